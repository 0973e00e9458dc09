//! The steps every idempotent execution goes through, framework-neutral, shared by the
//! server-side layer and the gateway: coalescing in-process duplicates ([`Flights`]),
//! claiming and waiting for the first execution ([`claim`], woken through
//! [`Wakeups`]), running under the claim's lease with a heartbeat and a shutdown's
//! cut-off ([`under_lease`], [`Executions`]), and finishing the record ([`finish`]).
//!
//! Owns the order of store calls and their retries. It must not know HTTP framing,
//! routes or authentication: callers hand it claim requests and futures, and turn its
//! answers into responses.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{
    Claim, ClaimRequest, ClaimToken, ErrorKind, Fingerprint, Finish, IdempotencyStore, Record,
    RecordState, Scope, StoreError,
};
use tokio::sync::{watch, Notify};
use tokio::time::{Instant, MissedTickBehavior};

use crate::config::InProgressMode;

// ---------------------------------------------------------------------------------------
// Wake-ups

/// Tells waiters that a key's execution ended. In-process ([`LocalWakeups`]) or shared
/// between instances (the gateway's Redis pub/sub). Best effort: a lost wake-up costs a
/// waiter its sleep until the owner's lease deadline, never a second execution.
#[async_trait]
pub trait Wakeups: Send + Sync + 'static {
    /// Starts listening for `scope`. Called before re-reading the record, so an end
    /// between the read and the wait is not missed.
    async fn subscribe(&self, scope: &Scope) -> Box<dyn Waiter>;
    /// Wakes every waiter of `scope`; called after the record was written.
    async fn publish(&self, scope: &Scope);
}

/// One waiter's interest in a scope.
#[async_trait]
pub trait Waiter: Send {
    /// Resolves at the next wake-up since subscribing or since it last resolved.
    async fn woken(&mut self);
}

/// Wake-ups within one process: waiters of a scope share one channel, dropped (which
/// wakes them all) by whoever finishes the scope's record.
#[derive(Debug, Default, Clone)]
pub struct LocalWakeups {
    inner: Arc<LocalInner>,
}

#[derive(Debug, Default)]
struct LocalInner {
    waiting: Mutex<HashMap<Scope, (u64, watch::Sender<()>)>>,
    generation: std::sync::atomic::AtomicU64,
}

struct LocalWaiter {
    wakeups: LocalWakeups,
    scope: Scope,
    generation: u64,
    receiver: watch::Receiver<()>,
}

