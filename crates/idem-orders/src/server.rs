//! Putting the service together and running it: `idem serve`.
//!
//! [`App::build`] opens the database (embedded SQLite by default, PostgreSQL with a
//! `postgres://` URL), seeds the catalogue for every tenant, builds the idempotency
//! layer, the metrics registry, the router and the chain. [`bind`] also listens and
//! starts the chain; [`serve`] runs until a shutdown signal.
//!
//! API keys map to tenants. With none configured the server makes a development key
//! (tenant `dev`) and an admin token, reports them, and listens on loopback only.
//!
//! Connections are served by hyper directly (not `axum::serve`), for its request-head
//! timeout ([`HttpTimeouts`]); a shutdown stops accepting, lets requests in flight finish
//! within the grace, then cuts off the executions still running so their keys are open
//! for a retry at once. The state gauges of `/metrics` are refreshed in the background,
//! never by a scrape. This module must not contain business rules or HTTP handlers.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::TokioTimer;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use idem_core::{OutcomePolicy, Principal, TenantId};
use idem_http::{
    BearerTokens, ClaimMode, IdempotencyConfig, IdempotencyLayer, IdempotencyMetrics, Identity,
    InProgressMode, KeyRule, RouteRule,
};
use idem_lease::LeaseMetrics;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::{self, AppState, LEGACY_ROUTE};
use crate::chain::{Chain, ChainHandle, ChainOptions, NatsOptions, TransportConfig};
use crate::db::{redact, Database, DatabaseOptions, DEFAULT_URL};
use crate::error::Error;
use crate::forwarded::TrustedProxies;
use crate::ledgers::ShowSeed;
use crate::metrics::OrdersMetrics;
use crate::service::{Orders, OrdersOptions};
use idem_sql::{ArrivalLog, ArrivalOptions};

/// One `--api-key TENANT=SECRET`.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey {
    pub tenant: TenantId,
    pub secret: String,
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKey")
            .field("tenant", &self.tenant)
            .field("secret", &"***")
            .finish()
    }
}

impl FromStr for ApiKey {
    type Err = Error;
    /// `TENANT=SECRET`; the secret is at least 8 visible ASCII characters.
    fn from_str(s: &str) -> Result<Self, Error> {
        let (tenant, secret) = s
            .split_once('=')
            .ok_or_else(|| Error::InvalidInput("an API key is TENANT=SECRET".into()))?;
        let tenant = TenantId::new(tenant).map_err(|e| Error::InvalidInput(e.to_string()))?;
        if secret.len() < 8 || !secret.chars().all(|c| c.is_ascii_graphic()) {
            return Err(Error::InvalidInput(
                "an API key secret is at least 8 visible ASCII characters".into(),
            ));
        }
        Ok(Self {
            tenant,
            secret: secret.to_owned(),
        })
    }
}

impl ApiKey {
    /// Keys from a file: one `TENANT=SECRET` per line; blank lines and lines starting
    /// with `#` are skipped. Errors name the line, never the secret.
    pub fn parse_lines(text: &str, origin: &str) -> Result<Vec<ApiKey>, Error> {
        text.lines()
            .enumerate()
            .map(|(n, line)| (n + 1, line.trim()))
            .filter(|(_, line)| !line.is_empty() && !line.starts_with('#'))
            .map(|(n, line)| {
                line.parse()
                    .map_err(|e: Error| Error::InvalidInput(format!("{origin} line {n}: {e}")))
            })
            .collect()
    }

    /// Keys from one string of comma-separated `TENANT=SECRET` (an environment
    /// variable); such secrets cannot contain a comma.
    pub fn parse_list(text: &str, origin: &str) -> Result<Vec<ApiKey>, Error> {
        text.split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .enumerate()
            .map(|(n, item)| {
                item.parse().map_err(|e: Error| {
                    Error::InvalidInput(format!("{origin} item {}: {e}", n + 1))
                })
            })
            .collect()
    }
}

/// The shortest admin token accepted.
pub const MIN_ADMIN_TOKEN_LEN: usize = 16;

