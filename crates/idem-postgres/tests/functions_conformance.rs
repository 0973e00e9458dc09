//! The SQL functions (migration 11): the shared scenario suite, unchanged, through
//! `FunctionStore`; duplicates racing in their own transactions as any client would run
//! them; the functions' input checks and error codes; and an ignored timing comparison
//! with the statement store.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::PgHarness;
use idem_conformance::{request, result, Harness};
use idem_core::{Claim, ClockShift, IdempotencyStore};
use idem_postgres::FunctionStore;
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, Executor, PgPool, Row};
use tokio::sync::Barrier;

struct FnHarness(PgHarness);

#[async_trait]
impl Harness for FnHarness {
    async fn open(&self) -> Arc<dyn IdempotencyStore> {
        Arc::new(FunctionStore::new(self.0.store().await))
    }

    fn clock(&self) -> &ClockShift {
        &self.0.clock
    }

    fn max_result_bytes(&self) -> usize {
        common::MAX_RESULT_BYTES
    }
}

async fn fn_harness() -> Option<FnHarness> {
    common::harness().await.map(FnHarness)
}

idem_conformance::store_tests!(fn_harness());

/// A pool of plain sessions whose search_path does not name the store's schema: the
/// functions must not need it.
async fn client_pool(h: &PgHarness, size: u32) -> PgPool {
    let pool = PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&h.url)
        .await
        .expect("connect");
    pool.execute(AssertSqlSafe(format!(
        "CREATE TABLE \"{}\".orders (tenant text, key text, body text)",
        h.schema
    )))
    .await
    .expect("business table");
    pool
}

#[derive(Debug, Default, PartialEq)]
struct Tally {
    executed: usize,
    rolled_back: usize,
    replayed: usize,
    other: usize,
}

/// `n` duplicates of one key, each in its own transaction calling `idem_claim` (as a
/// service in any language does). When `roll_back_first`, the first to proceed rolls its
/// transaction back instead of committing. Returns the tally and the replayed bodies.
async fn duplicates_in_transactions(
    pool: &PgPool,
    schema: &str,
    tenant: &str,
    key: &str,
    n: usize,
    roll_back_first: bool,
) -> (Tally, Vec<Vec<u8>>) {
    let barrier = Arc::new(Barrier::new(n));
    let first = Arc::new(AtomicBool::new(roll_back_first));
    let mut tasks = Vec::new();
    for i in 0..n {
        let (pool, barrier, first) = (pool.clone(), barrier.clone(), first.clone());
        let (schema, tenant, key) = (schema.to_string(), tenant.to_string(), key.to_string());
        tasks.push(tokio::spawn(async move {
            let mut tx = pool.begin().await.expect("begin");
            barrier.wait().await;
            let row = sqlx::query(AssertSqlSafe(format!(
                "SELECT decision, version, body FROM \"{schema}\".idem_claim(\
                 $1, $2, sha256('same'::bytea), 'user-1', $3, 30000)"
            )))
            .bind(&tenant)
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
                    if first.swap(false, Ordering::SeqCst) {
                        tx.rollback().await.expect("rollback");
                        return ("rolled_back", None);
                    }
                    let body = format!("order-{i}");
                    sqlx::query(AssertSqlSafe(format!(
                        "INSERT INTO \"{schema}\".orders VALUES ($1, $2, $3)"
                    )))
                    .bind(&tenant)
                    .bind(&key)
                    .bind(&body)
                    .execute(&mut *tx)
                    .await
                    .expect("business row");
                    sqlx::query(AssertSqlSafe(format!(
                        "SELECT version FROM \"{schema}\".idem_finish($1, $2, $3, $4, \
                         'succeeded', 201, '[]', $5, NULL)"
                    )))
                    .bind(&tenant)
                    .bind(&key)
                    .bind(format!("owner-{i}"))
                    .bind(row.get::<i64, _>("version"))
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
            "rolled_back" => tally.rolled_back += 1,
            "replayed" => tally.replayed += 1,
            _ => tally.other += 1,
        }
        bodies.extend(body);
    }
    (tally, bodies)
}

async fn orders(pool: &PgPool, schema: &str, tenant: &str, key: &str) -> i64 {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{schema}\".orders WHERE tenant = $1 AND key = $2"
    )))
    .bind(tenant)
    .bind(key)
    .fetch_one(pool)
    .await
    .expect("count")
}