impl LocalWakeups {
    fn waiter(&self, scope: &Scope) -> LocalWaiter {
        let mut waiting = self.lock();
        let (generation, sender) = waiting.entry(scope.clone()).or_insert_with(|| {
            let generation = self.inner.generation.fetch_add(1, Ordering::Relaxed);
            (generation, watch::channel(()).0)
        });
        LocalWaiter {
            wakeups: self.clone(),
            scope: scope.clone(),
            generation: *generation,
            receiver: sender.subscribe(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Scope, (u64, watch::Sender<()>)>> {
        self.inner
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes every waiter of `scope` (synchronous form of [`Wakeups::publish`]).
    pub fn wake(&self, scope: &Scope) {
        let removed = {
            let mut waiting = self.lock();
            if waiting.is_empty() {
                return;
            }
            waiting.remove(scope)
        };
        // Dropping the sender ends every receiver's `changed()`.
        drop(removed);
    }

    /// Scopes with waiters (for tests and gauges).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[async_trait]
impl Wakeups for LocalWakeups {
    async fn subscribe(&self, scope: &Scope) -> Box<dyn Waiter> {
        Box::new(self.waiter(scope))
    }

    async fn publish(&self, scope: &Scope) {
        self.wake(scope);
    }
}

#[async_trait]
impl Waiter for LocalWaiter {
    async fn woken(&mut self) {
        // Err means the sender was dropped: that is the wake-up. A fired channel stays
        // fired, so the next wait listens on a fresh one.
        let _ = self.receiver.changed().await;
        *self = self.wakeups.waiter(&self.scope);
    }
}

impl Drop for LocalWaiter {
    fn drop(&mut self) {
        let mut waiting = self.wakeups.lock();
        if let Some((generation, sender)) = waiting.get(&self.scope) {
            // Our own receiver is still alive here, hence 1.
            if *generation == self.generation && sender.receiver_count() <= 1 {
                waiting.remove(&self.scope);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Executions and the shutdown's cut-off

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

// ---------------------------------------------------------------------------------------
// Claiming and waiting for the first execution

/// Where a claim left the request.
#[derive(Debug)]
pub enum Turn {
    /// Execute: the claim is this request's.
    Proceed(ClaimToken),
    /// The key is finished: answer from this record.
    Replay(Record),
    /// The key belongs to a different request.
    Mismatch,
    /// The first execution is still running (no wait configured, the wait ran out, or
    /// the shutdown cut the wait off). `lease_left` is the owner's remaining lease.
    InProgress { lease_left: Duration },
}

impl Turn {
    /// A store's answer as a turn; "in progress" carries the owner's remaining lease.
    pub fn of(claim: Claim) -> Turn {
        match claim {
            Claim::Proceed(token) => Turn::Proceed(token),
            Claim::Replay(record) => Turn::Replay(record),
            Claim::Mismatch { .. } => Turn::Mismatch,
            Claim::InProgress {
                lease_expires_at,
                now,
                ..
            } => Turn::InProgress {
                lease_left: Duration::from_millis(
                    u64::try_from(lease_expires_at.saturating_sub(now)).unwrap_or(0),
                ),
            },
        }
    }
}

/// A claim's answer and whether the request waited on another execution for it.
#[derive(Debug)]
pub struct Claimed {
    pub turn: Turn,
    pub waited: bool,
}

/// Claims the key; while another execution holds it, either answers at once
/// ([`InProgressMode::Reject`]) or waits for its end ([`InProgressMode::Wait`]): woken
/// by `wakeups`, or at the owner's lease deadline (an owner elsewhere may have died, and
/// the next claim then takes over), bounded by the wait and by `cut_off`.
pub async fn claim(
    store: &dyn IdempotencyStore,
    wakeups: &dyn Wakeups,
    request: &ClaimRequest,
    mode: InProgressMode,
    cut_off: &Executions,
) -> Result<Claimed, StoreError> {
    let mut waiting: Option<(Instant, Box<dyn Waiter>)> = None;
    let mut cancelled = std::pin::pin!(cut_off.cancelled());
    loop {
        let asked = Instant::now();
        let answer = store.claim(request).await;
        // The request's span (the layer's and the gateway's) carries the store's latency.
        tracing::Span::current().record("store_ms", asked.elapsed().as_secs_f64() * 1000.0);
        let lease_left = match Turn::of(answer?) {
            Turn::InProgress { lease_left } => lease_left,
            turn => return Ok(done(turn, &waiting)),
        };
        let max_wait = match mode {
            InProgressMode::Wait { max_wait } if !max_wait.is_zero() => max_wait,
            _ => return Ok(done(Turn::InProgress { lease_left }, &waiting)),
        };
        let Some((deadline, waiter)) = waiting.as_mut() else {
            // Subscribe, then claim again: an end between the first claim and the
            // subscription is then seen by the second claim.
            waiting = Some((
                Instant::now() + max_wait,
                wakeups.subscribe(&request.scope).await,
            ));
            continue;
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || cut_off.is_cancelled() {
            return Ok(done(Turn::InProgress { lease_left }, &waiting));
        }
        // A little past the deadline, so the store's clock has passed it too.
        let sleep = (lease_left + Duration::from_millis(20)).min(left);
        tokio::select! {
            _ = waiter.woken() => {}
            _ = tokio::time::sleep(sleep) => {}
            // Shutting down: answer now; claiming again could start an execution past
            // the grace.
            _ = &mut cancelled => return Ok(done(Turn::InProgress { lease_left }, &waiting)),
        }
    }
}

fn done(turn: Turn, waiting: &Option<(Instant, Box<dyn Waiter>)>) -> Claimed {
    Claimed {
        turn,
        waited: waiting.is_some(),
    }
}

// ---------------------------------------------------------------------------------------
// Running under the claim's lease

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

// ---------------------------------------------------------------------------------------
// Finishing the record

/// Who wrote the record's final state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishedBy {
    /// [`finish`] did.
    Pipeline,
    /// The executed code did, in its own transaction (found when the finish was
    /// superseded by this very owner).
    Handler,
}

/// What to do when the store keeps less than the captured result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TooLarge {
    /// Keep status and headers; replays say `Idempotent-Body-Omitted: true`.
    OmitBody,
    /// End the record retryable: later duplicates execute again (behind the gateway the
    /// upstream's own record answers them).
    Forget,
}

/// How [`finish`] treats failures.
#[derive(Debug, Clone, Copy)]
pub struct FinishPolicy {
    /// Attempts while the store is unavailable (the action has run, so giving up early
    /// leaves the key PROCESSING until its lease ends).
    pub attempts: u32,
    pub too_large: TooLarge,
}

/// Why [`finish`] wrote nothing.
#[derive(Debug)]
pub enum NotFinished {
    /// Another request took the claim over.
    Lost,
    Failed(StoreError),
}

/// Finishes the record (see [`FinishPolicy`]).
pub async fn finish(
    store: &dyn IdempotencyStore,
    token: &ClaimToken,
    mut finish: Finish,
    policy: FinishPolicy,
) -> Result<(Record, FinishedBy), NotFinished> {
    let mut delay = Duration::from_millis(25);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let error = match store.finish(token, finish.clone()).await {
            Ok(record) => return Ok((record, FinishedBy::Pipeline)),
            Err(e) => e,
        };
        match error {
            StoreError::Superseded { .. } => {
                // The handler may have finished in its own transaction without saying
                // so; otherwise another request took the claim over.
                return match store.get(&token.scope).await {
                    Ok(Some(record))
                        if record.owner.as_ref() == Some(&token.owner)
                            && record.state != RecordState::Processing =>
                    {
                        Ok((record, FinishedBy::Handler))
                    }
                    _ => Err(NotFinished::Lost),
                };
            }
            // The layer keeps status and headers only for a body too large; the gateway
            // forgets any result its window refuses (the upstream still has it).
            e if finish.result.is_some()
                && (matches!(e, StoreError::ResultTooLarge { .. })
                    || (policy.too_large == TooLarge::Forget
                        && e.kind() == ErrorKind::InvalidInput)) =>
            {
                tracing::warn!(scope = %token.scope, error = %e, "result too large to keep");
                match (policy.too_large, finish.result.as_mut()) {
                    (TooLarge::OmitBody, Some(result)) if !result.body.is_empty() => {
                        result.body.clear();
                        result.headers.push((
                            crate::headers::IDEMPOTENT_BODY_OMITTED.as_str().to_owned(),
                            "true".to_owned(),
                        ));
                    }
                    (TooLarge::OmitBody, _) => finish.result = None,
                    (TooLarge::Forget, _) => {
                        finish = Finish {
                            state: RecordState::FailedRetryable,
                            result: None,
                        }
                    }
                }
            }
            e if e.is_unavailable() && attempt < policy.attempts => {
                tracing::warn!(scope = %token.scope, error = %e, attempt, "finish failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            e => return Err(NotFinished::Failed(e)),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Coalescing in-process duplicates

/// Executions in flight in this process, by scope: the first arrival of a key leads,
/// later arrivals with the same fingerprint follow and share its outcome `T` without
/// touching the store.
pub struct Flights<T> {
    map: Mutex<HashMap<Scope, Flight<T>>>,
}

struct Flight<T> {
    fingerprint: Fingerprint,
    outcome: watch::Receiver<Option<Arc<T>>>,
}

impl<T> Default for Flights<T> {
    fn default() -> Self {
        Self {
            map: Mutex::default(),
        }
    }
}

/// An arrival's place in its key's flight.
pub enum Joined<T> {
    /// No flight: this arrival runs it and completes it through the lead.
    Lead(Lead<T>, Follower<T>),
    /// A flight with the same fingerprint: wait for its outcome.
    Follow(Follower<T>),
    /// A flight of a different request under the same key.
    Mismatch,
}

/// The right to complete a flight. Dropping it without completing ends the flight with
/// no outcome (followers see `None`).
pub struct Lead<T> {
    flights: Arc<Flights<T>>,
    scope: Scope,
    tx: watch::Sender<Option<Arc<T>>>,
}

/// Waits for a flight's outcome.
pub struct Follower<T> {
    rx: watch::Receiver<Option<Arc<T>>>,
}

impl<T: Send + Sync + 'static> Flights<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Scope, Flight<T>>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Flights in progress.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Joins the flight of `scope`, or starts one.
    pub fn join(self: &Arc<Self>, scope: &Scope, fingerprint: Fingerprint) -> Joined<T> {
        let mut map = self.lock();
        match map.get(scope) {
            Some(f) if f.fingerprint != fingerprint => Joined::Mismatch,
            Some(f) => Joined::Follow(Follower {
                rx: f.outcome.clone(),
            }),
            None => {
                let (tx, rx) = watch::channel(None);
                map.insert(
                    scope.clone(),
                    Flight {
                        fingerprint,
                        outcome: rx.clone(),
                    },
                );
                Joined::Lead(
                    Lead {
                        flights: self.clone(),
                        scope: scope.clone(),
                        tx,
                    },
                    Follower { rx },
                )
            }
        }
    }
}

impl<T> Lead<T> {
    /// Ends the flight with `outcome`: every follower gets it.
    pub fn complete(self, outcome: T) {
        self.tx.send_replace(Some(Arc::new(outcome)));
    }
}

impl<T> Drop for Lead<T> {
    fn drop(&mut self) {
        // Removed after the outcome was sent: a new arrival either follows this flight
        // (and gets the outcome) or finds none and claims the (finished) key itself.
        self.flights
            .map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.scope);
    }
}

impl<T> Follower<T> {
    /// The flight's outcome; `None` when its lead was dropped without one.
    pub async fn outcome(mut self) -> Option<Arc<T>> {
        match self.rx.wait_for(Option::is_some).await {
            Ok(v) => v.clone(),
            Err(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{IdempotencyKey, TenantId};

    fn scope(k: &str) -> Scope {
        Scope::new(TenantId::new("t").unwrap(), IdempotencyKey::new(k).unwrap())
    }

    #[tokio::test]
    async fn local_wakeups_wake_subscribers_and_clean_up() {
        let w = LocalWakeups::default();
        let mut a = w.subscribe(&scope("k")).await;
        let mut b = w.subscribe(&scope("k")).await;
        let mut other = w.subscribe(&scope("other")).await;
        w.publish(&scope("k")).await;
        tokio::time::timeout(Duration::from_secs(1), a.woken())
            .await
            .expect("a woken");
        tokio::time::timeout(Duration::from_secs(1), b.woken())
            .await
            .expect("b woken");
        assert!(
            tokio::time::timeout(Duration::from_millis(50), other.woken())
                .await
                .is_err(),
            "a different scope is not woken"
        );
        // Woken once, a waiter listens again: the next publish wakes it again.
        assert!(
            tokio::time::timeout(Duration::from_millis(50), a.woken())
                .await
                .is_err(),
            "no second wake-up without a second publish"
        );
        w.publish(&scope("k")).await;
        tokio::time::timeout(Duration::from_secs(1), a.woken())
            .await
            .expect("a woken again");
        drop((a, b, other));
        assert!(w.is_empty(), "the map is cleaned up");
    }

    #[tokio::test]
    async fn flights_share_one_outcome_and_refuse_another_request() {
        let flights: Arc<Flights<u32>> = Arc::default();
        let fp = Fingerprint::from_bytes([1; 32]);
        let Joined::Lead(lead, mine) = flights.join(&scope("k"), fp) else {
            panic!("first arrival leads")
        };
        let Joined::Follow(follower) = flights.join(&scope("k"), fp) else {
            panic!("second arrival follows")
        };
        assert!(matches!(
            flights.join(&scope("k"), Fingerprint::from_bytes([2; 32])),
            Joined::Mismatch
        ));
        lead.complete(7);
        assert_eq!(follower.outcome().await.as_deref(), Some(&7));
        assert_eq!(mine.outcome().await.as_deref(), Some(&7));
        assert!(flights.is_empty());
        let Joined::Lead(lead, follower) = flights.join(&scope("k"), fp) else {
            panic!("a finished flight is gone")
        };
        drop(lead);
        assert_eq!(
            follower.outcome().await,
            None,
            "a dropped lead ends with none"
        );
    }
}
