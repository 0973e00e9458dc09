//! idem-sqlite: the embedded store, and idem's default.
//!
//! Owns the SQLite schema (applied on open) and the SQLite forms of claim, finish,
//! extend and get. The file runs in WAL mode with a busy timeout; every write is a
//! single statement (insert, or compare-and-set update), and transactions that read
//! then write start with `BEGIN IMMEDIATE`, since a deferred one fails with SQLITE_BUSY
//! under contention instead of waiting.
//!
//! It must not decide anything the core's decision table does not say, and it never
//! takes time from the caller: lease deadlines come from SQLite's clock (plus the
//! [`ClockShift`] tests use).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use idem_core::store::{verdict, Verdict};
use idem_core::{
    Claim, ClaimKind, ClaimRequest, ClaimToken, ClockShift, Finish, IdempotencyStore, Millis,
    Record, Scope, StoreError, StoreLimits,
};
use idem_store_kit::row::{headers_json, RecordRow};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::Row;
use tokio::sync::{Mutex, OwnedMutexGuard};

mod lease;
mod migrate;
mod retention;

pub use lease::*;
pub use migrate::MIGRATIONS;

/// The newest schema version this build knows (`idem_schema_migrations`).
pub fn newest_migration() -> i64 {
    idem_store_kit::migrate::newest(MIGRATIONS)
}

/// The default database file, relative to the working directory.
pub const DEFAULT_PATH: &str = "./idem-data/idem.db";

/// The store clock in epoch milliseconds, shifted by the bound parameter `$shift` (`?`,
/// or a numbered `?N` in statements that name their parameters), as an SQL literal.
macro_rules! now_sql {
    ($shift:literal) => {
        concat!(
            "(CAST(unixepoch('subsec') * 1000 AS INTEGER) + ",
            $shift,
            ")"
        )
    };
}
pub(crate) use now_sql;

/// The store clock in epoch milliseconds, shifted by a bound parameter.
const NOW: &str = now_sql!("?");

/// How to open the embedded store.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SqliteOptions {
    pub path: PathBuf,
    pub limits: StoreLimits,
    pub clock: ClockShift,
    pub max_connections: u32,
    pub busy_timeout: Duration,
    /// `FULL` by default: a commit survives power loss, not only a process crash.
    pub synchronous: SqliteSynchronous,
    /// Queue this process's writers in-process instead of in SQLite's busy handler.
    /// Off by default: on this project's benchmarks it did not beat the busy handler.
    pub serialize_writers: bool,
}

impl SqliteOptions {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            limits: StoreLimits::default(),
            clock: ClockShift::default(),
            max_connections: 8,
            busy_timeout: Duration::from_secs(10),
            synchronous: SqliteSynchronous::Full,
            serialize_writers: false,
        }
    }

    /// Parses `sqlite://PATH` (or `sqlite:PATH`).
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        let path = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
            .ok_or_else(|| StoreError::InvalidInput(format!("not an sqlite URL: {url}")))?;
        let path = path.split('?').next().unwrap_or_default();
        if path.is_empty() || path.starts_with(":memory:") {
            return Err(StoreError::InvalidInput(
                "sqlite URL needs a file path (sqlite://PATH)".into(),
            ));
        }
        Ok(Self::new(path))
    }

    /// How each connection opens the file. The journal mode is left to the file, which
    /// [`ensure_wal`](Self::ensure_wal) puts in WAL mode once: asking for it on every
    /// connection would race other openers of a new file for a lock SQLite does not wait on.
    pub fn connect_options(&self) -> SqliteConnectOptions {
        SqliteConnectOptions::new()
            .filename(&self.path)
            .create_if_missing(true)
            .synchronous(self.synchronous)
            .busy_timeout(self.busy_timeout)
            .foreign_keys(true)
    }

    /// Puts the file in WAL mode (it stays so: the mode is stored in the file). Turning a
    /// file into WAL takes an exclusive lock that SQLite's busy handler does not wait for,
    /// so an opener racing others retries here, with backoff, for up to `busy_timeout`.
    /// Fails if the file cannot run in WAL mode (a VFS without shared memory, say).
    pub async fn ensure_wal(&self) -> Result<(), StoreError> {
        use sqlx::{ConnectOptions, Connection};
        let start = Instant::now();
        // Each statement's own wait stays short, so this loop keeps the whole deadline.
        let options = self
            .connect_options()
            .busy_timeout(self.busy_timeout.min(WAL_STEP_WAIT));
        let mut conn = options.connect().await.map_err(map_err)?;
        let mut pause = Duration::from_millis(1);
        let outcome = loop {
            match wal_on(&mut conn).await {
                Ok(mode) if mode.eq_ignore_ascii_case("wal") => break Ok(()),
                Ok(mode) => {
                    break Err(StoreError::Backend(format!(
                        "{} cannot run in WAL mode (its journal mode stays {mode})",
                        self.path.display()
                    )))
                }
                Err(e) if is_busy(&e) && start.elapsed() + pause < self.busy_timeout => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                Err(e) => break Err(map_err(e)),
            }
        };
        let _ = conn.close().await;
        outcome
    }
}

