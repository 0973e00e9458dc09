//! A show's stock under a crowd: split across bucket rows so that concurrent orders of
//! one show commit in parallel, never oversold, and a transaction holding some of it
//! (a paused instance) stops neither the show nor the sold-out answer.

#[macro_use]
mod common;

use std::sync::Arc;

use common::{Backend, Env, TestServer, ADMIN, T1};
use serde_json::json;
use sqlx::{Connection, Executor, MySqlConnection, PgConnection, SqliteConnection};

/// Statements straight on the test's database, as an operator's session would run them.
enum Raw {
    Sqlite(SqliteConnection),
    Postgres(PgConnection),
    Mysql(MySqlConnection),
}

impl Raw {
    async fn open(env: &Env) -> Raw {
        match env.backend {
            Backend::Sqlite => Raw::Sqlite(
                SqliteConnection::connect(&format!("sqlite://{}", env.path().unwrap().display()))
                    .await
                    .unwrap(),
            ),
            Backend::Postgres => {
                let mut c = PgConnection::connect(&env.url).await.unwrap();
                let schema = env.pg_schema.as_deref().unwrap();
                c.execute(sqlx::AssertSqlSafe(format!(
                    "SET search_path TO \"{schema}\""
                )))
                .await
                .unwrap();
                Raw::Postgres(c)
            }
            Backend::Mysql => {
                let mut c = MySqlConnection::connect(&env.url).await.unwrap();
                // As the service's sessions: a locking read locks the rows it returns.
                c.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                    .await
                    .unwrap();
                Raw::Mysql(c)
            }
        }
    }

    /// The 64-bit integer of a `CAST`.
    fn bigint(&self) -> &'static str {
        match self {
            Raw::Mysql(_) => "SIGNED",
            _ => "BIGINT",
        }
    }

    async fn exec(&mut self, q: &str) {
        match self {
            Raw::Sqlite(c) => c
                .execute(sqlx::AssertSqlSafe(q.to_owned()))
                .await
                .map(|_| ()),
            Raw::Postgres(c) => c
                .execute(sqlx::AssertSqlSafe(q.to_owned()))
                .await
                .map(|_| ()),
            Raw::Mysql(c) => c
                .execute(sqlx::AssertSqlSafe(q.to_owned()))
                .await
                .map(|_| ()),
        }
        .unwrap_or_else(|e| panic!("{q}: {e}"));
    }

    async fn int(&mut self, q: &str) -> i64 {
        match self {
            Raw::Sqlite(c) => sqlx::query_scalar(sqlx::AssertSqlSafe(q.to_owned()))
                .fetch_one(c)
                .await
                .unwrap(),
            Raw::Postgres(c) => sqlx::query_scalar(sqlx::AssertSqlSafe(q.to_owned()))
                .fetch_one(c)
                .await
                .unwrap(),
            Raw::Mysql(c) => sqlx::query_scalar(sqlx::AssertSqlSafe(q.to_owned()))
                .fetch_one(c)
                .await
                .unwrap(),
        }
    }
}

async fn put_show(s: &TestServer, show: &str, capacity: i64) {
    let r = s
        .http
        .put(format!("{}/v1/admin/shows/t1/{show}", s.base))
        .bearer_auth(ADMIN)
        .json(
            &json!({"title": show, "capacity": capacity, "per_order_limit": 6, "price_cents": 100}),
        )
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "create {show}: {}", r.status());
}

async fn available(s: &TestServer, show: &str) -> i64 {
    let show = s.server.orders().show("t1", show).await.unwrap().unwrap();
    show.available
}

/// Quantities held by live holds of `show`.
async fn held(raw: &mut Raw, show: &str) -> i64 {
    let bigint = raw.bigint();
    raw.int(&format!(
        "SELECT CAST(COALESCE(SUM(quantity), 0) AS {bigint}) FROM inventory_holds \
         WHERE tenant_id = 't1' AND show_id = '{show}' AND status = 'held'"
    ))
    .await
}