/// Refuses credentials that cannot be told apart or guessed: one secret for two
/// tenants, a short admin token, an admin token that is also an API key. Drops exact
/// repeats (the same key given in two places).
fn check_credentials(keys: Vec<ApiKey>, admin_token: Option<&str>) -> Result<Vec<ApiKey>, Error> {
    let mut by_secret: HashMap<&str, &TenantId> = HashMap::new();
    let mut unique = Vec::with_capacity(keys.len());
    for key in &keys {
        match by_secret.get(key.secret.as_str()) {
            Some(tenant) if **tenant == key.tenant => continue,
            Some(tenant) => {
                return Err(Error::InvalidInput(format!(
                    "one API key secret is configured for tenants {tenant} and {}: give each \
                     tenant its own secret",
                    key.tenant
                )))
            }
            None => {
                by_secret.insert(&key.secret, &key.tenant);
                unique.push(key.clone());
            }
        }
    }
    if let Some(token) = admin_token {
        if token.len() < MIN_ADMIN_TOKEN_LEN || !token.chars().all(|c| c.is_ascii_graphic()) {
            return Err(Error::InvalidInput(format!(
                "the admin token must be at least {MIN_ADMIN_TOKEN_LEN} visible ASCII characters"
            )));
        }
        if by_secret.contains_key(token) {
            return Err(Error::InvalidInput(
                "the admin token is also an API key secret: give it its own value".into(),
            ));
        }
    }
    Ok(unique)
}

/// What `idem serve` was asked for.
#[derive(Clone)]
pub struct ServeConfig {
    /// Default `127.0.0.1:8080`.
    pub listen: SocketAddr,
    /// `sqlite://PATH` or `postgres://…`; default [`DEFAULT_URL`].
    pub database_url: Option<String>,
    /// One secret per tenant (a secret given for two tenants is refused).
    pub api_keys: Vec<ApiKey>,
    /// Enables the admin API (freezes, shows) and `/metrics`; at least
    /// [`MIN_ADMIN_TOKEN_LEN`] characters.
    pub admin_token: Option<String>,
    /// Relay the outbox to NATS JetStream instead of in process.
    pub nats_url: Option<String>,
    /// Serve HTTPS with this certificate chain and key (the metrics listener too).
    pub tls: Option<idem_net::tls::CertFiles>,
    pub options: ServiceOptions,
}

impl std::fmt::Debug for ServeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeConfig")
            .field("listen", &self.listen)
            .field("database_url", &self.database_url.as_deref().map(redact))
            .field("api_keys", &self.api_keys)
            .field("admin_token", &self.admin_token.as_ref().map(|_| "***"))
            .field("nats_url", &self.nats_url)
            .field("tls", &self.tls)
            .field("options", &self.options)
            .finish()
    }
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8080),
            database_url: None,
            api_keys: Vec::new(),
            admin_token: None,
            nats_url: None,
            tls: None,
            options: ServiceOptions::default(),
        }
    }
}

/// The HTTP server's time limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpTimeouts {
    /// A request head (request line and headers) must arrive within this, or the
    /// connection is closed; a keep-alive connection idle this long is closed too.
    /// Default 10 s.
    pub header_read: Duration,
    /// A request body must arrive in full within this, or the answer is 408 and nothing
    /// is recorded. Default 10 s.
    pub body_read: Duration,
    /// After a shutdown signal, requests in flight get this long to finish; executions
    /// still running then are cut off and their keys left FAILED_RETRYABLE. Default 10 s.
    pub shutdown_grace: Duration,
}

