//! Scenario functions every idem store must pass.
//!
//! Each scenario takes a [`Harness`] (which opens the store under test) and asserts the
//! behaviour callers rely on. A backend's test module calls [`store_tests!`] once; that
//! expands to one test per scenario, so every backend runs the same list. Behaviour that
//! legitimately differs between backends is a harness parameter, never a copy of a
//! scenario.
//!
//! Isolation: every scenario works under a tenant of its own, so backends that share a
//! server between tests (PostgreSQL, Redis) need no cleanup between scenarios; the
//! harness removes its schema or key prefix when dropped.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{
    Claim, ClaimKind, ClaimRequest, ClockShift, ErrorKind, Fingerprint, IdempotencyKey,
    IdempotencyStore, OwnerId, Principal, RecordState, Scope, StoredResult, TenantId,
};
use tokio::sync::Barrier;

pub mod lease;
mod services;
pub use services::{require_services, skip_or_fail};

/// Opens the store under test.
#[async_trait]
pub trait Harness: Send + Sync + 'static {
    /// Opens the store; every call sees the same data (a reopen after a drop).
    async fn open(&self) -> Arc<dyn IdempotencyStore>;
    /// The shift applied to the store clock of every store this harness opens.
    fn clock(&self) -> &ClockShift;
    /// The result size limit the stores are opened with.
    fn max_result_bytes(&self) -> usize;
}

/// A fresh tenant per scenario.
pub fn fresh_tenant() -> TenantId {
    TenantId::new(format!("t-{}", uuid::Uuid::now_v7().simple())).unwrap()
}

pub fn key(s: &str) -> IdempotencyKey {
    IdempotencyKey::new(s).unwrap()
}

pub fn owner(s: &str) -> OwnerId {
    OwnerId::new(s).unwrap()
}

/// A claim request with a payload-derived fingerprint.
pub fn request(tenant: &TenantId, k: &str, payload: &str, who: &str) -> ClaimRequest {
    ClaimRequest {
        scope: Scope::new(tenant.clone(), key(k)),
        principal: Principal::new("user-7318").unwrap(),
        fingerprint: Fingerprint::of_bytes(payload.as_bytes()),
        owner: owner(who),
        lease: Duration::from_secs(30),
    }
}

pub fn result(body: &str) -> StoredResult {
    StoredResult {
        status: 201,
        headers: vec![("content-type".into(), "application/json".into())],
        body: body.as_bytes().to_vec(),
        result_ref: Some(format!("order:{body}")),
    }
}

fn expect_proceed(claim: Claim) -> idem_core::ClaimToken {
    match claim {
        Claim::Proceed(t) => t,
        other => panic!("expected proceed, got {other:?}"),
    }
}

/// The first claim of an absent key proceeds as a fresh execution; completing it makes
/// every later claim a replay of the stored result.
pub async fn first_claim_proceeds(h: &dyn Harness) {
    let store = h.open().await;
    let t = fresh_tenant();
    let req = request(&t, "k1", "p", "a");
    assert_eq!(store.get(&req.scope).await.unwrap(), None);
    let token = expect_proceed(store.claim(&req).await.unwrap());
    assert_eq!(token.kind, ClaimKind::Fresh);
    assert_eq!(token.attempt, 1);
    let rec = store.get(&req.scope).await.unwrap().expect("record");
    assert_eq!(rec.state, RecordState::Processing);
    assert_eq!(rec.version, token.version);
    assert_eq!(rec.owner.as_ref(), Some(&req.owner));
    assert!(rec.lease_expires_at.unwrap() > rec.created_at);

    let done = store.complete(&token, result("order-1")).await.unwrap();
    assert_eq!(done.state, RecordState::Succeeded);
    assert!(done.version > token.version);
    assert_eq!(done.result, Some(result("order-1")));
    assert!(done.completed_at.is_some());

    let again = request(&t, "k1", "p", "b");
    match store.claim(&again).await.unwrap() {
        Claim::Replay(r) => {
            assert_eq!(r.result, Some(result("order-1")));
            assert_eq!(r.state, RecordState::Succeeded);
        }
        other => panic!("expected replay, got {other:?}"),
    }
    // Completing twice is a stale completion.
    let err = store.complete(&token, result("order-2")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict);
    assert_eq!(
        store.get(&req.scope).await.unwrap().unwrap().result,
        Some(result("order-1"))
    );
    assert!(store.unique_guard().await.unwrap());
}

