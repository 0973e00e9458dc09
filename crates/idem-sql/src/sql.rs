//! SQLite, PostgreSQL or (feature `mysql`) MySQL/MariaDB behind one type: the store,
//! its transactions, and statements written once.
//!
//! Owns the dispatch from [`SqlStore`], [`Transaction`], [`PoolConn`], [`Conn`] and
//! [`Row`] to each backend's own type. Statements are written with `$n` parameters and
//! bound with typed values, so a NULL keeps its type on PostgreSQL. For MySQL the one
//! rewrite this module makes is the placeholders ([`mysql_placeholders`]: each `$n`
//! becomes `?` and its argument is bound at that position, repeated as often as it
//! appears); the rest of a statement (`ON CONFLICT`, `RETURNING`, which MySQL lacks) is
//! the caller's to write in a form its backends accept. It adds no rule to the stores'
//! claims, leases or fences: it routes to them.

use std::path::Path;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::{BoxStream, StreamExt, TryStreamExt};
use idem_core::{
    ArchiveLookup, Claim, ClaimRequest, ClaimToken, Finish, IdempotencyStore, Lease, LeaseError,
    LeaseStore, Millis, Record, RetentionStore, StoreError, TenantId,
};
#[cfg(feature = "mysql")]
use idem_mysql::{MysqlOptions, MysqlStore};
use idem_postgres::{PgOptions, PgStore};
use idem_sqlite::{SqliteOptions, SqliteStore, SqliteTx};
#[cfg(feature = "mysql")]
use sqlx::mysql::{MySqlArguments, MySqlRow};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::sqlite::{SqliteArguments, SqliteRow};
#[cfg(feature = "mysql")]
use sqlx::{MySql, MySqlConnection};
use sqlx::{PgConnection, Postgres, Row as _, Sqlite, SqliteConnection};

use crate::{redact, Backend, OpenOptions};

/// A SQL store (SQLite, PostgreSQL or MySQL/MariaDB), migrated. Cheap to clone (the pool is shared).
#[derive(Clone)]
pub struct SqlStore {
    db: Db,
}

#[derive(Clone)]
enum Db {
    Sqlite(SqliteStore),
    Postgres(PgStore),
    #[cfg(feature = "mysql")]
    Mysql(MysqlStore),
}

/// Every `Db` arm with the store bound as `$s`, each running `$body` (same text, each
/// store's own types).
macro_rules! each_db {
    ($db:expr, |$s:ident| $body:expr) => {
        match $db {
            Db::Sqlite($s) => $body,
            Db::Postgres($s) => $body,
            #[cfg(feature = "mysql")]
            Db::Mysql($s) => $body,
        }
    };
}

impl std::fmt::Debug for SqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlStore")
            .field("backend", &self.backend())
            .field("schema", &self.schema())
            .finish_non_exhaustive()
    }
}

impl SqlStore {
    /// Opens `sqlite:…`, `postgres://…` or (feature `mysql`) `mysql://…` / `mariadb://…`
    /// and applies the store's pending migrations.
    pub async fn open(url: &str, options: &OpenOptions) -> Result<Self, StoreError> {
        match Backend::of_url(url)? {
            Backend::Sqlite => {
                let mut sqlite = SqliteOptions::from_url(url)?;
                sqlite.clock = options.clock.clone();
                Self::open_sqlite(sqlite).await
            }
            Backend::Postgres => {
                let mut pg = {
                    let mut o = PgOptions::default();
                    o.schema = options.pg_schema.clone();
                    o.clock = options.clock.clone();
                    o.lock_timeout = options.pg_lock_timeout;
                    o.idle_in_transaction_timeout = options.pg_idle_in_transaction_timeout;
                    o
                };
                if let Some(n) = options.pg_max_connections {
                    pg.max_connections = n;
                }
                if let Some(name) = &options.pg_application_name {
                    pg.application_name = name.clone();
                }
                Self::open_postgres(url, pg).await
            }
            #[cfg(feature = "mysql")]
            Backend::Mysql => {
                let mut my = {
                    let mut o = MysqlOptions::default();
                    o.clock = options.clock.clone();
                    o
                };
                if let Some(n) = options.mysql_max_connections {
                    my.max_connections = n;
                }
                if let Some(t) = options.mysql_lock_wait_timeout {
                    my.lock_wait_timeout = t;
                }
                Self::open_mysql(url, my).await
            }
            Backend::Redis => Err(StoreError::InvalidInput(format!(
                "{} is a Redis URL; this needs a SQL store (sqlite://PATH, postgres://…{})",
                redact(url),
                if cfg!(feature = "mysql") {
                    " or mysql://…"
                } else {
                    ""
                }
            ))),
        }
    }

