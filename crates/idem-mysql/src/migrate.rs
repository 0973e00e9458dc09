//! Versioned schema migrations, recorded in `idem_schema_migrations`.
//!
//! Owns the store's DDL and the order it is applied in. MySQL and MariaDB commit every
//! DDL statement on its own (an implicit commit), so migrations cannot share a
//! transaction: instead every statement is written to be run again safely (`CREATE
//! TABLE IF NOT EXISTS`, `DROP TRIGGER IF EXISTS` before `CREATE TRIGGER`, `DROP
//! PROCEDURE IF EXISTS` before `CREATE PROCEDURE`, no `CREATE INDEX`: indexes are
//! declared with their table), and a version is recorded only after all its statements
//! ran. A crash half-way leaves the version unrecorded and the next
//! run applies it again. Concurrent migrators serialize on a named server lock
//! (`GET_LOCK`). Migrations are append-only: a released version is never edited.
//!
//! It must not depend on a MariaDB-only or MySQL-only form: every statement here runs on
//! both (see the crate docs for the differences avoided).

use sqlx::pool::PoolConnection;
use sqlx::MySql;

use idem_core::StoreError;

use crate::error::map_err;

/// One schema change: statements run one by one (each may commit implicitly).
pub(crate) struct Migration {
    pub version: i64,
    pub name: &'static str,
    pub statements: &'static [&'static str],
}

/// Every migration, oldest first.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "idem_records",
        statements: &[RECORDS],
    },
    Migration {
        version: 2,
        name: "idem_leases",
        statements: crate::lease::MIGRATION,
    },
    Migration {
        version: 3,
        name: "idem_retention",
        statements: crate::retention::MIGRATION,
    },
    Migration {
        version: 4,
        name: "idem_advisory_locks",
        // Transaction-scoped named locks for the facade's `Transaction::advisory_lock`:
        // MySQL's GET_LOCK is held by the session, not the transaction, so it would
        // outlive a rolled-back transaction on a pooled connection. A row lock here ends
        // with the transaction.
        statements: &["CREATE TABLE IF NOT EXISTS idem_advisory_locks (
    name_digest BINARY(32) NOT NULL PRIMARY KEY
) ENGINE = InnoDB"],
    },
    Migration {
        version: 5,
        name: "idem_procedures",
        statements: crate::procedures::MIGRATION,
    },
    Migration {
        version: 6,
        name: "idem_arrivals",
        statements: &[ARRIVAL_KEYS, ARRIVALS],
    },
    Migration {
        version: 7,
        name: "idem_lease_procedures",
        statements: crate::lease::PROCEDURES,
    },
    Migration {
        version: 8,
        name: "idem_leases_in_place",
        statements: crate::lease::IN_PLACE,
    },
    Migration {
        version: 9,
        name: "idem_procedures_leaner",
        statements: crate::procedures::LEANER,
    },
];

/// Times are epoch milliseconds (BIGINT) from the server clock, as in the other stores.
/// Tenant, key, principal and owner are visible ASCII (idem_core checks it), so they are
/// `ascii` with the binary collation: byte comparison (keys `A` and `a` differ; the
/// default utf8mb4 collations are case-insensitive) and at most 383 bytes in the primary
/// key, far below InnoDB's 3072-byte index limit. The primary key is the unique guard:
/// a duplicate on a primary key takes a record lock, never the next-key (gap) lock a
/// duplicate on a secondary unique index takes, so concurrent claims of neighbouring
/// keys do not block or deadlock each other.
const RECORDS: &str = "CREATE TABLE IF NOT EXISTS idem_records (
    tenant_id        VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    `key`            VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    principal        VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    fingerprint      VARBINARY(32) NOT NULL,
    state            VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    version          BIGINT NOT NULL,
    owner            VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NULL,
    lease_expires_at BIGINT NULL,
    result_status    INT NULL,
    result_headers   MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    result_body      LONGBLOB NULL,
    result_ref       TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    attempts         INT NOT NULL,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    completed_at     BIGINT NULL,
    tier             VARCHAR(8) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT 'retry',
    PRIMARY KEY (tenant_id, `key`),
    -- The stale-PROCESSING scan.
    KEY idem_records_processing_lease_idx (state, lease_expires_at),
    -- The sweeper walks finished records per tier in (completed_at, tenant_id, key) order.
    KEY idem_records_tier_due_idx (tier, completed_at, tenant_id, `key`),
    CONSTRAINT idem_records_fingerprint_ck CHECK (LENGTH(fingerprint) = 32),
    CONSTRAINT idem_records_state_ck CHECK (state IN
        ('PROCESSING', 'SUCCEEDED', 'FAILED_RETRYABLE', 'FAILED_TERMINAL')),
    CONSTRAINT idem_records_version_ck CHECK (version > 0),
    CONSTRAINT idem_records_status_ck CHECK (result_status BETWEEN 0 AND 65535),
    CONSTRAINT idem_records_attempts_ck CHECK (attempts > 0),
    CONSTRAINT idem_records_tier_ck CHECK (tier IN ('retry', 'replay', 'dispute'))
) ENGINE = InnoDB";

