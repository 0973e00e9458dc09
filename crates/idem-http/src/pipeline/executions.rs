//! The executions running under a claim: counted so a shutdown can wait for their
//! records, cut off once its grace ran out, and kept alive meanwhile by renewing the
//! claim's lease ([`under_lease`]).
//!
//! Owns the heartbeat and the cut-off. It must not decide how a record ends: the run's
//! caller settles it ([`crate::pipeline::finish()`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use idem_core::{ClaimToken, IdempotencyStore, Millis, StoreError};
use tokio::sync::{watch, Notify};
use tokio::time::{Instant, Interval, MissedTickBehavior};

/// The executions running under a claim, so a shutdown can cut them off and wait until
/// their records are written.
#[derive(Debug)]
pub struct Executions {
    cancelled: watch::Sender<bool>,
    running: AtomicUsize,
    idle: Notify,
}

impl Default for Executions {
    fn default() -> Self {
        Self {
            cancelled: watch::channel(false).0,
            running: AtomicUsize::new(0),
            idle: Notify::new(),
        }
    }
}

/// One running execution; dropping it counts it out.
#[derive(Debug)]
pub struct Running(Arc<Executions>);

impl Drop for Running {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Executions {
    /// Counts an execution in until the returned guard drops.
    pub fn start(self: &Arc<Self>) -> Running {
        self.running.fetch_add(1, Ordering::AcqRel);
        Running(self.clone())
    }

    pub fn running(&self) -> usize {
        self.running.load(Ordering::Acquire)
    }

    /// Cuts off every running execution and waiter, and every one that starts from now.
    pub fn cancel(&self) {
        self.cancelled.send_replace(true);
    }

    pub fn is_cancelled(&self) -> bool {
        *self.cancelled.borrow()
    }

    /// Resolves once cancelled.
    pub fn cancelled(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.cancelled.subscribe();
        async move {
            let _ = rx.wait_for(|c| *c).await;
        }
    }

    /// Resolves when no execution is running.
    pub async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if self.running() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// How a run under a claim ended.
#[derive(Debug)]
pub enum Ran<T> {
    Done(T),
    /// The shutdown's grace ran out (or it had before the run started): the work was
    /// dropped — an open transaction of its rolls back.
    CutOff,
}

/// Drives `work` while renewing the claim's lease every `lease / 3`, until it ends or
/// `cut_off` is cancelled. A finished answer wins over a cut-off at the same moment.
///
/// The work keeps running while a renewal is on its way: a renewal may wait on the
/// work itself (a handler's transaction holding the writer it needs). A renewal still
/// on its way when the work ends or is cut off is dropped; it only ever pushed the
/// deadline of a record its owner is about to finish or free.
pub fn under_lease<'a, F: Future + 'a>(
    store: &'a dyn IdempotencyStore,
    token: &'a ClaimToken,
    lease: Duration,
    cut_off: &Executions,
    work: F,
) -> impl Future<Output = Ran<F::Output>> + 'a {
    let period = (lease / 3).max(Duration::from_millis(10));
    let mut heartbeat = tokio::time::interval_at(Instant::now() + period, period);
    heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
    UnderLease {
        work,
        cancelled: cut_off.cancelled(),
        cut_off_before: cut_off.is_cancelled(),
        heartbeat,
        renewing: None,
        store,
        token,
        lease,
    }
}

type Renewal<'a> = Pin<Box<dyn Future<Output = Result<Millis, StoreError>> + Send + 'a>>;

pin_project_lite::pin_project! {
    /// [`under_lease`]'s future. Written out rather than as an `async fn`, which would
    /// hold the work twice (as its argument and as the pinned local it is polled
    /// from): a forwarded request's work is kilobytes, copied on every move.
    struct UnderLease<'a, F, C> {
        #[pin]
        work: F,
        #[pin]
        cancelled: C,
        cut_off_before: bool,
        heartbeat: Interval,
        renewing: Option<Renewal<'a>>,
        store: &'a dyn IdempotencyStore,
        token: &'a ClaimToken,
        lease: Duration,
    }
}

impl<F: Future, C: Future<Output = ()>> Future for UnderLease<'_, F, C> {
    type Output = Ran<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if *this.cut_off_before {
            return Poll::Ready(Ran::CutOff);
        }
        if let Poll::Ready(out) = this.work.poll(cx) {
            return Poll::Ready(Ran::Done(out));
        }
        if this.cancelled.poll(cx).is_ready() {
            return Poll::Ready(Ran::CutOff);
        }
        loop {
            if let Some(renewal) = this.renewing.as_mut() {
                let Poll::Ready(renewed) = renewal.as_mut().poll(cx) else {
                    return Poll::Pending;
                };
                *this.renewing = None;
                match renewed {
                    Ok(_) => {}
                    // Finished meanwhile (in the handler's transaction) or taken over:
                    // the finish will tell which.
                    Err(e) if e.is_superseded() => {
                        tracing::debug!(scope = %this.token.scope, "lease renewal found the claim moved on")
                    }
                    Err(e) => {
                        tracing::warn!(scope = %this.token.scope, error = %e, "lease renewal failed")
                    }
                }
            }
            if this.heartbeat.poll_tick(cx).is_pending() {
                return Poll::Pending;
            }
            *this.renewing = Some(this.store.extend_lease(this.token, *this.lease));
        }
    }
}

/// Drives `work` until it ends or `cut_off` is cancelled (a run with no lease to renew).
pub async fn until_cut_off<F: Future>(cut_off: &Executions, work: F) -> Ran<F::Output> {
    if cut_off.is_cancelled() {
        return Ran::CutOff;
    }
    tokio::select! {
        biased;
        out = work => Ran::Done(out),
        _ = cut_off.cancelled() => Ran::CutOff,
    }
}