    /// Connects to MySQL or MariaDB (`mysql://`, `mariadb://`) and applies pending
    /// migrations.
    #[cfg(feature = "mysql")]
    pub async fn open_mysql(url: &str, options: MysqlOptions) -> Result<Self, StoreError> {
        let store = MysqlStore::connect(url, options).await?;
        store.migrate().await?;
        Ok(store.into())
    }

    /// Opens (creating) the SQLite file `options` names; migrations are applied on open.
    pub async fn open_sqlite(options: SqliteOptions) -> Result<Self, StoreError> {
        Ok(SqliteStore::open(options).await?.into())
    }

    /// Opens (creating) the SQLite file at `path` with default options.
    pub async fn open_sqlite_path(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_sqlite(SqliteOptions::new(path.as_ref())).await
    }

    /// Connects to PostgreSQL and applies pending migrations.
    pub async fn open_postgres(url: &str, options: PgOptions) -> Result<Self, StoreError> {
        let store = PgStore::connect(url, options).await?;
        store.migrate().await?;
        Ok(store.into())
    }

    /// The newest idempotency-store schema version this build knows for its backend.
    pub fn newest_migration(&self) -> i64 {
        match &self.db {
            Db::Sqlite(_) => idem_sqlite::newest_migration(),
            Db::Postgres(_) => idem_postgres::newest_migration(),
            #[cfg(feature = "mysql")]
            Db::Mysql(_) => idem_mysql::newest_migration(),
        }
    }

    pub fn backend(&self) -> Backend {
        match &self.db {
            Db::Sqlite(_) => Backend::Sqlite,
            Db::Postgres(_) => Backend::Postgres,
            #[cfg(feature = "mysql")]
            Db::Mysql(_) => Backend::Mysql,
        }
    }

    /// PostgreSQL: the schema holding the tables, if one was chosen.
    pub fn schema(&self) -> Option<&str> {
        match &self.db {
            Db::Postgres(p) => p.schema(),
            _ => None,
        }
    }

    pub fn records(&self) -> Arc<dyn IdempotencyStore> {
        each_db!(&self.db, |s| Arc::new(s.clone()))
    }

    pub fn leases(&self) -> Arc<dyn LeaseStore> {
        each_db!(&self.db, |s| Arc::new(s.clone()))
    }

    pub fn retention(&self) -> Arc<dyn RetentionStore> {
        each_db!(&self.db, |s| Arc::new(s.clone()))
    }

    pub fn archive(&self) -> Arc<dyn ArchiveLookup> {
        each_db!(&self.db, |s| Arc::new(s.clone()))
    }

    /// The SQLite store itself, for what only it has (its pool, for benchmarks).
    pub fn sqlite(&self) -> Option<&SqliteStore> {
        match &self.db {
            Db::Sqlite(s) => Some(s),
            _ => None,
        }
    }

    /// The PostgreSQL store itself, for what only it has (`fence_in_tx`, its pool).
    pub fn postgres(&self) -> Option<&PgStore> {
        match &self.db {
            Db::Postgres(p) => Some(p),
            _ => None,
        }
    }

