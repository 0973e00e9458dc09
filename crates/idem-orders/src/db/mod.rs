//! The repository boundary: one [`Database`] holding the idempotency records *and* the
//! four ledgers, so that a business write and the record that makes it idempotent commit
//! in one transaction.
//!
//! Which backend it is (the embedded SQLite file, PostgreSQL or MySQL/MariaDB) is
//! `idem-sql`'s business: opening and the stores' migrations, the writing transaction,
//! finishing a claim inside it, the fenced write, and the statements the ledgers
//! ([`crate::ledgers`]) write once in the dialect SQLite and PostgreSQL share, with a
//! MySQL form next to the few that differ ([`Conn::pick`], [`Conn::insert_new`]). This
//! module adds the ledgers' own migrations (`migrate.rs`, a MySQL form of each, run by
//! `idem_sql::migrate`), the service's defaults, and `Tx` / `PoolConn` / `Conn` / `Row`:
//! the facade's types answering this crate's [`Error`] (driver errors classified by
//! `From<sqlx::Error>`), so the ledgers' `?` keeps its meaning.
//!
//! This module must not know what an order is, and nothing here deletes a business row.

mod migrate;

use std::path::Path;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{Stream, TryStreamExt};
use idem_core::{
    ClaimToken, ClockShift, Finish, IdempotencyStore, Lease, LeaseStore, Record, StoreError,
};
use idem_postgres::PgStore;
use idem_sql::{Backend, OpenOptions, SqlStore};
use idem_sqlite::SqliteStore;

use crate::error::Error;

pub use idem_sql::{redact, DEFAULT_URL};
pub(crate) use idem_sql::{sql, Sql};

/// The longest a statement of the service waits for a row lock: well inside one
/// attempt of a client's retry (a few seconds), so a request queued behind a paused
/// holder fails in time for the retry to land elsewhere instead of using the attempt up.
/// Stock is never waited on (`SKIP LOCKED`); what is left are one key's duplicates and
/// one order's own steps.
pub const PG_LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
/// A session left idle inside a transaction this long is ended by the server.
pub const PG_IDLE_IN_TRANSACTION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The schema versions applied, and the ones this build needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SchemaStatus {
    pub store: i64,
    pub store_needed: i64,
    pub ledgers: i64,
    pub ledgers_needed: i64,
}

impl SchemaStatus {
    pub fn current(&self) -> bool {
        self.store >= self.store_needed && self.ledgers >= self.ledgers_needed
    }
}

/// How to open a [`Database`].
#[derive(Debug, Clone, Default)]
pub struct DatabaseOptions {
    /// PostgreSQL only: the schema holding every table (created if missing). `None`: the
    /// connection's `search_path` decides (usually `public`).
    pub pg_schema: Option<String>,
    /// PostgreSQL (and MySQL) pool size; default 16.
    pub pg_max_connections: Option<u32>,
    /// Shift of the store clock (leases, records); tests only.
    pub clock: ClockShift,
}

/// The service's database: idempotency records, leases and the four ledgers.
#[derive(Clone)]
pub struct Database {
    store: SqlStore,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database")
            .field("backend", &self.backend())
            .finish_non_exhaustive()
    }
}

impl Database {
    /// Opens `sqlite://PATH`, `postgres://…` or `mysql://…` and applies every pending
    /// migration (the idempotency store's first, then the ledgers').
    pub async fn open(url: &str, options: DatabaseOptions) -> Result<Self, Error> {
        let mut open = OpenOptions::default();
        open.pg_schema = options.pg_schema;
        open.pg_max_connections = Some(options.pg_max_connections.unwrap_or(16));
        open.pg_application_name = Some("idem-orders".into());
        // Found by `idem chaos`: after a pause, transactions queued behind the paused
        // process's row locks held the whole pool, and the service stayed wedged.
        // Bounded lock waits fail (and the request is retried) instead; a session
        // left idle in a transaction is ended by the server.
        open.pg_lock_timeout = Some(PG_LOCK_TIMEOUT);
        open.pg_idle_in_transaction_timeout = Some(PG_IDLE_IN_TRANSACTION_TIMEOUT);
        // MySQL's bound on row-lock waits, for the same reason (whole seconds).
        open.mysql_lock_wait_timeout = Some(PG_LOCK_TIMEOUT);
        open.mysql_max_connections = Some(options.pg_max_connections.unwrap_or(16));
        open.clock = options.clock;
        let options = open;
        Self::with_ledgers(SqlStore::open(url, &options).await?).await
    }

