//! The repository boundary: one [`Database`] that is either the embedded SQLite file or
//! PostgreSQL, holding the idempotency records *and* the four ledgers, so that a business
//! write and the record that makes it idempotent commit in one transaction.
//!
//! What differs between the backends lives here and nowhere else:
//! - opening, migrating, and starting a writing transaction (`Tx`: `BEGIN IMMEDIATE` on
//!   SQLite, a plain transaction on PostgreSQL);
//! - finishing an idempotency claim inside that transaction (`finish_in_tx` of
//!   `idem-sqlite` / `idem-postgres`);
//! - leases and the fenced write (`idem-sqlite`'s and `idem-postgres`'s, which keep the
//!   same rules and share the conformance suite).
//!
//! The ledgers' SQL ([`crate::ledgers`]) is written once, in the dialect both databases
//! accept (`$n` parameters, `ON CONFLICT`, `RETURNING`, `BIGINT`/`TEXT` columns), and
//! runs through the small `Conn` / `Row` pair below.
//!
//! This module must not know what an order is, and nothing here deletes a business row.

mod migrate;

use std::path::Path;
use std::sync::Arc;

use futures::future::BoxFuture;
use idem_core::{
    ClaimToken, ClockShift, Finish, IdempotencyStore, Lease, LeaseStore, Record, StoreError,
};
use idem_postgres::{PgOptions, PgStore};
use idem_sqlite::{SqliteOptions, SqliteStore, SqliteTx};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{PgConnection, Postgres, Row as _, Sqlite, SqliteConnection};

use crate::error::Error;

/// The default database: the embedded file, relative to the working directory.
pub const DEFAULT_URL: &str = "sqlite://./idem-data/idem.db";

/// How to open a [`Database`].
#[derive(Debug, Clone, Default)]
pub struct DatabaseOptions {
    /// PostgreSQL only: the schema holding every table (created if missing). `None`: the
    /// connection's `search_path` decides (usually `public`).
    pub pg_schema: Option<String>,
    /// PostgreSQL pool size; default 16.
    pub pg_max_connections: Option<u32>,
    /// Shift of the store clock (leases, records); tests only.
    pub clock: ClockShift,
}

/// The service's database: idempotency records, leases and the four ledgers.
#[derive(Clone)]
pub struct Database {
    backend: Backend,
}

#[derive(Clone)]
enum Backend {
    Sqlite(SqliteStore),
    Postgres(PgStore),
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database")
            .field("backend", &self.backend())
            .finish_non_exhaustive()
    }
}

impl Database {
    /// Opens `sqlite://PATH` or `postgres://…` and applies every pending migration (the
    /// idempotency store's first, then the ledgers').
    pub async fn open(url: &str, options: DatabaseOptions) -> Result<Self, Error> {
        if url.starts_with("sqlite:") {
            let mut sqlite = SqliteOptions::from_url(url)?;
            sqlite.clock = options.clock;
            Self::open_sqlite_with(sqlite).await
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let store = PgStore::connect(
                url,
                PgOptions {
                    schema: options.pg_schema.clone(),
                    clock: options.clock.clone(),
                    max_connections: options.pg_max_connections.unwrap_or(16),
                    application_name: "idem-orders".into(),
                    ..PgOptions::default()
                },
            )
            .await?;
            store.migrate().await?;
            let db = Self {
                backend: Backend::Postgres(store),
            };
            db.migrate().await?;
            Ok(db)
        } else {
            Err(Error::InvalidInput(format!(
                "unsupported database URL {:?}: expected sqlite://PATH or postgres://…",
                redact(url)
            )))
        }
    }

    /// Opens (creating) the SQLite file at `path`.
    pub async fn open_sqlite(path: impl AsRef<Path>) -> Result<Self, Error> {
        Self::open_sqlite_with(SqliteOptions::new(path.as_ref())).await
    }

    async fn open_sqlite_with(options: SqliteOptions) -> Result<Self, Error> {
        let store = SqliteStore::open(options).await?;
        let db = Self {
            backend: Backend::Sqlite(store),
        };
        db.migrate().await?;
        Ok(db)
    }

    async fn migrate(&self) -> Result<(), Error> {
        match &self.backend {
            Backend::Sqlite(store) => {
                let mut tx = store.begin().await?;
                migrate::apply_sqlite(&mut tx).await?;
                tx.commit().await?;
            }
            Backend::Postgres(store) => {
                let mut tx = store.pool().begin().await?;
                migrate::apply_postgres(&mut tx, store.schema()).await?;
                tx.commit().await?;
            }
        }
        Ok(())
    }

