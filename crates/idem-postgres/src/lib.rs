//! idem-postgres: the authoritative idem store on PostgreSQL.
//!
//! # What this crate owns
//! - The `idem_records` table (in a schema of its choosing), its UNIQUE guard
//!   `idem_records_scope_uq` on `(tenant_id, key)`, and the versioned migrations recorded
//!   in `idem_schema_migrations` ([`PgStore::migrate`]).
//! - [`PgStore`], an [`IdempotencyStore`]: a claim is one statement that inserts a fresh
//!   PROCESSING record or returns the existing one (one round trip for fresh, replay, in
//!   progress and mismatch; a scope this store saw finished lately is read first with a
//!   plain SELECT, see [`idem_store_kit::recent`]); [`idem_core::decide`] reads the existing
//!   record, and a
//!   takeover (FAILED_RETRYABLE, or PROCESSING past its lease) is a compare-and-set on
//!   the version it read. Finish and heartbeat are compare-and-sets on
//!   `(version, owner, state = PROCESSING)`.
//! - The transactional form ([`PgStore::claim_in_tx`], [`PgStore::finish_in_tx`]) for a
//!   service whose business rows live in the same database: the record commits or rolls
//!   back together with the business write (docs/DESIGN.md: two layers, commit costs).
//! - The same key-state machine as SQL functions (`idem_claim`, `idem_finish`,
//!   `idem_heartbeat`, migration 11) for services in any language, and [`FunctionStore`],
//!   the Rust client of them (docs/SQL-API.md).
//!
//! # What it must not do
//! - Read time from the caller: every deadline comes from the database clock
//!   (`clock_timestamp()`), shifted only by [`ClockShift`] in tests.
//! - Write on the strength of a value it read earlier without re-checking it: every
//!   transition is a single statement guarded by the version it read (a lost
//!   compare-and-set changes nothing and the claim reads again).
//! - Answer "proceed" without a record written, or when it cannot tell: errors are
//!   returned (`Unavailable` for connection trouble, `Backend` otherwise), never guessed.
//! - Delete or sweep records (retention is a separate job), partition the table, or
//!   touch tables other than its own.

mod error;
mod fence;
mod lease;
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
    Claim, ClaimKind, ClaimRequest, ClaimToken, ClockShift, Finish, IdempotencyStore, Millis,
    Record, Scope, StoreError, StoreLimits,
};
use idem_store_kit::RecentKeys;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{PgConnection, Row};

pub use error::{is_unavailable, map_err};

/// The newest schema version this build knows (`idem_schema_migrations`).
pub fn newest_migration() -> i64 {
    idem_store_kit::migrate::newest(migrate::MIGRATIONS)
}
pub use lease::*;

/// How many times one claim re-runs its deciding statement after an empty answer (the
/// READ COMMITTED pitfall) or a lost takeover compare-and-set. Each re-run sees a newer
/// snapshot; more than a couple means the key is being deleted and re-created in a loop.
const MAX_CLAIM_RERUNS: usize = 8;

/// Connection and behaviour settings for [`PgStore::connect`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PgOptions {
    /// Schema holding the tables. Created by [`PgStore::migrate`] if missing, selected
    /// with `search_path` on every pooled connection, and used to qualify the store's
    /// statements. `None`: the connection's own `search_path` decides.
    pub schema: Option<String>,
    pub limits: StoreLimits,
    pub clock: ClockShift,
    pub max_connections: u32,
    /// How long a call waits for a pooled connection before failing as `Unavailable`.
    pub acquire_timeout: Duration,
    /// `application_name` of the store's sessions (visible in `pg_stat_activity`).
    pub application_name: String,
    /// `lock_timeout` of the store's sessions: a statement waiting longer for a row lock
    /// fails instead of queueing behind a stalled holder. `None`: the server's setting.
    pub lock_timeout: Option<Duration>,
    /// `idle_in_transaction_session_timeout`: the server ends a session whose client
    /// left a transaction open this long (a paused or wedged process), releasing its
    /// locks. `None`: the server's setting.
    pub idle_in_transaction_timeout: Option<Duration>,
    /// How a claim reaches the database. Off (the default): one statement inserts a
    /// fresh record or returns the existing one, so fresh keys, replays, in-progress and
    /// mismatch answers all cost one round trip. On: a plain `INSERT … ON CONFLICT DO
    /// NOTHING` first, and a separate read only when the key exists (fresh keys one
    /// plain statement, existing keys two round trips). Takeovers are a separate
    /// compare-and-set either way.
    pub fresh_fast_path: bool,
    /// Scopes remembered as holding a record (`idem_store_kit::recent`): a claim on one of
    /// them reads first with a plain SELECT and decides from it (a takeover is still its
    /// compare-and-set); when the record is gone it runs the one-statement claim. 0
    /// turns the shortcut off.
    pub recent_capacity: usize,
}

