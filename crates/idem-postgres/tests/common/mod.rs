//! Test harness: every harness owns a fresh schema on the shared server and drops it
//! (`DROP SCHEMA … CASCADE`) when it is dropped.
#![allow(dead_code)] // each test binary uses a different part of this module

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_conformance::Harness;
use idem_core::{ClockShift, IdempotencyStore, StoreLimits};
use idem_postgres::{PgOptions, PgStore};
use sqlx::{Connection, Executor, PgConnection};

pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
/// Small enough that the "too large" scenario stays cheap.
pub const MAX_RESULT_BYTES: usize = 64 * 1024;

pub fn url() -> String {
    std::env::var("IDEM_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_URL.to_string())
}

pub struct PgHarness {
    pub url: String,
    pub schema: String,
    pub clock: ClockShift,
    /// Unique per harness, so a fault test kills only its own sessions.
    pub application_name: String,
}

impl PgHarness {
    pub fn options(&self) -> PgOptions {
        let mut o = PgOptions::default();
        o.schema = Some(self.schema.clone());
        o.limits = StoreLimits::with_max_result_bytes(MAX_RESULT_BYTES);
        o.clock = self.clock.clone();
        o.max_connections = 10;
        o.acquire_timeout = Duration::from_secs(10);
        o.application_name = self.application_name.clone();
        o.fresh_fast_path = false;
        o.lock_timeout = None;
        o.idle_in_transaction_timeout = None;
        o
    }

    pub async fn store(&self) -> PgStore {
        self.store_with(self.options()).await
    }

    pub async fn store_with(&self, options: PgOptions) -> PgStore {
        PgStore::connect(&self.url, options)
            .await
            .expect("connect to the test server")
    }

    /// A plain connection in this harness's schema (not part of any store's pool).
    pub async fn admin(&self) -> PgConnection {
        let mut conn = PgConnection::connect(&self.url)
            .await
            .expect("admin connect");
        conn.execute(sqlx::AssertSqlSafe(format!(
            "SET search_path TO \"{}\"",
            self.schema
        )))
        .await
        .expect("set search_path");
        conn
    }
}

/// A harness on a new, migrated schema; `None` (after `skip_or_fail`) when the server is
/// unreachable.
pub async fn harness() -> Option<PgHarness> {
    let h = unmigrated().await?;
    h.store().await.migrate().await.expect("migrate");
    Some(h)
}

/// A harness whose schema does not exist yet (migrate creates it).
pub async fn unmigrated() -> Option<PgHarness> {
    let url = url();
    // Probe first so an absent server is a visible skip, not a panic.
    match PgConnection::connect(&url).await {
        Ok(conn) => {
            let _ = conn.close().await;
        }
        Err(err) => {
            idem_conformance::skip_or_fail("PostgreSQL", &err);
            return None;
        }
    }
    let id = uuid::Uuid::now_v7().simple().to_string();
    Some(PgHarness {
        url,
        schema: format!("idem_t_{id}"),
        clock: ClockShift::new(),
        application_name: format!("idem-test-{id}"),
    })
}

#[async_trait]
impl Harness for PgHarness {
    async fn open(&self) -> Arc<dyn IdempotencyStore> {
        Arc::new(self.store().await)
    }

    fn clock(&self) -> &ClockShift {
        &self.clock
    }

    fn max_result_bytes(&self) -> usize {
        MAX_RESULT_BYTES
    }
}

async fn drop_schema(url: &str, schema: &str) -> Result<(), sqlx::Error> {
    let mut conn = PgConnection::connect(url).await?;
    // A session of a dropped pool may still be closing; wait for its locks, not forever.
    conn.execute("SET lock_timeout = '30s'").await?;
    conn.execute(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
    )))
    .await?;
    conn.close().await
}

impl Drop for PgHarness {
    fn drop(&mut self) {
        let url = self.url.clone();
        let schema = self.schema.clone();
        // Drop cannot await and may run inside a runtime: use a thread with its own.
        let outcome = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(drop_schema(&url, &schema))
                .map_err(|e| e.to_string())
        })
        .join()
        .unwrap_or_else(|_| Err("cleanup thread panicked".into()));
        if let Err(e) = outcome {
            if std::thread::panicking() {
                eprintln!("could not drop schema {}: {e}", self.schema);
            } else {
                panic!("could not drop schema {}: {e}", self.schema);
            }
        }
    }
}