impl Default for HttpTimeouts {
    fn default() -> Self {
        Self {
            header_read: Duration::from_secs(10),
            body_read: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

impl HttpTimeouts {
    fn check(&self) -> Result<(), Error> {
        if self.header_read.is_zero() || self.body_read.is_zero() {
            return Err(Error::InvalidInput(
                "the header and body read timeouts must be positive".into(),
            ));
        }
        Ok(())
    }
}

/// How long the records of cut-off executions may take to be written at shutdown.
const CUT_OFF_WRITE: Duration = Duration::from_secs(5);

/// Settings below the command line's basics (tests, the demo, embedding); `idem serve`
/// sets the timeouts and the metrics address from its flags.
#[derive(Debug, Clone)]
pub struct ServiceOptions {
    /// PostgreSQL schema for every table.
    pub pg_schema: Option<String>,
    /// Stream, subjects and timings on NATS; default [`NatsOptions::new`] of `nats_url`.
    pub nats: Option<NatsOptions>,
    /// Shows created (if missing) for every configured tenant at start.
    pub catalogue: Vec<ShowSeed>,
    /// Run the relay and consumers in this process (default true).
    pub run_chain: bool,
    pub chain: ChainOptions,
    /// Serve `POST /v1/legacy/orders` (the demo's pre-idem behaviour). Default false.
    pub legacy_route: bool,
    /// How long a duplicate waits for the first request with its key before 409.
    pub in_progress_wait: Duration,
    /// How long a claim holds PROCESSING before another request may take it over
    /// (renewed while the handler runs). Default 60 s.
    pub claim_lease: Duration,
    /// Where `POST /v1/orders` claims its key: in the order's transaction (one commit,
    /// the default) or ahead of it (a commit of its own, as pay and cancel do).
    pub create_claim: ClaimMode,
    pub orders: OrdersOptions,
    pub timeouts: HttpTimeouts,
    /// Also serve `/metrics`, without credentials, on this address (an internal
    /// interface). On the main address `/metrics` needs the admin token.
    pub metrics_listen: Option<SocketAddr>,
    /// How often the state gauges (freezes, pending deliveries, unpublished outbox) are
    /// read from the database; a scrape never reads it. Default 5 s.
    pub metrics_refresh: Duration,
    /// Record every keyed arrival for the console's timeline (default on); `None` turns
    /// the timeline off.
    pub arrivals: Option<ArrivalOptions>,
    /// Reverse proxies whose `X-Forwarded-For` names the client for the console's login
    /// throttle and audit. Default none: the peer is the client.
    pub trusted_proxies: TrustedProxies,
    /// Give the console's cookie `Secure` on plain HTTP too (TLS ends at a proxy in
    /// front). With `tls` it always has it.
    pub console_secure_cookie: bool,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        Self {
            pg_schema: None,
            nats: None,
            catalogue: ShowSeed::default_catalogue(),
            run_chain: true,
            chain: ChainOptions::default(),
            legacy_route: false,
            in_progress_wait: Duration::from_secs(10),
            claim_lease: Duration::from_secs(60),
            create_claim: ClaimMode::InTransaction,
            orders: OrdersOptions::default(),
            timeouts: HttpTimeouts::default(),
            metrics_listen: None,
            metrics_refresh: Duration::from_secs(5),
            arrivals: Some(ArrivalOptions::default()),
            trusted_proxies: TrustedProxies::default(),
            console_secure_cookie: false,
        }
    }
}

/// The key and token made when no API key was configured.
#[derive(Clone, PartialEq, Eq)]
pub struct DevCredentials {
    pub tenant: String,
    pub api_key: String,
    pub admin_token: String,
    /// The admin token was configured, not made here: it is never printed.
    pub admin_token_configured: bool,
}

impl std::fmt::Debug for DevCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevCredentials")
            .field("tenant", &self.tenant)
            .finish_non_exhaustive()
    }
}

/// The assembled service, not yet listening.
pub struct App {
    pub router: Router,
    pub orders: Orders,
    pub chain: Chain,
    pub database: Database,
    /// Where it will listen (loopback when running on development credentials).
    pub listen: SocketAddr,
    pub dev_credentials: Option<DevCredentials>,
    pub admin_enabled: bool,
    run_chain: bool,
    layer: IdempotencyLayer,
    metrics: OrdersMetrics,
    metrics_router: Router,
    options: ServiceOptions,
    draining: Arc<std::sync::atomic::AtomicBool>,
    arrivals: Option<ArrivalLog>,
    console: idem_console::Console,
}

/// The idempotency layer's configuration for this service.
pub fn idempotency_config(
    in_progress_wait: Duration,
    claim_lease: Duration,
    create_claim: ClaimMode,
) -> IdempotencyConfig {
    IdempotencyConfig::default()
        .lease(claim_lease)
        // Duplicates of a request in flight wait for it and replay its answer.
        .in_progress(InProgressMode::Wait {
            max_wait: in_progress_wait,
        })
        // Business refusals (409 sold out, illegal transition) are final answers that
        // replay under the same key; only 408/429 and 5xx leave the key open.
        .outcome_policy(OutcomePolicy {
            retryable_client_errors: vec![408, 429],
            server_errors_terminal: false,
        })
        .route(RouteRule::new(LEGACY_ROUTE).key(KeyRule::Ignored))
        // A create writes only to the database: its claim commits with the order. Pay
        // and cancel call the payment provider first, so they claim ahead.
        .route(
            RouteRule::new("/v1/orders")
                .method(axum::http::Method::POST)
                .claim(create_claim),
        )
}