impl Default for PgOptions {
    fn default() -> Self {
        Self {
            schema: None,
            limits: StoreLimits::default(),
            clock: ClockShift::default(),
            max_connections: 10,
            acquire_timeout: Duration::from_secs(5),
            application_name: "idem".to_string(),
            lock_timeout: None,
            idle_in_transaction_timeout: None,
            fresh_fast_path: false,
            recent_capacity: idem_store_kit::recent::DEFAULT_RECENT_CAPACITY,
        }
    }
}

/// A `sslrootcert` the URL names must be readable: the driver would only say "No such
/// file or directory" at the first connection, without the path.
fn check_root_cert(url: &str) -> Result<(), StoreError> {
    match idem_net::tls::unreadable_url_file(url, &["sslrootcert"]) {
        Some((path, e)) => Err(StoreError::InvalidInput(format!(
            "reading the PostgreSQL sslrootcert {path}: {e}"
        ))),
        None => Ok(()),
    }
}

/// Schema names are spliced into DDL and `search_path`, so only plain lower-case
/// identifiers are accepted (no quoting games, no case folding surprises).
fn validate_schema(name: &str) -> Result<(), StoreError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !name.starts_with("pg_");
    if ok {
        Ok(())
    } else {
        Err(StoreError::InvalidInput(format!(
            "schema name {name:?} must match [a-z_][a-z0-9_]{{0,62}} and not start with pg_"
        )))
    }
}

/// Runs `$call`, a future using `$conn: &mut PgConnection`, on a pooled connection; after
/// an unavailable answer, again on another one while `PgStore::once_more` allows. Every
/// store call that is safe to run twice goes through here.
macro_rules! on_pooled_connection {
    ($store:expr, |$conn:ident| $call:expr) => {{
        let mut tries = 0;
        loop {
            let mut pooled = $store.acquire().await?;
            let $conn: &mut PgConnection = &mut pooled;
            match $call.await {
                Err(e) if e.is_unavailable() && $store.once_more(pooled, &e, &mut tries) => {}
                answer => break answer,
            }
        }
    }};
}

// After the macro, which it uses.
mod functions;
pub use functions::{
    FunctionStore, SQLSTATE_INVALID_ARGUMENT, SQLSTATE_NOT_SETTLED, SQLSTATE_RESULT_TOO_LARGE,
    SQLSTATE_SUPERSEDED,
};

