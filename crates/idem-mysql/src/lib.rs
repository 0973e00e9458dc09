//! idem-mysql: the idem store on MySQL 8.0 and MariaDB 10.11 (InnoDB).
//!
//! # What this crate owns
//! - The `idem_records` table in the connection's database, whose primary key
//!   `(tenant_id, key)` is the UNIQUE guard, the lease, fence, retention and archive
//!   tables, and the versioned migrations recorded in `idem_schema_migrations`
//!   ([`MysqlStore::migrate`]).
//! - [`MysqlStore`], an [`IdempotencyStore`]: a fresh key is one `INSERT` (one round
//!   trip: the lease deadline comes back in the OK packet, see `sql.rs`); a key that has
//!   a record fails that insert on the primary key and is read with a plain `SELECT`
//!   (two round trips), or read first when this store saw the scope lately
//!   ([`idem_store_kit::recent`]: one round trip for hot replays). [`idem_core::decide`] reads
//!   the record; a takeover is a compare-and-set on the version it read; finish and
//!   heartbeat are compare-and-sets on `(version, owner, state = PROCESSING)`. A finish
//!   is that one statement: the claim's token keeps what the statement cannot hand back
//!   (`kept.rs`); a token without it (deserialized) reads those back.
//! - The transactional form ([`MysqlStore::claim_in_tx`], [`MysqlStore::insert_final_in_tx`],
//!   [`MysqlStore::finish_in_tx`]): the record commits or rolls back with the caller's
//!   business rows.
//! - Leases with fencing tokens ([`idem_core::LeaseStore`]), the fenced write, retention
//!   tiers and the archive (`lease.rs`, `retention.rs`).
//! - The same key-state machine as stored procedures (`idem_claim`, `idem_finish`,
//!   `idem_heartbeat`; docs/SQL-API.md) for clients in any language, and
//!   [`ProcedureStore`], the Rust client of them (`procedures.rs`).
//!
//! # Sessions and InnoDB
//! Every pooled session runs `READ COMMITTED` (each statement reads the newest committed
//! rows, so the read after a failed insert sees the row that made it fail, and an
//! `UPDATE` re-checks its `WHERE` on the newest committed version after waiting for a
//! lock; no gap locks on plain reads) with `innodb_lock_wait_timeout` from
//! [`MysqlOptions::lock_wait_timeout`] (a stalled holder costs a waiter seconds, not the
//! server's default 50 s). The session `time_zone` is `+00:00` (sqlx's default), so
//! `UNIX_TIMESTAMP(NOW(3))` has no daylight-saving gap. A call outside a transaction that
//! InnoDB refuses over a lock (deadlock victim 1213, lock wait timeout 1205) wrote
//! nothing and is run again, up to [`LOCK_CONFLICT_RETRIES`] times; inside the caller's
//! transaction it is answered as in progress (claim) or as "the key has a record"
//! (final insert), and the caller rolls back.
//!
//! # MySQL 8 and MariaDB
//! Tested on MariaDB 10.11; written for MySQL 8.0.16+ too (CHECK constraints are
//! enforced from 8.0.16). The statements are written in the dialect both accept. Where they differ this store
//! uses the common form: no `RETURNING` (MariaDB-only; `LAST_INSERT_ID(expr)` instead),
//! `VALUES(col)` in `ON DUPLICATE KEY UPDATE` (MySQL 8.0.20+ deprecates it in favour of
//! a row alias MariaDB lacks; MySQL answers it with a warning), `SET SESSION TRANSACTION
//! ISOLATION LEVEL` (the variable is `transaction_isolation` on MySQL 8 and `tx_isolation`
//! on MariaDB 10.11), no `CREATE INDEX IF NOT EXISTS` or `CREATE TRIGGER IF NOT EXISTS`
//! (MariaDB, and MySQL only from 8.0.29), `ascii_bin` / `utf8mb4_bin` collations (the
//! `utf8mb4_0900_*` ones are MySQL-only), `MEDIUMTEXT` for stored headers (MySQL's
//! binary `JSON` type is MariaDB's `LONGTEXT`). With binary logging on, creating the
//! lease triggers needs `SUPER` or `log_bin_trust_function_creators = 1` on both, and
//! the in-place release, which reads the clock after its row lock (`SYSDATE`), is logged
//! by row (`binlog_format` `MIXED` or `ROW`).
//!
//! # What it must not do
//! - Read time from the caller: every deadline comes from the server clock
//!   (`NOW(3)`), shifted only by [`ClockShift`] in tests.
//! - Write on the strength of a value it read earlier without re-checking it.
//! - Answer "proceed" without a record written, or when it cannot tell.
//! - Delete records outside retention, or touch tables other than its own.