/// How long one statement of [`SqliteOptions::ensure_wal`] waits in SQLite's busy handler.
const WAL_STEP_WAIT: Duration = Duration::from_millis(100);

/// The file's journal mode after asking for WAL; asks only when it is not WAL already,
/// since the question alone takes no exclusive lock.
async fn wal_on(conn: &mut SqliteConnection) -> Result<String, sqlx::Error> {
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut *conn)
        .await?;
    if mode.eq_ignore_ascii_case("wal") {
        return Ok(mode);
    }
    sqlx::query_scalar("PRAGMA journal_mode = WAL")
        .fetch_one(conn)
        .await
}

/// SQLITE_BUSY / SQLITE_LOCKED, with their extended codes: contention, worth a retry.
pub fn is_busy(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => db
            .code()
            .and_then(|c| c.parse::<i32>().ok())
            .is_some_and(|c| matches!(c & 0xff, 5 | 6)),
        _ => false,
    }
}

/// The embedded store.
#[derive(Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    limits: StoreLimits,
    clock: ClockShift,
    /// SQLite admits one writer at a time. Queueing this process's writers here, rather
    /// than in SQLite's sleeping busy handler, keeps latency flat under contention;
    /// other processes still meet `busy_timeout`.
    writer: Option<Arc<Mutex<()>>>,
}

