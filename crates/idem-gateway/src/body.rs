//! Bodies: the boxed body type the gateway speaks on both sides, buffering with a size
//! and time limit (keyed routes), and an idle timeout for streamed bodies (pass-through).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use tokio::time::{Instant, Sleep};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Every body the gateway sends or forwards.
pub type Body = BoxBody<Bytes, BoxError>;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

pub fn empty() -> Body {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed()
}

/// Why buffering a body failed.
#[derive(Debug)]
pub enum ReadError {
    TooLarge { limit: usize },
    TimedOut,
    Broken(BoxError),
}

/// Buffers a whole body: at most `limit` bytes, and all of it within `timeout`.
pub async fn read_limited<B>(body: B, limit: usize, timeout: Duration) -> Result<Bytes, ReadError>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let collect = async {
        let mut body = body;
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

/// The error a stalled client body ends with.
#[derive(Debug, thiserror::Error)]
#[error("no body data for {0:?}: the client stalled")]
pub struct BodyIdle(pub Duration);

pin_project_lite::pin_project! {
    /// A streamed body that fails when no frame arrives for `idle`: a slow or stalled
    /// client cannot hold an upstream request open forever.
    pub struct IdleTimeout<B> {
        #[pin]
        inner: B,
        #[pin]
        sleep: Sleep,
        idle: Duration,
    }
}

impl<B> IdleTimeout<B> {
    pub fn new(inner: B, idle: Duration) -> Self {
        Self {
            inner,
            sleep: tokio::time::sleep(idle),
            idle,
        }
    }
}

impl<B> HttpBody for IdleTimeout<B>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(res)) => {
                let idle = *this.idle;
                this.sleep.as_mut().reset(Instant::now() + idle);
                Poll::Ready(Some(res.map_err(Into::into)))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match this.sleep.poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyIdle(*this.idle))))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn limits() {
        let ok = read_limited(full("abc"), 3, Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(&ok[..], b"abc");
        assert!(matches!(
            read_limited(full("abcd"), 3, Duration::from_secs(1)).await,
            Err(ReadError::TooLarge { limit: 3 })
        ));
    }

    #[tokio::test]
    async fn idle_body_fails() {
        let (_tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(1);
        let stream =
            http_body_util::StreamBody::new(futures::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|f| (f, rx))
            }));
        let mut body = Box::pin(IdleTimeout::new(stream, Duration::from_millis(50)));
        let res = body.frame().await;
        assert!(matches!(res, Some(Err(_))));
    }
}
