//! MySQL / MariaDB behaviour beyond the shared scenarios: migrations, the live
//! unique-guard check, the transactional form, and InnoDB's locking under 64-way races
//! (duplicate-key waits, deadlock victims and lock wait timeouts inside and outside the
//! caller's transaction), key length and collation, millisecond times.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{harness, unmigrated};
use idem_conformance::{fresh_tenant, request, result};
use idem_core::{
    Claim, ClaimToken, ErrorKind, Finish, IdempotencyKey, IdempotencyStore, RecordState, Scope,
    TenantId,
};
use idem_mysql::{MysqlOptions, MysqlStore};
use sqlx::{Connection, Executor};

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

fn scope(t: &TenantId, k: &str) -> Scope {
    Scope::new(t.clone(), IdempotencyKey::new(k).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_twice_and_concurrently() {
    let Some(h) = harness().await else { return };
    let store = h.store().await;
    assert!(store.migrate().await.unwrap().is_empty());

    // Two pools on an empty database migrating at once: each version applied once.
    let Some(h2) = unmigrated().await else { return };
    let (a, b) = (h2.store().await, h2.store().await);
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
    assert_eq!(
        versions,
        (1..=idem_mysql::newest_migration()).collect::<Vec<_>>()
    );
    assert_eq!(all, versions, "each version applied once: {ra:?} {rb:?}");
    assert!(a.unique_guard().await.unwrap());

    // A version whose record was lost (a crash between its DDL and its record) is
    // applied again without error: every statement is safe to run twice.
    admin
        .execute("DELETE FROM idem_schema_migrations WHERE version >= 2")
        .await
        .unwrap();
    let again = a.migrate().await.unwrap();
    assert_eq!(
        again,
        (2..=idem_mysql::newest_migration()).collect::<Vec<_>>()
    );
    proceed(
        a.claim(&request(&fresh_tenant(), "k", "p", "o"))
            .await
            .unwrap(),
    );
    admin.close().await.unwrap();
}

#[tokio::test]
async fn unique_guard_reads_the_live_catalog() {
    let Some(h) = harness().await else { return };
    let store = h.store().await;
    let mut admin = h.admin().await;
    assert!(store.unique_guard().await.unwrap());
    admin
        .execute("ALTER TABLE idem_records DROP PRIMARY KEY")
        .await
        .unwrap();
    assert!(!store.unique_guard().await.unwrap());
    // Keys that do not cover exactly (tenant_id, key), whole, do not count.
    admin
        .execute(
            "ALTER TABLE idem_records ADD UNIQUE KEY wider_uq (tenant_id, `key`, principal), \
             ADD UNIQUE KEY prefix_uq (tenant_id, `key`(100)), ADD KEY plain_idx (tenant_id, `key`)",
        )
        .await
        .unwrap();
    assert!(!store.unique_guard().await.unwrap());
    admin
        .execute("ALTER TABLE idem_records ADD UNIQUE KEY scope_uq (`key`, tenant_id)")
        .await
        .unwrap();
    assert!(store.unique_guard().await.unwrap());
    admin.close().await.unwrap();
}

async fn orders_table(store: &MysqlStore) {
    store
        .pool()
        .execute(
            "CREATE TABLE IF NOT EXISTS orders (id VARCHAR(64) PRIMARY KEY, \
             tenant VARCHAR(128) NOT NULL) ENGINE = InnoDB",
        )
        .await
        .unwrap();
}

async fn order_count(store: &MysqlStore, tenant: &TenantId) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE tenant = ?")
        .bind(tenant.as_str())
        .fetch_one(store.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn transactional_form_commits_or_rolls_back_with_the_business_write() {
    let Some(h) = harness().await else { return };
    let store = h.store().await;
    orders_table(&store).await;
    let t = fresh_tenant();
    let req = request(&t, "tx", "p", "svc");

    let mut tx = store.pool().begin().await.unwrap();
    let token = proceed(store.claim_in_tx(&mut tx, &req).await.unwrap());
    sqlx::query("INSERT INTO orders (id, tenant) VALUES ('o-1', ?)")
        .bind(t.as_str())
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(store.get(&req.scope).await.unwrap(), None);
    assert_eq!(order_count(&store, &t).await, 0);

    let mut tx = store.pool().begin().await.unwrap();
    let token2 = proceed(store.claim_in_tx(&mut tx, &req).await.unwrap());
    assert_eq!(token2.version, token.version);
    sqlx::query("INSERT INTO orders (id, tenant) VALUES ('o-1', ?)")
        .bind(t.as_str())
        .execute(&mut *tx)
        .await
        .unwrap();
    let rec = store
        .finish_in_tx(&mut tx, &token2, succeeded("o-1"))
        .await
        .unwrap();
    assert_eq!((rec.state, rec.version), (RecordState::Succeeded, 2));
    tx.commit().await.unwrap();
    assert_eq!(store.get(&req.scope).await.unwrap(), Some(rec));
    assert_eq!(order_count(&store, &t).await, 1);
    // A stale finish in a transaction is superseded.
    let mut tx = store.pool().begin().await.unwrap();
    let err = store
        .finish_in_tx(&mut tx, &token, succeeded("other"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
}

/// 64 tasks claim one key in their own transactions, again and again: the first
/// winner of each round rolls back (its waiters then race for the freed key: InnoDB's
/// classic duplicate-key deadlock), the next one commits. Exactly one execution commits
/// per key, every other arrival replays it, and no error escapes.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn in_transaction_64_way_races_with_rollbacks() {
    let Some(h) = harness().await else { return };
    let store = Arc::new(
        h.store_with({
            let mut o = h.options();
            o.max_connections = 64;
            o.lock_wait_timeout = Duration::from_secs(2);
            o
        })
        .await,
    );
    orders_table(&store).await;
    let t = fresh_tenant();
    let mut in_progress_total = 0;
    for rep in 0..10 {
        let k = format!("tx-race-{rep}");
        let rolled_back = Arc::new(AtomicUsize::new(0));
        let in_progress = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(Barrier::new(64));
        let mut tasks = Vec::new();
        for i in 0..64 {
            let (store, t, k) = (store.clone(), t.clone(), k.clone());
            let (rolled_back, in_progress, barrier) =
                (rolled_back.clone(), in_progress.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                let req = request(&t, &k, "same", &format!("owner-{i}"));
                barrier.wait().await;
                let deadline = Instant::now() + Duration::from_secs(120);
                loop {
                    assert!(Instant::now() < deadline, "race did not settle");
                    let mut tx = store.pool().begin().await.unwrap();
                    match store.claim_in_tx(&mut tx, &req).await.unwrap() {
                        Claim::Proceed(token) => {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            if rolled_back.fetch_add(1, Ordering::SeqCst) == 0 {
                                tx.rollback().await.unwrap();
                                continue;
                            }
                            let id = format!("{k}-{i}");
                            sqlx::query("INSERT INTO orders (id, tenant) VALUES (?, ?)")
                                .bind(&id)
                                .bind(t.as_str())
                                .execute(&mut *tx)
                                .await
                                .unwrap();
                            store
                                .finish_in_tx(&mut tx, &token, succeeded(&id))
                                .await
                                .unwrap();
                            tx.commit().await.unwrap();
                            return id.into_bytes();
                        }
                        Claim::InProgress { .. } => {
                            in_progress.fetch_add(1, Ordering::Relaxed);
                            drop(tx);
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        Claim::Replay(rec) => return rec.result.unwrap().body,
                        Claim::Mismatch { .. } => panic!("same payload reported as mismatch"),
                    }
                }
            }));
        }
        let mut bodies = Vec::new();
        for task in tasks {
            bodies.push(task.await.unwrap());
        }
        assert!(
            bodies.windows(2).all(|w| w[0] == w[1]),
            "rep {rep}: one outcome"
        );
        let rec = store.get(&scope(&t, &k)).await.unwrap().unwrap();
        assert_eq!((rec.state, rec.attempts), (RecordState::Succeeded, 1));
        in_progress_total += in_progress.load(Ordering::Relaxed);
    }
    assert_eq!(
        order_count(&store, &t).await,
        10,
        "one committed order per key"
    );
    eprintln!(
        "in-transaction races: {in_progress_total} in-progress answers, {} lock conflicts",
        store.lock_conflicts()
    );
}

/// 64 concurrent claims outside transactions, on fresh keys and on a FAILED_RETRYABLE
/// record (the takeover compare-and-set), repeated: exactly one execution each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn autocommit_64_way_races_on_fresh_and_retryable_keys() {
    let Some(h) = harness().await else { return };
    let store = Arc::new(
        h.store_with({
            let mut o = h.options();
            o.max_connections = 32;
            o.recent_capacity = 0;
            o
        })
        .await,
    );
    let t = fresh_tenant();
    for rep in 0..10 {
        let k = format!("race-{rep}");
        if rep % 2 == 1 {
            // A failed first attempt: the race is over its takeover.
            let tok = proceed(
                store
                    .claim(&request(&t, &k, "same", "first"))
                    .await
                    .unwrap(),
            );
            store
                .finish(
                    &tok,
                    Finish {
                        state: RecordState::FailedRetryable,
                        result: None,
                    },
                )
                .await
                .unwrap();
        }
        let executions = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(Barrier::new(64));
        let mut tasks = Vec::new();
        for i in 0..64 {
            let (store, t, k) = (store.clone(), t.clone(), k.clone());
            let (executions, barrier) = (executions.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                let req = request(&t, &k, "same", &format!("owner-{i}"));
                barrier.wait().await;
                loop {
                    match store.claim(&req).await.expect("no error escapes") {
                        Claim::Proceed(token) => {
                            executions.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            store
                                .complete(&token, result(&format!("{i}")))
                                .await
                                .unwrap();
                            return format!("{i}");
                        }
                        Claim::InProgress { .. } => {
                            tokio::time::sleep(Duration::from_millis(2)).await
                        }
                        Claim::Replay(rec) => {
                            return String::from_utf8(rec.result.unwrap().body).unwrap()
                        }
                        Claim::Mismatch { .. } => panic!("mismatch"),
                    }
                }
            }));
        }
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await.unwrap());
        }
        assert_eq!(executions.load(Ordering::SeqCst), 1, "rep {rep}");
        assert!(answers.windows(2).all(|w| w[0] == w[1]), "rep {rep}");
        let rec = store.get(&scope(&t, &k)).await.unwrap().unwrap();
        assert_eq!(rec.attempts, if rep % 2 == 1 { 2 } else { 1 });
    }
    eprintln!(
        "autocommit races: {} re-runs, {} lock conflicts",
        store.claim_reruns(),
        store.lock_conflicts()
    );
}

