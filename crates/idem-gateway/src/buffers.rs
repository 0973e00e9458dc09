//! The budget of bytes buffered for keyed request bodies, across every request at once.
//!
//! A keyed body is read whole before it is fingerprinted and stays buffered until its
//! execution ends (a re-send after an uncertain result sends it again). Without a bound,
//! many slow clients each trickling a large body hold that much memory between them.
//! Each body takes its bytes from one budget before they are buffered: all of a
//! declared `Content-Length` up front (and the buffer is allocated at that size, never
//! doubled), or a step of at most 64 KiB at a time for a body without one (the buffer
//! grows by those steps, never by doubling). A body that does not fit is refused with 503 + `Retry-After`
//! and its bytes are never read. This module owns that accounting and the reading; it
//! does not decide routes, keys or answers.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::body::BoxError;
use crate::metrics::GatewayMetrics;

/// How far a body of undeclared length grows its buffer at a time.
const GROWTH: usize = 64 * 1024;

/// Why a keyed body could not be buffered.
#[derive(Debug)]
pub(crate) enum BufferError {
    /// Larger than `max_body_bytes` (declared or as it arrived).
    TooLarge,
    /// The budget shared by all requests has no room for it now.
    NoRoom,
    TimedOut,
    Broken(BoxError),
}

/// The bytes every keyed body buffered now may take between them.
pub(crate) struct BodyBudget {
    room: Arc<Semaphore>,
    metrics: Arc<GatewayMetrics>,
}

/// A body's share of the budget, given back when dropped.
pub(crate) struct Held {
    /// Every step taken, merged into one permit (no list to allocate).
    permits: Option<OwnedSemaphorePermit>,
    bytes: usize,
    metrics: Arc<GatewayMetrics>,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Held({} bytes)", self.bytes)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.metrics.buffered_body_bytes(-(self.bytes as i64));
    }
}

impl BodyBudget {
    pub fn new(bytes: usize, metrics: Arc<GatewayMetrics>) -> Self {
        Self {
            room: Arc::new(Semaphore::new(bytes.min(Semaphore::MAX_PERMITS))),
            metrics,
        }
    }

    fn held(&self) -> Held {
        Held {
            permits: None,
            bytes: 0,
            metrics: self.metrics.clone(),
        }
    }

    /// Adds `n` bytes to `held`, if the budget has room for them now.
    fn take(&self, held: &mut Held, n: usize) -> bool {
        if n == 0 {
            return true;
        }
        let Ok(n32) = u32::try_from(n) else {
            return false;
        };
        match self.room.clone().try_acquire_many_owned(n32) {
            Ok(permit) => {
                match &mut held.permits {
                    Some(all) => all.merge(permit),
                    None => held.permits = Some(permit),
                }
                held.bytes += n;
                self.metrics.buffered_body_bytes(n as i64);
                true
            }
            Err(_) => {
                self.metrics.body_budget_refused();
                false
            }
        }
    }

