//! The raw drivers the benches measure idem against, each doing the naive version of the
//! same work on the same server (the one place the CLI names a backend), and the clean-up
//! of what a bench wrote. Nothing of idem's stores is used here.

use std::time::Duration;

use async_trait::async_trait;
use idem_core::{Fingerprint, StoreError};

/// The raw driver doing the naive version of the same work.
#[async_trait]
pub trait Baseline: Send + Sync {
    fn describe(&self) -> &'static str;
    /// What the replay baseline runs.
    fn describe_replay(&self) -> &'static str;
    /// Naive claim+complete: insert if absent, then update to the final result.
    async fn claim_complete(&self, tenant: &str, key: &str, body: &[u8]) -> Result<(), StoreError>;
    /// Plain read of one record.
    async fn replay(&self, tenant: &str, key: &str) -> Result<(), StoreError>;
    /// Removes what the bench wrote (its schema or key prefix), idem's records included.
    async fn cleanup(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// SQLite baseline: raw sqlx on a table of the same shape, same pool settings.
pub struct SqliteBaseline {
    pool: sqlx::SqlitePool,
}

impl SqliteBaseline {
    /// Creates the naive table on its own connection first, then opens a pool with the
    /// store's settings; pooled connections opened before DDL would see a stale schema.
    pub async fn new(opts: &idem_sqlite::SqliteOptions) -> Result<Self, StoreError> {
        let pool = sqlite_pool_after_ddl(
            opts,
            "CREATE TABLE IF NOT EXISTS idem_bench_naive (tenant_id TEXT NOT NULL, key TEXT NOT NULL, \
             principal TEXT NOT NULL, fingerprint BLOB NOT NULL, state TEXT NOT NULL, version INTEGER NOT NULL, \
             owner TEXT, lease_expires_at INTEGER, result_status INTEGER, result_headers TEXT, \
             result_body BLOB, result_ref TEXT, attempts INTEGER NOT NULL, created_at INTEGER NOT NULL, \
             updated_at INTEGER NOT NULL, completed_at INTEGER); \
             CREATE UNIQUE INDEX IF NOT EXISTS idem_bench_naive_uq ON idem_bench_naive (tenant_id, key);",
        )
        .await?;
        Ok(Self { pool })
    }
}

/// Runs `ddl` on a connection of its own, then opens a pool with the store's settings:
/// pooled connections opened before the DDL would see a stale schema.
pub(crate) async fn sqlite_pool_after_ddl(
    opts: &idem_sqlite::SqliteOptions,
    ddl: &'static str,
) -> Result<sqlx::SqlitePool, StoreError> {
    use sqlx::{ConnectOptions, Connection};
    opts.ensure_wal().await?;
    let mut conn = opts.connect_options().connect().await.map_err(raw)?;
    sqlx::raw_sql(ddl).execute(&mut conn).await.map_err(raw)?;
    conn.close().await.map_err(raw)?;
    sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(opts.max_connections)
        .connect_with(opts.connect_options())
        .await
        .map_err(raw)
}

/// A reconnecting Redis connection, with setup bounded so a dead server fails fast.
pub(crate) async fn redis_connection(
    url: &str,
) -> Result<redis::aio::ConnectionManager, StoreError> {
    let client = redis::Client::open(url).map_err(|e| StoreError::InvalidInput(e.to_string()))?;
    tokio::time::timeout(Duration::from_secs(5), client.get_connection_manager())
        .await
        .map_err(|_| StoreError::Unavailable("redis connect timed out".into()))?
        .map_err(|e| StoreError::Unavailable(e.to_string()))
}

const SQLITE_NOW: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// Drops a bench's own PostgreSQL schema and everything in it.
pub(crate) async fn drop_bench_schema(pool: &sqlx::PgPool, schema: &str) -> Result<(), StoreError> {
    idem_bench::cleanup::drop_schema(pool, schema)
        .await
        .map_err(|e| StoreError::Backend(format!("drop bench schema {schema}: {e}")))
}

/// A driver error of a bench statement.
pub(crate) fn raw(e: sqlx::Error) -> StoreError {
    StoreError::Backend(e.to_string())
}

#[async_trait]
impl Baseline for SqliteBaseline {
    fn describe(&self) -> &'static str {
        "sqlx: INSERT ... ON CONFLICT DO NOTHING, then UPDATE (same table shape, same pool)"
    }

    fn describe_replay(&self) -> &'static str {
        "sqlx: SELECT * by (tenant_id, key) (same table shape, same pool)"
    }

