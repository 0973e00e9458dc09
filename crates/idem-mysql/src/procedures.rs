//! [`ProcedureStore`]: the idempotency store through the stored procedures of migration 5
//! (`idem_claim`, `idem_finish`, `idem_heartbeat`; docs/SQL-API.md, MySQL section), and
//! the text of those procedures (`crates/idem-mysql/sql/*.sql`).
//!
//! # What this module owns
//! - The procedures' text (`sql/`, one file each, listed by migration 5 in `migrate.rs`):
//!   each is dropped and created again, so the migration is safe to re-run; each file
//!   runs in the mysql client as it is (its body between `DELIMITER` lines).
//! - The Rust client of those procedures: it is what a client in any other language
//!   does, kept honest by the conformance suite (tests/procedures.rs).
//! - Mapping the procedures' SQLSTATE codes (class `ID`) to [`StoreError`] kinds.
//!
//! # What it must not do
//! - Decide anything itself: the decision table lives in the procedures, so Rust and
//!   every other client get the same answers. Reads (`get`, `unique_guard`), the pool and
//!   migrations are the wrapped [`MysqlStore`]'s.
//! - Send a time: deadlines come from the database clock (plus the test shift, passed in
//!   the session variable `@idem_clock_shift_ms`, which each procedure consumes).

use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::store::lease_millis;
use idem_core::{
    Claim, ClaimRequest, ClaimToken, Finish, IdempotencyStore, Millis, Record, RecordState, Scope,
    StoreError,
};
use idem_store_kit::row::{fingerprint, principal, ClaimAnswerRow};
use sqlx::mysql::MySqlRow;
use sqlx::MySqlConnection;

use crate::{error, row, MysqlOptions, MysqlStore, LOCK_CONFLICT_RETRIES};

/// SQLSTATE of a bad argument (key, tenant, owner, principal, fingerprint, lease,
/// outcome, status, headers, reference).
pub const SQLSTATE_INVALID_ARGUMENT: &str = "ID001";
/// SQLSTATE of a result over the procedures' 1 MiB limit.
pub const SQLSTATE_RESULT_TOO_LARGE: &str = "ID002";
/// SQLSTATE of a finish or heartbeat whose claim is no longer current.
pub const SQLSTATE_SUPERSEDED: &str = "ID003";
/// SQLSTATE of a claim that did not settle after its re-runs: retry.
pub const SQLSTATE_NOT_SETTLED: &str = "ID004";

const CLAIM: &str = "CALL idem_claim(?, ?, ?, ?, ?, ?)";
const FINISH: &str = "CALL idem_finish(?, ?, ?, ?, ?, ?, ?, ?, ?)";
const HEARTBEAT: &str = "CALL idem_heartbeat(?, ?, ?, ?, ?)";
/// The test clock shift of the next procedure call on this session.
const SHIFT: &str = "SET @idem_clock_shift_ms = ?";

/// An [`IdempotencyStore`] whose claim, finish and heartbeat are the stored procedures.
#[derive(Clone, Debug)]
pub struct ProcedureStore {
    my: MysqlStore,
}

/// The procedures' name for a finish outcome.
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

/// Maps the procedures' own SQLSTATEs; everything else as the statements' errors are.
fn map_err(what: &str, err: sqlx::Error, token: Option<&ClaimToken>) -> StoreError {
    let (code, message) = match &err {
        sqlx::Error::Database(db) => (db.code().map(|c| c.into_owned()), db.message().to_string()),
        _ => (None, String::new()),
    };
    match code.as_deref() {
        Some(SQLSTATE_INVALID_ARGUMENT) | Some(SQLSTATE_RESULT_TOO_LARGE) => {
            StoreError::InvalidInput(message)
        }
        Some(SQLSTATE_SUPERSEDED) => match token {
            Some(token) => StoreError::superseded(token),
            None => StoreError::Backend(message),
        },
        Some(SQLSTATE_NOT_SETTLED) => StoreError::Unavailable(message),
        _ => error::map_err(what, err),
    }
}