/// The PostgreSQL idempotency store. Cheap to clone (the pool is shared).
#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
    schema: Option<String>,
    limits: StoreLimits,
    clock: ClockShift,
    fresh_fast_path: bool,
    recent: Arc<RecentKeys>,
    sql: Arc<sql::Statements>,
    reruns: Arc<AtomicU64>,
    retries: Arc<AtomicU64>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("schema", &self.schema)
            .field("limits", &self.limits)
            .field("fresh_fast_path", &self.fresh_fast_path)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connects a pool to `url` (does not migrate: call [`PgStore::migrate`]).
    pub async fn connect(url: &str, options: PgOptions) -> Result<Self, StoreError> {
        if let Some(s) = &options.schema {
            validate_schema(s)?;
        }
        check_root_cert(url)?;
        let mut connect = PgConnectOptions::from_str(url)
            .map_err(|e| StoreError::InvalidInput(format!("postgres url: {e}")))?
            .application_name(&options.application_name);
        let mut settings: Vec<(&str, String)> = Vec::new();
        if let Some(s) = &options.schema {
            settings.push(("search_path", s.clone()));
        }
        if let Some(t) = options.lock_timeout {
            settings.push(("lock_timeout", format!("{}ms", t.as_millis().max(1))));
        }
        if let Some(t) = options.idle_in_transaction_timeout {
            settings.push((
                "idle_in_transaction_session_timeout",
                format!("{}ms", t.as_millis().max(1)),
            ));
        }
        if !settings.is_empty() {
            connect = connect.options(settings.iter().map(|(k, v)| (*k, v.as_str())));
        }
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .acquire_timeout(options.acquire_timeout)
            // No ping per checkout: it doubled the round trips of every call. A backend
            // that died while idle fails its first statement instead, and the calls safe
            // to run twice try another connection (`on_pooled_connection!`).
            .test_before_acquire(false)
            .connect_with(connect)
            .await
            .map_err(|e| error::map_err("connect", e))?;
        Self::from_pool(pool, options)
    }

    /// Wraps an existing pool (for example the service's own). Only `schema`, `limits`,
    /// `clock` and `fresh_fast_path` of `options` apply; the pool's own settings stay.
    /// With a schema the statements are schema-qualified, so the pool's `search_path`
    /// does not matter.
    pub fn from_pool(pool: PgPool, options: PgOptions) -> Result<Self, StoreError> {
        if let Some(s) = &options.schema {
            validate_schema(s)?;
        }
        Ok(Self {
            pool,
            sql: Arc::new(sql::Statements::new(options.schema.as_deref())),
            schema: options.schema,
            limits: options.limits,
            clock: options.clock,
            fresh_fast_path: options.fresh_fast_path,
            recent: Arc::new(RecentKeys::new(options.recent_capacity)),
            reruns: Arc::new(AtomicU64::new(0)),
            retries: Arc::new(AtomicU64::new(0)),
        })
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// The (possibly schema-qualified) name of the records table, for operator SQL.
    pub fn table(&self) -> &str {
        &self.sql.table
    }

    /// How many times claims re-ran their deciding statement (empty answer under the
    /// READ COMMITTED pitfall, or a lost takeover CAS). A contention gauge.
    pub fn claim_reruns(&self) -> u64 {
        self.reruns.load(Ordering::Relaxed)
    }

    /// How many calls (claims, finishes, heartbeats, reads, lease calls) were tried again
    /// on another connection after theirs failed (a backend that died while idle).
    pub fn connection_retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// Applies pending migrations (creating the schema if given and missing). Safe to run
    /// twice and from several processes at once. Returns the versions it applied.
    pub async fn migrate(&self) -> Result<Vec<i64>, StoreError> {
        let mut conn = self.acquire().await?;
        migrate::run(&mut conn, self.schema.as_deref()).await
    }

    async fn acquire(&self) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>, StoreError> {
        self.pool
            .acquire()
            .await
            .map_err(|e| error::map_err("acquire", e))
    }

    /// After a statement failed as unavailable: closes its connection and says whether to
    /// try again on another one. The pool does not ping before use, so after a server
    /// restart every idle connection is dead and fails its first statement quickly; up to
    /// one try per pooled connection, plus one, finds a live or new one. A store that
    /// cannot be reached fails in `acquire`, which is not retried. Safe for claim, finish
    /// and heartbeat: re-running a claim whose first run committed finds this caller's
    /// own PROCESSING record and answers in progress (never a second execution); a
    /// finish or heartbeat that committed is answered as the first time; reads are reads.
    fn once_more(
        &self,
        mut conn: sqlx::pool::PoolConnection<sqlx::Postgres>,
        err: &StoreError,
        tries: &mut u32,
    ) -> bool {
        conn.close_on_drop();
        self.try_another(err, tries)
    }

    /// Counts a failed try and says whether another is allowed: one per pooled
    /// connection, plus the first. Shared by the record and lease calls.
    pub(crate) fn try_another(&self, err: &dyn std::fmt::Display, tries: &mut u32) -> bool {
        *tries += 1;
        if *tries > self.pool.options().get_max_connections() {
            return false;
        }
        tracing::debug!(error = %err, "postgres connection failed; trying another");
        self.retries.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Claims inside the caller's transaction (`conn` is typically `&mut *tx`). The fresh
    /// record is visible to others only when the caller commits; a concurrent duplicate
    /// waits on the unique index meanwhile, then replays (or proceeds after a rollback).
    /// If this returns an error the transaction may be aborted: roll it back.
    pub async fn claim_in_tx(
        &self,
        conn: &mut PgConnection,
        req: &ClaimRequest,
    ) -> Result<Claim, StoreError> {
        match self.claim_on(conn, req).await {
            // Waited on a duplicate's uncommitted record past the session's
            // `lock_timeout`: that request is still in progress.
            Err(e) if crate::error::is_lock_timeout(&e) => {
                let now = idem_core::retention::millis(
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default(),
                );
                tracing::info!(scope = %req.scope, "claim in transaction waited past the lock timeout");
                Ok(Claim::InProgress {
                    owner: None,
                    lease_expires_at: now,
                    now,
                })
            }
            other => other,
        }
    }

    /// The one-commit create's record: `req`'s key written once, already final
    /// (`finish` must be SUCCEEDED or FAILED_TERMINAL), inside the caller's transaction.
    /// `None` when the key has a record (or a duplicate's uncommitted one outlived the
    /// session's `lock_timeout`): nothing was written, roll the business rows back and
    /// claim the key instead.
    pub async fn insert_final_in_tx(
        &self,
        conn: &mut PgConnection,
        req: &ClaimRequest,
        finish: Finish,
    ) -> Result<Option<Record>, StoreError> {
        self.limits.check_final(req, &finish)?;
        let result = finish.result.as_ref();
        let headers = result.map(|r| idem_store_kit::row::headers_json(&r.headers));
        let created: Option<i64> = match sqlx::query_scalar(self.sql.insert_final.clone())
            .bind(req.scope.tenant.as_str())
            .bind(req.scope.key.as_str())
            .bind(req.principal.as_str())
            .bind(req.fingerprint.as_bytes().as_slice())
            .bind(finish.state.as_str())
            .bind(req.owner.as_str())
            .bind(result.map(|r| i32::from(r.status)))
            .bind(headers.as_deref())
            .bind(result.map(|r| r.body.as_slice()))
            .bind(result.and_then(|r| r.result_ref.as_deref()))
            .bind(self.clock.millis())
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| error::map_err("insert_final", e))
        {
            Ok(created) => created,
            Err(e) if error::is_lock_timeout(&e) => None,
            Err(e) => return Err(e),
        };
        Ok(created.map(|at| {
            self.recent.note(&req.scope);
            idem_core::store::final_record(req, finish, at)
        }))
    }

    /// Finishes inside the caller's transaction, so the completion commits with the
    /// business write. A lost compare-and-set returns `Superseded`: the caller must roll
    /// back its business write.
    pub async fn finish_in_tx(
        &self,
        conn: &mut PgConnection,
        token: &ClaimToken,
        finish: Finish,
    ) -> Result<Record, StoreError> {
        self.finish_on(conn, token, finish).await
    }

    async fn claim_on(
        &self,
        conn: &mut PgConnection,
        req: &ClaimRequest,
    ) -> Result<Claim, StoreError> {
        let lease_ms = self.limits.claim_lease(req)?;
        for run in 0..MAX_CLAIM_RERUNS {
            if run > 0 {
                self.reruns.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(scope = %req.scope, run, "claim statement re-run");
            }
            let answer = if run == 0 && self.recent.contains(&req.scope) {
                match self.read_existing(conn, req).await? {
                    Some(existing) => Some(existing),
                    None => {
                        self.recent.forget(&req.scope);
                        self.read_or_insert(conn, req, lease_ms).await?
                    }
                }
            } else if self.fresh_fast_path {
                self.insert_then_read(conn, req, lease_ms).await?
            } else {
                self.read_or_insert(conn, req, lease_ms).await?
            };
            let (rec, now) = match answer {
                // Empty answer (the READ COMMITTED pitfall, or the record vanished
                // between two statements): run again with a new snapshot.
                None => continue,
                Some(row::ClaimRow::Fresh(version, lease, attempt)) => {
                    let token = ClaimToken::of(req, version, lease, attempt, ClaimKind::Fresh);
                    return Ok(Claim::Proceed(token));
                }
                Some(row::ClaimRow::Existing(rec, now)) => {
                    self.recent.note(&req.scope);
                    (rec, now)
                }
            };
            match verdict(rec, req, now) {
                Verdict::Answer(claim) => return Ok(claim),
                Verdict::TakeOver { existing, kind } => {
                    if let Some(tok) = self
                        .take_over(conn, req, lease_ms, existing.version, kind)
                        .await?
                    {
                        return Ok(Claim::Proceed(tok));
                    }
                    // Lost the compare-and-set: another caller moved the record
                    // first. Re-read in a new statement.
                }
            }
        }
        // Never guess: without a decided row there is no claim.
        Err(StoreError::Unavailable(format!(
            "claim on {} did not settle after {MAX_CLAIM_RERUNS} runs; retry",
            req.scope
        )))
    }

    /// One statement: returns the existing record or inserts a fresh one. `None` is the
    /// READ COMMITTED empty answer (see `sql::Statements::claim`).
    async fn read_or_insert(
        &self,
        conn: &mut PgConnection,
        req: &ClaimRequest,
        lease_ms: i64,
    ) -> Result<Option<row::ClaimRow>, StoreError> {
        let row = sqlx::query(self.sql.claim.clone())
            .bind(req.scope.tenant.as_str())
            .bind(req.scope.key.as_str())
            .bind(req.principal.as_str())
            .bind(req.fingerprint.as_bytes().as_slice())
            .bind(req.owner.as_str())
            .bind(lease_ms)
            .bind(self.clock.millis())
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| error::map_err("claim", e))?;
        row.map(|row| row::claim_row(&row, &req.scope.tenant, &req.scope.key))
            .transpose()
    }

    /// Two statements when the key exists: a plain insert, then a read in a new
    /// snapshot (which sees the committed conflicting row: the insert waited for it).
    async fn insert_then_read(
        &self,
        conn: &mut PgConnection,
        req: &ClaimRequest,
        lease_ms: i64,
    ) -> Result<Option<row::ClaimRow>, StoreError> {
        let row = sqlx::query(self.sql.claim_fresh.clone())
            .bind(req.scope.tenant.as_str())
            .bind(req.scope.key.as_str())
            .bind(req.principal.as_str())
            .bind(req.fingerprint.as_bytes().as_slice())
            .bind(req.owner.as_str())
            .bind(lease_ms)
            .bind(self.clock.millis())
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| error::map_err("claim", e))?;
        if let Some(row) = row {
            return Ok(Some(row::ClaimRow::Fresh(
                row.try_get(0).map_err(decode)?,
                row.try_get(1).map_err(decode)?,
                row.try_get(2).map_err(decode)?,
            )));
        }
        self.read_existing(conn, req).await
    }

    /// The existing record and the store time, in one plain read; `None` when absent.
    async fn read_existing(
        &self,
        conn: &mut PgConnection,
        req: &ClaimRequest,
    ) -> Result<Option<row::ClaimRow>, StoreError> {
        let row = sqlx::query(self.sql.claim_read.clone())
            .bind(req.scope.tenant.as_str())
            .bind(req.scope.key.as_str())
            .bind(self.clock.millis())
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| error::map_err("claim", e))?;
        row.map(|row| row::claim_row(&row, &req.scope.tenant, &req.scope.key))
            .transpose()
    }

    /// Takeover compare-and-set on the version `decide` looked at. `None`: lost.
    async fn take_over(
        &self,
        conn: &mut PgConnection,
        req: &ClaimRequest,
        lease_ms: i64,
        seen_version: i64,
        kind: ClaimKind,
    ) -> Result<Option<ClaimToken>, StoreError> {
        let row = sqlx::query(self.sql.take_over.clone())
            .bind(req.scope.tenant.as_str())
            .bind(req.scope.key.as_str())
            .bind(req.principal.as_str())
            .bind(req.fingerprint.as_bytes().as_slice())
            .bind(req.owner.as_str())
            .bind(lease_ms)
            .bind(self.clock.millis())
            .bind(seen_version)
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| error::map_err("claim", e))?;
        let Some(row) = row else {
            return Ok(None);
        };
        let version: i64 = row.try_get(0).map_err(decode)?;
        let lease: Option<i64> = row.try_get(1).map_err(decode)?;
        let attempt: i32 = row.try_get(2).map_err(decode)?;
        let lease =
            lease.ok_or_else(|| StoreError::Backend("claimed record has no lease".into()))?;
        tracing::debug!(scope = %req.scope, owner = %req.owner, version, ?kind, "takeover");
        Ok(Some(ClaimToken::of(req, version, lease, attempt, kind)))
    }

    async fn finish_on(
        &self,
        conn: &mut PgConnection,
        token: &ClaimToken,
        finish: Finish,
    ) -> Result<Record, StoreError> {
        self.limits.check_finish(&finish)?;
        let result = finish.result.as_ref();
        let headers = result.map(|r| idem_store_kit::row::headers_json(&r.headers));
        let row = sqlx::query(self.sql.finish.clone())
            .bind(token.scope.tenant.as_str())
            .bind(token.scope.key.as_str())
            .bind(token.version)
            .bind(token.owner.as_str())
            .bind(self.clock.millis())
            .bind(finish.state.as_str())
            .bind(result.map(|r| i32::from(r.status)))
            .bind(headers.as_deref())
            .bind(result.map(|r| r.body.as_slice()))
            .bind(result.and_then(|r| r.result_ref.as_deref()))
            .bind(finish.state.is_terminal())
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| error::map_err("finish", e))?;
        if let Some(row) = row {
            self.recent.note(&token.scope);
            return row::finished(&row, token, finish.state, finish.result);
        }
        // Nothing matched. A retry of a finish whose response was lost: this very token
        // already moved the record to exactly this outcome. Answer as the first time
        // (f(f(x)) = f(x)); anything else is stale.
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

    async fn extend_on(
        &self,
        conn: &mut PgConnection,
        token: &ClaimToken,
        lease_ms: Millis,
    ) -> Result<Millis, StoreError> {
        let deadline: Option<i64> = sqlx::query_scalar(self.sql.extend.clone())
            .bind(token.scope.tenant.as_str())
            .bind(token.scope.key.as_str())
            .bind(token.version)
            .bind(token.owner.as_str())
            .bind(self.clock.millis())
            .bind(lease_ms)
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| error::map_err("extend_lease", e))?
            .flatten();
        deadline.ok_or_else(|| StoreError::superseded(token))
    }
}

