//! Bodies: the pipeline's body type and bounded buffering (keyed routes, re-exported
//! from `idem_http::body`), and an idle timeout for streamed bodies (pass-through).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

/// The pipeline's body type, so keyed answers need no conversion.
pub use idem_http::body::{empty, full, read_limited, Body, BoxError, ReadError};

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
    use http_body_util::BodyExt;

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
