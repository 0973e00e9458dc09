//! Opening a store from a `--database-url`, through `idem-sql` (the one place that knows
//! every backend); the commands work on the roles it hands out (`dyn IdempotencyStore`,
//! `dyn LeaseStore`, …). Must not open a backend crate's store directly.

use std::sync::Arc;

use idem_core::{ArchiveLookup, IdempotencyStore, LeaseStore, StoreError};
use idem_sql::{OpenOptions, Store};

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
