//! Shared test setup: a stand-in upstream, gateway configs, Redis prefixes that clean up
//! after themselves, and a private redis-server that a test may kill.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idem_core::TenantId;
use idem_gateway::{ApiKeyEntry, GatewayConfig, KeyRule, RouteConfig};
use idem_stub::Stub;

pub const T1_KEY: &str = "api-key-tenant-1";
pub const T2_KEY: &str = "api-key-tenant-2";

pub fn redis_url() -> String {
    std::env::var("IDEM_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string())
}

pub async fn stub() -> Stub {
    Stub::start("x-idem-tenant").await.expect("stub upstream")
}

/// A gateway config in front of `upstream`: keys required on `POST /v1/*`, optional on
/// `PUT /opt/*`, two tenants, short timeouts.
pub fn config(upstream: &str) -> GatewayConfig {
    let mut c = GatewayConfig::new("127.0.0.1:0".parse().unwrap(), upstream);
    c.routes = vec![
        RouteConfig {
            methods: vec!["POST".into()],
            path: "/v1/search".into(),
            key: KeyRule::Ignored,
        },
        RouteConfig {
            methods: vec!["POST".into(), "PATCH".into()],
            path: "/v1/*".into(),
            key: KeyRule::Required,
        },
        RouteConfig {
            methods: vec!["PUT".into()],
            path: "/opt/*".into(),
            key: KeyRule::Optional,
        },
    ];
    c.auth.api_keys.insert(
        T1_KEY.into(),
        ApiKeyEntry::Tenant(TenantId::new("tenant-1").unwrap()),
    );
    c.auth.api_keys.insert(
        T2_KEY.into(),
        ApiKeyEntry::Tenant(TenantId::new("tenant-2").unwrap()),
    );
    c.upstream_timeout_ms = 5_000;
    c.max_wait_ms = 20_000;
    c
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(512)
        .build()
        .unwrap()
}

pub fn fresh(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::now_v7().simple())
}

/// A keyed order request through the gateway.
pub fn order(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    body: &str,
) -> reqwest::RequestBuilder {
    client
        .post(format!("{base}/v1/orders"))
        .header("x-api-key", T1_KEY)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(body.to_string())
}

/// Reads a problem+json response: (status, type URI).
pub async fn problem(resp: reqwest::Response) -> (u16, String) {
    let status = resp.status().as_u16();
    assert_eq!(
        resp.headers()["content-type"],
        "application/problem+json",
        "status {status}"
    );
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["status"], status);
    (status, v["type"].as_str().unwrap().to_string())
}

pub fn problem_type(slug: &str) -> String {
    format!("https://idem.dev/problems/{slug}")
}

/// A key prefix of one test in a Redis server, deleted when dropped.
pub struct RedisPrefix {
    pub url: String,
    pub prefix: String,
}

impl RedisPrefix {
    /// `None` (after the visible skip, or a panic with IDEM_REQUIRE_SERVICES=1) when the
    /// shared Redis is unreachable.
    pub async fn new() -> Option<Self> {
        let url = redis_url();
        let reach = async {
            let client = redis::Client::open(url.as_str())?;
            let mut conn = client.get_multiplexed_async_connection().await?;
            redis::cmd("PING").query_async::<String>(&mut conn).await
        };
        match tokio::time::timeout(Duration::from_secs(3), reach).await {
            Ok(Ok(_)) => Some(Self {
                url,
                prefix: fresh("idem-gw-test"),
            }),
            Ok(Err(e)) => {
                idem_conformance::skip_or_fail("Redis", &e);
                None
            }
            Err(_) => {
                idem_conformance::skip_or_fail("Redis", &"connection timed out");
                None
            }
        }
    }

    pub fn apply(&self, c: &mut GatewayConfig) {
        c.redis_url = Some(self.url.clone());
        c.redis_prefix = self.prefix.clone();
    }
}

impl Drop for RedisPrefix {
    fn drop(&mut self) {
        let url = self.url.clone();
        let pattern = format!("{}:*", self.prefix);
        let _ = std::thread::spawn(move || purge(&url, &pattern)).join();
    }
}

fn purge(url: &str, pattern: &str) -> redis::RedisResult<()> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_connection_with_timeout(Duration::from_secs(3))?;
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query(&mut conn)?;
        if !batch.is_empty() {
            redis::cmd("UNLINK").arg(&batch).query::<i64>(&mut conn)?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// A redis-server of this test's own, on a free port, that the test may stop.
pub struct PrivateRedis {
    pub port: u16,
    child: Option<Child>,
}

impl PrivateRedis {
    /// `None` (after the visible skip) when `redis-server` cannot be started.
    pub async fn start() -> Option<Self> {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) => {
                idem_conformance::skip_or_fail("redis-server binary", &e);
                return None;
            }
        };
        let me = Self {
            port,
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let ok = async {
                let client = redis::Client::open(me.url().as_str())?;
                let mut conn = client.get_multiplexed_async_connection().await?;
                redis::cmd("PING").query_async::<String>(&mut conn).await
            }
            .await
            .is_ok();
            if ok {
                return Some(me);
            }
            if Instant::now() > deadline {
                idem_conformance::skip_or_fail("redis-server", &"did not start within 10 s");
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn addr_url(addr: SocketAddr) -> String {
    format!("http://{addr}")
}