/// 64 duplicates in their own transactions: one proceeds, the other 63 wait on its
/// uncommitted record and replay its committed result; one business row. Repeated.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_transactions_one_proceeds_the_rest_replay() {
    let Some(h) = common::harness().await else {
        return;
    };
    let pool = client_pool(&h, 66).await;
    for rep in 0..5 {
        let (tenant, key) = (format!("t-{rep}"), format!("k-{rep}"));
        let (tally, bodies) =
            duplicates_in_transactions(&pool, &h.schema, &tenant, &key, 64, false).await;
        let want = Tally {
            executed: 1,
            replayed: 63,
            ..Tally::default()
        };
        assert_eq!(tally, want, "rep {rep}");
        assert!(
            bodies.windows(2).all(|w| w[0] == w[1]),
            "rep {rep}: {bodies:?}"
        );
        assert_eq!(
            orders(&pool, &h.schema, &tenant, &key).await,
            1,
            "rep {rep}"
        );
    }
    pool.close().await;
}

/// The first to proceed rolls back: exactly one of the waiting duplicates proceeds after
/// it (the record vanished with the rollback), commits, and the rest replay that one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_a_rollback_exactly_one_more_proceeds() {
    let Some(h) = common::harness().await else {
        return;
    };
    let pool = client_pool(&h, 66).await;
    for rep in 0..5 {
        let (tenant, key) = (format!("t-{rep}"), format!("k-{rep}"));
        let (tally, bodies) =
            duplicates_in_transactions(&pool, &h.schema, &tenant, &key, 64, true).await;
        let want = Tally {
            executed: 1,
            rolled_back: 1,
            replayed: 62,
            other: 0,
        };
        assert_eq!(tally, want, "rep {rep}");
        assert_eq!(bodies.len(), 63, "rep {rep}");
        assert!(bodies.windows(2).all(|w| w[0] == w[1]), "rep {rep}");
        assert_eq!(
            orders(&pool, &h.schema, &tenant, &key).await,
            1,
            "rep {rep}"
        );
    }
    pool.close().await;
}

