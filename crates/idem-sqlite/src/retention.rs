//! Retention on SQLite: the tier column, the one archive table, stale recovery.
//!
//! Every batch is one `BEGIN IMMEDIATE` transaction of compare-and-set statements (on
//! version and tier, or version, state and lease for stale records), so two sweepers or
//! a rerun after a crash reach the same final state. Archiving deletes the online row
//! and inserts the archive row in the same transaction. The archive is one table;
//! expiry deletes rows by `archived_at`.
//!
//! Scans take their time bounds from the caller (the sweeper's `now`); only
//! [`RetentionStore::now`] reads SQLite's clock.

use async_trait::async_trait;
use idem_core::retention::{
    ArchiveExpiry, ArchiveLookup, ArchivedRecord, Demotion, DueRecord, RetentionStore, ScanCursor,
    StaleColumns, StaleRecord, Tier, TierUsage,
};
use idem_core::{IdempotencyKey, Millis, RecordState, Scope, StoreError, TenantId};
use idem_store_kit::row::{headers_json, ArchiveRow, DueRow};
use sqlx::sqlite::SqliteRow;
use sqlx::Row;

use crate::{map_err, record_row, SqliteStore, RECORD_COLUMNS};

const TERMINAL: &str = "state IN ('SUCCEEDED', 'FAILED_TERMINAL')";

const ARCHIVE_COLUMNS: &str = "tenant_id, key_digest, fingerprint, result_digest, result_ref, \
     state, status, first_processed_at, completed_at, archived_at";

/// Reads an archive row's columns; `idem_store_kit::row` validates them.
fn archived_from_row(row: &SqliteRow) -> Result<ArchivedRecord, StoreError> {
    ArchiveRow {
        tenant_id: row.try_get("tenant_id").map_err(map_err)?,
        key_digest: row.try_get("key_digest").map_err(map_err)?,
        fingerprint: row.try_get("fingerprint").map_err(map_err)?,
        result_digest: row.try_get("result_digest").map_err(map_err)?,
        result_ref: row.try_get("result_ref").map_err(map_err)?,
        state: row.try_get("state").map_err(map_err)?,
        status: row.try_get("status").map_err(map_err)?,
        first_processed_at: row.try_get("first_processed_at").map_err(map_err)?,
        completed_at: row.try_get("completed_at").map_err(map_err)?,
        archived_at: row.try_get("archived_at").map_err(map_err)?,
    }
    .decode()
}

fn tier_of_row(row: &SqliteRow) -> Result<Tier, StoreError> {
    idem_store_kit::row::tier(row.try_get("tier").map_err(map_err)?)
}

#[async_trait]
impl ArchiveLookup for SqliteStore {
    async fn archived(
        &self,
        tenant: &TenantId,
        key: &IdempotencyKey,
    ) -> Result<Option<ArchivedRecord>, StoreError> {
        let digest = idem_core::retention::key_digest(key);
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {ARCHIVE_COLUMNS} FROM idem_archive WHERE tenant_id = ? AND key_digest = ?"
        )))
        .bind(tenant.as_str())
        .bind(&digest[..])
        .fetch_optional(self.pool())
        .await
        .map_err(map_err)?;
        row.as_ref().map(archived_from_row).transpose()
    }

    async fn archived_by_ref(
        &self,
        tenant: Option<&TenantId>,
        result_ref: &str,
    ) -> Result<Vec<ArchivedRecord>, StoreError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {ARCHIVE_COLUMNS} FROM idem_archive \
             WHERE result_ref = ? AND (? IS NULL OR tenant_id = ?) \
             ORDER BY archived_at, tenant_id, key_digest"
        )))
        .bind(result_ref)
        .bind(tenant.map(|t| t.as_str()))
        .bind(tenant.map(|t| t.as_str()))
        .fetch_all(self.pool())
        .await
        .map_err(map_err)?;
        rows.iter().map(archived_from_row).collect()
    }
}

