//! idem gateway: a reverse proxy that requires idempotency keys, coalesces duplicates,
//! keeps completed responses for a short window, and never mints a key.
//!
//! It is the first of idem's two layers: it absorbs short bursts of duplicates
//! (double clicks, client retries, concurrent resends) in front of any HTTP service. The
//! business service behind it stays the source of truth; the gateway passes every key
//! through unchanged and, when it cannot know an outcome, asks that service instead of
//! guessing.
//!
//! | a request on a keyed route | gets |
//! |---|---|
//! | no credential (no API key; without API keys, none of the credential headers, blank values counting as none) | 401, unless anonymous access is configured |
//! | a `Connection` header naming the key, a credential or a fingerprinted header | 400 |
//! | a keyed JSON body naming a member twice | 400 |
//! | no `Idempotency-Key` | 400 |
//! | a key while the same key (same request) is in flight, here or on another instance | waits, then the same response with `Idempotent-Replayed: true` |
//! | the same key with a different payload | 422 at once |
//! | a key whose response is in the window | the stored response, replayed |
//! | a new key | one upstream call; its response is kept for the window |
//! | a new key while the in-memory window is full | 503 + `Retry-After` (when the earliest entry expires); health reports degraded |
//! | a new key while this caller's share of the window, or of keys in progress, is used up | 429 + `Retry-After` |
//! | a keyed body while the budget for buffered bodies is used up | 503 + `Retry-After` |
//! | a new key the upstream answers 401/403/407/511 | that answer; nothing of it stays in the window |
//! | an upstream timeout after sending | the upstream's key state, asked again while it reports the key in progress: the stored response, 409 + `Retry-After` once the wait runs out, or a bounded re-send with the same key |
//!
//! Results are kept per caller: with API keys, per key's tenant and principal; without,
//! per keyed hash (HMAC-SHA-256, a per-deployment secret) of the caller's credential
//! headers (`Authorization`, `Cookie`), so nobody is replayed another caller's answer.
//! Per-caller response headers (`Set-Cookie` and a configured list) reach only the caller
//! whose request executed; 401/403/407/511 answers are never kept, so the key stays free.
//! Problem details say what happened in stable words plus a `request_id` (also in
//! `X-Request-Id`); the cause (addresses, OS errors) goes to the log under that id.
//!
//! Routes without a key rule stream through untouched. With `redis_url` the window, the
//! in-flight markers (with leases) and the wake-ups (pub/sub) live in Redis and many
//! instances share them; if Redis is unreachable the gateway keeps forwarding with the
//! key and reports degraded mode.
//!
//! With `upstreams` one gateway fronts several copies of the service on one database:
//! each request goes to the healthy one with the fewest requests in flight; one that
//! fails `upstream_health.consecutive_failures` times in a row (no answer — a 5xx is an
//! answer) gets nothing new for `upstream_health.eject_ms`; with all of them ejected the
//! gateway still forwards, to the one back first (see [`upstreams`]). A keyed request
//! that was never sent goes to the next one; after an uncertain result the state query
//! and the re-send go to another healthy one, which shares the key's record.
//!
//! # What the upstream gets and must provide
//!
//! - `Idempotency-Key` exactly as the client sent it; the gateway never creates one.
//! - The authenticated tenant in `x-idem-tenant` and principal in `x-idem-principal`
//!   (names configurable). Client-sent copies are removed, so the upstream may trust them
//!   from the gateway; `upstream_token` adds `x-idem-gateway-token` to prove the sender.
//!   Without API keys both carry the caller's partition (`caller-…`, a keyed hash of its
//!   credential): they tell callers apart but authenticate nobody — the upstream checks
//!   the forwarded credential itself.
//! - Write routes that honour `Idempotency-Key`: after an uncertain result the gateway
//!   re-sends the same request with the same key once the key-state endpoint has an
//!   answer, and takes the upstream's own verdict (replay or 422).
//! - Hop-by-hop fields removed (RFC 9110 §7.6.1), `Host` set to the upstream,
//!   `X-Forwarded-For` / `X-Forwarded-Host` set, the API key removed. Client-sent
//!   `X-Forwarded-*`, `Forwarded` and `X-Real-IP` are kept (`X-Forwarded-For` extended)
//!   only from peers listed in `trusted_proxies`; from anyone else the upstream sees the
//!   peer address alone.
//! - The caller's own credential headers, unchanged (they are the upstream's to
//!   check), and `X-Request-Id`.
//! - For uncertain results, a key state endpoint (default
//!   `GET /v1/idempotency-keys/{key}`, same identity headers and the caller's forwarded
//!   credential, so it authenticates as the original caller) answering JSON such as
//!   `{"state": "SUCCEEDED", "response": {"status": 201, "headers": [["content-type",
//!   "application/json"]], "body": "…"}}`, `{"state": "PROCESSING"}` or (200 or 404)
//!   `{"state": "ABSENT"}`; see [`upstream::parse_key_state`]. A 404 without a state is
//!   treated as "unknown", never as "absent", so a missing endpoint cannot cause a re-send.
//!
//! # Embedding (the CLI does this)
//!
//! `run(config, shutdown)` serves until the shutdown future resolves; [`start`] serves in
//! the background. Two sends of one key reach the upstream once:
//!
//! ```
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let upstream = idem_stub::Stub::start("x-idem-tenant").await?;
//! let config = idem_gateway::GatewayConfig {
//!     listen: "127.0.0.1:0".parse()?,
//!     upstream: upstream.url(), // the business service behind the gateway
//!     ..Default::default()
//! };
//! let gateway = idem_gateway::start(config).await?;
//! let client = reqwest::Client::new();
//! let send = || {
//!     client
//!         .post(format!("{}/v1/orders", gateway.url()))
//!         .header("authorization", "Bearer alice") // tells callers apart
//!         .header("idempotency-key", "order-7318")
//!         .body(r#"{"show":"S-204"}"#)
//!         .send()
//! };
//! let first = send().await?;
//! let again = send().await?;
//! assert_eq!(again.headers()["idempotent-replayed"], "true");
//! assert_eq!(first.status(), again.status());
//! assert_eq!(upstream.state.total_calls(), 1);
//! gateway.stop().await?;
//! # Ok(()) }
//! ```
//!
//! Modules: [`config`] (the JSON file), [`routes`], [`auth`], [`memory`] (the in-process
//! window store), [`window`], [`wakeup`], [`upstream`] (client, state query),
//! [`upstreams`] (choosing one per request, passive health), [`problem`],
//! [`metrics`]. The benchmark is in `idem-bench`; the business-service stand-in the
//! tests and the bench run against is `idem-stub`.