mod error;
mod kept;
mod lease;
mod lease_cycle;
mod migrate;
mod retention;
mod row;
mod sql;

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::store::{lease_millis, verdict, Verdict};
use idem_core::{
    Claim, ClaimKind, ClaimRequest, ClaimToken, ClockShift, Fingerprint, Finish, IdempotencyStore,
    Millis, Principal, Record, Scope, StoreError, StoreLimits,
};
use idem_store_kit::RecentKeys;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, Executor, MySqlConnection, SqlSafeStr, SqlStr};

pub use error::{error_number, is_lock_conflict, is_unavailable, map_err};
pub use lease::FencedWriteFuture;
pub use migrate::split_statements;

/// The newest schema version this build knows (`idem_schema_migrations`).
pub fn newest_migration() -> i64 {
    idem_store_kit::migrate::newest(migrate::MIGRATIONS)
}

/// How many times one claim re-reads after a lost race (the record vanished between
/// the failed insert and the read, or a lost takeover compare-and-set).
const MAX_CLAIM_RERUNS: usize = 8;

/// How many times a call outside a transaction runs again after InnoDB refused it over a
/// lock (deadlock victim or lock wait timeout). Each run wrote nothing.
pub const LOCK_CONFLICT_RETRIES: u32 = 6;

/// Connection and behaviour settings for [`MysqlStore::connect`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MysqlOptions {
    pub limits: StoreLimits,
    pub clock: ClockShift,
    pub max_connections: u32,
    /// How long a call waits for a pooled connection before failing as `Unavailable`.
    pub acquire_timeout: Duration,
    /// `innodb_lock_wait_timeout` of the store's sessions (whole seconds, at least 1): a
    /// statement waiting longer for a row lock fails (and is retried, or answered as in
    /// progress inside a transaction) instead of queueing behind a stalled holder.
    pub lock_wait_timeout: Duration,
    /// Scopes remembered as holding a record (`idem_store_kit::recent`): a claim on one reads
    /// first. 0 turns the shortcut off.
    pub recent_capacity: usize,
}

impl Default for MysqlOptions {
    fn default() -> Self {
        Self {
            limits: StoreLimits::default(),
            clock: ClockShift::default(),
            max_connections: 10,
            acquire_timeout: Duration::from_secs(5),
            lock_wait_timeout: Duration::from_secs(5),
            recent_capacity: idem_store_kit::recent::DEFAULT_RECENT_CAPACITY,
        }
    }
}

/// `mariadb://` names the same protocol; sqlx knows only `mysql://`.
pub fn driver_url(url: &str) -> String {
    match url.strip_prefix("mariadb://") {
        Some(rest) => format!("mysql://{rest}"),
        None => url.to_string(),
    }
}

/// An `ssl-ca` the URL names must be readable: the driver would only fail at the first
/// connection, without the path.
fn check_ssl_ca(url: &str) -> Result<(), StoreError> {
    match idem_net::tls::unreadable_url_file(url, &["ssl-ca", "sslca"]) {
        Some((path, e)) => Err(StoreError::InvalidInput(format!(
            "reading the MySQL ssl-ca {path}: {e}"
        ))),
        None => Ok(()),
    }
}

/// Built once per store; each use clones an `Arc`, not the text.
fn shared(sql: String) -> SqlStr {
    AssertSqlSafe(Arc::<str>::from(sql)).into_sql_str()
}

struct Statements {
    claim_read: SqlStr,
    claim_fresh: SqlStr,
    take_over: SqlStr,
    finish: SqlStr,
    extend: SqlStr,
    insert_final: SqlStr,
    get: SqlStr,
}

