//! The store's versioned schema migrations, recorded in `idem_schema_migrations`, how
//! MySQL runs them for `idem_store_kit::migrate::run` (which owns the algorithm), and
//! how a MySQL migration's text is cut into statements ([`split_statements`]).
//!
//! Owns the order the store's DDL is applied in: `migrations/NNNN_name.sql`, and the
//! procedures in `sql/` (one file each, a migration lists them). MySQL and MariaDB commit
//! every DDL statement on its own (an implicit commit), so migrations cannot share a
//! transaction: instead every statement is written to be run again safely (`CREATE
//! TABLE IF NOT EXISTS`, `DROP TRIGGER IF EXISTS` before `CREATE TRIGGER`, `DROP
//! PROCEDURE IF EXISTS` before `CREATE PROCEDURE`, no `CREATE INDEX`: indexes are
//! declared with their table), statements run one at a time, and a version is recorded
//! only after all its statements ran. A crash half-way leaves the version unrecorded and
//! the next run applies it again. Concurrent migrators serialize on a named server lock
//! (`GET_LOCK`). Migrations are append-only: a released version is never edited.
//!
//! Adding one: write `migrations/NNNN_name.sql` (statements as above, each ending in
//! `;`; a trigger or procedure body between `DELIMITER //` and `DELIMITER ;`, its end
//! `END //`), and append `Migration::new(N, "name", include_str!(…))` to [`MIGRATIONS`].
//!
//! It must not depend on a MariaDB-only or MySQL-only form: every statement here runs on
//! both (see the crate docs for the differences avoided).

use idem_store_kit::migrate::{self, Migration, MigrationBackend};
use sqlx::pool::PoolConnection;
use sqlx::MySql;

use idem_core::StoreError;

use crate::error::map_err;

/// Every migration, oldest first.
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
        "idem_advisory_locks",
        include_str!("../migrations/0004_idem_advisory_locks.sql"),
    ),
    // The key-state machine's procedures (docs/SQL-API.md): the checks first, the
    // others call them.
    Migration::new(
        5,
        "idem_procedures",
        concat!(
            include_str!("../sql/idem_check_names.sql"),
            include_str!("../sql/idem_check_lease.sql"),
            include_str!("../sql/idem_claim.sql"),
            include_str!("../sql/idem_finish.sql"),
            include_str!("../sql/idem_heartbeat.sql"),
        ),
    ),
    Migration::new(
        6,
        "idem_arrivals",
        include_str!("../migrations/0006_idem_arrivals.sql"),
    ),
    // The lease acquire and the holder's release, one round trip each instead of six to
    // eight; the store's own, called only from lease.rs with checked arguments.
    Migration::new(
        7,
        "idem_lease_procedures",
        concat!(
            include_str!("../sql/idem_lease_acquire.sql"),
            include_str!("../sql/idem_lease_release.sql"),
        ),
    ),
    // Leases kept in place: triggers write a grant's and a release's evidence in the
    // statement that makes it and keep a deleted row's token in the counter; the
    // procedures grant over an ended row and end a released one in place. Migration 7
    // installs the same procedure texts (a fresh database runs both); this moves an
    // existing one on.
    Migration::new(
        8,
        "idem_leases_in_place",
        concat!(
            include_str!("../sql/idem_leases_granted.sql"),
            include_str!("../sql/idem_leases_changed.sql"),
            include_str!("../sql/idem_leases_deleted.sql"),
            include_str!("../sql/idem_lease_acquire.sql"),
            include_str!("../sql/idem_lease_release.sql"),
        ),
    ),
    // `idem_claim` and `idem_finish` again, cheaper on the server (fewer statements per
    // call); migration 5 installs the same texts, this moves an existing database on.
    Migration::new(
        9,
        "idem_procedures_leaner",
        concat!(
            include_str!("../sql/idem_claim.sql"),
            include_str!("../sql/idem_finish.sql"),
        ),
    ),
    // The visible-ASCII check of every name as a negated class, which also refuses a
    // final newline, in `idem_check_names` (which the three procedures call) and in
    // `idem_claim`'s principal check. Migrations 5 and 9 install the same texts; this
    // moves an existing database on.
    Migration::new(
        10,
        "idem_procedures_cheaper",
        concat!(
            include_str!("../sql/idem_check_names.sql"),
            include_str!("../sql/idem_claim.sql"),
            include_str!("../sql/idem_finish.sql"),
        ),
    ),
];

