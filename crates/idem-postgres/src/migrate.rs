//! The store's versioned schema migrations (`migrations/*.sql`), recorded in
//! `idem_schema_migrations`, and how PostgreSQL runs them for
//! `idem_store_kit::migrate::run`, which owns the algorithm.
//!
//! All of them run in one transaction that first takes a transaction-scoped advisory lock,
//! so two processes migrating the same schema at once serialize: the second waits, then
//! sees the versions the first recorded and applies nothing. Migrations are append-only:
//! a released version is never edited, a change is a new version.

use idem_store_kit::migrate::{self, Migration, MigrationBackend};
use sqlx::{Connection, PgConnection, Postgres, Transaction};

use idem_core::StoreError;

use crate::error::map_err;

/// Every migration, oldest first. The SQL uses unqualified names: the migration
/// transaction sets `search_path` to the store's schema.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration::new(
        1,
        "idem_records",
        include_str!("../migrations/0001_idem_records.sql"),
    ),
    Migration::new(
        2,
        "idem_leases",
        include_str!("../migrations/0002_idem_leases.sql"),
    ),
    Migration::new(
        3,
        "idem_retention",
        include_str!("../migrations/0003_idem_retention.sql"),
    ),
    Migration::new(
        4,
        "idem_records_drop_completed_idx",
        include_str!("../migrations/0004_idem_records_drop_completed_idx.sql"),
    ),
    Migration::new(
        5,
        "idem_lease_events_one_index",
        include_str!("../migrations/0005_idem_lease_events_one_index.sql"),
    ),
    Migration::new(
        6,
        "idem_lease_tokens_guard_when",
        include_str!("../migrations/0006_idem_lease_tokens_guard_when.sql"),
    ),
    Migration::new(
        7,
        "idem_lease_events_at_idx",
        include_str!("../migrations/0007_idem_lease_events_at_idx.sql"),
    ),
    Migration::new(
        8,
        "idem_leases_kept",
        include_str!("../migrations/0008_idem_leases_kept.sql"),
    ),
    Migration::new(
        9,
        "idem_lease_release_in_place",
        include_str!("../migrations/0009_idem_lease_release_in_place.sql"),
    ),
    Migration::new(
        10,
        "idem_arrivals",
        include_str!("../migrations/0010_arrivals.sql"),
    ),
    // The key-state machine as SQL functions for clients in any language
    // (docs/SQL-API.md).
    Migration::new(
        11,
        "idem_functions",
        include_str!("../migrations/0011_functions.sql"),
    ),
];

const _: () = assert!(migrate::ascending(MIGRATIONS));

/// Constant first half of the advisory lock key, so idem's lock does not collide with
/// other users of two-key advisory locks by accident.
const LOCK_CLASS: i32 = 0x1DE0_0001;

/// Applies the migrations that `idem_schema_migrations` does not list yet. Returns the
/// versions applied by this call (empty when the schema was current).
pub(crate) async fn run(
    conn: &mut PgConnection,
    schema: Option<&str>,
) -> Result<Vec<i64>, StoreError> {
    let tx = conn.begin().await.map_err(m)?;
    migrate::run(PgMigrator { tx, schema }, MIGRATIONS).await
}

fn m(e: sqlx::Error) -> StoreError {
    map_err("migrate", e)
}

/// One migration transaction on the store's schema (`None`: the connection's own).
struct PgMigrator<'c> {
    tx: Transaction<'c, Postgres>,
    schema: Option<&'c str>,
}

impl MigrationBackend for PgMigrator<'_> {
    type Error = StoreError;

    async fn lock(&mut self) -> Result<(), StoreError> {
        // Lock first: CREATE SCHEMA / CREATE TABLE IF NOT EXISTS are not safe against a
        // concurrent twin (both can pass the existence check and one fails on pg_namespace).
        let lock_name = match self.schema {
            Some(s) => s.to_string(),
            None => sqlx::query_scalar::<_, Option<String>>("SELECT current_schema()")
                .fetch_one(&mut *self.tx)
                .await
                .map_err(m)?
                .unwrap_or_default(),
        };
        sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
            .bind(LOCK_CLASS)
            .bind(format!("idem.migrate:{lock_name}"))
            .execute(&mut *self.tx)
            .await
            .map_err(m)?;
        if let Some(s) = self.schema {
            // `s` passed `validate_schema`: a plain lower-case identifier, safe to splice.
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "CREATE SCHEMA IF NOT EXISTS \"{s}\"; SET LOCAL search_path TO \"{s}\";"
            )))
            .execute(&mut *self.tx)
            .await
            .map_err(m)?;
        }
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS idem_schema_migrations (
                version    bigint      PRIMARY KEY,
                name       text        NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
            )",
        )
        .execute(&mut *self.tx)
        .await
        .map_err(m)?;
        Ok(())
    }

    async fn applied(&mut self) -> Result<Vec<i64>, StoreError> {
        sqlx::query_scalar("SELECT version FROM idem_schema_migrations")
            .fetch_all(&mut *self.tx)
            .await
            .map_err(m)
    }

    async fn apply(&mut self, migration: &Migration) -> Result<(), StoreError> {
        sqlx::raw_sql(migration.sql)
            .execute(&mut *self.tx)
            .await
            .map_err(m)?;
        Ok(())
    }

    async fn record(&mut self, migration: &Migration) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO idem_schema_migrations (version, name) VALUES ($1, $2)")
            .bind(migration.version)
            .bind(migration.name)
            .execute(&mut *self.tx)
            .await
            .map_err(m)?;
        Ok(())
    }

    async fn unlock(self) -> Result<(), StoreError> {
        // The advisory lock is the transaction's: it ends with the commit.
        self.tx.commit().await.map_err(m)
    }

    async fn abandon(self) {
        // Dropping the transaction rolls it back and ends its lock.
    }
}