impl Statements {
    fn new() -> Self {
        Self {
            claim_read: shared(sql::claim_read()),
            claim_fresh: shared(sql::claim_fresh()),
            take_over: shared(sql::take_over()),
            finish: shared(sql::finish()),
            extend: shared(sql::extend()),
            insert_final: shared(sql::insert_final()),
            get: shared(sql::get()),
        }
    }
}

/// Runs `$call`, a future using `$conn: &mut MySqlConnection`, on a pooled connection;
/// again on another one after an unavailable answer (while `try_another` allows), and
/// again after a lock conflict (up to [`LOCK_CONFLICT_RETRIES`]). Every call that is
/// safe to run twice goes through here.
macro_rules! on_pooled_connection {
    ($store:expr, |$conn:ident| $call:expr) => {{
        let mut tries = 0;
        let mut conflicts = 0;
        loop {
            let mut pooled = $store.acquire().await?;
            let $conn: &mut MySqlConnection = &mut pooled;
            match $call.await {
                Err(e) if e.is_unavailable() => {
                    pooled.close_on_drop();
                    if !$store.try_another(&e, &mut tries) {
                        break Err(e);
                    }
                }
                Err(e)
                    if error::is_mapped_lock_conflict(&e) && conflicts < LOCK_CONFLICT_RETRIES =>
                {
                    conflicts += 1;
                    $store.lock_conflicts.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(2 << conflicts)).await;
                }
                answer => break answer,
            }
        }
    }};
}

// After the macro, which it uses.
mod procedures;
pub use procedures::{
    ProcedureStore, SQLSTATE_INVALID_ARGUMENT, SQLSTATE_NOT_SETTLED, SQLSTATE_RESULT_TOO_LARGE,
    SQLSTATE_SUPERSEDED,
};

/// The MySQL / MariaDB idempotency store. Cheap to clone (the pool is shared).
#[derive(Clone)]
pub struct MysqlStore {
    pool: MySqlPool,
    limits: StoreLimits,
    clock: ClockShift,
    recent: Arc<RecentKeys>,
    /// The leases this store granted or ended, for the one-statement cycle.
    held: Arc<lease_cycle::Held>,
    sql: Arc<Statements>,
    reruns: Arc<AtomicU64>,
    retries: Arc<AtomicU64>,
    lock_conflicts: Arc<AtomicU64>,
}