    /// `sqlite` or `postgres`.
    pub fn backend(&self) -> &'static str {
        match &self.backend {
            Backend::Sqlite(_) => "sqlite",
            Backend::Postgres(_) => "postgres",
        }
    }

    /// The idempotency store over the same database (for the HTTP layer).
    pub fn idempotency_store(&self) -> Arc<dyn IdempotencyStore> {
        match &self.backend {
            Backend::Sqlite(s) => Arc::new(s.clone()),
            Backend::Postgres(store) => Arc::new(store.clone()),
        }
    }

    /// The lease store over the same database.
    pub fn lease_store(&self) -> Arc<dyn LeaseStore> {
        match &self.backend {
            Backend::Sqlite(s) => Arc::new(s.clone()),
            Backend::Postgres(store) => Arc::new(store.clone()),
        }
    }

    pub fn sqlite(&self) -> Option<&SqliteStore> {
        match &self.backend {
            Backend::Sqlite(s) => Some(s),
            Backend::Postgres(_) => None,
        }
    }

    pub fn postgres(&self) -> Option<&PgStore> {
        match &self.backend {
            Backend::Sqlite(_) => None,
            Backend::Postgres(store) => Some(store),
        }
    }

    /// A writing transaction. Dropping it rolls back. On SQLite it holds the single
    /// write lock: never start a second write (another `begin`, a store method) while it
    /// is open.
    pub(crate) async fn begin(&self) -> Result<Tx, Error> {
        Ok(match &self.backend {
            Backend::Sqlite(s) => Tx::Sqlite(s.begin().await?),
            Backend::Postgres(store) => Tx::Pg(store.pool().begin().await?),
        })
    }

    /// A pooled connection for reads (and single-statement writes outside a transaction).
    pub(crate) async fn acquire(&self) -> Result<PoolConn, Error> {
        Ok(match &self.backend {
            Backend::Sqlite(s) => PoolConn::Sqlite(s.pool().acquire().await?),
            Backend::Postgres(store) => PoolConn::Pg(store.pool().acquire().await?),
        })
    }

    /// Finishes an idempotency claim inside `tx`: it commits with the business rows.
    pub(crate) async fn finish_in_tx(
        &self,
        tx: &mut Tx,
        token: &ClaimToken,
        finish: Finish,
    ) -> Result<Record, StoreError> {
        match (&self.backend, tx) {
            (Backend::Sqlite(s), Tx::Sqlite(t)) => s.finish_in_tx(t, token, finish).await,
            (Backend::Postgres(store), Tx::Pg(t)) => store.finish_in_tx(t, token, finish).await,
            _ => Err(StoreError::InvalidInput(
                "transaction from another database".into(),
            )),
        }
    }

    /// Runs `write` in one transaction with the fence of `resource`: only if `lease`'s
    /// token is at least the last one the resource accepted. A stale token gets
    /// [`Error::Lease`] with `LeaseError::Fenced` and nothing is written.
    pub(crate) async fn fenced_write<T, F>(
        &self,
        resource: &str,
        lease: &Lease,
        write: F,
    ) -> Result<T, Error>
    where
        T: Send,
        F: for<'c> FnOnce(Conn<'c>) -> BoxFuture<'c, Result<T, Error>> + Send,
    {
        match &self.backend {
            Backend::Sqlite(store) => {
                store
                    .fenced_write(resource, lease, move |c| write(Conn::Sqlite(c)))
                    .await
            }
            Backend::Postgres(store) => {
                store
                    .fenced_write(resource, lease, move |c| write(Conn::Pg(c)))
                    .await
            }
        }
    }

    /// Presents `lease` to the fence of `resource` and writes nothing else: the fence
    /// moves to the lease's token when it is current, and a stale token gets
    /// `LeaseError::Fenced` (recorded as `fenced_write_rejected`). For drills and tests.
    pub async fn fenced_probe(&self, resource: &str, lease: &Lease) -> Result<(), Error> {
        self.fenced_write(resource, lease, |_| Box::pin(async { Ok(()) }))
            .await
    }
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

/// An open writing transaction on either backend.
pub(crate) enum Tx {
    Sqlite(SqliteTx),
    Pg(sqlx::Transaction<'static, Postgres>),
}

impl Tx {
    pub(crate) fn conn(&mut self) -> Conn<'_> {
        match self {
            Tx::Sqlite(t) => Conn::Sqlite(t),
            Tx::Pg(t) => Conn::Pg(t),
        }
    }

    pub(crate) async fn commit(self) -> Result<(), Error> {
        match self {
            Tx::Sqlite(t) => t.commit().await?,
            Tx::Pg(t) => t.commit().await?,
        }
        Ok(())
    }
}

/// A pooled connection on either backend.
pub(crate) enum PoolConn {
    Sqlite(PoolConnection<Sqlite>),
    Pg(PoolConnection<Postgres>),
}

impl PoolConn {
    pub(crate) fn conn(&mut self) -> Conn<'_> {
        match self {
            PoolConn::Sqlite(c) => Conn::Sqlite(c),
            PoolConn::Pg(c) => Conn::Pg(c),
        }
    }
}