    /// The MySQL/MariaDB store itself, for what only it has (`fence_in_tx`, its pool).
    #[cfg(feature = "mysql")]
    pub fn mysql(&self) -> Option<&MysqlStore> {
        match &self.db {
            Db::Mysql(m) => Some(m),
            _ => None,
        }
    }

    /// A writing transaction; dropping it rolls back. On SQLite it is `BEGIN IMMEDIATE`
    /// and holds the single write lock: start no other write (another `begin`, a store
    /// method that writes) until it ends.
    pub async fn begin(&self) -> Result<Transaction, StoreError> {
        Ok(Transaction {
            tx: match &self.db {
                Db::Sqlite(s) => Tx::Sqlite(s.begin().await?),
                Db::Postgres(p) => Tx::Postgres(
                    p.pool()
                        .begin()
                        .await
                        .map_err(|e| idem_postgres::map_err("begin", e))?,
                ),
                #[cfg(feature = "mysql")]
                Db::Mysql(m) => Tx::Mysql(
                    m.pool()
                        .begin()
                        .await
                        .map_err(|e| idem_mysql::map_err("begin", e))?,
                ),
            },
        })
    }

    /// A pooled connection for reads (and single-statement writes outside a transaction).
    pub async fn acquire(&self) -> Result<PoolConn, sqlx::Error> {
        Ok(PoolConn {
            conn: match &self.db {
                Db::Sqlite(s) => Pooled::Sqlite(s.pool().acquire().await?),
                Db::Postgres(p) => Pooled::Postgres(p.pool().acquire().await?),
                #[cfg(feature = "mysql")]
                Db::Mysql(m) => Pooled::Mysql(m.pool().acquire().await?),
            },
        })
    }

    /// Whether the database holds a table named `name` (PostgreSQL: on the search path;
    /// MySQL: in the connection's database).
    pub async fn has_table(&self, name: &str) -> Result<bool, sqlx::Error> {
        match &self.db {
            Db::Sqlite(s) => {
                sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?)",
                )
                .bind(name)
                .fetch_one(s.pool())
                .await
            }
            Db::Postgres(p) => {
                sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
                    .bind(name)
                    .fetch_one(p.pool())
                    .await
            }
            #[cfg(feature = "mysql")]
            Db::Mysql(m) => {
                sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM information_schema.TABLES \
                     WHERE table_schema = DATABASE() AND table_name = ?)",
                )
                .bind(name)
                .fetch_one(m.pool())
                .await
            }
        }
    }

    /// Claims inside `tx`: the fresh record commits or rolls back with the caller's
    /// other writes. After an error, roll back.
    pub async fn claim_in_tx(
        &self,
        tx: &mut Transaction,
        req: &ClaimRequest,
    ) -> Result<Claim, StoreError> {
        match (&self.db, &mut tx.tx) {
            (Db::Sqlite(s), Tx::Sqlite(t)) => s.claim_in_tx(t, req).await,
            (Db::Postgres(p), Tx::Postgres(t)) => p.claim_in_tx(t, req).await,
            #[cfg(feature = "mysql")]
            (Db::Mysql(m), Tx::Mysql(t)) => m.claim_in_tx(t, req).await,
            _ => Err(foreign_transaction()),
        }
    }

    /// Inserts `req`'s record whole and final inside `tx` (the one-commit create); `None`
    /// when the key has a record and nothing was written (roll back, then claim).
    pub async fn insert_final_in_tx(
        &self,
        tx: &mut Transaction,
        req: &ClaimRequest,
        finish: Finish,
    ) -> Result<Option<Record>, StoreError> {
        match (&self.db, &mut tx.tx) {
            (Db::Sqlite(s), Tx::Sqlite(t)) => s.insert_final_in_tx(t, req, finish).await,
            (Db::Postgres(p), Tx::Postgres(t)) => p.insert_final_in_tx(t, req, finish).await,
            #[cfg(feature = "mysql")]
            (Db::Mysql(m), Tx::Mysql(t)) => m.insert_final_in_tx(t, req, finish).await,
            _ => Err(foreign_transaction()),
        }
    }

    /// Finishes a claim inside `tx`, so the completion commits with the business write.
    /// A lost compare-and-set is `Superseded`: roll the business write back.
    pub async fn finish_in_tx(
        &self,
        tx: &mut Transaction,
        token: &ClaimToken,
        finish: Finish,
    ) -> Result<Record, StoreError> {
        match (&self.db, &mut tx.tx) {
            (Db::Sqlite(s), Tx::Sqlite(t)) => s.finish_in_tx(t, token, finish).await,
            (Db::Postgres(p), Tx::Postgres(t)) => p.finish_in_tx(t, token, finish).await,
            #[cfg(feature = "mysql")]
            (Db::Mysql(m), Tx::Mysql(t)) => m.finish_in_tx(t, token, finish).await,
            _ => Err(foreign_transaction()),
        }
    }

    /// Runs `write` in one transaction with the fence of `resource`, only if `lease`'s
    /// token is at least the last one the resource accepted (the stores' `fenced_write`).
    /// A stale token gets `LeaseError::Fenced` (converted into `E`), recorded as
    /// `fenced_write_rejected`, and nothing is written.
    pub async fn fenced_write<T, E, F>(
        &self,
        resource: &str,
        lease: &Lease,
        write: F,
    ) -> Result<T, E>
    where
        E: From<LeaseError>,
        F: for<'c> FnOnce(Conn<'c>) -> BoxFuture<'c, Result<T, E>> + Send,
    {
        match &self.db {
            Db::Sqlite(s) => {
                s.fenced_write(resource, lease, move |c| write(Conn::from(c)))
                    .await
            }
            Db::Postgres(p) => {
                p.fenced_write(resource, lease, move |c| write(Conn::from(c)))
                    .await
            }
            #[cfg(feature = "mysql")]
            Db::Mysql(m) => {
                m.fenced_write(resource, lease, move |c| write(Conn::from(c)))
                    .await
            }
        }
    }
}

