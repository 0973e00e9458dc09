//! [`Inspect`] for the SQL stores, written once over [`Conn`] in the `$n` dialect every
//! backend accepts; the two words MySQL reads otherwise (the reserved `key`, the cast to
//! a 64-bit integer) are spelled per dialect by [`dialects!`].
//!
//! Owns the read-only statements over `idem_records` that operators' tools run (counts,
//! overdue PROCESSING records, key-prefix and result-reference search). It must not
//! write, and it adds no rule: what a record means stays with the stores.

use std::sync::Arc;

use futures::future::BoxFuture;
use idem_core::inspect::page_limit;
use idem_core::{Inspect, Millis, PastLease, RecordState, RecordSummary, StoreError, TenantId};

use crate::sql::{sql, Row, Sql};
use crate::SqlStore;

/// A statement failure as the store error of its kind: a pool or connection trouble, or
/// SQLite busy, is "unavailable" (retry), the rest a backend error.
fn store_error(e: sqlx::Error) -> StoreError {
    let transient = match &e {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => true,
        sqlx::Error::Database(db) => {
            idem_sqlite::is_busy(&e)
                || db
                    .code()
                    .is_some_and(|c| c.starts_with("08") || c.starts_with("57P"))
        }
        _ => false,
    };
    if transient {
        StoreError::Unavailable(e.to_string())
    } else {
        StoreError::Backend(e.to_string())
    }
}

/// One statement in both dialects.
struct Dialects {
    /// SQLite and PostgreSQL.
    common: &'static str,
    /// MySQL and MariaDB.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    mysql: &'static str,
}

/// A statement from literal parts, where `SUMMARY` selects a [`RecordSummary`]'s columns,
/// `KEY` is the key column (MySQL reserves the word; its backticks are not PostgreSQL's
/// quotes) and `INTEGER` the integer type of a cast (MySQL casts to `SIGNED` only, not
/// `BIGINT` or `INTEGER`).
macro_rules! dialects {
    ($($part:tt),* $(,)?) => {
        Dialects {
            common: concat!($(dialects!(@common $part)),*),
            mysql: concat!($(dialects!(@mysql $part)),*),
        }
    };
    (@common SUMMARY) => {
        "SELECT tenant_id, key, state, CAST(attempts AS BIGINT) AS attempts, lease_expires_at, \
         created_at, updated_at, result_ref FROM idem_records"
    };
    (@common KEY) => { "key" };
    (@common INTEGER) => { "INTEGER" };
    (@common $s:literal) => { $s };
    (@mysql SUMMARY) => {
        "SELECT tenant_id, `key`, state, CAST(attempts AS SIGNED) AS attempts, lease_expires_at, \
         created_at, updated_at, result_ref FROM idem_records"
    };
    (@mysql KEY) => { "`key`" };
    (@mysql INTEGER) => { "SIGNED" };
    (@mysql $s:literal) => { $s };
}

const PAST_LEASE: Dialects = dialects![
    SUMMARY,
    " WHERE state = 'PROCESSING' AND lease_expires_at < $1 \
     ORDER BY lease_expires_at LIMIT $2",
];

// SUBSTR, not LIKE: SQLite's LIKE ignores ASCII case, keys do not.
const KEY_PREFIX: Dialects = dialects![
    SUMMARY,
    " WHERE tenant_id = $1 AND SUBSTR(",
    KEY,
    ", 1, CAST($2 AS ",
    INTEGER,
    ")) = $3 \
     ORDER BY ",
    KEY,
    " LIMIT $4",
];

const RESULT_REF: Dialects = dialects![
    SUMMARY,
    " WHERE tenant_id = $1 AND result_ref = $2 ORDER BY created_at LIMIT $3",
];

fn limit_arg(limit: usize) -> i64 {
    i64::try_from(page_limit(limit)).unwrap_or(1)
}