/// 64 one-commit creates of one key, repeated; the first inserter of each round rolls
/// back. Exactly one final record commits, and every other create learns the key is
/// taken (or was refused over a lock) without writing.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn final_insert_64_way_races_with_rollbacks() {
    let Some(h) = harness().await else { return };
    let store = Arc::new(
        h.store_with({
            let mut o = h.options();
            o.max_connections = 64;
            o
        })
        .await,
    );
    let t = fresh_tenant();
    for rep in 0..10 {
        let k = format!("final-{rep}");
        let rolled_back = Arc::new(AtomicUsize::new(0));
        let committed = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(Barrier::new(64));
        let mut tasks = Vec::new();
        for i in 0..64 {
            let (store, t, k) = (store.clone(), t.clone(), k.clone());
            let (rolled_back, committed, barrier) =
                (rolled_back.clone(), committed.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                let req = request(&t, &k, "same", &format!("svc-{i}"));
                barrier.wait().await;
                let deadline = Instant::now() + Duration::from_secs(120);
                loop {
                    assert!(Instant::now() < deadline, "race did not settle");
                    let mut tx = store.pool().begin().await.unwrap();
                    let body = format!("order-{i}");
                    match store
                        .insert_final_in_tx(&mut tx, &req, succeeded(&body))
                        .await
                        .unwrap()
                    {
                        Some(_) if rolled_back.fetch_add(1, Ordering::SeqCst) == 0 => {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            tx.rollback().await.unwrap();
                        }
                        Some(_) => {
                            tx.commit().await.unwrap();
                            committed.fetch_add(1, Ordering::SeqCst);
                            return body;
                        }
                        None => {
                            drop(tx);
                            if let Some(rec) = store.get(&req.scope).await.unwrap() {
                                return String::from_utf8(rec.result.unwrap().body).unwrap();
                            }
                        }
                    }
                }
            }));
        }
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await.unwrap());
        }
        assert_eq!(committed.load(Ordering::SeqCst), 1, "rep {rep}");
        assert!(answers.windows(2).all(|w| w[0] == w[1]), "rep {rep}");
    }
    eprintln!(
        "final-insert races: {} lock conflicts",
        store.lock_conflicts()
    );
}

