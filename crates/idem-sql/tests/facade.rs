//! The facade over real stores: a SQLite file, a PostgreSQL schema per test, a MySQL /
//! MariaDB database per test (feature `mysql`), a Redis key prefix per test. The SQL
//! scenarios are written once and run on every SQL backend: transactions and fences, a
//! caller's migrations, the arrival timeline (`ArrivalLog` and its reads) and the
//! operators' `Inspect`.

use std::time::Duration;

use idem_conformance::{fresh_tenant, request, result, skip_or_fail};
use idem_core::{Acquire, Claim, ErrorKind, Finish, LeaseName, OwnerId, RecordState, StoreError};
use idem_core::{
    Arrival, ArrivalDecision, ArrivalSink, IdempotencyKey, Principal, Scope, StoredResult, TenantId,
};
use idem_sql::migrate::{self, Migration, Schema};
use idem_sql::{arrivals, sql, ArrivalLog, ArrivalOptions, Backend, OpenOptions, SqlStore, Store};

const PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
const REDIS_URL: &str = "redis://127.0.0.1:6379";

fn pg_url() -> String {
    std::env::var("IDEM_TEST_POSTGRES_URL").unwrap_or_else(|_| PG_URL.into())
}

fn redis_url() -> String {
    std::env::var("IDEM_TEST_REDIS_URL").unwrap_or_else(|_| REDIS_URL.into())
}

fn run_id() -> String {
    uuid::Uuid::now_v7().simple().to_string()
}

/// A PostgreSQL schema of the test's own, dropped at the end.
struct PgSchema {
    store: SqlStore,
    schema: String,
}

impl PgSchema {
    async fn open() -> Option<Self> {
        let schema = format!("idem_sql_t_{}", run_id());
        let options = {
            let mut o = OpenOptions::default();
            o.pg_schema = Some(schema.clone());
            o.pg_max_connections = Some(4);
            o
        };
        match SqlStore::open(&pg_url(), &options).await {
            Ok(store) => Some(Self { store, schema }),
            Err(e) if e.is_unavailable() => {
                skip_or_fail("PostgreSQL", &e);
                None
            }
            Err(e) => panic!("{e}"),
        }
    }

    async fn drop_schema(self) {
        let pg = self.store.postgres().expect("a PostgreSQL store");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS \"{}\" CASCADE",
            self.schema
        )))
        .execute(pg.pool())
        .await
        .unwrap();
    }
}

async fn sqlite() -> (SqlStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    let store = Store::open(&url, &OpenOptions::default()).await.unwrap();
    assert_eq!(store.backend(), Backend::Sqlite);
    assert!(store.retention().is_some() && store.archive().is_some());
    (store.sql().expect("a SQL store").clone(), dir)
}

const TABLE: &str = "CREATE TABLE IF NOT EXISTS facade_items (\
    id TEXT PRIMARY KEY, n BIGINT, note TEXT, done BIGINT NOT NULL DEFAULT 0)";

/// DDL is the one part the caller writes per backend: MySQL keys need a bounded type.
fn table_ddl(db: &SqlStore) -> &'static str {
    match db.backend() {
        #[cfg(feature = "mysql")]
        Backend::Mysql => {
            "CREATE TABLE IF NOT EXISTS facade_items (\
             id VARCHAR(255) PRIMARY KEY, n BIGINT, note TEXT, done BIGINT NOT NULL DEFAULT 0)"
        }
        _ => TABLE,
    }
}

const RUNS_TABLE: &str = "CREATE TABLE facade_runs (v BIGINT NOT NULL)";
const RUNS_TABLE_MYSQL: &str = "CREATE TABLE IF NOT EXISTS facade_runs (v BIGINT NOT NULL)";

/// Versions 2 and 3 each leave one row: a version applied twice leaves two. Version 1
/// fails if run twice on SQLite and PostgreSQL (no `IF NOT EXISTS`).
const MIGRATIONS: &[Migration] = &[
    Migration::new(1, "runs", RUNS_TABLE),
    Migration::new(2, "two", "INSERT INTO facade_runs (v) VALUES (2)"),
    Migration::new(3, "three", "INSERT INTO facade_runs (v) VALUES (3)"),
];
const MIGRATIONS_MYSQL: &[Migration] = &[
    Migration::new(1, "runs", RUNS_TABLE_MYSQL),
    MIGRATIONS[1],
    MIGRATIONS[2],
];
const BROKEN: &[Migration] = &[
    MIGRATIONS[0],
    MIGRATIONS[1],
    MIGRATIONS[2],
    Migration::new(4, "broken", "SELECT v FROM facade_no_such_table"),
];