    /// Reads a whole body of at most `limit` bytes within `timeout`, its bytes taken
    /// from the budget as described in the module docs. `declared` is the request's
    /// `Content-Length` (already checked against `limit`).
    pub async fn read<B>(
        &self,
        body: B,
        declared: Option<usize>,
        limit: usize,
        timeout: Duration,
    ) -> Result<(Bytes, Held), BufferError>
    where
        B: http_body::Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let mut held = self.held();
        if let Some(n) = declared {
            if n > limit {
                return Err(BufferError::TooLarge);
            }
            if !self.take(&mut held, n) {
                return Err(BufferError::NoRoom);
            }
        }
        let collect = async {
            let mut body = std::pin::pin!(body);
            // Allocated at the declared size once a body comes in more than one frame.
            let mut whole: Vec<u8> = Vec::new();
            // The whole declared body in its first frame: kept as it came, no copy.
            let mut single: Option<Bytes> = None;
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| BufferError::Broken(e.into()))?;
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                if data.is_empty() {
                    continue;
                }
                let before = whole.len() + single.as_ref().map_or(0, Bytes::len);
                let len = before + data.len();
                if len > limit || declared.is_some_and(|n| len > n) {
                    return Err(BufferError::TooLarge);
                }
                if before == 0 && declared == Some(len) {
                    single = Some(data);
                    continue;
                }
                if whole.capacity() == 0 {
                    whole.reserve_exact(declared.unwrap_or(0));
                }
                if len > whole.capacity() {
                    // Undeclared length: grow by at most GROWTH past what arrived, the
                    // growth taken from the budget first.
                    let grow = (len - whole.capacity())
                        .max(GROWTH.min(limit - whole.capacity()))
                        .min(limit - whole.capacity());
                    if !self.take(&mut held, grow) {
                        return Err(BufferError::NoRoom);
                    }
                    whole.reserve_exact(whole.capacity() + grow - whole.len());
                }
                whole.extend_from_slice(&data);
            }
            Ok(single.unwrap_or_else(|| Bytes::from(whole)))
        };
        match tokio::time::timeout(timeout, collect).await {
            Ok(Ok(bytes)) => Ok((bytes, held)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(BufferError::TimedOut),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::full;

    fn budget(bytes: usize) -> BodyBudget {
        BodyBudget::new(bytes, Arc::new(GatewayMetrics::new()))
    }

    #[tokio::test]
    async fn declared_bodies_take_their_length_up_front_and_give_it_back() {
        let b = budget(10);
        let t = Duration::from_secs(1);
        let (one, held) = b.read(full("abcdef"), Some(6), 100, t).await.unwrap();
        assert_eq!(&one[..], b"abcdef");
        assert!(matches!(
            b.read(full("abcdef"), Some(6), 100, t).await,
            Err(BufferError::NoRoom)
        ));
        drop(held);
        assert!(b.read(full("abcdef"), Some(6), 100, t).await.is_ok());
        assert!(matches!(
            b.read(full("abcdef"), Some(6), 5, t).await,
            Err(BufferError::TooLarge)
        ));
        // A body longer than it declared is refused, not silently buffered.
        assert!(matches!(
            b.read(full("abcdefgh"), Some(6), 100, t).await,
            Err(BufferError::TooLarge)
        ));
    }

    #[tokio::test]
    async fn a_declared_body_in_frames_is_joined_and_bounded() {
        use http_body_util::StreamBody;
        let frames = |parts: &'static [&'static str]| {
            StreamBody::new(futures::stream::iter(parts.iter().map(|p| {
                Ok::<_, std::convert::Infallible>(http_body::Frame::data(Bytes::from_static(
                    p.as_bytes(),
                )))
            })))
        };
        let b = budget(100);
        let t = Duration::from_secs(1);
        let (whole, held) = b
            .read(frames(&["abc", "", "def"]), Some(6), 100, t)
            .await
            .unwrap();
        assert_eq!(&whole[..], b"abcdef");
        assert_eq!(held.bytes, 6);
        // A whole first frame followed by more is longer than declared.
        assert!(matches!(
            b.read(frames(&["abcdef", "g"]), Some(6), 100, t).await,
            Err(BufferError::TooLarge)
        ));
        let (one, _held) = b
            .read(frames(&["abcdef", ""]), Some(6), 100, t)
            .await
            .unwrap();
        assert_eq!(&one[..], b"abcdef");
    }

    #[tokio::test]
    async fn undeclared_bodies_take_room_as_they_arrive() {
        // The whole limit is the most one body grows to: 8 of a budget of 10.
        let b = budget(10);
        let t = Duration::from_secs(1);
        let (eight, held) = b.read(full("12345678"), None, 8, t).await.unwrap();
        assert_eq!(&eight[..], b"12345678");
        assert!(matches!(
            b.read(full("123"), None, 8, t).await,
            Err(BufferError::NoRoom)
        ));
        drop(held);
        assert!(b.read(full("123"), None, 8, t).await.is_ok());
    }
}