impl SqlStore {
    /// Test and benchmark fixture (the stores' own `seed_terminal`): inserts `count`
    /// SUCCEEDED records in the retry tier under `tenant`, keys `{prefix}{n}`, completed
    /// at `completed_at`, each with a `body_bytes` response body and result reference
    /// `order-{prefix}{n}`.
    pub async fn seed_terminal(
        &self,
        tenant: &TenantId,
        prefix: &str,
        count: u64,
        completed_at: Millis,
        body_bytes: usize,
    ) -> Result<u64, StoreError> {
        each_db!(&self.db, |s| {
            s.seed_terminal(tenant, prefix, count, completed_at, body_bytes)
                .await
        })
    }
}

fn foreign_transaction() -> StoreError {
    StoreError::InvalidInput("transaction from another database".into())
}

impl From<SqliteStore> for SqlStore {
    fn from(store: SqliteStore) -> Self {
        Self {
            db: Db::Sqlite(store),
        }
    }
}

impl From<PgStore> for SqlStore {
    fn from(store: PgStore) -> Self {
        Self {
            db: Db::Postgres(store),
        }
    }
}

#[cfg(feature = "mysql")]
impl From<MysqlStore> for SqlStore {
    fn from(store: MysqlStore) -> Self {
        Self {
            db: Db::Mysql(store),
        }
    }
}

/// An open writing transaction on any SQL backend. Dropping it rolls back.
pub struct Transaction {
    tx: Tx,
}