/// Creates until the answer is not `stock-busy` (the retry a client makes, same key).
async fn create(s: &TestServer, key: &str, show: &str, quantity: i64) -> common::Reply {
    loop {
        let r = s.create(T1, key, "U-1", show, quantity).await;
        if r.problem_type().ends_with("/stock-busy") {
            tokio::task::yield_now().await;
            continue;
        }
        return r;
    }
}

on_every_store!(
    a_crowd_on_one_show_never_oversells_it,
    an_order_bigger_than_any_bucket_gathers_from_several
);
// A MySQL database starts with the buckets: there is no schema before them to migrate.
on_both_stores!(the_buckets_migration_keeps_every_ticket);
// SQLite has one writer at a time: no row locks to skip.
on_server_stores!(
    a_paused_holder_blocks_its_buckets_not_the_show,
    stock_held_by_others_is_busy_not_sold_out
);

/// 64 buyers at once, each buying 1 to 6 until the show is gone, three shows in a row:
/// what was sold plus what is left is the capacity, and the last tickets are sold.
async fn a_crowd_on_one_show_never_oversells_it(env: Env) {
    let s = Arc::new(env.start().await);
    let mut raw = Raw::open(&env).await;
    for round in 0..3 {
        let show = format!("CROWD-{round}");
        let capacity = 150 + round * 37;
        put_show(&s, &show, capacity).await;
        let mut tasks = Vec::new();
        for buyer in 0..64 {
            let (s, show) = (s.clone(), show.clone());
            tasks.push(tokio::spawn(async move {
                let mut bought = 0;
                for n in 0.. {
                    let quantity = 1 + (buyer + n) % 6;
                    let r = create(&s, &format!("{show}-{buyer}-{n}"), &show, quantity).await;
                    match r.status {
                        201 => bought += quantity,
                        409 if r.problem_type().ends_with("/sold-out") => {
                            let left = r.body["available"].as_i64().unwrap();
                            assert!(left < quantity, "sold out with {left} for {quantity}");
                            if left == 0 {
                                return bought;
                            }
                        }
                        _ => panic!("{}: {}", r.status, r.body),
                    }
                }
                unreachable!()
            }));
        }
        let mut sold = 0;
        for t in tasks {
            sold += t.await.unwrap();
        }
        assert_eq!(
            sold, capacity,
            "round {round}: every ticket sold, none twice"
        );
        assert_eq!(available(&s, &show).await, 0);
        assert_eq!(held(&mut raw, &show).await, capacity);
        let negative = raw
            .int(&format!(
                "SELECT COUNT(*) FROM inventory_buckets WHERE show_id = '{show}' AND available < 0"
            ))
            .await;
        assert_eq!(negative, 0);
    }
}

/// 40 tickets over 32 buckets leave no bucket with 6: the order takes from several.
async fn an_order_bigger_than_any_bucket_gathers_from_several(env: Env) {
    let s = env.start().await;
    let mut raw = Raw::open(&env).await;
    put_show(&s, "SPLIT", 40).await;
    let most = raw
        .int("SELECT MAX(available) FROM inventory_buckets WHERE show_id = 'SPLIT'")
        .await;
    assert!(most < 6, "buckets hold at most {most}");
    for n in 0..6 {
        let r = create(&s, &format!("split-{n}"), "SPLIT", 6).await;
        assert_eq!(r.status, 201, "{}", r.body);
    }
    assert_eq!(available(&s, "SPLIT").await, 4);
    let r = create(&s, "split-6", "SPLIT", 6).await;
    assert_eq!((r.status, r.body["available"].as_i64()), (409, Some(4)));
    let r = create(&s, "split-7", "SPLIT", 4).await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(held(&mut raw, "SPLIT").await, 40);
}

