//! The lease conformance suite on PostgreSQL: a fresh schema per scenario (dropped with
//! the harness). The protected resource is a table in the same schema, written through
//! `PgStore::fenced_write`.

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use common::PgHarness;
use idem_conformance::lease::LeaseHarness;
use idem_core::{ClockShift, FencingToken, Lease, LeaseError, LeaseName, LeaseStore, OwnerId};
use idem_postgres::PgStore;
use sqlx::Executor;
use tokio::sync::OnceCell;

struct PgLeaseHarness {
    /// The handle the resource and the failover hook use; `open` gives fresh ones.
    /// Declared first so its pool goes before the schema is dropped.
    side: OnceCell<PgStore>,
    pg: PgHarness,
}

impl PgLeaseHarness {
    fn resource_table(&self) -> String {
        format!("\"{}\".protected_resource", self.pg.schema)
    }

    async fn side(&self) -> &PgStore {
        self.side
            .get_or_init(|| async {
                let store = self.pg.store().await;
                store
                    .pool()
                    .execute(
                        sqlx::AssertSqlSafe(format!(
                            "CREATE TABLE IF NOT EXISTS {} \
                             (resource text PRIMARY KEY, value text NOT NULL, token bigint NOT NULL)",
                            self.resource_table()
                        )),
                    )
                    .await
                    .expect("resource table");
                store
            })
            .await
    }
}

#[async_trait]
impl LeaseHarness for PgLeaseHarness {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        Arc::new(self.pg.store().await)
    }

    fn clock(&self) -> &ClockShift {
        &self.pg.clock
    }

    async fn lose_lease(&self, name: &LeaseName) {
        // The lease row only: the token counter commits with it (and cannot be deleted).
        let sql = format!(
            "DELETE FROM \"{}\".idem_leases WHERE name = $1",
            self.pg.schema
        );
        sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
            .bind(name.as_str())
            .execute(self.side().await.pool())
            .await
            .expect("delete lease row");
    }

    async fn fenced_write(
        &self,
        resource: &str,
        lease: &Lease,
        value: &str,
    ) -> Result<(), LeaseError> {
        let sql = format!(
            "INSERT INTO {} (resource, value, token) VALUES ($1, $2, $3) \
             ON CONFLICT (resource) DO UPDATE SET value = EXCLUDED.value, token = EXCLUDED.token",
            self.resource_table()
        );
        let (resource_owned, value, token) = (resource.to_owned(), value.to_owned(), lease.token);
        self.side()
            .await
            .fenced_write(resource, lease, move |tx| {
                Box::pin(async move {
                    sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                        .bind(resource_owned)
                        .bind(value)
                        .bind(token.get())
                        .execute(tx)
                        .await
                        .map_err(|e| LeaseError::Backend(e.to_string()))?;
                    Ok(())
                })
            })
            .await
    }

    async fn resource_value(&self, resource: &str) -> Option<String> {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT value FROM {} WHERE resource = $1",
            self.resource_table()
        )))
        .bind(resource)
        .fetch_optional(self.side().await.pool())
        .await
        .expect("read resource")
    }
}

async fn harness() -> Option<PgLeaseHarness> {
    Some(PgLeaseHarness {
        side: OnceCell::new(),
        pg: common::harness().await?,
    })
}

idem_conformance::lease_tests!(harness());

fn lease(name: &LeaseName, owner: &str, token: i64) -> Lease {
    Lease {
        name: name.clone(),
        owner: OwnerId::new(owner).unwrap(),
        token: FencingToken::new(token),
        acquired_at: 0,
        expires_at: 0,
        renewals: 0,
    }
}

