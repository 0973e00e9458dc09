//! Test environments (SQLite file, PostgreSQL schema per test) and the scenarios every
//! retention backend passes. Time is controlled with `ClockShift` (the store's clock)
//! and the sweep's explicit `now`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_conformance::{fresh_tenant, request};
use idem_core::retention::{
    dropped_response, key_digest, result_digest, ArchiveExpiry, ArchiveLookup, ArchivedRecord,
    CompensationCheck, Demotion, DueRecord, RetentionStore, ScanCursor, StaleRecord, TierUsage,
};
use idem_core::{
    Claim, ClaimKind, ClockShift, IdempotencyKey, IdempotencyStore, LeaseStore, Millis,
    RecordState, RetentionPolicy, Scope, StoreError, StoredResult, TenantId, Tier,
};
use idem_sweep::{LeaseOutcome, SweepOptions, Sweeper};

pub const DAY: Duration = Duration::from_secs(86_400);
pub const DAY_MS: i64 = 86_400_000;

/// The store's own `seed_terminal` (a fixture, outside the retention contract):
/// `(tenant, prefix, count, completed_at, body_bytes)`.
pub type Seed = Arc<
    dyn Fn(
            TenantId,
            &'static str,
            u64,
            Millis,
            usize,
        ) -> Pin<Box<dyn Future<Output = Result<u64, StoreError>> + Send>>
        + Send
        + Sync,
>;

pub struct Env {
    pub store: Arc<dyn IdempotencyStore>,
    pub retention: Arc<dyn RetentionStore>,
    pub leases: Arc<dyn LeaseStore>,
    pub seed: Seed,
    pub clock: ClockShift,
    pub _guard: Box<dyn std::any::Any + Send>,
}

pub async fn sqlite() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let clock = ClockShift::new();
    let mut opts = idem_sqlite::SqliteOptions::new(dir.path().join("idem.db"));
    opts.clock = clock.clone();
    let store = Arc::new(idem_sqlite::SqliteStore::open(opts).await.unwrap());
    let seeder = store.clone();
    Env {
        store: store.clone(),
        retention: store.clone(),
        leases: store,
        seed: Arc::new(move |t, prefix, n, at, bytes| {
            let s = seeder.clone();
            Box::pin(async move { s.seed_terminal(&t, prefix, n, at, bytes).await })
        }),
        clock,
        _guard: Box::new(dir),
    }
}

pub struct PgSchema {
    url: String,
    schema: String,
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        let (url, schema) = (self.url.clone(), self.schema.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                use sqlx::{Connection, Executor};
                let mut c = sqlx::PgConnection::connect(&url).await?;
                c.execute("SET lock_timeout = '30s'").await?;
                c.execute(sqlx::AssertSqlSafe(format!(
                    "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
                )))
                .await?;
                c.close().await
            })
        })
        .join();
    }
}

pub async fn postgres() -> Option<Env> {
    use sqlx::Connection;
    let url = std::env::var("IDEM_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    match sqlx::PgConnection::connect(&url).await {
        Ok(c) => {
            let _ = c.close().await;
        }
        Err(e) => {
            idem_conformance::skip_or_fail("PostgreSQL", &e);
            return None;
        }
    }
    let schema = format!("idem_sweep_t_{}", uuid_like());
    let clock = ClockShift::new();
    let opts = {
        let mut o = idem_postgres::PgOptions::default();
        o.schema = Some(schema.clone());
        o.clock = clock.clone();
        o.max_connections = 8;
        o
    };
    let store = Arc::new(idem_postgres::PgStore::connect(&url, opts).await.unwrap());
    store.migrate().await.unwrap();
    let seeder = store.clone();
    Some(Env {
        store: store.clone(),
        retention: store.clone(),
        leases: store,
        seed: Arc::new(move |t, prefix, n, at, bytes| {
            let s = seeder.clone();
            Box::pin(async move { s.seed_terminal(&t, prefix, n, at, bytes).await })
        }),
        clock,
        _guard: Box::new(PgSchema { url, schema }),
    })
}

