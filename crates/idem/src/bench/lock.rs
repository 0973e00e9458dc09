//! `idem bench lock`: acquire+release cycles per second of idem's leases against the raw
//! driver doing the classic lock in the same run (Redis: `SET NX PX` + Lua
//! compare-and-delete; SQL: an upsert that takes an expired lock and a compare-and-release
//! `UPDATE … RETURNING`). Each task cycles its own lock name, so this measures the cost of
//! a cycle, not contention.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{Acquire, LeaseName, LeaseStore, OwnerId, Release, StoreError};
use idem_sql::{Backend, OpenOptions, Store};
use idem_sqlite::SqliteOptions;
use serde::Serialize;

use super::baseline::{
    drop_bench_schema, pg_bench_pool, redis_connection, sqlite_pool_after_ddl, unlink_prefix,
    MysqlBenchDb, MYSQL_NOW,
};
use super::load::{drive, phase, Load, Phase};
use crate::open::bench_url;

const TTL: Duration = Duration::from_secs(30);

#[async_trait]
trait RawLock: Send + Sync {
    fn describe(&self) -> &'static str;
    async fn cycle(&self, name: &str, owner: &str) -> Result<(), StoreError>;
    async fn cleanup(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

fn raw(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

const SQL_TABLE: &str = "CREATE TABLE IF NOT EXISTS idem_bench_locks (name TEXT PRIMARY KEY, \
    owner TEXT NOT NULL, token BIGINT NOT NULL, expires_at BIGINT NOT NULL)";

struct SqliteRaw(sqlx::SqlitePool);

#[async_trait]
impl RawLock for SqliteRaw {
    fn describe(&self) -> &'static str {
        "sqlx: upsert taking an expired lock RETURNING token, then UPDATE … WHERE owner AND token RETURNING"
    }

    async fn cycle(&self, name: &str, owner: &str) -> Result<(), StoreError> {
        const NOW: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";
        let token: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "INSERT INTO idem_bench_locks (name, owner, token, expires_at) VALUES (?1, ?2, 1, {NOW} + 30000) \
             ON CONFLICT (name) DO UPDATE SET owner = ?2, token = idem_bench_locks.token + 1, \
             expires_at = {NOW} + 30000 WHERE idem_bench_locks.expires_at <= {NOW} RETURNING token"
        )))
        .bind(name)
        .bind(owner)
        .fetch_one(&self.0)
        .await
        .map_err(raw)?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE idem_bench_locks SET expires_at = {NOW} WHERE name = ?1 AND owner = ?2 AND token = ?3 \
             RETURNING token"
        )))
        .bind(name)
        .bind(owner)
        .bind(token)
        .fetch_one(&self.0)
        .await
        .map_err(raw)?;
        Ok(())
    }
}

struct PgRaw {
    pool: sqlx::PgPool,
    schema: String,
}

#[async_trait]
impl RawLock for PgRaw {
    fn describe(&self) -> &'static str {
        "sqlx: upsert taking an expired lock RETURNING token, then UPDATE … WHERE owner AND token RETURNING"
    }

    async fn cycle(&self, name: &str, owner: &str) -> Result<(), StoreError> {
        const NOW: &str = "((extract(epoch from clock_timestamp()) * 1000)::bigint)";
        let s = &self.schema;
        let token: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {s}.idem_bench_locks AS l (name, owner, token, expires_at) VALUES ($1, $2, 1, {NOW} + 30000) \
             ON CONFLICT (name) DO UPDATE SET owner = $2, token = l.token + 1, expires_at = {NOW} + 30000 \
             WHERE l.expires_at <= {NOW} RETURNING token"
        )))
        .bind(name)
        .bind(owner)
        .fetch_one(&self.pool)
        .await
        .map_err(raw)?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {s}.idem_bench_locks SET expires_at = {NOW} WHERE name = $1 AND owner = $2 AND token = $3 \
             RETURNING token"
        )))
        .bind(name)
        .bind(owner)
        .bind(token)
        .fetch_one(&self.pool)
        .await
        .map_err(raw)?;
        Ok(())
    }

    async fn cleanup(&self) -> Result<(), StoreError> {
        drop_bench_schema(&self.pool, &self.schema).await
    }
}

const MYSQL_TABLE: &str = "CREATE TABLE IF NOT EXISTS idem_bench_locks (\
    name VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin PRIMARY KEY, \
    owner VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, token BIGINT NOT NULL, \
    expires_at BIGINT NOT NULL) ENGINE = InnoDB";