fn random_secret(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

impl App {
    pub async fn build(config: &ServeConfig) -> Result<App, Error> {
        config.options.timeouts.check()?;
        let mut keys = check_credentials(config.api_keys.clone(), config.admin_token.as_deref())?;
        let url = config.database_url.as_deref().unwrap_or(DEFAULT_URL);
        let database = Database::open(
            url,
            DatabaseOptions {
                pg_schema: config.options.pg_schema.clone(),
                ..Default::default()
            },
        )
        .await?;

        let mut admin_token = config.admin_token.clone();
        let mut listen = config.listen;
        let dev_credentials = if keys.is_empty() {
            let dev = DevCredentials {
                tenant: "dev".into(),
                api_key: random_secret("dev"),
                admin_token: admin_token
                    .clone()
                    .unwrap_or_else(|| random_secret("admin")),
                admin_token_configured: admin_token.is_some(),
            };
            keys.push(ApiKey {
                tenant: TenantId::new(dev.tenant.clone()).expect("valid tenant"),
                secret: dev.api_key.clone(),
            });
            admin_token = Some(dev.admin_token.clone());
            if !listen.ip().is_loopback() {
                tracing::warn!(requested = %listen, "no API key configured: listening on loopback only");
                listen.set_ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
            }
            Some(dev)
        } else {
            None
        };

        let mut auth = BearerTokens::new();
        for key in &keys {
            let principal = Principal::new(format!("api-key:{}", key.tenant))
                .map_err(|e| Error::InvalidInput(e.to_string()))?;
            auth = auth
                .try_with(
                    key.secret.clone(),
                    Identity::new(key.tenant.clone(), principal),
                )
                .map_err(|e| Error::InvalidInput(e.to_string()))?;
        }

        let mut registry = Registry::default();
        let idem_metrics = IdempotencyMetrics::new();
        idem_metrics.register(&mut registry);
        let lease_metrics = LeaseMetrics::register(&mut registry);
        let metrics = OrdersMetrics::default();
        metrics.register(&mut registry);

        let orders = Orders::new(
            database.clone(),
            config.options.orders.clone(),
            metrics.clone(),
            lease_metrics,
        );
        let mut tenants: Vec<&TenantId> = keys.iter().map(|k| &k.tenant).collect();
        tenants.sort();
        tenants.dedup();
        for tenant in tenants {
            orders
                .seed(tenant.as_str(), &config.options.catalogue)
                .await?;
        }

        let transport = match (&config.options.nats, &config.nats_url) {
            (Some(o), _) => TransportConfig::Nats(o.clone()),
            (None, Some(url)) => TransportConfig::Nats(NatsOptions::new(url.clone())),
            (None, None) => TransportConfig::InProcess,
        };
        let chain = Chain::new(orders.clone(), transport, config.options.chain.clone()).await?;

        let idem_config = idempotency_config(
            config.options.in_progress_wait,
            config.options.claim_lease,
            config.options.create_claim,
        );
        let openapi = crate::openapi::spec(&idem_config, config.options.legacy_route);
        let store = database.idempotency_store();
        let auth: Arc<dyn idem_http::Authenticate> = Arc::new(auth);
        let max_body = idem_config.max_request_body;
        // MySQL: the timeline's tables (`idem_arrival_keys`, `idem_arrivals`) belong to the
        // store's migrations, and a MySQL store without them gets no recording (each
        // write would fail) rather than a broken timeline; it records once they exist.
        let record_arrivals = database.backend() != "mysql"
            || database.store().has_table("idem_arrival_keys").await?;
        let arrivals = config
            .options
            .arrivals
            .clone()
            .filter(|_| record_arrivals)
            .map(|options| ArrivalLog::start(database.store().clone(), options));
        let mut layer = IdempotencyLayer::from_arcs(store.clone(), auth.clone())
            .with_config(idem_config)
            .with_metrics(idem_metrics.clone());
        if let Some(log) = &arrivals {
            log.register(&mut registry);
            layer = layer.with_arrivals(Arc::new(log.clone()));
        }
        let console = crate::console::build(
            &database,
            &metrics,
            crate::console::ConsoleConfig {
                admin_token: admin_token.clone(),
                arrivals: arrivals.clone(),
                metrics: idem_metrics,
                secure_cookie: config.tls.is_some() || config.options.console_secure_cookie,
                proxies: config.options.trusted_proxies.clone(),
            },
        )
        .await?;
        let draining = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let state = AppState {
            orders: orders.clone(),
            auth,
            store,
            admin_token: admin_token.as_deref().map(Arc::from),
            registry: Arc::new(registry),
            metrics: metrics.clone(),
            openapi: Arc::new(openapi),
            body_read_timeout: config.options.timeouts.body_read,
            max_body,
            draining: draining.clone(),
            console: console.clone(),
        };
        let metrics_router = api::metrics_router(state.clone());
        let router = api::router(state, layer.clone(), config.options.legacy_route);
        Ok(App {
            router,
            orders,
            chain,
            database,
            listen,
            dev_credentials,
            admin_enabled: admin_token.is_some(),
            run_chain: config.options.run_chain,
            layer,
            metrics,
            metrics_router,
            options: config.options.clone(),
            draining,
            arrivals,
            console,
        })
    }
}

/// A listening server and its chain.
pub struct Server {
    addr: SocketAddr,
    https: bool,
    metrics_addr: Option<SocketAddr>,
    dev_credentials: Option<DevCredentials>,
    orders: Orders,
    chain: Chain,
    chain_handle: Option<ChainHandle>,
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), Error>>,
    refresher: JoinHandle<()>,
    sampler: JoinHandle<()>,
    arrivals: Option<ArrivalLog>,
    admin_enabled: bool,
    backend: &'static str,
    draining: Arc<std::sync::atomic::AtomicBool>,
}

