//! Test harness: every harness owns a freshly created database (`idem_t_<uuid>`) on the
//! shared server and drops it when the harness is dropped.
#![allow(dead_code)] // each test binary uses a different part of this module

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_conformance::Harness;
use idem_core::{ClockShift, IdempotencyStore, StoreLimits};
use idem_mysql::{MysqlOptions, MysqlStore};
use sqlx::{Connection, Executor, MySqlConnection};

pub const DEFAULT_URL: &str = "mysql://root@127.0.0.1:3306/test";
/// Small enough that the "too large" scenario stays cheap.
pub const MAX_RESULT_BYTES: usize = 64 * 1024;

/// The server's URL (any database on it: each harness creates its own).
pub fn url() -> String {
    std::env::var("IDEM_TEST_MYSQL_URL").unwrap_or_else(|_| DEFAULT_URL.to_string())
}

/// `url` with its database replaced by `database`.
pub fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let after_scheme = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[after_scheme..]
        .find('/')
        .map_or(base.len(), |i| after_scheme + i);
    let mut out = format!("{}/{database}", &base[..host_end]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

pub struct MyHarness {
    /// The URL of this harness's own database.
    pub url: String,
    pub server_url: String,
    pub database: String,
    pub clock: ClockShift,
}

impl MyHarness {
    pub fn options(&self) -> MysqlOptions {
        {
            let mut o = MysqlOptions::default();
            o.limits = StoreLimits::with_max_result_bytes(MAX_RESULT_BYTES);
            o.clock = self.clock.clone();
            o.max_connections = 16;
            o.acquire_timeout = Duration::from_secs(20);
            o
        }
    }

    pub async fn store(&self) -> MysqlStore {
        self.store_with(self.options()).await
    }

    pub async fn store_with(&self, options: MysqlOptions) -> MysqlStore {
        MysqlStore::connect(&self.url, options)
            .await
            .expect("connect to the test server")
    }

    /// A plain connection to this harness's database (not part of any store's pool).
    pub async fn admin(&self) -> MySqlConnection {
        MySqlConnection::connect(&self.url)
            .await
            .expect("admin connect")
    }
}

/// A harness on a new, migrated database; `None` (after `skip_or_fail`) when the server
/// is unreachable.
pub async fn harness() -> Option<MyHarness> {
    let h = unmigrated().await?;
    h.store().await.migrate().await.expect("migrate");
    Some(h)
}

/// A harness whose database exists but holds no tables yet.
pub async fn unmigrated() -> Option<MyHarness> {
    let server_url = url();
    // Probe first so an absent server is a visible skip, not a panic.
    let mut conn = match MySqlConnection::connect(&server_url).await {
        Ok(conn) => conn,
        Err(err) => {
            idem_conformance::skip_or_fail("MySQL/MariaDB", &err);
            return None;
        }
    };
    let database = format!("idem_t_{}", uuid::Uuid::now_v7().simple());
    conn.execute(sqlx::AssertSqlSafe(format!(
        "CREATE DATABASE `{database}` CHARACTER SET utf8mb4"
    )))
    .await
    .expect("create the test database");
    let _ = conn.close().await;
    Some(MyHarness {
        url: with_database(&server_url, &database),
        server_url,
        database,
        clock: ClockShift::new(),
    })
}

#[async_trait]
impl Harness for MyHarness {
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

async fn drop_database(url: &str, database: &str) -> Result<(), sqlx::Error> {
    let mut conn = MySqlConnection::connect(url).await?;
    // A dropped pool closes its sessions in the background, and a session that was
    // returned inside a transaction still holds metadata locks the DROP would wait on
    // forever: end every session of this database first.
    let sessions: Vec<i64> =
        sqlx::query_scalar("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = ?")
            .bind(database)
            .fetch_all(&mut conn)
            .await?;
    for id in sessions {
        // Gone already is fine.
        let _ = conn
            .execute(sqlx::AssertSqlSafe(format!("KILL {id}")))
            .await;
    }
    conn.execute(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS `{database}`"
    )))
    .await?;
    conn.close().await
}

impl Drop for MyHarness {
    fn drop(&mut self) {
        let url = self.server_url.clone();
        let database = self.database.clone();
        // Drop cannot await and may run inside a runtime: use a thread with its own.
        let outcome = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(drop_database(&url, &database))
                .map_err(|e| e.to_string())
        })
        .join()
        .unwrap_or_else(|_| Err("cleanup thread panicked".into()));
        if let Err(e) = outcome {
            if std::thread::panicking() {
                eprintln!("could not drop database {}: {e}", self.database);
            } else {
                panic!("could not drop database {}: {e}", self.database);
            }
        }
    }
}

#[test]
fn database_replaced_in_urls() {
    assert_eq!(
        with_database("mysql://root@127.0.0.1:3306/test", "x"),
        "mysql://root@127.0.0.1:3306/x"
    );
    assert_eq!(
        with_database("mysql://u:p@h/test?ssl-mode=REQUIRED", "x"),
        "mysql://u:p@h/x?ssl-mode=REQUIRED"
    );
    assert_eq!(with_database("mysql://h", "x"), "mysql://h/x");
}
