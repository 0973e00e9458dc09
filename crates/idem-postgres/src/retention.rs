//! Retention on PostgreSQL: the tier column, the monthly-partitioned archive, stale
//! recovery (see `idem_core::retention`).
//!
//! - Demotions are one statement per batch over `unnest` arrays, each row a
//!   compare-and-set on `(version, tier)`; archiving is one statement that deletes the
//!   online rows that still match and inserts exactly those into the archive, so a
//!   crash leaves either both or neither.
//! - `idem_archive` is `PARTITION BY RANGE (archived_month)`; the partition for a month
//!   is created on demand (under an advisory lock, so two sweepers do not race on the
//!   catalog) and archive expiry is a `DROP TABLE` of whole months whose every row is
//!   older than the cutoff — rows may outlive the archive window by up to a month.
//! - The archive has no unique constraint (a partitioned table could only enforce one
//!   per partition); inserts skip a key digest already archived.
//!
//! Scans take their time bounds from the caller; only [`RetentionStore::now`] reads the
//! database clock.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock, PoisonError};

use async_trait::async_trait;
use idem_core::retention::{
    ArchiveExpiry, ArchiveLookup, ArchivedRecord, Demotion, DueRecord, RetentionStore, ScanCursor,
    StaleColumns, StaleRecord, Tier, TierUsage,
};
use idem_core::{IdempotencyKey, Millis, RecordState, Scope, StoreError, TenantId};
use idem_store_kit::row::{ArchiveRow, DueRow};
use sqlx::postgres::PgRow;
use sqlx::Row;

use crate::error::map_err;
use crate::PgStore;

const CLOCK: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

const RECORD_COLS: &str = "r.tenant_id, r.key, r.principal, r.fingerprint, r.state, r.version, \
     r.owner, r.lease_expires_at, r.result_status, r.result_headers::text AS result_headers, \
     r.result_body, r.result_ref, r.attempts, r.created_at, r.updated_at, r.completed_at, r.tier";

const ARCHIVE_COLS: &str = "tenant_id, key_digest, fingerprint, result_digest, result_ref, \
     state, status, first_processed_at, completed_at, archived_at";

/// Same constant class as the migration lock, another name.
const LOCK_CLASS: i32 = 0x1DE0_0001;

fn err(what: &str) -> impl Fn(sqlx::Error) -> StoreError + '_ {
    move |e| map_err(what, e)
}

/// Months whose partition this process has seen exist (schema-qualified name).
fn known_partitions() -> &'static Mutex<HashSet<String>> {
    static KNOWN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    KNOWN.get_or_init(Mutex::default)
}

impl PgStore {
    fn qualified(&self, table: &str) -> String {
        match self.schema.as_deref() {
            Some(s) => format!("\"{s}\".{table}"),
            None => table.to_string(),
        }
    }

    /// Creates the archive partition for the month containing `at` if missing; returns
    /// the month's first day (`YYYY-MM-01`).
    async fn archive_partition(&self, at: Millis) -> Result<String, StoreError> {
        let (suffix, from, to): (String, String, String) = sqlx::query_as(
            "SELECT to_char(m, 'YYYYMM'), m::text, (m + interval '1 month')::date::text
             FROM (SELECT date_trunc('month', to_timestamp($1 / 1000.0) AT TIME ZONE 'UTC')::date
                   AS m) x",
        )
        .bind(at)
        .fetch_one(&self.pool)
        .await
        .map_err(err("archive partition"))?;
        let name = self.qualified(&format!("idem_archive_p{suffix}"));
        let known = known_partitions()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&name);
        if !known {
            let mut tx = self.pool.begin().await.map_err(err("archive partition"))?;
            // Two sweepers creating the same partition would race in the catalog.
            sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
                .bind(LOCK_CLASS)
                .bind(format!("idem.archive_partition:{name}"))
                .execute(&mut *tx)
                .await
                .map_err(err("archive partition"))?;
            let create = format!(
                "CREATE TABLE IF NOT EXISTS {name} PARTITION OF {} \
                 FOR VALUES FROM ('{from}') TO ('{to}')",
                self.qualified("idem_archive")
            );
            sqlx::query(sqlx::AssertSqlSafe(create))
                .execute(&mut *tx)
                .await
                .map_err(err("archive partition"))?;
            tx.commit().await.map_err(err("archive partition"))?;
            known_partitions()
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(name);
        }
        Ok(from)
    }
}

