//! The stored procedures (migration 5): the shared scenario suite, unchanged, through
//! `ProcedureStore`; duplicates racing in their own transactions as any client would run
//! them; the procedures' input checks and error codes.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::MyHarness;
use idem_conformance::{fresh_tenant, request, result, Harness};
use idem_core::{Claim, ClockShift, Finish, IdempotencyKey, IdempotencyStore, RecordState, Scope};
use idem_mysql::ProcedureStore;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, Connection, Executor, Row};
use tokio::sync::Barrier;

struct ProcHarness(MyHarness);

#[async_trait]
impl Harness for ProcHarness {
    async fn open(&self) -> Arc<dyn IdempotencyStore> {
        Arc::new(ProcedureStore::new(self.0.store().await))
    }

    fn clock(&self) -> &ClockShift {
        &self.0.clock
    }

    fn max_result_bytes(&self) -> usize {
        common::MAX_RESULT_BYTES
    }
}

async fn proc_harness() -> Option<ProcHarness> {
    common::harness().await.map(ProcHarness)
}

idem_conformance::store_tests!(proc_harness());

/// A pool of plain sessions at the server's default isolation (REPEATABLE READ on both
/// servers), as a client in another language opens them.
async fn client_pool(h: &MyHarness, size: u32) -> MySqlPool {
    let pool = MySqlPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&h.url)
        .await
        .expect("connect");
    pool.execute(
        "CREATE TABLE IF NOT EXISTS orders (tenant VARCHAR(128), `key` VARCHAR(255), \
         body VARCHAR(64)) ENGINE = InnoDB",
    )
    .await
    .expect("business table");
    pool
}

#[derive(Debug, Default, PartialEq)]
struct Tally {
    executed: usize,
    replayed: usize,
    other: usize,
}

/// `n` duplicates of one key, each in its own transaction calling `idem_claim` at
/// `isolation`: the one that proceeds writes a business row and finishes in the same
/// transaction. Returns the tally and the bodies seen (executed or replayed).
async fn duplicates_in_transactions(
    pool: &MySqlPool,
    isolation: &'static str,
    key: &str,
    n: usize,
) -> (Tally, Vec<Vec<u8>>) {
    let barrier = Arc::new(Barrier::new(n));
    let mut tasks = Vec::new();
    for i in 0..n {
        let (pool, barrier, key) = (pool.clone(), barrier.clone(), key.to_string());
        tasks.push(tokio::spawn(async move {
            let mut conn = pool.acquire().await.expect("acquire");
            conn.execute(AssertSqlSafe(format!(
                "SET SESSION TRANSACTION ISOLATION LEVEL {isolation}"
            )))
            .await
            .expect("isolation");
            let mut tx = conn.begin().await.expect("begin");
            barrier.wait().await;
            let row = sqlx::query(
                "CALL idem_claim('t', ?, UNHEX(SHA2('same', 256)), 'user-1', ?, 30000)",
            )
            .bind(&key)
            .bind(format!("owner-{i}"))
            .fetch_one(&mut *tx)
            .await
            .expect("idem_claim");
            let decision: String = row.get("decision");
            match decision.as_str() {
                "proceed" => {
                    // Hold the uncommitted record a while so the others pile up on it.
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    let body = format!("order-{i}");
                    sqlx::query("INSERT INTO orders VALUES ('t', ?, ?)")
                        .bind(&key)
                        .bind(&body)
                        .execute(&mut *tx)
                        .await
                        .expect("business row");
                    let version: i64 = row.get("version");
                    sqlx::query("CALL idem_finish('t', ?, ?, ?, 'succeeded', 201, '[]', ?, NULL)")
                        .bind(&key)
                        .bind(format!("owner-{i}"))
                        .bind(version)
                        .bind(body.as_bytes())
                        .fetch_one(&mut *tx)
                        .await
                        .expect("idem_finish");
                    tx.commit().await.expect("commit");
                    ("executed", Some(body.into_bytes()))
                }
                "replay" => {
                    tx.commit().await.expect("commit");
                    ("replayed", row.get::<Option<Vec<u8>>, _>("body"))
                }
                _ => ("other", None),
            }
        }));
    }
    let mut tally = Tally::default();
    let mut bodies = Vec::new();
    for t in tasks {
        let (what, body) = t.await.expect("task");
        match what {
            "executed" => tally.executed += 1,
            "replayed" => tally.replayed += 1,
            _ => tally.other += 1,
        }
        bodies.extend(body);
    }
    (tally, bodies)
}