impl std::fmt::Debug for MysqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlStore")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl MysqlStore {
    /// Connects a pool to `url` (`mysql://` or `mariadb://`; does not migrate: call
    /// [`MysqlStore::migrate`]). `ssl-mode=DISABLED|PREFERRED|REQUIRED|VERIFY_CA|
    /// VERIFY_IDENTITY` and `ssl-ca=PATH` in the query choose TLS.
    pub async fn connect(url: &str, options: MysqlOptions) -> Result<Self, StoreError> {
        check_ssl_ca(url)?;
        let connect = MySqlConnectOptions::from_str(&driver_url(url))
            .map_err(|e| StoreError::InvalidInput(format!("mysql url: {e}")))?
            .timezone(Some("+00:00".to_string()));
        let wait = options.lock_wait_timeout.as_secs().max(1);
        let pool = MySqlPoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .acquire_timeout(options.acquire_timeout)
            // No ping per checkout (it doubles every call's round trips); a session that
            // died while idle fails its first statement and the call tries another.
            .test_before_acquire(false)
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    conn.execute(AssertSqlSafe(format!(
                        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; \
                         SET SESSION innodb_lock_wait_timeout = {wait}"
                    )))
                    .await?;
                    Ok(())
                })
            })
            .connect_with(connect)
            .await
            .map_err(|e| error::map_err("connect", e))?;
        Ok(Self::from_pool(pool, options))
    }

    /// Wraps an existing pool. Its sessions must run READ COMMITTED (see the crate docs);
    /// only `limits`, `clock` and `recent_capacity` of `options` apply.
    pub fn from_pool(pool: MySqlPool, options: MysqlOptions) -> Self {
        Self {
            pool,
            limits: options.limits,
            clock: options.clock,
            recent: Arc::new(RecentKeys::new(options.recent_capacity)),
            held: Arc::default(),
            sql: Arc::new(Statements::new()),
            reruns: Arc::new(AtomicU64::new(0)),
            retries: Arc::new(AtomicU64::new(0)),
            lock_conflicts: Arc::new(AtomicU64::new(0)),
        }
    }

    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// How many times claims re-read after a lost race. A contention gauge.
    pub fn claim_reruns(&self) -> u64 {
        self.reruns.load(Ordering::Relaxed)
    }

    /// How many calls were tried again on another connection after theirs failed.
    pub fn connection_retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// How many statements InnoDB refused over a lock (1213, 1205): calls outside a
    /// transaction ran again, calls inside one answered in progress or "taken".
    pub fn lock_conflicts(&self) -> u64 {
        self.lock_conflicts.load(Ordering::Relaxed)
    }

    /// Applies pending migrations. Safe to run twice and from several processes at once.
    /// Returns the versions it applied.
    pub async fn migrate(&self) -> Result<Vec<i64>, StoreError> {
        let mut conn = self.acquire().await?;
        migrate::run(&mut conn).await
    }

    async fn acquire(&self) -> Result<sqlx::pool::PoolConnection<sqlx::MySql>, StoreError> {
        self.pool
            .acquire()
            .await
            .map_err(|e| error::map_err("acquire", e))
    }

    /// Counts a failed try and says whether another is allowed: one per pooled
    /// connection, plus the first.
    pub(crate) fn try_another(&self, err: &dyn std::fmt::Display, tries: &mut u32) -> bool {
        *tries += 1;
        if *tries > self.pool.options().get_max_connections() {
            return false;
        }
        tracing::debug!(error = %err, "mysql connection failed; trying another");
        self.retries.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Claims inside the caller's transaction (`conn` is typically `&mut *tx`; its
    /// session must run READ COMMITTED, as the store's pool does). The fresh record is
    /// visible to others when the caller commits; a concurrent duplicate waits on the
    /// primary key meanwhile, then replays (or proceeds after a rollback). A lock
    /// conflict (a lock wait timeout, or this transaction chosen as a deadlock victim and
    /// rolled back) is answered as in progress. After an error or that answer, roll back.
    pub async fn claim_in_tx(
        &self,
        conn: &mut MySqlConnection,
        req: &ClaimRequest,
    ) -> Result<Claim, StoreError> {
        self.limits.check_claim(req)?;
        let answer = self.claim_on(conn, req, true).await;
        self.lock_conflict_in_tx(req, answer)
    }

    /// A claim inside a transaction that InnoDB refused over a lock (a lock wait timeout,
    /// or a deadlock victim whose transaction was rolled back) is answered as in progress:
    /// another request holds the key.
    pub(crate) fn lock_conflict_in_tx(
        &self,
        req: &ClaimRequest,
        answer: Result<Claim, StoreError>,
    ) -> Result<Claim, StoreError> {
        match answer {
            Err(e) if error::is_mapped_lock_conflict(&e) => {
                self.lock_conflicts.fetch_add(1, Ordering::Relaxed);
                let now = idem_core::retention::millis(
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default(),
                );
                tracing::info!(scope = %req.scope, error = %e, "claim in transaction refused over a lock");
                Ok(Claim::InProgress {
                    owner: None,
                    lease_expires_at: now,
                    now,
                })
            }
            other => other,
        }
    }

    /// The one-commit create's record: `req`'s key written once, already final, inside
    /// the caller's transaction. `None` when the key has a record (or the insert was
    /// refused over a lock): nothing was written, roll the business rows back and claim
    /// the key instead.
    pub async fn insert_final_in_tx(
        &self,
        conn: &mut MySqlConnection,
        req: &ClaimRequest,
        finish: Finish,
    ) -> Result<Option<Record>, StoreError> {
        self.limits.check_final(req, &finish)?;
        let result = finish.result.as_ref();
        let headers = result.map(|r| idem_store_kit::row::headers_json(&r.headers));
        let shift = self.clock.millis();
        let done = sqlx::query(self.sql.insert_final.clone())
            .bind(req.scope.tenant.as_str())
            .bind(req.scope.key.as_str())
            .bind(req.principal.as_str())
            .bind(req.fingerprint.as_bytes().as_slice())
            .bind(finish.state.as_str())
            .bind(req.owner.as_str())
            .bind(shift)
            .bind(shift)
            .bind(shift)
            .bind(result.map(|r| i32::from(r.status)))
            .bind(headers.as_deref())
            .bind(result.map(|r| r.body.as_slice()))
            .bind(result.and_then(|r| r.result_ref.as_deref()))
            .execute(&mut *conn)
            .await;
        match done {
            Ok(done) => {
                self.recent.note(&req.scope);
                let at = i64::try_from(done.last_insert_id()).unwrap_or(i64::MAX);
                Ok(Some(idem_core::store::final_record(req, finish, at)))
            }
            Err(e) if error::error_number(&e) == Some(error::DUP_ENTRY) => Ok(None),
            Err(e) if error::is_lock_conflict(&e) => {
                self.lock_conflicts.fetch_add(1, Ordering::Relaxed);
                Ok(None)
            }
            Err(e) => Err(error::map_err("insert_final", e)),
        }
    }

    /// Finishes inside the caller's transaction. A lost compare-and-set returns
    /// `Superseded`: roll the business write back.
    pub async fn finish_in_tx(
        &self,
        conn: &mut MySqlConnection,
        token: &ClaimToken,
        finish: Finish,
    ) -> Result<Record, StoreError> {
        self.finish_on(conn, token, finish).await
    }

    async fn claim_on(
        &self,
        conn: &mut MySqlConnection,
        req: &ClaimRequest,
        in_tx: bool,
    ) -> Result<Claim, StoreError> {
        let lease_ms = self.limits.claim_lease(req)?;
        // In a transaction, read first: a failed insert would leave a shared lock on the
        // existing row until the caller commits, and two such callers upgrading it for a
        // takeover deadlock. Outside one the insert's lock ends with its statement.
        let mut read_first = in_tx || self.recent.contains(&req.scope);
        for run in 0..MAX_CLAIM_RERUNS {
            if run > 0 {
                self.reruns.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(scope = %req.scope, run, "claim re-run");
            }
            let mut existing = None;
            if read_first {
                existing = self.read_existing(conn, req).await?;
                if existing.is_none() {
                    self.recent.forget(&req.scope);
                }
            }
            let (rec, now) = match existing {
                Some(found) => found,
                None => match self.insert_fresh(conn, req, lease_ms).await? {
                    Some(token) => return Ok(Claim::Proceed(token)),
                    None => {
                        read_first = true;
                        match self.read_existing(conn, req).await? {
                            Some(found) => found,
                            // Gone between the insert and the read: start again.
                            None => continue,
                        }
                    }
                },
            };
            self.recent.note(&req.scope);
            match verdict(rec, req, now) {
                Verdict::Answer(claim) => return Ok(claim),
                Verdict::TakeOver { existing, kind } => {
                    if let Some(tok) = self.take_over(conn, req, lease_ms, &existing, kind).await? {
                        return Ok(Claim::Proceed(tok));
                    }
                    read_first = true;
                }
            }
        }
        Err(StoreError::Unavailable(format!(
            "claim on {} did not settle after {MAX_CLAIM_RERUNS} runs; retry",
            req.scope
        )))
    }

    /// The fresh record; `None` when the key has one (ER_DUP_ENTRY, after waiting for an
    /// uncommitted one to commit).
    async fn insert_fresh(
        &self,
        conn: &mut MySqlConnection,
        req: &ClaimRequest,
        lease_ms: i64,
    ) -> Result<Option<ClaimToken>, StoreError> {
        let shift = self.clock.millis();
        let done = sqlx::query(self.sql.claim_fresh.clone())
            .bind(req.scope.tenant.as_str())
            .bind(req.scope.key.as_str())
            .bind(req.principal.as_str())
            .bind(req.fingerprint.as_bytes().as_slice())
            .bind(req.owner.as_str())
            .bind(shift)
            .bind(lease_ms)
            .bind(shift)
            .bind(shift)
            .execute(&mut *conn)
            .await;
        match done {
            Ok(done) => {
                let lease = i64::try_from(done.last_insert_id()).unwrap_or(i64::MAX);
                // One `NOW(3)` per statement: the record was created `lease_ms` before
                // its deadline.
                Ok(Some(
                    ClaimToken::of(req, 1, lease, 1, ClaimKind::Fresh)
                        .with_written(kept::keep(req, lease - lease_ms)),
                ))
            }
            Err(e) if error::error_number(&e) == Some(error::DUP_ENTRY) => Ok(None),
            Err(e) => Err(error::map_err("claim", e)),
        }
    }

    /// The existing record and the store time, in one plain read; `None` when absent.
    async fn read_existing(
        &self,
        conn: &mut MySqlConnection,
        req: &ClaimRequest,
    ) -> Result<Option<(Record, Millis)>, StoreError> {
        let row = sqlx::query(self.sql.claim_read.clone())
            .bind(self.clock.millis())
            .bind(req.scope.tenant.as_str())
            .bind(req.scope.key.as_str())
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| error::map_err("claim", e))?;
        match row {
            None => Ok(None),
            Some(row) => {
                let now: i64 = row::get(&row, "now_ms")?;
                Ok(Some((row::record(&row)?, now)))
            }
        }
    }

    /// Takeover compare-and-set on the version `decide` looked at. `None`: lost.
    async fn take_over(
        &self,
        conn: &mut MySqlConnection,
        req: &ClaimRequest,
        lease_ms: i64,
        seen: &Record,
        kind: ClaimKind,
    ) -> Result<Option<ClaimToken>, StoreError> {
        let shift = self.clock.millis();
        let done = sqlx::query(self.sql.take_over.clone())
            .bind(req.owner.as_str())
            .bind(shift)
            .bind(lease_ms)
            .bind(shift)
            .bind(req.scope.tenant.as_str())
            .bind(req.scope.key.as_str())
            .bind(seen.version)
            .bind(req.principal.as_str())
            .bind(req.fingerprint.as_bytes().as_slice())
            .bind(shift)
            .execute(&mut *conn)
            .await
            .map_err(|e| error::map_err("claim", e))?;
        if done.rows_affected() != 1 {
            return Ok(None);
        }
        let lease = i64::try_from(done.last_insert_id()).unwrap_or(i64::MAX);
        let version = seen.version + 1;
        tracing::debug!(scope = %req.scope, owner = %req.owner, version, ?kind, "takeover");
        Ok(Some(
            ClaimToken::of(req, version, lease, seen.attempts + 1, kind)
                .with_written(kept::keep(req, seen.created_at)),
        ))
    }

    async fn finish_on(
        &self,
        conn: &mut MySqlConnection,
        token: &ClaimToken,
        finish: Finish,
    ) -> Result<Record, StoreError> {
        self.limits.check_finish(&finish)?;
        let result = finish.result.as_ref();
        let headers = result.map(|r| idem_store_kit::row::headers_json(&r.headers));
        let shift = self.clock.millis();
        let done = sqlx::query(self.sql.finish.clone())
            .bind(finish.state.as_str())
            .bind(shift)
            .bind(finish.state.is_terminal())
            .bind(shift)
            .bind(result.map(|r| i32::from(r.status)))
            .bind(headers.as_deref())
            .bind(result.map(|r| r.body.as_slice()))
            .bind(result.and_then(|r| r.result_ref.as_deref()))
            .bind(token.scope.tenant.as_str())
            .bind(token.scope.key.as_str())
            .bind(token.version)
            .bind(token.owner.as_str())
            .execute(&mut *conn)
            .await
            .map_err(|e| error::map_err("finish", e))?;
        if done.rows_affected() == 1 {
            self.recent.note(&token.scope);
            let at = i64::try_from(done.last_insert_id()).unwrap_or(i64::MAX);
            let (principal, fingerprint, created_at) = match kept::kept(token) {
                Some(kept) => kept,
                None => self.finished_read(conn, token).await?,
            };
            return Ok(Record {
                tenant: token.scope.tenant.clone(),
                key: token.scope.key.clone(),
                principal,
                fingerprint,
                state: finish.state,
                version: token.version + 1,
                owner: Some(token.owner.clone()),
                lease_expires_at: None,
                result: finish.result,
                attempts: token.attempt,
                created_at,
                updated_at: at,
                completed_at: finish.state.is_terminal().then_some(at),
            });
        }
        // Nothing matched. A retry of a finish whose answer was lost: this very token
        // already moved the record to exactly this outcome. Answer as the first time.
        let current = sqlx::query(self.sql.get.clone())
            .bind(token.scope.tenant.as_str())
            .bind(token.scope.key.as_str())
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| error::map_err("finish", e))?;
        if let Some(rec) = current.as_ref().map(row::record).transpose()? {
            if rec.version == token.version + 1
                && rec.owner.as_ref() == Some(&token.owner)
                && rec.state == finish.state
                && rec.result == finish.result
            {
                return Ok(rec);
            }
        }
        Err(StoreError::superseded(token))
    }

    /// What a finish cannot rebuild from a token that kept nothing (one deserialized, or
    /// from another process). Principal, fingerprint and creation time never change while
    /// the row exists (a takeover must match the first two), so reading them after the
    /// compare-and-set reads this record's.
    async fn finished_read(
        &self,
        conn: &mut MySqlConnection,
        token: &ClaimToken,
    ) -> Result<(Principal, Fingerprint, Millis), StoreError> {
        let row = sqlx::query(sql::FINISHED_READ)
            .bind(token.scope.tenant.as_str())
            .bind(token.scope.key.as_str())
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| error::map_err("finish", e))?
            .ok_or_else(|| {
                StoreError::Backend(format!(
                    "mysql finish: {} was removed right after it finished",
                    token.scope
                ))
            })?;
        Ok((
            idem_store_kit::row::principal(row::get(&row, "principal")?)?,
            idem_store_kit::row::fingerprint(row::get(&row, "fingerprint")?)?,
            row::get(&row, "created_at")?,
        ))
    }

    async fn extend_on(
        &self,
        conn: &mut MySqlConnection,
        token: &ClaimToken,
        lease_ms: Millis,
    ) -> Result<Millis, StoreError> {
        let shift = self.clock.millis();
        let done = sqlx::query(self.sql.extend.clone())
            .bind(shift)
            .bind(lease_ms)
            .bind(shift)
            .bind(token.scope.tenant.as_str())
            .bind(token.scope.key.as_str())
            .bind(token.version)
            .bind(token.owner.as_str())
            .execute(&mut *conn)
            .await
            .map_err(|e| error::map_err("extend_lease", e))?;
        if done.rows_affected() != 1 {
            return Err(StoreError::superseded(token));
        }
        Ok(i64::try_from(done.last_insert_id()).unwrap_or(i64::MAX))
    }
}

