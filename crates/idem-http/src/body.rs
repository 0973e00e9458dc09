//! The body type of every response the pipeline answers with, framework-neutral: a
//! boxed `http_body::Body` of `Bytes` (axum, hyper and tower-http all accept it), and
//! bounded buffering of a body before it is fingerprinted or stored.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{HeaderMap, CONTENT_LENGTH};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Every response body the pipeline produces.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

pub fn empty() -> Body {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Boxes any body of `Bytes`.
pub fn boxed<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

/// Why buffering a body failed.
#[derive(Debug)]
pub enum ReadError {
    TooLarge { limit: usize },
    TimedOut,
    Broken(BoxError),
}

/// The body length the request declares (`Content-Length`), when it is a number.
pub fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

/// Whether the declared `Content-Length` already exceeds `limit` (refused before a byte
/// is read).
pub fn declared_too_large(headers: &HeaderMap, limit: usize) -> bool {
    declared_length(headers).is_some_and(|len| len > limit as u64)
}

/// Buffers a whole body: at most `limit` bytes, and all of it within `timeout`.
/// Trailers are not kept.
pub async fn read_limited<B>(body: B, limit: usize, timeout: Duration) -> Result<Bytes, ReadError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let collect = async {
        let mut body = std::pin::pin!(body);
        let mut buf = BytesMut::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| ReadError::Broken(e.into()))?;
            if let Ok(data) = frame.into_data() {
                if buf.len() + data.len() > limit {
                    return Err(ReadError::TooLarge { limit });
                }
                buf.extend_from_slice(&data);
            }
        }
        Ok(buf.freeze())
    };
    match tokio::time::timeout(timeout, collect).await {
        Ok(res) => res,
        Err(_) => Err(ReadError::TimedOut),
    }
}
