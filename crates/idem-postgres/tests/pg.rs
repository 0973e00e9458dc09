//! PostgreSQL-specific behaviour beyond the shared scenarios: migrations, the live
//! unique-guard check, the transactional form, the READ COMMITTED pitfall, error mapping
//! and a fault test that terminates the store's sessions mid-race.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{harness, unmigrated, PgHarness};
use idem_conformance::{fresh_tenant, request, result};
use idem_core::{
    Claim, ClaimKind, ClaimToken, ErrorKind, Finish, IdempotencyStore, RecordState, Scope, TenantId,
};
use idem_postgres::{PgOptions, PgStore};
use sqlx::{Connection, Executor, Row};
use tokio::sync::Barrier;

fn proceed(claim: Claim) -> ClaimToken {
    match claim {
        Claim::Proceed(t) => t,
        other => panic!("expected proceed, got {other:?}"),
    }
}

fn succeeded(body: &str) -> Finish {
    Finish {
        state: RecordState::Succeeded,
        result: Some(result(body)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_twice_and_concurrently() {
    // Twice in a row on a migrated schema: nothing left to apply.
    let Some(h) = harness().await else { return };
    let store = h.store().await;
    assert!(store.migrate().await.unwrap().is_empty());
    assert!(store.migrate().await.unwrap().is_empty());

    // Two pools (two sessions, as two processes would be) on a schema that does not
    // exist yet, migrating at the same moment: exactly one applies each version.
    let Some(h2) = unmigrated().await else { return };
    let a = h2.store().await;
    let b = h2.store().await;
    let (ra, rb) = tokio::join!(a.migrate(), b.migrate());
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    let mut all: Vec<i64> = ra.iter().chain(rb.iter()).copied().collect();
    all.sort();
    let mut admin = h2.admin().await;
    let versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM idem_schema_migrations ORDER BY version")
            .fetch_all(&mut admin)
            .await
            .unwrap();
    // Every version (1 records, 2 leases, …) applied exactly once, by one of the two.
    assert!(versions.starts_with(&[1, 2]), "{versions:?}");
    assert_eq!(all, versions, "each version applied once: {ra:?} {rb:?}");
    assert!(a.unique_guard().await.unwrap());
    // The store works on the concurrently migrated schema.
    let t = fresh_tenant();
    proceed(a.claim(&request(&t, "k", "p", "o")).await.unwrap());
    admin.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unique_guard_reads_the_live_catalog() {
    let Some(h) = harness().await else { return };
    let store = h.store().await;
    let mut admin = h.admin().await;
    assert!(store.unique_guard().await.unwrap());

    admin
        .execute("DROP INDEX idem_records_scope_uq")
        .await
        .unwrap();
    assert!(!store.unique_guard().await.unwrap());
    // Without the guard a claim must not proceed (ON CONFLICT has no arbiter): it fails.
    let t = fresh_tenant();
    let err = store.claim(&request(&t, "k", "p", "o")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    assert_eq!(
        store
            .get(&Scope::new(t.clone(), common_key("k")))
            .await
            .unwrap(),
        None
    );

    // Guards that do not cover exactly (tenant_id, key) do not count.
    admin
        .execute("CREATE UNIQUE INDEX wider_uq ON idem_records (tenant_id, key, principal)")
        .await
        .unwrap();
    admin
        .execute("CREATE UNIQUE INDEX partial_uq ON idem_records (tenant_id, key) WHERE state = 'PROCESSING'")
        .await
        .unwrap();
    admin
        .execute("CREATE INDEX plain_idx ON idem_records (tenant_id, key)")
        .await
        .unwrap();
    assert!(!store.unique_guard().await.unwrap());

    // A named UNIQUE constraint is a guard; dropping it removes the guard again.
    admin
        .execute(
            "ALTER TABLE idem_records ADD CONSTRAINT idem_records_scope_uq UNIQUE (tenant_id, key)",
        )
        .await
        .unwrap();
    assert!(store.unique_guard().await.unwrap());
    proceed(store.claim(&request(&t, "k", "p", "o")).await.unwrap());
    admin
        .execute("ALTER TABLE idem_records DROP CONSTRAINT idem_records_scope_uq")
        .await
        .unwrap();
    assert!(!store.unique_guard().await.unwrap());
    admin.close().await.unwrap();
}

fn common_key(s: &str) -> idem_core::IdempotencyKey {
    idem_core::IdempotencyKey::new(s).unwrap()
}

async fn orders_table(h: &PgHarness) {
    let mut admin = h.admin().await;
    admin
        .execute(
            "CREATE TABLE orders (id text PRIMARY KEY, tenant_id text NOT NULL, key text NOT NULL)",
        )
        .await
        .unwrap();
    admin.close().await.unwrap();
}

async fn order_count(store: &PgStore, tenant: &TenantId) -> i64 {
    let sql = format!(
        "SELECT count(*) FROM \"{}\".orders WHERE tenant_id = $1",
        store.schema().unwrap()
    );
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.clone()))
        .bind(tenant.as_str())
        .fetch_one(store.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transactional_form_commits_with_the_business_write() {
    let Some(h) = harness().await else { return };
    orders_table(&h).await;
    let store = Arc::new(h.store().await);
    let t = fresh_tenant();
    let req = request(&t, "buy", "show-S-204", "svc-a");

    let mut tx = store.pool().begin().await.unwrap();
    let tok = proceed(store.claim_in_tx(&mut tx, &req).await.unwrap());
    assert_eq!(tok.kind, ClaimKind::Fresh);
    sqlx::query("INSERT INTO orders (id, tenant_id, key) VALUES ('order-1', $1, 'buy')")
        .bind(t.as_str())
        .execute(&mut *tx)
        .await
        .unwrap();
    let rec = store
        .finish_in_tx(&mut tx, &tok, succeeded("order-1"))
        .await
        .unwrap();
    assert_eq!(rec.state, RecordState::Succeeded);
    // Not visible before commit.
    assert_eq!(store.get(&req.scope).await.unwrap(), None);

    // A concurrent duplicate waits on the unique index until the commit, then replays
    // (one commit for the whole intent, docs/DESIGN.md: commit costs).
    let dup = {
        let store = store.clone();
        let req = request(&t, "buy", "show-S-204", "svc-b");
        tokio::spawn(async move { store.claim(&req).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !dup.is_finished(),
        "duplicate must wait for the first commit"
    );
    tx.commit().await.unwrap();
    match dup.await.unwrap().unwrap() {
        Claim::Replay(r) => assert_eq!(r.result, Some(result("order-1"))),
        other => panic!("expected replay, got {other:?}"),
    }
    assert_eq!(order_count(&store, &t).await, 1);
    assert_eq!(store.get(&req.scope).await.unwrap(), Some(rec));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transactional_form_rollback_changes_nothing() {
    let Some(h) = harness().await else { return };
    orders_table(&h).await;
    let store = h.store().await;
    let t = fresh_tenant();

    // Fresh claim + business write + completion, rolled back: no record, no order.
    let req = request(&t, "rb", "p", "svc-a");
    let mut tx = store.pool().begin().await.unwrap();
    let tok = proceed(store.claim_in_tx(&mut tx, &req).await.unwrap());
    sqlx::query("INSERT INTO orders (id, tenant_id, key) VALUES ('o-rb', $1, 'rb')")
        .bind(t.as_str())
        .execute(&mut *tx)
        .await
        .unwrap();
    store
        .finish_in_tx(&mut tx, &tok, succeeded("o-rb"))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(store.get(&req.scope).await.unwrap(), None);
    assert_eq!(order_count(&store, &t).await, 0);
    // The key is absent again: the next arrival is a fresh first execution.
    let again = proceed(store.claim(&request(&t, "rb", "p", "svc-b")).await.unwrap());
    assert_eq!((again.kind, again.attempt), (ClaimKind::Fresh, 1));

    // A retry takeover rolled back leaves the FAILED_RETRYABLE record as it was.
    let req2 = request(&t, "rb2", "p", "svc-a");
    let tok = proceed(store.claim(&req2).await.unwrap());
    store.fail(&tok, true, Some(result("boom"))).await.unwrap();
    let before = store.get(&req2.scope).await.unwrap().unwrap();
    let mut tx = store.pool().begin().await.unwrap();
    let retry = proceed(
        store
            .claim_in_tx(&mut tx, &request(&t, "rb2", "p", "svc-b"))
            .await
            .unwrap(),
    );
    assert_eq!(retry.kind, ClaimKind::RetryAfterFailure);
    tx.rollback().await.unwrap();
    assert_eq!(store.get(&req2.scope).await.unwrap(), Some(before));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transactional_form_lost_cas_is_superseded() {
    let Some(h) = harness().await else { return };
    orders_table(&h).await;
    let store = h.store().await;
    let t = fresh_tenant();
    let mut first = request(&t, "slow", "p", "slow-owner");
    first.lease = Duration::from_secs(1);
    let old = proceed(store.claim(&first).await.unwrap());
    h.clock.advance(Duration::from_millis(1100));
    let new = proceed(
        store
            .claim(&request(&t, "slow", "p", "taker"))
            .await
            .unwrap(),
    );
    assert!(matches!(new.kind, ClaimKind::ExpiredLease { .. }));
    let before = store.get(&first.scope).await.unwrap().unwrap();

    // The old owner's business write and completion in one transaction: the CAS loses,
    // so the caller rolls back and its business row never lands.
    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query("INSERT INTO orders (id, tenant_id, key) VALUES ('late', $1, 'slow')")
        .bind(t.as_str())
        .execute(&mut *tx)
        .await
        .unwrap();
    let err = store
        .finish_in_tx(&mut tx, &old, succeeded("late"))
        .await
        .unwrap_err();
    assert!(err.is_superseded(), "{err:?}");
    tx.rollback().await.unwrap();
    assert_eq!(order_count(&store, &t).await, 0);
    assert_eq!(store.get(&first.scope).await.unwrap(), Some(before));
    store.complete(&new, result("taker")).await.unwrap();
}

/// The READ COMMITTED pitfall (docs/DESIGN.md: pitfalls), made deterministic: the one-statement claim (read the record, insert when
/// absent) starts while the conflicting row is uncommitted. Its read does not see the row
/// (not committed yet), its INSERT waits on the unique index, conflicts after the commit,
/// and the read's snapshot still does not see the row: the statement returns nothing.
/// The store re-runs it and answers from the committed record. With `fresh_fast_path`
/// the plain INSERT waits and returns nothing, and the separate read (a new snapshot)
/// sees the row at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn read_committed_pitfall_is_rerun() {
    let Some(h) = harness().await else { return };
    for fast_path in [false, true] {
        let store = Arc::new(
            h.store_with({
                let mut o = h.options();
                o.fresh_fast_path = fast_path;
                o
            })
            .await,
        );
        let t = fresh_tenant();
        let mut tx = store.pool().begin().await.unwrap();
        proceed(
            store
                .claim_in_tx(&mut tx, &request(&t, "k", "p", "first"))
                .await
                .unwrap(),
        );
        let second = {
            let store = store.clone();
            let req = request(&t, "k", "p", "second");
            tokio::spawn(async move { store.claim(&req).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !second.is_finished(),
            "second claim waits on the unique index"
        );
        tx.commit().await.unwrap();
        match second.await.unwrap().unwrap() {
            Claim::InProgress { owner, .. } => {
                assert_eq!(owner.unwrap().as_str(), "first")
            }
            other => panic!("expected in progress, got {other:?}"),
        }
        if fast_path {
            // The plain INSERT waits and returns nothing; the next statement sees the row.
            assert_eq!(store.claim_reruns(), 0);
        } else {
            // The empty answer happened and was re-run (not guessed, not an error).
            assert_eq!(store.claim_reruns(), 1, "the empty answer was re-run once");
        }
    }
}

#[derive(Debug, PartialEq)]
enum Arrival {
    Executed(Vec<u8>),
    Replayed(Vec<u8>),
}

#[derive(Default)]
struct Counters {
    executions: AtomicUsize,
    unavailable: AtomicUsize,
}

/// `n` concurrent arrivals of one intent that retry `Unavailable` like a client would.
async fn race(
    store: Arc<PgStore>,
    tenant: &TenantId,
    key: &str,
    n: usize,
    lease: Duration,
    counters: Arc<Counters>,
) -> Vec<Arrival> {
    let barrier = Arc::new(Barrier::new(n));
    let mut tasks = Vec::new();
    for i in 0..n {
        let store = store.clone();
        let barrier = barrier.clone();
        let counters = counters.clone();
        let mut req = request(tenant, key, "same-payload", &format!("owner-{i}"));
        req.lease = lease;
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            loop {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "race did not settle"
                );
                match store.claim(&req).await {
                    Err(e) if e.is_unavailable() => {
                        counters.unavailable.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err(e) => panic!("claim: {e:?}"),
                    Ok(Claim::Proceed(token)) => {
                        counters.executions.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        let body = uuid::Uuid::now_v7().to_string();
                        // Retrying a finish whose response was lost answers Ok (same
                        // token, same outcome), so the executor just retries.
                        loop {
                            match store.complete(&token, result(&body)).await {
                                Ok(_) => break,
                                Err(e) if e.is_unavailable() => {
                                    counters.unavailable.fetch_add(1, Ordering::Relaxed);
                                    tokio::time::sleep(Duration::from_millis(5)).await;
                                }
                                Err(e) => panic!("complete: {e:?}"),
                            }
                        }
                        return Arrival::Executed(result(&body).body);
                    }
                    Ok(Claim::InProgress { .. }) => {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    Ok(Claim::Replay(rec)) => {
                        return Arrival::Replayed(rec.result.expect("stored result").body)
                    }
                    Ok(Claim::Mismatch { .. }) => panic!("same payload reported as mismatch"),
                }
            }
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("task"));
    }
    out
}

fn one_execution(arrivals: &[Arrival]) -> Vec<u8> {
    let executed: Vec<_> = arrivals
        .iter()
        .filter_map(|a| match a {
            Arrival::Executed(b) => Some(b.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(executed.len(), 1, "exactly one execution");
    for a in arrivals {
        if let Arrival::Replayed(b) = a {
            assert_eq!(b, &executed[0], "replay differs from the first result");
        }
    }
    executed[0].clone()
}

/// The 64-way race with every claim going through the single deciding statement (no
/// fast path), which is where the READ COMMITTED empty answer shows up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn single_statement_64_way_race() {
    let Some(h) = harness().await else { return };
    let store = Arc::new(
        h.store_with({
            let mut o = h.options();
            o.fresh_fast_path = false;
            o.max_connections = 20;
            o
        })
        .await,
    );
    let t = fresh_tenant();
    for rep in 0..8 {
        let k = format!("cte-{rep}");
        let counters = Arc::new(Counters::default());
        let arrivals = race(
            store.clone(),
            &t,
            &k,
            64,
            Duration::from_secs(30),
            counters.clone(),
        )
        .await;
        one_execution(&arrivals);
        assert_eq!(counters.executions.load(Ordering::Relaxed), 1);
        let rec = store
            .get(&Scope::new(t.clone(), common_key(&k)))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((rec.state, rec.attempts), (RecordState::Succeeded, 1));
    }
    eprintln!("single-statement race: {} re-runs", store.claim_reruns());
}

/// Fault test: during 64-way duplicate races, the store's own sessions are terminated
/// (`pg_terminate_backend`, SQLSTATE 57P01). Still exactly one execution per intent;
/// every other caller replays the same result, possibly after the store retried on
/// another connection or answered `Unavailable` and the caller retried; no record is
/// left PROCESSING.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn terminated_sessions_during_race() {
    let Some(h) = harness().await else { return };
    let store = Arc::new(
        h.store_with({
            let mut o = h.options();
            o.max_connections = 16;
            o.acquire_timeout = Duration::from_secs(15);
            o
        })
        .await,
    );
    let t = fresh_tenant();
    let terminated = Arc::new(AtomicUsize::new(0));
    let counters = Arc::new(Counters::default());
    for rep in 0..4 {
        let k = format!("fault-{rep}");
        let done = Arc::new(AtomicBool::new(false));
        // The killer has its own session (another application_name), so it only ends
        // this store's sessions, never other tests' or its own.
        let killer = {
            let done = done.clone();
            let terminated = terminated.clone();
            let url = h.url.clone();
            let app = h.application_name.clone();
            tokio::spawn(async move {
                let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
                for round in 0..400 {
                    if done.load(Ordering::Relaxed) {
                        break;
                    }
                    let n: i64 = sqlx::query_scalar(
                        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
                         FROM pg_stat_activity
                         WHERE datname = current_database() AND pid <> pg_backend_pid()
                           AND application_name = $1",
                    )
                    .bind(&app)
                    .fetch_one(&mut conn)
                    .await
                    .unwrap();
                    terminated.fetch_add(n as usize, Ordering::Relaxed);
                    // Kill hard at the start of the race, then let it settle.
                    let pause = if round < 40 { 2 } else { 25 };
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
                conn.close().await.unwrap();
            })
        };
        let before = counters.executions.load(Ordering::Relaxed);
        // A short lease bounds the wait when a claim committed but its answer was lost
        // (its owner never executed; after expiry one retry takes over and executes).
        // It must still outlast an executor's finish retries through the kill storm: at
        // 2 s a loaded 2-core machine saw a takeover (two executions) about one run in
        // five.
        let arrivals = race(
            store.clone(),
            &t,
            &k,
            64,
            Duration::from_secs(5),
            counters.clone(),
        )
        .await;
        done.store(true, Ordering::Relaxed);
        killer.await.unwrap();
        one_execution(&arrivals);
        assert_eq!(counters.executions.load(Ordering::Relaxed) - before, 1);
        let rec = store
            .get(&Scope::new(t.clone(), common_key(&k)))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(rec.state, RecordState::Succeeded);
    }
    let mut admin = h.admin().await;
    let processing: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM idem_records WHERE tenant_id = $1 AND state = 'PROCESSING'",
    )
    .bind(t.as_str())
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(processing, 0, "no record left PROCESSING");
    admin.close().await.unwrap();
    let (killed, unavailable) = (
        terminated.load(Ordering::Relaxed),
        counters.unavailable.load(Ordering::Relaxed),
    );
    let retried = store.connection_retries();
    eprintln!(
        "fault test: {killed} sessions terminated, {retried} calls retried on another \
         connection, {unavailable} Unavailable answers"
    );
    assert!(killed > 0, "the fault was injected");
    assert!(
        retried > 0 || unavailable > 0,
        "the fault reached the store's calls"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn finish_retry_with_same_outcome_is_idempotent() {
    let Some(h) = harness().await else { return };
    let store = h.store().await;
    let t = fresh_tenant();
    let req = request(&t, "k", "p", "o");
    let tok = proceed(store.claim(&req).await.unwrap());
    let first = store.complete(&tok, result("r1")).await.unwrap();
    // Same token, same outcome (a retry after a lost response): the same record.
    assert_eq!(store.complete(&tok, result("r1")).await.unwrap(), first);
    // Same token, another outcome: stale.
    assert!(store
        .complete(&tok, result("r2"))
        .await
        .unwrap_err()
        .is_superseded());
    assert!(store
        .fail(&tok, true, Some(result("r1")))
        .await
        .unwrap_err()
        .is_superseded());
    assert!(store
        .extend_lease(&tok, Duration::from_secs(5))
        .await
        .unwrap_err()
        .is_superseded());
    assert_eq!(store.get(&req.scope).await.unwrap(), Some(first));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn takeover_keeps_the_previous_result_as_evidence() {
    let Some(h) = harness().await else { return };
    let store = h.store().await;
    let t = fresh_tenant();
    let tok = proceed(store.claim(&request(&t, "k", "p", "a")).await.unwrap());
    let failed = store.fail(&tok, true, Some(result("oops"))).await.unwrap();
    // Retryable is not an end: no completion time, and no lease held.
    assert_eq!((failed.completed_at, failed.lease_expires_at), (None, None));
    assert_eq!(failed.owner.as_ref().map(|o| o.as_str()), Some("a"));
    let retry = proceed(store.claim(&request(&t, "k", "p", "b")).await.unwrap());
    assert_eq!(retry.kind, ClaimKind::RetryAfterFailure);
    let rec = store
        .get(&Scope::new(t.clone(), common_key("k")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.state, RecordState::Processing);
    assert_eq!(rec.owner.unwrap().as_str(), "b");
    assert_eq!((rec.attempts, rec.version), (2, retry.version));
    // The failed attempt's answer stays until the retry finishes and overwrites it.
    assert_eq!(rec.result, Some(result("oops")));
    assert_eq!(rec.completed_at, None);
    assert_eq!(rec.lease_expires_at, Some(retry.lease_expires_at));
    let done = store.complete(&retry, result("ok")).await.unwrap();
    assert_eq!(done.result, Some(result("ok")));
    assert_eq!(
        done.lease_expires_at, None,
        "a finished record holds no lease"
    );
    assert!(done.completed_at.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unreachable_or_closed_is_unavailable() {
    // Nothing listens on port 1: connection refused.
    let err = PgStore::connect("postgres://postgres@127.0.0.1:1/test", {
        let mut o = PgOptions::default();
        o.acquire_timeout = Duration::from_secs(2);
        o
    })
    .await
    .unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");

    let Some(h) = harness().await else { return };
    let store = h.store().await;
    store.pool().close().await;
    let t = fresh_tenant();
    let err = store.claim(&request(&t, "k", "p", "o")).await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    let err = store
        .get(&Scope::new(t, common_key("k")))
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wait_behind_a_held_row_lock_is_bounded_when_asked() {
    let Some(h) = harness().await else { return };
    let store = h
        .store_with({
            let mut o = h.options();
            o.lock_timeout = Some(Duration::from_millis(300));
            o.idle_in_transaction_timeout = Some(Duration::from_secs(20));
            o
        })
        .await;
    let shown: (String, String) = sqlx::query_as(
        "SELECT current_setting('lock_timeout'), \
         current_setting('idle_in_transaction_session_timeout')",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(shown, ("300ms".to_string(), "20s".to_string()));

    // A claim waiting behind a transaction that holds its row fails, not hangs.
    let t = fresh_tenant();
    let first = store.claim(&request(&t, "k", "p", "o")).await.unwrap();
    drop(first);
    let mut holder = h.admin().await;
    sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
    sqlx::query("SELECT 1 FROM idem_records WHERE tenant_id = $1 FOR UPDATE")
        .bind(t.as_str())
        .execute(&mut holder)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let waited = tokio::time::timeout(
        Duration::from_secs(10),
        sqlx::query("UPDATE idem_records SET updated_at = updated_at WHERE tenant_id = $1")
            .bind(t.as_str())
            .execute(store.pool()),
    )
    .await
    .expect("bounded by lock_timeout, not by this test");
    assert!(
        waited.is_err(),
        "the update waited behind the lock and failed"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    sqlx::query("ROLLBACK").execute(&mut holder).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropping_the_harness_drops_its_schema() {
    let Some(h) = harness().await else { return };
    let schema = h.schema.clone();
    let url = h.url.clone();
    drop(h);
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    let left: i64 = sqlx::query("SELECT count(*) AS n FROM pg_namespace WHERE nspname = $1")
        .bind(&schema)
        .fetch_one(&mut conn)
        .await
        .unwrap()
        .get("n");
    assert_eq!(left, 0);
    conn.close().await.unwrap();
}

/// A service's own pool (default `search_path`) wrapped by `from_pool`: the statements
/// are schema-qualified, so claims and the transactional form still find the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn from_pool_uses_qualified_names() {
    let Some(h) = harness().await else { return };
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&h.url)
        .await
        .unwrap();
    let store = PgStore::from_pool(pool, h.options()).unwrap();
    assert_eq!(store.table(), format!("\"{}\".idem_records", h.schema));
    assert!(store.unique_guard().await.unwrap());
    let t = fresh_tenant();
    let req = request(&t, "k", "p", "svc");
    let mut tx = store.pool().begin().await.unwrap();
    let tok = proceed(store.claim_in_tx(&mut tx, &req).await.unwrap());
    store
        .finish_in_tx(&mut tx, &tok, succeeded("o-1"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(matches!(
        store.claim(&request(&t, "k", "p", "again")).await.unwrap(),
        Claim::Replay(_)
    ));
    // A bad schema name is refused before any SQL is built from it.
    let bad = {
        let mut o = h.options();
        o.schema = Some("x\"; DROP TABLE y; --".into());
        o
    };
    let err = PgStore::from_pool(store.pool().clone(), bad).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    store.pool().close().await;
}

/// The replay shortcut (a plain read for scopes this store saw finished) answers replays
/// and mismatches like the full claim, and never answers for a record that is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replay_shortcut_follows_the_record() {
    let Some(h) = harness().await else { return };
    let store = h.store().await;
    let mut admin = h.admin().await;
    let t = fresh_tenant();
    let req = request(&t, "k", "p", "a");
    let tok = proceed(store.claim(&req).await.unwrap());
    store.finish(&tok, succeeded("first")).await.unwrap();
    for _ in 0..3 {
        match store.claim(&req).await.unwrap() {
            Claim::Replay(r) => assert_eq!(r.result.unwrap().body, b"first"),
            other => panic!("expected replay, got {other:?}"),
        }
        let other = request(&t, "k", "another payload", "b");
        assert!(matches!(
            store.claim(&other).await.unwrap(),
            Claim::Mismatch {
                state: RecordState::Succeeded
            }
        ));
    }
    // The record leaves the online table (as the sweeper's archive move does): the
    // remembered scope must not answer; the claim decides afresh.
    admin
        .execute(sqlx::AssertSqlSafe(format!(
            "DELETE FROM idem_records WHERE tenant_id = '{}'",
            t.as_str()
        )))
        .await
        .unwrap();
    let again = proceed(store.claim(&req).await.unwrap());
    assert_eq!(again.kind, ClaimKind::Fresh);
    assert_eq!(again.version, 1);

    // A remembered scope whose record went back to FAILED_RETRYABLE is taken over, not
    // replayed.
    store
        .finish(
            &again,
            Finish {
                state: RecordState::FailedRetryable,
                result: None,
            },
        )
        .await
        .unwrap();
    let retry = proceed(store.claim(&req).await.unwrap());
    assert_eq!(retry.kind, ClaimKind::RetryAfterFailure);
}

/// Terminates every session of the store's pool, and waits until they are gone.
async fn kill_store_sessions(h: &PgHarness) {
    let mut admin = h.admin().await;
    let kill = "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
                WHERE datname = current_database() AND pid <> pg_backend_pid()
                  AND application_name = $1";
    let killed: i64 = sqlx::query_scalar(kill)
        .bind(&h.application_name)
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert!(killed > 0, "the pool held a session");
    for _ in 0..200 {
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
                .bind(&h.application_name)
                .fetch_one(&mut admin)
                .await
                .unwrap();
        if left == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("sessions still there");
}

/// The pool does not ping before each use: a connection the server closed while it was
/// idle fails its first statement, and claim, finish and lease calls try another — the
/// caller sees no error, even when every pooled connection died (a server restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_connections_killed_by_the_server_are_replaced() {
    let Some(h) = harness().await else { return };
    let store = Arc::new(
        h.store_with({
            let mut o = h.options();
            o.max_connections = 4;
            o
        })
        .await,
    );
    let t = fresh_tenant();
    // Open several pooled connections at once.
    let warm: Vec<_> = (0..4)
        .map(|i| {
            let store = store.clone();
            let req = request(&t, &format!("warm-{i}"), "p", "o");
            tokio::spawn(async move {
                let tok = proceed(store.claim(&req).await.unwrap());
                tokio::time::sleep(Duration::from_millis(50)).await;
                store.finish(&tok, succeeded("warm")).await.unwrap();
            })
        })
        .collect();
    for w in warm {
        w.await.unwrap();
    }

    kill_store_sessions(&h).await;
    let before = store.connection_retries();
    let tok = proceed(store.claim(&request(&t, "k", "p", "o")).await.unwrap());
    assert!(store.connection_retries() > before);

    kill_store_sessions(&h).await;
    store.finish(&tok, succeeded("done")).await.unwrap();
    match store.claim(&request(&t, "k", "p", "o2")).await.unwrap() {
        Claim::Replay(r) => assert_eq!(r.result.unwrap().body, b"done"),
        other => panic!("expected replay, got {other:?}"),
    }

    kill_store_sessions(&h).await;
    let name = idem_core::LeaseName::new(format!("idle-kill-{}", t.as_str())).unwrap();
    let owner = idem_core::OwnerId::new("o").unwrap();
    let lease = match idem_core::LeaseStore::try_acquire(
        store.as_ref(),
        &name,
        &owner,
        Duration::from_secs(30),
    )
    .await
    .unwrap()
    {
        idem_core::Acquire::Granted(l) => l,
        other => panic!("expected a grant, got {other:?}"),
    };
    kill_store_sessions(&h).await;
    assert!(matches!(
        idem_core::LeaseStore::release(store.as_ref(), &name, &owner, lease.token)
            .await
            .unwrap(),
        idem_core::Release::Released { .. }
    ));
}

/// The one-commit create's record: inserted whole and final in the business
/// transaction; a duplicate's final insert waits on the unique index, then writes
/// nothing after the first commits; past the transaction's `lock_timeout` the wait ends
/// as "in progress" for a claim and as "taken" for a final insert.
#[tokio::test]
async fn final_insert_in_tx_waits_then_yields_and_times_out_as_in_progress() {
    let Some(h) = harness().await else { return };
    let store = Arc::new(h.store().await);
    let t = fresh_tenant();
    let req = request(&t, "final", "show-S-204", "svc-a");

    let mut tx = store.pool().begin().await.unwrap();
    let rec = store
        .insert_final_in_tx(&mut tx, &req, succeeded("order-1"))
        .await
        .unwrap()
        .expect("inserted");
    assert_eq!((rec.state, rec.version), (RecordState::Succeeded, 1));
    assert_eq!(
        store.get(&req.scope).await.unwrap(),
        None,
        "not before the commit"
    );

    // Waiting on the uncommitted row, bounded by the lock timeout.
    let mut other = store.pool().begin().await.unwrap();
    sqlx::query("SET LOCAL lock_timeout = '200ms'")
        .execute(&mut *other)
        .await
        .unwrap();
    let dup = request(&t, "final", "show-S-204", "svc-b");
    match store.claim_in_tx(&mut other, &dup).await.unwrap() {
        Claim::InProgress { .. } => {}
        other => panic!("expected in progress, got {other:?}"),
    }
    drop(other);
    let mut other = store.pool().begin().await.unwrap();
    sqlx::query("SET LOCAL lock_timeout = '200ms'")
        .execute(&mut *other)
        .await
        .unwrap();
    assert_eq!(
        store
            .insert_final_in_tx(&mut other, &dup, succeeded("order-2"))
            .await
            .unwrap(),
        None,
        "a final insert past the lock timeout writes nothing"
    );
    drop(other);

    // Without a timeout the duplicate waits for the commit, then finds the key taken.
    let waiting = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut tx = store.pool().begin().await.unwrap();
            store
                .insert_final_in_tx(&mut tx, &dup, succeeded("order-2"))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "the duplicate waits for the first commit"
    );
    tx.commit().await.unwrap();
    assert_eq!(waiting.await.unwrap().unwrap(), None);
    let stored = store.get(&req.scope).await.unwrap().unwrap();
    assert_eq!(stored.result, Some(result("order-1")));
    // A non-final outcome cannot be inserted whole.
    let mut tx = store.pool().begin().await.unwrap();
    let retry = request(&t, "final-retry", "p", "svc-a");
    let err = store
        .insert_final_in_tx(
            &mut tx,
            &retry,
            idem_core::Finish {
                state: RecordState::FailedRetryable,
                result: None,
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), idem_core::ErrorKind::InvalidInput);
}