    async fn claim_complete(&self, tenant: &str, key: &str, body: &[u8]) -> Result<(), StoreError> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO idem_bench_naive (tenant_id, key, principal, fingerprint, state, version, owner, \
             lease_expires_at, attempts, created_at, updated_at) VALUES (?, ?, 'bench', ?, 'PROCESSING', 1, \
             'bench', {SQLITE_NOW} + 30000, 1, {SQLITE_NOW}, {SQLITE_NOW}) ON CONFLICT (tenant_id, key) DO NOTHING"
        )))
        .bind(tenant)
        .bind(key)
        .bind(&Fingerprint::of_bytes(b"bench-payload").as_bytes()[..])
        .execute(&self.pool)
        .await
        .map_err(raw)?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE idem_bench_naive SET state = 'SUCCEEDED', version = version + 1, lease_expires_at = NULL, \
             result_status = 201, result_headers = '[[\"content-type\",\"application/json\"]]', result_body = ?, \
             result_ref = 'ord_0192f0c0bench', updated_at = {SQLITE_NOW}, completed_at = {SQLITE_NOW} \
             WHERE tenant_id = ? AND key = ?"
        )))
        .bind(body)
        .bind(tenant)
        .bind(key)
        .execute(&self.pool)
        .await
        .map_err(raw)?;
        Ok(())
    }

    async fn replay(&self, tenant: &str, key: &str) -> Result<(), StoreError> {
        sqlx::query("SELECT * FROM idem_bench_naive WHERE tenant_id = ? AND key = ?")
            .bind(tenant)
            .bind(key)
            .fetch_one(&self.pool)
            .await
            .map_err(raw)?;
        Ok(())
    }
}

/// PostgreSQL baseline: the naive two statements on a table of the same shape (LIKE
/// idem_records, indexes included) in the bench's own schema, with its own pool of the
/// same size. `cleanup` drops the schema.
pub struct PgBaseline {
    pool: sqlx::PgPool,
    schema: String,
}

/// The pool of a PostgreSQL baseline: what the store's own pool does per checkout (no
/// ping, which would add a round trip to every statement of the baseline alone).
pub(crate) fn pg_bench_pool() -> sqlx::postgres::PgPoolOptions {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(32)
        .acquire_timeout(Duration::from_secs(5))
        .test_before_acquire(false)
}

pub(crate) const PG_NOW: &str = "((extract(epoch from clock_timestamp()) * 1000)::bigint)";

impl PgBaseline {
    pub async fn new(url: &str, schema: &str) -> Result<Self, StoreError> {
        // The same pool settings as the store under test (`open_bench`): 32 connections,
        // no ping when taken from the pool.
        let pool = pg_bench_pool()
            .connect(url)
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE TABLE IF NOT EXISTS {schema}.idem_bench_naive (LIKE {schema}.idem_records INCLUDING ALL)"
        )))
        .execute(&pool)
        .await
        .map_err(raw)?;
        Ok(Self {
            pool,
            schema: schema.to_string(),
        })
    }
}