fn caller_schema<'a>(shared: &'a [Migration], mysql: &'a [Migration]) -> Schema<'a> {
    Schema {
        versions: idem_sql::versions_table!("facade_schema_migrations"),
        lock: "idem-facade",
        shared,
        mysql,
    }
}

/// A caller's schema through the one runner: eight migrators at once apply each version
/// once; a current schema, and one a newer build migrated, apply nothing; a failing
/// version is not recorded and leaves the lock free for the next migrator.
async fn caller_migrations_take_turns(db: &SqlStore) {
    let schema = caller_schema(MIGRATIONS, MIGRATIONS_MYSQL);
    let runs = futures::future::join_all((0..8).map(|_| migrate::run(db, &schema))).await;
    let mut applied: Vec<i64> = runs.into_iter().flat_map(|r| r.unwrap()).collect();
    applied.sort_unstable();
    assert_eq!(applied, [1, 2, 3]);
    assert!(migrate::run(db, &schema).await.unwrap().is_empty());
    let older = caller_schema(&MIGRATIONS[..2], &MIGRATIONS_MYSQL[..2]);
    assert!(migrate::run(db, &older).await.unwrap().is_empty());

    let broken = caller_schema(BROKEN, BROKEN);
    assert!(migrate::run(db, &broken).await.is_err());
    let mut conn = db.acquire().await.unwrap();
    let rows = conn
        .conn()
        .all(sql(
            "SELECT version, name FROM facade_schema_migrations ORDER BY version",
        ))
        .await
        .unwrap();
    let recorded: Vec<(i64, String)> = rows
        .iter()
        .map(|r| (r.int("version").unwrap(), r.text("name").unwrap()))
        .collect();
    let expected: Vec<(i64, String)> = MIGRATIONS
        .iter()
        .map(|m| (m.version, m.name.to_string()))
        .collect();
    assert_eq!(recorded, expected);
    let rows = conn
        .conn()
        .all(sql("SELECT v FROM facade_runs ORDER BY v"))
        .await
        .unwrap();
    let runs: Vec<i64> = rows.iter().map(|r| r.int("v").unwrap()).collect();
    assert_eq!(runs, [2, 3]);
    drop(conn);
    let again = tokio::time::timeout(Duration::from_secs(10), migrate::run(db, &schema));
    assert!(again.await.expect("the lock is free").unwrap().is_empty());
}