/// Reads an archive row's columns; `idem_store_kit::row` validates them.
fn archived_from_row(row: &PgRow) -> Result<ArchivedRecord, StoreError> {
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

fn tier_of_row(row: &PgRow) -> Result<Tier, StoreError> {
    idem_store_kit::row::tier(row.try_get("tier").map_err(err("decode"))?)
}

#[async_trait]
impl ArchiveLookup for PgStore {
    async fn archived(
        &self,
        tenant: &TenantId,
        key: &IdempotencyKey,
    ) -> Result<Option<ArchivedRecord>, StoreError> {
        let digest = idem_core::retention::key_digest(key);
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {ARCHIVE_COLS} FROM {} WHERE tenant_id = $1 AND key_digest = $2 \
             ORDER BY archived_at LIMIT 1",
            self.qualified("idem_archive")
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
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {ARCHIVE_COLS} FROM {} \
             WHERE result_ref = $1 AND ($2::text IS NULL OR tenant_id = $2) \
             ORDER BY archived_at, tenant_id, key_digest",
            self.qualified("idem_archive")
        )))
        .bind(result_ref)
        .bind(tenant.map(|t| t.as_str()))
        .fetch_all(&self.pool)
        .await
        .map_err(err("archive lookup"))?;
        rows.iter().map(archived_from_row).collect()
    }
}