#[async_trait]
impl Baseline for PgBaseline {
    fn describe(&self) -> &'static str {
        "sqlx: INSERT ... ON CONFLICT DO NOTHING, then UPDATE (same table shape, pool of 32)"
    }

    fn describe_replay(&self) -> &'static str {
        "sqlx: SELECT * by (tenant_id, key) (same table shape, pool of 32)"
    }

    async fn claim_complete(&self, tenant: &str, key: &str, body: &[u8]) -> Result<(), StoreError> {
        let s = &self.schema;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {s}.idem_bench_naive (tenant_id, key, principal, fingerprint, state, version, owner, \
             lease_expires_at, attempts, created_at, updated_at) VALUES ($1, $2, 'bench', $3, 'PROCESSING', 1, \
             'bench', {PG_NOW} + 30000, 1, {PG_NOW}, {PG_NOW}) ON CONFLICT (tenant_id, key) DO NOTHING"
        )))
        .bind(tenant)
        .bind(key)
        .bind(&Fingerprint::of_bytes(b"bench-payload").as_bytes()[..])
        .execute(&self.pool)
        .await
        .map_err(raw)?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {s}.idem_bench_naive SET state = 'SUCCEEDED', version = version + 1, lease_expires_at = NULL, \
             result_status = 201, result_headers = '[[\"content-type\",\"application/json\"]]'::jsonb, result_body = $1, \
             result_ref = 'ord_0192f0c0bench', updated_at = {PG_NOW}, completed_at = {PG_NOW} \
             WHERE tenant_id = $2 AND key = $3"
        )))
        .bind(body)
        .bind(tenant)
        .bind(key)
        .execute(&self.pool)
        .await
        .map_err(raw)?;
        Ok(())
    }

    async fn replay(&self, tenant: &str, key: &str) -> Result<(), StoreError> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT * FROM {}.idem_bench_naive WHERE tenant_id = $1 AND key = $2",
            self.schema
        )))
        .bind(tenant)
        .bind(key)
        .fetch_one(&self.pool)
        .await
        .map_err(raw)?;
        Ok(())
    }

    async fn cleanup(&self) -> Result<(), StoreError> {
        drop_bench_schema(&self.pool, &self.schema).await
    }
}

/// The current time in epoch milliseconds on MySQL/MariaDB (sessions of UTC or not:
/// `UNIX_TIMESTAMP` of `NOW` is zone-free).
pub(crate) const MYSQL_NOW: &str = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)";

/// A database of a bench's own on a MySQL/MariaDB server (MySQL's schemas are
/// databases): created next to the one the URL names, with the raw driver's pool of 32
/// on it; `drop` removes it with everything in it, idem's tables included.
pub(crate) struct MysqlBenchDb {
    pub pool: sqlx::MySqlPool,
    /// The URL of the bench's database, for idem's store.
    pub url: String,
    /// The URL it was made from, to drop it.
    server: String,
    name: String,
}

impl MysqlBenchDb {
    pub async fn create(url: &str, name: &str) -> Result<Self, StoreError> {
        use std::str::FromStr;
        let unavailable = |e: sqlx::Error| StoreError::Unavailable(e.to_string());
        let bench_url = idem_bench::cleanup::create_mysql_database(url, name)
            .await
            .map_err(unavailable)?;
        let options = sqlx::mysql::MySqlConnectOptions::from_str(&bench_url.replacen(
            "mariadb://",
            "mysql://",
            1,
        ))
        .map_err(|e| StoreError::InvalidInput(format!("database URL: {e}")))?;
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(32)
            .acquire_timeout(Duration::from_secs(5))
            .test_before_acquire(false)
            .connect_with(options)
            .await
            .map_err(unavailable)?;
        Ok(Self {
            pool,
            url: bench_url,
            server: url.to_string(),
            name: name.to_string(),
        })
    }

    pub async fn drop(&self) -> Result<(), StoreError> {
        idem_bench::cleanup::drop_mysql_database(&self.server, &self.name)
            .await
            .map_err(|e| StoreError::Backend(format!("drop bench database {}: {e}", self.name)))
    }
}

/// MySQL/MariaDB baseline: `INSERT … ON DUPLICATE KEY UPDATE` that changes nothing,
/// then `UPDATE`, on a table of the same shape (`LIKE idem_records`) in the bench's own
/// database with a pool of 32. `cleanup` drops the database.
pub struct MysqlBaseline {
    db: MysqlBenchDb,
}

impl MysqlBaseline {
    pub(crate) async fn new(db: MysqlBenchDb) -> Result<Self, StoreError> {
        sqlx::query("CREATE TABLE IF NOT EXISTS idem_bench_naive LIKE idem_records")
            .execute(&db.pool)
            .await
            .map_err(raw)?;
        Ok(Self { db })
    }
}