/// A driver error as the store's: busy and locked files, pool and I/O trouble are
/// `Unavailable`, the rest `Backend`.
pub fn map_err(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => {
            StoreError::Unavailable(e.to_string())
        }
        sqlx::Error::Database(_) if is_busy(&e) => StoreError::Unavailable(e.to_string()),
        _ => StoreError::Backend(e.to_string()),
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database file and applies pending migrations.
    /// A new file (and a missing directory) is created readable by its owner only.
    pub async fn open(options: SqliteOptions) -> Result<Self, StoreError> {
        if let Some(dir) = options.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            private::create_dir_all(dir).map_err(|e| {
                StoreError::Unavailable(format!("cannot create {}: {e}", dir.display()))
            })?;
        }
        let created = private::create_file(&options.path).map_err(|e| {
            StoreError::Unavailable(format!("cannot create {}: {e}", options.path.display()))
        })?;
        options.ensure_wal().await?;
        let pool = SqlitePoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.connect_options())
            .await
            .map_err(map_err)?;
        migrate::apply(&pool).await?;
        if created {
            // SQLite gives -wal and -shm the database file's mode; make sure of it.
            private::restrict_companions(&options.path);
        }
        Ok(Self {
            pool,
            limits: options.limits,
            clock: options.clock,
            writer: options.serialize_writers.then(|| Arc::new(Mutex::new(()))),
        })
    }

    /// Opens the file at `path` with default options.
    pub async fn open_path(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open(SqliteOptions::new(path.as_ref())).await
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    pub fn clock(&self) -> &ClockShift {
        &self.clock
    }

    /// Starts a writing transaction the right way for SQLite (`BEGIN IMMEDIATE`), for
    /// callers that write business rows and finish a claim in one commit. The
    /// transaction holds this store's writer slot until it ends.
    pub async fn begin(&self) -> Result<SqliteTx, StoreError> {
        let guard = match &self.writer {
            Some(w) => Some(w.clone().lock_owned().await),
            None => None,
        };
        let tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(map_err)?;
        Ok(SqliteTx { tx, _writer: guard })
    }

    /// The store's current time, in epoch milliseconds.
    pub async fn now(&self) -> Result<Millis, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        now_on(&mut conn, &self.clock).await
    }

    /// Claim on the caller's connection or transaction. Inside a transaction the claim
    /// commits or rolls back with the caller's other writes.
    pub async fn claim_in_tx(
        &self,
        conn: &mut SqliteConnection,
        req: &ClaimRequest,
    ) -> Result<Claim, StoreError> {
        self.limits.check_claim(req)?;
        claim_on(conn, &self.clock, None, req).await
    }

    /// The one-commit create's record: `req`'s key written once, already final, on the
    /// caller's transaction (which holds the write lock, so a duplicate waits for its
    /// commit). `None` when the key has a record: nothing was written; roll back and
    /// claim the key instead.
    pub async fn insert_final_in_tx(
        &self,
        conn: &mut SqliteConnection,
        req: &ClaimRequest,
        finish: Finish,
    ) -> Result<Option<Record>, StoreError> {
        self.limits.check_final(req, &finish)?;
        let now = now_on(conn, &self.clock).await?;
        let result = finish.result.as_ref();
        let headers = result.map(|r| headers_json(&r.headers));
        let inserted = sqlx::query(
            "INSERT INTO idem_records (tenant_id, key, principal, fingerprint, state, version, \
               owner, lease_expires_at, attempts, created_at, updated_at, completed_at, \
               result_status, result_headers, result_body, result_ref) \
             VALUES (?, ?, ?, ?, ?, 1, ?, NULL, 1, ?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (tenant_id, key) DO NOTHING",
        )
        .bind(req.scope.tenant.as_str())
        .bind(req.scope.key.as_str())
        .bind(req.principal.as_str())
        .bind(&req.fingerprint.as_bytes()[..])
        .bind(finish.state.as_str())
        .bind(req.owner.as_str())
        .bind(now)
        .bind(now)
        .bind(now)
        .bind(result.map(|r| i64::from(r.status)))
        .bind(headers)
        .bind(result.map(|r| r.body.as_slice()))
        .bind(result.and_then(|r| r.result_ref.as_deref()))
        .execute(&mut *conn)
        .await
        .map_err(map_err)?
        .rows_affected();
        Ok((inserted == 1).then(|| idem_core::store::final_record(req, finish, now)))
    }

    /// Finish on the caller's transaction: a lost compare-and-set returns
    /// [`StoreError::Superseded`] and the caller rolls its business write back.
    pub async fn finish_in_tx(
        &self,
        conn: &mut SqliteConnection,
        token: &ClaimToken,
        finish: Finish,
    ) -> Result<Record, StoreError> {
        self.limits.check_finish(&finish)?;
        finish_on(conn, &self.clock, None, token, finish).await
    }
}

async fn now_on(conn: &mut SqliteConnection, clock: &ClockShift) -> Result<Millis, StoreError> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT {NOW}")))
        .bind(clock.millis())
        .fetch_one(conn)
        .await
        .map_err(map_err)
}

const RECORD_COLUMNS: &str = "tenant_id, key, principal, fingerprint, state, version, owner, \
     lease_expires_at, result_status, result_headers, result_body, result_ref, attempts, \
     created_at, updated_at, completed_at";

/// Reads a record's columns; `idem_store_kit::row` validates them.
fn record_from_row(row: &SqliteRow) -> Result<Record, StoreError> {
    record_row(row)?.decode()
}