fn summary(r: &Row) -> Result<RecordSummary, StoreError> {
    let state = r.text("state").map_err(store_error)?;
    Ok(RecordSummary {
        tenant: r.text("tenant_id").map_err(store_error)?,
        key: r.text("key").map_err(store_error)?,
        state: state
            .parse()
            .map_err(|e: idem_core::record::UnknownState| StoreError::Backend(e.to_string()))?,
        attempts: r.int("attempts").map_err(store_error)?,
        lease_expires_at: r.opt_int("lease_expires_at").map_err(store_error)?,
        created_at: r.int("created_at").map_err(store_error)?,
        updated_at: r.int("updated_at").map_err(store_error)?,
        result_ref: r.opt_text("result_ref").map_err(store_error)?,
    })
}

impl SqlStore {
    /// This store's records as an operator reads them.
    pub fn inspect(&self) -> Arc<dyn Inspect> {
        Arc::new(self.clone())
    }

    async fn rows(&self, q: Sql) -> Result<Vec<Row>, StoreError> {
        let mut conn = self.acquire().await.map_err(store_error)?;
        conn.conn().all(q).await.map_err(store_error)
    }

    /// `d` in this store's dialect.
    fn dialect(&self, d: &Dialects) -> &'static str {
        #[cfg(feature = "mysql")]
        if self.backend() == crate::Backend::Mysql {
            return d.mysql;
        }
        d.common
    }

    async fn summaries(&self, q: Sql) -> Result<Vec<RecordSummary>, StoreError> {
        self.rows(q).await?.iter().map(summary).collect()
    }
}

// Written as `async_trait` expands (this crate does not depend on the macro).
impl Inspect for SqlStore {
    fn now<'a, 'f>(&'a self) -> BoxFuture<'f, Result<Millis, StoreError>>
    where
        'a: 'f,
        Self: 'f,
    {
        Box::pin(self.store_now())
    }

    fn counts_by_state<'a, 'f>(
        &'a self,
    ) -> BoxFuture<'f, Result<Vec<(RecordState, i64)>, StoreError>>
    where
        'a: 'f,
        Self: 'f,
    {
        Box::pin(self.state_counts())
    }

    fn processing_past_lease<'a, 'f>(
        &'a self,
        now: Millis,
        limit: usize,
    ) -> BoxFuture<'f, Result<PastLease, StoreError>>
    where
        'a: 'f,
        Self: 'f,
    {
        Box::pin(self.past_lease(now, limit))
    }

    fn by_key_prefix<'a, 'b, 'c, 'f>(
        &'a self,
        tenant: &'b TenantId,
        prefix: &'c str,
        limit: usize,
    ) -> BoxFuture<'f, Result<Vec<RecordSummary>, StoreError>>
    where
        'a: 'f,
        'b: 'f,
        'c: 'f,
        Self: 'f,
    {
        Box::pin(self.key_prefix(tenant, prefix, limit))
    }

    fn by_result_ref<'a, 'b, 'c, 'f>(
        &'a self,
        tenant: &'b TenantId,
        result_ref: &'c str,
        limit: usize,
    ) -> BoxFuture<'f, Result<Vec<RecordSummary>, StoreError>>
    where
        'a: 'f,
        'b: 'f,
        'c: 'f,
        Self: 'f,
    {
        Box::pin(self.result_ref(tenant, result_ref, limit))
    }
}

impl SqlStore {
    async fn store_now(&self) -> Result<Millis, StoreError> {
        self.retention().now().await
    }

    async fn state_counts(&self) -> Result<Vec<(RecordState, i64)>, StoreError> {
        let rows = self
            .rows(sql(
                "SELECT state, COUNT(*) AS n FROM idem_records GROUP BY state",
            ))
            .await?;
        let mut counts: Vec<(RecordState, i64)> =
            RecordState::ALL.into_iter().map(|s| (s, 0)).collect();
        for r in &rows {
            let state = r.text("state").map_err(store_error)?;
            let n = r.int("n").map_err(store_error)?;
            if let Some(c) = counts.iter_mut().find(|(s, _)| s.as_str() == state) {
                c.1 = n;
            }
        }
        Ok(counts)
    }