/// The arrival timeline (idem-sql's arrivals module writes and reads it), the columns of
/// PostgreSQL's migration 10: per key, when it first and last arrived and how many
/// arrivals got each decision. Tenant and key are the records' (visible ASCII, byte
/// comparison); the `(last_at)` index serves the retention pass's walk.
const ARRIVAL_KEYS: &str = "CREATE TABLE IF NOT EXISTS idem_arrival_keys (
    tenant_id   VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    idem_key    VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    first_at    BIGINT NOT NULL,
    last_at     BIGINT NOT NULL,
    executed    BIGINT NOT NULL,
    replayed    BIGINT NOT NULL,
    in_progress BIGINT NOT NULL,
    mismatch    BIGINT NOT NULL,
    refused     BIGINT NOT NULL,
    total       BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, idem_key),
    KEY idem_arrival_keys_by_last (last_at),
    CONSTRAINT idem_arrival_keys_counts_ck CHECK (executed >= 0 AND replayed >= 0
        AND in_progress >= 0 AND mismatch >= 0 AND refused >= 0 AND total > 0)
) ENGINE = InnoDB";

/// The first arrivals of each key, one row each (bounded per key by the writer).
const ARRIVALS: &str = "CREATE TABLE IF NOT EXISTS idem_arrivals (
    tenant_id  VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    idem_key   VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    seq        BIGINT NOT NULL,
    at         BIGINT NOT NULL,
    decision   VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    status     BIGINT NOT NULL,
    elapsed_ms BIGINT NOT NULL,
    principal  VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    PRIMARY KEY (tenant_id, idem_key, seq),
    CONSTRAINT idem_arrivals_seq_ck CHECK (seq > 0),
    CONSTRAINT idem_arrivals_decision_ck CHECK (decision IN
        ('executed', 'replayed', 'in_progress', 'mismatch', 'refused'))
) ENGINE = InnoDB";

/// The named server lock of the migrators of one database. The name is cut to 64
/// characters, MySQL's limit for lock names.
const LOCK: &str = "SELECT GET_LOCK(CONCAT('idem.migrate:', LEFT(SHA2(DATABASE(), 256), 40)), 60)";
const UNLOCK: &str =
    "SELECT RELEASE_LOCK(CONCAT('idem.migrate:', LEFT(SHA2(DATABASE(), 256), 40)))";

/// Applies the migrations that `idem_schema_migrations` does not list yet. Returns the
/// versions applied by this call (empty when the schema was current).
pub(crate) async fn run(conn: &mut PoolConnection<MySql>) -> Result<Vec<i64>, StoreError> {
    let m = |e| map_err("migrate", e);
    let got: Option<i64> = sqlx::query_scalar(LOCK)
        .fetch_one(&mut **conn)
        .await
        .map_err(m)?;
    if got != Some(1) {
        return Err(StoreError::Unavailable(
            "mysql migrate: another migrator held the lock for 60 s".into(),
        ));
    }
    let outcome = apply(conn).await;
    match &outcome {
        // The lock is the session's: give it back before the connection is reused.
        Ok(_) => {
            sqlx::query(UNLOCK).execute(&mut **conn).await.map_err(m)?;
        }
        // A failed session may not run the unlock: closing it releases the lock.
        Err(_) => conn.close_on_drop(),
    }
    outcome
}

async fn apply(conn: &mut PoolConnection<MySql>) -> Result<Vec<i64>, StoreError> {
    let m = |e| map_err("migrate", e);
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS idem_schema_migrations (
            version    BIGINT       NOT NULL PRIMARY KEY,
            name       VARCHAR(128) NOT NULL,
            applied_at DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
        ) ENGINE = InnoDB",
    )
    .execute(&mut **conn)
    .await
    .map_err(m)?;
    let applied: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM idem_schema_migrations ORDER BY version")
            .fetch_all(&mut **conn)
            .await
            .map_err(m)?;
    let known = MIGRATIONS.last().map_or(0, |mig| mig.version);
    if let Some(&newest) = applied.last() {
        if newest > known {
            // A newer build migrated this database; additive migrations keep it
            // readable, so warn rather than refuse.
            tracing::warn!(newest, known, "schema is newer than this build");
        }
    }
    let mut done = Vec::new();
    for mig in MIGRATIONS {
        if applied.contains(&mig.version) {
            continue;
        }
        for statement in mig.statements {
            sqlx::raw_sql(*statement)
                .execute(&mut **conn)
                .await
                .map_err(m)?;
        }
        sqlx::query("INSERT INTO idem_schema_migrations (version, name) VALUES (?, ?)")
            .bind(mig.version)
            .bind(mig.name)
            .execute(&mut **conn)
            .await
            .map_err(m)?;
        tracing::info!(version = mig.version, name = mig.name, "applied migration");
        done.push(mig.version);
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_rise_and_statements_rerun_safely() {
        let mut last = 0;
        for mig in MIGRATIONS {
            assert!(mig.version > last, "{}", mig.name);
            last = mig.version;
            for s in mig.statements {
                let s = s.trim_start().to_ascii_uppercase();
                // Each statement must be safe to run twice (no transaction holds DDL).
                assert!(
                    s.starts_with("CREATE TABLE IF NOT EXISTS")
                        || s.starts_with("DROP TRIGGER IF EXISTS")
                        || s.starts_with("CREATE TRIGGER")
                        || s.starts_with("DROP PROCEDURE IF EXISTS")
                        || s.starts_with("CREATE PROCEDURE"),
                    "{s}"
                );
            }
        }
    }
}
