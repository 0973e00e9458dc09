//! The store's versioned schema migrations (`migrations/*.sql`), applied on open and
//! recorded in `idem_schema_migrations` (versions only: the table has no name column),
//! and how SQLite runs them for `idem_store_kit::migrate::run`, which owns the
//! algorithm. Each runs once; a dropped object is not silently recreated, so the drill
//! can report a missing guard.

use idem_store_kit::migrate::{self, Migration, MigrationBackend};
use sqlx::{Executor, Sqlite, SqlitePool, Transaction};

use crate::map_err;
use idem_core::StoreError;

/// Every migration, oldest first.
pub const MIGRATIONS: &[Migration] = &[
    Migration::new(1, "records", include_str!("../migrations/0001_records.sql")),
    Migration::new(2, "leases", include_str!("../migrations/0002_leases.sql")),
    Migration::new(
        3,
        "retention",
        include_str!("../migrations/0003_retention.sql"),
    ),
    Migration::new(
        4,
        "lease_triggers",
        include_str!("../migrations/0004_lease_triggers.sql"),
    ),
    Migration::new(
        5,
        "arrivals",
        include_str!("../migrations/0005_arrivals.sql"),
    ),
];

const _: () = assert!(migrate::ascending(MIGRATIONS));

pub(crate) async fn apply(pool: &SqlitePool) -> Result<(), StoreError> {
    // IMMEDIATE: two processes opening the same file at once serialise here.
    let tx = pool.begin_with("BEGIN IMMEDIATE").await.map_err(map_err)?;
    migrate::run(SqliteMigrator { tx }, MIGRATIONS).await?;
    Ok(())
}

/// One `BEGIN IMMEDIATE` transaction: it holds the file's only write lock from its start.
struct SqliteMigrator {
    tx: Transaction<'static, Sqlite>,
}

impl MigrationBackend for SqliteMigrator {
    type Error = StoreError;

    async fn lock(&mut self) -> Result<(), StoreError> {
        // The lock is the transaction's own; only the versions table is left to make.
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS idem_schema_migrations (\
               version INTEGER PRIMARY KEY, \
               applied_at INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)))",
        )
        .execute(&mut *self.tx)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn applied(&mut self) -> Result<Vec<i64>, StoreError> {
        sqlx::query_scalar("SELECT version FROM idem_schema_migrations")
            .fetch_all(&mut *self.tx)
            .await
            .map_err(map_err)
    }

    async fn apply(&mut self, migration: &Migration) -> Result<(), StoreError> {
        // Multi-statement text: the Executor form runs every statement in it.
        (&mut *self.tx)
            .execute(migration.sql)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn record(&mut self, migration: &Migration) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO idem_schema_migrations (version) VALUES (?)")
            .bind(migration.version)
            .execute(&mut *self.tx)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn unlock(self) -> Result<(), StoreError> {
        self.tx.commit().await.map_err(map_err)
    }

    async fn abandon(self) {
        // Dropping the transaction rolls it back and releases the write lock.
    }
}