fn uuid_like() -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    static N: AtomicUsize = AtomicUsize::new(0);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{t:x}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

pub fn order_result(order: &str) -> StoredResult {
    StoredResult {
        status: 201,
        headers: vec![("content-type".into(), "application/json".into())],
        body: format!("{{\"order_id\":\"{order}\"}}").into_bytes(),
        result_ref: Some(order.to_string()),
    }
}

pub fn sweeper(env: &Env) -> Sweeper {
    Sweeper::new(env.retention.clone(), RetentionPolicy::default()).with_batch(7)
}

pub async fn sweep(env: &Env) -> idem_sweep::SweepReport {
    sweeper(env).run(&SweepOptions::default()).await.unwrap()
}

fn expect_replay(c: Claim) -> idem_core::Record {
    match c {
        Claim::Replay(r) => r,
        other => panic!("expected replay, got {other:?}"),
    }
}

/// A record walks retry → replay → dispute → archive; at each step a duplicate gets the
/// right answer, a message on day 6 finds the original result, and on day 100 the
/// archive finds the fingerprint by key and by order number.
pub async fn walks_through_all_tiers(env: &Env) {
    let t = fresh_tenant();
    let req = request(&t, "order-confirm-1", "payload", "a");
    let token = match env.store.claim(&req).await.unwrap() {
        Claim::Proceed(t) => t,
        other => panic!("{other:?}"),
    };
    let full = order_result("O-7318");
    env.store.complete(&token, full.clone()).await.unwrap();
    let scope = req.scope.clone();
    let dup = || request(&t, "order-confirm-1", "payload", "b");

    // Day 0: full replay; nothing due.
    let r = expect_replay(env.store.claim(&dup()).await.unwrap());
    assert_eq!(r.result, Some(full.clone()));
    let report = sweep(env).await;
    assert_eq!(report.total(), 0, "{report:?}");
    assert_eq!(
        env.retention.tier_of(&scope).await.unwrap(),
        Some(Tier::Retry)
    );

    // Day 2: past the retry window → replay tier, response dropped, reference kept.
    env.clock.advance(2 * DAY);
    let report = sweep(env).await;
    assert_eq!(report.moved(Tier::Retry), 1, "{report:?}");
    assert_eq!(
        env.retention.tier_of(&scope).await.unwrap(),
        Some(Tier::Replay)
    );
    let r = expect_replay(env.store.claim(&dup()).await.unwrap());
    let kept = r.result.clone().unwrap();
    assert_eq!(dropped_response(&kept), Some(Tier::Replay));
    assert_eq!(kept.status, 201);
    assert_eq!(kept.result_ref.as_deref(), Some("O-7318"));
    assert!(kept.body.is_empty());

    // Day 6: a redelivered message still finds the original result.
    env.clock.advance(4 * DAY);
    assert_eq!(sweep(env).await.total(), 0);
    let r = expect_replay(env.store.claim(&dup()).await.unwrap());
    assert_eq!(r.result.unwrap().result_ref.as_deref(), Some("O-7318"));
    assert_eq!(r.state, RecordState::Succeeded);

    // Day 8: dispute tier; still online, still a (reconstructable) replay.
    env.clock.advance(2 * DAY);
    let report = sweep(env).await;
    assert_eq!(report.moved(Tier::Replay), 1, "{report:?}");
    assert_eq!(
        env.retention.tier_of(&scope).await.unwrap(),
        Some(Tier::Dispute)
    );
    let r = expect_replay(env.store.claim(&dup()).await.unwrap());
    assert_eq!(
        dropped_response(r.result.as_ref().unwrap()),
        Some(Tier::Dispute)
    );
    assert_eq!(r.result.unwrap().result_ref.as_deref(), Some("O-7318"));
    assert_eq!(r.owner, None, "the dispute tier keeps audit fields only");

    // Day 100: archived; off the online index, found by key and by order number.
    env.clock.advance(92 * DAY);
    let report = sweep(env).await;
    assert_eq!(report.moved(Tier::Dispute), 1, "{report:?}");
    assert_eq!(env.store.get(&scope).await.unwrap(), None);
    assert_eq!(env.retention.tier_of(&scope).await.unwrap(), None);
    let a = env
        .retention
        .archived(&t, &scope.key)
        .await
        .unwrap()
        .expect("archived");
    assert_eq!(a.fingerprint, req.fingerprint);
    assert_eq!(a.key_digest, key_digest(&scope.key));
    assert_eq!(a.result_digest, Some(result_digest(&full)));
    assert_eq!(a.result_ref.as_deref(), Some("O-7318"));
    assert_eq!(a.state, RecordState::Succeeded);
    assert_eq!(a.status, Some(201));
    let by_order = env.retention.archived_by_ref(None, "O-7318").await.unwrap();
    assert_eq!(by_order, vec![a.clone()]);
    assert_eq!(
        env.retention
            .archived_by_ref(Some(&t), "O-7318")
            .await
            .unwrap(),
        vec![a]
    );
    assert!(env
        .retention
        .archived_by_ref(Some(&fresh_tenant()), "O-7318")
        .await
        .unwrap()
        .is_empty());
    // Rerunning changes nothing.
    assert_eq!(sweep(env).await.total(), 0);
}