/// A borrowed connection (pooled or inside a transaction) on either backend.
pub(crate) enum Conn<'c> {
    Sqlite(&'c mut SqliteConnection),
    Pg(&'c mut PgConnection),
}

/// A bound parameter. Typed even when NULL, for PostgreSQL.
#[derive(Debug, Clone)]
pub(crate) enum Arg {
    Text(Option<String>),
    Int(Option<i64>),
}

pub(crate) trait IntoArg {
    fn into_arg(self) -> Arg;
}

impl IntoArg for &str {
    fn into_arg(self) -> Arg {
        Arg::Text(Some(self.to_owned()))
    }
}
impl IntoArg for String {
    fn into_arg(self) -> Arg {
        Arg::Text(Some(self))
    }
}
impl IntoArg for &String {
    fn into_arg(self) -> Arg {
        Arg::Text(Some(self.clone()))
    }
}
impl IntoArg for Option<&str> {
    fn into_arg(self) -> Arg {
        Arg::Text(self.map(str::to_owned))
    }
}
impl IntoArg for Option<String> {
    fn into_arg(self) -> Arg {
        Arg::Text(self)
    }
}
impl IntoArg for i64 {
    fn into_arg(self) -> Arg {
        Arg::Int(Some(self))
    }
}
impl IntoArg for Option<i64> {
    fn into_arg(self) -> Arg {
        Arg::Int(self)
    }
}

/// A statement (with `$1`, `$2`, … parameters) and its arguments.
#[derive(Debug, Clone)]
pub(crate) struct Sql {
    text: &'static str,
    args: Vec<Arg>,
}

/// Starts a statement.
pub(crate) fn sql(text: &'static str) -> Sql {
    Sql {
        text,
        args: Vec::new(),
    }
}

impl Sql {
    pub(crate) fn bind(mut self, value: impl IntoArg) -> Self {
        self.args.push(value.into_arg());
        self
    }

    fn sqlite(&self) -> sqlx::query::Query<'_, Sqlite, SqliteArguments<'_>> {
        let mut q = sqlx::query(self.text);
        for arg in &self.args {
            q = match arg {
                Arg::Text(v) => q.bind(v.as_deref()),
                Arg::Int(v) => q.bind(*v),
            };
        }
        q
    }

    fn pg(&self) -> sqlx::query::Query<'_, Postgres, PgArguments> {
        let mut q = sqlx::query(self.text);
        for arg in &self.args {
            q = match arg {
                Arg::Text(v) => q.bind(v.as_deref()),
                Arg::Int(v) => q.bind(*v),
            };
        }
        q
    }
}

impl Conn<'_> {
    /// Rows affected.
    pub(crate) async fn execute(&mut self, q: Sql) -> Result<u64, Error> {
        Ok(match self {
            Conn::Sqlite(c) => q.sqlite().execute(&mut **c).await?.rows_affected(),
            Conn::Pg(c) => q.pg().execute(&mut **c).await?.rows_affected(),
        })
    }

    pub(crate) async fn optional(&mut self, q: Sql) -> Result<Option<Row>, Error> {
        Ok(match self {
            Conn::Sqlite(c) => q.sqlite().fetch_optional(&mut **c).await?.map(Row::Sqlite),
            Conn::Pg(c) => q.pg().fetch_optional(&mut **c).await?.map(Row::Pg),
        })
    }

    pub(crate) async fn one(&mut self, q: Sql) -> Result<Row, Error> {
        Ok(match self {
            Conn::Sqlite(c) => Row::Sqlite(q.sqlite().fetch_one(&mut **c).await?),
            Conn::Pg(c) => Row::Pg(q.pg().fetch_one(&mut **c).await?),
        })
    }

    pub(crate) async fn all(&mut self, q: Sql) -> Result<Vec<Row>, Error> {
        Ok(match self {
            Conn::Sqlite(c) => q
                .sqlite()
                .fetch_all(&mut **c)
                .await?
                .into_iter()
                .map(Row::Sqlite)
                .collect(),
            Conn::Pg(c) => q
                .pg()
                .fetch_all(&mut **c)
                .await?
                .into_iter()
                .map(Row::Pg)
                .collect(),
        })
    }
}

/// A result row on either backend, read by column name.
pub(crate) enum Row {
    Sqlite(SqliteRow),
    Pg(PgRow),
}

impl Row {
    pub(crate) fn opt_text(&self, column: &str) -> Result<Option<String>, Error> {
        Ok(match self {
            Row::Sqlite(r) => r.try_get(column)?,
            Row::Pg(r) => r.try_get(column)?,
        })
    }

    pub(crate) fn text(&self, column: &str) -> Result<String, Error> {
        self.opt_text(column)?
            .ok_or_else(|| Error::Backend(format!("column {column} is NULL")))
    }

    pub(crate) fn opt_int(&self, column: &str) -> Result<Option<i64>, Error> {
        Ok(match self {
            Row::Sqlite(r) => r.try_get(column)?,
            Row::Pg(r) => r.try_get(column)?,
        })
    }

    pub(crate) fn int(&self, column: &str) -> Result<i64, Error> {
        self.opt_int(column)?
            .ok_or_else(|| Error::Backend(format!("column {column} is NULL")))
    }
}
