//! Opening a store from a `--database-url`. The CLI is the only place that knows every
//! backend; the commands work on `dyn IdempotencyStore`.

use std::sync::Arc;

use idem_core::{ArchiveLookup, IdempotencyStore, LeaseStore, StoreError};
use idem_postgres::{PgOptions, PgStore};
use idem_redis::{RedisOptions, RedisStore};
use idem_sqlite::{SqliteOptions, SqliteStore};

/// The default when no URL is given: the embedded file.
pub fn default_url() -> String {
    format!("sqlite://{}", idem_sqlite::DEFAULT_PATH)
}

/// Which backend a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
    Redis,
}

pub fn backend_of(url: &str) -> Result<Backend, StoreError> {
    if url.starts_with("sqlite:") {
        Ok(Backend::Sqlite)
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Backend::Postgres)
    } else if url.starts_with("redis://") || url.starts_with("rediss://") {
        Ok(Backend::Redis)
    } else {
        Err(StoreError::InvalidInput(format!(
            "unsupported database URL {:?}: expected sqlite://PATH, postgres://… or redis://…",
            redact(url)
        )))
    }
}

/// A store opened from a URL, as its concrete type, so each command can take the
/// roles it needs (claims, leases, archive) from one place.
pub enum Opened {
    Sqlite(Arc<SqliteStore>),
    Postgres(Arc<PgStore>),
    Redis(Arc<RedisStore>),
}

impl Opened {
    /// Opens the store a URL names; SQLite and PostgreSQL apply pending migrations.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        Ok(match backend_of(url)? {
            Backend::Sqlite => Self::Sqlite(Arc::new(
                SqliteStore::open(SqliteOptions::from_url(url)?).await?,
            )),
            Backend::Postgres => {
                let store = PgStore::connect(url, PgOptions::default()).await?;
                store.migrate().await?;
                Self::Postgres(Arc::new(store))
            }
            Backend::Redis => Self::Redis(Arc::new(
                RedisStore::connect(url, RedisOptions::default()).await?,
            )),
        })
    }

    pub fn idempotency(&self) -> Arc<dyn IdempotencyStore> {
        match self {
            Self::Sqlite(s) => s.clone(),
            Self::Postgres(s) => s.clone(),
            Self::Redis(s) => s.clone(),
        }
    }

    pub fn leases(&self) -> Arc<dyn LeaseStore> {
        match self {
            Self::Sqlite(s) => s.clone(),
            Self::Postgres(s) => s.clone(),
            Self::Redis(s) => s.clone(),
        }
    }

    /// The archive of a store that keeps one (SQLite, PostgreSQL); Redis only expires.
    pub fn archive(&self) -> Option<Arc<dyn ArchiveLookup>> {
        match self {
            Self::Sqlite(s) => Some(s.clone()),
            Self::Postgres(s) => Some(s.clone()),
            Self::Redis(_) => None,
        }
    }
}

/// Opens the store a URL names for claims.
pub async fn open_store(url: &str) -> Result<Arc<dyn IdempotencyStore>, StoreError> {
    Ok(Opened::open(url).await?.idempotency())
}

/// Opens the lease store a URL names.
pub async fn open_lease_store(url: &str) -> Result<Arc<dyn LeaseStore>, StoreError> {
    Ok(Opened::open(url).await?.leases())
}

/// The archive of the store a URL names, if it keeps one.
pub async fn open_archive(url: &str) -> Result<Option<Arc<dyn ArchiveLookup>>, StoreError> {
    Ok(Opened::open(url).await?.archive())
}

/// A URL with any password removed, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}://{user}:***@{}", &url[..s], &url[at + 1..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// What `idem bench store` runs against.
pub struct BenchTargets {
    pub store: Arc<dyn IdempotencyStore>,
    pub baseline: Arc<dyn crate::bench::Baseline>,
    /// PostgreSQL only: the growth measurement on the store's own table.
    pub growth: Option<crate::bench::PgGrowth>,
    /// The embedded store's temporary directory, kept until this drops.
    pub _tmp: Option<tempfile::TempDir>,
}

/// Opens the store and its raw-driver baseline for `idem bench store`. Without an
/// explicit URL the embedded store runs in a temporary directory, kept until the
/// returned targets drop.
pub async fn open_bench(url: &str) -> Result<BenchTargets, StoreError> {
    match backend_of(url)? {
        Backend::Sqlite => {
            let (opts, tmp) = if url == default_url() {
                let tmp = tempfile::tempdir()
                    .map_err(|e| StoreError::Unavailable(format!("temp dir: {e}")))?;
                (SqliteOptions::new(tmp.path().join("bench.db")), Some(tmp))
            } else {
                (SqliteOptions::from_url(url)?, None)
            };
            let baseline = crate::bench::SqliteBaseline::new(&opts).await?;
            let store = SqliteStore::open(opts).await?;
            Ok(BenchTargets {
                store: Arc::new(store),
                baseline: Arc::new(baseline),
                growth: None,
                _tmp: tmp,
            })
        }
        Backend::Postgres => {
            // A schema of its own, dropped when the bench ends. Both sides get a pool of
            // 32 with the same settings (see `PgBaseline::new`).
            let schema = format!("idem_bench_{}", uuid::Uuid::now_v7().simple());
            let options = PgOptions {
                schema: Some(schema.clone()),
                max_connections: 32,
                ..PgOptions::default()
            };
            let store = PgStore::connect(url, options).await?;
            store.migrate().await?;
            let baseline = crate::bench::PgBaseline::new(url, &schema).await?;
            Ok(BenchTargets {
                growth: Some(crate::bench::PgGrowth::new(store.clone())),
                store: Arc::new(store),
                baseline: Arc::new(baseline),
                _tmp: None,
            })
        }
        Backend::Redis => {
            let prefix = format!("idem-bench-{}", uuid::Uuid::now_v7().simple());
            let options = RedisOptions {
                prefix: prefix.clone(),
                ..RedisOptions::default()
            };
            let store = RedisStore::connect(url, options).await?;
            let baseline = crate::bench::RedisBaseline::new(url, &prefix).await?;
            Ok(BenchTargets {
                store: Arc::new(store),
                baseline: Arc::new(baseline),
                growth: None,
                _tmp: None,
            })
        }
    }
}