struct Pending(String);

#[async_trait]
impl CompensationCheck for Pending {
    async fn pending(&self, _: &TenantId, result_ref: &str) -> Result<bool, StoreError> {
        Ok(result_ref == self.0)
    }
}

/// A record whose refund is pending stays in its tier past every window.
pub async fn pending_compensation_survives(env: &Env) {
    let t = fresh_tenant();
    for (k, order) in [("k-paid", "O-1"), ("k-refund-pending", "O-2")] {
        let req = request(&t, k, "p", "a");
        let Claim::Proceed(tok) = env.store.claim(&req).await.unwrap() else {
            panic!()
        };
        env.store.complete(&tok, order_result(order)).await.unwrap();
    }
    env.clock.advance(100 * DAY);
    let s = sweeper(env).with_compensation(Arc::new(Pending("O-2".into())));
    let report = s.run(&SweepOptions::default()).await.unwrap();
    assert_eq!(report.moved(Tier::Dispute), 1, "{report:?}");
    assert_eq!(report.skipped_pending_compensation.get("retry"), Some(&1));
    let pending = Scope::new(t.clone(), IdempotencyKey::new("k-refund-pending").unwrap());
    assert_eq!(
        env.retention.tier_of(&pending).await.unwrap(),
        Some(Tier::Retry)
    );
    let rec = env.store.get(&pending).await.unwrap().unwrap();
    assert_eq!(rec.result, Some(order_result("O-2")), "full evidence kept");
    // Once the refund settled, the next sweep moves it all the way.
    let report = sweep(env).await;
    assert_eq!(report.moved(Tier::Dispute), 1, "{report:?}");
    assert_eq!(env.store.get(&pending).await.unwrap(), None);
}