/// The counter is the schema's invariant, not only the code's: it can be neither
/// deleted, truncated nor lowered by hand.
#[tokio::test]
async fn token_counter_cannot_go_back() {
    let Some(h) = harness().await else { return };
    let store = h.open().await;
    let name = idem_conformance::lease::fresh_name("guard");
    let a = store
        .try_acquire(
            &name,
            &OwnerId::new("A").unwrap(),
            std::time::Duration::from_secs(3),
        )
        .await
        .unwrap()
        .granted()
        .unwrap();
    let mut admin = h.pg.admin().await;
    for sql in [
        "DELETE FROM idem_lease_tokens WHERE name = $1",
        "UPDATE idem_lease_tokens SET last_token = last_token - 1 WHERE name = $1",
        "TRUNCATE idem_lease_tokens",
    ] {
        let err = sqlx::query(sql)
            .bind(name.as_str())
            .execute(&mut admin)
            .await
            .expect_err(sql);
        assert!(
            err.to_string().contains("idem_lease_tokens"),
            "{sql}: {err}"
        );
    }
    assert_eq!(store.show(&name).await.unwrap().last_token, Some(a.token));
    // The lease row carries the last token too: it cannot be lowered or truncated, and
    // deleting it leaves its token in the counter.
    for sql in [
        "UPDATE idem_leases SET token = token - 1 WHERE name = $1",
        "TRUNCATE idem_leases",
    ] {
        let err = sqlx::query(sql)
            .bind(name.as_str())
            .execute(&mut admin)
            .await
            .expect_err(sql);
        assert!(err.to_string().contains("idem_leases"), "{sql}: {err}");
    }
    // Deleted from a session whose search_path does not hold the store's schema: the
    // token still lands in this schema's counter.
    admin.execute("SET search_path TO public").await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DELETE FROM \"{}\".idem_leases WHERE name = $1",
        h.pg.schema
    )))
    .bind(name.as_str())
    .execute(&mut admin)
    .await
    .unwrap();
    admin
        .execute(sqlx::AssertSqlSafe(format!(
            "SET search_path TO \"{}\"",
            h.pg.schema
        )))
        .await
        .unwrap();
    let b = store
        .try_acquire(
            &name,
            &OwnerId::new("B").unwrap(),
            std::time::Duration::from_secs(3),
        )
        .await
        .unwrap()
        .granted()
        .unwrap();
    assert!(b.token > a.token, "{b:?} after {a:?}");

    // An idem older than migration 8 would grant over an ended row without clearing
    // ended_at: refused, not a second live lease.
    store
        .release(&name, &OwnerId::new("B").unwrap(), b.token)
        .await
        .unwrap();
    let err = sqlx::query(
        "UPDATE idem_leases SET owner = 'C', token = token + 1, expires_at = expires_at + 1 \
         WHERE name = $1",
    )
    .bind(name.as_str())
    .execute(&mut admin)
    .await
    .expect_err("an old build's grant");
    assert!(err.to_string().contains("schema version 8"), "{err}");
    // A row put back by hand cannot start below the counter.
    sqlx::query("DELETE FROM idem_leases WHERE name = $1")
        .bind(name.as_str())
        .execute(&mut admin)
        .await
        .unwrap();
    let err = sqlx::query(
        "INSERT INTO idem_leases (name, owner, token, acquired_at, expires_at, renewals, ended_at) \
         VALUES ($1, 'A', $2, 0, 0, 0, 0)",
    )
    .bind(name.as_str())
    .bind(a.token.get())
    .execute(&mut admin)
    .await
    .expect_err("a row below the counter");
    assert!(err.to_string().contains("below its counter"), "{err}");
}

