//! Versioned migrations of the tables a caller keeps beside the store's (the order
//! service's ledgers, the console's sessions and audit), on any SQL backend, by
//! `idem_store_kit::migrate::run`.
//!
//! # What this module owns
//! - How such a schema is locked, read, applied and recorded on each backend. SQLite and
//!   PostgreSQL: one transaction for all pending versions, serialized on the facade's
//!   [`Transaction::advisory_lock`] (SQLite's `BEGIN IMMEDIATE` already holds the only
//!   write lock). MySQL/MariaDB commits every DDL statement on its own, which would end a
//!   transaction's row lock: migrators take turns on a named server lock (`GET_LOCK`) held
//!   by the session, statements run one at a time (`idem_mysql::split_statements`), each
//!   safe to run twice, and a version is recorded after all of them, so one stopped
//!   half-way is finished by the next.
//!
//! # What it must not do
//! - Know a caller's tables: the versions table's name, the lock's name and the SQL
//!   are the caller's ([`Schema`], [`versions_table!`](crate::versions_table)).

use idem_core::StoreError;
use idem_store_kit::migrate::{self, MigrationBackend};

pub use idem_store_kit::migrate::{ascending, newest, same_versions, Migration};

use crate::{sql, Backend, SqlStore, Transaction};

/// Where a schema's applied versions are recorded: `(version, name, applied_at)`, the
/// time in epoch milliseconds. Written by [`versions_table!`](crate::versions_table).
#[derive(Debug, Clone, Copy)]
pub struct VersionsTable {
    pub create: &'static str,
    pub create_mysql: &'static str,
    pub applied: &'static str,
    pub record: &'static str,
}

/// The statements of the versions table named `$table` (a string literal).
#[macro_export]
macro_rules! versions_table {
    ($table:literal) => {
        $crate::migrate::VersionsTable {
            create: concat!(
                "CREATE TABLE IF NOT EXISTS ",
                $table,
                " (version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)"
            ),
            create_mysql: concat!(
                "CREATE TABLE IF NOT EXISTS ",
                $table,
                " (version BIGINT NOT NULL PRIMARY KEY, name VARCHAR(128) NOT NULL, \
                 applied_at BIGINT NOT NULL) ENGINE = InnoDB"
            ),
            applied: concat!("SELECT version FROM ", $table),
            record: concat!(
                "INSERT INTO ",
                $table,
                " (version, name, applied_at) VALUES ($1, $2, $3)"
            ),
        }
    };
}

/// A caller's versioned schema.
#[derive(Debug, Clone, Copy)]
pub struct Schema<'a> {
    pub versions: VersionsTable,
    /// Names the lock its migrators take turns on: `{lock}-migrate:{pg schema}` on
    /// PostgreSQL, `{lock}.migrate:` and a digest of the database on MySQL (at most 15
    /// bytes, for MySQL's 64-character lock names).
    pub lock: &'static str,
    /// The migrations in the dialect SQLite and PostgreSQL share, each one script.
    pub shared: &'a [Migration],
    /// The same versions and names in MySQL's form (see [`same_versions`]).
    pub mysql: &'a [Migration],
}

/// Applies the versions of `schema` that its versions table does not list yet, oldest
/// first. Returns the versions this call applied.
pub async fn run(store: &SqlStore, schema: &Schema<'_>) -> Result<Vec<i64>, StoreError> {
    let backend = store.backend();
    #[cfg(feature = "mysql")]
    if backend == Backend::Mysql {
        let session = MysqlSession {
            conn: store.acquire().await.map_err(|e| failed(backend, e))?,
            schema,
        };
        return migrate::run(session, schema.mysql).await;
    }
    let tx = InTransaction {
        tx: store.begin().await?,
        lock: format!("{}-migrate:{}", schema.lock, store.schema().unwrap_or("")),
        schema,
    };
    migrate::run(tx, schema.shared).await
}

fn failed(backend: Backend, e: sqlx::Error) -> StoreError {
    match backend {
        Backend::Postgres => idem_postgres::map_err("migrate", e),
        #[cfg(feature = "mysql")]
        Backend::Mysql => idem_mysql::map_err("migrate", e),
        Backend::Sqlite | Backend::Redis => idem_sqlite::map_err(e),
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// SQLite and PostgreSQL: every pending version in one transaction.
struct InTransaction<'a> {
    tx: Transaction,
    lock: String,
    schema: &'a Schema<'a>,
}

impl InTransaction<'_> {
    fn failed(&self, e: sqlx::Error) -> StoreError {
        failed(self.tx.backend(), e)
    }
}

