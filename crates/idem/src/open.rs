//! Opening a store from a `--database-url`, through `idem-sql` (the one place that knows
//! every backend); the commands work on the roles it hands out (`dyn IdempotencyStore`,
//! `dyn LeaseStore`, …). Must not open a backend crate's store directly.

use std::sync::Arc;

use idem_core::{ArchiveLookup, IdempotencyStore, LeaseStore, StoreError};
use idem_sql::{OpenOptions, SqlStore, Store};
use idem_sqlite::SqliteOptions;

pub use idem_sql::{redact, Backend};

/// The default when no URL is given: the embedded file.
pub fn default_url() -> String {
    idem_sql::DEFAULT_URL.to_string()
}

/// Which backend a URL names.
pub fn backend_of(url: &str) -> Result<Backend, StoreError> {
    Backend::of_url(url)
}

/// Opens the store a URL names, with default options; SQLite and PostgreSQL apply
/// pending migrations.
pub async fn open(url: &str) -> Result<Store, StoreError> {
    Store::open(url, &OpenOptions::default()).await
}

/// Opens the store a URL names for claims.
pub async fn open_store(url: &str) -> Result<Arc<dyn IdempotencyStore>, StoreError> {
    Ok(open(url).await?.records())
}

/// Opens the lease store a URL names.
pub async fn open_lease_store(url: &str) -> Result<Arc<dyn LeaseStore>, StoreError> {
    Ok(open(url).await?.leases())
}

/// The archive of the store a URL names, if it keeps one.
pub async fn open_archive(url: &str) -> Result<Option<Arc<dyn ArchiveLookup>>, StoreError> {
    Ok(open(url).await?.archive())
}

/// The URL a bench runs against: `url`, or without an explicit URL a file named `file`
/// in a temporary directory, kept until the returned guard drops.
pub(crate) fn bench_url(
    url: &str,
    file: &str,
) -> Result<(String, Option<tempfile::TempDir>), StoreError> {
    if url != default_url() {
        return Ok((url.to_string(), None));
    }
    let tmp = tempfile::tempdir().map_err(|e| StoreError::Unavailable(format!("temp dir: {e}")))?;
    let url = format!("sqlite://{}", tmp.path().join(file).display());
    Ok((url, Some(tmp)))
}

/// What `idem bench store` runs against.
pub struct BenchTargets {
    pub store: Arc<dyn IdempotencyStore>,
    pub baseline: Arc<dyn crate::bench::Baseline>,
    /// PostgreSQL only: the growth measurement on the store's own table.
    pub growth: Option<crate::bench::PgGrowth>,
    /// Redis-compatible servers: which one and its version.
    pub server: Option<String>,
    /// The embedded store's temporary directory, kept until this drops.
    pub _tmp: Option<tempfile::TempDir>,
}

/// Opens the store and its raw-driver baseline for `idem bench store`. The store is
/// opened in a schema (PostgreSQL) or under a key prefix (Redis) of its own; without an
/// explicit URL the embedded store runs in a temporary directory, kept until the
/// returned targets drop.
pub async fn open_bench(url: &str) -> Result<BenchTargets, StoreError> {
    let run = uuid::Uuid::now_v7().simple();
    let schema = format!("idem_bench_{run}");
    let prefix = format!("idem-bench-{run}");
    // Both sides get a pool of 32 with the same settings (see `PgBaseline::new`).
    let options = OpenOptions {
        pg_schema: Some(schema.clone()),
        pg_max_connections: Some(32),
        redis_prefix: Some(prefix.clone()),
        ..OpenOptions::default()
    };
    let (url, tmp) = bench_url(url, "bench.db")?;
    let store = Store::open(&url, &options).await?;
    // The baseline is each backend's own driver doing the same work: one per backend.
    let baseline: Arc<dyn crate::bench::Baseline> = match store.backend() {
        Backend::Sqlite => {
            Arc::new(crate::bench::SqliteBaseline::new(&SqliteOptions::from_url(&url)?).await?)
        }
        Backend::Postgres => Arc::new(crate::bench::PgBaseline::new(&url, &schema).await?),
        Backend::Redis => Arc::new(crate::bench::RedisBaseline::new(&url, &prefix).await?),
    };
    let growth = store
        .sql()
        .and_then(SqlStore::postgres)
        .map(|pg| crate::bench::PgGrowth::new(pg.clone()));
    Ok(BenchTargets {
        server: store.redis().map(|r| r.server().to_string()),
        store: store.records(),
        baseline,
        growth,
        _tmp: tmp,
    })
}
