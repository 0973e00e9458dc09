//! The ledgers' schema, as versioned migrations recorded in `orders_schema_migrations`,
//! run by `idem_sql::migrate` (which says how each backend locks and applies them).
//!
//! The DDL is shared by SQLite and PostgreSQL (`migrations/*.sql`: `BIGINT` and `TEXT`
//! columns, partial indexes, `CHECK`s); MySQL/MariaDB has its own form of each version
//! (`migrations/mysql/`), with the same numbers and names. Leases and fences are the
//! stores' own tables (`idem-sqlite`, `idem-postgres`, `idem-mysql`). Migrations are
//! append-only: a released version is never edited.
//!
//! Every ledger is append-or-update: rows are never deleted, and nothing in this schema
//! cascades a delete. The console's tables (migration 2) are not ledgers: expired
//! sessions are dropped, and the arrival timeline, first kept here, now lives in the
//! store's own tables (migration 4 carries it over).

use idem_sql::migrate::{self, Migration, Schema};

use super::SqlStore;
use crate::error::Error;

const SHARED: &[Migration] = &[
    Migration::new(
        1,
        "ledgers",
        include_str!("../../migrations/0001_ledgers.sql"),
    ),
    Migration::new(
        2,
        "console",
        include_str!("../../migrations/0002_console.sql"),
    ),
    Migration::new(
        3,
        "stock buckets, delivery claims",
        include_str!("../../migrations/0003_stock_buckets.sql"),
    ),
    Migration::new(
        4,
        "arrival timeline to the store",
        include_str!("../../migrations/0004_arrivals_to_store.sql"),
    ),
];

/// A MySQL database starts at the shape the others reach at version 4 (see the file):
/// versions 2 to 4 are recorded with nothing left to run.
const MYSQL: &[Migration] = &[
    Migration::new(
        1,
        "ledgers",
        include_str!("../../migrations/mysql/0001_ledgers.sql"),
    ),
    Migration::new(2, "console", ""),
    Migration::new(3, "stock buckets, delivery claims", ""),
    Migration::new(4, "arrival timeline to the store", ""),
];

const _: () = assert!(migrate::ascending(SHARED) && migrate::same_versions(SHARED, MYSQL));

fn schema(up_to: usize) -> Schema<'static> {
    Schema {
        versions: idem_sql::versions_table!("orders_schema_migrations"),
        lock: "idem-orders",
        shared: &SHARED[..up_to],
        mysql: &MYSQL[..up_to],
    }
}

/// The newest ledger schema version this build knows.
pub(super) fn newest() -> i64 {
    migrate::newest(SHARED)
}

/// Applies the pending versions. Concurrent migrators of one database take turns.
pub(super) async fn apply(store: &SqlStore) -> Result<(), Error> {
    migrate::run(store, &schema(SHARED.len())).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_sql::arrivals::key_arrivals;

    /// A service that kept the timeline in its own tables upgrades without losing it.
    #[tokio::test]
    async fn the_old_timeline_is_carried_to_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqlStore::open_sqlite_path(dir.path().join("o.db"))
            .await
            .unwrap();
        migrate::run(&store, &schema(3)).await.unwrap();
        let mut tx = store.begin().await.unwrap();
        tx.conn()
            .execute_script(
                "INSERT INTO arrival_keys VALUES ('t1', 'k1', 10, 20, 1, 7, 0, 0, 0, 8); \
                 INSERT INTO arrivals VALUES ('t1', 'k1', 1, 10, 'executed', 201, 5, 'p'); \
                 INSERT INTO arrivals VALUES ('t1', 'k1', 2, 20, 'replayed', 201, 1, 'p');",
            )
            .await
            .unwrap();
        tx.commit().await.unwrap();
        apply(&store).await.unwrap();
        let moved = key_arrivals(&store, "t1", "k1").await.unwrap().unwrap();
        assert_eq!(moved.summary(), "8 arrivals: 1 executed, 7 replayed");
        assert_eq!(moved.arrivals.len(), 2);
        assert!(!store.has_table("arrival_keys").await.unwrap());
        assert!(!store.has_table("arrivals").await.unwrap());
    }
}