    /// Opens (creating) the SQLite file at `path`.
    pub async fn open_sqlite(path: impl AsRef<Path>) -> Result<Self, Error> {
        Self::with_ledgers(SqlStore::open_sqlite_path(path).await?).await
    }

    /// The service's database over an opened store: applies the ledgers' migrations.
    pub async fn with_ledgers(store: SqlStore) -> Result<Self, Error> {
        let db = Self { store };
        db.migrate().await?;
        Ok(db)
    }

    async fn migrate(&self) -> Result<(), Error> {
        migrate::apply(&self.store).await
    }

    /// Whether the database answers and its schemas are the ones this build needs: the
    /// idempotency store's and the ledgers' newest applied versions against the newest
    /// this build knows. A newer schema (a newer build migrated it) is current too: the
    /// migrations are additive.
    pub async fn schema_status(&self) -> Result<SchemaStatus, Error> {
        let mut c = self.acquire().await?;
        let row = c
            .conn()
            .one(sql(
                "SELECT (SELECT max(version) FROM idem_schema_migrations) AS store, \
                 (SELECT max(version) FROM orders_schema_migrations) AS ledgers",
            ))
            .await?;
        let store = row.opt_int("store")?.unwrap_or(0);
        let ledgers = row.opt_int("ledgers")?.unwrap_or(0);
        Ok(SchemaStatus {
            store,
            store_needed: self.store.newest_migration(),
            ledgers,
            ledgers_needed: migrate::newest(),
        })
    }

    /// `sqlite`, `postgres` or `mysql`.
    pub fn backend(&self) -> &'static str {
        self.store.backend().as_str()
    }

    /// The store under the ledgers.
    pub fn store(&self) -> &SqlStore {
        &self.store
    }

    /// The idempotency store over the same database (for the HTTP layer).
    pub fn idempotency_store(&self) -> Arc<dyn IdempotencyStore> {
        self.store.records()
    }

    /// The lease store over the same database.
    pub fn lease_store(&self) -> Arc<dyn LeaseStore> {
        self.store.leases()
    }

    pub fn sqlite(&self) -> Option<&SqliteStore> {
        self.store.sqlite()
    }

    pub fn postgres(&self) -> Option<&PgStore> {
        self.store.postgres()
    }

    /// A writing transaction. Dropping it rolls back. On SQLite it holds the single
    /// write lock: never start a second write (another `begin`, a store method) while it
    /// is open.
    pub(crate) async fn begin(&self) -> Result<Tx, Error> {
        Ok(Tx(self.store.begin().await?))
    }

    /// A pooled connection for reads (and single-statement writes outside a transaction).
    pub(crate) async fn acquire(&self) -> Result<PoolConn, Error> {
        Ok(PoolConn(self.store.acquire().await?))
    }

    /// Claims an idempotency key inside `tx`: the record commits or rolls back with the
    /// business rows (a concurrent duplicate waits on the unique index meanwhile).
    pub(crate) async fn claim_in_tx(
        &self,
        tx: &mut Tx,
        req: &idem_core::ClaimRequest,
    ) -> Result<idem_core::Claim, StoreError> {
        self.store.claim_in_tx(&mut tx.0, req).await
    }

    /// Writes an idempotency record whole and final inside `tx` (the one-commit create);
    /// `None` when the key already has one.
    pub(crate) async fn insert_final_in_tx(
        &self,
        tx: &mut Tx,
        req: &idem_core::ClaimRequest,
        finish: Finish,
    ) -> Result<Option<Record>, StoreError> {
        self.store.insert_final_in_tx(&mut tx.0, req, finish).await
    }

    /// Finishes an idempotency claim inside `tx`: it commits with the business rows.
    pub(crate) async fn finish_in_tx(
        &self,
        tx: &mut Tx,
        token: &ClaimToken,
        finish: Finish,
    ) -> Result<Record, StoreError> {
        self.store.finish_in_tx(&mut tx.0, token, finish).await
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
        self.store
            .fenced_write(resource, lease, move |c| write(Conn(c)))
            .await
    }

    /// Presents `lease` to the fence of `resource` and writes nothing else: the fence
    /// moves to the lease's token when it is current, and a stale token gets
    /// `LeaseError::Fenced` (recorded as `fenced_write_rejected`). For drills and tests.
    pub async fn fenced_probe(&self, resource: &str, lease: &Lease) -> Result<(), Error> {
        self.fenced_write(resource, lease, |_| Box::pin(async { Ok(()) }))
            .await
    }
}

