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
        // Times are epoch milliseconds read from the database clock (never the caller's).
        // Not partitioned: the UNIQUE guard must cover the whole (tenant_id, key) space, and
        // a partitioned table could only enforce it per partition.
        sql: r#"
CREATE TABLE idem_records (
    tenant_id        text    NOT NULL,
    key              text    NOT NULL,
    principal        text    NOT NULL,
    fingerprint      bytea   NOT NULL CHECK (octet_length(fingerprint) = 32),
    state            text    NOT NULL CHECK (state IN
                         ('PROCESSING', 'SUCCEEDED', 'FAILED_RETRYABLE', 'FAILED_TERMINAL')),
    version          bigint  NOT NULL CHECK (version > 0),
    owner            text,
    lease_expires_at bigint,
    result_status    integer CHECK (result_status BETWEEN 0 AND 65535),
    result_headers   jsonb,
    result_body      bytea,
    result_ref       text,
    attempts         integer NOT NULL CHECK (attempts > 0),
    created_at       bigint  NOT NULL,
    updated_at       bigint  NOT NULL,
    completed_at     bigint
);
-- The last gate (docs/DESIGN.md: key states): two instances that both saw "absent" both INSERT; this index
-- lets one win and makes the other read the winner's record. unique_guard() checks it.
CREATE UNIQUE INDEX idem_records_scope_uq ON idem_records (tenant_id, key);
-- The stale-PROCESSING scan (records whose lease ran out) reads only this small index.
CREATE INDEX idem_records_processing_lease_idx ON idem_records (lease_expires_at)
    WHERE state = 'PROCESSING';
-- Retention sweeps walk finished records by completion time.
CREATE INDEX idem_records_completed_idx ON idem_records (completed_at)
    WHERE completed_at IS NOT NULL;
"#,
    },
    Migration {
        version: 2,
        name: "idem_leases",
        // The tables of `lease.rs`, next to the statements that use them.
        sql: crate::lease::MIGRATION_SQL,
    },
    Migration {
        version: 3,
        name: "idem_retention",
        // Retention tiers, the partitioned archive: next to the statements in `retention.rs`.
        sql: crate::retention::MIGRATION_SQL,
    },
    Migration {
        version: 4,
        name: "idem_records_drop_completed_idx",
        // The sweeper's (tier, completed_at, tenant_id, key) index serves every scan by
        // completion time; this one only cost each completion an extra index write.
        // DROP INDEX takes the table's exclusive lock: give up rather than queue every
        // claim behind a long transaction (rerun `idem migrate` when it is quiet).
        sql: "SET LOCAL lock_timeout = '10s'; DROP INDEX IF EXISTS idem_records_completed_idx;",
    },
    Migration {
        version: 5,
        name: "idem_lease_events_one_index",
        // The event log is append-only with ids from its identity sequence, read by
        // (name, id): that index is the only one it needs. Every lease change writes an
        // event, so a second index was a second write on the hot path.
        sql: "SET LOCAL lock_timeout = '10s'; \
              ALTER TABLE idem_lease_events DROP CONSTRAINT IF EXISTS idem_lease_events_pkey;",
    },
    Migration {
        version: 6,
        name: "idem_lease_tokens_guard_when",
        // Every grant bumps its counter, and the guard ran a PL/pgSQL call for each bump
        // only to find it rising (about a tenth of a grant's cost in pgbench). The
        // trigger's WHEN clause now tests the rule in the executor and calls the function
        // only to refuse a counter that would go back or be renamed; deletes and
        // truncates are refused as before.
        sql: "SET LOCAL lock_timeout = '10s'; \
              DROP TRIGGER IF EXISTS idem_lease_tokens_guard ON idem_lease_tokens; \
              CREATE TRIGGER idem_lease_tokens_guard BEFORE UPDATE ON idem_lease_tokens \
                  FOR EACH ROW \
                  WHEN (NEW.last_token < OLD.last_token OR NEW.name <> OLD.name) \
                  EXECUTE FUNCTION idem_lease_tokens_never_go_back(); \
              CREATE TRIGGER idem_lease_tokens_no_delete BEFORE DELETE ON idem_lease_tokens \
                  FOR EACH ROW EXECUTE FUNCTION idem_lease_tokens_never_go_back();",
    },
    Migration {
        version: 7,
        name: "idem_lease_events_at_idx",
        // Retention of the evidence (`trim_events`) finds old events by time. A B-tree:
        // a BRIN summary would only widen as trimmed space is reused, until every range
        // matched. The build blocks event inserts (every lease change) while it reads the
        // log once: run `idem migrate` when it is quiet on a large log.
        sql: "SET LOCAL lock_timeout = '10s'; \
              CREATE INDEX IF NOT EXISTS idem_lease_events_at_idx ON idem_lease_events (at);",
    },
    Migration {
        version: 8,
        name: "idem_leases_kept",
        // A lease row outlives its lease (marked ended), so a grant and a release are
        // each one update of it in place instead of a counter bump, an insert and a
        // delete: next to the statements in `lease.rs`.
        sql: crate::lease::KEPT_ROWS_SQL,
    },
    Migration {
        version: 9,
        name: "idem_lease_release_in_place",
        // The holder's release writes no event row of its own: about a third of a lease
        // cycle's cost in pgbench. Next to the statements in `lease.rs`.
        sql: crate::lease::RELEASE_IN_PLACE_SQL,
    },
    Migration {
        version: 10,
        name: "idem_arrivals",
        // The arrival timeline's tables (idem-sql's `arrivals` writes and reads them).
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
