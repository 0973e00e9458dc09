//! Test harness: a real server bound to 127.0.0.1:0 on a real store — a temporary
//! SQLite file, a fresh PostgreSQL schema or a fresh MySQL/MariaDB database (both
//! `idem_orders_t_<uuid>`, dropped at the end) — and a real HTTP client.
#![allow(dead_code)] // each test binary uses a different part of this module

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use idem_orders::{ApiKey, ChainOptions, ServeConfig, Server, ServiceOptions};
use serde_json::Value;
use sqlx::{Connection, Executor, MySqlConnection, PgConnection};

pub const T1: &str = "t1-secret-key";
pub const T2: &str = "t2-secret-key";
pub const ADMIN: &str = "admin-secret-token";
pub const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
pub const DEFAULT_MYSQL_URL: &str = "mysql://root@127.0.0.1:3306/test";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
    Mysql,
}

pub fn pg_url() -> String {
    std::env::var("IDEM_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_PG_URL.to_string())
}

/// The MySQL/MariaDB server (any database on it: each test creates its own).
pub fn mysql_url() -> String {
    std::env::var("IDEM_TEST_MYSQL_URL").unwrap_or_else(|_| DEFAULT_MYSQL_URL.to_string())
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

/// A database for one test.
pub struct Env {
    pub backend: Backend,
    pub url: String,
    pub pg_schema: Option<String>,
    /// MySQL: the test's own database, created on the server at `mysql_server`.
    pub mysql_database: Option<String>,
    mysql_server: Option<String>,
    dir: Option<tempfile::TempDir>,
}

/// A database of `backend`; `None` (after `skip_or_fail`) when its server is unreachable.
pub async fn env(backend: Backend) -> Option<Env> {
    match backend {
        Backend::Sqlite => {
            let dir = tempfile::tempdir().expect("tempdir");
            Some(Env {
                backend,
                url: format!("sqlite://{}", dir.path().join("orders.db").display()),
                pg_schema: None,
                mysql_database: None,
                mysql_server: None,
                dir: Some(dir),
            })
        }
        Backend::Postgres => {
            let url = pg_url();
            match PgConnection::connect(&url).await {
                Ok(conn) => {
                    let _ = conn.close().await;
                }
                Err(err) => {
                    idem_conformance::skip_or_fail("PostgreSQL", &err);
                    return None;
                }
            }
            Some(Env {
                backend,
                url,
                pg_schema: Some(format!("idem_orders_t_{}", uuid::Uuid::now_v7().simple())),
                mysql_database: None,
                mysql_server: None,
                dir: None,
            })
        }
        Backend::Mysql => {
            let server = mysql_url();
            let mut conn = match MySqlConnection::connect(&server).await {
                Ok(conn) => conn,
                Err(err) => {
                    idem_conformance::skip_or_fail("MySQL/MariaDB", &err);
                    return None;
                }
            };
            let database = format!("idem_orders_t_{}", uuid::Uuid::now_v7().simple());
            conn.execute(sqlx::AssertSqlSafe(format!(
                "CREATE DATABASE `{database}` CHARACTER SET utf8mb4"
            )))
            .await
            .expect("create the test database");
            let _ = conn.close().await;
            Some(Env {
                backend,
                url: with_database(&server, &database),
                pg_schema: None,
                mysql_database: Some(database),
                mysql_server: Some(server),
                dir: None,
            })
        }
    }
}

impl Env {
    /// A server config: tenants t1 and t2, an admin token, a quick chain.
    pub fn config(&self) -> ServeConfig {
        ServeConfig {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            database_url: Some(self.url.clone()),
            api_keys: vec![
                format!("t1={T1}").parse::<ApiKey>().unwrap(),
                format!("t2={T2}").parse::<ApiKey>().unwrap(),
            ],
            admin_token: Some(ADMIN.into()),
            nats_url: None,
            tls: None,
            options: ServiceOptions {
                pg_schema: self.pg_schema.clone(),
                chain: ChainOptions {
                    poll_interval: Duration::from_millis(50),
                    freeze_recheck: Duration::from_millis(200),
                    retry_backoff: Duration::from_millis(50),
                    batch: 100,
                },
                // A freeze written straight to the database shows in /metrics quickly.
                metrics_refresh: Duration::from_millis(100),
                ..ServiceOptions::default()
            },
        }
    }

    pub async fn start(&self) -> TestServer {
        self.start_with(|_| {}).await
    }

    pub async fn start_with(&self, tweak: impl FnOnce(&mut ServeConfig)) -> TestServer {
        let mut config = self.config();
        tweak(&mut config);
        let server = idem_orders::bind(config).await.expect("server starts");
        TestServer {
            base: server.url(),
            server,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap(),
        }
    }

    /// The service's database on this test's store, opened (and migrated) anew.
    pub async fn database(&self) -> idem_orders::Database {
        idem_orders::Database::open(
            &self.url,
            idem_orders::DatabaseOptions {
                pg_schema: self.pg_schema.clone(),
                ..Default::default()
            },
        )
        .await
        .expect("open")
    }

    pub fn path(&self) -> Option<std::path::PathBuf> {
        self.dir.as_ref().map(|d| d.path().join("orders.db"))
    }
}

async fn drop_schema(url: &str, schema: &str) -> Result<(), sqlx::Error> {
    let mut conn = PgConnection::connect(url).await?;
    conn.execute("SET lock_timeout = '30s'").await?;
    conn.execute(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
    )))
    .await?;
    conn.close().await
}