/// Bad arguments fail with SQLSTATE ID001 (and a too large result with ID002, a stale
/// finish with ID003) before anything is written.
#[tokio::test]
async fn the_functions_check_their_arguments() {
    let Some(h) = common::harness().await else {
        return;
    };
    let pool = client_pool(&h, 2).await;
    let s = &h.schema;
    let code = |sql: String| {
        let pool = pool.clone();
        async move {
            match sqlx::query(AssertSqlSafe(sql.clone())).execute(&pool).await {
                Err(sqlx::Error::Database(db)) => db.code().map(|c| c.into_owned()),
                other => panic!("{sql}: expected an error, got {other:?}"),
            }
        }
    };
    let claim = |tenant: &str, key: &str, fp: &str, principal: &str, owner: &str, lease: &str| {
        format!("SELECT * FROM \"{s}\".idem_claim({tenant}, {key}, {fp}, {principal}, {owner}, {lease})")
    };
    let fp = "sha256('x'::bytea)";
    let long_key = format!("'{}'", "k".repeat(256));
    let long_name = format!("'{}'", "t".repeat(129));
    for sql in [
        claim("'t'", "''", fp, "'p'", "'o'", "1000"),
        claim("'t'", "'a b'", fp, "'p'", "'o'", "1000"),
        claim("'t'", "'a,b'", fp, "'p'", "'o'", "1000"),
        claim("'t'", "'a;b'", fp, "'p'", "'o'", "1000"),
        claim("'t'", "'caf\u{e9}'", fp, "'p'", "'o'", "1000"),
        claim("'t'", &long_key, fp, "'p'", "'o'", "1000"),
        claim(&long_name, "'k'", fp, "'p'", "'o'", "1000"),
        claim("NULL", "'k'", fp, "'p'", "'o'", "1000"),
        claim("'t'", "'k'", "'\\x00'::bytea", "'p'", "'o'", "1000"),
        claim("'t'", "'k'", fp, "''", "'o'", "1000"),
        claim("'t'", "'k'", fp, "'p'", "'o o'", "1000"),
        claim("'t'", "'k'", fp, "'p'", "'o'", "0"),
        claim("'t'", "'k'", fp, "'p'", "'o'", "86400001"),
    ] {
        assert_eq!(code(sql.clone()).await.as_deref(), Some("ID001"), "{sql}");
    }
    // Accepted at the edges: a 255-character key of every allowed kind of character.
    let edge = format!("'{}zZ9'", "!-.:<~".repeat(42));
    sqlx::query(AssertSqlSafe(claim(
        "'t'", &edge, fp, "'p'", "'o'", "86400000",
    )))
    .execute(&pool)
    .await
    .expect("edge key");
    let count: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{s}\".idem_records"
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(count, 1, "only the valid claim wrote");

    sqlx::query(AssertSqlSafe(claim("'t'", "'k'", fp, "'p'", "'o'", "1000")))
        .execute(&pool)
        .await
        .expect("claim");
    let finish = |version: &str, outcome: &str, status: &str, headers: &str, body: &str| {
        format!(
            "SELECT * FROM \"{s}\".idem_finish('t', 'k', 'o', {version}, {outcome}, {status}, \
             {headers}, {body}, NULL)"
        )
    };
    for sql in [
        finish("1", "'done'", "200", "NULL", "NULL"),
        finish("0", "'succeeded'", "200", "NULL", "NULL"),
        finish("1", "'succeeded'", "70000", "NULL", "NULL"),
        finish("1", "'succeeded'", "NULL", "NULL", "'x'::bytea"),
        finish("1", "'succeeded'", "200", "'{\"a\":\"b\"}'", "NULL"),
        finish("1", "'succeeded'", "200", "'[[\"a\"]]'", "NULL"),
        finish("1", "'succeeded'", "200", "'[[\"a\", 1]]'", "NULL"),
    ] {
        assert_eq!(code(sql.clone()).await.as_deref(), Some("ID001"), "{sql}");
    }
    let big = finish(
        "1",
        "'succeeded'",
        "200",
        "'[[\"n\", \"v\"]]'",
        "convert_to(repeat('x', 1048575), 'UTF8')",
    );
    assert_eq!(code(big).await.as_deref(), Some("ID002"));
    assert_eq!(
        code(finish("2", "'succeeded'", "200", "NULL", "NULL"))
            .await
            .as_deref(),
        Some("ID003"),
        "a version the claim never had"
    );
    let heartbeat = format!("SELECT \"{s}\".idem_heartbeat('t', 'k', 'other', 1, 1000)");
    assert_eq!(code(heartbeat).await.as_deref(), Some("ID003"));
    // Still PROCESSING, unchanged by the refused calls.
    let (state, version): (String, i64) = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT state, version FROM \"{s}\".idem_records WHERE key = 'k'"
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((state.as_str(), version), ("PROCESSING", 1));
    // The same finish twice: the second (a retry after a lost answer) gets the same
    // version; a different result is refused.
    let ok = finish("1", "'succeeded'", "200", "'[]'", "'x'::bytea");
    let first: i64 = sqlx::query_scalar(AssertSqlSafe(ok.replace("SELECT *", "SELECT version")))
        .fetch_one(&pool)
        .await
        .unwrap();
    let again: i64 = sqlx::query_scalar(AssertSqlSafe(ok.replace("SELECT *", "SELECT version")))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!((first, again), (2, 2));
    let other = finish("1", "'succeeded'", "200", "'[]'", "'y'::bytea");
    assert_eq!(code(other).await.as_deref(), Some("ID003"));
    pool.close().await;
}