#[derive(Debug, PartialEq)]
enum Arrival {
    Executed(Vec<u8>),
    Replayed(Vec<u8>),
}

/// Runs `n` concurrent arrivals of one intent: each claims; the winner "executes" and
/// completes; the others wait (in progress) and finally replay.
async fn race(
    store: Arc<dyn IdempotencyStore>,
    tenant: &TenantId,
    k: &str,
    n: usize,
) -> (Vec<Arrival>, usize) {
    let barrier = Arc::new(Barrier::new(n));
    let in_progress = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..n {
        let store = store.clone();
        let barrier = barrier.clone();
        let in_progress = in_progress.clone();
        let req = request(tenant, k, "same-payload", &format!("owner-{i}"));
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            loop {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "race did not settle"
                );
                match store.claim(&req).await.expect("claim") {
                    Claim::Proceed(token) => {
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        let body = uuid::Uuid::now_v7().to_string();
                        store
                            .complete(&token, result(&body))
                            .await
                            .expect("complete");
                        return Arrival::Executed(result(&body).body);
                    }
                    Claim::InProgress { .. } => {
                        in_progress.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    Claim::Replay(rec) => {
                        return Arrival::Replayed(rec.result.expect("stored result").body)
                    }
                    Claim::Mismatch { .. } => panic!("same payload reported as mismatch"),
                }
            }
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("task"));
    }
    let waits = in_progress.load(std::sync::atomic::Ordering::Relaxed);
    (out, waits)
}