/// Reads an `idem_claim` answer for `req`.
fn claim_answer(r: &MySqlRow, req: &ClaimRequest) -> Result<Claim, StoreError> {
    ClaimAnswerRow {
        decision: row::get(r, "decision")?,
        kind: row::get(r, "kind")?,
        version: row::get(r, "version")?,
        attempt: row::get(r, "attempt")?,
        lease_expires_at: row::get(r, "lease_expires_at")?,
        now_ms: row::get(r, "now_ms")?,
        state: row::get(r, "state")?,
        owner: row::get(r, "owner")?,
        status: row::get::<Option<i32>>(r, "status")?.map(i64::from),
        headers: row::get(r, "headers")?,
        body: row::get(r, "body")?,
        result_ref: row::get(r, "result_ref")?,
        created_at: row::get(r, "created_at")?,
        updated_at: row::get(r, "updated_at")?,
        completed_at: row::get(r, "completed_at")?,
    }
    .decode(req)
}

impl ProcedureStore {
    /// Wraps a store (its pool, limits and clock shift); the database must be migrated to
    /// version 5 or newer.
    pub fn new(my: MysqlStore) -> Self {
        Self { my }
    }

    /// Connects like [`MysqlStore::connect`] (does not migrate: call
    /// [`ProcedureStore::migrate`]).
    pub async fn connect(url: &str, options: MysqlOptions) -> Result<Self, StoreError> {
        Ok(Self::new(MysqlStore::connect(url, options).await?))
    }

    /// The wrapped statement store (same pool).
    pub fn mysql(&self) -> &MysqlStore {
        &self.my
    }

    pub async fn migrate(&self) -> Result<Vec<i64>, StoreError> {
        self.my.migrate().await
    }

    /// `idem_claim` inside the caller's transaction: a concurrent duplicate waits on the
    /// primary key, then replays (or proceeds after a rollback). A lock conflict (a lock
    /// wait timeout, or this transaction chosen as a deadlock victim and rolled back) is
    /// answered as in progress. After an error or that answer, roll back.
    pub async fn claim_in_tx(
        &self,
        conn: &mut MySqlConnection,
        req: &ClaimRequest,
    ) -> Result<Claim, StoreError> {
        self.my.limits.check_claim(req)?;
        let answer = self.claim_on(conn, req).await;
        self.my.lock_conflict_in_tx(req, answer)
    }

    /// `idem_finish` inside the caller's transaction, so the completion commits with the
    /// business write. `Superseded`: roll the business write back.
    pub async fn finish_in_tx(
        &self,
        conn: &mut MySqlConnection,
        token: &ClaimToken,
        finish: Finish,
    ) -> Result<Record, StoreError> {
        self.finish_on(conn, token, finish).await
    }

    /// Sets the test clock shift for the next call on `conn`; nothing when there is none
    /// (every procedure consumes the variable, so no earlier value is left over).
    async fn shift(&self, conn: &mut MySqlConnection, what: &str) -> Result<(), StoreError> {
        let shift = self.my.clock.millis();
        if shift != 0 {
            sqlx::query(SHIFT)
                .bind(shift)
                .execute(&mut *conn)
                .await
                .map_err(|e| error::map_err(what, e))?;
        }
        Ok(())
    }

    async fn claim_on(
        &self,
        conn: &mut MySqlConnection,
        req: &ClaimRequest,
    ) -> Result<Claim, StoreError> {
        let lease_ms = self.my.limits.claim_lease(req)?;
        self.shift(conn, "claim").await?;
        let r = sqlx::query(CLAIM)
            .bind(req.scope.tenant.as_str())
            .bind(req.scope.key.as_str())
            .bind(req.fingerprint.as_bytes().as_slice())
            .bind(req.principal.as_str())
            .bind(req.owner.as_str())
            .bind(lease_ms)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| map_err("claim", e, None))?;
        claim_answer(&r, req)
    }

    async fn finish_on(
        &self,
        conn: &mut MySqlConnection,
        token: &ClaimToken,
        finish: Finish,
    ) -> Result<Record, StoreError> {
        self.my.limits.check_finish(&finish)?;
        let result = finish.result.as_ref();
        let headers = result.map(|r| idem_store_kit::row::headers_json(&r.headers));
        self.shift(conn, "finish").await?;
        let r = sqlx::query(FINISH)
            .bind(token.scope.tenant.as_str())
            .bind(token.scope.key.as_str())
            .bind(token.owner.as_str())
            .bind(token.version)
            .bind(outcome(finish.state)?)
            .bind(result.map(|r| i64::from(r.status)))
            .bind(headers.as_deref())
            .bind(result.map(|r| r.body.as_slice()))
            .bind(result.and_then(|r| r.result_ref.as_deref()))
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| map_err("finish", e, Some(token)))?;
        self.my.recent.note(&token.scope);
        Ok(Record {
            tenant: token.scope.tenant.clone(),
            key: token.scope.key.clone(),
            principal: principal(row::get(&r, "principal")?)?,
            fingerprint: fingerprint(row::get(&r, "fingerprint")?)?,
            state: finish.state,
            version: row::get(&r, "version")?,
            owner: Some(token.owner.clone()),
            lease_expires_at: None,
            result: finish.result,
            attempts: row::get(&r, "attempt")?,
            created_at: row::get(&r, "created_at")?,
            updated_at: row::get(&r, "updated_at")?,
            completed_at: row::get(&r, "completed_at")?,
        })
    }

    async fn heartbeat_on(
        &self,
        conn: &mut MySqlConnection,
        token: &ClaimToken,
        lease_ms: Millis,
    ) -> Result<Millis, StoreError> {
        self.shift(conn, "extend_lease").await?;
        let r = sqlx::query(HEARTBEAT)
            .bind(token.scope.tenant.as_str())
            .bind(token.scope.key.as_str())
            .bind(token.owner.as_str())
            .bind(token.version)
            .bind(lease_ms)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| map_err("extend_lease", e, Some(token)))?;
        row::get(&r, "lease_expires_at")
    }
}

