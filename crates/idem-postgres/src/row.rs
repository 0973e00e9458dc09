//! Decoding rows into [`Record`]s. A row that does not decode is reported as a backend
//! error, never skipped: a corrupt record must not look like an absent one.

use idem_core::{
    ClaimToken, IdempotencyKey, Record, RecordState, StoreError, StoredResult, TenantId,
};
use idem_store_kit::row::{fingerprint, owner, principal, state, stored_result, RecordRow};
use sqlx::postgres::PgRow;
use sqlx::Row;

use crate::error::map_err;

fn corrupt(what: &str, detail: impl std::fmt::Display) -> StoreError {
    idem_store_kit::row::corrupt(what, detail)
}

fn get<'r, T>(row: &'r PgRow, col: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(col).map_err(|e| map_err("decode", e))
}

/// Reads a record's columns (by name); `idem_store_kit::row` validates them.
pub(crate) fn record(row: &PgRow) -> Result<Record, StoreError> {
    record_row(row)?.decode()
}

pub(crate) fn record_row(row: &PgRow) -> Result<RecordRow, StoreError> {
    Ok(RecordRow {
        tenant_id: get(row, "tenant_id")?,
        key: get(row, "key")?,
        principal: get(row, "principal")?,
        fingerprint: get(row, "fingerprint")?,
        state: get(row, "state")?,
        version: get(row, "version")?,
        owner: get(row, "owner")?,
        lease_expires_at: get(row, "lease_expires_at")?,
        result_status: get::<Option<i32>>(row, "result_status")?.map(i64::from),
        result_headers: get(row, "result_headers")?,
        result_body: get(row, "result_body")?,
        result_ref: get(row, "result_ref")?,
        attempts: get(row, "attempts")?,
        created_at: get(row, "created_at")?,
        updated_at: get(row, "updated_at")?,
        completed_at: get(row, "completed_at")?,
    })
}

fn at<'r, T>(row: &'r PgRow, idx: usize) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(idx).map_err(|e| map_err("decode", e))
}

/// What a claim statement answered (see `sql::CLAIM_COLS`).
// A short-lived return value, matched at once: boxing the record would only add an
// allocation to every replay.
#[allow(clippy::large_enum_variant)]
pub(crate) enum ClaimRow {
    /// This statement inserted the record: `(version, lease_expires_at, attempts)`.
    Fresh(i64, i64, i32),
    /// The record that was there, and the store clock when it was read.
    Existing(Record, i64),
}

/// Decodes a claim answer row; `tenant` and `key` are the request's (the row is theirs).
pub(crate) fn claim_row(
    row: &PgRow,
    tenant: &TenantId,
    key: &IdempotencyKey,
) -> Result<ClaimRow, StoreError> {
    if row.len() != crate::sql::CLAIM_COLS {
        return Err(corrupt("claim answer", format!("{} columns", row.len())));
    }
    let fresh: bool = at(row, 0)?;
    let version: i64 = at(row, 1)?;
    let lease: Option<i64> = at(row, 2)?;
    let attempts: i32 = at(row, 3)?;
    if fresh {
        let lease = lease.ok_or_else(|| corrupt("lease_expires_at", "fresh claim has none"))?;
        return Ok(ClaimRow::Fresh(version, lease, attempts));
    }
    let now: i64 = at(row, 4)?;
    let rec = Record {
        tenant: tenant.clone(),
        key: key.clone(),
        principal: principal(at(row, 5)?)?,
        fingerprint: fingerprint(at(row, 6)?)?,
        state: state(at(row, 7)?)?,
        version,
        owner: owner(at(row, 8)?)?,
        lease_expires_at: lease,
        result: stored_result(
            at::<Option<i32>>(row, 9)?.map(i64::from),
            at(row, 10)?,
            at(row, 11)?,
            at(row, 12)?,
        )?,
        attempts,
        created_at: at(row, 13)?,
        updated_at: at(row, 14)?,
        completed_at: at(row, 15)?,
    };
    Ok(ClaimRow::Existing(rec, now))
}

/// The record a successful finish wrote, rebuilt from what the caller sent plus the
/// columns the statement returned (see `sql::FINISH_COLS`).
pub(crate) fn finished(
    row: &PgRow,
    token: &ClaimToken,
    state: RecordState,
    result: Option<StoredResult>,
) -> Result<Record, StoreError> {
    if row.len() != crate::sql::FINISH_COLS {
        return Err(corrupt("finish answer", format!("{} columns", row.len())));
    }
    Ok(Record {
        tenant: token.scope.tenant.clone(),
        key: token.scope.key.clone(),
        principal: principal(at(row, 0)?)?,
        fingerprint: fingerprint(at(row, 1)?)?,
        state,
        version: at(row, 6)?,
        owner: Some(token.owner.clone()),
        lease_expires_at: None,
        result,
        attempts: at(row, 2)?,
        created_at: at(row, 3)?,
        updated_at: at(row, 4)?,
        completed_at: at(row, 5)?,
    })
}