/// PROCESSING past its lease → FAILED_RETRYABLE with an event; never deleted; the old
/// owner's late finish fails; a live lease is untouched even with a later `--now`.
pub async fn stale_processing_recovered(env: &Env) {
    let t = fresh_tenant();
    let mut dead = request(&t, "crashed", "p", "owner-a");
    dead.lease = Duration::from_secs(30);
    let Claim::Proceed(dead_token) = env.store.claim(&dead).await.unwrap() else {
        panic!()
    };
    let mut live = request(&t, "running", "p", "owner-b");
    live.lease = Duration::from_secs(3600);
    let Claim::Proceed(_) = env.store.claim(&live).await.unwrap() else {
        panic!()
    };
    env.clock.advance(Duration::from_secs(31));
    // A `--now` far ahead must not judge the live lease: the stale scan uses the store
    // clock.
    let far = env.retention.now().await.unwrap() + 10 * DAY_MS;
    let s = sweeper(env);
    let dry = s
        .run(&SweepOptions {
            dry_run: true,
            now: Some(far),
            progress: false,
        })
        .await
        .unwrap();
    assert_eq!(dry.stale_recovered(), 1, "{dry:?}");
    assert_eq!(
        env.store.get(&dead.scope).await.unwrap().unwrap().state,
        RecordState::Processing,
        "a dry run writes nothing"
    );
    let report = s
        .run(&SweepOptions {
            now: Some(far),
            ..SweepOptions::default()
        })
        .await
        .unwrap();
    assert_eq!(report.stale_recovered(), 1, "{report:?}");
    assert_eq!(report.stale_events[0].key, "crashed");
    assert_eq!(report.stale_events[0].owner.as_deref(), Some("owner-a"));
    assert_eq!(s.metrics().stale_recovered_total(), 1);
    let rec = env
        .store
        .get(&dead.scope)
        .await
        .unwrap()
        .expect("never deleted");
    assert_eq!(rec.state, RecordState::FailedRetryable);
    assert_eq!(rec.version, dead_token.version + 1);
    assert_eq!(
        env.store.get(&live.scope).await.unwrap().unwrap().state,
        RecordState::Processing
    );
    // The crashed owner's late completion is refused; a retry wins the key.
    let late = env.store.complete(&dead_token, order_result("O-9")).await;
    assert!(late.unwrap_err().is_superseded());
    match env
        .store
        .claim(&request(&t, "crashed", "p", "owner-c"))
        .await
        .unwrap()
    {
        Claim::Proceed(tok) => assert_eq!(tok.kind, ClaimKind::RetryAfterFailure),
        other => panic!("{other:?}"),
    }
    assert_eq!(sweep(env).await.stale_recovered(), 0);
}

/// What the archive and the online table hold for `n` seeded keys, without the tenant.
async fn snapshot(env: &Env, t: &TenantId, n: u64) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for i in 0..n {
        let key = IdempotencyKey::new(format!("k-{i}")).unwrap();
        let scope = Scope::new(t.clone(), key.clone());
        let online = env.store.get(&scope).await.unwrap().map(|r| {
            (
                r.state,
                r.result
                    .map(|x| (x.status, x.headers, x.body, x.result_ref)),
            )
        });
        let tier = env.retention.tier_of(&scope).await.unwrap();
        let archived = env.retention.archived(t, &key).await.unwrap().map(|a| {
            (
                a.key_digest,
                a.result_digest,
                a.result_ref,
                a.state,
                a.status,
                a.first_processed_at,
                a.completed_at,
            )
        });
        out.insert(
            format!("k-{i}"),
            format!("{online:?} {tier:?} {archived:?}"),
        );
    }
    out
}

const SEEDED: u64 = 60;

async fn seeded(env: &Env, completed_at: Millis) -> TenantId {
    let t = fresh_tenant();
    (env.seed)(t.clone(), "k-", SEEDED, completed_at, 64)
        .await
        .unwrap();
    t
}

/// A retention store around the test's, watching `demote`: counts the records moved by
/// (from, to); with `fail_at`, fails after applying half of that demote call's batch (a
/// sweeper killed in the middle of its work); with `hold`, closes that gate after every
/// demote.
struct Instrumented {
    inner: Arc<dyn RetentionStore>,
    calls: AtomicUsize,
    fail_at: Option<usize>,
    moves: std::sync::Mutex<BTreeMap<(Tier, Tier), u64>>,
    hold: std::sync::Mutex<Option<tokio::sync::watch::Sender<bool>>>,
}

impl Instrumented {
    fn new(inner: Arc<dyn RetentionStore>) -> Self {
        Self {
            inner,
            calls: AtomicUsize::new(0),
            fail_at: None,
            moves: Default::default(),
            hold: Default::default(),
        }
    }
}