async fn drop_database(server: &str, database: &str) -> Result<(), sqlx::Error> {
    let mut conn = MySqlConnection::connect(server).await?;
    // A dropped pool closes its sessions in the background, and a session still inside a
    // transaction holds metadata locks the DROP would wait on: end them first.
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

impl Drop for Env {
    fn drop(&mut self) {
        let url = self.url.clone();
        let schema = self.pg_schema.clone();
        let mysql = self.mysql_server.clone().zip(self.mysql_database.clone());
        if schema.is_none() && mysql.is_none() {
            return;
        }
        // Drop cannot await and may run inside a runtime: a thread with its own.
        let outcome = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async {
                if let Some(schema) = schema {
                    drop_schema(&url, &schema).await?;
                }
                if let Some((server, database)) = mysql {
                    drop_database(&server, &database).await?;
                }
                Ok::<_, sqlx::Error>(())
            })
            .map_err(|e| e.to_string())
        })
        .join()
        .unwrap_or_else(|_| Err("cleanup thread panicked".into()));
        if let Err(e) = outcome {
            eprintln!("could not drop the test's schema or database: {e}");
        }
    }
}

/// A running server and a client for it.
pub struct TestServer {
    pub server: Server,
    pub http: reqwest::Client,
    pub base: String,
}

/// A response, read whole.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub replayed: bool,
    pub content_type: String,
    pub body: Value,
    pub bytes: Vec<u8>,
}

impl Reply {
    pub fn order_id(&self) -> String {
        self.body["order_id"]
            .as_str()
            .unwrap_or_else(|| panic!("no order_id in {}: {}", self.status, self.body))
            .to_owned()
    }

    pub fn problem_type(&self) -> &str {
        self.body["type"].as_str().unwrap_or("")
    }
}

pub async fn read(response: reqwest::Response) -> Reply {
    let status = response.status().as_u16();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let bytes = response.bytes().await.expect("body").to_vec();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Reply {
        status,
        replayed,
        content_type,
        body,
        bytes,
    }
}

impl TestServer {
    pub async fn post(&self, path: &str, token: &str, key: Option<&str>, body: &Value) -> Reply {
        self.post_raw(path, token, key, serde_json::to_vec(body).unwrap())
            .await
    }

    pub async fn post_raw(
        &self,
        path: &str,
        token: &str,
        key: Option<&str>,
        body: Vec<u8>,
    ) -> Reply {
        let mut req = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(body);
        if let Some(k) = key {
            req = req.header("Idempotency-Key", k);
        }
        read(req.send().await.expect("request")).await
    }

    pub async fn get(&self, path: &str, token: &str) -> Reply {
        read(
            self.http
                .get(format!("{}{path}", self.base))
                .bearer_auth(token)
                .send()
                .await
                .expect("request"),
        )
        .await
    }

    pub async fn create(
        &self,
        token: &str,
        key: &str,
        user: &str,
        show: &str,
        quantity: i64,
    ) -> Reply {
        self.post(
            "/v1/orders",
            token,
            Some(key),
            &serde_json::json!({"user_id": user, "show_id": show, "quantity": quantity}),
        )
        .await
    }

    pub async fn order(&self, token: &str, order_id: &str) -> Value {
        let r = self.get(&format!("/v1/orders/{order_id}"), token).await;
        assert_eq!(r.status, 200, "GET order {order_id}: {}", r.body);
        r.body
    }

    /// Polls the order until `done` holds (or panics after `timeout`).
    pub async fn wait_order(
        &self,
        token: &str,
        order_id: &str,
        timeout: Duration,
        what: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let view = self.order(token, order_id).await;
            if done(&view) {
                return view;
            }
            if tokio::time::Instant::now() > deadline {
                panic!("timed out waiting for {what} on {order_id}: {view:#}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn get_admin(&self, path: &str) -> Value {
        let r = self.get(path, ADMIN).await;
        assert_eq!(r.status, 200, "GET {path}: {}", r.body);
        r.body
    }

    pub async fn admin(&self, path: &str, body: &Value) -> Reply {
        self.post(path, ADMIN, None, body).await
    }

    pub async fn metrics(&self) -> String {
        self.http
            .get(format!("{}/metrics", self.base))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    pub async fn shutdown(self) {
        self.server.shutdown().await.expect("clean shutdown");
    }
}

/// One store's test of scenario `$name` (inside the scenario's module).
macro_rules! store_test {
    ($name:ident, $test:ident, $backend:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $test() {
            if let Some(env) = $crate::common::env($crate::common::Backend::$backend).await {
                super::$name(env).await;
            }
        }
    };
}

/// Runs one scenario `async fn name(env: Env)` on SQLite, PostgreSQL and MySQL/MariaDB.
#[allow(unused_macros)] // binaries whose scenarios run on two stores only
macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                store_test!($name, sqlite, Sqlite);
                store_test!($name, postgres, Postgres);
                store_test!($name, mysql, Mysql);
            }
        )*
    };
}

/// Runs one scenario `async fn name(env: Env)` on SQLite and on PostgreSQL.
#[allow(unused_macros)] // binaries whose scenarios all run on every store
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                store_test!($name, sqlite, Sqlite);
                store_test!($name, postgres, Postgres);
            }
        )*
    };
}

/// Runs one scenario `async fn name(env: Env)` on PostgreSQL and MySQL/MariaDB (the
/// servers, with row locks).
#[allow(unused_macros)]
macro_rules! on_server_stores {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                store_test!($name, postgres, Postgres);
                store_test!($name, mysql, Mysql);
            }
        )*
    };
}