const _: () = assert!(migrate::ascending(MIGRATIONS));

/// The statements of a MySQL script, one by one, as the mysql client cuts them: a
/// statement ends with the line that ends in the delimiter (`;` until a line
/// `DELIMITER x` switches it to `x`, for bodies holding `;`), whole-line `--` and `#`
/// comments aside; the delimiter is not part of the statement. Comment lines between
/// statements are left out.
pub fn split_statements(script: &'static str) -> Vec<&'static str> {
    let mut out = Vec::new();
    let mut delimiter = ";";
    let mut start: Option<usize> = None;
    let mut at = 0;
    for line in script.split_inclusive('\n') {
        let line_at = at;
        at += line.len();
        let text = line.trim();
        let comment = text.starts_with("--") || text.starts_with('#');
        if start.is_none() {
            if let Some(d) = delimiter_directive(text) {
                delimiter = d;
                continue;
            }
            if text.is_empty() || comment {
                continue;
            }
            start = Some(line_at);
        }
        if let Some(from) = start.filter(|_| !comment && text.ends_with(delimiter)) {
            let end = line_at + line.trim_end().len() - delimiter.len();
            out.push(script[from..end].trim());
            start = None;
        }
    }
    if let Some(from) = start {
        out.push(script[from..].trim());
    }
    out.retain(|s| !s.is_empty());
    out
}

/// The migration of `version`, for tests of what it installs.
#[cfg(test)]
pub(crate) fn migration(version: i64) -> &'static Migration {
    MIGRATIONS
        .iter()
        .find(|m| m.version == version)
        .expect("a released version")
}

/// The CREATE statements of migrations `versions`, each checked to follow a `DROP … IF
/// EXISTS` of the same trigger or procedure (so the migration runs again safely).
#[cfg(test)]
pub(crate) fn creates_after_drops(versions: &[i64]) -> Vec<&'static str> {
    let statements: Vec<_> = versions
        .iter()
        .flat_map(|v| split_statements(migration(*v).sql))
        .collect();
    assert_eq!(statements.len() % 2, 0, "a drop and a create each");
    statements
        .chunks(2)
        .map(|pair| {
            let (kind, name) = pair[0]
                .strip_prefix("DROP ")
                .and_then(|s| s.split_once(" IF EXISTS "))
                .expect("a drop first");
            let create = pair[1].trim_start();
            let object = format!("CREATE {kind} {name}");
            assert!(create.starts_with(&object), "{name}");
            // The name ends there, not as the prefix of a longer one.
            let next = create[object.len()..].chars().next();
            assert!(matches!(next, Some('(' | ' ' | '\n')), "{name}");
            create
        })
        .collect()
}

/// `x` of a `DELIMITER x` line.
fn delimiter_directive(line: &str) -> Option<&str> {
    let (word, rest) = line.split_once(char::is_whitespace)?;
    let rest = rest.trim();
    (word.eq_ignore_ascii_case("DELIMITER") && !rest.is_empty() && !rest.contains(' '))
        .then_some(rest)
}

/// The named server lock of the migrators of one database. The name is cut to 64
/// characters, MySQL's limit for lock names.
const LOCK: &str = "SELECT GET_LOCK(CONCAT('idem.migrate:', LEFT(SHA2(DATABASE(), 256), 40)), 60)";
const UNLOCK: &str =
    "SELECT RELEASE_LOCK(CONCAT('idem.migrate:', LEFT(SHA2(DATABASE(), 256), 40)))";

/// Applies the migrations that `idem_schema_migrations` does not list yet. Returns the
/// versions applied by this call (empty when the schema was current).
pub(crate) async fn run(conn: &mut PoolConnection<MySql>) -> Result<Vec<i64>, StoreError> {
    migrate::run(MysqlMigrator { conn }, MIGRATIONS).await
}

