//! The executions running under a claim: counted so a shutdown can wait for their
//! records, cut off once its grace ran out, and kept alive meanwhile by renewing the
//! claim's lease ([`under_lease`]).
//!
//! Owns the heartbeat and the cut-off. It must not decide how a record ends: the run's
//! caller settles it ([`crate::pipeline::finish()`]).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_core::{ClaimToken, IdempotencyStore};
use tokio::sync::{watch, Notify};
use tokio::time::{Instant, MissedTickBehavior};

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
pub async fn under_lease<F: Future>(
    store: &dyn IdempotencyStore,
    token: &ClaimToken,
    lease: Duration,
    cut_off: &Executions,
    work: F,
) -> Ran<F::Output> {
    if cut_off.is_cancelled() {
        return Ran::CutOff;
    }
    let mut work = std::pin::pin!(work);
    let period = (lease / 3).max(Duration::from_millis(10));
    let mut heartbeat = tokio::time::interval_at(Instant::now() + period, period);
    heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut cancelled = std::pin::pin!(cut_off.cancelled());
    loop {
        tokio::select! {
            biased;
            out = &mut work => return Ran::Done(out),
            _ = &mut cancelled => return Ran::CutOff,
            _ = heartbeat.tick() => match store.extend_lease(token, lease).await {
                Ok(_) => {}
                // Finished meanwhile (in the handler's transaction) or taken over: the
                // finish will tell which.
                Err(e) if e.is_superseded() => {
                    tracing::debug!(scope = %token.scope, "lease renewal found the claim moved on")
                }
                Err(e) => tracing::warn!(scope = %token.scope, error = %e, "lease renewal failed"),
            },
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
