//! [`FunctionStore`]: the idempotency store through the SQL functions of migration 11
//! (`idem_claim`, `idem_finish`, `idem_heartbeat`; docs/SQL-API.md).
//!
//! # What this module owns
//! - The Rust client of those functions: it is what a client in any other language does,
//!   kept honest by the conformance suite (tests/functions_conformance.rs).
//! - Mapping the functions' SQLSTATE codes (class `ID`) to [`StoreError`] kinds.
//!
//! # What it must not do
//! - Decide anything itself: the decision table lives in the SQL functions, so Rust and
//!   every other client get the same answers. Reads (`get`, `unique_guard`), the pool
//!   and migrations are the wrapped [`PgStore`]'s.
//! - Send a time: deadlines come from the database clock (plus the test shift).

use std::time::Duration;

use async_trait::async_trait;
use idem_core::store::lease_millis;
use idem_core::{
    Claim, ClaimRequest, ClaimToken, Finish, IdempotencyStore, Millis, Record, RecordState, Scope,
    StoreError,
};
use idem_store_kit::row::ClaimAnswerRow;
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, PgConnection, Row, SqlSafeStr, SqlStr};

use crate::{error, row, PgOptions, PgStore};

/// SQLSTATE of a bad argument (key, tenant, owner, principal, fingerprint, lease,
/// outcome, status, headers).
pub const SQLSTATE_INVALID_ARGUMENT: &str = "ID001";
/// SQLSTATE of a result over the functions' 1 MiB limit.
pub const SQLSTATE_RESULT_TOO_LARGE: &str = "ID002";
/// SQLSTATE of a finish or heartbeat whose claim is no longer current.
pub const SQLSTATE_SUPERSEDED: &str = "ID003";
/// SQLSTATE of a claim that did not settle after its re-runs: retry.
pub const SQLSTATE_NOT_SETTLED: &str = "ID004";

/// The calls, built once with the (optionally schema-qualified) function names.
struct Calls {
    claim: SqlStr,
    finish: SqlStr,
    heartbeat: SqlStr,
}

impl Calls {
    fn new(schema: Option<&str>) -> Self {
        let q = match schema {
            Some(s) => format!("\"{s}\"."),
            None => String::new(),
        };
        let shared = |sql: String| AssertSqlSafe(std::sync::Arc::<str>::from(sql)).into_sql_str();
        Calls {
            claim: shared(format!(
                "SELECT decision, kind, version, attempt, lease_expires_at, now_ms, state, \
                 owner, status, headers::text AS headers, body, result_ref, created_at, \
                 updated_at, completed_at FROM {q}idem_claim($1, $2, $3, $4, $5, $6, $7)"
            )),
            // In the column order `row::finished` reads.
            finish: shared(format!(
                "SELECT principal, fingerprint, attempt, created_at, updated_at, \
                 completed_at, version \
                 FROM {q}idem_finish($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, $10)"
            )),
            heartbeat: shared(format!("SELECT {q}idem_heartbeat($1, $2, $3, $4, $5, $6)")),
        }
    }
}

/// An [`IdempotencyStore`] whose claim, finish and heartbeat are the SQL functions.
#[derive(Clone)]
pub struct FunctionStore {
    pg: PgStore,
    calls: std::sync::Arc<Calls>,
}

impl std::fmt::Debug for FunctionStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FunctionStore")
            .field("pg", &self.pg)
            .finish_non_exhaustive()
    }
}

/// The functions' name for a finish outcome.
fn outcome(state: RecordState) -> Result<&'static str, StoreError> {
    match state {
        RecordState::Succeeded => Ok("succeeded"),
        RecordState::FailedTerminal => Ok("terminal"),
        RecordState::FailedRetryable => Ok("retryable"),
        RecordState::Processing => Err(StoreError::InvalidInput(
            "a claim cannot finish in PROCESSING".into(),
        )),
    }
}

/// Maps the functions' own SQLSTATEs; everything else as the statements' errors are.
fn map_err(what: &str, err: sqlx::Error, token: Option<&ClaimToken>) -> StoreError {
    let code = match &err {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    };
    let message = || match &err {
        sqlx::Error::Database(db) => db.message().to_string(),
        other => other.to_string(),
    };
    match code.as_deref() {
        Some(SQLSTATE_INVALID_ARGUMENT) | Some(SQLSTATE_RESULT_TOO_LARGE) => {
            StoreError::InvalidInput(message())
        }
        Some(SQLSTATE_SUPERSEDED) => match token {
            Some(token) => StoreError::superseded(token),
            None => StoreError::Backend(message()),
        },
        Some(SQLSTATE_NOT_SETTLED) => StoreError::Unavailable(message()),
        _ => error::map_err(what, err),
    }
}

fn get<'r, T>(row: &'r PgRow, col: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(col).map_err(|e| error::map_err("decode", e))
}

/// Reads an `idem_claim` answer for `req`.
fn claim_answer(row: &PgRow, req: &ClaimRequest) -> Result<Claim, StoreError> {
    ClaimAnswerRow {
        decision: get(row, "decision")?,
        kind: get(row, "kind")?,
        version: get(row, "version")?,
        attempt: get(row, "attempt")?,
        lease_expires_at: get(row, "lease_expires_at")?,
        now_ms: get(row, "now_ms")?,
        state: get(row, "state")?,
        owner: get(row, "owner")?,
        status: get::<Option<i32>>(row, "status")?.map(i64::from),
        headers: get(row, "headers")?,
        body: get(row, "body")?,
        result_ref: get(row, "result_ref")?,
        created_at: get(row, "created_at")?,
        updated_at: get(row, "updated_at")?,
        completed_at: get(row, "completed_at")?,
    }
    .decode(req)
}