enum Tx {
    Sqlite(SqliteTx),
    Postgres(sqlx::Transaction<'static, Postgres>),
    #[cfg(feature = "mysql")]
    Mysql(sqlx::Transaction<'static, MySql>),
}

impl Transaction {
    pub fn backend(&self) -> Backend {
        match &self.tx {
            Tx::Sqlite(_) => Backend::Sqlite,
            Tx::Postgres(_) => Backend::Postgres,
            #[cfg(feature = "mysql")]
            Tx::Mysql(_) => Backend::Mysql,
        }
    }

    /// The transaction's connection, for statements.
    pub fn conn(&mut self) -> Conn<'_> {
        match &mut self.tx {
            Tx::Sqlite(t) => Conn::from(&mut **t),
            Tx::Postgres(t) => Conn::from(&mut **t),
            #[cfg(feature = "mysql")]
            Tx::Mysql(t) => Conn::from(&mut **t),
        }
    }

    /// Serializes the transactions that take the same `key` until each ends (for
    /// example concurrent migrators). PostgreSQL: a transaction-scoped advisory lock on
    /// `hashtext(key)`. MySQL: the row lock of `key`'s digest in the store's
    /// `idem_advisory_locks` (its `GET_LOCK` belongs to the session, not the
    /// transaction). SQLite: nothing to take, the transaction already holds the
    /// database's only write lock.
    pub async fn advisory_lock(&mut self, key: &str) -> Result<(), sqlx::Error> {
        match &mut self.tx {
            Tx::Postgres(t) => {
                sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
                    .bind(key)
                    .execute(&mut **t)
                    .await?;
            }
            #[cfg(feature = "mysql")]
            Tx::Mysql(t) => {
                sqlx::query(
                    "INSERT INTO idem_advisory_locks (name_digest) VALUES (UNHEX(SHA2(?, 256))) \
                     ON DUPLICATE KEY UPDATE name_digest = name_digest",
                )
                .bind(key)
                .execute(&mut **t)
                .await?;
            }
            Tx::Sqlite(_) => {}
        }
        Ok(())
    }

    pub async fn commit(self) -> Result<(), StoreError> {
        match self.tx {
            Tx::Sqlite(t) => t.commit().await,
            Tx::Postgres(t) => t
                .commit()
                .await
                .map_err(|e| idem_postgres::map_err("commit", e)),
            #[cfg(feature = "mysql")]
            Tx::Mysql(t) => t
                .commit()
                .await
                .map_err(|e| idem_mysql::map_err("commit", e)),
        }
    }

    pub async fn rollback(self) -> Result<(), StoreError> {
        match self.tx {
            Tx::Sqlite(t) => t.rollback().await,
            Tx::Postgres(t) => t
                .rollback()
                .await
                .map_err(|e| idem_postgres::map_err("rollback", e)),
            #[cfg(feature = "mysql")]
            Tx::Mysql(t) => t
                .rollback()
                .await
                .map_err(|e| idem_mysql::map_err("rollback", e)),
        }
    }
}

/// A pooled connection on either backend, returned to the pool when dropped.
pub struct PoolConn {
    conn: Pooled,
}

enum Pooled {
    Sqlite(PoolConnection<Sqlite>),
    Postgres(PoolConnection<Postgres>),
    #[cfg(feature = "mysql")]
    Mysql(PoolConnection<MySql>),
}

impl PoolConn {
    pub fn conn(&mut self) -> Conn<'_> {
        match &mut self.conn {
            Pooled::Sqlite(c) => Conn::from(&mut **c),
            Pooled::Postgres(c) => Conn::from(&mut **c),
            #[cfg(feature = "mysql")]
            Pooled::Mysql(c) => Conn::from(&mut **c),
        }
    }
}

/// A borrowed connection (pooled, or a transaction's) on either backend.
pub struct Conn<'c> {
    conn: Borrowed<'c>,
}

enum Borrowed<'c> {
    Sqlite(&'c mut SqliteConnection),
    Postgres(&'c mut PgConnection),
    #[cfg(feature = "mysql")]
    Mysql(&'c mut MySqlConnection),
}

impl<'c> From<&'c mut SqliteConnection> for Conn<'c> {
    fn from(c: &'c mut SqliteConnection) -> Self {
        Self {
            conn: Borrowed::Sqlite(c),
        }
    }
}

impl<'c> From<&'c mut PgConnection> for Conn<'c> {
    fn from(c: &'c mut PgConnection) -> Self {
        Self {
            conn: Borrowed::Postgres(c),
        }
    }
}