#[async_trait]
impl RetentionStore for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn now(&self) -> Result<Millis, StoreError> {
        SqliteStore::now(self).await
    }

    async fn scan_due(
        &self,
        tier: Tier,
        completed_before: Millis,
        after: Option<&ScanCursor>,
        limit: usize,
    ) -> Result<Vec<DueRecord>, StoreError> {
        let (c, t, k) = ScanCursor::start(after);
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {RECORD_COLUMNS}, tier FROM idem_records \
             WHERE tier = ? AND completed_at IS NOT NULL AND completed_at < ? AND {TERMINAL} \
               AND (completed_at, tenant_id, key) > (?, ?, ?) \
             ORDER BY completed_at, tenant_id, key LIMIT ?"
        )))
        .bind(tier.as_str())
        .bind(completed_before)
        .bind(c)
        .bind(t)
        .bind(k)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(self.pool())
        .await
        .map_err(map_err)?;
        let due = |row: &SqliteRow| {
            let record = record_row(row)?;
            let tier = row.try_get("tier").map_err(map_err)?;
            DueRow { record, tier }.decode()
        };
        rows.iter().map(due).collect()
    }

    async fn demote(
        &self,
        from: Tier,
        to: Tier,
        batch: &[Demotion],
        now: Millis,
    ) -> Result<u64, StoreError> {
        if !idem_core::retention::demotes(from, to, batch)? {
            return Ok(0);
        }
        let mut tx = self.begin().await?;
        let mut applied = 0u64;
        for d in batch {
            if to == Tier::Archive {
                let archive = d.archive_row()?;
                let deleted = sqlx::query(
                    "DELETE FROM idem_records \
                     WHERE tenant_id = ? AND key = ? AND version = ? AND tier = ?",
                )
                .bind(d.scope.tenant.as_str())
                .bind(d.scope.key.as_str())
                .bind(d.version)
                .bind(from.as_str())
                .execute(&mut *tx)
                .await
                .map_err(map_err)?
                .rows_affected();
                if deleted == 0 {
                    continue;
                }
                // A key archived before (a key-expired answer swept again) keeps its first
                // archive row: that is the evidence of the original execution.
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO idem_archive ({ARCHIVE_COLUMNS}) \
                     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
                     ON CONFLICT (tenant_id, key_digest) DO NOTHING"
                )))
                .bind(archive.tenant.as_str())
                .bind(&archive.key_digest[..])
                .bind(&archive.fingerprint.as_bytes()[..])
                .bind(archive.result_digest.as_ref().map(|d| &d[..]))
                .bind(archive.result_ref.as_deref())
                .bind(archive.state.as_str())
                .bind(archive.status.map(i64::from))
                .bind(archive.first_processed_at)
                .bind(archive.completed_at)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(map_err)?;
                applied += 1;
            } else {
                let headers = d.result.as_ref().map(|r| headers_json(&r.headers));
                // The dispute tier keeps audit fields only: the lease owner goes too.
                let n = sqlx::query(
                    "UPDATE idem_records SET tier = ?, version = version + 1, updated_at = ?, \
                       result_headers = COALESCE(?, result_headers), \
                       result_body = CASE WHEN ? THEN NULL ELSE result_body END, \
                       owner = CASE WHEN ? THEN NULL ELSE owner END \
                     WHERE tenant_id = ? AND key = ? AND version = ? AND tier = ?",
                )
                .bind(to.as_str())
                .bind(now)
                .bind(headers)
                .bind(d.result.is_some())
                .bind(to == Tier::Dispute)
                .bind(d.scope.tenant.as_str())
                .bind(d.scope.key.as_str())
                .bind(d.version)
                .bind(from.as_str())
                .execute(&mut *tx)
                .await
                .map_err(map_err)?
                .rows_affected();
                applied += n;
            }
        }
        tx.commit().await?;
        Ok(applied)
    }

    async fn scan_stale(
        &self,
        lease_before: Millis,
        limit: usize,
    ) -> Result<Vec<StaleRecord>, StoreError> {
        let rows: Vec<StaleColumns> = sqlx::query_as(
            "SELECT tenant_id, key, version, owner, lease_expires_at FROM idem_records \
             WHERE state = 'PROCESSING' AND lease_expires_at < ? \
             ORDER BY lease_expires_at LIMIT ?",
        )
        .bind(lease_before)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(self.pool())
        .await
        .map_err(map_err)?;
        rows.into_iter().map(StaleRecord::try_from).collect()
    }

    async fn recover_stale(
        &self,
        batch: &[StaleRecord],
        lease_before: Millis,
        now: Millis,
    ) -> Result<Vec<StaleRecord>, StoreError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.begin().await?;
        let mut recovered = Vec::new();
        for s in batch {
            let n = sqlx::query(
                "UPDATE idem_records SET state = ?, version = version + 1, \
                   lease_expires_at = NULL, updated_at = ? \
                 WHERE tenant_id = ? AND key = ? AND version = ? AND state = 'PROCESSING' \
                   AND lease_expires_at < ?",
            )
            .bind(RecordState::FailedRetryable.as_str())
            .bind(now)
            .bind(s.scope.tenant.as_str())
            .bind(s.scope.key.as_str())
            .bind(s.version)
            .bind(lease_before)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?
            .rows_affected();
            if n == 0 {
                continue;
            }
            sqlx::query(
                "INSERT INTO idem_retention_events \
                   (tenant_id, key, kind, at, owner, version, detail) \
                 VALUES (?, ?, 'stale_recovered', ?, ?, ?, ?)",
            )
            .bind(s.scope.tenant.as_str())
            .bind(s.scope.key.as_str())
            .bind(now)
            .bind(s.owner.as_ref().map(|o| o.as_str()))
            .bind(s.version + 1)
            .bind(format!(
                "PROCESSING past its lease (ended at {}); now FAILED_RETRYABLE",
                s.lease_expires_at
            ))
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
            recovered.push(s.clone());
        }
        tx.commit().await?;
        Ok(recovered)
    }

    async fn expire_archive(&self, archived_before: Millis) -> Result<ArchiveExpiry, StoreError> {
        let mut rows = 0;
        // Batches, so a large expiry does not hold the write lock for long.
        loop {
            let mut tx = self.begin().await?;
            let n = sqlx::query(
                "DELETE FROM idem_archive WHERE (tenant_id, key_digest) IN \
                 (SELECT tenant_id, key_digest FROM idem_archive \
                  WHERE archived_at < ? LIMIT 5000)",
            )
            .bind(archived_before)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?
            .rows_affected();
            tx.commit().await?;
            rows += n;
            if n < 5000 {
                break;
            }
        }
        Ok(ArchiveExpiry {
            rows,
            partitions_dropped: Vec::new(),
        })
    }

    async fn tier_of(&self, scope: &Scope) -> Result<Option<Tier>, StoreError> {
        let row = sqlx::query("SELECT tier FROM idem_records WHERE tenant_id = ? AND key = ?")
            .bind(scope.tenant.as_str())
            .bind(scope.key.as_str())
            .fetch_optional(self.pool())
            .await
            .map_err(map_err)?;
        row.as_ref().map(tier_of_row).transpose()
    }

    async fn usage(&self) -> Result<Vec<TierUsage>, StoreError> {
        // Summed lengths of the stored values (integers counted as 8 bytes): SQLite has
        // no per-row size without the optional dbstat table.
        let online: Vec<(String, i64, Option<f64>)> = sqlx::query_as(
            "SELECT tier, count(*), avg(length(tenant_id) + length(key) + length(principal) \
               + length(fingerprint) + length(state) + coalesce(length(owner), 0) \
               + coalesce(length(result_headers), 0) + coalesce(length(result_body), 0) \
               + coalesce(length(result_ref), 0) + length(tier) + 8 * 8) \
             FROM idem_records GROUP BY tier",
        )
        .fetch_all(self.pool())
        .await
        .map_err(map_err)?;
        let archive: (i64, Option<f64>) = sqlx::query_as(
            "SELECT count(*), avg(length(tenant_id) + length(key_digest) + length(fingerprint) \
               + coalesce(length(result_digest), 0) + coalesce(length(result_ref), 0) \
               + length(state) + 8 * 4) FROM idem_archive",
        )
        .fetch_one(self.pool())
        .await
        .map_err(map_err)?;
        Ok(TierUsage::per_tier(&online, archive))
    }
}