fn decode(e: sqlx::Error) -> StoreError {
    error::map_err("decode", e)
}

#[async_trait]
impl IdempotencyStore for PgStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        // Validate before taking a connection: bad input must not wait on the pool.
        self.limits.check_claim(req)?;
        on_pooled_connection!(self, |conn| self.claim_on(conn, req))
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
        // Checked before taking a connection. A heartbeat is a compare-and-set without a
        // version bump: running it twice is the same as once.
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
        on_pooled_connection!(self, |conn| async {
            sqlx::query_scalar(self.sql.guard.clone())
                .bind(&self.sql.table)
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| error::map_err("unique_guard", e))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::RecordState;

    #[test]
    fn schema_names() {
        for ok in ["idem", "idem_t_0190abcd", "_x", "a1"] {
            assert!(validate_schema(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Idem", "1abc", "a-b", "a\"b", "pg_x", &"a".repeat(64)] {
            assert!(validate_schema(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn state_spelling_matches_sql() {
        // The SQL spells states as RecordState::as_str does; keep them in step.
        let spelled = [
            "PROCESSING",
            "SUCCEEDED",
            "FAILED_RETRYABLE",
            "FAILED_TERMINAL",
        ];
        for (st, s) in RecordState::ALL.iter().zip(spelled) {
            assert_eq!(st.as_str(), s);
        }
    }
}