#[cfg(feature = "mysql")]
impl<'c> From<&'c mut MySqlConnection> for Conn<'c> {
    fn from(c: &'c mut MySqlConnection) -> Self {
        Self {
            conn: Borrowed::Mysql(c),
        }
    }
}

/// A bound parameter. Typed even when NULL, for PostgreSQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arg {
    Text(Option<String>),
    Int(Option<i64>),
}

/// Values a statement can bind.
pub trait IntoArg {
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
pub struct Sql {
    text: &'static str,
    args: Vec<Arg>,
}

/// Starts a statement.
pub fn sql(text: &'static str) -> Sql {
    Sql {
        text,
        args: Vec::new(),
    }
}

impl Sql {
    pub fn bind(mut self, value: impl IntoArg) -> Self {
        self.args.push(value.into_arg());
        self
    }

    pub fn text(&self) -> &'static str {
        self.text
    }

    pub fn args(&self) -> &[Arg] {
        &self.args
    }

    fn sqlite(&self) -> sqlx::query::Query<'_, Sqlite, SqliteArguments> {
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

    /// The statement with MySQL's `?` placeholders, each bound to the argument its `$n`
    /// named. A `$n` past the arguments is refused before anything is sent.
    #[cfg(feature = "mysql")]
    fn mysql(&self) -> Result<sqlx::query::Query<'_, MySql, MySqlArguments>, sqlx::Error> {
        let (text, order) = mysql_placeholders(self.text);
        let mut q = sqlx::query(sqlx::AssertSqlSafe(text));
        for i in order {
            let arg = self.args.get(i).ok_or_else(|| {
                sqlx::Error::InvalidArgument(format!(
                    "${} has no argument ({} bound)",
                    i + 1,
                    self.args.len()
                ))
            })?;
            q = match arg {
                Arg::Text(v) => q.bind(v.as_deref()),
                Arg::Int(v) => q.bind(*v),
            };
        }
        Ok(q)
    }
}

/// `$n` placeholders rewritten as MySQL's positional `?`: the new text, and for each `?`
/// in order the index (from 0) of the argument it takes, so `$1 … $1` binds the first
/// argument twice and `$2 … $1` swaps them. Quoted text (`'…'`, `"…"`, `` `…` ``) is
/// copied untouched, so a `$1` inside a string literal stays text.
pub fn mysql_placeholders(text: &str) -> (String, Vec<usize>) {
    let mut out = String::with_capacity(text.len());
    let mut order = Vec::new();
    let mut chars = text.char_indices().peekable();
    let mut quote: Option<char> = None;
    while let Some((_, c)) = chars.next() {
        match quote {
            Some(q) => {
                out.push(c);
                if c == q {
                    // A doubled quote is an escaped one: still inside.
                    if chars.peek().map(|&(_, n)| n) == Some(q) {
                        out.push(q);
                        chars.next();
                    } else {
                        quote = None;
                    }
                } else if c == '\\' && q != '`' {
                    if let Some((_, n)) = chars.next() {
                        out.push(n);
                    }
                }
            }
            None if matches!(c, '\'' | '"' | '`') => {
                quote = Some(c);
                out.push(c);
            }
            None if c == '$' && chars.peek().is_some_and(|&(_, n)| n.is_ascii_digit()) => {
                let mut n = 0usize;
                while let Some(&(_, d)) = chars.peek() {
                    let Some(v) = d.to_digit(10) else { break };
                    n = n.saturating_mul(10).saturating_add(v as usize);
                    chars.next();
                }
                out.push('?');
                // `$0` names no argument: index past every list, refused at binding.
                order.push(n.checked_sub(1).unwrap_or(usize::MAX));
            }
            None => out.push(c),
        }
    }
    (out, order)
}