/// An open writing transaction. Dropping it rolls back.
pub(crate) struct Tx(idem_sql::Transaction);

impl Tx {
    pub(crate) fn conn(&mut self) -> Conn<'_> {
        Conn(self.0.conn())
    }

    pub(crate) async fn commit(self) -> Result<(), Error> {
        Ok(self.0.commit().await?)
    }
}

/// A pooled connection.
pub(crate) struct PoolConn(idem_sql::PoolConn);

impl PoolConn {
    pub(crate) fn conn(&mut self) -> Conn<'_> {
        Conn(self.0.conn())
    }
}

/// A borrowed connection (pooled or inside a transaction).
pub(crate) struct Conn<'c>(idem_sql::Conn<'c>);

impl Conn<'_> {
    /// Which database the statements go to, for the few that differ (row locks).
    pub(crate) fn backend(&self) -> Backend {
        self.0.backend()
    }

    /// `shared` on SQLite and PostgreSQL, `mysql` on MySQL/MariaDB: for the statements
    /// whose forms differ (no `ON CONFLICT`, `RETURNING`, `||` or `CAST(… AS BIGINT)`).
    pub(crate) fn pick(&self, shared: &'static str, mysql: &'static str) -> &'static str {
        if self.backend() == Backend::Mysql {
            mysql
        } else {
            shared
        }
    }

    /// An insert that writes nothing when a unique key already holds its row: the shared
    /// form says so with `ON CONFLICT … DO NOTHING`; on MySQL `q` is the plain `INSERT`
    /// and a duplicate-key refusal counts as 0 rows (InnoDB rolls back only the
    /// statement, the transaction goes on). Not `INSERT IGNORE`, which would also pass
    /// over other errors; not `ON DUPLICATE KEY UPDATE`, whose rows affected cannot tell
    /// a kept row from a fresh one on a connection with `CLIENT_FOUND_ROWS` (sqlx's).
    pub(crate) async fn insert_new(&mut self, q: Sql) -> Result<u64, Error> {
        match self.0.execute(q).await {
            Err(sqlx::Error::Database(e))
                if self.backend() == Backend::Mysql
                    && e.kind() == sqlx::error::ErrorKind::UniqueViolation =>
            {
                Ok(0)
            }
            done => Ok(done?),
        }
    }

    /// Rows affected.
    pub(crate) async fn execute(&mut self, q: Sql) -> Result<u64, Error> {
        Ok(self.0.execute(q).await?)
    }

    pub(crate) async fn optional(&mut self, q: Sql) -> Result<Option<Row>, Error> {
        Ok(self.0.optional(q).await?.map(Row))
    }

    pub(crate) async fn one(&mut self, q: Sql) -> Result<Row, Error> {
        Ok(Row(self.0.one(q).await?))
    }

    pub(crate) async fn all(&mut self, q: Sql) -> Result<Vec<Row>, Error> {
        Ok(self.0.all(q).await?.into_iter().map(Row).collect())
    }

    /// The rows of `q` as they arrive.
    pub(crate) fn fetch<'a>(
        &'a mut self,
        q: &'a Sql,
    ) -> impl Stream<Item = Result<Row, Error>> + Send + 'a {
        self.0.fetch(q).map_ok(Row).map_err(Error::from)
    }
}

/// A result row, read by column name.
pub(crate) struct Row(idem_sql::Row);

impl Row {
    pub(crate) fn opt_text(&self, column: &str) -> Result<Option<String>, Error> {
        Ok(self.0.opt_text(column)?)
    }

    pub(crate) fn text(&self, column: &str) -> Result<String, Error> {
        Ok(self.0.text(column)?)
    }

    pub(crate) fn opt_int(&self, column: &str) -> Result<Option<i64>, Error> {
        Ok(self.0.opt_int(column)?)
    }

    pub(crate) fn int(&self, column: &str) -> Result<i64, Error> {
        Ok(self.0.int(column)?)
    }
}