/// `n` concurrent claims of one key, `reps` times: exactly one executes, every other
/// arrival gets the identical stored result.
pub async fn concurrent_claims_one_winner(h: &dyn Harness, n: usize, reps: usize) {
    let store = h.open().await;
    let t = fresh_tenant();
    for rep in 0..reps {
        let k = format!("race-{rep}");
        let (arrivals, _) = race(store.clone(), &t, &k, n).await;
        let executed: Vec<_> = arrivals
            .iter()
            .filter_map(|a| match a {
                Arrival::Executed(b) => Some(b.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(executed.len(), 1, "rep {rep}: executions");
        for a in &arrivals {
            if let Arrival::Replayed(b) = a {
                assert_eq!(
                    b, &executed[0],
                    "rep {rep}: replay differs from the first result"
                );
            }
        }
        let rec = store
            .get(&Scope::new(t.clone(), key(&k)))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(rec.state, RecordState::Succeeded);
        assert_eq!(rec.attempts, 1);
    }
}

/// Same key, different fingerprint: mismatch in every state, and nothing changes.
pub async fn mismatch_in_every_state(h: &dyn Harness) {
    let store = h.open().await;
    let t = fresh_tenant();
    for (i, target) in RecordState::ALL.into_iter().enumerate() {
        let k = format!("mm-{i}");
        let req = request(&t, &k, "payload-A", "a");
        let token = expect_proceed(store.claim(&req).await.unwrap());
        if target != RecordState::Processing {
            let finish = idem_core::Finish {
                state: target,
                result: Some(result("r")),
            };
            store.finish(&token, finish).await.unwrap();
        }
        let before = store.get(&req.scope).await.unwrap().unwrap();
        assert_eq!(before.state, target);
        let other = request(&t, &k, "payload-B", "b");
        assert_eq!(
            store.claim(&other).await.unwrap(),
            Claim::Mismatch { state: target },
            "state {target}"
        );
        // A different principal with the same payload is a different request too.
        let mut other_principal = request(&t, &k, "payload-A", "b");
        other_principal.principal = Principal::new("someone-else").unwrap();
        assert!(matches!(
            store.claim(&other_principal).await.unwrap(),
            Claim::Mismatch { .. }
        ));
        assert_eq!(store.get(&req.scope).await.unwrap().unwrap(), before);
    }
}

/// Tenant A's key is invisible to tenant B; one key string in two tenants is two intents.
pub async fn tenant_isolation(h: &dyn Harness) {
    let store = h.open().await;
    let a = fresh_tenant();
    let b = fresh_tenant();
    let ra = request(&a, "shared-key", "payload-A", "a");
    let ta = expect_proceed(store.claim(&ra).await.unwrap());
    store.complete(&ta, result("a-order")).await.unwrap();

    let rb_scope = Scope::new(b.clone(), key("shared-key"));
    assert_eq!(store.get(&rb_scope).await.unwrap(), None);
    // Even with a different payload, B's claim is a fresh intent, not a mismatch.
    let rb = request(&b, "shared-key", "payload-B", "b");
    let tb = expect_proceed(store.claim(&rb).await.unwrap());
    assert_eq!(tb.kind, ClaimKind::Fresh);
    store.complete(&tb, result("b-order")).await.unwrap();

    let rec_a = store.get(&ra.scope).await.unwrap().unwrap();
    let rec_b = store.get(&rb.scope).await.unwrap().unwrap();
    assert_eq!(rec_a.result, Some(result("a-order")));
    assert_eq!(rec_b.result, Some(result("b-order")));
    assert_eq!(rec_a.tenant, a);
    assert_eq!(rec_b.tenant, b);
}

/// PROCESSING with an expired lease is taken over by exactly one of `n` concurrent
/// callers; the old owner's late completion then fails and changes nothing.
pub async fn expired_lease_takeover(h: &dyn Harness, n: usize) {
    let store = h.open().await;
    let t = fresh_tenant();
    let mut first = request(&t, "lease", "p", "crashed-owner");
    first.lease = Duration::from_secs(3);
    let old = expect_proceed(store.claim(&first).await.unwrap());

    // Before expiry: in progress for everyone else.
    let early = request(&t, "lease", "p", "early");
    assert!(matches!(
        store.claim(&early).await.unwrap(),
        Claim::InProgress { .. }
    ));
    h.clock().advance(Duration::from_millis(3100));

    let barrier = Arc::new(Barrier::new(n));
    let mut tasks = Vec::new();
    for i in 0..n {
        let store = store.clone();
        let barrier = barrier.clone();
        let req = request(&t, "lease", "p", &format!("taker-{i}"));
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            store.claim(&req).await.expect("claim")
        }));
    }
    let mut winners = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            Claim::Proceed(tok) => winners.push(tok),
            Claim::InProgress { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one takeover");
    let new = winners.pop().unwrap();
    assert_eq!(
        new.kind,
        ClaimKind::ExpiredLease {
            previous_owner: Some(owner("crashed-owner"))
        }
    );
    assert_eq!(new.attempt, 2);
    assert!(new.version > old.version);

    let before = store.get(&first.scope).await.unwrap().unwrap();
    let err = store.complete(&old, result("late")).await.unwrap_err();
    assert!(err.is_superseded(), "{err:?}");
    let err = store
        .extend_lease(&old, Duration::from_secs(30))
        .await
        .unwrap_err();
    assert!(err.is_superseded(), "{err:?}");
    assert_eq!(store.get(&first.scope).await.unwrap().unwrap(), before);

    store.complete(&new, result("taker")).await.unwrap();
    let rec = store.get(&first.scope).await.unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Succeeded);
    assert_eq!(rec.result, Some(result("taker")));
}