/// Migration 8 on a schema that already holds leases: a live lease carries over and
/// holds, a released name's next token is above its counter, and the one-statement
/// grant and release continue from there.
#[tokio::test]
async fn kept_rows_migration_carries_leases_over() {
    let Some(h) = harness().await else { return };
    let store = h.pg.store().await;
    let mut admin = h.pg.admin().await;
    // Back to version 7 (the harness migrated an empty schema), with its data: a name
    // released at token 5 (counter only), a live lease with token 7, a name whose
    // counter was only ever locked (0).
    admin
        .execute(
            "DROP VIEW idem_lease_events; \
             ALTER TABLE idem_leases DROP COLUMN release_after, DROP COLUMN prev_owner, \
               DROP COLUMN prev_token, DROP COLUMN prev_acquired_at, \
               DROP COLUMN prev_expires_at, DROP COLUMN prev_ended_at, \
               DROP COLUMN prev_release_after; \
             ALTER TABLE idem_lease_event_rows DROP COLUMN released_after, \
               DROP COLUMN released_owner, DROP COLUMN released_token, \
               DROP COLUMN released_acquired_at, DROP COLUMN released_expires_at, \
               DROP COLUMN released_at; \
             ALTER TABLE idem_lease_event_rows RENAME TO idem_lease_events; \
             ALTER INDEX idem_lease_event_rows_name_idx RENAME TO idem_lease_events_name_idx; \
             ALTER INDEX idem_lease_event_rows_at_idx RENAME TO idem_lease_events_at_idx; \
             DELETE FROM idem_schema_migrations WHERE version = 9; \
             DROP TRIGGER idem_leases_no_truncate ON idem_leases; \
             DROP TRIGGER idem_leases_keep_token ON idem_leases; \
             DROP TRIGGER idem_leases_token_guard ON idem_leases; \
             DROP TRIGGER idem_leases_insert_guard ON idem_leases; \
             DROP FUNCTION idem_leases_keep_token(); \
             ALTER TABLE idem_leases DROP COLUMN ended_at; \
             DELETE FROM idem_schema_migrations WHERE version = 8; \
             INSERT INTO idem_lease_tokens (name, last_token) \
               VALUES ('old', 5), ('live', 7), ('locked', 0); \
             INSERT INTO idem_leases (name, owner, token, acquired_at, expires_at, renewals) \
               VALUES ('live', 'holder', 7, 1000, 253402300799000, 2);",
        )
        .await
        .unwrap();
    assert_eq!(store.migrate().await.unwrap(), vec![8, 9]);

    let n = |s: &str| LeaseName::new(s).unwrap();
    let o = |s: &str| OwnerId::new(s).unwrap();
    let ttl = std::time::Duration::from_secs(30);
    assert_eq!(
        store.show(&n("old")).await.unwrap().last_token,
        Some(FencingToken::new(5))
    );
    let old = store.try_acquire(&n("old"), &o("a"), ttl).await.unwrap();
    assert_eq!(old.granted().map(|l| l.token.get()), Some(6));

    let held = store.try_acquire(&n("live"), &o("b"), ttl).await.unwrap();
    assert!(
        matches!(&held, idem_core::Acquire::Held { holder, .. } if holder.token.get() == 7 && holder.renewals == 2),
        "{held:?}"
    );
    let released = store
        .release(&n("live"), &o("holder"), FencingToken::new(7))
        .await
        .unwrap();
    assert!(
        matches!(released, idem_core::Release::Released { .. }),
        "{released:?}"
    );
    let live = store.try_acquire(&n("live"), &o("b"), ttl).await.unwrap();
    assert_eq!(live.granted().map(|l| l.token.get()), Some(8));

    let locked = store.try_acquire(&n("locked"), &o("c"), ttl).await.unwrap();
    assert_eq!(locked.granted().map(|l| l.token.get()), Some(1));
}