fn record_row(row: &SqliteRow) -> Result<RecordRow, StoreError> {
    Ok(RecordRow {
        tenant_id: row.try_get("tenant_id").map_err(map_err)?,
        key: row.try_get("key").map_err(map_err)?,
        principal: row.try_get("principal").map_err(map_err)?,
        fingerprint: row.try_get("fingerprint").map_err(map_err)?,
        state: row.try_get("state").map_err(map_err)?,
        version: row.try_get("version").map_err(map_err)?,
        owner: row.try_get("owner").map_err(map_err)?,
        lease_expires_at: row.try_get("lease_expires_at").map_err(map_err)?,
        result_status: row.try_get("result_status").map_err(map_err)?,
        result_headers: row.try_get("result_headers").map_err(map_err)?,
        result_body: row.try_get("result_body").map_err(map_err)?,
        result_ref: row.try_get("result_ref").map_err(map_err)?,
        attempts: row.try_get("attempts").map_err(map_err)?,
        created_at: row.try_get("created_at").map_err(map_err)?,
        updated_at: row.try_get("updated_at").map_err(map_err)?,
        completed_at: row.try_get("completed_at").map_err(map_err)?,
    })
}

async fn get_on(conn: &mut SqliteConnection, scope: &Scope) -> Result<Option<Record>, StoreError> {
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {RECORD_COLUMNS} FROM idem_records WHERE tenant_id = ? AND key = ?"
    )))
    .bind(scope.tenant.as_str())
    .bind(scope.key.as_str())
    .fetch_optional(conn)
    .await
    .map_err(map_err)?;
    row.as_ref().map(record_from_row).transpose()
}

/// The record (if any) and the store's time, in one statement.
async fn get_with_now(
    conn: &mut SqliteConnection,
    clock: &ClockShift,
    scope: &Scope,
) -> Result<(Millis, Option<Record>), StoreError> {
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {NOW} AS now_ms, r.tenant_id IS NOT NULL AS found, r.* \
         FROM (SELECT 1) LEFT JOIN idem_records r ON r.tenant_id = ? AND r.key = ?"
    )))
    .bind(clock.millis())
    .bind(scope.tenant.as_str())
    .bind(scope.key.as_str())
    .fetch_one(conn)
    .await
    .map_err(map_err)?;
    let now: Millis = row.try_get("now_ms").map_err(map_err)?;
    let found: bool = row.try_get("found").map_err(map_err)?;
    let record = if found {
        Some(record_from_row(&row)?)
    } else {
        None
    };
    Ok((now, record))
}

async fn lock(writer: Option<&Mutex<()>>) -> Option<tokio::sync::MutexGuard<'_, ()>> {
    match writer {
        Some(m) => Some(m.lock().await),
        None => None,
    }
}