/// A heartbeat pushes the deadline from the store's clock; a record whose lease was
/// extended is not taken over.
pub async fn extend_lease_keeps_ownership(h: &dyn Harness) {
    let store = h.open().await;
    let t = fresh_tenant();
    let mut req = request(&t, "hb", "p", "worker");
    req.lease = Duration::from_secs(3);
    let token = expect_proceed(store.claim(&req).await.unwrap());
    h.clock().advance(Duration::from_secs(2));
    let deadline = store
        .extend_lease(&token, Duration::from_secs(3))
        .await
        .unwrap();
    assert!(deadline > token.lease_expires_at);
    h.clock().advance(Duration::from_secs(2));
    // 4 s after the claim: the original lease is over, the extended one is not.
    let other = request(&t, "hb", "p", "other");
    assert!(matches!(
        store.claim(&other).await.unwrap(),
        Claim::InProgress { .. }
    ));
    let rec = store.get(&req.scope).await.unwrap().unwrap();
    assert_eq!(rec.lease_expires_at, Some(deadline));
    // The token is still good after a heartbeat.
    store.complete(&token, result("ok")).await.unwrap();
}

/// FAILED_RETRYABLE: exactly one of `n` concurrent retries wins; then everyone replays.
pub async fn retryable_failure_one_winner(h: &dyn Harness, n: usize) {
    let store = h.open().await;
    let t = fresh_tenant();
    let first = request(&t, "retry", "p", "first");
    let tok = expect_proceed(store.claim(&first).await.unwrap());
    let failed = store.fail(&tok, true, None).await.unwrap();
    assert_eq!(failed.state, RecordState::FailedRetryable);

    let barrier = Arc::new(Barrier::new(n));
    let mut tasks = Vec::new();
    for i in 0..n {
        let store = store.clone();
        let barrier = barrier.clone();
        let req = request(&t, "retry", "p", &format!("retrier-{i}"));
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            store.claim(&req).await.expect("claim")
        }));
    }
    let mut winners = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            Claim::Proceed(tok) => winners.push(tok),
            Claim::InProgress { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one retry wins");
    let win = winners.pop().unwrap();
    assert_eq!(win.kind, ClaimKind::RetryAfterFailure);
    assert_eq!(win.attempt, 2);
    // The first owner cannot finish a claim that was retried.
    assert!(store
        .complete(&tok, result("stale"))
        .await
        .unwrap_err()
        .is_superseded());
    store.complete(&win, result("retried")).await.unwrap();
    match store.claim(&first).await.unwrap() {
        Claim::Replay(r) => assert_eq!(r.result, Some(result("retried"))),
        other => panic!("expected replay, got {other:?}"),
    }
}

/// Terminal failures are stored and replayed like successes.
pub async fn terminal_failure_replays(h: &dyn Harness) {
    let store = h.open().await;
    let t = fresh_tenant();
    let req = request(&t, "terminal", "p", "a");
    let tok = expect_proceed(store.claim(&req).await.unwrap());
    let mut rejected = result("{\"type\":\"sold-out\"}");
    rejected.status = 422;
    rejected.result_ref = None;
    store
        .fail(&tok, false, Some(rejected.clone()))
        .await
        .unwrap();
    for i in 0..3 {
        let again = request(&t, "terminal", "p", &format!("b{i}"));
        match store.claim(&again).await.unwrap() {
            Claim::Replay(r) => {
                assert_eq!(r.state, RecordState::FailedTerminal);
                assert_eq!(r.result, Some(rejected.clone()));
            }
            other => panic!("expected replay, got {other:?}"),
        }
    }
}

