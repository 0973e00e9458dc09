//! [`Detached`]: a keyed request's work, awaited in place by whoever serves the request
//! and handed to a task of its own if that one goes away first (a client hanging up).
//!
//! Owns that hand-over. It must not decide anything about the work: it only makes sure
//! that work which has started (a claim being written, a record PROCESSING) is driven
//! to its end instead of dropped.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
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

impl<T: 'static> Future for Detached<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let work = self.work.as_mut().expect("polled after it completed");
        // Work that panicked cannot be polled again: it is dropped here, never detached.
        match std::panic::catch_unwind(AssertUnwindSafe(|| work.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(out)) => {
                self.work = None;
                Poll::Ready(out)
            }
            Err(panic) => {
                self.work = None;
                std::panic::resume_unwind(panic)
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn dropped_unfinished_work_runs_on_and_panicked_work_is_not_polled_again() {
        // Dropped before its end: finished by a task of its own.
        let done = Arc::new(AtomicUsize::new(0));
        let d = done.clone();
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let mut work = Box::pin(Detached::new(async move {
            let _ = wait.await;
            d.fetch_add(1, Ordering::SeqCst);
        }));
        assert!(futures::poll!(work.as_mut()).is_pending());
        drop(work);
        go.send(()).unwrap();
        for _ in 0..100 {
            if done.load(Ordering::SeqCst) == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(done.load(Ordering::SeqCst), 1);

        // Panicked: the panic reaches the one polling it, and the work is never detached.
        // A future that could be polled again (an async block could not), so a detach
        // after the panic would show as a second poll.
        struct PanicsFirst(Arc<AtomicUsize>);
        impl Future for PanicsFirst {
            type Output = ();
            fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
                if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
                    panic!("work panics on purpose");
                }
                Poll::Ready(())
            }
        }
        let polls = Arc::new(AtomicUsize::new(0));
        let mut work = Box::pin(Detached::new(PanicsFirst(polls.clone())));
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let caught = std::panic::catch_unwind(AssertUnwindSafe(|| work.as_mut().poll(&mut cx)));
        assert!(caught.is_err());
        drop(work);
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        assert_eq!(polls.load(Ordering::SeqCst), 1);
    }
}