/// Claim, business write and finish commit together; a rolled-back transaction leaves
/// neither the record nor the row.
async fn claim_write_finish_commit_together(db: &SqlStore) {
    let mut tx = db.begin().await.unwrap();
    tx.advisory_lock("idem-sql-facade-test").await.unwrap();
    tx.conn().execute_script(table_ddl(db)).await.unwrap();
    tx.commit().await.unwrap();

    let tenant = fresh_tenant();
    let req = request(&tenant, "k-1", "p", "owner-a");
    let mut tx = db.begin().await.unwrap();
    let Claim::Proceed(token) = db.claim_in_tx(&mut tx, &req).await.unwrap() else {
        panic!("a fresh key proceeds");
    };
    let id = format!("{tenant}-1");
    let n = tx
        .conn()
        .execute(
            sql("INSERT INTO facade_items (id, n, note) VALUES ($1, $2, $3)")
                .bind(id.as_str())
                .bind(7)
                .bind(None::<String>),
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
    let finish = Finish {
        state: RecordState::Succeeded,
        result: Some(result("done")),
    };
    let record = db.finish_in_tx(&mut tx, &token, finish).await.unwrap();
    assert_eq!(record.state, RecordState::Succeeded);
    tx.commit().await.unwrap();
    let stored = db.records().get(&req.scope).await.unwrap().unwrap();
    assert_eq!(stored.state, RecordState::Succeeded);

    // Rolled back: neither the claim nor the row stays.
    let other = request(&tenant, "k-2", "p", "owner-a");
    let mut tx = db.begin().await.unwrap();
    assert!(matches!(
        db.claim_in_tx(&mut tx, &other).await.unwrap(),
        Claim::Proceed(_)
    ));
    tx.conn()
        .execute(sql("INSERT INTO facade_items (id) VALUES ($1)").bind(format!("{tenant}-2")))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(db.records().get(&other.scope).await.unwrap(), None);

    // Reads: typed NULLs, streaming, the accessors.
    let mut conn = db.acquire().await.unwrap();
    let mut c = conn.conn();
    let rows = c
        .all(
            sql("SELECT id, n, note FROM facade_items WHERE ($1 IS NULL OR id = $1) ORDER BY id")
                .bind(Some(id.clone())),
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].text("id").unwrap(), id);
    assert_eq!(rows[0].int("n").unwrap(), 7);
    assert_eq!(rows[0].opt_text("note").unwrap(), None);
    assert!(
        rows[0].text("note").is_err(),
        "NULL where a value is required"
    );
    let q = sql("SELECT id FROM facade_items WHERE id LIKE $1").bind(format!("{tenant}%"));
    let streamed: Vec<_> = futures::TryStreamExt::try_collect::<Vec<_>>(c.fetch(&q))
        .await
        .unwrap();
    assert_eq!(streamed.len(), 1);
    let row = c
        .one(
            sql("SELECT EXISTS (SELECT 1 FROM facade_items WHERE id = $1) AS found")
                .bind(id.as_str()),
        )
        .await
        .unwrap();
    assert!(row.bool("found").unwrap());
    assert!(c
        .optional(sql("SELECT id FROM facade_items WHERE id = $1").bind("absent"))
        .await
        .unwrap()
        .is_none());
    assert!(db.has_table("facade_items").await.unwrap());
    assert!(!db.has_table("no_such_table").await.unwrap());
}

/// The fenced write: a current token writes, an older one is refused with nothing
/// written and the refusal recorded.
async fn fenced_writes(db: &SqlStore) {
    let leases = db.leases();
    let name = LeaseName::new(format!("facade-{}", run_id())).unwrap();
    let resource = format!("resource-{name}");
    let ttl = Duration::from_secs(30);
    let Acquire::Granted(first) = leases
        .try_acquire(&name, &OwnerId::new("a").unwrap(), ttl)
        .await
        .unwrap()
    else {
        panic!("a fresh name is granted");
    };
    leases
        .force_release(&name, "test hands over")
        .await
        .unwrap();
    let second = leases
        .try_acquire(&name, &OwnerId::new("b").unwrap(), ttl)
        .await
        .unwrap()
        .granted()
        .unwrap();
    assert!(second.token > first.token);

    let id = format!("fence-{name}");
    let wrote = db
        .fenced_write::<u64, idem_core::LeaseError, _>(&resource, &second, |mut c| {
            let id = id.clone();
            Box::pin(async move {
                c.execute(sql("INSERT INTO facade_items (id, n) VALUES ($1, 1)").bind(id))
                    .await
                    .map_err(|e| idem_core::LeaseError::Backend(e.to_string()))
            })
        })
        .await
        .unwrap();
    assert_eq!(wrote, 1);
    let err = db
        .fenced_write::<u64, idem_core::LeaseError, _>(&resource, &first, |mut c| {
            Box::pin(async move {
                c.execute(sql("UPDATE facade_items SET n = 99"))
                    .await
                    .map_err(|e| idem_core::LeaseError::Backend(e.to_string()))
            })
        })
        .await
        .unwrap_err();
    assert!(err.is_fenced(), "{err}");
    let mut conn = db.acquire().await.unwrap();
    let n = conn
        .conn()
        .one(sql("SELECT n FROM facade_items WHERE id = $1").bind(id.as_str()))
        .await
        .unwrap()
        .int("n")
        .unwrap();
    assert_eq!(n, 1, "the stale write did not run");
    let events = leases.events(&name, 10).await.unwrap();
    assert_eq!(
        events.last().map(|e| e.kind),
        Some(idem_core::LeaseEventKind::FencedWriteRejected)
    );
    let empty = db
        .fenced_write::<(), idem_core::LeaseError, _>("", &second, |_| Box::pin(async { Ok(()) }))
        .await
        .unwrap_err();
    assert_eq!(empty.kind(), ErrorKind::InvalidInput);
}