/// A duplicate waits on the uncommitted row, bounded by the session's
/// `innodb_lock_wait_timeout`: a claim in a transaction answers in progress, a final
/// insert writes nothing; without the timeout running out the duplicate waits for the
/// commit, then finds the key taken.
#[tokio::test]
async fn waits_on_an_uncommitted_row_end_at_the_lock_wait_timeout() {
    let Some(h) = harness().await else { return };
    let store = Arc::new(
        h.store_with({
            let mut o = h.options();
            o.lock_wait_timeout = Duration::from_secs(1);
            o
        })
        .await,
    );
    let t = fresh_tenant();
    let req = request(&t, "held", "p", "svc-a");
    let mut tx = store.pool().begin().await.unwrap();
    store
        .insert_final_in_tx(&mut tx, &req, succeeded("order-1"))
        .await
        .unwrap()
        .expect("inserted");

    let dup = request(&t, "held", "p", "svc-b");
    let started = Instant::now();
    let mut other = store.pool().begin().await.unwrap();
    match store.claim_in_tx(&mut other, &dup).await.unwrap() {
        Claim::InProgress { .. } => {}
        answer => panic!("expected in progress, got {answer:?}"),
    }
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    drop(other);
    let mut other = store.pool().begin().await.unwrap();
    assert_eq!(
        store
            .insert_final_in_tx(&mut other, &dup, succeeded("order-2"))
            .await
            .unwrap(),
        None
    );
    drop(other);

    let waiting = {
        let (store, dup) = (store.clone(), dup.clone());
        tokio::spawn(async move { store.claim(&dup).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the duplicate waits for the commit");
    tx.commit().await.unwrap();
    match waiting.await.unwrap().unwrap() {
        Claim::Replay(rec) => assert_eq!(rec.result, Some(result("order-1"))),
        answer => panic!("expected a replay, got {answer:?}"),
    }
}

/// Keys compare as bytes (the default utf8mb4 collations would fold `K` into `k`), and
/// the longest key with the longest tenant fits the primary key.
#[tokio::test]
async fn keys_compare_as_bytes_and_the_longest_fit() {
    let Some(h) = harness().await else { return };
    let store = h.store().await;
    let t = fresh_tenant();
    proceed(store.claim(&request(&t, "Key-A", "p", "o")).await.unwrap());
    proceed(store.claim(&request(&t, "key-a", "p", "o")).await.unwrap());
    let long_key = "k".repeat(idem_core::key::MAX_KEY_LEN);
    let long_tenant = TenantId::new("t".repeat(idem_core::key::MAX_NAME_LEN)).unwrap();
    let tok = proceed(
        store
            .claim(&request(&long_tenant, &long_key, "p", "o"))
            .await
            .unwrap(),
    );
    store.complete(&tok, result("long")).await.unwrap();
    let rec = store
        .get(&scope(&long_tenant, &long_key))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.key.as_str(), long_key);
    assert_eq!(rec.tenant, long_tenant);
}

/// Times are epoch milliseconds from the server clock: a lease deadline is exactly the
/// lease after the claim, and the store clock is the server's (within a second of ours
/// here), not whole seconds.
#[tokio::test]
async fn times_are_server_milliseconds() {
    let Some(h) = harness().await else { return };
    let store = h.store().await;
    let t = fresh_tenant();
    let mut off_second = 0;
    for i in 0..20 {
        let req = request(&t, &format!("ms-{i}"), "p", "o");
        let tok = proceed(store.claim(&req).await.unwrap());
        let rec = store.get(&req.scope).await.unwrap().unwrap();
        assert_eq!(tok.lease_expires_at - rec.created_at, 30_000);
        assert_eq!(rec.lease_expires_at, Some(tok.lease_expires_at));
        if rec.created_at % 1000 != 0 {
            off_second += 1;
        }
        let done = store.complete(&tok, result("x")).await.unwrap();
        assert_eq!(done.completed_at, Some(done.updated_at));
        assert!(done.updated_at >= rec.created_at);
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    assert!(off_second > 0, "millisecond precision");
    let now = idem_core::RetentionStore::now(&store).await.unwrap();
    let ours = idem_core::retention::millis(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap(),
    );
    assert!((now - ours).abs() < 1000, "{now} vs {ours}");
}

/// A finish answers the stored record whether its token kept the claim's principal,
/// fingerprint and creation time (the finish is one statement) or crossed a process
/// boundary without them (they are read back), after a fresh claim and a takeover.
#[tokio::test]
async fn finish_answers_the_stored_record_with_or_without_what_the_token_kept() {
    let Some(h) = harness().await else { return };
    let store = h.store().await;
    let t = fresh_tenant();
    for through_json in [false, true] {
        let key = format!("kept-{through_json}");
        let carry = |tok: ClaimToken| -> ClaimToken {
            if through_json {
                serde_json::from_str(&serde_json::to_string(&tok).unwrap()).unwrap()
            } else {
                tok
            }
        };
        let first = carry(proceed(
            store.claim(&request(&t, &key, "p", "o1")).await.unwrap(),
        ));
        let failed = store
            .finish(
                &first,
                Finish {
                    state: RecordState::FailedRetryable,
                    result: None,
                },
            )
            .await
            .unwrap();
        let scope = scope(&t, &key);
        assert_eq!(Some(&failed), store.get(&scope).await.unwrap().as_ref());
        tokio::time::sleep(Duration::from_millis(3)).await;
        let retry = carry(proceed(
            store.claim(&request(&t, &key, "p", "o2")).await.unwrap(),
        ));
        assert_eq!(retry.version, 3);
        let done = store.finish(&retry, succeeded("x")).await.unwrap();
        let stored = store.get(&scope).await.unwrap().unwrap();
        assert_eq!(done, stored);
        assert_eq!(done.created_at, failed.created_at, "the first claim's time");
        assert!(done.updated_at > done.created_at);
    }
}

#[tokio::test]
async fn unreachable_is_unavailable_and_bad_urls_are_invalid() {
    let err = MysqlStore::connect("mysql://root@127.0.0.1:1/test", {
        let mut o = MysqlOptions::default();
        o.acquire_timeout = Duration::from_secs(2);
        o
    })
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("mysql connect"), "{err}");
    let err = MysqlStore::connect("mysql://h:notaport/db", MysqlOptions::default())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
}

/// A missing table is a backend error naming the server's error number, never a guess.
#[tokio::test]
async fn a_missing_table_is_a_backend_error() {
    let Some(h) = unmigrated().await else { return };
    let store = h.store().await;
    let err = store
        .claim(&request(&fresh_tenant(), "k", "p", "o"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    assert!(err.to_string().contains("[1146]"), "{err}");
}

/// Gap locks: a transaction that met a duplicate on the primary key holds a lock on that
/// record only. With the guard as a secondary unique index it would hold a next-key lock
/// covering the gap before the record, and fresh keys sorting into that gap would wait
/// out the lock wait timeout. 64 concurrent claims of such neighbours, repeated, all
/// finish well inside the timeout and none meets a lock conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn a_duplicate_holds_no_gap_lock_over_its_neighbours() {
    let Some(h) = harness().await else { return };
    let store = Arc::new(
        h.store_with({
            let mut o = h.options();
            o.max_connections = 64;
            o.lock_wait_timeout = Duration::from_secs(2);
            o.recent_capacity = 0;
            o
        })
        .await,
    );
    let t = fresh_tenant();
    for rep in 0..5 {
        let anchor = request(&t, &format!("gap-{rep}-m"), "p", "first");
        let tok = proceed(store.claim(&anchor).await.unwrap());
        store.complete(&tok, result("anchor")).await.unwrap();
        // The duplicate's lock stays until this transaction ends.
        let mut holder = store.pool().begin().await.unwrap();
        assert_eq!(
            store
                .insert_final_in_tx(&mut holder, &anchor, succeeded("again"))
                .await
                .unwrap(),
            None
        );
        let started = Instant::now();
        let mut tasks = Vec::new();
        for i in 0..64 {
            // `gap-{rep}-l…` sorts right before the anchor `gap-{rep}-m`.
            let (store, req) = (
                store.clone(),
                request(&t, &format!("gap-{rep}-l{i:02}"), "p", "o"),
            );
            tasks.push(tokio::spawn(async move { store.claim(&req).await }));
        }
        for task in tasks {
            proceed(task.await.unwrap().expect("no lock error"));
        }
        let took = started.elapsed();
        assert!(took < Duration::from_millis(1500), "rep {rep}: {took:?}");
        holder.rollback().await.unwrap();
    }
    assert_eq!(store.lock_conflicts(), 0);
}

/// Fault test: while 64-way duplicate races run, another session keeps killing the
/// store's sessions (`KILL`). Still exactly one execution per intent, every other
/// arrival replays it (after the store tried another connection, or answered
/// `Unavailable` and the caller retried), and no record is left PROCESSING.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn killed_sessions_during_races_still_execute_once() {
    let Some(h) = harness().await else { return };
    let store = Arc::new(
        h.store_with({
            let mut o = h.options();
            o.max_connections = 16;
            o
        })
        .await,
    );
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let kills = Arc::new(AtomicUsize::new(0));
    let killer = {
        let (stop, kills, url, database) = (
            stop.clone(),
            kills.clone(),
            h.server_url.clone(),
            h.database.clone(),
        );
        tokio::spawn(async move {
            let mut admin = sqlx::MySqlConnection::connect(&url).await.unwrap();
            while !stop.load(Ordering::Relaxed) {
                let ids: Vec<i64> = sqlx::query_scalar(
                    "SELECT ID FROM information_schema.PROCESSLIST \
                     WHERE DB = ? AND ID <> CONNECTION_ID()",
                )
                .bind(&database)
                .fetch_all(&mut admin)
                .await
                .unwrap();
                // A few at a time, so some calls run on live sessions in between.
                for id in ids.into_iter().take(3) {
                    if admin
                        .execute(sqlx::AssertSqlSafe(format!("KILL {id}")))
                        .await
                        .is_ok()
                    {
                        kills.fetch_add(1, Ordering::Relaxed);
                    }
                }
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        })
    };
    let t = fresh_tenant();
    let unavailable = Arc::new(AtomicUsize::new(0));
    for rep in 0..6 {
        let k = format!("killed-{rep}");
        let executions = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..64 {
            let (store, t, k) = (store.clone(), t.clone(), k.clone());
            let (executions, unavailable) = (executions.clone(), unavailable.clone());
            tasks.push(tokio::spawn(async move {
                let mut req = request(&t, &k, "same", &format!("owner-{i}"));
                // A claim whose answer was lost leaves its record PROCESSING until the
                // lease runs out; then another arrival takes it over.
                req.lease = Duration::from_secs(2);
                let deadline = Instant::now() + Duration::from_secs(60);
                loop {
                    assert!(Instant::now() < deadline, "race did not settle");
                    match store.claim(&req).await {
                        Err(e) if e.is_unavailable() => {
                            unavailable.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        Err(e) => panic!("claim: {e:?}"),
                        Ok(Claim::Proceed(token)) => {
                            executions.fetch_add(1, Ordering::SeqCst);
                            let body = format!("{i}");
                            loop {
                                match store.complete(&token, result(&body)).await {
                                    Ok(_) => return body,
                                    Err(e) if e.is_unavailable() => {
                                        unavailable.fetch_add(1, Ordering::Relaxed);
                                        tokio::time::sleep(Duration::from_millis(5)).await;
                                    }
                                    Err(e) => panic!("complete: {e:?}"),
                                }
                            }
                        }
                        Ok(Claim::InProgress { .. }) => {
                            tokio::time::sleep(Duration::from_millis(5)).await
                        }
                        Ok(Claim::Replay(rec)) => {
                            return String::from_utf8(rec.result.unwrap().body).unwrap()
                        }
                        Ok(Claim::Mismatch { .. }) => panic!("mismatch"),
                    }
                }
            }));
        }
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await.unwrap());
        }
        assert_eq!(executions.load(Ordering::SeqCst), 1, "rep {rep}");
        assert!(answers.windows(2).all(|w| w[0] == w[1]), "rep {rep}");
    }
    stop.store(true, Ordering::Relaxed);
    killer.await.unwrap();
    // A fresh session: the pool's may have been killed last.
    let mut admin = h.admin().await;
    let stuck: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM idem_records WHERE state = 'PROCESSING'")
            .fetch_one(&mut admin)
            .await
            .unwrap();
    assert_eq!(stuck, 0);
    assert!(kills.load(Ordering::Relaxed) > 0, "the fault was injected");
    eprintln!(
        "killed sessions: {} kills, {} retries on another connection, {} unavailable answers",
        kills.load(Ordering::Relaxed),
        store.connection_retries(),
        unavailable.load(Ordering::Relaxed)
    );
}