impl FunctionStore {
    /// Wraps a store (its pool, schema, limits and clock shift); the schema must be
    /// migrated to version 11 or newer.
    pub fn new(pg: PgStore) -> Self {
        Self {
            calls: std::sync::Arc::new(Calls::new(pg.schema())),
            pg,
        }
    }

    /// Connects like [`PgStore::connect`] (does not migrate: call [`FunctionStore::migrate`]).
    pub async fn connect(url: &str, options: PgOptions) -> Result<Self, StoreError> {
        Ok(Self::new(PgStore::connect(url, options).await?))
    }

    /// The wrapped statement store (same pool, same schema).
    pub fn pg(&self) -> &PgStore {
        &self.pg
    }

    pub async fn migrate(&self) -> Result<Vec<i64>, StoreError> {
        self.pg.migrate().await
    }

    /// `idem_claim` inside the caller's transaction: a concurrent duplicate waits on the
    /// unique index, then replays (or proceeds after a rollback). After an error, roll
    /// the transaction back.
    pub async fn claim_in_tx(
        &self,
        conn: &mut PgConnection,
        req: &ClaimRequest,
    ) -> Result<Claim, StoreError> {
        match self.claim_on(conn, req).await {
            // Waited on a duplicate's uncommitted record past the session's
            // `lock_timeout`: that request is still in progress.
            Err(e) if error::is_lock_timeout(&e) => {
                let now = idem_core::retention::millis(
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default(),
                );
                Ok(Claim::InProgress {
                    owner: None,
                    lease_expires_at: now,
                    now,
                })
            }
            other => other,
        }
    }

    /// `idem_finish` inside the caller's transaction, so the completion commits with the
    /// business write. `Superseded`: roll the business write back.
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
        let lease_ms = self.pg.limits.claim_lease(req)?;
        let row = sqlx::query(self.calls.claim.clone())
            .bind(req.scope.tenant.as_str())
            .bind(req.scope.key.as_str())
            .bind(req.fingerprint.as_bytes().as_slice())
            .bind(req.principal.as_str())
            .bind(req.owner.as_str())
            .bind(lease_ms)
            .bind(self.pg.clock.millis())
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| map_err("claim", e, None))?;
        claim_answer(&row, req)
    }

    async fn finish_on(
        &self,
        conn: &mut PgConnection,
        token: &ClaimToken,
        finish: Finish,
    ) -> Result<Record, StoreError> {
        self.pg.limits.check_finish(&finish)?;
        let result = finish.result.as_ref();
        let headers = result.map(|r| idem_store_kit::row::headers_json(&r.headers));
        let row = sqlx::query(self.calls.finish.clone())
            .bind(token.scope.tenant.as_str())
            .bind(token.scope.key.as_str())
            .bind(token.owner.as_str())
            .bind(token.version)
            .bind(outcome(finish.state)?)
            .bind(result.map(|r| i32::from(r.status)))
            .bind(headers.as_deref())
            .bind(result.map(|r| r.body.as_slice()))
            .bind(result.and_then(|r| r.result_ref.as_deref()))
            .bind(self.pg.clock.millis())
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| map_err("finish", e, Some(token)))?;
        row::finished(&row, token, finish.state, finish.result)
    }

    async fn heartbeat_on(
        &self,
        conn: &mut PgConnection,
        token: &ClaimToken,
        lease_ms: Millis,
    ) -> Result<Millis, StoreError> {
        sqlx::query_scalar(self.calls.heartbeat.clone())
            .bind(token.scope.tenant.as_str())
            .bind(token.scope.key.as_str())
            .bind(token.owner.as_str())
            .bind(token.version)
            .bind(lease_ms)
            .bind(self.pg.clock.millis())
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| map_err("extend_lease", e, Some(token)))
    }
}

#[async_trait]
impl IdempotencyStore for FunctionStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        self.pg.limits.check_claim(req)?;
        on_pooled_connection!(self.pg, |conn| self.claim_on(conn, req))
    }

    async fn finish(&self, token: &ClaimToken, finish: Finish) -> Result<Record, StoreError> {
        self.pg.limits.check_finish(&finish)?;
        // Safe to run twice: idem_finish answers a repeat of an applied finish as the
        // first time.
        on_pooled_connection!(self.pg, |conn| self.finish_on(conn, token, finish.clone()))
    }

    async fn extend_lease(
        &self,
        token: &ClaimToken,
        lease: Duration,
    ) -> Result<Millis, StoreError> {
        let lease_ms = lease_millis(lease)?;
        on_pooled_connection!(self.pg, |conn| self.heartbeat_on(conn, token, lease_ms))
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        self.pg.get(scope).await
    }

    async fn unique_guard(&self) -> Result<bool, StoreError> {
        self.pg.unique_guard().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_spelled_as_the_sql_expects() {
        assert_eq!(outcome(RecordState::Succeeded).unwrap(), "succeeded");
        assert_eq!(outcome(RecordState::FailedTerminal).unwrap(), "terminal");
        assert_eq!(outcome(RecordState::FailedRetryable).unwrap(), "retryable");
        assert!(outcome(RecordState::Processing).is_err());
        let sql = include_str!("../migrations/0011_functions.sql");
        for word in ["'succeeded'", "'terminal'", "'retryable'"] {
            assert!(sql.contains(word), "{word}");
        }
        for code in [
            SQLSTATE_INVALID_ARGUMENT,
            SQLSTATE_RESULT_TOO_LARGE,
            SQLSTATE_SUPERSEDED,
            SQLSTATE_NOT_SETTLED,
        ] {
            assert!(sql.contains(&format!("ERRCODE = '{code}'")), "{code}");
        }
    }
}