/// The process clock in epoch ms, as arrivals are stamped.
fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn arrival(tenant: &TenantId, key: &str, decision: ArrivalDecision, at: i64) -> Arrival {
    Arrival {
        scope: Scope::new(tenant.clone(), IdempotencyKey::new(key).unwrap()),
        principal: Principal::new("p").unwrap(),
        decision,
        status: 201,
        at,
        elapsed_ms: 3,
    }
}

/// Writes `batch` through an `ArrivalLog` (closing it writes what it buffered).
async fn log_arrivals(db: &SqlStore, batch: Vec<Arrival>) {
    let log = ArrivalLog::start(db.clone(), ArrivalOptions::default());
    let n = batch.len() as u64;
    for a in batch {
        log.record(a);
    }
    log.close().await;
    assert_eq!((log.written(), log.dropped()), (n, 0));
}

/// The arrival timeline: counts per key, the first 64 arrivals one by one, multi-row
/// writes of many keys, lookups by name, and retention following the record.
async fn arrival_timeline(db: &SqlStore) {
    let t = fresh_tenant();
    let records = db.records();
    let token = match records.claim(&request(&t, "kept", "p", "o")).await.unwrap() {
        Claim::Proceed(token) => token,
        other => panic!("{other:?}"),
    };
    records.complete(&token, result("done")).await.unwrap();
    let now = wall_ms() - 10_000;
    // 70 arrivals of a recorded key in two writes, 2 of a key without a record.
    let first: Vec<Arrival> = (0..40)
        .map(|i| {
            let d = if i == 0 {
                ArrivalDecision::Executed
            } else {
                ArrivalDecision::Replayed
            };
            arrival(&t, "kept", d, now + i)
        })
        .chain([arrival(&t, "gone", ArrivalDecision::Refused, now)])
        .collect();
    log_arrivals(db, first).await;
    let second: Vec<Arrival> = (40..70)
        .map(|i| arrival(&t, "kept", ArrivalDecision::Replayed, now + i))
        .chain([arrival(&t, "gone", ArrivalDecision::Mismatch, now + 1)])
        .collect();
    log_arrivals(db, second).await;
    let kept = arrivals::key_arrivals(db, t.as_str(), "kept")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kept.summary(), "70 arrivals: 1 executed, 69 replayed");
    assert_eq!(kept.arrivals.len(), 64);
    assert_eq!(kept.arrivals.last().unwrap().seq, 64);
    assert_eq!(kept.arrivals[0].decision, ArrivalDecision::Executed);
    assert_eq!((kept.first_at, kept.last_at), (now, now + 69));
    let found = arrivals::arrived_keys(db, t.as_str(), "gone", 10)
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!((found[0].key.as_str(), found[0].last_at), ("gone", now + 1));
    assert!(arrivals::key_arrivals(db, t.as_str(), "never")
        .await
        .unwrap()
        .is_none());

    // Many keys in one write go in multi-row statements; every total lands on its key.
    let many: Vec<Arrival> = (0..100)
        .flat_map(|k| {
            let t = t.clone();
            (0..=k % 3)
                .map(move |i| arrival(&t, &format!("many-{k}"), ArrivalDecision::Replayed, now + i))
        })
        .collect();
    log_arrivals(db, many.clone()).await;
    log_arrivals(db, many).await;
    for k in 0..100 {
        let a = arrivals::key_arrivals(db, t.as_str(), &format!("many-{k}"))
            .await
            .unwrap()
            .unwrap();
        let n = 2 * (k % 3 + 1);
        assert_eq!((a.total, a.arrivals.len() as i64), (n, n), "many-{k}");
        let mut seqs: Vec<i64> = a.arrivals.iter().map(|x| x.seq).collect();
        seqs.sort();
        assert_eq!(seqs, (1..=n).collect::<Vec<_>>(), "many-{k}");
    }

    // Too recent to go, whatever the record says; then every key without a record goes
    // (the "many" ones and "gone"), the recorded one stays.
    let archive = db.archive();
    let sweep = |cutoff| arrivals::sweep(db, records.as_ref(), Some(archive.as_ref()), cutoff);
    assert_eq!(sweep(now - 1).await.unwrap(), 0);
    assert_eq!(sweep(wall_ms()).await.unwrap(), 101);
    assert!(arrivals::key_arrivals(db, t.as_str(), "gone")
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        arrivals::key_arrivals(db, t.as_str(), "kept")
            .await
            .unwrap()
            .unwrap()
            .total,
        70
    );
}