    async fn past_lease(&self, now: Millis, limit: usize) -> Result<PastLease, StoreError> {
        let count = self
            .rows(
                sql("SELECT COUNT(*) AS n FROM idem_records \
                     WHERE state = 'PROCESSING' AND lease_expires_at < $1")
                .bind(now),
            )
            .await?
            .first()
            .map(|r| r.int("n").map_err(store_error))
            .transpose()?
            .unwrap_or(0);
        let first = self
            .summaries(
                sql(self.dialect(&PAST_LEASE))
                    .bind(now)
                    .bind(limit_arg(limit)),
            )
            .await?;
        Ok(PastLease { count, first })
    }

    async fn key_prefix(
        &self,
        tenant: &TenantId,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<RecordSummary>, StoreError> {
        // Keys are visible ASCII: another prefix names none (and MySQL would refuse to
        // compare it with the ASCII column).
        if !prefix.is_ascii() {
            return Ok(Vec::new());
        }
        let len = i64::try_from(prefix.len()).unwrap_or(i64::MAX);
        self.summaries(
            sql(self.dialect(&KEY_PREFIX))
                .bind(tenant.as_str())
                .bind(len)
                .bind(prefix)
                .bind(limit_arg(limit)),
        )
        .await
    }

    async fn result_ref(
        &self,
        tenant: &TenantId,
        result_ref: &str,
        limit: usize,
    ) -> Result<Vec<RecordSummary>, StoreError> {
        self.summaries(
            sql(self.dialect(&RESULT_REF))
                .bind(tenant.as_str())
                .bind(result_ref)
                .bind(limit_arg(limit)),
        )
        .await
    }
}

impl crate::Store {
    /// The records as an operator reads them. Redis keeps no index to scan: its
    /// inspection answers "not supported by this store".
    pub fn inspect(&self) -> Arc<dyn Inspect> {
        match self.sql() {
            Some(sql) => sql.inspect(),
            None => Arc::new(idem_core::inspect::NotSupported::new("redis")),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use idem_core::{ClaimRequest, Fingerprint, IdempotencyKey, OwnerId, Principal, Scope};

    use super::*;

    fn claim(key: &str) -> ClaimRequest {
        ClaimRequest {
            scope: Scope::new(
                TenantId::new("t1").unwrap(),
                IdempotencyKey::new(key).unwrap(),
            ),
            principal: Principal::new("p").unwrap(),
            fingerprint: Fingerprint::of_bytes(key.as_bytes()),
            owner: OwnerId::new("worker").unwrap(),
            lease: Duration::from_secs(1),
        }
    }

    #[tokio::test]
    async fn counts_prefixes_and_overdue_leases_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqlStore::open_sqlite_path(dir.path().join("inspect.db"))
            .await
            .unwrap();
        for key in ["ab-1", "ab-2", "AB-3", "zz"] {
            store.records().claim(&claim(key)).await.unwrap();
        }
        let inspect = store.inspect();
        let counts = inspect.counts_by_state().await.unwrap();
        assert_eq!(counts.len(), RecordState::ALL.len());
        assert!(counts.contains(&(RecordState::Processing, 4)), "{counts:?}");
        assert!(counts.contains(&(RecordState::Succeeded, 0)), "{counts:?}");

        let t1 = TenantId::new("t1").unwrap();
        // Case-sensitive, bounded, by key.
        let found = inspect.by_key_prefix(&t1, "ab-", 10).await.unwrap();
        let keys: Vec<&str> = found.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["ab-1", "ab-2"]);
        assert_eq!(inspect.by_key_prefix(&t1, "ab-", 1).await.unwrap().len(), 1);
        let other = TenantId::new("t2").unwrap();
        assert!(inspect
            .by_key_prefix(&other, "ab", 10)
            .await
            .unwrap()
            .is_empty());

        // Judged by the store's clock: nothing overdue now, all four a little later.
        let now = inspect.now().await.unwrap();
        assert_eq!(
            inspect.processing_past_lease(now, 10).await.unwrap().count,
            0
        );
        let later = inspect.processing_past_lease(now + 2_000, 2).await.unwrap();
        assert_eq!((later.count, later.first.len()), (4, 2));
        assert_eq!(later.first[0].state, RecordState::Processing);

        assert!(inspect
            .by_result_ref(&t1, "/v1/none", 10)
            .await
            .unwrap()
            .is_empty());
    }
}