/// Claim as single statements. One read (record and store time together) decides: an
/// absent key is inserted (`ON CONFLICT DO NOTHING`, so a concurrent winner makes the
/// insert return nothing and the loop decides again on the winner's record); an existing
/// one is decided by the core's table and taken over by a compare-and-set on its version.
/// Reading first keeps replays off SQLite's single write lock.
async fn claim_on(
    conn: &mut SqliteConnection,
    clock: &ClockShift,
    writer: Option<&Mutex<()>>,
    req: &ClaimRequest,
) -> Result<Claim, StoreError> {
    let lease = idem_core::retention::millis(req.lease);
    for _ in 0..16 {
        let (now, existing) = get_with_now(conn, clock, &req.scope).await?;
        let Some(existing) = existing else {
            let _w = lock(writer).await;
            // No RETURNING: SQLite keeps the write transaction open until the statement's
            // rows are drained, which through sqlx's worker thread means holding the single
            // write lock across a thread round trip. The lease starts at the store time
            // just read, so the deadline is still the store's, not the caller's.
            let lease_expires_at = now.saturating_add(lease);
            let inserted = sqlx::query(
                "INSERT INTO idem_records (tenant_id, key, principal, fingerprint, state, version, \
                   owner, lease_expires_at, attempts, created_at, updated_at) \
                 VALUES (?, ?, ?, ?, 'PROCESSING', 1, ?, ?, 1, ?, ?) \
                 ON CONFLICT (tenant_id, key) DO NOTHING",
            )
            .bind(req.scope.tenant.as_str())
            .bind(req.scope.key.as_str())
            .bind(req.principal.as_str())
            .bind(&req.fingerprint.as_bytes()[..])
            .bind(req.owner.as_str())
            .bind(lease_expires_at)
            .bind(now)
            .bind(now)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
            if inserted.rows_affected() == 1 {
                let token = ClaimToken::of(req, 1, lease_expires_at, 1, ClaimKind::Fresh);
                return Ok(Claim::Proceed(token));
            }
            continue; // a concurrent arrival inserted first: decide on its record
        };
        match verdict(existing, req, now) {
            Verdict::Answer(claim) => return Ok(claim),
            Verdict::TakeOver { existing, kind } => {
                let _w = lock(writer).await;
                let taken: Option<(i64, i64, i32)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "UPDATE idem_records SET state = 'PROCESSING', version = version + 1, \
                       owner = ?, lease_expires_at = {NOW} + ?, attempts = attempts + 1, \
                       updated_at = {NOW} \
                     WHERE tenant_id = ? AND key = ? AND version = ? \
                     RETURNING version, lease_expires_at, attempts"
                )))
                .bind(req.owner.as_str())
                .bind(clock.millis())
                .bind(lease)
                .bind(clock.millis())
                .bind(req.scope.tenant.as_str())
                .bind(req.scope.key.as_str())
                .bind(existing.version)
                .fetch_optional(&mut *conn)
                .await
                .map_err(map_err)?;
                if let Some((version, lease_expires_at, attempt)) = taken {
                    let token = ClaimToken::of(req, version, lease_expires_at, attempt, kind);
                    return Ok(Claim::Proceed(token));
                }
                // Lost the compare-and-set: decide again on the winner's record.
            }
        }
    }
    Err(StoreError::Unavailable(format!(
        "claim on {} did not settle under contention",
        req.scope
    )))
}

async fn finish_on(
    conn: &mut SqliteConnection,
    clock: &ClockShift,
    writer: Option<&Mutex<()>>,
    token: &ClaimToken,
    finish: Finish,
) -> Result<Record, StoreError> {
    let terminal = finish.state.is_terminal();
    let result = finish.result.as_ref();
    let headers = result.map(|r| headers_json(&r.headers));
    let w = lock(writer).await;
    // No RETURNING (see claim_on): the write commits as soon as it executes, and the
    // record is read back afterwards without the write lock.
    let updated = sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE idem_records SET state = ?, version = version + 1, lease_expires_at = NULL, \
           result_status = ?, result_headers = ?, result_body = ?, result_ref = ?, \
           updated_at = {NOW}, completed_at = CASE WHEN ? THEN {NOW} END \
         WHERE tenant_id = ? AND key = ? AND version = ? AND owner = ? AND state = 'PROCESSING'"
    )))
    .bind(finish.state.as_str())
    .bind(result.map(|r| i64::from(r.status)))
    .bind(headers)
    .bind(result.map(|r| r.body.as_slice()))
    .bind(result.and_then(|r| r.result_ref.as_deref()))
    .bind(clock.millis())
    .bind(terminal)
    .bind(clock.millis())
    .bind(token.scope.tenant.as_str())
    .bind(token.scope.key.as_str())
    .bind(token.version)
    .bind(token.owner.as_str())
    .execute(&mut *conn)
    .await
    .map_err(map_err)?;
    drop(w);
    if updated.rows_affected() == 0 {
        return Err(StoreError::superseded(token));
    }
    get_on(conn, &token.scope)
        .await?
        .ok_or_else(|| StoreError::NotFound(token.scope.to_string()))
}