#[async_trait]
impl IdempotencyStore for ProcedureStore {
    fn backend(&self) -> &'static str {
        "mysql"
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        self.my.limits.check_claim(req)?;
        on_pooled_connection!(self.my, |conn| self.claim_on(conn, req))
    }

    async fn finish(&self, token: &ClaimToken, finish: Finish) -> Result<Record, StoreError> {
        self.my.limits.check_finish(&finish)?;
        // Safe to run twice: idem_finish answers a repeat of an applied finish as the
        // first time.
        on_pooled_connection!(self.my, |conn| self.finish_on(conn, token, finish.clone()))
    }

    async fn extend_lease(
        &self,
        token: &ClaimToken,
        lease: Duration,
    ) -> Result<Millis, StoreError> {
        let lease_ms = lease_millis(lease)?;
        on_pooled_connection!(self.my, |conn| self.heartbeat_on(conn, token, lease_ms))
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        self.my.get(scope).await
    }

    async fn unique_guard(&self) -> Result<bool, StoreError> {
        self.my.unique_guard().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_and_codes_are_spelled_as_the_sql_expects() {
        assert_eq!(outcome(RecordState::Succeeded).unwrap(), "succeeded");
        assert_eq!(outcome(RecordState::FailedTerminal).unwrap(), "terminal");
        assert_eq!(outcome(RecordState::FailedRetryable).unwrap(), "retryable");
        assert!(outcome(RecordState::Processing).is_err());
        let sql = crate::migrate::migration(5).sql;
        for word in ["'succeeded'", "'terminal'", "'retryable'"] {
            assert!(sql.contains(word), "{word}");
        }
        for code in [
            SQLSTATE_INVALID_ARGUMENT,
            SQLSTATE_RESULT_TOO_LARGE,
            SQLSTATE_SUPERSEDED,
            SQLSTATE_NOT_SETTLED,
        ] {
            assert!(sql.contains(&format!("SIGNAL SQLSTATE '{code}'")), "{code}");
        }
    }

    #[test]
    fn every_procedure_is_dropped_before_it_is_created() {
        let creates = crate::migrate::creates_after_drops(&[5, 9, 10]);
        assert_eq!(creates.len(), 10);
        for create in creates {
            let name = create
                .strip_prefix("CREATE PROCEDURE ")
                .and_then(|rest| rest.split_once('('))
                .map(|(name, _)| name)
                .expect("a procedure");
            // The argument list follows the name at once.
            assert!(!name.contains(char::is_whitespace), "{name}");
            // One statement: DELIMITER is a mysql client command, not SQL.
            assert!(!create.contains("DELIMITER"), "{name}");
            assert!(create.ends_with("END"), "{name}");
        }
    }

    #[test]
    fn the_call_texts_have_one_placeholder_per_argument() {
        assert_eq!(CLAIM.matches('?').count(), 6);
        assert_eq!(FINISH.matches('?').count(), 9);
        assert_eq!(HEARTBEAT.matches('?').count(), 5);
    }
}