impl Conn<'_> {
    pub fn backend(&self) -> Backend {
        match &self.conn {
            Borrowed::Sqlite(_) => Backend::Sqlite,
            Borrowed::Postgres(_) => Backend::Postgres,
            #[cfg(feature = "mysql")]
            Borrowed::Mysql(_) => Backend::Mysql,
        }
    }

    /// Runs `q`; rows affected.
    pub async fn execute(&mut self, q: Sql) -> Result<u64, sqlx::Error> {
        Ok(match &mut self.conn {
            Borrowed::Sqlite(c) => q.sqlite().execute(&mut **c).await?.rows_affected(),
            Borrowed::Postgres(c) => q.pg().execute(&mut **c).await?.rows_affected(),
            #[cfg(feature = "mysql")]
            Borrowed::Mysql(c) => q.mysql()?.execute(&mut **c).await?.rows_affected(),
        })
    }

    /// Runs a script of statements without parameters (DDL), in order.
    pub async fn execute_script(&mut self, script: &'static str) -> Result<(), sqlx::Error> {
        match &mut self.conn {
            Borrowed::Sqlite(c) => {
                sqlx::raw_sql(script).execute(&mut **c).await?;
            }
            Borrowed::Postgres(c) => {
                sqlx::raw_sql(script).execute(&mut **c).await?;
            }
            #[cfg(feature = "mysql")]
            Borrowed::Mysql(c) => {
                sqlx::raw_sql(script).execute(&mut **c).await?;
            }
        }
        Ok(())
    }

    pub async fn optional(&mut self, q: Sql) -> Result<Option<Row>, sqlx::Error> {
        Ok(match &mut self.conn {
            Borrowed::Sqlite(c) => q.sqlite().fetch_optional(&mut **c).await?.map(Row::from),
            Borrowed::Postgres(c) => q.pg().fetch_optional(&mut **c).await?.map(Row::from),
            #[cfg(feature = "mysql")]
            Borrowed::Mysql(c) => q.mysql()?.fetch_optional(&mut **c).await?.map(Row::from),
        })
    }

    pub async fn one(&mut self, q: Sql) -> Result<Row, sqlx::Error> {
        Ok(match &mut self.conn {
            Borrowed::Sqlite(c) => q.sqlite().fetch_one(&mut **c).await?.into(),
            Borrowed::Postgres(c) => q.pg().fetch_one(&mut **c).await?.into(),
            #[cfg(feature = "mysql")]
            Borrowed::Mysql(c) => q.mysql()?.fetch_one(&mut **c).await?.into(),
        })
    }

    pub async fn all(&mut self, q: Sql) -> Result<Vec<Row>, sqlx::Error> {
        Ok(match &mut self.conn {
            Borrowed::Sqlite(c) => q
                .sqlite()
                .fetch_all(&mut **c)
                .await?
                .into_iter()
                .map(Row::from)
                .collect(),
            Borrowed::Postgres(c) => q
                .pg()
                .fetch_all(&mut **c)
                .await?
                .into_iter()
                .map(Row::from)
                .collect(),
            #[cfg(feature = "mysql")]
            Borrowed::Mysql(c) => q
                .mysql()?
                .fetch_all(&mut **c)
                .await?
                .into_iter()
                .map(Row::from)
                .collect(),
        })
    }

    /// The rows of `q` as they arrive, for passes too large to hold at once.
    pub fn fetch<'a>(&'a mut self, q: &'a Sql) -> BoxStream<'a, Result<Row, sqlx::Error>> {
        match &mut self.conn {
            Borrowed::Sqlite(c) => q.sqlite().fetch(&mut **c).map_ok(Row::from).boxed(),
            Borrowed::Postgres(c) => q.pg().fetch(&mut **c).map_ok(Row::from).boxed(),
            #[cfg(feature = "mysql")]
            Borrowed::Mysql(c) => match q.mysql() {
                Ok(q) => q.fetch(&mut **c).map_ok(Row::from).boxed(),
                Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
            },
        }
    }
}