impl SqliteStore {
    /// Test and benchmark fixture: inserts `count` SUCCEEDED records in the retry tier
    /// under `tenant`, keys `{prefix}{n}`, completed at `completed_at`, each with a
    /// `body_bytes` response body and result reference `order-{prefix}{n}`.
    pub async fn seed_terminal(
        &self,
        tenant: &TenantId,
        prefix: &str,
        count: u64,
        completed_at: Millis,
        body_bytes: usize,
    ) -> Result<u64, StoreError> {
        const CHUNK: u64 = 50_000;
        let mut start = 0u64;
        while start < count {
            let end = (start + CHUNK).min(count);
            let mut tx = self.begin().await?;
            sqlx::query(
                "WITH RECURSIVE n(i) AS (SELECT ? UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?) \
                 INSERT INTO idem_records (tenant_id, key, principal, fingerprint, state, \
                   version, owner, lease_expires_at, result_status, result_headers, \
                   result_body, result_ref, attempts, created_at, updated_at, completed_at) \
                 SELECT ?, ? || i, 'seed', CAST(printf('%032d', i) AS BLOB), 'SUCCEEDED', 2, 'seed', NULL, 201, \
                   '[[\"content-type\",\"application/json\"]]', zeroblob(?), \
                   'order-' || ? || i, 1, ? - 400, ?, ? FROM n",
            )
            .bind(i64::try_from(start).unwrap_or(i64::MAX))
            .bind(i64::try_from(end).unwrap_or(i64::MAX))
            .bind(tenant.as_str())
            .bind(prefix)
            .bind(i64::try_from(body_bytes).unwrap_or(0))
            .bind(prefix)
            .bind(completed_at)
            .bind(completed_at)
            .bind(completed_at)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
            tx.commit().await?;
            start = end;
        }
        Ok(count)
    }
}