#[async_trait]
impl ArchiveLookup for Instrumented {
    async fn archived(
        &self,
        t: &TenantId,
        k: &IdempotencyKey,
    ) -> Result<Option<ArchivedRecord>, StoreError> {
        self.inner.archived(t, k).await
    }
    async fn archived_by_ref(
        &self,
        t: Option<&TenantId>,
        r: &str,
    ) -> Result<Vec<ArchivedRecord>, StoreError> {
        self.inner.archived_by_ref(t, r).await
    }
}

#[async_trait]
impl RetentionStore for Instrumented {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    async fn now(&self) -> Result<Millis, StoreError> {
        self.inner.now().await
    }
    async fn scan_due(
        &self,
        tier: Tier,
        before: Millis,
        after: Option<&ScanCursor>,
        limit: usize,
    ) -> Result<Vec<DueRecord>, StoreError> {
        self.inner.scan_due(tier, before, after, limit).await
    }
    async fn demote(
        &self,
        from: Tier,
        to: Tier,
        batch: &[Demotion],
        now: Millis,
    ) -> Result<u64, StoreError> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let (applied, killed) = if self.fail_at == Some(call) {
            (&batch[..batch.len() / 2], true)
        } else {
            (batch, false)
        };
        let n = self.inner.demote(from, to, applied, now).await?;
        *self.moves.lock().unwrap().entry((from, to)).or_default() += n;
        if let Some(hold) = self.hold.lock().unwrap().as_ref() {
            hold.send_replace(false);
        }
        if killed {
            return Err(StoreError::Unavailable("killed mid-batch".into()));
        }
        Ok(n)
    }
    async fn scan_stale(&self, b: Millis, l: usize) -> Result<Vec<StaleRecord>, StoreError> {
        self.inner.scan_stale(b, l).await
    }
    async fn recover_stale(
        &self,
        batch: &[StaleRecord],
        b: Millis,
        now: Millis,
    ) -> Result<Vec<StaleRecord>, StoreError> {
        self.inner.recover_stale(batch, b, now).await
    }
    async fn expire_archive(&self, b: Millis) -> Result<ArchiveExpiry, StoreError> {
        self.inner.expire_archive(b).await
    }
    async fn tier_of(&self, s: &Scope) -> Result<Option<Tier>, StoreError> {
        self.inner.tier_of(s).await
    }
    async fn usage(&self) -> Result<Vec<TierUsage>, StoreError> {
        self.inner.usage().await
    }
}

/// One sweeper; two at once without the lease (compare-and-set only); two at once with
/// the lease; one killed mid-batch then rerun: identical final states.
pub async fn concurrent_and_crashed_sweeps_agree(env: &Env) {
    let completed = env.retention.now().await.unwrap() - 100 * DAY_MS;
    let policy = RetentionPolicy::default();

    let t1 = seeded(env, completed).await;
    let one = sweeper(env).run(&SweepOptions::default()).await.unwrap();
    assert_eq!(one.moved(Tier::Dispute), SEEDED, "{one:?}");
    let expected = snapshot(env, &t1, SEEDED).await;

    // Two at once, no lease: every transition is counted exactly once between them.
    let t2 = seeded(env, completed).await;
    let a = Sweeper::new(env.retention.clone(), policy.clone()).with_batch(5);
    let b = Sweeper::new(env.retention.clone(), policy.clone()).with_batch(3);
    let opts = SweepOptions::default();
    let (ra, rb) = tokio::join!(a.run(&opts), b.run(&opts));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    for tier in Tier::ONLINE {
        assert_eq!(ra.moved(tier) + rb.moved(tier), SEEDED, "{ra:?} {rb:?}");
    }
    assert_eq!(snapshot(env, &t2, SEEDED).await, expected);

    // Two at once with the lease: one sweeps, the other sees it held (or runs after).
    let t3 = seeded(env, completed).await;
    let lm = idem_lease::LeaseMetrics::default();
    let a = sweeper(env).with_lease(env.leases.clone(), lm.clone());
    let b = sweeper(env).with_lease(env.leases.clone(), lm);
    let opts = SweepOptions::default();
    let (ra, rb) = tokio::join!(a.run(&opts), b.run(&opts));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert!(
        matches!(ra.lease, LeaseOutcome::Held { .. })
            || matches!(rb.lease, LeaseOutcome::Held { .. }),
        "{ra:?} {rb:?}"
    );
    assert_eq!(ra.moved(Tier::Dispute) + rb.moved(Tier::Dispute), SEEDED);
    assert_eq!(snapshot(env, &t3, SEEDED).await, expected);

    // Killed in the middle of a batch, then rerun.
    let t4 = seeded(env, completed).await;
    let crashing = Arc::new(Instrumented {
        fail_at: Some(4),
        ..Instrumented::new(env.retention.clone())
    });
    let err = Sweeper::new(crashing, policy.clone())
        .with_batch(7)
        .run(&SweepOptions::default())
        .await
        .unwrap_err();
    assert!(err.is_unavailable());
    assert_ne!(
        snapshot(env, &t4, SEEDED).await,
        expected,
        "stopped part-way"
    );
    sweep(env).await;
    assert_eq!(snapshot(env, &t4, SEEDED).await, expected);
}