impl Server {
    /// The bound address (the real port when asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, or `https://ADDR` when it serves TLS.
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme(), self.addr)
    }

    fn scheme(&self) -> &'static str {
        if self.https {
            "https"
        } else {
            "http"
        }
    }

    /// Where `/metrics` is served without credentials, if it was asked for.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    pub fn dev_credentials(&self) -> Option<&DevCredentials> {
        self.dev_credentials.as_ref()
    }

    /// `URL/console/` when the console is on (an admin token is configured).
    pub fn console_url(&self) -> Option<String> {
        self.admin_enabled
            .then(|| format!("{}/console/", self.url()))
    }

    pub fn orders(&self) -> &Orders {
        &self.orders
    }

    /// The chain (for `drain` in tests when it is not running).
    pub fn chain(&self) -> &Chain {
        &self.chain
    }

    /// `sqlite` or `postgres`.
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// Stops accepting, lets requests in flight finish within the shutdown grace (then
    /// cuts off the executions still running), stops the chain.
    pub async fn shutdown(mut self) -> Result<(), Error> {
        // Readiness first: connections kept alive during the drain hear "not ready".
        self.draining
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.stop.send_replace(true);
        self.finish().await
    }

    /// Waits until the HTTP server ends by itself (it does not, without a shutdown).
    pub async fn wait(mut self) -> Result<(), Error> {
        self.finish().await
    }

    async fn finish(&mut self) -> Result<(), Error> {
        let result = (&mut self.task)
            .await
            .map_err(|e| Error::Backend(format!("server task: {e}")))?;
        self.refresher.abort();
        self.sampler.abort();
        // The answers are out: what the timeline buffered is written before stopping.
        if let Some(log) = self.arrivals.take() {
            log.close().await;
        }
        if let Some(chain) = self.chain_handle.take() {
            chain.stop().await;
        }
        result
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Dropped without a shutdown: stop accepting all the same.
        self.stop.send_replace(true);
        self.refresher.abort();
        self.sampler.abort();
        if let Some(log) = &self.arrivals {
            log.stop();
        }
    }
}

