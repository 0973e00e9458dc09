//! [`Detached`]: a keyed request's work, awaited in place by whoever serves the request
//! and handed to a task of its own if that one goes away first (a client hanging up).
//!
//! Owns that hand-over. It must not decide anything about the work: it only makes sure
//! that work which has started (a claim being written, a record PROCESSING) is driven
//! to its end instead of dropped.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

type Work<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Work that runs to its end whether or not it is awaited to its end. Boxed, so moving
/// it moves a pointer, never the work's state machine.
pub struct Detached<T: 'static> {
    work: Option<Work<T>>,
}

impl<T: Send + 'static> Detached<T> {
    pub fn new(work: impl Future<Output = T> + Send + 'static) -> Self {
        Self {
            work: Some(Box::pin(work)),
        }
    }
}

impl<T: 'static> Detached<T> {
    /// Drops the work here instead of detaching it: for work that panicked, which cannot
    /// be polled again.
    pub fn abandon(&mut self) {
        self.work = None;
    }
}

impl<T: 'static> Future for Detached<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let work = self.work.as_mut().expect("polled after it completed");
        let out = std::task::ready!(work.as_mut().poll(cx));
        self.work = None;
        Poll::Ready(out)
    }
}

impl<T: 'static> Drop for Detached<T> {
    fn drop(&mut self) {
        let Some(work) = self.work.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(async move {
                work.await;
            })),
            // Only outside a runtime, where nothing could run it: a claim it holds frees
            // when its lease ends.
            Err(_) => tracing::warn!("keyed work was dropped outside a runtime"),
        }
    }
}

impl<T> fmt::Debug for Detached<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Detached")
            .field("done", &self.work.is_none())
            .finish()
    }
}