/// `Inspect`: counts by state, case-sensitive key prefixes, overdue leases by the store
/// clock, result references.
async fn inspect_reads(db: &SqlStore) {
    let t = fresh_tenant();
    let records = db.records();
    let inspect = db.inspect();
    let before = inspect.counts_by_state().await.unwrap();
    let processing = |counts: &[(RecordState, i64)]| {
        counts
            .iter()
            .find(|(s, _)| *s == RecordState::Processing)
            .map_or(0, |(_, n)| *n)
    };
    let mut tokens = Vec::new();
    for key in ["ab-1", "ab-2", "AB-3", "zz"] {
        let mut req = request(&t, key, "p", "worker");
        req.lease = Duration::from_secs(1);
        match records.claim(&req).await.unwrap() {
            Claim::Proceed(token) => tokens.push(token),
            other => panic!("{other:?}"),
        }
    }
    let counts = inspect.counts_by_state().await.unwrap();
    assert_eq!(counts.len(), RecordState::ALL.len());
    assert_eq!(processing(&counts), processing(&before) + 4, "{counts:?}");

    let found = inspect.by_key_prefix(&t, "ab-", 10).await.unwrap();
    let keys: Vec<&str> = found.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["ab-1", "ab-2"]);
    assert_eq!(found[0].attempts, 1);
    assert_eq!(found[0].state, RecordState::Processing);
    assert_eq!(inspect.by_key_prefix(&t, "ab-", 1).await.unwrap().len(), 1);
    assert!(inspect
        .by_key_prefix(&t, "\u{e9}", 10)
        .await
        .unwrap()
        .is_empty());
    assert!(inspect
        .by_key_prefix(&fresh_tenant(), "ab", 10)
        .await
        .unwrap()
        .is_empty());

    // Judged by the store's clock: none of these overdue now, all four a little later.
    let now = inspect.now().await.unwrap();
    let ours = |first: &[idem_core::RecordSummary]| {
        first.iter().filter(|r| r.tenant == t.as_str()).count()
    };
    let overdue = inspect.processing_past_lease(now, 100).await.unwrap();
    assert_eq!(ours(&overdue.first), 0);
    let later = inspect
        .processing_past_lease(now + 2_000, 100)
        .await
        .unwrap();
    assert_eq!(ours(&later.first), 4);
    assert!(later.count >= 4);
    assert_eq!(
        inspect
            .processing_past_lease(now + 2_000, 2)
            .await
            .unwrap()
            .first
            .len(),
        2
    );

    let with_ref = StoredResult {
        result_ref: Some("/v1/orders/7".into()),
        ..result("done")
    };
    records.complete(&tokens[3], with_ref).await.unwrap();
    let by_ref = inspect.by_result_ref(&t, "/v1/orders/7", 10).await.unwrap();
    assert_eq!(by_ref.len(), 1);
    assert_eq!(
        (by_ref[0].key.as_str(), by_ref[0].state),
        ("zz", RecordState::Succeeded)
    );
    assert!(inspect
        .by_result_ref(&t, "/v1/none", 10)
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn sqlite_arrivals_and_inspect() {
    let (db, _dir) = sqlite().await;
    arrival_timeline(&db).await;
    inspect_reads(&db).await;
}

#[tokio::test]
async fn postgres_arrivals_and_inspect() {
    let Some(pg) = PgSchema::open().await else {
        return;
    };
    arrival_timeline(&pg.store).await;
    inspect_reads(&pg.store).await;
    pg.drop_schema().await;
}

#[tokio::test]
async fn sqlite_transactions_statements_and_fences() {
    let (db, _dir) = sqlite().await;
    assert_eq!(db.schema(), None);
    claim_write_finish_commit_together(&db).await;
    fenced_writes(&db).await;
    caller_migrations_take_turns(&db).await;
}

#[tokio::test]
async fn postgres_transactions_statements_and_fences() {
    let Some(pg) = PgSchema::open().await else {
        return;
    };
    assert_eq!(pg.store.backend(), Backend::Postgres);
    assert_eq!(pg.store.schema(), Some(pg.schema.as_str()));
    claim_write_finish_commit_together(&pg.store).await;
    fenced_writes(&pg.store).await;
    caller_migrations_take_turns(&pg.store).await;
    pg.drop_schema().await;
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;
    use sqlx::{Connection, Executor};

    const MYSQL_URL: &str = "mysql://root@127.0.0.1:3306/test";

    fn mysql_url() -> String {
        std::env::var("IDEM_TEST_MYSQL_URL").unwrap_or_else(|_| MYSQL_URL.into())
    }

    /// `url` naming `database` instead of its own (query kept).
    fn with_database(url: &str, database: &str) -> String {
        let (base, query) = url
            .split_once('?')
            .map_or((url, None), |(b, q)| (b, Some(q)));
        let start = base.find("://").map_or(0, |i| i + 3);
        let end = base[start..].find('/').map_or(base.len(), |i| start + i);
        let mut out = format!("{}/{database}", &base[..end]);
        if let Some(q) = query {
            out = format!("{out}?{q}");
        }
        out
    }

    /// A database of the test's own on the shared server, dropped at the end.
    struct MyDb {
        store: Store,
        server: String,
        database: String,
    }

    impl MyDb {
        async fn open(scheme: &str) -> Option<Self> {
            let server = mysql_url();
            let mut conn = match sqlx::MySqlConnection::connect(&server).await {
                Ok(c) => c,
                Err(e) => {
                    skip_or_fail("MySQL/MariaDB", &e);
                    return None;
                }
            };
            let database = format!("idem_sql_t_{}", run_id());
            conn.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{database}`")))
                .await
                .unwrap();
            conn.close().await.unwrap();
            let url = with_database(&server, &database).replacen("mysql://", scheme, 1);
            let options = {
                let mut o = OpenOptions::default();
                o.mysql_max_connections = Some(4);
                o
            };
            let store = Store::open(&url, &options).await.unwrap();
            Some(Self {
                store,
                server,
                database,
            })
        }

        async fn drop_database(self) {
            drop(self.store);
            let mut conn = sqlx::MySqlConnection::connect(&self.server).await.unwrap();
            // Sessions of the dropped pool may still be closing: end them first.
            let ids: Vec<i64> =
                sqlx::query_scalar("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = ?")
                    .bind(&self.database)
                    .fetch_all(&mut conn)
                    .await
                    .unwrap();
            for id in ids {
                let _ = conn
                    .execute(sqlx::AssertSqlSafe(format!("KILL {id}")))
                    .await;
            }
            conn.execute(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS `{}`",
                self.database
            )))
            .await
            .unwrap();
        }
    }

    #[tokio::test]
    async fn mysql_transactions_statements_and_fences() {
        let Some(my) = MyDb::open("mysql://").await else {
            return;
        };
        assert_eq!(my.store.backend(), Backend::Mysql);
        assert_eq!(my.store.records().backend(), "mysql");
        assert!(my.store.retention().is_some() && my.store.archive().is_some());
        let db = my.store.sql().expect("a SQL store").clone();
        assert_eq!(db.schema(), None);
        assert_eq!(db.newest_migration(), idem_mysql::newest_migration());
        claim_write_finish_commit_together(&db).await;
        fenced_writes(&db).await;
        caller_migrations_take_turns(&db).await;
        // Arguments named out of order, repeated, and one too many.
        let mut conn = db.acquire().await.unwrap();
        let row = conn
            .conn()
            .one(sql("SELECT $2 AS b, $1 AS a, $2 AS b2").bind("x").bind(7))
            .await
            .unwrap();
        assert_eq!(
            (
                row.int("b").unwrap(),
                row.text("a").unwrap(),
                row.int("b2").unwrap()
            ),
            (7, "x".to_string(), 7)
        );
        let err = conn
            .conn()
            .one(sql("SELECT $3 AS c").bind(1))
            .await
            .err()
            .expect("a missing argument");
        assert!(err.to_string().contains("$3"), "{err}");
        drop(conn);
        my.drop_database().await;
    }

    #[tokio::test]
    async fn mysql_arrivals_and_inspect() {
        let Some(my) = MyDb::open("mysql://").await else {
            return;
        };
        let db = my.store.sql().expect("a SQL store").clone();
        arrival_timeline(&db).await;
        inspect_reads(&db).await;
        drop(db);
        my.drop_database().await;
    }

    /// `advisory_lock` holds until the transaction ends: a second taker waits for the
    /// first commit; a rollback releases it too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn advisory_locks_end_with_their_transaction() {
        let Some(my) = MyDb::open("mysql://").await else {
            return;
        };
        let db = my.store.sql().unwrap().clone();
        for end_with_commit in [true, false] {
            let mut first = db.begin().await.unwrap();
            first.advisory_lock("facade-lock").await.unwrap();
            let waiter = {
                let db = db.clone();
                tokio::spawn(async move {
                    let mut second = db.begin().await.unwrap();
                    second.advisory_lock("facade-lock").await.unwrap();
                    second.commit().await.unwrap();
                })
            };
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(!waiter.is_finished(), "the second taker waits");
            if end_with_commit {
                first.commit().await.unwrap();
            } else {
                first.rollback().await.unwrap();
            }
            tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .expect("released at the end of the transaction")
                .unwrap();
        }
        drop(db);
        my.drop_database().await;
    }

    #[tokio::test]
    async fn mariadb_urls_open_the_mysql_store() {
        let Some(my) = MyDb::open("mariadb://").await else {
            return;
        };
        assert_eq!(my.store.backend(), Backend::Mysql);
        let req = request(&fresh_tenant(), "k", "p", "o");
        assert!(matches!(
            my.store.records().claim(&req).await.unwrap(),
            Claim::Proceed(_)
        ));
        my.drop_database().await;
    }

    #[tokio::test]
    async fn mysql_errors_keep_their_shape_and_hide_the_password() {
        let err = Store::open(
            "mysql://root:s3cret@127.0.0.1:1/test",
            &OpenOptions::default(),
        )
        .await
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
        assert!(err.to_string().contains("mysql connect"), "{err}");
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }
}

#[tokio::test]
async fn a_transaction_of_another_database_is_refused() {
    let (a, _dir) = sqlite().await;
    let Some(pg) = PgSchema::open().await else {
        return;
    };
    let mut tx = pg.store.begin().await.unwrap();
    let req = request(&fresh_tenant(), "k", "p", "o");
    let err = a.claim_in_tx(&mut tx, &req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    drop(tx);
    pg.drop_schema().await;
}

#[tokio::test]
async fn redis_has_records_and_leases_only() {
    let prefix = format!("idem-sql-t-{}", run_id());
    let options = {
        let mut o = OpenOptions::default();
        o.redis_prefix = Some(prefix.clone());
        o
    };
    let store = match Store::open(&redis_url(), &options).await {
        Ok(s) => s,
        Err(e) if e.is_unavailable() => return skip_or_fail("Redis", &e),
        Err(e) => panic!("{e}"),
    };
    assert_eq!(store.backend(), Backend::Redis);
    assert!(store.retention().is_none() && store.archive().is_none() && store.sql().is_none());
    let req = request(&fresh_tenant(), "k", "p", "o");
    assert!(matches!(
        store.records().claim(&req).await.unwrap(),
        Claim::Proceed(_)
    ));
    let name = LeaseName::new(format!("facade-{}", run_id())).unwrap();
    assert!(store
        .leases()
        .try_acquire(&name, &OwnerId::new("a").unwrap(), Duration::from_secs(5))
        .await
        .unwrap()
        .granted()
        .is_some());
    // The server is shared with later runs: leave nothing under the prefix.
    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    assert!(idem_redis::unlink_prefix(&mut conn, &prefix).await.unwrap() >= 2);
}

#[tokio::test]
async fn urls_the_sql_store_cannot_open() {
    let err: StoreError = SqlStore::open("redis://u:secret@h", &OpenOptions::default())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(!err.to_string().contains("secret"), "{err}");
    let err = Store::open("oracle://h/db", &OpenOptions::default())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
}