pub mod auth;
pub mod body;
mod buffers;
pub mod config;
mod ctx;
pub mod error;
mod flights;
mod forward;
pub mod forwarded;
mod h1;
pub mod hop;
mod keyed;
mod lazy;
pub mod memory;
pub mod metrics;
mod outbound;
mod pool;
pub mod problem;
pub mod routes;
mod service;
pub mod upstream;
pub mod upstreams;
pub mod wakeup;
pub mod window;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::TokioTimer;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use config::{ApiKeyEntry, AuthConfig, GatewayConfig, RouteConfig, StateQueryConfig};
pub use ctx::GATEWAY_TOKEN;
pub use error::GatewayError;
pub use memory::{MemoryOptions, MemoryStore};
pub use metrics::GatewayMetrics;
pub use problem::{Problem, ProblemKind};
pub use routes::KeyRule;

/// How long executions cut off at the end of the grace get to record their end.
const CUT_OFF_GRACE: Duration = Duration::from_secs(2);

/// Serves until `shutdown` resolves, then drains open connections (bounded by
/// [`GatewayConfig::shutdown_grace_ms`]); keyed executions still running past it end
/// as retryable in the window.
pub async fn run(
    config: GatewayConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), GatewayError> {
    let (_, handle) = bind(config, shutdown).await?;
    handle
        .await
        .map_err(|e| GatewayError::Io(std::io::Error::other(e)))?
}

/// Binds the listener (port 0 picks a free one) and serves in a task until `shutdown`
/// resolves. Returns the bound address and the serving task.
pub async fn bind(
    config: GatewayConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, JoinHandle<Result<(), GatewayError>>), GatewayError> {
    let (addr, _, handle) = start_with(config, shutdown).await?;
    Ok((addr, handle))
}

/// A gateway serving in the background: its address and counters, stopped by
/// [`RunningGateway::stop`] (or when dropped).
pub struct RunningGateway {
    pub addr: SocketAddr,
    https: bool,
    metrics: Arc<GatewayMetrics>,
    stop: Option<oneshot::Sender<()>>,
    handle: JoinHandle<Result<(), GatewayError>>,
}

impl RunningGateway {
    /// `http://<addr>`, or `https://` when it serves TLS.
    pub fn url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    pub fn metrics(&self) -> &GatewayMetrics {
        &self.metrics
    }