fn m(e: sqlx::Error) -> StoreError {
    map_err("migrate", e)
}

/// One session, outside any transaction, holding the migrators' named lock.
struct MysqlMigrator<'c> {
    conn: &'c mut PoolConnection<MySql>,
}

impl MigrationBackend for MysqlMigrator<'_> {
    type Error = StoreError;

    async fn lock(&mut self) -> Result<(), StoreError> {
        let got: Option<i64> = sqlx::query_scalar(LOCK)
            .fetch_one(&mut **self.conn)
            .await
            .map_err(m)?;
        if got != Some(1) {
            return Err(StoreError::Unavailable(
                "mysql migrate: another migrator held the lock for 60 s".into(),
            ));
        }
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS idem_schema_migrations (
                version    BIGINT       NOT NULL PRIMARY KEY,
                name       VARCHAR(128) NOT NULL,
                applied_at DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
            ) ENGINE = InnoDB",
        )
        .execute(&mut **self.conn)
        .await
        .map_err(m)?;
        Ok(())
    }

    async fn applied(&mut self) -> Result<Vec<i64>, StoreError> {
        sqlx::query_scalar("SELECT version FROM idem_schema_migrations")
            .fetch_all(&mut **self.conn)
            .await
            .map_err(m)
    }

    async fn apply(&mut self, migration: &Migration) -> Result<(), StoreError> {
        for statement in split_statements(migration.sql) {
            sqlx::raw_sql(statement)
                .execute(&mut **self.conn)
                .await
                .map_err(m)?;
        }
        Ok(())
    }

    async fn record(&mut self, migration: &Migration) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO idem_schema_migrations (version, name) VALUES (?, ?)")
            .bind(migration.version)
            .bind(migration.name)
            .execute(&mut **self.conn)
            .await
            .map_err(m)?;
        Ok(())
    }

    async fn unlock(self) -> Result<(), StoreError> {
        // The lock is the session's: give it back before the connection is reused.
        sqlx::query(UNLOCK)
            .execute(&mut **self.conn)
            .await
            .map_err(m)?;
        Ok(())
    }

    async fn abandon(self) {
        // A failed session may not run the unlock: closing it releases the lock.
        self.conn.close_on_drop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_are_cut_at_the_delimiter() {
        let script = "-- head; not a statement\n\
            CREATE TABLE IF NOT EXISTS a (\n  -- a comment;\n  x INT\n);\n\n\
            DROP TRIGGER IF EXISTS t;\n\
            DELIMITER //\n\
            CREATE TRIGGER t BEFORE UPDATE ON a FOR EACH ROW BEGIN\n  SET NEW.x = 1;\nEND //\n\
            delimiter ;\n\
            # last\n\
            DO 1";
        assert_eq!(
            split_statements(script),
            [
                "CREATE TABLE IF NOT EXISTS a (\n  -- a comment;\n  x INT\n)",
                "DROP TRIGGER IF EXISTS t",
                "CREATE TRIGGER t BEFORE UPDATE ON a FOR EACH ROW BEGIN\n  SET NEW.x = 1;\nEND",
                "DO 1",
            ]
        );
        assert!(split_statements("-- nothing to do here\n\n").is_empty());
    }

    #[test]
    fn every_statement_reruns_safely() {
        for mig in MIGRATIONS {
            let statements = split_statements(mig.sql);
            assert!(!statements.is_empty(), "{}", mig.name);
            for s in statements {
                let s = s.to_ascii_uppercase();
                // Each statement must be safe to run twice (no transaction holds DDL).
                assert!(
                    s.starts_with("CREATE TABLE IF NOT EXISTS")
                        || s.starts_with("DROP TRIGGER IF EXISTS")
                        || s.starts_with("CREATE TRIGGER")
                        || s.starts_with("DROP PROCEDURE IF EXISTS")
                        || s.starts_with("CREATE PROCEDURE"),
                    "{s}"
                );
                assert!(!s.contains("\nDELIMITER"), "{s}");
            }
        }
    }
}