/// A quiet finish writes what a finish writes, refuses what it refuses, and a stale
/// token's is superseded like any other write.
pub async fn quiet_finish_writes_what_finish_writes(h: &dyn Harness) {
    let store = h.open().await;
    let t = fresh_tenant();
    let loud = request(&t, "loud", "p", "a");
    let quiet = request(&t, "quiet", "p", "a");
    let loud_tok = expect_proceed(store.claim(&loud).await.unwrap());
    let quiet_tok = expect_proceed(store.claim(&quiet).await.unwrap());
    let done = |body: &str| idem_core::Finish {
        state: RecordState::Succeeded,
        result: Some(result(body)),
    };
    let written = store.finish(&loud_tok, done("same")).await.unwrap();
    let before = store.get(&quiet.scope).await.unwrap().unwrap();
    let mut big = result("x");
    big.body = vec![b'x'; h.max_result_bytes() + 1];
    let too_big = idem_core::Finish {
        state: RecordState::Succeeded,
        result: Some(big),
    };
    let err = store.finish_quiet(&quiet_tok, too_big).await.unwrap_err();
    assert!(
        matches!(err, idem_core::StoreError::ResultTooLarge { .. }),
        "{err:?}"
    );
    assert_eq!(store.get(&quiet.scope).await.unwrap().unwrap(), before);
    store.finish_quiet(&quiet_tok, done("same")).await.unwrap();
    let held = store.get(&quiet.scope).await.unwrap().unwrap();
    assert_eq!(held.state, written.state);
    assert_eq!(held.result, written.result);
    assert_eq!(
        held.version - quiet_tok.version,
        written.version - loud_tok.version
    );
    assert_eq!(held.owner.as_ref(), Some(&quiet.owner));
    assert_eq!(held.lease_expires_at, None);
    assert!(held.completed_at.is_some());
    // Finished once: the same token again is a stale write, and the record stays.
    let err = store
        .finish_quiet(&quiet_tok, done("other"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict);
    assert_eq!(store.get(&quiet.scope).await.unwrap().unwrap(), held);
    match store.claim(&request(&t, "quiet", "p", "b")).await.unwrap() {
        Claim::Replay(r) => assert_eq!(r.result, Some(result("same"))),
        other => panic!("expected replay, got {other:?}"),
    }
}

/// An abandoned claim leaves the key free and holds no result; a stale token cannot
/// abandon the claim that took the key over.
pub async fn abandoned_claim_frees_the_key(h: &dyn Harness) {
    let store = h.open().await;
    let t = fresh_tenant();
    let req = request(&t, "abandoned", "p", "a");
    let tok = expect_proceed(store.claim(&req).await.unwrap());
    store.abandon(&tok).await.unwrap();
    match store.get(&req.scope).await.unwrap() {
        None => {}
        Some(r) => {
            assert_eq!(r.state, RecordState::FailedRetryable);
            assert_eq!(r.result, None);
        }
    }
    // The same token again is a retry of the abandon (done, or superseded where the
    // record is gone); after another claim took the key it is superseded, and the new
    // claim is untouched.
    if let Err(e) = store.abandon(&tok).await {
        assert!(e.is_superseded(), "{e}");
    }
    let next = expect_proceed(
        store
            .claim(&request(&t, "abandoned", "p", "b"))
            .await
            .unwrap(),
    );
    assert!(store.abandon(&tok).await.unwrap_err().is_superseded());
    let held = store.get(&req.scope).await.unwrap().unwrap();
    assert_eq!(held.state, RecordState::Processing);
    assert_eq!(held.version, next.version);
    store.complete(&next, result("after")).await.unwrap();
    match store
        .claim(&request(&t, "abandoned", "p", "c"))
        .await
        .unwrap()
    {
        Claim::Replay(r) => assert_eq!(r.result, Some(result("after"))),
        other => panic!("expected replay, got {other:?}"),
    }
}

/// Every state survives closing and reopening the store.
pub async fn survives_reopen(h: &dyn Harness) {
    let t = fresh_tenant();
    let mut saved = Vec::new();
    {
        let store = h.open().await;
        for (i, target) in RecordState::ALL.into_iter().enumerate() {
            let req = request(&t, &format!("reopen-{i}"), "p", "a");
            let tok = expect_proceed(store.claim(&req).await.unwrap());
            if target != RecordState::Processing {
                let finish = idem_core::Finish {
                    state: target,
                    result: Some(result(&format!("r{i}"))),
                };
                store.finish(&tok, finish).await.unwrap();
            }
            saved.push(store.get(&req.scope).await.unwrap().unwrap());
        }
    }
    let store = h.open().await;
    for rec in saved {
        let scope = Scope::new(rec.tenant.clone(), rec.key.clone());
        assert_eq!(store.get(&scope).await.unwrap(), Some(rec));
    }
}

/// Bad input gives a typed error and writes nothing.
pub async fn bad_input_writes_nothing(h: &dyn Harness) {
    for bad in ["", "has space", "ctl\u{1}", &"k".repeat(256)] {
        assert!(IdempotencyKey::new(bad).is_err(), "{bad:?} accepted");
    }
    let store = h.open().await;
    let t = fresh_tenant();

    let mut zero = request(&t, "zero-lease", "p", "a");
    zero.lease = Duration::ZERO;
    let err = store.claim(&zero).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert_eq!(store.get(&zero.scope).await.unwrap(), None);

    let req = request(&t, "too-big", "p", "a");
    let tok = expect_proceed(store.claim(&req).await.unwrap());
    let before = store.get(&req.scope).await.unwrap().unwrap();
    let mut big = result("x");
    big.body = vec![b'x'; h.max_result_bytes() + 1];
    let err = store.complete(&tok, big).await.unwrap_err();
    assert!(
        matches!(err, idem_core::StoreError::ResultTooLarge { .. }),
        "{err:?}"
    );
    assert_eq!(store.get(&req.scope).await.unwrap().unwrap(), before);
    let processing_finish = idem_core::Finish {
        state: RecordState::Processing,
        result: None,
    };
    assert_eq!(
        store
            .finish(&tok, processing_finish)
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidInput
    );
    // The claim is still usable after the rejected writes.
    store.complete(&tok, result("fits")).await.unwrap();
}

/// Expands to one `#[tokio::test]` per scenario for a backend. `$open` is an async
/// expression yielding `Option<impl Harness>`; `None` means the backend's server is
/// absent and the test was skipped (see [`skip_or_fail`]).
#[macro_export]
macro_rules! store_tests {
    ($open:expr) => {
        $crate::store_tests!(@one $open, first_claim_proceeds, |h| $crate::first_claim_proceeds(h));
        $crate::store_tests!(@one $open, concurrent_8_claims_one_winner, |h| $crate::concurrent_claims_one_winner(h, 8, 25));
        $crate::store_tests!(@one $open, concurrent_64_claims_one_winner, |h| $crate::concurrent_claims_one_winner(h, 64, 10));
        $crate::store_tests!(@one $open, mismatch_in_every_state, |h| $crate::mismatch_in_every_state(h));
        $crate::store_tests!(@one $open, tenant_isolation, |h| $crate::tenant_isolation(h));
        $crate::store_tests!(@one $open, expired_lease_takeover_16, |h| $crate::expired_lease_takeover(h, 16));
        $crate::store_tests!(@one $open, extend_lease_keeps_ownership, |h| $crate::extend_lease_keeps_ownership(h));
        $crate::store_tests!(@one $open, retryable_failure_one_winner_16, |h| $crate::retryable_failure_one_winner(h, 16));
        $crate::store_tests!(@one $open, terminal_failure_replays, |h| $crate::terminal_failure_replays(h));
        $crate::store_tests!(@one $open, quiet_finish_writes_what_finish_writes, |h| $crate::quiet_finish_writes_what_finish_writes(h));
        $crate::store_tests!(@one $open, abandoned_claim_frees_the_key, |h| $crate::abandoned_claim_frees_the_key(h));
        $crate::store_tests!(@one $open, survives_reopen, |h| $crate::survives_reopen(h));
        $crate::store_tests!(@one $open, bad_input_writes_nothing, |h| $crate::bad_input_writes_nothing(h));
    };
    (@one $open:expr, $name:ident, |$h:ident| $body:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $name() {
            let Some(harness) = $open.await else { return };
            let $h: &dyn $crate::Harness = &harness;
            $body.await;
        }
    };
}
