//! Wake-ups for duplicates that wait on another gateway instance's execution.
//!
//! Within one process duplicates share one in-flight execution directly (see
//! the keyed flow); this module covers the remaining case: the key is PROCESSING in the
//! shared window under another instance. The waiter subscribes to the key's Redis
//! channel *before* re-reading the record, then sleeps until a message arrives or the
//! record's lease deadline passes — never on a fixed polling interval. The executing
//! instance publishes on the channel after it finished the record.
//!
//! One Redis pub/sub connection per gateway, driven by one dispatcher task that owns the
//! subscriptions (reference-counted per channel) and reconnects with backoff. While it is
//! disconnected, subscriptions are refused and waiters fall back to their lease deadline.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use idem_core::Scope;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::{mpsc, oneshot, watch};

use crate::lazy::Lazy;

type Channels = Arc<Mutex<HashMap<String, (watch::Sender<u64>, usize)>>>;

enum Cmd {
    Subscribe(String, oneshot::Sender<bool>),
    Unsubscribe(String),
}

/// Wake-up notifications, local (none needed) or through Redis.
#[derive(Clone)]
pub struct Wakeups {
    redis: Option<Arc<RedisWakeups>>,
}

struct RedisWakeups {
    client: redis::Client,
    prefix: String,
    channels: Channels,
    cmds: mpsc::UnboundedSender<Cmd>,
    publisher: Lazy<ConnectionManager>,
    timeout: Duration,
}

impl Wakeups {
    /// No cross-instance wake-ups: a single instance's duplicates share its in-flight
    /// execution directly.
    pub fn local() -> Self {
        Self { redis: None }
    }

    /// Wake-ups through Redis pub/sub on `<prefix>:w:<tenant>:<key>` channels.
    pub fn redis(client: redis::Client, prefix: &str, timeout: Duration) -> Self {
        let channels: Channels = Arc::default();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(dispatch(client.clone(), channels.clone(), rx, timeout));
        Self {
            redis: Some(Arc::new(RedisWakeups {
                client,
                prefix: prefix.to_string(),
                channels,
                cmds: tx,
                publisher: Lazy::new(),
                timeout,
            })),
        }
    }

    /// Starts listening for the end of `scope`'s execution. Call before re-reading the
    /// record, so a completion between the read and the wait is not missed.
    pub async fn subscribe(&self, scope: &Scope) -> Subscription {
        let Some(r) = &self.redis else {
            return Subscription::none();
        };
        let channel = channel(&r.prefix, scope);
        let rx = {
            let mut map = r.channels.lock().unwrap_or_else(|p| p.into_inner());
            let entry = map
                .entry(channel.clone())
                .or_insert_with(|| (watch::channel(0).0, 0));
            entry.1 += 1;
            entry.0.subscribe()
        };
        let guard = SubscriptionGuard {
            channel: channel.clone(),
            redis: r.clone(),
        };
        let (ack_tx, ack_rx) = oneshot::channel();
        let confirmed = r.cmds.send(Cmd::Subscribe(channel, ack_tx)).is_ok()
            && matches!(tokio::time::timeout(r.timeout, ack_rx).await, Ok(Ok(true)));
        Subscription {
            rx: Some(rx),
            confirmed,
            _guard: Some(guard),
        }
    }

    /// Wakes every instance waiting on `scope`. Best effort: a lost message costs the
    /// waiters their lease deadline, never a duplicate execution.
    pub async fn publish(&self, scope: &Scope) {
        let Some(r) = &self.redis else { return };
        let channel = channel(&r.prefix, scope);
        let client = r.client.clone();
        let timeout = r.timeout;
        let conn = r
            .publisher
            .get(|| async move {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout))
                    .set_number_of_retries(0);
                tokio::time::timeout(timeout, ConnectionManager::new_with_config(client, config))
                    .await
                    .map_err(|_| "connect timed out".to_string())?
                    .map_err(|e| e.to_string())
            })
            .await;
        let mut conn = match conn {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "wake-up publisher unavailable");
                return;
            }
        };
        let res = redis::cmd("PUBLISH")
            .arg(&channel)
            .arg("done")
            .query_async::<i64>(&mut conn)
            .await;
        if let Err(e) = res {
            tracing::debug!(error = %e, %channel, "wake-up publish failed");
        }
    }
}

/// The Redis channel of a scope. Tenant and key are encoded as in the record key, so the
/// `:` separator is unambiguous.
fn channel(prefix: &str, scope: &Scope) -> String {
    format!(
        "{prefix}:w:{}:{}",
        idem_redis::encode_component(scope.tenant.as_str()),
        idem_redis::encode_component(scope.key.as_str())
    )
}

/// A waiter's subscription; unsubscribes when dropped.
pub struct Subscription {
    rx: Option<watch::Receiver<u64>>,
    confirmed: bool,
    _guard: Option<SubscriptionGuard>,
}

impl Subscription {
    fn none() -> Self {
        Self {
            rx: None,
            confirmed: false,
            _guard: None,
        }
    }

    /// Whether Redis confirmed the subscription (otherwise only the deadline wakes).
    pub fn is_confirmed(&self) -> bool {
        self.confirmed
    }

