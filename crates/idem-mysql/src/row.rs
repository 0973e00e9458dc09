//! Reading MySQL rows into the plain structs of [`idem_store_kit::row`], which validates them.
//!
//! Owns only the column types of this store (BIGINT times, INT status and attempts,
//! VARBINARY fingerprints). It must not run statements or validate values itself
//! (`idem_store_kit::row` does). A row that does not decode is a backend error, never
//! skipped: a corrupt record must not look like an absent one.

use idem_core::{Record, StoreError};
use idem_store_kit::row::RecordRow;
use sqlx::mysql::MySqlRow;
use sqlx::Row;

use crate::error::map_err;

pub(crate) fn get<'r, T>(row: &'r MySqlRow, col: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, sqlx::MySql> + sqlx::Type<sqlx::MySql>,
{
    row.try_get(col).map_err(|e| map_err("decode", e))
}

pub(crate) fn record(row: &MySqlRow) -> Result<Record, StoreError> {
    record_row(row)?.decode()
}

pub(crate) fn record_row(row: &MySqlRow) -> Result<RecordRow, StoreError> {
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
