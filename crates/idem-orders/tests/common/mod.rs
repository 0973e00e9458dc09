//! Test harness: a real server bound to 127.0.0.1:0 on a real store — a temporary
//! SQLite file, or a fresh PostgreSQL schema `idem_orders_t_<uuid>` dropped at the end —
//! and a real HTTP client.
#![allow(dead_code)] // each test binary uses a different part of this module

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use idem_orders::{ApiKey, ChainOptions, ServeConfig, Server, ServiceOptions};
use serde_json::Value;
use sqlx::{Connection, Executor, PgConnection};

pub const T1: &str = "t1-secret-key";
pub const T2: &str = "t2-secret-key";
pub const ADMIN: &str = "admin-secret-token";
pub const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

pub fn pg_url() -> String {
    std::env::var("IDEM_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_PG_URL.to_string())
}

/// A database for one test.
pub struct Env {
    pub backend: Backend,
    pub url: String,
    pub pg_schema: Option<String>,
    dir: Option<tempfile::TempDir>,
}

/// A database of `backend`; `None` (after `skip_or_fail`) when PostgreSQL is unreachable.
pub async fn env(backend: Backend) -> Option<Env> {
    match backend {
        Backend::Sqlite => {
            let dir = tempfile::tempdir().expect("tempdir");
            Some(Env {
                backend,
                url: format!("sqlite://{}", dir.path().join("orders.db").display()),
                pg_schema: None,
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

impl Drop for Env {
    fn drop(&mut self) {
        let Some(schema) = self.pg_schema.clone() else {
            return;
        };
        let url = self.url.clone();
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
            eprintln!("could not drop schema: {e}");
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

/// Runs one scenario `async fn name(env: Env)` on SQLite and on PostgreSQL.
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn sqlite() {
                    if let Some(env) = $crate::common::env($crate::common::Backend::Sqlite).await {
                        super::$name(env).await;
                    }
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn postgres() {
                    if let Some(env) = $crate::common::env($crate::common::Backend::Postgres).await {
                        super::$name(env).await;
                    }
                }
            }
        )*
    };
}