/// 64 duplicates in their own transactions, at both isolation levels a client is likely
/// to run: one proceeds, the other 63 wait on its uncommitted record and replay its
/// committed result; one business row. Repeated.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_transactions_one_proceeds_the_rest_replay() {
    let Some(h) = common::harness().await else {
        return;
    };
    let pool = client_pool(&h, 66).await;
    for isolation in ["READ COMMITTED", "REPEATABLE READ"] {
        for rep in 0..3 {
            let key = format!("k-{}-{rep}", isolation.replace(' ', "-"));
            let (tally, bodies) = duplicates_in_transactions(&pool, isolation, &key, 64).await;
            let want = Tally {
                executed: 1,
                replayed: 63,
                other: 0,
            };
            assert_eq!(tally, want, "{isolation} rep {rep}");
            assert!(
                bodies.windows(2).all(|w| w[0] == w[1]),
                "{isolation} rep {rep}: {bodies:?}"
            );
            let orders: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE `key` = ?")
                .bind(&key)
                .fetch_one(&pool)
                .await
                .expect("count");
            assert_eq!(orders, 1, "{isolation} rep {rep}");
        }
    }
    pool.close().await;
}

/// 64 tasks claim one key through `ProcedureStore::claim_in_tx`, again and again: the
/// first winner of each round rolls back (its waiters then race for the freed key and
/// InnoDB may pick deadlock victims, answered as in progress), the next one commits.
/// Exactly one execution commits per key and every other arrival replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn in_transaction_races_with_rollbacks_execute_once() {
    let Some(h) = common::harness().await else {
        return;
    };
    let store = ProcedureStore::new(
        h.store_with({
            let mut o = h.options();
            o.max_connections = 64;
            o.lock_wait_timeout = Duration::from_secs(2);
            o
        })
        .await,
    );
    let store = Arc::new(store);
    let pool = client_pool(&h, 2).await;
    let t = fresh_tenant();
    for rep in 0..5 {
        let k = format!("tx-race-{rep}");
        let rolled_back = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(Barrier::new(64));
        let mut tasks = Vec::new();
        for i in 0..64 {
            let (store, t, k) = (store.clone(), t.clone(), k.clone());
            let (rolled_back, barrier) = (rolled_back.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                let req = request(&t, &k, "same", &format!("owner-{i}"));
                barrier.wait().await;
                let deadline = Instant::now() + Duration::from_secs(120);
                loop {
                    assert!(Instant::now() < deadline, "race did not settle");
                    let mut tx = store.mysql().pool().begin().await.unwrap();
                    match store.claim_in_tx(&mut tx, &req).await.unwrap() {
                        Claim::Proceed(token) => {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            if rolled_back.fetch_add(1, Ordering::SeqCst) == 0 {
                                tx.rollback().await.unwrap();
                                continue;
                            }
                            let body = format!("{k}-{i}");
                            sqlx::query("INSERT INTO orders VALUES (?, ?, ?)")
                                .bind(t.as_str())
                                .bind(&k)
                                .bind(&body)
                                .execute(&mut *tx)
                                .await
                                .unwrap();
                            let done = Finish {
                                state: RecordState::Succeeded,
                                result: Some(result(&body)),
                            };
                            store.finish_in_tx(&mut tx, &token, done).await.unwrap();
                            tx.commit().await.unwrap();
                            return body.into_bytes();
                        }
                        Claim::InProgress { .. } => {
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
        let rec = store
            .get(&Scope::new(t.clone(), IdempotencyKey::new(&k).unwrap()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((rec.state, rec.attempts), (RecordState::Succeeded, 1));
    }
    let orders: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE tenant = ?")
        .bind(t.as_str())
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(orders, 5, "one committed order per key");
    pool.close().await;
}

/// Bad arguments fail with SQLSTATE ID001 (a too large result with ID002, a stale finish
/// or heartbeat with ID003) before anything is written; a lost finish answered twice.
#[tokio::test]
async fn the_procedures_check_their_arguments() {
    let Some(h) = common::harness().await else {
        return;
    };
    let pool = client_pool(&h, 2).await;
    let code = |sql: String| {
        let pool = pool.clone();
        async move {
            match sqlx::raw_sql(AssertSqlSafe(sql.clone()))
                .execute(&pool)
                .await
            {
                Err(sqlx::Error::Database(db)) => db.code().map(|c| c.into_owned()),
                other => panic!("{sql}: expected an error, got {other:?}"),
            }
        }
    };
    let claim = |tenant: &str, key: &str, fp: &str, principal: &str, owner: &str, lease: &str| {
        format!("CALL idem_claim({tenant}, {key}, {fp}, {principal}, {owner}, {lease})")
    };
    let fp = "UNHEX(SHA2('x', 256))";
    let long_key = format!("'{}'", "k".repeat(256));
    let long_name = format!("'{}'", "t".repeat(129));
    for sql in [
        claim("'t'", "''", fp, "'p'", "'o'", "1000"),
        claim("'t'", "'a b'", fp, "'p'", "'o'", "1000"),
        claim("'t'", "'a,b'", fp, "'p'", "'o'", "1000"),
        claim("'t'", "'a;b'", fp, "'p'", "'o'", "1000"),
        claim("'t'", "'caf\u{e9}'", fp, "'p'", "'o'", "1000"),
        claim("'t'", "'tab\tkey'", fp, "'p'", "'o'", "1000"),
        // A final newline: `$` of an anchored pattern matches before it.
        claim("'t'", "'key\n'", fp, "'p'", "'o'", "1000"),
        claim("'t\n'", "'k'", fp, "'p'", "'o'", "1000"),
        claim("'t'", "'k'", fp, "'p\n'", "'o'", "1000"),
        claim("'t'", "'k'", fp, "'p'", "'o\n'", "1000"),
        claim("'t'", "'del\u{7f}'", fp, "'p'", "'o'", "1000"),
        claim("'t'", &long_key, fp, "'p'", "'o'", "1000"),
        claim(&long_name, "'k'", fp, "'p'", "'o'", "1000"),
        claim("NULL", "'k'", fp, "'p'", "'o'", "1000"),
        claim("'t'", "'k'", "X'00'", "'p'", "'o'", "1000"),
        claim(
            "'t'",
            "'k'",
            "CONCAT(UNHEX(SHA2('x', 256)), 'y')",
            "'p'",
            "'o'",
            "1000",
        ),
        claim("'t'", "'k'", fp, "''", "'o'", "1000"),
        claim("'t'", "'k'", fp, "'p'", "'o o'", "1000"),
        claim("'t'", "'k'", fp, "'p'", "'o'", "0"),
        claim("'t'", "'k'", fp, "'p'", "'o'", "86400001"),
    ] {
        assert_eq!(code(sql.clone()).await.as_deref(), Some("ID001"), "{sql}");
    }
    // Accepted at the edges: a 255-character key of every allowed kind of character.
    let edge = format!("'{}zZ9'", "!-.:<~".repeat(42));
    sqlx::raw_sql(AssertSqlSafe(claim(
        "'t'", &edge, fp, "'p'", "'o'", "86400000",
    )))
    .execute(&pool)
    .await
    .expect("edge key");
    let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_records")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(count, 1, "only the valid claim wrote");

    sqlx::raw_sql(AssertSqlSafe(claim("'t'", "'k'", fp, "'p'", "'o'", "1000")))
        .execute(&pool)
        .await
        .expect("claim");
    let finish = |version: &str, outcome: &str, status: &str, headers: &str, body: &str| {
        format!(
            "CALL idem_finish('t', 'k', 'o', {version}, {outcome}, {status}, {headers}, \
             {body}, NULL)"
        )
    };
    for sql in [
        "CALL idem_finish('t', 'k\n', 'o', 1, 'succeeded', 200, NULL, NULL, NULL)".to_string(),
        "CALL idem_heartbeat('t', 'k', 'o\n', 1, 1000)".to_string(),
        finish("1", "'done'", "200", "NULL", "NULL"),
        finish("0", "'succeeded'", "200", "NULL", "NULL"),
        finish("1", "'succeeded'", "70000", "NULL", "NULL"),
        finish("1", "'succeeded'", "-1", "NULL", "NULL"),
        finish("1", "'succeeded'", "NULL", "NULL", "'x'"),
        finish("1", "'succeeded'", "200", "'{\"a\":\"b\"}'", "NULL"),
        finish("1", "'succeeded'", "200", "'[[\"a\"]]'", "NULL"),
        finish("1", "'succeeded'", "200", "'[[\"a\", 1]]'", "NULL"),
        finish("1", "'succeeded'", "200", "'not json'", "NULL"),
    ] {
        assert_eq!(code(sql.clone()).await.as_deref(), Some("ID001"), "{sql}");
    }
    let big = finish(
        "1",
        "'succeeded'",
        "200",
        "'[[\"n\", \"v\"]]'",
        "REPEAT('x', 1048575)",
    );
    assert_eq!(code(big).await.as_deref(), Some("ID002"));
    assert_eq!(
        code(finish("2", "'succeeded'", "200", "NULL", "NULL"))
            .await
            .as_deref(),
        Some("ID003"),
        "a version the claim never had"
    );
    let heartbeat = "CALL idem_heartbeat('t', 'k', 'other', 1, 1000)".to_string();
    assert_eq!(code(heartbeat).await.as_deref(), Some("ID003"));
    // Still PROCESSING, unchanged by the refused calls.
    let (state, version): (String, i64) =
        sqlx::query_as("SELECT state, version FROM idem_records WHERE `key` = 'k'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((state.as_str(), version), ("PROCESSING", 1));
    // Two heartbeats within one millisecond both answer (nothing changed the second
    // time, and the client did not ask for found rows).
    for _ in 0..2 {
        let deadline: i64 = sqlx::query_scalar("CALL idem_heartbeat('t', 'k', 'o', 1, 1000)")
            .fetch_one(&pool)
            .await
            .expect("heartbeat");
        assert!(deadline > 0);
    }
    // The same finish twice: the second (a retry after a lost answer) gets the same
    // version; a different result is refused.
    let ok = finish("1", "'succeeded'", "200", "'[]'", "'x'");
    let mut versions = Vec::new();
    for _ in 0..2 {
        let row = sqlx::query(AssertSqlSafe(ok.clone()))
            .fetch_one(&pool)
            .await
            .unwrap();
        versions.push(row.get::<i64, _>("version"));
    }
    assert_eq!(versions, [2, 2]);
    let other = finish("1", "'succeeded'", "200", "'[]'", "'y'");
    assert_eq!(code(other).await.as_deref(), Some("ID003"));
    // The claim now replays the stored result.
    let row = sqlx::query(AssertSqlSafe(claim(
        "'t'", "'k'", fp, "'p'", "'o2'", "1000",
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    let (decision, status, body): (String, Option<i32>, Option<Vec<u8>>) =
        (row.get("decision"), row.get("status"), row.get("body"));
    assert_eq!(
        (decision.as_str(), status, body.as_deref()),
        ("replay", Some(200), Some(&b"x"[..]))
    );
    pool.close().await;
}

/// The test clock shift is consumed by the call it was set for: a value left by an
/// earlier call never moves a later one's clock.
#[tokio::test]
async fn the_clock_shift_lasts_one_call() {
    let Some(h) = common::harness().await else {
        return;
    };
    let pool = client_pool(&h, 1).await;
    let mut conn = pool.acquire().await.unwrap();
    let call =
        |key: &str| format!("CALL idem_claim('t', '{key}', UNHEX(SHA2('x', 256)), 'p', 'o', 1000)");
    conn.execute("SET @idem_clock_shift_ms = 3600000")
        .await
        .unwrap();
    let shifted = sqlx::query(AssertSqlSafe(call("a")))
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    let left: Option<i64> = sqlx::query_scalar("SELECT @idem_clock_shift_ms")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(left, None, "consumed");
    let plain = sqlx::query(AssertSqlSafe(call("b")))
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    let (a, b): (i64, i64) = (shifted.get("created_at"), plain.get("created_at"));
    assert!(a - b > 3_500_000, "a {a} b {b}");
}

/// Times claim+complete of fresh keys and replays through the procedures and through the
/// statement store, alternating rounds (and which goes first) on one pool of 2. Run with
/// `cargo test -p idem-mysql --test procedures -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "timing; prints ratios"]
async fn bench_procedures_against_statements() {
    let Some(h) = common::harness().await else {
        return;
    };
    let mut options = h.options();
    options.max_connections = 2;
    options.recent_capacity = 0; // both claims read through one statement
    let my = h.store_with(options).await;
    let procs = ProcedureStore::new(my.clone());
    let stores: [(&str, Arc<dyn IdempotencyStore>); 2] = [
        ("statements", Arc::new(my)),
        ("procedures", Arc::new(procs)),
    ];
    let tenant = fresh_tenant();
    let per_round = 300;
    let rounds = 7;
    let mut totals = [[Duration::ZERO; 2]; 2]; // [store][claim+complete, replay]
    for round in 0..rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let (name, store) = &stores[i];
            let keys: Vec<_> = (0..per_round)
                .map(|n| request(&tenant, &format!("{name}-{round}-{n}"), "p", "o"))
                .collect();
            let start = Instant::now();
            for req in &keys {
                match store.claim(req).await.unwrap() {
                    Claim::Proceed(token) => {
                        store.complete(&token, result("r")).await.unwrap();
                    }
                    other => panic!("{other:?}"),
                }
            }
            let fresh = start.elapsed();
            let start = Instant::now();
            for req in &keys {
                assert!(matches!(store.claim(req).await.unwrap(), Claim::Replay(_)));
            }
            let replay = start.elapsed();
            // The first round warms the pool and the statement caches.
            if round > 0 {
                totals[i][0] += fresh;
                totals[i][1] += replay;
            }
        }
    }
    let n = (per_round * (rounds - 1)) as f64;
    let us = |d: Duration| d.as_secs_f64() * 1e6 / n;
    for (what, j) in [("claim+complete", 0), ("replay", 1)] {
        println!(
            "{what}: statements {:.0} us, procedures {:.0} us, procedures/statements {:.2}",
            us(totals[0][j]),
            us(totals[1][j]),
            totals[1][j].as_secs_f64() / totals[0][j].as_secs_f64()
        );
    }
}

/// A procedure works on its own database's tables whatever the session's default
/// database: a decoy `idem_records` there is never touched.
#[tokio::test]
async fn the_callers_default_database_does_not_redirect_the_procedures() {
    let (Some(h), Some(decoy)) = (common::harness().await, common::unmigrated().await) else {
        return;
    };
    let mut conn = decoy.admin().await;
    conn.execute(AssertSqlSafe(format!(
        "CREATE TABLE idem_records LIKE `{}`.idem_records",
        h.database
    )))
    .await
    .expect("decoy table");
    let decision: String = sqlx::query_scalar(AssertSqlSafe(format!(
        "CALL `{}`.idem_claim('t', 'k', UNHEX(SHA2('x', 256)), 'p', 'o', 1000)",
        h.database
    )))
    .fetch_one(&mut conn)
    .await
    .expect("claim");
    assert_eq!(decision, "proceed");
    let count = |db: String| {
        let url = decoy.url.clone();
        async move {
            let mut c = sqlx::MySqlConnection::connect(&url).await.expect("connect");
            sqlx::query_scalar::<_, i64>(AssertSqlSafe(format!(
                "SELECT COUNT(*) FROM `{db}`.idem_records"
            )))
            .fetch_one(&mut c)
            .await
            .expect("count")
        }
    };
    assert_eq!(count(h.database.clone()).await, 1);
    assert_eq!(count(decoy.database.clone()).await, 0);
    conn.close().await.expect("close");
}
