//! idem-sql: the one place that knows every backend.
//!
//! # What this crate owns
//! - Telling backends apart by URL ([`Backend::of_url`]: `sqlite:…`, `postgres://` /
//!   `postgresql://`, `redis://` / `rediss://`, and with the `mysql` feature `mysql://` /
//!   `mariadb://`) and the form of a URL fit for messages ([`redact`]).
//! - [`Store::open`]: connects, applies the store's migrations, and hands out the roles
//!   the store plays — records ([`IdempotencyStore`]), leases ([`LeaseStore`]),
//!   retention ([`RetentionStore`], SQL stores only) and the archive ([`ArchiveLookup`],
//!   SQL stores only) — as trait objects.
//! - The arrival timeline ([`ArrivalLog`], [`arrivals`]): what the layer decided for each
//!   request of a key, recorded off the request path into the SQL store's own tables.
//! - Running the versioned migrations of tables a caller keeps beside the store's on
//!   every SQL backend ([`migrate`]); the tables and their SQL stay the caller's.
//! - [`SqlStore`], SQLite, PostgreSQL or (feature `mysql`) MySQL/MariaDB: a
//!   [`Transaction`] over each backend's own, claiming and finishing inside it, the
//!   fenced write, and statements written once with `$n` parameters ([`sql`]; rewritten
//!   to MySQL's `?` with their arguments in order) run through [`Conn`] and read back as
//!   [`Row`]s.
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

pub mod arrivals;
mod inspect;
pub mod migrate;
mod sql;

use std::fmt;
use std::sync::Arc;

use idem_core::{
    ArchiveLookup, ClockShift, IdempotencyStore, LeaseStore, RetentionStore, StoreError,
};
use idem_redis::{RedisOptions, RedisStore};

pub use arrivals::{ArrivalLog, ArrivalOptions, KeyArrivals};
pub use sql::{
    mysql_placeholders, sql, Arg, Conn, IntoArg, PoolConn, Row, Sql, SqlStore, Transaction,
};

/// The default store: the embedded file, relative to the working directory.
pub const DEFAULT_URL: &str = "sqlite://./idem-data/idem.db";

/// Which backend a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    Sqlite,
    Postgres,
    Redis,
    /// MySQL 8 or MariaDB 10.11 (`mysql://`, `mariadb://`).
    #[cfg(feature = "mysql")]
    Mysql,
}

/// What `of_url` tells a caller it accepts.
#[cfg(feature = "mysql")]
const EXPECTED: &str = "sqlite://PATH, postgres://…, mysql://… (or mariadb://…) or redis://…";
#[cfg(not(feature = "mysql"))]
const EXPECTED: &str = "sqlite://PATH, postgres://… or redis://…";

impl Backend {
    pub fn of_url(url: &str) -> Result<Self, StoreError> {
        if url.starts_with("sqlite:") {
            Ok(Backend::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Backend::Postgres)
        } else if url.starts_with("redis://") || url.starts_with("rediss://") {
            Ok(Backend::Redis)
        } else {
            #[cfg(feature = "mysql")]
            if url.starts_with("mysql://") || url.starts_with("mariadb://") {
                return Ok(Backend::Mysql);
            }
            Err(StoreError::InvalidInput(format!(
                "unsupported database URL {:?}: expected {EXPECTED}",
                redact(url)
            )))
        }
    }

    /// `sqlite`, `postgres`, `redis` or `mysql`: what the stores' `backend()` answer.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
            Backend::Redis => "redis",
            #[cfg(feature = "mysql")]
            Backend::Mysql => "mysql",
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
                // for PostgreSQL and MySQL it is the user name.
                None if !matches!(
                    scheme,
                    "postgres" | "postgresql" | "sqlite" | "mysql" | "mariadb"
                ) =>
                {
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
#[non_exhaustive]
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
    /// MySQL/MariaDB pool size; `None`: the store's default.
    pub mysql_max_connections: Option<u32>,
    /// MySQL/MariaDB `innodb_lock_wait_timeout` of the sessions (whole seconds); `None`:
    /// the store's default (5 s).
    pub mysql_lock_wait_timeout: Option<std::time::Duration>,
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
    /// Opens the store `url` names; the SQL stores apply pending migrations.
    pub async fn open(url: &str, options: &OpenOptions) -> Result<Self, StoreError> {
        if Backend::of_url(url)? != Backend::Redis {
            return Ok(SqlStore::open(url, options).await?.into());
        }
        let mut redis = RedisOptions::default();
        redis.clock = options.clock.clone();
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

    /// The archive of a store that keeps one (the SQL stores); Redis only expires.
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
        let err = Backend::of_url("oracle://u:secret@h/db").unwrap_err();
        assert!(
            err.to_string().contains("unsupported database URL"),
            "{err}"
        );
        assert!(!err.to_string().contains("secret"), "{err}");
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn mysql_and_mariadb_urls() {
        assert_eq!(Backend::of_url("mysql://u@h/db").unwrap(), Backend::Mysql);
        assert_eq!(Backend::of_url("mariadb://u@h/db").unwrap(), Backend::Mysql);
        assert_eq!(Backend::Mysql.as_str(), "mysql");
        let err = Backend::of_url("mysqlx://u:secret@h/db").unwrap_err();
        assert!(err.to_string().contains("mysql://"), "{err}");
    }

    #[cfg(not(feature = "mysql"))]
    #[test]
    fn mysql_needs_its_feature() {
        assert!(Backend::of_url("mysql://u@h/db").is_err());
    }

    #[test]
    fn redaction() {
        assert_eq!(
            redact("mysql://root:pw@127.0.0.1:3306/test"),
            "mysql://root:***@127.0.0.1:3306/test"
        );
        assert_eq!(redact("mariadb://u@h/db"), "mariadb://u@h/db");
        assert_eq!(redact("mysql://u:p@ss@h/db"), "mysql://u:***@h/db");
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
