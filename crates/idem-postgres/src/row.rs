//! Decoding rows into [`Record`]s. A row that does not decode is reported as a backend
//! error, never skipped: a corrupt record must not look like an absent one.

use idem_core::{
    Fingerprint, IdempotencyKey, OwnerId, Principal, Record, RecordState, StoreError, StoredResult,
    TenantId,
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
        key: IdempotencyKey::new(key).map_err(|e| corrupt("key", e))?,
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