#[async_trait]
impl Baseline for MysqlBaseline {
    fn describe(&self) -> &'static str {
        "sqlx: INSERT ... ON DUPLICATE KEY UPDATE (no change), then UPDATE (same table shape, pool of 32)"
    }

    fn describe_replay(&self) -> &'static str {
        "sqlx: SELECT * by (tenant_id, key) (same table shape, pool of 32)"
    }

    async fn claim_complete(&self, tenant: &str, key: &str, body: &[u8]) -> Result<(), StoreError> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO idem_bench_naive (tenant_id, `key`, principal, fingerprint, state, version, owner, \
             lease_expires_at, attempts, created_at, updated_at) VALUES (?, ?, 'bench', ?, 'PROCESSING', 1, \
             'bench', {MYSQL_NOW} + 30000, 1, {MYSQL_NOW}, {MYSQL_NOW}) \
             ON DUPLICATE KEY UPDATE tenant_id = tenant_id"
        )))
        .bind(tenant)
        .bind(key)
        .bind(&Fingerprint::of_bytes(b"bench-payload").as_bytes()[..])
        .execute(&self.db.pool)
        .await
        .map_err(raw)?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE idem_bench_naive SET state = 'SUCCEEDED', version = version + 1, lease_expires_at = NULL, \
             result_status = 201, result_headers = '[[\"content-type\",\"application/json\"]]', result_body = ?, \
             result_ref = 'ord_0192f0c0bench', updated_at = {MYSQL_NOW}, completed_at = {MYSQL_NOW} \
             WHERE tenant_id = ? AND `key` = ?"
        )))
        .bind(body)
        .bind(tenant)
        .bind(key)
        .execute(&self.db.pool)
        .await
        .map_err(raw)?;
        Ok(())
    }

    async fn replay(&self, tenant: &str, key: &str) -> Result<(), StoreError> {
        sqlx::query("SELECT * FROM idem_bench_naive WHERE tenant_id = ? AND `key` = ?")
            .bind(tenant)
            .bind(key)
            .fetch_one(&self.db.pool)
            .await
            .map_err(raw)?;
        Ok(())
    }

    async fn cleanup(&self) -> Result<(), StoreError> {
        self.db.drop().await
    }
}

/// Redis baseline: `SET NX PX` then `SET PX` with the result; replay is a `GET`.
pub struct RedisBaseline {
    conn: redis::aio::ConnectionManager,
    prefix: String,
}

fn redis_err(e: redis::RedisError) -> StoreError {
    StoreError::Backend(e.to_string())
}

impl RedisBaseline {
    pub async fn new(url: &str, prefix: &str) -> Result<Self, StoreError> {
        let conn = redis_connection(url).await?;
        Ok(Self {
            conn,
            prefix: prefix.to_string(),
        })
    }
}

#[async_trait]
impl Baseline for RedisBaseline {
    fn describe(&self) -> &'static str {
        "redis-rs: SET NX PX, then SET PX with the result"
    }

    fn describe_replay(&self) -> &'static str {
        "redis-rs: GET"
    }

    async fn claim_complete(&self, tenant: &str, key: &str, body: &[u8]) -> Result<(), StoreError> {
        let k = format!("{}:naive:{{{tenant}:{key}}}", self.prefix);
        let mut c = self.conn.clone();
        let _: Option<String> = redis::cmd("SET")
            .arg(&k)
            .arg("PROCESSING")
            .arg("NX")
            .arg("PX")
            .arg(86_400_000)
            .query_async(&mut c)
            .await
            .map_err(redis_err)?;
        let _: () = redis::cmd("SET")
            .arg(&k)
            .arg(body)
            .arg("PX")
            .arg(86_400_000)
            .query_async(&mut c)
            .await
            .map_err(redis_err)?;
        Ok(())
    }

    async fn replay(&self, tenant: &str, key: &str) -> Result<(), StoreError> {
        let k = format!("{}:naive:{{{tenant}:{key}}}", self.prefix);
        let mut c = self.conn.clone();
        let _: Option<Vec<u8>> = redis::cmd("GET")
            .arg(&k)
            .query_async(&mut c)
            .await
            .map_err(redis_err)?;
        Ok(())
    }

    async fn cleanup(&self) -> Result<(), StoreError> {
        unlink_prefix(&self.conn, &self.prefix).await
    }
}

/// Removes every key under `prefix:` (what a bench wrote).
pub(crate) async fn unlink_prefix(
    conn: &redis::aio::ConnectionManager,
    prefix: &str,
) -> Result<(), StoreError> {
    idem_bench::cleanup::unlink_prefix(&mut conn.clone(), prefix)
        .await
        .map(|_| ())
        .map_err(redis_err)
}