/// Builds the app, binds its listener and starts serving (and the chain). Returns at
/// once with the bound address.
pub async fn bind(config: ServeConfig) -> Result<Server, Error> {
    let app = App::build(&config).await?;
    // Read before listening: a bad certificate is a start-up error, not a failed request.
    let tls = config
        .tls
        .as_ref()
        .map(|files| files.listener(app.options.timeouts.header_read))
        .transpose()
        .map_err(|e| Error::InvalidInput(e.to_string()))?;
    let listener = TcpListener::bind(app.listen).await?;
    let addr = listener.local_addr()?;
    let metrics_listener = match app.options.metrics_listen {
        Some(mut at) => {
            // Development credentials keep everything on loopback, metrics too.
            if app.dev_credentials.is_some() && !at.ip().is_loopback() {
                tracing::warn!(requested = %at, "no API key configured: metrics on loopback only");
                at.set_ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
            }
            Some(TcpListener::bind(at).await?)
        }
        None => None,
    };
    let metrics_addr = metrics_listener
        .as_ref()
        .map(TcpListener::local_addr)
        .transpose()?;

    // The gauges are right from the first scrape on, then follow the database.
    if let Err(e) = api::refresh_state_gauges(&app.database, &app.metrics).await {
        tracing::warn!(error = %e, "could not read the state gauges");
    }
    let refresher = tokio::spawn(refresh_gauges(
        app.database.clone(),
        app.metrics.clone(),
        app.options.metrics_refresh,
    ));

    let sampler = tokio::spawn(idem_console::sample_rates(app.console.clone()));
    let chain_handle = app.run_chain.then(|| app.chain.clone().spawn());
    let (stop, stopped) = watch::channel(false);
    let timeouts = app.options.timeouts;
    if let Some(listener) = metrics_listener {
        let router = app.metrics_router;
        let stopped = stopped.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let graceful = accept(listener, router, tls, timeouts.header_read, stopped).await;
            let _ = tokio::time::timeout(Duration::from_secs(1), graceful.shutdown()).await;
        });
    }
    let router = app.router;
    let layer = app.layer;
    let https = tls.is_some();
    let task = tokio::spawn(async move {
        let graceful = accept(listener, router, tls, timeouts.header_read, stopped).await;
        drain(graceful, &layer, timeouts.shutdown_grace).await;
        Ok(())
    });
    tracing::info!(%addr, https, database = app.database.backend(), transport = app.chain.transport(), "idem orders listening");
    Ok(Server {
        addr,
        https,
        metrics_addr,
        dev_credentials: app.dev_credentials,
        orders: app.orders,
        backend: app.database.backend(),
        chain: app.chain,
        chain_handle,
        stop,
        task,
        refresher,
        sampler,
        arrivals: app.arrivals,
        admin_enabled: app.admin_enabled,
        draining: app.draining,
    })
}

/// Serves connections from `listener` until `stop` turns true (or its sender is gone),
/// then closes the listener and returns the watch over the connections still open.
async fn accept(
    listener: TcpListener,
    router: Router,
    tls: Option<idem_net::serve::ListenerTls>,
    header_read: Duration,
    mut stop: watch::Receiver<bool>,
) -> GracefulShutdown {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(header_read)
        .keep_alive(true);
    let stopped = async move {
        // Err: the sender is gone, which stops serving too.
        let _ = stop.wait_for(|stop| *stop).await;
    };
    idem_net::serve::accept_until(
        listener,
        &http,
        tls,
        // The peer's address for the console's login throttle.
        |peer| {
            TowerToHyperService::new(tower::Layer::layer(
                &axum::Extension(axum::extract::ConnectInfo(peer)),
                router.clone(),
            ))
        },
        stopped,
    )
    .await
}

/// Waits for the connections to finish their requests and for executions whose caller
/// already hung up, at most `grace`; then cuts off the executions still running (their
/// records end FAILED_RETRYABLE) and gives their answers a moment to go out.
async fn drain(graceful: GracefulShutdown, layer: &IdempotencyLayer, grace: Duration) {
    let until = tokio::time::Instant::now() + grace;
    let connections = graceful.shutdown();
    tokio::pin!(connections);
    let connections_done = tokio::time::timeout_at(until, &mut connections)
        .await
        .is_ok();
    let executions_done = tokio::time::timeout_at(until, layer.executions_idle())
        .await
        .is_ok();
    if connections_done && executions_done {
        return;
    }
    tracing::warn!(
        running = layer.executions_running(),
        grace_ms = grace.as_millis() as u64,
        "requests still in flight after the shutdown grace; cutting them off"
    );
    if tokio::time::timeout(CUT_OFF_WRITE, layer.cut_off_executions())
        .await
        .is_err()
    {
        tracing::error!(
            "the records of cut-off executions were not all written; they wait out their lease"
        );
    }
    if !connections_done {
        let _ = tokio::time::timeout(Duration::from_secs(1), &mut connections).await;
    }
}

/// Re-reads the state gauges every `every`.
async fn refresh_gauges(database: Database, metrics: OrdersMetrics, every: Duration) {
    let mut tick = tokio::time::interval(every.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        if let Err(e) = api::refresh_state_gauges(&database, &metrics).await {
            tracing::warn!(error = %e, "could not refresh the state gauges");
        }
    }
}