#[async_trait]
impl IdempotencyStore for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        self.limits.check_claim(req)?;
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        claim_on(&mut conn, &self.clock, self.writer.as_deref(), req).await
    }

    async fn finish(&self, token: &ClaimToken, finish: Finish) -> Result<Record, StoreError> {
        self.limits.check_finish(&finish)?;
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        finish_on(
            &mut conn,
            &self.clock,
            self.writer.as_deref(),
            token,
            finish,
        )
        .await
    }

    async fn extend_lease(
        &self,
        token: &ClaimToken,
        lease: Duration,
    ) -> Result<Millis, StoreError> {
        let lease = idem_core::store::lease_millis(lease)?;
        let _w = lock(self.writer.as_deref()).await;
        let deadline: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "UPDATE idem_records SET lease_expires_at = {NOW} + ?, updated_at = {NOW} \
             WHERE tenant_id = ? AND key = ? AND version = ? AND owner = ? \
               AND state = 'PROCESSING' \
             RETURNING lease_expires_at"
        )))
        .bind(self.clock.millis())
        .bind(lease)
        .bind(self.clock.millis())
        .bind(token.scope.tenant.as_str())
        .bind(token.scope.key.as_str())
        .bind(token.version)
        .bind(token.owner.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)?;
        deadline.ok_or_else(|| StoreError::superseded(token))
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        get_on(&mut conn, scope).await
    }

    async fn unique_guard(&self) -> Result<bool, StoreError> {
        // Read from the live schema: a unique index whose columns are exactly
        // (tenant_id, key), in any order.
        let indexes: Vec<(String, i64)> =
            sqlx::query_as("SELECT name, \"unique\" FROM pragma_index_list('idem_records')")
                .fetch_all(&self.pool)
                .await
                .map_err(map_err)?;
        for (name, _) in indexes.into_iter().filter(|(_, unique)| *unique == 1) {
            let mut cols: Vec<String> = sqlx::query_scalar("SELECT name FROM pragma_index_info(?)")
                .bind(&name)
                .fetch_all(&self.pool)
                .await
                .map_err(map_err)?;
            cols.sort();
            if cols == ["key", "tenant_id"] {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// A `BEGIN IMMEDIATE` transaction holding the store's writer slot. Derefs to the sqlx
/// transaction; pass `&mut *tx` (a connection) to `claim_in_tx` / `finish_in_tx` and to
/// business writes, then `commit()`. Dropping it rolls back.
pub struct SqliteTx {
    tx: sqlx::Transaction<'static, sqlx::Sqlite>,
    _writer: Option<OwnedMutexGuard<()>>,
}

impl SqliteTx {
    pub async fn commit(self) -> Result<(), StoreError> {
        self.tx.commit().await.map_err(map_err)
    }

    pub async fn rollback(self) -> Result<(), StoreError> {
        self.tx.rollback().await.map_err(map_err)
    }
}

impl std::ops::Deref for SqliteTx {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        &self.tx
    }
}

impl std::ops::DerefMut for SqliteTx {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        &mut self.tx
    }
}

/// Database files hold every stored response: owner-only permissions, set when the file
/// is created rather than through the process umask.
mod private {
    use std::io;
    use std::path::Path;

    pub(super) fn create_dir_all(dir: &Path) -> io::Result<()> {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(dir)
    }

    /// Creates `path` empty (SQLite takes an empty file as a new database); `false` when
    /// it already exists, whose mode is left alone.
    pub(super) fn create_file(path: &Path) -> io::Result<bool> {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        match options.open(path) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub(super) fn restrict_companions(path: &Path) {
        #[cfg(unix)]
        for suffix in ["-wal", "-shm", "-journal"] {
            use std::os::unix::fs::PermissionsExt;
            let mut companion = path.as_os_str().to_owned();
            companion.push(suffix);
            let companion = Path::new(&companion);
            if companion.exists() {
                let private = std::fs::Permissions::from_mode(0o600);
                if let Err(e) = std::fs::set_permissions(companion, private) {
                    tracing::warn!(file = %companion.display(), error = %e, "cannot restrict permissions");
                }
            }
        }
        #[cfg(not(unix))]
        let _ = path;
    }
}
