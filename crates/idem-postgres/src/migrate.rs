//! Versioned schema migrations, recorded in `idem_schema_migrations`.
//!
//! All of them run in one transaction that first takes a transaction-scoped advisory lock,
//! so two processes migrating the same schema at once serialize: the second waits, then
//! sees the versions the first recorded and applies nothing. Migrations are append-only:
//! a released version is never edited, a change is a new version.

use sqlx::{Connection, PgConnection};

use idem_core::StoreError;

use crate::error::map_err;

/// One schema change. `sql` uses unqualified names: the migration transaction sets
/// `search_path` to the store's schema.
pub(crate) struct Migration {
    pub version: i64,
    pub name: &'static str,
    pub sql: &'static str,
}

/// Every migration, oldest first.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "idem_records",
        sql: include_str!("../migrations/0001_idem_records.sql"),
    },
    Migration {
        version: 2,
        name: "idem_leases",
        sql: include_str!("../migrations/0002_idem_leases.sql"),
    },
    Migration {
        version: 3,
        name: "idem_retention",
        sql: include_str!("../migrations/0003_idem_retention.sql"),
    },
    Migration {
        version: 4,
        name: "idem_records_drop_completed_idx",
        sql: include_str!("../migrations/0004_idem_records_drop_completed_idx.sql"),
    },
    Migration {
        version: 5,
        name: "idem_lease_events_one_index",
        sql: include_str!("../migrations/0005_idem_lease_events_one_index.sql"),
    },
    Migration {
        version: 6,
        name: "idem_lease_tokens_guard_when",
        sql: include_str!("../migrations/0006_idem_lease_tokens_guard_when.sql"),
    },
    Migration {
        version: 7,
        name: "idem_lease_events_at_idx",
        sql: include_str!("../migrations/0007_idem_lease_events_at_idx.sql"),
    },
    Migration {
        version: 8,
        name: "idem_leases_kept",
        sql: include_str!("../migrations/0008_idem_leases_kept.sql"),
    },
    Migration {
        version: 9,
        name: "idem_lease_release_in_place",
        sql: include_str!("../migrations/0009_idem_lease_release_in_place.sql"),
    },
    Migration {
        version: 10,
        name: "idem_arrivals",
        sql: include_str!("../migrations/0010_arrivals.sql"),
    },
    Migration {
        version: 11,
        name: "idem_functions",
        // The key-state machine as SQL functions for clients in any language
        // (docs/SQL-API.md).
        sql: include_str!("../migrations/0011_functions.sql"),
    },
];

/// Constant first half of the advisory lock key, so idem's lock does not collide with
/// other users of two-key advisory locks by accident.
const LOCK_CLASS: i32 = 0x1DE0_0001;

/// Applies the migrations that `idem_schema_migrations` does not list yet. Returns the
/// versions applied by this call (empty when the schema was current).
pub(crate) async fn run(
    conn: &mut PgConnection,
    schema: Option<&str>,
) -> Result<Vec<i64>, StoreError> {
    let m = |e| map_err("migrate", e);
    let mut tx = conn.begin().await.map_err(m)?;
    // Lock first: CREATE SCHEMA / CREATE TABLE IF NOT EXISTS are not safe against a
    // concurrent twin (both can pass the existence check and one fails on pg_namespace).
    let lock_name = match schema {
        Some(s) => s.to_string(),
        None => sqlx::query_scalar::<_, Option<String>>("SELECT current_schema()")
            .fetch_one(&mut *tx)
            .await
            .map_err(m)?
            .unwrap_or_default(),
    };
    sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
        .bind(LOCK_CLASS)
        .bind(format!("idem.migrate:{lock_name}"))
        .execute(&mut *tx)
        .await
        .map_err(m)?;
    if let Some(s) = schema {
        // `s` passed `validate_schema`: a plain lower-case identifier, safe to splice.
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE SCHEMA IF NOT EXISTS \"{s}\"; SET LOCAL search_path TO \"{s}\";"
        )))
        .execute(&mut *tx)
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
    .execute(&mut *tx)
    .await
    .map_err(m)?;
    let applied: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM idem_schema_migrations ORDER BY version")
            .fetch_all(&mut *tx)
            .await
            .map_err(m)?;
    let known = MIGRATIONS.last().map_or(0, |mig| mig.version);
    if let Some(&newest) = applied.last() {
        if newest > known {
            // A newer build migrated this schema; it stays readable by design (additive
            // migrations), so warn rather than refuse.
            tracing::warn!(newest, known, "schema is newer than this build");
        }
    }
    let mut done = Vec::new();
    for mig in MIGRATIONS {
        if applied.contains(&mig.version) {
            continue;
        }
        sqlx::raw_sql(mig.sql).execute(&mut *tx).await.map_err(m)?;
        sqlx::query("INSERT INTO idem_schema_migrations (version, name) VALUES ($1, $2)")
            .bind(mig.version)
            .bind(mig.name)
            .execute(&mut *tx)
            .await
            .map_err(m)?;
        tracing::info!(version = mig.version, name = mig.name, schema = ?schema, "applied migration");
        done.push(mig.version);
    }
    tx.commit().await.map_err(m)?;
    Ok(done)
}