/// The classic lock row on MySQL/MariaDB, in one round trip each way: the upsert takes
/// an expired lock and hands the token back in the OK packet (`LAST_INSERT_ID(expr)`),
/// the release compares owner and token.
struct MysqlRaw(MysqlBenchDb);

#[async_trait]
impl RawLock for MysqlRaw {
    fn describe(&self) -> &'static str {
        "sqlx: INSERT … ON DUPLICATE KEY UPDATE taking an expired lock (token by LAST_INSERT_ID), then UPDATE … WHERE owner AND token"
    }

    async fn cycle(&self, name: &str, owner: &str) -> Result<(), StoreError> {
        // Assignments run left to right: `expires_at` is read before it is moved.
        let taken = sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO idem_bench_locks (name, owner, token, expires_at) \
             VALUES (?, ?, LAST_INSERT_ID(1), {MYSQL_NOW} + 30000) ON DUPLICATE KEY UPDATE \
             owner = IF(expires_at <= {MYSQL_NOW}, VALUES(owner), owner), \
             token = IF(expires_at <= {MYSQL_NOW}, LAST_INSERT_ID(token + 1), token), \
             expires_at = IF(expires_at <= {MYSQL_NOW}, {MYSQL_NOW} + 30000, expires_at)"
        )))
        .bind(name)
        .bind(owner)
        .execute(&self.0.pool)
        .await
        .map_err(raw)?;
        if taken.rows_affected() == 0 {
            return Err(StoreError::Backend(format!("raw lock {name} was held")));
        }
        let released = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE idem_bench_locks SET expires_at = {MYSQL_NOW} \
             WHERE name = ? AND owner = ? AND token = ?"
        )))
        .bind(name)
        .bind(owner)
        .bind(taken.last_insert_id())
        .execute(&self.0.pool)
        .await
        .map_err(raw)?;
        if released.rows_affected() != 1 {
            return Err(StoreError::Backend(format!("raw lock {name}: not holder")));
        }
        Ok(())
    }

    async fn cleanup(&self) -> Result<(), StoreError> {
        self.0.drop().await
    }
}

struct RedisRaw {
    conn: redis::aio::ConnectionManager,
    prefix: String,
    release: redis::Script,
}

#[async_trait]
impl RawLock for RedisRaw {
    fn describe(&self) -> &'static str {
        "redis-rs: SET NX PX, then Lua compare-and-delete"
    }

    async fn cycle(&self, name: &str, owner: &str) -> Result<(), StoreError> {
        let key = format!("{}:rawlock:{{{name}}}", self.prefix);
        let mut c = self.conn.clone();
        let ok: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(owner)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut c)
            .await
            .map_err(raw)?;
        if ok.is_none() {
            return Err(StoreError::Backend(format!("raw lock {key} was held")));
        }
        let _: i64 = self
            .release
            .key(&key)
            .arg(owner)
            .invoke_async(&mut c)
            .await
            .map_err(raw)?;
        Ok(())
    }

    async fn cleanup(&self) -> Result<(), StoreError> {
        unlink_prefix(&self.conn, &self.prefix).await
    }
}

#[derive(Serialize)]
pub struct LockBenchReport {
    pub backend: &'static str,
    pub concurrency: usize,
    pub duration_s: f64,
    pub phase: Phase,
    /// What the run (both sides) was limited by.
    pub saturation: idem_bench::saturation::Saturation,
}

async fn targets(
    url: &str,
) -> Result<
    (
        Arc<dyn LeaseStore>,
        Arc<dyn RawLock>,
        Option<tempfile::TempDir>,
        &'static str,
    ),
    StoreError,