/// `fence_in_tx` fences inside the caller's transaction: the fence commits (or rolls
/// back) with the caller's write, and an older token is refused with evidence.
#[tokio::test]
async fn fence_in_callers_transaction() {
    let Some(h) = harness().await else { return };
    let store = h.side().await.clone();
    let name = idem_conformance::lease::fresh_name("in-tx");
    let resource = format!("res-{name}");

    // Token 5 passes but the caller rolls back: the fence forgets it.
    let mut tx = store.pool().begin().await.unwrap();
    store
        .fence_in_tx(&mut tx, &resource, &lease(&name, "A", 5))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let mut tx = store.pool().begin().await.unwrap();
    store
        .fence_in_tx(&mut tx, &resource, &lease(&name, "B", 3))
        .await
        .expect("token 5 was rolled back with its transaction");
    tx.commit().await.unwrap();

    let mut tx = store.pool().begin().await.unwrap();
    let err = store
        .fence_in_tx(&mut tx, &resource, &lease(&name, "A", 2))
        .await
        .unwrap_err();
    assert_eq!(
        err.fenced().map(|f| f.last_accepted),
        Some(FencingToken::new(3))
    );
    tx.rollback().await.unwrap();
    let events = store.events(&name, 10).await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].token, Some(FencingToken::new(2)));
    assert!(events[0].detail.as_deref().unwrap().contains(&resource));

    let err = store
        .fenced_write::<(), LeaseError, _>("", &lease(&name, "A", 9), |_| {
            Box::pin(async { Ok(()) })
        })
        .await
        .unwrap_err();
    assert_eq!(err.kind(), idem_core::ErrorKind::InvalidInput);
}

/// Migrating twice applies the lease tables once.
#[tokio::test]
async fn lease_migration_is_version_2() {
    let Some(h) = harness().await else { return };
    let store = h.pg.store().await;
    assert!(store.migrate().await.unwrap().is_empty());
    let mut admin = h.pg.admin().await;
    let name: String =
        sqlx::query_scalar("SELECT name FROM idem_schema_migrations WHERE version = 2")
            .fetch_one(&mut admin)
            .await
            .unwrap();
    assert_eq!(name, "idem_leases");
}

/// Migration 9: the holder's release is one update of the lease row; the next grant
/// carries it into its `acquired` row, and the evidence reads the same either way: each
/// release once, in order, with its owner and token.
#[tokio::test]
async fn a_release_recorded_in_place_reads_as_its_own_event() {
    let Some(h) = harness().await else { return };
    let store = h.pg.store().await;
    let mut admin = h.pg.admin().await;
    let name = LeaseName::new(format!("in-place-{}", uuid::Uuid::new_v4().simple())).unwrap();
    let o = |s: &str| OwnerId::new(s).unwrap();
    let ttl = std::time::Duration::from_secs(30);
    let a = store.try_acquire(&name, &o("a"), ttl).await.unwrap();
    let a = a.granted().unwrap().clone();
    store.release(&name, &o("a"), a.token).await.unwrap();
    let stored: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idem_lease_event_rows WHERE name = $1")
            .bind(name.as_str())
            .fetch_one(&mut admin)
            .await
            .unwrap();
    assert_eq!(stored, 1, "the release wrote no event row");
    let kinds = |events: &[idem_core::LeaseEvent]| {
        events
            .iter()
            .map(|e| {
                (
                    e.kind,
                    e.owner.as_ref().map(|o| o.as_str().to_owned()),
                    e.token,
                )
            })
            .collect::<Vec<_>>()
    };
    let released = (
        idem_core::LeaseEventKind::Released,
        Some("a".to_owned()),
        Some(a.token),
    );
    let events = store.events(&name, 10).await.unwrap();
    assert_eq!(kinds(&events)[1], released, "{events:?}");
    let b = store.try_acquire(&name, &o("b"), ttl).await.unwrap();
    let b = b.granted().unwrap().clone();
    let events = store.events(&name, 10).await.unwrap();
    assert_eq!(events.len(), 3, "{events:?}");
    assert_eq!(
        kinds(&events)[1],
        released,
        "still once, before the next grant"
    );
    assert_eq!(kinds(&events)[2].2, Some(b.token));
    let on_row: Option<i64> =
        sqlx::query_scalar("SELECT release_after FROM idem_leases WHERE name = $1")
            .bind(name.as_str())
            .fetch_one(&mut admin)
            .await
            .unwrap();
    assert_eq!(on_row, None, "moved into the grant's row");
}
