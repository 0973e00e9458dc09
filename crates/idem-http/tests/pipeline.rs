//! The shared pipeline steps against a real store (SQLite): waiting for the first
//! execution, the shutdown's cut-off, the lease heartbeat.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use idem_conformance::{fresh_tenant, request};
use idem_core::{
    Claim, ClaimRequest, ClaimToken, Finish, IdempotencyStore, Millis, Record, Scope, StoreError,
};
use idem_http::pipeline::{self, Executions, LocalWakeups, Ran};
use idem_http::InProgressMode;
use idem_sqlite::SqliteStore;

async fn store() -> (tempfile::TempDir, Arc<SqliteStore>) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open_path(dir.path().join("idem.db"))
        .await
        .unwrap();
    (dir, Arc::new(store))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_the_finish_and_replays() {
    let (_dir, store) = store().await;
    let wakeups = LocalWakeups::default();
    let cut_off = Executions::default();
    let tenant = fresh_tenant();
    let first = request(&tenant, "k", "p", "a");
    let Claim::Proceed(token) = store.claim(&first).await.unwrap() else {
        panic!("first claim proceeds")
    };
    let waiter = {
        let (store, wakeups) = (store.clone(), wakeups.clone());
        let req = request(&tenant, "k", "p", "b");
        tokio::spawn(async move {
            let cut_off = Executions::default();
            let mode = InProgressMode::Wait {
                max_wait: Duration::from_secs(20),
            };
            pipeline::claim(store.as_ref(), &wakeups, &req, mode, &cut_off).await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let result = idem_conformance::result("{}");
    store.complete(&token, result).await.unwrap();
    pipeline::Wakeups::publish(&wakeups, &first.scope).await;
    let claimed = waiter.await.unwrap().unwrap();
    assert!(claimed.waited);
    assert!(
        matches!(claimed.claim, Claim::Replay(_)),
        "{:?}",
        claimed.claim
    );
    // Woken, not by the 30 s lease deadline.
    assert!(started.elapsed() < Duration::from_secs(5));
    drop(cut_off);
}

/// The real store, counting claims and lease renewals; renewals wait until the gate
/// is open.
struct Watched {
    inner: Arc<SqliteStore>,
    claims: AtomicUsize,
    renewing: AtomicUsize,
    gate: tokio::sync::watch::Sender<bool>,
}

impl Watched {
    fn new(inner: Arc<SqliteStore>, open: bool) -> Self {
        Self {
            inner,
            claims: AtomicUsize::new(0),
            renewing: AtomicUsize::new(0),
            gate: tokio::sync::watch::channel(open).0,
        }
    }
}

#[async_trait]
impl IdempotencyStore for Watched {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        self.inner.claim(req).await
    }
    async fn finish(&self, token: &ClaimToken, finish: Finish) -> Result<Record, StoreError> {
        self.inner.finish(token, finish).await
    }
    async fn extend_lease(
        &self,
        token: &ClaimToken,
        lease: Duration,
    ) -> Result<Millis, StoreError> {
        self.renewing.fetch_add(1, Ordering::SeqCst);
        let mut open = self.gate.subscribe();
        let _ = open.wait_for(|o| *o).await;
        self.inner.extend_lease(token, lease).await
    }
    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        self.inner.get(scope).await
    }
    async fn unique_guard(&self) -> Result<bool, StoreError> {
        self.inner.unique_guard().await
    }
}

/// A fresh key claimed by owner `a` with `lease`.
async fn claimed(
    lease: Duration,
) -> (
    tempfile::TempDir,
    Arc<SqliteStore>,
    idem_core::TenantId,
    ClaimRequest,
    ClaimToken,
) {
    let (dir, store) = store().await;
    let tenant = fresh_tenant();
    let mut req = request(&tenant, "k", "p", "a");
    req.lease = lease;
    let Claim::Proceed(token) = store.claim(&req).await.unwrap() else {
        panic!("proceeds")
    };
    (dir, store, tenant, req, token)
}

/// A renewal that waits on the work (a handler's transaction holding the writer the
/// renewal needs) must not stop the work: it runs on and lets the renewal through.
#[tokio::test]
async fn the_work_runs_on_while_a_renewal_waits() {
    let (_dir, store, _, req, token) = claimed(Duration::from_millis(300)).await;
    let held = Watched::new(store.clone(), false);
    let cut_off = Executions::default();
    let work = async {
        // Until the first heartbeat is stuck on the gate, then open it.
        while held.renewing.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        held.gate.send_replace(true);
        "done"
    };
    let ran = tokio::time::timeout(
        Duration::from_secs(5),
        pipeline::under_lease(&held, &token, req.lease, &cut_off, work),
    )
    .await
    .expect("the work was not starved by the waiting renewal");
    assert!(matches!(ran, Ran::Done("done")));
    assert!(held.renewing.load(Ordering::SeqCst) >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cut_off_answers_a_waiter_without_claiming_again() {
    let (_dir, store) = store().await;
    let tenant = fresh_tenant();
    let first = request(&tenant, "k", "p", "a");
    assert!(matches!(
        store.claim(&first).await.unwrap(),
        Claim::Proceed(_)
    ));
    let cut_off = Arc::new(Executions::default());
    let counting = Arc::new(Watched::new(store.clone(), true));
    let waiter = {
        let (store, cut_off) = (counting.clone(), cut_off.clone());
        let req = request(&tenant, "k", "p", "b");
        tokio::spawn(async move {
            let mode = InProgressMode::Wait {
                max_wait: Duration::from_secs(20),
            };
            let wakeups = LocalWakeups::default();
            pipeline::claim(store.as_ref(), &wakeups, &req, mode, &cut_off).await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let claims_before = counting.claims.load(Ordering::SeqCst);
    assert_eq!(
        claims_before, 2,
        "claim, subscribe, claim again, then sleep"
    );
    cut_off.cancel();
    let claimed = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("the cut-off ends the wait at once")
        .unwrap()
        .unwrap();
    assert!(
        matches!(claimed.claim, Claim::InProgress { .. })
            && pipeline::lease_left(&claimed.claim) > Duration::from_secs(20),
        "{:?}",
        claimed.claim
    );
    assert_eq!(
        counting.claims.load(Ordering::SeqCst),
        claims_before,
        "no claim after the cut-off: it could start an execution past the grace"
    );
    // The first owner still holds the key.
    let record = store.get(&first.scope).await.unwrap().unwrap();
    assert_eq!(record.owner.as_ref().map(|o| o.as_str()), Some("a"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_lease_renews_and_a_cut_off_drops_the_work() {
    let (_dir, store, tenant, req, token) = claimed(Duration::from_millis(300)).await;
    let cut_off = Executions::default();
    // Work three leases long: the heartbeat must keep the claim ours.
    let ran = pipeline::under_lease(
        store.as_ref(),
        &token,
        req.lease,
        &cut_off,
        tokio::time::sleep(Duration::from_millis(900)),
    )
    .await;
    assert!(matches!(ran, Ran::Done(())));
    let mut other = request(&tenant, "k", "p", "b");
    other.lease = Duration::from_secs(5);
    assert!(
        matches!(store.claim(&other).await.unwrap(), Claim::InProgress { .. }),
        "the renewed lease still holds"
    );

    let dropped = Arc::new(AtomicBool::new(false));
    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let flag = Flag(dropped.clone());
    let work = async move {
        let _flag = flag;
        tokio::time::sleep(Duration::from_secs(30)).await;
    };
    let cut = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        cut_off.cancel();
    };
    let (ran, ()) = tokio::join!(
        pipeline::under_lease(store.as_ref(), &token, req.lease, &cut_off, work),
        cut
    );
    assert!(matches!(ran, Ran::CutOff));
    assert!(
        dropped.load(Ordering::SeqCst),
        "the cut-off work was dropped"
    );
    // Cut off before it starts: the work is never polled.
    let polled = Arc::new(AtomicBool::new(false));
    let seen = polled.clone();
    let ran = pipeline::under_lease(store.as_ref(), &token, req.lease, &cut_off, async move {
        seen.store(true, Ordering::SeqCst);
    })
    .await;
    assert!(matches!(ran, Ran::CutOff));
    assert!(!polled.load(Ordering::SeqCst), "no work after the cut-off");
}

/// A store that keeps results of at most `max` bytes.
async fn store_keeping(max: usize) -> (tempfile::TempDir, Arc<SqliteStore>) {
    let dir = tempfile::tempdir().unwrap();
    let mut options = idem_sqlite::SqliteOptions::new(dir.path().join("idem.db"));
    options.limits = idem_core::StoreLimits::with_max_result_bytes(max);
    (dir, Arc::new(SqliteStore::open(options).await.unwrap()))
}

fn stored(body: usize) -> idem_core::StoredResult {
    idem_core::StoredResult {
        status: 201,
        headers: vec![("content-type".into(), "application/json".into())],
        body: vec![b'x'; body],
        result_ref: None,
    }
}

/// Claims `key` and finishes it with a `body`-byte result under `policy`; the record
/// written, as the store holds it.
async fn finish_with(
    store: &SqliteStore,
    tenant: &idem_core::TenantId,
    key: &str,
    body: usize,
    policy: pipeline::FinishPolicy,
) -> Record {
    let req = request(tenant, key, "p", "a");
    let Claim::Proceed(token) = store.claim(&req).await.unwrap() else {
        panic!("{key}: a fresh claim proceeds")
    };
    let end = Finish {
        state: idem_core::RecordState::Succeeded,
        result: Some(stored(body)),
    };
    let (read, by) = pipeline::finish(store, &token, end, policy)
        .await
        .unwrap_or_else(|e| panic!("{key}: {e:?}"));
    assert_eq!(by, pipeline::FinishedBy::Pipeline, "{key}");
    let record = store.get(&req.scope).await.unwrap().expect("the record");
    // Written by the pipeline: handed back exactly when the policy reads it.
    match read {
        Some(read) => {
            assert!(policy.read_back, "{key}");
            assert_eq!(read, record, "{key}");
        }
        None => assert!(!policy.read_back, "{key}"),
    }
    record
}

#[tokio::test]
async fn a_result_the_store_refuses_is_forgotten_or_kept_without_its_body() {
    use idem_core::RecordState;
    use pipeline::{FinishPolicy, TooLarge};

    let (_dir, store) = store_keeping(256).await;
    let tenant = fresh_tenant();
    // The gateway's policy (one attempt, a refused result forgotten): a result that
    // fits is kept whole, one that does not leaves the key open for a retry.
    let gateway = FinishPolicy {
        attempts: 1,
        too_large: TooLarge::Forget,
        read_back: false,
    };
    let kept = finish_with(&store, &tenant, "fits", 16, gateway).await;
    assert_eq!(kept.state, RecordState::Succeeded);
    assert_eq!(kept.result, Some(stored(16)));
    let forgotten = finish_with(&store, &tenant, "forgotten", 1000, gateway).await;
    assert_eq!(forgotten.state, RecordState::FailedRetryable);
    assert_eq!(forgotten.result, None);
    // The layer's policy: status and headers kept, the body left out and said so.
    let layer = FinishPolicy {
        attempts: 6,
        too_large: TooLarge::OmitBody,
        read_back: true,
    };
    let omitted = finish_with(&store, &tenant, "omitted", 1000, layer).await;
    assert_eq!(omitted.state, RecordState::Succeeded);
    let omitted = omitted.result.expect("kept without its body");
    assert_eq!(omitted.status, 201);
    assert!(omitted.body.is_empty());
    assert!(omitted
        .headers
        .iter()
        .any(|(n, v)| n == "idempotent-body-omitted" && v == "true"));
    assert!(omitted.headers.iter().any(|(n, _)| n == "content-type"));
}