/// The archive window removes old archive rows (PostgreSQL: whole monthly partitions).
pub async fn archive_expires(env: &Env) {
    let now = env.retention.now().await.unwrap();
    let t = seeded(env, now - 100 * DAY_MS).await;
    sweep(env).await;
    let key = IdempotencyKey::new("k-0").unwrap();
    assert!(env.retention.archived(&t, &key).await.unwrap().is_some());
    let policy = RetentionPolicy {
        archive_window: Some(30 * DAY),
        ..RetentionPolicy::default()
    };
    let s = Sweeper::new(env.retention.clone(), policy);
    // 20 days later: inside the window.
    let r = s
        .run(&SweepOptions {
            now: Some(now + 20 * DAY_MS),
            ..SweepOptions::default()
        })
        .await
        .unwrap();
    assert_eq!(r.archive_rows_expired, 0, "{r:?}");
    assert!(env.retention.archived(&t, &key).await.unwrap().is_some());
    // 70 days later: past the window (and past the end of the archiving month).
    let r = s
        .run(&SweepOptions {
            now: Some(now + 70 * DAY_MS),
            ..SweepOptions::default()
        })
        .await
        .unwrap();
    assert!(r.archive_rows_expired >= SEEDED, "{r:?}");
    assert_eq!(env.retention.archived(&t, &key).await.unwrap(), None);
}

/// Lease events past the policy's window go, judged by the store clock: a later `--now`
/// and a dry run delete nothing; the sweeper's own lease and newer events stay.
pub async fn lease_events_trimmed(env: &Env) {
    let name = idem_core::LeaseName::new(format!("trim-{}", fresh_tenant())).unwrap();
    let owner = idem_core::OwnerId::new("worker").unwrap();
    let lease = match env.leases.try_acquire(&name, &owner, DAY).await.unwrap() {
        idem_core::Acquire::Granted(l) => l,
        other => panic!("not granted: {other:?}"),
    };
    env.leases
        .release(&name, &owner, lease.token)
        .await
        .unwrap();
    let policy = RetentionPolicy {
        lease_event_window: Some(DAY),
        ..RetentionPolicy::default()
    };
    let lm = idem_lease::LeaseMetrics::default();
    let s = Sweeper::new(env.retention.clone(), policy)
        .with_batch(1)
        .with_lease(env.leases.clone(), lm);
    let now = env.retention.now().await.unwrap();
    let r = s
        .run(&SweepOptions {
            now: Some(now + 400 * DAY_MS),
            ..SweepOptions::default()
        })
        .await
        .unwrap();
    assert_eq!(r.lease_events_trimmed, 0, "a later --now trimmed: {r:?}");
    env.clock.advance(2 * DAY);
    let r = s
        .run(&SweepOptions {
            dry_run: true,
            ..SweepOptions::default()
        })
        .await
        .unwrap();
    assert_eq!(r.lease_events_trimmed, 0, "a dry run trimmed: {r:?}");
    assert_eq!(env.leases.events(&name, 10).await.unwrap().len(), 2);
    // Batches of one: the loop runs until a batch comes back short. The sweeper's own
    // lease events from the first run are past the window as well.
    let r = sweep_with(&s).await;
    assert!(r.lease_events_trimmed >= 2, "{r:?}");
    assert!(env.leases.events(&name, 10).await.unwrap().is_empty());
    let sweeper_lease = idem_core::LeaseName::new(idem_sweep::LEASE_NAME).unwrap();
    let own = env.leases.events(&sweeper_lease, 10).await.unwrap();
    assert!(!own.is_empty(), "this run's own lease events are new");
    assert!(env.leases.show(&name).await.unwrap().last_token >= Some(lease.token));
}

