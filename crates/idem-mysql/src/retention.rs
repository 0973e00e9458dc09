//! Retention on MySQL / MariaDB: the tier column, the one archive table, stale recovery
//! (see `idem_core::retention`).
//!
//! Every batch is one READ COMMITTED transaction of compare-and-set statements (on
//! version and tier, or version, state and lease for stale records), so two sweepers or
//! a rerun after a crash reach the same final state. Archiving deletes the online row and
//! inserts the archive row in the same transaction. The archive is one table keyed by
//! `(tenant_id, key_digest)` (MySQL partitioning would need the partition column in that
//! key and takes DDL locks to add months); expiry deletes rows by `archived_at` in
//! batches through its index.
//!
//! Scans take their time bounds from the caller; only [`RetentionStore::now`] reads the
//! server clock. It must not delete an online record except by moving it to the archive.

use async_trait::async_trait;
use idem_core::retention::{
    ArchiveExpiry, ArchiveLookup, ArchivedRecord, Demotion, DueRecord, RetentionStore, ScanCursor,
    StaleColumns, StaleRecord, Tier, TierUsage,
};
use idem_core::{IdempotencyKey, Millis, RecordState, Scope, StoreError, TenantId};
use idem_store_kit::row::{headers_json, ArchiveRow, DueRow};
use sqlx::mysql::MySqlRow;
use sqlx::Row;

use crate::error::map_err;
use crate::sql::{CLOCK, RECORD_COLS};
use crate::MysqlStore;

const TERMINAL: &str = "state IN ('SUCCEEDED', 'FAILED_TERMINAL')";

const ARCHIVE_COLS: &str = "tenant_id, key_digest, fingerprint, result_digest, result_ref, \
     state, status, first_processed_at, completed_at, archived_at";

/// Rows per archive expiry statement: short transactions, short lock holds.
const EXPIRY_BATCH: i64 = 5000;

fn err(what: &str) -> impl Fn(sqlx::Error) -> StoreError + '_ {
    move |e| map_err(what, e)
}

fn archived_from_row(row: &MySqlRow) -> Result<ArchivedRecord, StoreError> {
    let g = err("decode");
    ArchiveRow {
        tenant_id: row.try_get("tenant_id").map_err(&g)?,
        key_digest: row.try_get("key_digest").map_err(&g)?,
        fingerprint: row.try_get("fingerprint").map_err(&g)?,
        result_digest: row.try_get("result_digest").map_err(&g)?,
        result_ref: row.try_get("result_ref").map_err(&g)?,
        state: row.try_get("state").map_err(&g)?,
        status: row
            .try_get::<Option<i32>, _>("status")
            .map_err(&g)?
            .map(i64::from),
        first_processed_at: row.try_get("first_processed_at").map_err(&g)?,
        completed_at: row.try_get("completed_at").map_err(&g)?,
        archived_at: row.try_get("archived_at").map_err(&g)?,
    }
    .decode()
}

#[async_trait]
impl ArchiveLookup for MysqlStore {
    async fn archived(
        &self,
        tenant: &TenantId,
        key: &IdempotencyKey,
    ) -> Result<Option<ArchivedRecord>, StoreError> {
        let digest = idem_core::retention::key_digest(key);
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {ARCHIVE_COLS} FROM idem_archive WHERE tenant_id = ? AND key_digest = ?"
        )))
        .bind(tenant.as_str())
        .bind(&digest[..])
        .fetch_optional(&self.pool)
        .await
        .map_err(err("archive lookup"))?;
        row.as_ref().map(archived_from_row).transpose()
    }

    async fn archived_by_ref(
        &self,
        tenant: Option<&TenantId>,
        result_ref: &str,
    ) -> Result<Vec<ArchivedRecord>, StoreError> {
        let tenant = tenant.map(|t| t.as_str());
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {ARCHIVE_COLS} FROM idem_archive \
             WHERE result_ref = ? AND (? IS NULL OR tenant_id = ?) \
             ORDER BY archived_at, tenant_id, key_digest"
        )))
        .bind(result_ref)
        .bind(tenant)
        .bind(tenant)
        .fetch_all(&self.pool)
        .await
        .map_err(err("archive lookup"))?;
        rows.iter().map(archived_from_row).collect()
    }
}