/// A result row on any SQL backend, read by column name.
pub struct Row {
    row: AnyRow,
}

enum AnyRow {
    Sqlite(SqliteRow),
    Postgres(PgRow),
    #[cfg(feature = "mysql")]
    Mysql(MySqlRow),
}

impl From<SqliteRow> for Row {
    fn from(row: SqliteRow) -> Self {
        Self {
            row: AnyRow::Sqlite(row),
        }
    }
}

impl From<PgRow> for Row {
    fn from(row: PgRow) -> Self {
        Self {
            row: AnyRow::Postgres(row),
        }
    }
}

#[cfg(feature = "mysql")]
impl From<MySqlRow> for Row {
    fn from(row: MySqlRow) -> Self {
        Self {
            row: AnyRow::Mysql(row),
        }
    }
}

/// A NULL where a value is required: reported as a decode error of that column.
fn null(column: &str) -> sqlx::Error {
    sqlx::Error::ColumnDecode {
        index: column.to_owned(),
        source: "unexpected NULL".into(),
    }
}

impl Row {
    pub fn opt_text(&self, column: &str) -> Result<Option<String>, sqlx::Error> {
        match &self.row {
            AnyRow::Sqlite(r) => r.try_get(column),
            AnyRow::Postgres(r) => r.try_get(column),
            #[cfg(feature = "mysql")]
            AnyRow::Mysql(r) => r.try_get(column),
        }
    }

    pub fn text(&self, column: &str) -> Result<String, sqlx::Error> {
        self.opt_text(column)?.ok_or_else(|| null(column))
    }

    pub fn opt_int(&self, column: &str) -> Result<Option<i64>, sqlx::Error> {
        match &self.row {
            AnyRow::Sqlite(r) => r.try_get(column),
            AnyRow::Postgres(r) => r.try_get(column),
            #[cfg(feature = "mysql")]
            AnyRow::Mysql(r) => r.try_get(column),
        }
    }

    pub fn int(&self, column: &str) -> Result<i64, sqlx::Error> {
        self.opt_int(column)?.ok_or_else(|| null(column))
    }

    pub fn opt_bool(&self, column: &str) -> Result<Option<bool>, sqlx::Error> {
        match &self.row {
            AnyRow::Sqlite(r) => r.try_get(column),
            AnyRow::Postgres(r) => r.try_get(column),
            #[cfg(feature = "mysql")]
            AnyRow::Mysql(r) => r.try_get(column),
        }
    }

    pub fn bool(&self, column: &str) -> Result<bool, sqlx::Error> {
        self.opt_bool(column)?.ok_or_else(|| null(column))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_become_positional_with_their_arguments() {
        let (text, order) = mysql_placeholders("SELECT a FROM t WHERE b = $2 AND c = $1");
        assert_eq!(text, "SELECT a FROM t WHERE b = ? AND c = ?");
        assert_eq!(order, [1, 0]);
        // A repeated parameter is bound once per use.
        let (text, order) = mysql_placeholders("WHERE ($1 IS NULL OR id = $1) LIMIT $12");
        assert_eq!(text, "WHERE (? IS NULL OR id = ?) LIMIT ?");
        assert_eq!(order, [0, 0, 11]);
    }

    #[test]
    fn quoted_text_and_lone_dollars_stay() {
        let (text, order) = mysql_placeholders(
            r#"SELECT '$1', 'it''s $2', "$3", `$4`, 'a\'$5', $ FROM t WHERE x = $1"#,
        );
        assert_eq!(
            text,
            r#"SELECT '$1', 'it''s $2', "$3", `$4`, 'a\'$5', $ FROM t WHERE x = ?"#
        );
        assert_eq!(order, [0]);
        let (text, order) = mysql_placeholders("SELECT $0, é");
        assert_eq!(text, "SELECT ?, é");
        assert_eq!(order, [usize::MAX]);
    }
}
