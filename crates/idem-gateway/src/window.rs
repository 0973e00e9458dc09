//! The short window: where completed responses are kept for a few minutes and where
//! concurrent executions of one key are serialised across gateway instances.
//!
//! It is an [`IdempotencyStore`]: [`MemoryStore`] for one instance, [`RedisStore`] when
//! instances share Redis (records carry the in-flight marker with its lease, and the
//! result), plus [`Wakeups`] for waiters on another instance's execution.
//!
//! Redis is connected lazily and re-connected on demand: the gateway starts and keeps
//! forwarding while Redis is unreachable. Every store call reports reachability here;
//! the transition into and out of degraded mode is logged once and exposed as the
//! `idem_gateway_degraded` gauge.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{
    Claim, ClaimRequest, ClaimToken, Finish, IdempotencyStore, Millis, Record, Scope, StoreError,
    StoreLimits,
};
use idem_redis::{RedisOptions, RedisStore};

use crate::config::GatewayConfig;
use crate::error::GatewayError;
use crate::lazy::Lazy;
use crate::memory::{MemoryOptions, MemoryStore};
use crate::metrics::GatewayMetrics;
use crate::wakeup::Wakeups;

/// Header and reference slack on top of the stored body limit.
const RESULT_OVERHEAD: usize = 64 * 1024;

/// The largest result the window a gateway with `config` opens takes: the stored body
/// limit plus header and reference slack.
pub fn result_limit(config: &GatewayConfig) -> usize {
    config.max_stored_bytes + RESULT_OVERHEAD
}

pub struct Window {
    store: Arc<dyn IdempotencyStore>,
    /// The same store when it is Redis (for whether its server answered last).
    redis: Option<Arc<LazyRedisStore>>,
    /// The same store when it is the in-memory one (for its fill level).
    memory: Option<MemoryStore>,
    wakeups: Wakeups,
    shared: bool,
    metrics: Arc<GatewayMetrics>,
}

impl Window {
    pub fn from_config(
        config: &GatewayConfig,
        instance: &str,
        metrics: Arc<GatewayMetrics>,
    ) -> Result<Self, GatewayError> {
        let limits = StoreLimits::with_max_result_bytes(result_limit(config));
        match &config.redis_url {
            None => {
                let memory = MemoryStore::new(MemoryOptions {
                    window: config.window(),
                    limits,
                    max_bytes: config.memory_window_bytes,
                    partition_bytes: config.partition_window_bytes(),
                    ..MemoryOptions::default()
                });
                Ok(Self {
                    store: Arc::new(memory.clone()),
                    redis: None,
                    memory: Some(memory),
                    wakeups: Wakeups::local(),
                    shared: false,
                    metrics,
                })
            }
            Some(url) => {
                let client =
                    idem_redis::pubsub_client(url.as_str(), config.redis_ca_file.as_deref())
                        .map_err(|e| GatewayError::Config(format!("redis_url: {e}")))?;
                let client_name: String = format!("idem-gw-{instance}")
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || "-_.:".contains(c) {
                            c
                        } else {
                            '_'
                        }
                    })
                    .collect();
                let options = {
                    let mut o = RedisOptions::default();
                    o.prefix = config.redis_prefix.clone();
                    o.retention = config.window();
                    o.limits = limits;
                    o.connect_timeout = config.redis_timeout();
                    o.response_timeout = config.redis_timeout();
                    o.client_name = Some(client_name);
                    o.ca_file = config.redis_ca_file.clone();
                    o
                };
                let redis = Arc::new(LazyRedisStore {
                    url: url.clone(),
                    options,
                    store: Lazy::new(),
                });
                Ok(Self {
                    store: redis.clone(),
                    redis: Some(redis),
                    memory: None,
                    wakeups: Wakeups::redis(client, &config.redis_prefix, config.redis_timeout()),
                    shared: true,
                    metrics,
                })
            }
        }
    }

    /// Whether the window is shared between instances (Redis).
    pub fn is_shared(&self) -> bool {
        self.shared
    }

    /// Whether the in-memory window refuses new keys right now (never for Redis).
    pub fn is_full(&self) -> bool {
        self.memory.as_ref().is_some_and(MemoryStore::is_full)
    }

    fn note<T>(&self, res: &Result<T, StoreError>) {
        if !self.shared {
            return;
        }
        match res {
            // Any failure of the shared window forwards without it: count it degraded.
            Err(e) if e.is_unavailable() || e.kind() == idem_core::ErrorKind::Backend => {
                if !self.metrics.set_degraded(true) {
                    tracing::warn!(error = %e, "short window failing: degraded mode, keys are still forwarded and the upstream guards them");
                }
            }
            // A replay Redis's store answered from its in-process copy proves nothing
            // about the server: only an answer while it is reachable ends the mode.
            _ if !self.redis_reachable() => {}
            _ => {
                if self.metrics.set_degraded(false) {
                    tracing::info!("short window reachable again: degraded mode over");
                }
            }
        }
    }

    fn redis_reachable(&self) -> bool {
        self.redis
            .as_ref()
            .and_then(|r| r.store.peek())
            .is_some_and(|s| s.is_reachable())
    }

    /// Wake-ups for waiters on another instance's execution (none without Redis:
    /// in-process duplicates share the flight).
    pub fn wakeups(&self) -> &Wakeups {
        &self.wakeups
    }
}

