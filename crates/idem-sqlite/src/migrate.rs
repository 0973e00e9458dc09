//! Versioned schema migrations, applied on open. Each runs once, recorded in
//! `idem_schema_migrations`; a dropped object is not silently recreated, so the
//! drill can report a missing guard.

use sqlx::{Executor, SqlitePool};

use crate::map_err;
use idem_core::StoreError;

/// `(version, sql)` in order.
pub const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../migrations/0001_records.sql")),
    (2, include_str!("../migrations/0002_leases.sql")),
    (3, include_str!("../migrations/0003_retention.sql")),
    (4, include_str!("../migrations/0004_lease_triggers.sql")),
    (5, include_str!("../migrations/0005_arrivals.sql")),
];

pub(crate) async fn apply(pool: &SqlitePool) -> Result<(), StoreError> {
    // IMMEDIATE: two processes opening the same file at once serialise here.
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.map_err(map_err)?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS idem_schema_migrations (\
           version INTEGER PRIMARY KEY, \
           applied_at INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)))",
    )
    .execute(&mut *tx)
    .await
    .map_err(map_err)?;
    let applied: Vec<i64> = sqlx::query_scalar("SELECT version FROM idem_schema_migrations")
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
    for (version, sql) in MIGRATIONS {
        if applied.contains(version) {
            continue;
        }
        // Multi-statement text: the Executor form runs every statement in it.
        (&mut *tx).execute(*sql).await.map_err(map_err)?;
        sqlx::query("INSERT INTO idem_schema_migrations (version) VALUES (?)")
            .bind(version)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
    }
    tx.commit().await.map_err(map_err)
}