    /// Resolves at the next wake-up; never, without a subscription.
    pub async fn changed(&mut self) {
        match &mut self.rx {
            Some(rx) => {
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending::<()>().await,
        }
    }
}

struct SubscriptionGuard {
    channel: String,
    redis: Arc<RedisWakeups>,
}

impl Drop for SubscriptionGuard {
    fn drop(&mut self) {
        let mut map = self
            .redis
            .channels
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = map.get_mut(&self.channel) {
            entry.1 -= 1;
            if entry.1 == 0 {
                map.remove(&self.channel);
                let _ = self.redis.cmds.send(Cmd::Unsubscribe(self.channel.clone()));
            }
        }
    }
}

fn wake_all(channels: &Channels) {
    let map = channels.lock().unwrap_or_else(|p| p.into_inner());
    for (tx, _) in map.values() {
        tx.send_modify(|v| *v = v.wrapping_add(1));
    }
}

/// Owns the pub/sub connection: applies (un)subscriptions in order, routes messages to
/// waiters, reconnects with backoff. Ends when the gateway drops its [`Wakeups`].
async fn dispatch(
    client: redis::Client,
    channels: Channels,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    timeout: Duration,
) {
    const MIN_BACKOFF: Duration = Duration::from_millis(100);
    const MAX_BACKOFF: Duration = Duration::from_secs(2);
    let mut backoff = MIN_BACKOFF;
    loop {
        if let Ok(Ok(pubsub)) = tokio::time::timeout(timeout, client.get_async_pubsub()).await {
            let (mut sink, mut stream) = pubsub.split();
            let mut subscribed: HashSet<String> = HashSet::new();
            let wanted: Vec<String> = {
                let map = channels.lock().unwrap_or_else(|p| p.into_inner());
                map.keys().cloned().collect()
            };
            let resubscribed = wanted.is_empty()
                || matches!(
                    tokio::time::timeout(timeout, sink.subscribe(&wanted)).await,
                    Ok(Ok(()))
                );
            if resubscribed {
                backoff = MIN_BACKOFF;
                subscribed.extend(wanted);
                tracing::debug!("wake-up subscriber connected");
                // A completion may have been published while we were away.
                wake_all(&channels);
                loop {
                    tokio::select! {
                        cmd = cmds.recv() => match cmd {
                            None => return,
                            Some(Cmd::Subscribe(ch, ack)) => {
                                let wanted = channels
                                    .lock()
                                    .unwrap_or_else(|p| p.into_inner())
                                    .contains_key(&ch);
                                if !wanted || subscribed.contains(&ch) {
                                    let _ = ack.send(wanted);
                                    continue;
                                }
                                match tokio::time::timeout(timeout, sink.subscribe(&ch)).await {
                                    Ok(Ok(())) => {
                                        subscribed.insert(ch);
                                        let _ = ack.send(true);
                                    }
                                    _ => {
                                        let _ = ack.send(false);
                                        break;
                                    }
                                }
                            }
                            Some(Cmd::Unsubscribe(ch)) => {
                                let still_wanted = channels
                                    .lock()
                                    .unwrap_or_else(|p| p.into_inner())
                                    .contains_key(&ch);
                                if !still_wanted && subscribed.remove(&ch) {
                                    let res = tokio::time::timeout(timeout, sink.unsubscribe(&ch)).await;
                                    if !matches!(res, Ok(Ok(()))) {
                                        break;
                                    }
                                }
                            }
                        },
                        msg = stream.next() => match msg {
                            Some(msg) => {
                                let map = channels.lock().unwrap_or_else(|p| p.into_inner());
                                if let Some((tx, _)) = map.get(msg.get_channel_name()) {
                                    tx.send_modify(|v| *v = v.wrapping_add(1));
                                }
                            }
                            None => break,
                        },
                    }
                }
                tracing::warn!(
                    "wake-up subscriber disconnected; waiters fall back to lease deadlines"
                );
                wake_all(&channels);
            }
        }
        // Disconnected: refuse subscriptions until the next attempt.
        let retry_at = tokio::time::Instant::now() + backoff;
        backoff = (backoff * 2).min(MAX_BACKOFF);
        loop {
            tokio::select! {
                cmd = cmds.recv() => match cmd {
                    None => return,
                    Some(Cmd::Subscribe(_, ack)) => { let _ = ack.send(false); }
                    Some(Cmd::Unsubscribe(_)) => {}
                },
                _ = tokio::time::sleep_until(retry_at) => break,
            }
        }
    }
}
/// The pipeline's view: a waiter on another instance's execution of a key.
#[async_trait::async_trait]
impl idem_http::pipeline::Wakeups for Wakeups {
    async fn subscribe(&self, scope: &Scope) -> Box<dyn idem_http::pipeline::Waiter> {
        Box::new(Wakeups::subscribe(self, scope).await)
    }

    async fn publish(&self, scope: &Scope) {
        Wakeups::publish(self, scope).await
    }
}

#[async_trait::async_trait]
impl idem_http::pipeline::Waiter for Subscription {
    async fn woken(&mut self) {
        self.changed().await
    }
}