impl MigrationBackend for InTransaction<'_> {
    type Error = StoreError;

    async fn lock(&mut self) -> Result<(), StoreError> {
        // Lock first: CREATE TABLE IF NOT EXISTS is not safe against a concurrent twin.
        let taken = self.tx.advisory_lock(&self.lock).await;
        taken.map_err(|e| self.failed(e))?;
        let made = self
            .tx
            .conn()
            .execute_script(self.schema.versions.create)
            .await;
        made.map_err(|e| self.failed(e))
    }

    async fn applied(&mut self) -> Result<Vec<i64>, StoreError> {
        let rows = self.tx.conn().all(sql(self.schema.versions.applied)).await;
        let rows = rows.map_err(|e| self.failed(e))?;
        rows.iter()
            .map(|r| r.int("version"))
            .collect::<Result<_, _>>()
            .map_err(|e| self.failed(e))
    }

    async fn apply(&mut self, migration: &Migration) -> Result<(), StoreError> {
        let done = self.tx.conn().execute_script(migration.sql).await;
        done.map_err(|e| self.failed(e))
    }

    async fn record(&mut self, migration: &Migration) -> Result<(), StoreError> {
        let q = sql(self.schema.versions.record)
            .bind(migration.version)
            .bind(migration.name)
            .bind(now_ms());
        let done = self.tx.conn().execute(q).await;
        done.map(drop).map_err(|e| self.failed(e))
    }

    async fn unlock(self) -> Result<(), StoreError> {
        // The lock is the transaction's: it ends with the commit.
        self.tx.commit().await
    }

    async fn abandon(self) {
        // Dropping the transaction rolls it back and ends its lock.
    }
}

/// MySQL/MariaDB: one pooled session, outside any transaction, holding a named lock.
#[cfg(feature = "mysql")]
struct MysqlSession<'a> {
    conn: crate::PoolConn,
    schema: &'a Schema<'a>,
}

#[cfg(feature = "mysql")]
impl MysqlSession<'_> {
    async fn release(&mut self) -> Result<(), sqlx::Error> {
        let q = sql("DO RELEASE_LOCK(CONCAT($1, LEFT(SHA2(DATABASE(), 256), 40)))")
            .bind(format!("{}.migrate:", self.schema.lock));
        self.conn.conn().execute(q).await.map(drop)
    }
}

#[cfg(feature = "mysql")]
fn mysql_failed(e: sqlx::Error) -> StoreError {
    failed(Backend::Mysql, e)
}

#[cfg(feature = "mysql")]
impl MigrationBackend for MysqlSession<'_> {
    type Error = StoreError;

    async fn lock(&mut self) -> Result<(), StoreError> {
        let q = sql("SELECT GET_LOCK(CONCAT($1, LEFT(SHA2(DATABASE(), 256), 40)), 60) AS got")
            .bind(format!("{}.migrate:", self.schema.lock));
        let mut c = self.conn.conn();
        let got = c.one(q).await.and_then(|r| r.opt_int("got"));
        if got.map_err(mysql_failed)? != Some(1) {
            return Err(StoreError::Unavailable(format!(
                "{} migration: another migrator held the lock for 60 s",
                self.schema.lock
            )));
        }
        let made = c.execute_script(self.schema.versions.create_mysql).await;
        made.map_err(mysql_failed)
    }

    async fn applied(&mut self) -> Result<Vec<i64>, StoreError> {
        let rows = self
            .conn
            .conn()
            .all(sql(self.schema.versions.applied))
            .await;
        rows.map_err(mysql_failed)?
            .iter()
            .map(|r| r.int("version"))
            .collect::<Result<_, _>>()
            .map_err(mysql_failed)
    }

    async fn apply(&mut self, migration: &Migration) -> Result<(), StoreError> {
        let mut c = self.conn.conn();
        for statement in idem_mysql::split_statements(migration.sql) {
            c.execute_script(statement).await.map_err(mysql_failed)?;
        }
        Ok(())
    }

    async fn record(&mut self, migration: &Migration) -> Result<(), StoreError> {
        let q = sql(self.schema.versions.record)
            .bind(migration.version)
            .bind(migration.name)
            .bind(now_ms());
        self.conn.conn().execute(q).await.map_err(mysql_failed)?;
        Ok(())
    }

    async fn unlock(mut self) -> Result<(), StoreError> {
        // The lock is the session's: give it back before the connection is reused.
        self.release().await.map_err(mysql_failed)
    }

    async fn abandon(mut self) {
        // A session that cannot run this is gone, and the lock with it.
        let _ = self.release().await;
    }
}