/// The window as the pipeline's store: every call reports reachability.
#[async_trait]
impl IdempotencyStore for Window {
    fn backend(&self) -> &'static str {
        self.store.backend()
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        let res = self.store.claim(req).await;
        self.note(&res);
        res
    }

    async fn finish(&self, token: &ClaimToken, finish: Finish) -> Result<Record, StoreError> {
        let res = self.store.finish(token, finish).await;
        self.note(&res);
        res
    }

    async fn finish_quiet(&self, token: &ClaimToken, finish: Finish) -> Result<(), StoreError> {
        let res = self.store.finish_quiet(token, finish).await;
        self.note(&res);
        res
    }

    async fn extend_lease(
        &self,
        token: &ClaimToken,
        lease: Duration,
    ) -> Result<Millis, StoreError> {
        let res = self.store.extend_lease(token, lease).await;
        self.note(&res);
        res
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        let res = self.store.get(scope).await;
        self.note(&res);
        res
    }

    async fn abandon(&self, token: &ClaimToken) -> Result<(), StoreError> {
        let res = self.store.abandon(token).await;
        self.note(&res);
        res
    }

    async fn unique_guard(&self) -> Result<bool, StoreError> {
        self.store.unique_guard().await
    }
}

/// A [`RedisStore`] connected on first use; calls fail fast with `Unavailable` while no
/// connection can be made (one attempt a second).
struct LazyRedisStore {
    url: String,
    options: RedisOptions,
    store: Lazy<RedisStore>,
}

impl LazyRedisStore {
    async fn connected(&self) -> Result<RedisStore, StoreError> {
        let url = self.url.clone();
        let options = self.options.clone();
        self.store
            .get(|| async move {
                RedisStore::connect(&url, options)
                    .await
                    .map_err(|e| e.to_string())
            })
            .await
            .map_err(StoreError::Unavailable)
    }
}

#[async_trait]
impl IdempotencyStore for LazyRedisStore {
    fn backend(&self) -> &'static str {
        "redis"
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        self.connected().await?.claim(req).await
    }

    async fn finish(&self, token: &ClaimToken, finish: Finish) -> Result<Record, StoreError> {
        self.connected().await?.finish(token, finish).await
    }

    async fn finish_quiet(&self, token: &ClaimToken, finish: Finish) -> Result<(), StoreError> {
        self.connected().await?.finish_quiet(token, finish).await
    }

    async fn extend_lease(
        &self,
        token: &ClaimToken,
        lease: Duration,
    ) -> Result<Millis, StoreError> {
        self.connected().await?.extend_lease(token, lease).await
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        self.connected().await?.get(scope).await
    }

    async fn abandon(&self, token: &ClaimToken) -> Result<(), StoreError> {
        self.connected().await?.abandon(token).await
    }

    async fn unique_guard(&self) -> Result<bool, StoreError> {
        self.connected().await?.unique_guard().await
    }
}
