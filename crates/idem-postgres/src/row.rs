//! Decoding rows into [`Record`]s. A row that does not decode is reported as a backend
//! error, never skipped: a corrupt record must not look like an absent one.

use idem_core::{
    ClaimToken, Fingerprint, IdempotencyKey, OwnerId, Principal, Record, RecordState, StoreError,
    StoredResult, TenantId,
};
use sqlx::postgres::PgRow;
use sqlx::Row;

use crate::error::map_err;

fn corrupt(what: &str, detail: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(format!("corrupt idempotency record: {what}: {detail}"))
}

fn get<'r, T>(row: &'r PgRow, col: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(col).map_err(|e| map_err("decode", e))
}

/// Encodes result headers as a JSON array of `[name, value]` pairs (order kept).
pub(crate) fn headers_json(headers: &[(String, String)]) -> String {
    serde_json::to_string(headers).expect("string pairs always serialize")
}

pub(crate) fn record(row: &PgRow) -> Result<Record, StoreError> {
    let tenant: String = get(row, "tenant_id")?;
    let key: String = get(row, "key")?;
    let principal: String = get(row, "principal")?;
    let fingerprint: Vec<u8> = get(row, "fingerprint")?;
    let state: String = get(row, "state")?;
    let owner: Option<String> = get(row, "owner")?;
    let status: Option<i32> = get(row, "result_status")?;
    let headers: Option<String> = get(row, "result_headers")?;
    let body: Option<Vec<u8>> = get(row, "result_body")?;
    let result_ref: Option<String> = get(row, "result_ref")?;

    let fingerprint: [u8; 32] = fingerprint
        .as_slice()
        .try_into()
        .map_err(|_| corrupt("fingerprint", format!("{} bytes", fingerprint.len())))?;
    // A result exists iff a status was stored; the other parts default to empty.
    let result = match status {
        None => None,
        Some(status) => Some(StoredResult {
            status: u16::try_from(status).map_err(|e| corrupt("result_status", e))?,
            headers: match headers {
                None => Vec::new(),
                Some(text) => {
                    serde_json::from_str(&text).map_err(|e| corrupt("result_headers", e))?
                }
            },
            body: body.unwrap_or_default(),
            result_ref,
        }),
    };
    Ok(Record {
        tenant: TenantId::new(tenant).map_err(|e| corrupt("tenant_id", e))?,
        key: IdempotencyKey::from_stored(key).map_err(|e| corrupt("key", e))?,
        principal: Principal::new(principal).map_err(|e| corrupt("principal", e))?,
        fingerprint: Fingerprint::from_bytes(fingerprint),
        state: state
            .parse::<RecordState>()
            .map_err(|e| corrupt("state", e))?,
        version: get(row, "version")?,
        owner: owner
            .map(OwnerId::new)
            .transpose()
            .map_err(|e| corrupt("owner", e))?,
        lease_expires_at: get(row, "lease_expires_at")?,
        result,
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

fn fingerprint(bytes: Vec<u8>) -> Result<Fingerprint, StoreError> {
    let fp: [u8; 32] = bytes
        .as_slice()
        .try_into()
        .map_err(|_| corrupt("fingerprint", format!("{} bytes", bytes.len())))?;
    Ok(Fingerprint::from_bytes(fp))
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
    let principal: String = at(row, 5)?;
    let state: &str = at(row, 7)?;
    let owner: Option<String> = at(row, 8)?;
    let status: Option<i32> = at(row, 9)?;
    let headers: Option<&str> = at(row, 10)?;
    let result = match status {
        None => None,
        Some(status) => Some(StoredResult {
            status: u16::try_from(status).map_err(|e| corrupt("result_status", e))?,
            headers: match headers {
                None => Vec::new(),
                Some(text) => {
                    serde_json::from_str(text).map_err(|e| corrupt("result_headers", e))?
                }
            },
            body: at::<Option<Vec<u8>>>(row, 11)?.unwrap_or_default(),
            result_ref: at(row, 12)?,
        }),
    };
    let rec = Record {
        tenant: tenant.clone(),
        key: key.clone(),
        principal: Principal::new(principal).map_err(|e| corrupt("principal", e))?,
        fingerprint: fingerprint(at(row, 6)?)?,
        state: state
            .parse::<RecordState>()
            .map_err(|e| corrupt("state", e))?,
        version,
        owner: owner
            .map(OwnerId::new)
            .transpose()
            .map_err(|e| corrupt("owner", e))?,
        lease_expires_at: lease,
        result,
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
    let principal: String = at(row, 0)?;
    Ok(Record {
        tenant: token.scope.tenant.clone(),
        key: token.scope.key.clone(),
        principal: Principal::new(principal).map_err(|e| corrupt("principal", e))?,
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