/// `idem serve`: binds, prints where it listens (and the development key, if it made
/// one), and runs until `shutdown` resolves.
pub async fn serve(
    config: ServeConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let url = config
        .database_url
        .clone()
        .unwrap_or_else(|| DEFAULT_URL.to_owned());
    let nats = config.nats_url.clone();
    let server = bind(config).await?;
    // A closed stdout (the parent stopped reading) must not take the server down: the
    // banner is best effort, unlike `println!`, which panics on a broken pipe.
    macro_rules! say {
        ($($arg:tt)*) => {{
            use std::io::Write as _;
            let _ = writeln!(std::io::stdout(), $($arg)*);
        }};
    }
    say!("idem orders listening on {}", server.url());
    if let Some(at) = server.metrics_addr() {
        say!("  metrics: {}://{at}/metrics", server.scheme());
    }
    say!("  database: {}", redact(&url));
    say!(
        "  outbox transport: {}",
        nats.as_deref().map_or_else(
            || "in-process".to_owned(),
            |u| format!("NATS JetStream at {}", redact(u))
        )
    );
    if let Some(dev) = server.dev_credentials() {
        say!("  no --api-key given: development credentials (loopback only)");
        say!("    tenant:      {}", dev.tenant);
        say!(
            "    api key:     {}   (Authorization: Bearer {})",
            dev.api_key,
            dev.api_key
        );
        if dev.admin_token_configured {
            say!("    admin token: (the one configured)");
        } else {
            say!("    admin token: {}", dev.admin_token);
        }
    }
    match server.console_url() {
        Some(url) => say!("  console: {url}  (log in with the admin token)"),
        None => say!("  console: off (no admin token)"),
    }
    say!("  try: curl -s {}/healthz", server.url());
    shutdown.await;
    say!("shutting down");
    server.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_keys() {
        let k: ApiKey = "acme=s3cret-key".parse().unwrap();
        assert_eq!(k.tenant.as_str(), "acme");
        assert_eq!(k.secret, "s3cret-key");
        assert!("acme".parse::<ApiKey>().is_err());
        assert!("acme=short".parse::<ApiKey>().is_err());
        assert!("=longenough".parse::<ApiKey>().is_err());
        assert!("acme=has space here".parse::<ApiKey>().is_err());
        assert!(!format!("{k:?}").contains("s3cret"));
    }

    #[test]
    fn api_keys_from_files_and_lists() {
        let text = "# tenants\n\nacme=s3cret-key\n  beta=other-secret  \n#gamma=x\n";
        let keys = ApiKey::parse_lines(text, "keys.txt").unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[1].tenant.as_str(), "beta");
        assert_eq!(keys[1].secret, "other-secret");
        let e = ApiKey::parse_lines("acme=s3cret-key\nbeta=short\n", "keys.txt").unwrap_err();
        assert!(e.to_string().contains("keys.txt line 2"), "{e}");
        assert!(
            !e.to_string().contains("short"),
            "the secret is not echoed: {e}"
        );
        let keys =
            ApiKey::parse_list("acme=s3cret-key, beta=other-secret,", "IDEM_API_KEYS").unwrap();
        assert_eq!(keys.len(), 2);
    }

    #[test]
    fn credentials_are_checked() {
        let key = |s: &str| s.parse::<ApiKey>().unwrap();
        let twice = vec![
            key("a=same-secret"),
            key("a=same-secret"),
            key("a=other-secret"),
        ];
        assert_eq!(check_credentials(twice, None).unwrap().len(), 2);
        let shared = vec![key("a=same-secret"), key("b=same-secret")];
        let e = check_credentials(shared, None).unwrap_err().to_string();
        assert!(
            e.contains("tenants a and b") && !e.contains("same-secret"),
            "{e}"
        );
        assert!(check_credentials(vec![], Some("short-token")).is_err());
        assert!(check_credentials(vec![], Some("a-long-enough-token")).is_ok());
        let reused = vec![key("a=a-long-enough-token")];
        assert!(check_credentials(reused, Some("a-long-enough-token")).is_err());
    }

    #[test]
    fn default_timeouts() {
        let t = ServiceOptions::default().timeouts;
        assert_eq!(t.header_read, Duration::from_secs(10));
        assert_eq!(t.body_read, Duration::from_secs(10));
        assert_eq!(t.shutdown_grace, Duration::from_secs(10));
    }
}