#[async_trait]
impl RetentionStore for PgStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn now(&self) -> Result<Millis, StoreError> {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT {CLOCK} + $1")))
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
        // The walk must follow the due index in order. With missing or stale statistics
        // (a tier that was empty at the last ANALYZE, a freshly loaded table) the planner
        // estimates a handful of rows and picks a bitmap scan plus a sort of every due
        // record — per batch, which made a 1-million-record sweep crawl. Ruling out the
        // sort and the bitmap scan for this one transaction leaves only the ordered index
        // scan, whose cost is the batch size whatever the statistics say.
        let mut tx = self.pool.begin().await.map_err(err("scan due"))?;
        sqlx::query(
            "SELECT set_config('enable_sort', 'off', true), \
                    set_config('enable_bitmapscan', 'off', true), \
                    set_config('enable_seqscan', 'off', true)",
        )
        .execute(&mut *tx)
        .await
        .map_err(err("scan due"))?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {RECORD_COLS} FROM {} r \
             WHERE r.tier = $1 AND r.completed_at IS NOT NULL AND r.completed_at < $2 \
               AND r.state IN ('SUCCEEDED', 'FAILED_TERMINAL') \
               AND (r.completed_at, r.tenant_id, r.key) > ($3, $4, $5) \
             ORDER BY r.completed_at, r.tenant_id, r.key LIMIT $6",
            self.table()
        )))
        .bind(tier.as_str())
        .bind(completed_before)
        .bind(c)
        .bind(t)
        .bind(k)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&mut *tx)
        .await
        .map_err(err("scan due"))?;
        tx.commit().await.map_err(err("scan due"))?;
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
        let tenants: Vec<&str> = batch.iter().map(|d| d.scope.tenant.as_str()).collect();
        let keys: Vec<&str> = batch.iter().map(|d| d.scope.key.as_str()).collect();
        let versions: Vec<i64> = batch.iter().map(|d| d.version).collect();
        if to != Tier::Archive {
            let headers: Vec<Option<String>> = batch
                .iter()
                .map(|d| {
                    d.result
                        .as_ref()
                        .map(|r| idem_store_kit::row::headers_json(&r.headers))
                })
                .collect();
            // The dispute tier keeps audit fields only: the lease owner goes too.
            let n = sqlx::query(sqlx::AssertSqlSafe(format!(
                "UPDATE {t} r SET tier = $1, version = r.version + 1, updated_at = $2,
                   result_headers = COALESCE(u.headers::jsonb, r.result_headers),
                   result_body = CASE WHEN u.headers IS NULL THEN r.result_body END,
                   owner = CASE WHEN $1 = 'dispute' THEN NULL ELSE r.owner END
                 FROM unnest($3::text[], $4::text[], $5::bigint[], $6::text[])
                      AS u(tenant_id, key, version, headers)
                 WHERE r.tenant_id = u.tenant_id AND r.key = u.key AND r.version = u.version
                   AND r.tier = $7",
                t = self.table()
            )))
            .bind(to.as_str())
            .bind(now)
            .bind(&tenants)
            .bind(&keys)
            .bind(&versions)
            .bind(&headers)
            .bind(from.as_str())
            .execute(&self.pool)
            .await
            .map_err(err("demote"))?
            .rows_affected();
            return Ok(n);
        }
        let mut digests = Vec::with_capacity(batch.len());
        let mut result_digests = Vec::with_capacity(batch.len());
        for d in batch {
            let a = d.archive_row()?;
            digests.push(a.key_digest.to_vec());
            result_digests.push(a.result_digest.map(|d| d.to_vec()));
        }
        let month = self.archive_partition(now).await?;
        let a = self.qualified("idem_archive");
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "WITH u AS (
                 SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bytea[],
                                      $5::bytea[])
                     AS u(tenant_id, key, version, key_digest, result_digest)
             ), del AS (
                 DELETE FROM {t} r USING u
                 WHERE r.tenant_id = u.tenant_id AND r.key = u.key AND r.version = u.version
                   AND r.tier = $6
                 RETURNING r.tenant_id, r.key, r.fingerprint, r.result_ref, r.state,
                           r.result_status, r.created_at, r.completed_at
             ), ins AS (
                 INSERT INTO {a} ({ARCHIVE_COLS}, archived_month)
                 SELECT d.tenant_id, u.key_digest, d.fingerprint, u.result_digest,
                        d.result_ref, d.state, d.result_status, d.created_at, d.completed_at,
                        $7, $8::date
                 FROM del d JOIN u ON u.tenant_id = d.tenant_id AND u.key = d.key
                 WHERE NOT EXISTS (SELECT 1 FROM {a} x
                                   WHERE x.tenant_id = d.tenant_id
                                     AND x.key_digest = u.key_digest)
                 RETURNING 1
             )
             SELECT count(*) FROM del",
            t = self.table()
        )))
        .bind(&tenants)
        .bind(&keys)
        .bind(&versions)
        .bind(&digests)
        .bind(&result_digests)
        .bind(from.as_str())
        .bind(now)
        .bind(&month)
        .fetch_one(&self.pool)
        .await
        .map_err(err("archive"))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn scan_stale(
        &self,
        lease_before: Millis,
        limit: usize,
    ) -> Result<Vec<StaleRecord>, StoreError> {
        let rows: Vec<StaleColumns> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT tenant_id, key, version, owner, lease_expires_at FROM {} \
             WHERE state = 'PROCESSING' AND lease_expires_at < $1 \
             ORDER BY lease_expires_at LIMIT $2",
            self.table()
        )))
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
        let tenants: Vec<&str> = batch.iter().map(|s| s.scope.tenant.as_str()).collect();
        let keys: Vec<&str> = batch.iter().map(|s| s.scope.key.as_str()).collect();
        let versions: Vec<i64> = batch.iter().map(|s| s.version).collect();
        // Compare-and-set on version, state and a lease still over (a heartbeat moves the
        // lease without a new version); the event is written by the same statement.
        let rows: Vec<(String, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "WITH upd AS (
                 UPDATE {t} r SET state = $1, version = r.version + 1,
                        lease_expires_at = NULL, updated_at = $2
                 FROM unnest($3::text[], $4::text[], $5::bigint[]) AS u(tenant_id, key, version)
                 WHERE r.tenant_id = u.tenant_id AND r.key = u.key AND r.version = u.version
                   AND r.state = 'PROCESSING' AND r.lease_expires_at < $6
                 RETURNING r.tenant_id, r.key, r.owner, r.version
             ), ev AS (
                 INSERT INTO {e} (tenant_id, key, kind, at, owner, version, detail)
                 SELECT tenant_id, key, 'stale_recovered', $2, owner, version,
                        'PROCESSING past its lease; now FAILED_RETRYABLE' FROM upd
             )
             SELECT tenant_id, key FROM upd",
            t = self.table(),
            e = self.qualified("idem_retention_events"),
        )))
        .bind(RecordState::FailedRetryable.as_str())
        .bind(now)
        .bind(&tenants)
        .bind(&keys)
        .bind(&versions)
        .bind(lease_before)
        .fetch_all(&self.pool)
        .await
        .map_err(err("recover stale"))?;
        Ok(batch
            .iter()
            .filter(|s| {
                rows.iter()
                    .any(|(t, k)| t == s.scope.tenant.as_str() && k == s.scope.key.as_str())
            })
            .cloned()
            .collect())
    }

    async fn expire_archive(&self, archived_before: Millis) -> Result<ArchiveExpiry, StoreError> {
        // Whole months only: a partition goes when its every row is older than the cutoff.
        let parts: Vec<String> = sqlx::query_scalar(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = to_regclass($1)
               AND c.relname ~ '^idem_archive_p[0-9]{6}$'
               AND extract(epoch FROM (to_date(right(c.relname, 6), 'YYYYMM')
                                       + interval '1 month')) * 1000 <= $2
             ORDER BY c.relname",
        )
        .bind(self.qualified("idem_archive"))
        .bind(archived_before)
        .fetch_all(&self.pool)
        .await
        .map_err(err("expire archive"))?;
        let mut out = ArchiveExpiry::default();
        for part in parts {
            let name = self.qualified(&part);
            let rows: i64 =
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {name}")))
                    .fetch_one(&self.pool)
                    .await
                    .map_err(err("expire archive"))?;
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP TABLE IF EXISTS {name}")))
                .execute(&self.pool)
                .await
                .map_err(err("expire archive"))?;
            known_partitions()
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&name);
            out.rows += u64::try_from(rows).unwrap_or(0);
            out.partitions_dropped.push(part);
        }
        Ok(out)
    }

    async fn tier_of(&self, scope: &Scope) -> Result<Option<Tier>, StoreError> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT tier FROM {} WHERE tenant_id = $1 AND key = $2",
            self.table()
        )))
        .bind(scope.tenant.as_str())
        .bind(scope.key.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(err("tier"))?;
        row.as_ref().map(tier_of_row).transpose()
    }

    async fn usage(&self) -> Result<Vec<TierUsage>, StoreError> {
        let online: Vec<(String, i64, Option<f64>)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT tier, count(*), avg(pg_column_size(r.*))::float8 FROM {} r GROUP BY tier",
            self.table()
        )))
        .fetch_all(&self.pool)
        .await
        .map_err(err("usage"))?;
        let archive: (i64, Option<f64>) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT count(*), avg(pg_column_size(a.*))::float8 FROM {} a",
            self.qualified("idem_archive")
        )))
        .fetch_one(&self.pool)
        .await
        .map_err(err("usage"))?;
        Ok(TierUsage::per_tier(&online, archive))
    }
}

