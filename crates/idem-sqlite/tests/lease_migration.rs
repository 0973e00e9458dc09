//! Migration 4 on a file that already holds leases: the rebuilt event log keeps every
//! event in order, the counter and a live lease carry over, and the one-statement grant
//! and release continue the same history.

use std::time::Duration;

use idem_core::{Acquire, FencingToken, LeaseEventKind, LeaseName, LeaseStore, OwnerId, Release};
use idem_sqlite::{SqliteOptions, SqliteStore, MIGRATIONS};
use sqlx::sqlite::SqlitePoolOptions;
use sqlx::Executor;

#[tokio::test]
async fn lease_history_survives_migration_4() {
    let dir = tempfile::tempdir().unwrap();
    let opts = SqliteOptions::new(dir.path().join("idem.db"));
    {
        // The file as the previous release left it: migrations 1-3, a released lease
        // (token 1) and a live one on another name (token 7).
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(opts.connect_options())
            .await
            .unwrap();
        pool.execute(
            "CREATE TABLE idem_schema_migrations (version INTEGER PRIMARY KEY, \
             applied_at INTEGER NOT NULL DEFAULT 0)",
        )
        .await
        .unwrap();
        for m in MIGRATIONS.iter().filter(|m| m.version <= 3) {
            pool.execute(m.sql).await.unwrap();
            sqlx::query("INSERT INTO idem_schema_migrations (version) VALUES (?)")
                .bind(m.version)
                .execute(&pool)
                .await
                .unwrap();
        }
        pool.execute(
            "INSERT INTO idem_lease_tokens (name, last_token) VALUES ('old', 1), ('live', 7); \
             INSERT INTO idem_leases (name, owner, token, acquired_at, expires_at, renewals) \
               VALUES ('live', 'holder', 7, 1000, 253402300799000, 2); \
             INSERT INTO idem_lease_events (name, kind, at, owner, token, acquired_at, expires_at) \
               VALUES ('old', 'acquired', 10, 'a', 1, 10, 40), \
                      ('old', 'released', 20, 'a', 1, 10, 40), \
                      ('live', 'acquired', 1000, 'holder', 7, 1000, 253402300799000);",
        )
        .await
        .unwrap();
        pool.close().await;
    }

    let store = SqliteStore::open(opts).await.unwrap();
    let old = LeaseName::new("old").unwrap();
    let live = LeaseName::new("live").unwrap();
    let kinds = |events: Vec<idem_core::LeaseEvent>| -> Vec<(LeaseEventKind, Option<i64>)> {
        events
            .into_iter()
            .map(|e| (e.kind, e.token.map(FencingToken::get)))
            .collect()
    };
    assert_eq!(
        kinds(store.events(&old, 10).await.unwrap()),
        vec![
            (LeaseEventKind::Acquired, Some(1)),
            (LeaseEventKind::Released, Some(1)),
        ]
    );

    // The live lease still holds; the old name's next token continues its counter.
    let owner = OwnerId::new("newcomer").unwrap();
    match store
        .try_acquire(&live, &owner, Duration::from_secs(30))
        .await
        .unwrap()
    {
        Acquire::Held { holder, .. } => {
            assert_eq!(holder.token, FencingToken::new(7));
            assert_eq!(holder.renewals, 2);
        }
        other => panic!("live lease lost in the migration: {other:?}"),
    }
    let lease = match store
        .try_acquire(&old, &owner, Duration::from_secs(30))
        .await
        .unwrap()
    {
        Acquire::Granted(lease) => lease,
        other => panic!("free name not granted: {other:?}"),
    };
    assert_eq!(lease.token, FencingToken::new(2));
    let released = store.release(&old, &owner, lease.token).await.unwrap();
    assert!(matches!(released, Release::Released { .. }), "{released:?}");
    assert_eq!(
        kinds(store.events(&old, 10).await.unwrap()),
        vec![
            (LeaseEventKind::Acquired, Some(1)),
            (LeaseEventKind::Released, Some(1)),
            (LeaseEventKind::Acquired, Some(2)),
            (LeaseEventKind::Released, Some(2)),
        ]
    );
    assert_eq!(
        store.show(&old).await.unwrap().last_token,
        Some(FencingToken::new(2))
    );
}