#[async_trait]
impl RetentionStore for MysqlStore {
    fn backend(&self) -> &'static str {
        "mysql"
    }

    async fn now(&self) -> Result<Millis, StoreError> {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT {CLOCK}")))
            .bind(self.clock.millis())
            .fetch_one(&self.pool)
            .await
            .map_err(err("now"))
    }

    async fn scan_due(
        &self,
        tier: Tier,
        completed_before: Millis,
        after: Option<&ScanCursor>,
        limit: usize,
    ) -> Result<Vec<DueRecord>, StoreError> {
        let (c, t, k) = ScanCursor::start(after);
        // The row comparison is spelled out: both servers turn it into one range on the
        // due index `(tier, completed_at, tenant_id, key)`.
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {RECORD_COLS}, tier FROM idem_records \
             WHERE tier = ? AND completed_at IS NOT NULL AND completed_at < ? AND {TERMINAL} \
               AND (completed_at, tenant_id, `key`) > (?, ?, ?) \
             ORDER BY completed_at, tenant_id, `key` LIMIT ?"
        )))
        .bind(tier.as_str())
        .bind(completed_before)
        .bind(c)
        .bind(t)
        .bind(k)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(err("scan due"))?;
        rows.iter()
            .map(|row| {
                let record = crate::row::record_row(row)?;
                let tier = row.try_get("tier").map_err(err("decode"))?;
                DueRow { record, tier }.decode()
            })
            .collect()
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
        let mut tx = self.pool.begin().await.map_err(err("demote"))?;
        let mut applied = 0u64;
        for d in batch {
            if to == Tier::Archive {
                let archive = d.archive_row()?;
                let deleted = sqlx::query(
                    "DELETE FROM idem_records \
                     WHERE tenant_id = ? AND `key` = ? AND version = ? AND tier = ?",
                )
                .bind(d.scope.tenant.as_str())
                .bind(d.scope.key.as_str())
                .bind(d.version)
                .bind(from.as_str())
                .execute(&mut *tx)
                .await
                .map_err(err("archive"))?
                .rows_affected();
                if deleted == 0 {
                    continue;
                }
                // A key archived before keeps its first archive row: the evidence of the
                // original execution. A duplicate on the primary key locks that record
                // only (no gap lock).
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO idem_archive ({ARCHIVE_COLS}) \
                     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
                     ON DUPLICATE KEY UPDATE tenant_id = tenant_id"
                )))
                .bind(archive.tenant.as_str())
                .bind(&archive.key_digest[..])
                .bind(&archive.fingerprint.as_bytes()[..])
                .bind(archive.result_digest.as_ref().map(|d| &d[..]))
                .bind(archive.result_ref.as_deref())
                .bind(archive.state.as_str())
                .bind(archive.status.map(i32::from))
                .bind(archive.first_processed_at)
                .bind(archive.completed_at)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(err("archive"))?;
                applied += 1;
            } else {
                let headers = d.result.as_ref().map(|r| headers_json(&r.headers));
                // The dispute tier keeps audit fields only: the lease owner goes too.
                let n = sqlx::query(
                    "UPDATE idem_records SET tier = ?, version = version + 1, updated_at = ?, \
                       result_headers = COALESCE(?, result_headers), \
                       result_body = CASE WHEN ? THEN NULL ELSE result_body END, \
                       owner = CASE WHEN ? THEN NULL ELSE owner END \
                     WHERE tenant_id = ? AND `key` = ? AND version = ? AND tier = ?",
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
                .map_err(err("demote"))?
                .rows_affected();
                applied += n;
            }
        }
        tx.commit().await.map_err(err("demote"))?;
        Ok(applied)
    }

    async fn scan_stale(
        &self,
        lease_before: Millis,
        limit: usize,
    ) -> Result<Vec<StaleRecord>, StoreError> {
        let rows: Vec<StaleColumns> = sqlx::query_as(
            "SELECT tenant_id, `key`, version, owner, lease_expires_at FROM idem_records \
             WHERE state = 'PROCESSING' AND lease_expires_at < ? \
             ORDER BY lease_expires_at LIMIT ?",
        )
        .bind(lease_before)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(err("scan stale"))?;
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
        let mut tx = self.pool.begin().await.map_err(err("recover stale"))?;
        let mut recovered = Vec::new();
        for s in batch {
            // Compare-and-set on version, state and a lease still over (a heartbeat
            // moves the lease without a new version).
            let n = sqlx::query(
                "UPDATE idem_records SET state = ?, version = version + 1, \
                   lease_expires_at = NULL, updated_at = ? \
                 WHERE tenant_id = ? AND `key` = ? AND version = ? AND state = 'PROCESSING' \
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
            .map_err(err("recover stale"))?
            .rows_affected();
            if n == 0 {
                continue;
            }
            sqlx::query(
                "INSERT INTO idem_retention_events \
                   (tenant_id, `key`, kind, at, owner, version, detail) \
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
            .map_err(err("recover stale"))?;
            recovered.push(s.clone());
        }
        tx.commit().await.map_err(err("recover stale"))?;
        Ok(recovered)
    }

    async fn expire_archive(&self, archived_before: Millis) -> Result<ArchiveExpiry, StoreError> {
        let mut rows = 0;
        loop {
            let n = sqlx::query(
                "DELETE FROM idem_archive WHERE archived_at < ? ORDER BY archived_at LIMIT ?",
            )
            .bind(archived_before)
            .bind(EXPIRY_BATCH)
            .execute(&self.pool)
            .await
            .map_err(err("expire archive"))?
            .rows_affected();
            rows += n;
            if n < EXPIRY_BATCH as u64 {
                break;
            }
        }
        Ok(ArchiveExpiry {
            rows,
            partitions_dropped: Vec::new(),
        })
    }

    async fn tier_of(&self, scope: &Scope) -> Result<Option<Tier>, StoreError> {
        let tier: Option<String> =
            sqlx::query_scalar("SELECT tier FROM idem_records WHERE tenant_id = ? AND `key` = ?")
                .bind(scope.tenant.as_str())
                .bind(scope.key.as_str())
                .fetch_optional(&self.pool)
                .await
                .map_err(err("tier"))?;
        tier.as_deref().map(idem_store_kit::row::tier).transpose()
    }

    async fn usage(&self) -> Result<Vec<TierUsage>, StoreError> {
        // Summed lengths of the stored values (integers counted as 8 bytes), as SQLite
        // reports them: InnoDB keeps no per-row size.
        let online: Vec<(String, i64, Option<f64>)> = sqlx::query_as(
            "SELECT tier, COUNT(*), CAST(AVG(LENGTH(tenant_id) + LENGTH(`key`) \
               + LENGTH(principal) + LENGTH(fingerprint) + LENGTH(state) \
               + COALESCE(LENGTH(owner), 0) + COALESCE(LENGTH(result_headers), 0) \
               + COALESCE(LENGTH(result_body), 0) + COALESCE(LENGTH(result_ref), 0) \
               + LENGTH(tier) + 8 * 8) AS DOUBLE) \
             FROM idem_records GROUP BY tier",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(err("usage"))?;
        let archive: (i64, Option<f64>) = sqlx::query_as(
            "SELECT COUNT(*), CAST(AVG(LENGTH(tenant_id) + LENGTH(key_digest) \
               + LENGTH(fingerprint) + COALESCE(LENGTH(result_digest), 0) \
               + COALESCE(LENGTH(result_ref), 0) + LENGTH(state) + 8 * 4) AS DOUBLE) \
             FROM idem_archive",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(err("usage"))?;
        Ok(TierUsage::per_tier(&online, archive))
    }
}

impl MysqlStore {
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
        const CHUNK: u64 = 500;
        let body = vec![0u8; body_bytes];
        let mut start = 0u64;
        while start < count {
            let end = (start + CHUNK).min(count);
            let values = vec![
                "(?, ?, 'seed', ?, 'SUCCEEDED', 2, 'seed', NULL, 201, \
                 '[[\"content-type\",\"application/json\"]]', ?, ?, 1, ?, ?, ?)";
                (end - start) as usize
            ]
            .join(", ");
            let text = format!(
                "INSERT INTO idem_records (tenant_id, `key`, principal, fingerprint, state, \
                   version, owner, lease_expires_at, result_status, result_headers, \
                   result_body, result_ref, attempts, created_at, updated_at, completed_at) \
                 VALUES {values}"
            );
            let mut q = sqlx::query(sqlx::AssertSqlSafe(text));
            for i in start..end {
                let key = format!("{prefix}{i}");
                let mut fingerprint = [0u8; 32];
                fingerprint[24..].copy_from_slice(&i.to_be_bytes());
                q = q
                    .bind(tenant.as_str())
                    .bind(key.clone())
                    .bind(fingerprint.to_vec())
                    .bind(body.clone())
                    .bind(format!("order-{key}"))
                    .bind(completed_at - 400)
                    .bind(completed_at)
                    .bind(completed_at);
            }
            q.execute(&self.pool).await.map_err(err("seed"))?;
            start = end;
        }
        Ok(count)
    }
}