async fn sweep_with(s: &Sweeper) -> idem_sweep::SweepReport {
    s.run(&SweepOptions::default()).await.unwrap()
}

/// A dry run counts and writes nothing.
pub async fn dry_run_writes_nothing(env: &Env) {
    let now = env.retention.now().await.unwrap();
    let t = seeded(env, now - 3 * DAY_MS).await;
    let before = snapshot(env, &t, SEEDED).await;
    let r = sweeper(env)
        .run(&SweepOptions {
            dry_run: true,
            ..SweepOptions::default()
        })
        .await
        .unwrap();
    assert_eq!(r.moved(Tier::Retry), SEEDED, "{r:?}");
    assert_eq!(r.moved(Tier::Replay), 0);
    assert_eq!(snapshot(env, &t, SEEDED).await, before);
    // `--now` moves the sweep's notion of time only.
    let r = sweeper(env)
        .run(&SweepOptions {
            now: Some(now + 200 * DAY_MS),
            dry_run: true,
            progress: false,
        })
        .await
        .unwrap();
    assert_eq!(r.now, now + 200 * DAY_MS);
    let usage = env.retention.usage().await.unwrap();
    let retry = usage.iter().find(|u| u.tier == Tier::Retry).unwrap();
    assert!(
        retry.records >= SEEDED && retry.bytes_per_record > 64.0,
        "{usage:?}"
    );
}

/// A backlog: records past several windows move to the deepest tier they are due for
/// in one write each, land exactly where a tier-by-tier walk puts them, and the report
/// counts every transition they passed. A demotion never goes up or stays in place.
pub async fn backlog_moves_once(env: &Env) {
    let now = env.retention.now().await.unwrap();
    // Tier by tier (a sweep every few days) as the reference.
    let walked = seeded(env, now - 100 * DAY_MS).await;
    for days in [2, 10, 100] {
        sweeper(env)
            .run(&SweepOptions {
                now: Some(now - 100 * DAY_MS + days * DAY_MS),
                ..SweepOptions::default()
            })
            .await
            .unwrap();
    }
    let reference = snapshot(env, &walked, SEEDED).await;

    let old = seeded(env, now - 100 * DAY_MS).await;
    let counting = Arc::new(Instrumented::new(env.retention.clone()));
    let report = Sweeper::new(counting.clone(), RetentionPolicy::default())
        .with_batch(7)
        .run(&SweepOptions::default())
        .await
        .unwrap();
    for tier in Tier::ONLINE {
        assert_eq!(report.moved(tier), SEEDED, "{report:?}");
    }
    let moves = counting.moves.lock().unwrap().clone();
    assert_eq!(
        moves,
        BTreeMap::from([((Tier::Retry, Tier::Archive), SEEDED)]),
        "one write per record"
    );
    // Same archive rows as the walk (digests, reference, times), keyed per tenant.
    let strip = |m: BTreeMap<String, String>| m.into_values().collect::<Vec<_>>();
    assert_eq!(strip(snapshot(env, &old, SEEDED).await), strip(reference));

    // Ten days old: replay window passed, dispute window not: straight to dispute.
    let mid = seeded(env, now - 10 * DAY_MS).await;
    counting.moves.lock().unwrap().clear();
    let report = Sweeper::new(counting.clone(), RetentionPolicy::default())
        .run(&SweepOptions::default())
        .await
        .unwrap();
    assert_eq!(report.moved(Tier::Retry), SEEDED);
    assert_eq!(report.moved(Tier::Replay), SEEDED);
    assert_eq!(report.moved(Tier::Dispute), 0);
    let scope = Scope::new(mid.clone(), IdempotencyKey::new("k-0").unwrap());
    assert_eq!(
        env.retention.tier_of(&scope).await.unwrap(),
        Some(Tier::Dispute)
    );
    assert_eq!(
        counting.moves.lock().unwrap().clone(),
        BTreeMap::from([((Tier::Retry, Tier::Dispute), SEEDED)])
    );

    for (from, to) in [(Tier::Replay, Tier::Replay), (Tier::Dispute, Tier::Retry)] {
        let err = env.retention.demote(from, to, &[], now).await.unwrap_err();
        assert!(matches!(err, StoreError::InvalidInput(_)), "{err:?}");
    }
}