#[async_trait]
impl IdempotencyStore for MysqlStore {
    fn backend(&self) -> &'static str {
        "mysql"
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        // Validate before taking a connection: bad input must not wait on the pool.
        self.limits.check_claim(req)?;
        on_pooled_connection!(self, |conn| self.claim_on(conn, req, false))
    }

    async fn finish(&self, token: &ClaimToken, finish: Finish) -> Result<Record, StoreError> {
        self.limits.check_finish(&finish)?;
        on_pooled_connection!(self, |conn| self.finish_on(conn, token, finish.clone()))
    }

    async fn extend_lease(
        &self,
        token: &ClaimToken,
        lease: Duration,
    ) -> Result<Millis, StoreError> {
        let lease_ms = lease_millis(lease)?;
        on_pooled_connection!(self, |conn| self.extend_on(conn, token, lease_ms))
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        let row = on_pooled_connection!(self, |conn| async {
            sqlx::query(self.sql.get.clone())
                .bind(scope.tenant.as_str())
                .bind(scope.key.as_str())
                .fetch_optional(&mut *conn)
                .await
                .map_err(|e| error::map_err("get", e))
        })?;
        row.as_ref().map(row::record).transpose()
    }

    async fn unique_guard(&self) -> Result<bool, StoreError> {
        let guards: i64 = on_pooled_connection!(self, |conn| async {
            sqlx::query_scalar(sql::GUARD)
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| error::map_err("unique_guard", e))
        })?;
        Ok(guards > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mariadb_urls_reach_the_mysql_driver() {
        assert_eq!(driver_url("mariadb://u@h/db"), "mysql://u@h/db");
        assert_eq!(driver_url("mysql://u@h/db"), "mysql://u@h/db");
    }

    #[test]
    fn an_unreadable_ssl_ca_is_named() {
        let err = check_ssl_ca("mysql://h/db?ssl-mode=VERIFY_CA&ssl-ca=/nonexistent/ca%2Epem")
            .unwrap_err();
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
        assert!(check_ssl_ca("mysql://h/db").is_ok());
    }
}
