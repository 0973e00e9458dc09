//! The lease conformance suite on the embedded store: a temporary file per scenario.
//! The protected resource is a table in the same file, written through `fenced_write`.

use std::sync::Arc;

use async_trait::async_trait;
use idem_conformance::lease::LeaseHarness;
use idem_core::{ClockShift, Lease, LeaseError, LeaseName, LeaseStore};
use idem_sqlite::{SqliteOptions, SqliteStore};
use tokio::sync::OnceCell;

struct SqliteLeaseHarness {
    dir: tempfile::TempDir,
    clock: ClockShift,
    /// The handle the resource and the failover hook use; `open` gives fresh ones.
    side: OnceCell<SqliteStore>,
}

impl SqliteLeaseHarness {
    async fn connect(&self) -> SqliteStore {
        let mut opts = SqliteOptions::new(self.dir.path().join("idem.db"));
        opts.clock = self.clock.clone();
        SqliteStore::open(opts).await.expect("open sqlite")
    }

    async fn side(&self) -> &SqliteStore {
        self.side
            .get_or_init(|| async {
                let store = self.connect().await;
                sqlx::query(
                    "CREATE TABLE IF NOT EXISTS protected_resource \
                     (resource TEXT PRIMARY KEY, value TEXT NOT NULL, token INTEGER NOT NULL)",
                )
                .execute(store.pool())
                .await
                .expect("resource table");
                store
            })
            .await
    }
}

#[async_trait]
impl LeaseHarness for SqliteLeaseHarness {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        Arc::new(self.connect().await)
    }

    fn clock(&self) -> &ClockShift {
        &self.clock
    }

    async fn lose_lease(&self, name: &LeaseName) {
        // The lease row only: the token counter commits with it and survives.
        sqlx::query("DELETE FROM idem_leases WHERE name = ?")
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
        let (resource_owned, value, token) = (resource.to_owned(), value.to_owned(), lease.token);
        self.side()
            .await
            .fenced_write(resource, lease, move |tx| {
                Box::pin(async move {
                    sqlx::query(
                        "INSERT INTO protected_resource (resource, value, token) VALUES (?, ?, ?) \
                         ON CONFLICT (resource) DO UPDATE SET value = excluded.value, \
                           token = excluded.token",
                    )
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
        sqlx::query_scalar("SELECT value FROM protected_resource WHERE resource = ?")
            .bind(resource)
            .fetch_optional(self.side().await.pool())
            .await
            .expect("read resource")
    }
}

async fn harness() -> Option<SqliteLeaseHarness> {
    Some(SqliteLeaseHarness {
        dir: tempfile::tempdir().expect("tempdir"),
        clock: ClockShift::new(),
        side: OnceCell::new(),
    })
}

idem_conformance::lease_tests!(harness());
