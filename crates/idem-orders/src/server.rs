//! Putting the service together and running it: `idem serve`.
//!
//! [`App::build`] opens the database (embedded SQLite by default, PostgreSQL with a
//! `postgres://` URL), seeds the catalogue for every tenant, builds the idempotency
//! layer, the metrics registry, the router and the chain. [`bind`] also listens and
//! starts the chain; [`serve`] runs until a shutdown signal.
//!
//! API keys map to tenants. With none configured the server makes a development key
//! (tenant `dev`) and an admin token, reports them, and listens on loopback only.
//! This module must not contain business rules or HTTP handlers.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use idem_core::{OutcomePolicy, Principal, TenantId};
use idem_http::{
    BearerTokens, IdempotencyConfig, IdempotencyLayer, IdempotencyMetrics, Identity,
    InProgressMode, KeyRequirement, RouteRule,
};
use idem_lease::LeaseMetrics;
use prometheus_client::registry::Registry;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::api::{self, AppState, LEGACY_ROUTE};
use crate::chain::{Chain, ChainHandle, ChainOptions, NatsOptions, TransportConfig};
use crate::db::{redact, Database, DatabaseOptions, DEFAULT_URL};
use crate::error::Error;
use crate::ledgers::ShowSeed;
use crate::metrics::OrdersMetrics;
use crate::service::{Orders, OrdersOptions};

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

/// What `idem serve` was asked for.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Default `127.0.0.1:8080`.
    pub listen: SocketAddr,
    /// `sqlite://PATH` or `postgres://…`; default [`DEFAULT_URL`].
    pub database_url: Option<String>,
    pub api_keys: Vec<ApiKey>,
    /// Enables the admin API (freezes, shows).
    pub admin_token: Option<String>,
    /// Relay the outbox to NATS JetStream instead of in process.
    pub nats_url: Option<String>,
    pub options: ServiceOptions,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8080),
            database_url: None,
            api_keys: Vec::new(),
            admin_token: None,
            nats_url: None,
            options: ServiceOptions::default(),
        }
    }
}

/// Settings below the command line (tests, the demo, embedding).
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
    pub orders: OrdersOptions,
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
            orders: OrdersOptions::default(),
        }
    }
}

/// The key and token made when no API key was configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevCredentials {
    pub tenant: String,
    pub api_key: String,
    pub admin_token: String,
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
}

/// The idempotency layer's configuration for this service.
pub fn idempotency_config(in_progress_wait: Duration) -> IdempotencyConfig {
    IdempotencyConfig::default()
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
        .route(RouteRule::new(LEGACY_ROUTE).key(KeyRequirement::Ignored))
}

fn random_secret(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

impl App {
    pub async fn build(config: &ServeConfig) -> Result<App, Error> {
        let url = config.database_url.as_deref().unwrap_or(DEFAULT_URL);
        let database = Database::open(
            url,
            DatabaseOptions {
                pg_schema: config.options.pg_schema.clone(),
                ..Default::default()
            },
        )
        .await?;

        let mut keys = config.api_keys.clone();
        let mut admin_token = config.admin_token.clone();
        let mut listen = config.listen;
        let dev_credentials = if keys.is_empty() {
            let dev = DevCredentials {
                tenant: "dev".into(),
                api_key: random_secret("dev"),
                admin_token: admin_token
                    .clone()
                    .unwrap_or_else(|| random_secret("admin")),
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
            auth = auth.with(
                key.secret.clone(),
                Identity::new(key.tenant.clone(), principal),
            );
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

        let idem_config = idempotency_config(config.options.in_progress_wait);
        let openapi = crate::openapi::spec(&idem_config, config.options.legacy_route);
        let store = database.idempotency_store();
        let auth: Arc<dyn idem_http::Authenticate> = Arc::new(auth);
        let layer = IdempotencyLayer::from_arcs(store.clone(), auth.clone())
            .with_config(idem_config)
            .with_metrics(idem_metrics);
        let state = AppState {
            orders: orders.clone(),
            auth,
            store,
            admin_token: admin_token.as_deref().map(Arc::from),
            registry: Arc::new(registry),
            metrics,
            openapi: Arc::new(openapi),
        };
        let router = api::router(state, layer, config.options.legacy_route);
        Ok(App {
            router,
            orders,
            chain,
            database,
            listen,
            dev_credentials,
            admin_enabled: admin_token.is_some(),
            run_chain: config.options.run_chain,
        })
    }
}

/// A listening server and its chain.
pub struct Server {
    addr: SocketAddr,
    dev_credentials: Option<DevCredentials>,
    orders: Orders,
    chain: Chain,
    chain_handle: Option<ChainHandle>,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), Error>>,
    backend: &'static str,
}

impl Server {
    /// The bound address (the real port when asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn dev_credentials(&self) -> Option<&DevCredentials> {
        self.dev_credentials.as_ref()
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

    /// Stops accepting, finishes requests in flight, stops the chain.
    pub async fn shutdown(mut self) -> Result<(), Error> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
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
        if let Some(chain) = self.chain_handle.take() {
            chain.stop().await;
        }
        result
    }
}

/// Builds the app, binds its listener and starts serving (and the chain). Returns at
/// once with the bound address.
pub async fn bind(config: ServeConfig) -> Result<Server, Error> {
    let app = App::build(&config).await?;
    let listener = tokio::net::TcpListener::bind(app.listen).await?;
    let addr = listener.local_addr()?;
    let chain_handle = app.run_chain.then(|| app.chain.clone().spawn());
    let (shutdown, stopped) = oneshot::channel::<()>();
    let router = app.router;
    let task = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .await
            .map_err(Error::Io)
    });
    tracing::info!(%addr, database = app.database.backend(), transport = app.chain.transport(), "idem orders listening");
    Ok(Server {
        addr,
        dev_credentials: app.dev_credentials,
        orders: app.orders,
        backend: app.database.backend(),
        chain: app.chain,
        chain_handle,
        shutdown: Some(shutdown),
        task,
    })
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
    println!("idem orders listening on {}", server.url());
    println!("  database: {}", redact(&url));
    println!(
        "  outbox transport: {}",
        nats.as_deref().map_or_else(
            || "in-process".to_owned(),
            |u| format!("NATS JetStream at {u}")
        )
    );
    if let Some(dev) = server.dev_credentials() {
        println!("  no --api-key given: development credentials (loopback only)");
        println!("    tenant:      {}", dev.tenant);
        println!(
            "    api key:     {}   (Authorization: Bearer {})",
            dev.api_key, dev.api_key
        );
        println!("    admin token: {}", dev.admin_token);
    }
    println!("  try: curl -s {}/healthz", server.url());
    shutdown.await;
    println!("shutting down");
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
}