/// Times claim+complete of fresh keys and replays through the functions and through the
/// statement store, alternating rounds (and which goes first) on one pool: once with
/// durable commits, once with `synchronous_commit = off` so the commit's disk flush does
/// not hide the statements' own cost. Run with
/// `cargo test -p idem-postgres --test functions_conformance -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "timing; prints ratios"]
async fn bench_functions_against_statements() {
    let Some(h) = common::harness().await else {
        return;
    };
    for synchronous_commit in ["on", "off"] {
        let connect = h
            .url
            .parse::<sqlx::postgres::PgConnectOptions>()
            .expect("url")
            .options([
                ("search_path", h.schema.as_str()),
                ("synchronous_commit", synchronous_commit),
            ]);
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .connect_with(connect)
            .await
            .expect("connect");
        let mut options = h.options();
        options.recent_capacity = 0; // both claims read through one statement
        let pg = idem_postgres::PgStore::from_pool(pool, options).expect("store");
        let fns = FunctionStore::new(pg.clone());
        let stores: [(&str, Arc<dyn IdempotencyStore>); 2] =
            [("statements", Arc::new(pg)), ("functions", Arc::new(fns))];
        let tenant = idem_conformance::fresh_tenant();
        let per_round = 400;
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
                // The first round warms the pool and the plan caches.
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
                "synchronous_commit={synchronous_commit} {what}: statements {:.0} us, \
                 functions {:.0} us, functions/statements {:.2}",
                us(totals[0][j]),
                us(totals[1][j]),
                totals[1][j].as_secs_f64() / totals[0][j].as_secs_f64()
            );
        }
    }
}

/// The functions read their own schema's table whatever the caller's search_path: a
/// decoy `idem_records` first on the path is never touched.
#[tokio::test]
async fn a_callers_search_path_does_not_redirect_the_functions() {
    let Some(h) = common::harness().await else {
        return;
    };
    let pool = client_pool(&h, 1).await;
    let decoy = format!("{}_decoy", h.schema);
    let mut conn = pool.acquire().await.expect("acquire");
    conn.execute(AssertSqlSafe(format!(
        "CREATE SCHEMA \"{decoy}\"; \
         CREATE TABLE \"{decoy}\".idem_records (LIKE \"{s}\".idem_records INCLUDING ALL); \
         SET search_path TO \"{decoy}\"",
        s = h.schema
    )))
    .await
    .expect("decoy");
    let decision: String = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT decision FROM \"{}\".idem_claim('t', 'k', sha256('x'::bytea), 'p', 'o', 1000)",
        h.schema
    )))
    .fetch_one(&mut *conn)
    .await
    .expect("claim");
    assert_eq!(decision, "proceed");
    let count = |schema: String| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(AssertSqlSafe(format!(
                "SELECT count(*) FROM \"{schema}\".idem_records"
            )))
            .fetch_one(&pool)
            .await
            .expect("count")
        }
    };
    drop(conn);
    assert_eq!(count(h.schema.clone()).await, 1);
    assert_eq!(count(decoy.clone()).await, 0);
    pool.execute(AssertSqlSafe(format!("DROP SCHEMA \"{decoy}\" CASCADE")))
        .await
        .expect("drop decoy");
    pool.close().await;
}

/// `FunctionStore::claim_in_tx` / `finish_in_tx`: a rolled-back transaction leaves no
/// record (the key is free again); a committed one replays.
#[tokio::test]
async fn the_transactional_form_commits_and_rolls_back_with_the_caller() {
    let Some(h) = common::harness().await else {
        return;
    };
    let store = FunctionStore::new(h.store().await);
    let t = idem_conformance::fresh_tenant();
    let req = request(&t, "k", "p", "a");
    for commit in [false, true] {
        let mut tx = store.pg().pool().begin().await.expect("begin");
        let token = match store.claim_in_tx(&mut tx, &req).await.expect("claim") {
            Claim::Proceed(token) => token,
            other => panic!("commit={commit}: {other:?}"),
        };
        store
            .finish_in_tx(
                &mut tx,
                &token,
                idem_core::Finish {
                    state: idem_core::RecordState::Succeeded,
                    result: Some(result("o")),
                },
            )
            .await
            .expect("finish");
        if commit {
            tx.commit().await.expect("commit");
        } else {
            tx.rollback().await.expect("rollback");
            assert_eq!(store.get(&req.scope).await.unwrap(), None);
        }
    }
    match store.claim(&request(&t, "k", "p", "b")).await.unwrap() {
        Claim::Replay(rec) => assert_eq!(rec.result, Some(result("o"))),
        other => panic!("{other:?}"),
    }
}
