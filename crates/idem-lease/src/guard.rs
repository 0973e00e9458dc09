//! The keepalive guard: holds a granted lease by renewing it every ttl/3 in a spawned
//! task, and keeps the holder told.
//!
//! - Validity: the guard is valid while its state is held (or renewals are failing but
//!   time is left) *and* the local deadline has not passed. The local deadline is the
//!   send time of the last successful acquire/renew plus the ttl, which is never later
//!   than the store's deadline (the store started its clock after the send). A paused
//!   process therefore wakes up invalid, even before its keepalive runs.
//! - Failure is loud: a refused renewal, an error or a passed deadline changes the state
//!   (watched through [`LeaseGuard::subscribe`]), counts in the metrics and logs a
//!   warning. Lost is final: the holder must acquire again.
//! - [`LeaseGuard::release`] stops the keepalive and waits for it to finish (a renewal in
//!   flight completes first) before releasing, so no renewal outlives the release.
//! - Dropping the guard without releasing aborts the keepalive; the lease then expires.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idem_core::lease::holder_detail;
use idem_core::{
    Acquire, Lease, LeaseError, LeaseName, LeaseStore, Millis, OwnerId, Release, Renew,
};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::metrics::LeaseMetrics;
use crate::wait::acquire_wait_at;

/// Why a held lease is over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LostReason {
    /// The store said the lease is no longer ours (expired there, released, forced,
    /// lost in a failover, or granted to `current`).
    NotHolder { current: Option<Lease> },
    /// The local deadline passed without a successful renewal.
    Expired,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LostReason::NotHolder { current } => write!(
                f,
                "the store says the lease is over ({})",
                holder_detail(current.as_ref())
            ),
            LostReason::Expired => f.write_str("no renewal succeeded before the lease ran out"),
        }
    }
}

/// What the holder knows about its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseState {
    /// Renewed on schedule.
    Held { lease: Lease, valid_until: Instant },
    /// Renewals are failing with store errors; retried until `valid_until`.
    RenewFailing {
        lease: Lease,
        valid_until: Instant,
        failures: u32,
        error: String,
    },
    /// The lease is over; protected writes must stop.
    Lost { lease: Lease, reason: LostReason },
    /// Released by the holder.
    Released { lease: Lease, released_at: Millis },
}

impl LeaseState {
    /// The lease as last known (the token never changes).
    pub fn lease(&self) -> &Lease {
        match self {
            LeaseState::Held { lease, .. }
            | LeaseState::RenewFailing { lease, .. }
            | LeaseState::Lost { lease, .. }
            | LeaseState::Released { lease, .. } => lease,
        }
    }

    /// Whether a protected write may start now.
    pub fn is_valid(&self) -> bool {
        match self {
            LeaseState::Held { valid_until, .. } | LeaseState::RenewFailing { valid_until, .. } => {
                Instant::now() < *valid_until
            }
            LeaseState::Lost { .. } | LeaseState::Released { .. } => false,
        }
    }
}

/// The answer to [`LeaseGuard::acquire`].
#[derive(Debug)]
pub enum Acquired {
    Guard(LeaseGuard),
    /// The wait ended with someone else holding the lease.
    Busy {
        holder: Lease,
        now: Millis,
    },
}

/// A held lease with its keepalive running. Must be created inside a Tokio runtime.
pub struct LeaseGuard {
    store: Arc<dyn LeaseStore>,
    metrics: LeaseMetrics,
    ttl: Duration,
    state: watch::Sender<LeaseState>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("ttl", &self.ttl)
            .field("state", &*self.state.borrow())
            .finish_non_exhaustive()
    }
}

impl LeaseGuard {
    /// Acquires `name` (waiting up to `wait`, see [`acquire_wait`](crate::acquire_wait))
    /// and starts the keepalive.
    pub async fn acquire(
        store: Arc<dyn LeaseStore>,
        name: &LeaseName,
        owner: &OwnerId,
        ttl: Duration,
        wait: Duration,
        metrics: LeaseMetrics,
    ) -> Result<Acquired, LeaseError> {
        match acquire_wait_at(&*store, name, owner, ttl, wait).await? {
            (Acquire::Granted(lease), sent) => Ok(Acquired::Guard(Self::start(
                store, lease, ttl, sent, metrics,
            ))),
            (Acquire::Held { holder, now }, _) => Ok(Acquired::Busy { holder, now }),
        }
    }

