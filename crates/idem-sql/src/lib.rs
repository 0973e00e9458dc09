//! idem-sql: the one place that knows every backend.
//!
//! # What this crate owns
//! - Telling backends apart by URL ([`Backend::of_url`]: `sqlite:…`, `postgres://` /
//!   `postgresql://`, `redis://` / `rediss://`) and the form of a URL fit for messages
//!   ([`redact`]).
//! - [`Store::open`]: connects, applies the store's migrations, and hands out the roles
//!   the store plays — records ([`IdempotencyStore`]), leases ([`LeaseStore`]),
//!   retention ([`RetentionStore`], SQL stores only) and the archive ([`ArchiveLookup`],
//!   SQL stores only) — as trait objects.
//! - [`SqlStore`], SQLite or PostgreSQL: a [`Transaction`] over either backend's own,
//!   claiming and finishing inside it, the fenced write, and statements written once in
//!   the dialect both accept (`$n` parameters, [`sql`]) run through [`Conn`] and read
//!   back as [`Row`]s.
//!
//! Other crates open stores here and never match on the backend themselves.
//!
//! # What it must not do
//! - Hold rules of its own: claims, leases, fences and migrations are the stores'; this
//!   crate only routes to them.
//! - Know callers' tables: their schema and migrations stay with them.
//!
//! Errors: opening, transactions and store calls answer the stores' [`StoreError`] (or
//! [`idem_core::LeaseError`]); statements answer `sqlx::Error`, which callers classify as
//! they would with sqlx itself.

mod inspect;
mod sql;

use std::fmt;
use std::sync::Arc;

use idem_core::{
    ArchiveLookup, ClockShift, IdempotencyStore, LeaseStore, RetentionStore, StoreError,
};
use idem_redis::{RedisOptions, RedisStore};

pub use sql::{sql, Arg, Conn, IntoArg, PoolConn, Row, Sql, SqlStore, Transaction};

/// The default store: the embedded file, relative to the working directory.
pub const DEFAULT_URL: &str = "sqlite://./idem-data/idem.db";

/// Which backend a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    Sqlite,
    Postgres,
    Redis,
}

impl Backend {
    pub fn of_url(url: &str) -> Result<Self, StoreError> {
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

    /// `sqlite`, `postgres` or `redis`: what the stores' `backend()` answer.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
            Backend::Redis => "redis",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A URL with any password removed, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            let scheme = &url[..s];
            match creds.split_once(':') {
                Some((user, _)) => format!("{scheme}://{user}:***@{}", &url[at + 1..]),
                // A lone user part is a token for NATS, Redis and HTTP (`nats://TOKEN@h`);
                // for PostgreSQL it is the user name.
                None if !matches!(scheme, "postgres" | "postgresql" | "sqlite") => {
                    format!("{scheme}://***@{}", &url[at + 1..])
                }
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// How to open a store; what does not apply to the URL's backend is ignored.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// PostgreSQL: the schema holding every table (created if missing). `None`: the
    /// connection's `search_path` decides.
    pub pg_schema: Option<String>,
    /// PostgreSQL pool size; `None`: the store's default.
    pub pg_max_connections: Option<u32>,
    /// PostgreSQL `application_name`; `None`: the store's default.
    pub pg_application_name: Option<String>,
    /// PostgreSQL `lock_timeout` and `idle_in_transaction_session_timeout` of the
    /// sessions; `None`: the server's settings.
    pub pg_lock_timeout: Option<std::time::Duration>,
    pub pg_idle_in_transaction_timeout: Option<std::time::Duration>,
    /// Redis key prefix; `None`: the store's default.
    pub redis_prefix: Option<String>,
    /// Shift of the store clock; tests only.
    pub clock: ClockShift,
}

/// A store opened from a URL, migrated, with the roles it plays. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    Sql(SqlStore),
    Redis(RedisStore),
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("backend", &self.backend())
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens the store `url` names; SQLite and PostgreSQL apply pending migrations.
    pub async fn open(url: &str, options: &OpenOptions) -> Result<Self, StoreError> {
        if Backend::of_url(url)? != Backend::Redis {
            return Ok(SqlStore::open(url, options).await?.into());
        }
        let mut redis = RedisOptions {
            clock: options.clock.clone(),
            ..RedisOptions::default()
        };
        if let Some(prefix) = &options.redis_prefix {
            redis.prefix = prefix.clone();
        }
        Ok(Self {
            kind: Kind::Redis(RedisStore::connect(url, redis).await?),
        })
    }

    pub fn backend(&self) -> Backend {
        match &self.kind {
            Kind::Sql(s) => s.backend(),
            Kind::Redis(_) => Backend::Redis,
        }
    }

    /// The idempotency records.
    pub fn records(&self) -> Arc<dyn IdempotencyStore> {
        match &self.kind {
            Kind::Sql(s) => s.records(),
            Kind::Redis(r) => Arc::new(r.clone()),
        }
    }

    pub fn leases(&self) -> Arc<dyn LeaseStore> {
        match &self.kind {
            Kind::Sql(s) => s.leases(),
            Kind::Redis(r) => Arc::new(r.clone()),
        }
    }

    /// The sweeper's side of the store; Redis has none (its records expire by TTL).
    pub fn retention(&self) -> Option<Arc<dyn RetentionStore>> {
        self.sql().map(SqlStore::retention)
    }

    /// The archive of a store that keeps one (SQLite, PostgreSQL); Redis only expires.
    pub fn archive(&self) -> Option<Arc<dyn ArchiveLookup>> {
        self.sql().map(SqlStore::archive)
    }

    /// The SQL store, for transactions and statements; `None` for Redis.
    pub fn sql(&self) -> Option<&SqlStore> {
        match &self.kind {
            Kind::Sql(s) => Some(s),
            Kind::Redis(_) => None,
        }
    }

    pub fn redis(&self) -> Option<&RedisStore> {
        match &self.kind {
            Kind::Redis(r) => Some(r),
            Kind::Sql(_) => None,
        }
    }
}

impl From<SqlStore> for Store {
    fn from(store: SqlStore) -> Self {
        Self {
            kind: Kind::Sql(store),
        }
    }
}

impl From<RedisStore> for Store {
    fn from(store: RedisStore) -> Self {
        Self {
            kind: Kind::Redis(store),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_by_url() {
        assert_eq!(Backend::of_url("sqlite://x.db").unwrap(), Backend::Sqlite);
        assert_eq!(Backend::of_url("sqlite:x.db").unwrap(), Backend::Sqlite);
        assert_eq!(
            Backend::of_url("postgresql://u@h/db").unwrap(),
            Backend::Postgres
        );
        assert_eq!(Backend::of_url("rediss://h").unwrap(), Backend::Redis);
        let err = Backend::of_url("mysql://u:secret@h/db").unwrap_err();
        assert!(
            err.to_string().contains("unsupported database URL"),
            "{err}"
        );
        assert!(!err.to_string().contains("secret"), "{err}");
    }

    #[test]
    fn redaction() {
        assert_eq!(
            redact("postgres://u:pw@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("sqlite://./a@b.db"), "sqlite://./a@b.db");
        assert_eq!(redact("nats://s3cr3t@h:4222"), "nats://***@h:4222");
        assert_eq!(redact("tls://s3cr3t@h:4222"), "tls://***@h:4222");
        assert_eq!(
            redact("https://u:pw@up.example"),
            "https://u:***@up.example"
        );
    }

    #[test]
    fn default_url_is_the_sqlite_default_path() {
        assert_eq!(
            DEFAULT_URL,
            format!("sqlite://{}", idem_sqlite::DEFAULT_PATH)
        );
    }
}