/// A held gate stops the sweep before its next batch; releasing it lets it go on.
pub async fn gate_holds_between_batches(env: &Env) {
    let now = env.retention.now().await.unwrap();
    let t = seeded(env, now - 100 * DAY_MS).await;
    let (open, gate) = tokio::sync::watch::channel(false);
    // The store closes the gate again after each batch it applies.
    let counting = Arc::new(Instrumented {
        hold: std::sync::Mutex::new(Some(open.clone())),
        ..Instrumented::new(env.retention.clone())
    });
    let s = Sweeper::new(counting.clone(), RetentionPolicy::default())
        .with_batch(7)
        .with_duty(1.0)
        .with_gate(gate);
    let run = tokio::spawn(async move { s.run(&SweepOptions::default()).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        count_archived(env, &t).await,
        0,
        "held before the first batch"
    );
    assert!(!run.is_finished());
    for batch in 1..=2u64 {
        open.send_replace(true);
        for _ in 0..200 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            if count_archived(env, &t).await >= 7 * batch {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            count_archived(env, &t).await,
            7 * batch,
            "one batch per release"
        );
        assert!(!run.is_finished());
    }
    // Released for good.
    counting.hold.lock().unwrap().take();
    open.send_replace(true);
    let report = run.await.unwrap().unwrap();
    assert_eq!(report.moved(Tier::Dispute), SEEDED);
    assert_eq!(count_archived(env, &t).await, SEEDED);
}

async fn count_archived(env: &Env, t: &TenantId) -> u64 {
    let mut n = 0;
    for i in 0..SEEDED {
        let key = IdempotencyKey::new(format!("k-{i}")).unwrap();
        if env.retention.archived(t, &key).await.unwrap().is_some() {
            n += 1;
        }
    }
    n
}

#[macro_export]
macro_rules! retention_tests {
    ($env:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn walks_through_all_tiers() {
            let Some(env) = $env else { return };
            common::walks_through_all_tiers(&env).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn pending_compensation_survives() {
            let Some(env) = $env else { return };
            common::pending_compensation_survives(&env).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn stale_processing_recovered() {
            let Some(env) = $env else { return };
            common::stale_processing_recovered(&env).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn concurrent_and_crashed_sweeps_agree() {
            let Some(env) = $env else { return };
            common::concurrent_and_crashed_sweeps_agree(&env).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn archive_expires() {
            let Some(env) = $env else { return };
            common::archive_expires(&env).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn lease_events_trimmed() {
            let Some(env) = $env else { return };
            common::lease_events_trimmed(&env).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn dry_run_writes_nothing() {
            let Some(env) = $env else { return };
            common::dry_run_writes_nothing(&env).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn backlog_moves_once() {
            let Some(env) = $env else { return };
            common::backlog_moves_once(&env).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn gate_holds_between_batches() {
            let Some(env) = $env else { return };
            common::gate_holds_between_batches(&env).await;
        }
    };
}