    /// The counters, for holding after the gateway is stopped or moved.
    pub fn shared_metrics(&self) -> Arc<GatewayMetrics> {
        self.metrics.clone()
    }

    /// Stops accepting, drains connections, and returns how serving ended.
    pub async fn stop(mut self) -> Result<(), GatewayError> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        (&mut self.handle)
            .await
            .map_err(|e| GatewayError::Io(std::io::Error::other(e)))?
    }
}

impl Drop for RunningGateway {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// Starts a gateway in the background (tests, the bench).
pub async fn start(config: GatewayConfig) -> Result<RunningGateway, GatewayError> {
    let (tx, rx) = oneshot::channel::<()>();
    let https = config.tls_cert_file.is_some();
    let (addr, metrics, handle) = start_with(config, async move {
        let _ = rx.await;
    })
    .await?;
    Ok(RunningGateway {
        addr,
        https,
        metrics,
        stop: Some(tx),
        handle,
    })
}

type Started = (
    SocketAddr,
    Arc<GatewayMetrics>,
    JoinHandle<Result<(), GatewayError>>,
);

async fn start_with(
    config: GatewayConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Started, GatewayError> {
    let listen = config.listen;
    let tls =
        idem_net::tls::CertFiles::pair(config.tls_cert_file.clone(), config.tls_key_file.clone())
            .map_err(GatewayError::Config)?
            .map(|files| files.listener(config.header_read_timeout()))
            .transpose()
            .map_err(|e| GatewayError::Config(format!("TLS: {e}")))?;
    let ctx = Arc::new(ctx::Ctx::new(config)?);
    for header in ctx.auth.ignored_upstream_credentials() {
        tracing::warn!(header = %header, "auth.credential_headers leaves out {header}, which the upstream authenticates callers by: two callers that differ only in it share stored results; add it to auth.credential_headers");
    }
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|source| GatewayError::Bind {
            addr: listen,
            source,
        })?;
    let addr = listener.local_addr()?;
    let upstreams = ctx.upstreams.labels().collect::<Vec<_>>().join(", ");
    tracing::info!(%addr, https = tls.is_some(), %upstreams, window = idem_core::IdempotencyStore::backend(&ctx.window), instance = %ctx.instance, "idem gateway listening");
    let metrics = ctx.metrics.clone();
    let handle = tokio::spawn(serve(listener, tls, ctx, shutdown));
    Ok((addr, metrics, handle))
}

/// Waits until no keyed execution is in flight, or `until`.
async fn flights_ended(ctx: &ctx::Ctx, until: tokio::time::Instant) -> bool {
    while !ctx.flights.is_empty() {
        if tokio::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

async fn serve(
    listener: TcpListener,
    tls: Option<idem_net::serve::ListenerTls>,
    ctx: Arc<ctx::Ctx>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), GatewayError> {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(ctx.config.header_read_timeout())
        .keep_alive(true)
        .writev(false);
    let graceful = idem_net::serve::accept_until(
        listener,
        &http,
        tls,
        |peer| {
            let ctx = ctx.clone();
            let peer_info = Arc::new(outbound::Peer::new(peer));
            service_fn(move |req| service::serve(ctx.clone(), peer_info.clone(), req))
        },
        shutdown,
    )
    .await;
    ctx.draining
        .store(true, std::sync::atomic::Ordering::Relaxed);
    tracing::info!("idem gateway shutting down");
    // Connections drain, and so do flights whose callers already hung up (they run
    // in tasks of their own): both within the grace.
    let until = tokio::time::Instant::now() + ctx.config.shutdown_grace();
    let drained = graceful.shutdown();
    tokio::pin!(drained);
    let connections_done = tokio::time::timeout_at(until, &mut drained).await.is_ok();
    let flights_done = flights_ended(&ctx, until).await;
    if !(connections_done && flights_done) {
        tracing::warn!(
            in_flight = ctx.flights.len(),
            "requests still running after the shutdown grace period; ending them as retryable"
        );
        // Executions record their end and their callers get an answer; then the
        // connections close. Recording takes up to two window round trips.
        ctx.executions.cancel();
        let bound = CUT_OFF_GRACE.max(2 * ctx.config.redis_timeout());
        let until = tokio::time::Instant::now() + bound;
        if !flights_ended(&ctx, until).await {
            tracing::warn!(
                in_flight = ctx.flights.len(),
                "executions still running after the cut-off"
            );
        }
        if !connections_done && tokio::time::timeout_at(until, &mut drained).await.is_err() {
            tracing::warn!("connections still open after the cut-off; closing");
        }
    }
    Ok(())
}