> {
    let run = uuid::Uuid::now_v7().simple();
    let schema = format!("idem_bench_lock_{run}");
    let prefix = format!("idem-bench-lock-{run}");
    // MySQL: a database of the bench's own, where both sides' tables go.
    let mut mysql = match Backend::of_url(url)? {
        Backend::Mysql => Some(MysqlBenchDb::create(url, &schema).await?),
        _ => None,
    };
    let url = mysql.as_ref().map_or(url, |db| db.url.as_str());
    let (url, tmp) = bench_url(url, "bench.db")?;
    let store = Store::open(&url, &{
        let mut o = OpenOptions::default();
        o.pg_schema = Some(schema.clone());
        o.pg_max_connections = Some(32);
        o.mysql_max_connections = Some(32);
        o.redis_prefix = Some(prefix.clone());
        o
    })
    .await?;
    // The baseline is each backend's own driver doing the classic lock: one per backend.
    let raw_lock: Arc<dyn RawLock> = match store.backend() {
        Backend::Sqlite => {
            let opts = SqliteOptions::from_url(&url)?;
            Arc::new(SqliteRaw(sqlite_pool_after_ddl(&opts, SQL_TABLE).await?))
        }
        Backend::Postgres => {
            let pool = pg_bench_pool()
                .connect(&url)
                .await
                .map_err(|e| StoreError::Unavailable(e.to_string()))?;
            sqlx::query(sqlx::AssertSqlSafe(
                SQL_TABLE.replace("idem_bench_locks", &format!("{schema}.idem_bench_locks")),
            ))
            .execute(&pool)
            .await
            .map_err(raw)?;
            Arc::new(PgRaw { pool, schema })
        }
        Backend::Mysql => {
            let db = mysql.take().expect("made above");
            sqlx::query(sqlx::AssertSqlSafe(MYSQL_TABLE))
                .execute(&db.pool)
                .await
                .map_err(raw)?;
            Arc::new(MysqlRaw(db))
        }
        Backend::Redis => {
            let conn = redis_connection(&url).await?;
            let release = redis::Script::new(
                "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end",
            );
            Arc::new(RedisRaw {
                conn,
                prefix,
                release,
            })
        }
    };
    Ok((store.leases(), raw_lock, tmp, store.backend().as_str()))
}

pub async fn run(
    url: &str,
    concurrency: usize,
    duration: Duration,
) -> Result<LockBenchReport, StoreError> {
    if concurrency == 0 || duration.is_zero() {
        return Err(StoreError::InvalidInput(
            "--concurrency and --duration must be positive".into(),
        ));
    }
    let (store, raw_lock, _tmp, backend) = targets(url).await?;
    let half = duration / 2;
    let run_id = uuid::Uuid::now_v7().simple().to_string();
    let mut idem = Load::default();
    let mut base = Load::default();
    let meter = idem_bench::saturation::Meter::start();
    let outcome: Result<(), StoreError> = async {
        for round in 0..2 {
            let r = raw_lock.clone();
            let id = run_id.clone();
            base.merge(
                drive(concurrency, half, move |task, _| {
                    let r = r.clone();
                    let name = format!("raw-{id}-{round}-{task}");
                    async move { r.cycle(&name, &format!("bench-{task}")).await }
                })
                .await?,
            );
            let s = store.clone();
            let id = run_id.clone();
            idem.merge(
                drive(concurrency, half, move |task, _| {
                    let s = s.clone();
                    let name =
                        LeaseName::new(format!("idem-{id}-{round}-{task}")).expect("lease name");
                    let owner = OwnerId::new(format!("bench-{task}")).expect("owner");
                    async move {
                        let lease = match s.try_acquire(&name, &owner, TTL).await.map_err(raw)? {
                            Acquire::Granted(l) => l,
                            Acquire::Held { .. } => {
                                return Err(StoreError::Backend(format!("{name} was held")))
                            }
                        };
                        match s.release(&name, &owner, lease.token).await.map_err(raw)? {
                            Release::Released { .. } => Ok(()),
                            Release::NotHolder { .. } => {
                                Err(StoreError::Backend(format!("{name}: not holder")))
                            }
                        }
                    }
                })
                .await?,
            );
        }
        Ok(())
    }
    .await;
    let saturation = meter.stop(idem_bench::http::store_limit(backend));
    let cleaned = raw_lock.cleanup().await;
    outcome?;
    cleaned?;
    Ok(LockBenchReport {
        saturation,
        backend,
        concurrency,
        duration_s: duration.as_secs_f64(),
        phase: phase("acquire_release", raw_lock.describe(), idem, base),
    })
}

pub fn print_human(r: &LockBenchReport) {
    let p = &r.phase;
    println!(
        "idem bench lock on {} ({} tasks, {:.0} s per side)",
        r.backend, r.concurrency, r.duration_s
    );
    println!(
        "  acquire+release  idem {:>8.0} cycles/s (p50 {} us, p99 {} us)  baseline {:>8.0} cycles/s (p50 {} us, p99 {} us)  ratio {:.2}",
        p.idem_ops_per_s, p.idem_p50_us, p.idem_p99_us, p.baseline_ops_per_s, p.baseline_p50_us, p.baseline_p99_us, p.ratio
    );
    println!("  saturated        {}", r.saturation.saturated);
    println!("  baseline: {}", p.baseline);
}