impl PgStore {
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
        const CHUNK: u64 = 100_000;
        let mut start = 0u64;
        while start < count {
            let end = (start + CHUNK).min(count);
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {} (tenant_id, key, principal, fingerprint, state, version, owner,
                   lease_expires_at, result_status, result_headers, result_body, result_ref,
                   attempts, created_at, updated_at, completed_at)
                 SELECT $1, $2 || i, 'seed', sha256(($2 || i)::bytea), 'SUCCEEDED', 2, 'seed',
                   NULL, 201, '[[\"content-type\", \"application/json\"]]'::jsonb,
                   substring(decode(repeat(md5(i::text), $5 / 16 + 1), 'hex') FROM 1 FOR $5),
                   'order-' || $2 || i, 1, $6 - 400, $6, $6
                 FROM generate_series($3::bigint, $4::bigint - 1) AS i",
                self.table()
            )))
            .bind(tenant.as_str())
            .bind(prefix)
            .bind(i64::try_from(start).unwrap_or(i64::MAX))
            .bind(i64::try_from(end).unwrap_or(i64::MAX))
            .bind(i32::try_from(body_bytes).unwrap_or(i32::MAX))
            .bind(completed_at)
            .execute(&self.pool)
            .await
            .map_err(err("seed"))?;
            start = end;
        }
        Ok(count)
    }
}