/// A database from before the buckets: its stock (in `inventory.available`) moves into
/// buckets when the migration runs, and stock left in the reserve is still sold.
async fn the_buckets_migration_keeps_every_ticket(env: Env) {
    let s = env.start().await;
    put_show(&s, "OLD", 100).await;
    assert_eq!(create(&s, "old-1", "OLD", 3).await.status, 201);
    s.shutdown().await;
    // Back to the schema before the buckets, 97 left in the show row.
    let mut raw = Raw::open(&env).await;
    raw.exec("DROP TABLE inventory_buckets").await;
    raw.exec("ALTER TABLE message_deliveries DROP COLUMN claim")
        .await;
    raw.exec("DELETE FROM orders_schema_migrations WHERE version = 3")
        .await;
    raw.exec("UPDATE inventory SET available = 97 WHERE show_id = 'OLD'")
        .await;
    let s = env.start().await;
    assert_eq!(available(&s, "OLD").await, 97);
    let reserve = raw
        .int("SELECT available FROM inventory WHERE show_id = 'OLD'")
        .await;
    assert_eq!(reserve, 0, "the reserve moved into buckets");
    let buckets = raw
        .int("SELECT COUNT(*) FROM inventory_buckets WHERE show_id = 'OLD' AND available > 0")
        .await;
    assert_eq!(buckets, 32);
    // Stock a build from before the buckets returned to the reserve is sold too.
    raw.exec("UPDATE inventory_buckets SET available = 0 WHERE show_id = 'OLD'")
        .await;
    raw.exec("UPDATE inventory SET available = 7 WHERE show_id = 'OLD'")
        .await;
    assert_eq!(create(&s, "old-2", "OLD", 5).await.status, 201);
    assert_eq!(available(&s, "OLD").await, 2);
    let r = create(&s, "old-3", "OLD", 3).await;
    assert_eq!((r.status, r.body["available"].as_i64()), (409, Some(2)));
    s.shutdown().await;
}

/// A transaction holding half of a show's buckets (an instance paused mid-order) does
/// not stop the others: they take the other half, without waiting on its locks.
async fn a_paused_holder_blocks_its_buckets_not_the_show(env: Env) {
    let s = env.start().await;
    put_show(&s, "HOT", 1_000).await;
    let mut holder = Raw::open(&env).await;
    holder.exec("BEGIN").await;
    holder
        .exec(
            "SELECT bucket FROM inventory_buckets WHERE show_id = 'HOT' AND bucket < 16 \
             FOR UPDATE",
        )
        .await;
    // While it holds them: 40 orders, 8 at a time. Waiting on its locks would end in
    // the lock timeout, a 503 that is not `stock-busy`.
    for batch in 0..5 {
        let keys: Vec<String> = (0..8).map(|n| format!("hot-{batch}-{n}")).collect();
        let replies = keys.iter().map(|k| s.create(T1, k, "U-1", "HOT", 2));
        for r in futures::future::join_all(replies).await {
            assert_eq!(r.status, 201, "{}", r.body);
        }
    }
    assert_eq!(available(&s, "HOT").await, 920);
    holder.exec("ROLLBACK").await;
    s.shutdown().await;
}

/// When every ticket left is in rows other transactions hold, the order is told to
/// retry (503 `stock-busy`, `Retry-After`), not sold out and not kept waiting; once
/// they let go, the same key buys.
async fn stock_held_by_others_is_busy_not_sold_out(env: Env) {
    let s = env.start().await;
    put_show(&s, "HELD", 64).await;
    let mut holder = Raw::open(&env).await;
    holder.exec("BEGIN").await;
    holder
        .exec("SELECT bucket FROM inventory_buckets WHERE show_id = 'HELD' FOR UPDATE")
        .await;
    let r = s
        .http
        .post(format!("{}/v1/orders", s.base))
        .bearer_auth(T1)
        .header("Idempotency-Key", "held-1")
        .json(&json!({"user_id": "U-1", "show_id": "HELD", "quantity": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let r = common::read(r).await;
    assert!(r.problem_type().ends_with("/stock-busy"), "{}", r.body);
    holder.exec("ROLLBACK").await;
    let r = s.create(T1, "held-1", "U-1", "HELD", 1).await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(available(&s, "HELD").await, 63);
    s.shutdown().await;
}