    /// Starts the keepalive for a lease granted with `ttl` by an acquire sent at `sent`.
    pub fn start(
        store: Arc<dyn LeaseStore>,
        lease: Lease,
        ttl: Duration,
        sent: Instant,
        metrics: LeaseMetrics,
    ) -> Self {
        let valid_until = sent + ttl;
        let (state, _) = watch::channel(LeaseState::Held {
            lease: lease.clone(),
            valid_until,
        });
        let (stop, stopped) = oneshot::channel();
        let keepalive = Keepalive {
            store: store.clone(),
            metrics: metrics.clone(),
            ttl,
            state: state.clone(),
        };
        let task = tokio::spawn(keepalive.run(lease, valid_until, stopped));
        Self {
            store,
            metrics,
            ttl,
            state,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// The lease as last renewed.
    pub fn lease(&self) -> Lease {
        self.state.borrow().lease().clone()
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    pub fn state(&self) -> LeaseState {
        self.state.borrow().clone()
    }

    /// Check before each protected write: false once the lease is (or may be) over.
    pub fn is_valid(&self) -> bool {
        self.state.borrow().is_valid()
    }

    /// The lease if still valid, otherwise `LeaseError::Lost`.
    pub fn check(&self) -> Result<Lease, LeaseError> {
        let state = self.state.borrow();
        if state.is_valid() {
            return Ok(state.lease().clone());
        }
        let lease = state.lease();
        Err(LeaseError::Lost {
            name: lease.name.clone(),
            token: lease.token,
            reason: match &*state {
                LeaseState::Lost { reason, .. } => reason.to_string(),
                LeaseState::Released { .. } => "released".into(),
                _ => "local deadline passed without a renewal".into(),
            },
        })
    }

    /// A signal that changes with every state change (renewed, failing, lost, released).
    pub fn subscribe(&self) -> watch::Receiver<LeaseState> {
        self.state.subscribe()
    }

    /// Runs a protected write after [`check`](Self::check), with the current lease
    /// (whose token the write must present to its fence). A fenced rejection is counted.
    /// The check narrows the window; only the fence closes it.
    pub async fn fenced<T, F, Fut>(&self, write: F) -> Result<T, LeaseError>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = Result<T, LeaseError>>,
    {
        let result = write(self.check()?).await;
        if let Err(e) = &result {
            if e.is_fenced() {
                self.metrics.fenced_rejection();
            }
        }
        result
    }

    /// Stops the keepalive (waiting for a renewal in flight), then releases. The answer
    /// is recorded in the metrics: hold fraction, or owner mismatch.
    pub async fn release(mut self) -> Result<Release, LeaseError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            // A panicked keepalive renews nothing either; the release still runs.
            if let Err(e) = task.await {
                tracing::error!(error = %e, "lease keepalive task failed");
            }
        }
        let lease = self.lease();
        let answer = self
            .store
            .release(&lease.name, &lease.owner, lease.token)
            .await?;
        self.metrics.observe_release(&answer, self.ttl);
        match &answer {
            Release::Released { released_at, .. } => {
                self.state.send_replace(LeaseState::Released {
                    lease,
                    released_at: *released_at,
                });
            }
            Release::NotHolder { current } => {
                self.state.send_if_modified(|s| {
                    let lost = !matches!(s, LeaseState::Lost { .. });
                    if lost {
                        *s = LeaseState::Lost {
                            lease: lease.clone(),
                            reason: LostReason::NotHolder {
                                current: current.clone(),
                            },
                        };
                    }
                    lost
                });
            }
        }
        Ok(answer)
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let lease = self.state.borrow().lease().clone();
            tracing::warn!(
                lease = %lease.name, owner = %lease.owner, token = %lease.token,
                "lease guard dropped without release: renewal stopped, the lease will expire"
            );
        }
    }
}

/// The renewal loop's context.
struct Keepalive {
    store: Arc<dyn LeaseStore>,
    metrics: LeaseMetrics,
    ttl: Duration,
    state: watch::Sender<LeaseState>,
}

impl Keepalive {
    async fn run(
        self,
        mut lease: Lease,
        mut valid_until: Instant,
        mut stop: oneshot::Receiver<()>,
    ) {
        let period = self.ttl / 3;
        // Retries after an error come faster than renewals, to use the time left.
        let retry = (self.ttl / 10).max(Duration::from_millis(5));
        let mut next = valid_until - self.ttl + period;
        let mut failures = 0u32;
        loop {
            tokio::select! {
                biased;
                _ = &mut stop => return,
                _ = tokio::time::sleep_until(next) => {}
            }
            let sent = Instant::now();
            if sent >= valid_until {
                self.lost(lease, LostReason::Expired, "expired");
                return;
            }
            // A renewal may not outlast the lease (nor the next renewal slot).
            let budget = (valid_until - sent).min(period);
            let renewed = tokio::time::timeout(
                budget,
                self.store
                    .renew(&lease.name, &lease.owner, lease.token, self.ttl),
            )
            .await;
            let error = match renewed {
                Ok(Ok(Renew::Renewed(l))) => {
                    lease = l;
                    valid_until = sent + self.ttl;
                    failures = 0;
                    next = sent + period;
                    self.state.send_replace(LeaseState::Held {
                        lease: lease.clone(),
                        valid_until,
                    });
                    continue;
                }
                Ok(Ok(Renew::NotHolder { current })) => {
                    self.lost(lease, LostReason::NotHolder { current }, "not_holder");
                    return;
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("renewal timed out after {budget:?}"),
            };
            failures += 1;
            self.metrics.renew_failure("error");
            tracing::warn!(
                lease = %lease.name, owner = %lease.owner, token = %lease.token,
                failures, %error, "lease renewal failed; retrying until the lease runs out"
            );
            self.state.send_replace(LeaseState::RenewFailing {
                lease: lease.clone(),
                valid_until,
                failures,
                error,
            });
            next = Instant::now() + retry;
        }
    }

    fn lost(&self, lease: Lease, reason: LostReason, metric: &'static str) {
        self.metrics.renew_failure(metric);
        tracing::warn!(
            lease = %lease.name, owner = %lease.owner, token = %lease.token, %reason,
            "lease lost: the holder must stop protected writes"
        );
        self.state.send_replace(LeaseState::Lost { lease, reason });
    }
}
