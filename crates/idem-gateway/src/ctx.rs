//! What every request of one gateway shares ([`Ctx`]: its configuration, route table,
//! callers, upstreams, window, flights and counters), built once from the
//! configuration, and the ids of the arrival a task answers.
//!
//! Owns building that context, the gateway's own header names and the problem answer
//! with its request id. It must not handle a request: that is [`crate::service`]'s and,
//! for keyed routes, [`crate::keyed`]'s.

use std::future::Future;
use std::sync::Arc;

use http::header::{HeaderName, HeaderValue};
use http::{Method, Response};
use idem_http::pipeline::{Executions, FinishPolicy, OwnerIds, Pipeline, TooLarge};
use idem_http::InProgressMode;

use crate::auth::ApiKeys;
use crate::body::Body;
use crate::buffers::BodyBudget;
use crate::config::GatewayConfig;
use crate::error::GatewayError;
use crate::flights::{Flights, InProgress};
use crate::forwarded::TrustedProxies;
use crate::metrics::GatewayMetrics;
use crate::problem::Problem;
use crate::routes::RouteTable;
use crate::upstream::{Upstream, UpstreamBase};
use crate::upstreams::{HealthPolicy, Upstreams};
use crate::window::Window;

/// The shared secret header the gateway sends upstream (when configured).
pub const GATEWAY_TOKEN: HeaderName = HeaderName::from_static("x-idem-gateway-token");
/// Correlates a client's answer with the gateway's log line (and the upstream's).
pub use idem_http::headers::REQUEST_ID as X_REQUEST_ID;

/// An arrival's ids: the gateway's own, always minted here (a client-chosen id could
/// repeat another request's and confuse the logs), and the client's `X-Request-Id`
/// when it is plain enough to log, kept apart.
#[derive(Clone)]
struct RequestIds {
    ours: Arc<str>,
    client: Option<Arc<str>>,
}

tokio::task_local! {
    /// The ids of the arrival this task answers.
    static REQUEST_ID: RequestIds;
}

/// `answer` run as the arrival with the gateway's id `ours` and the client's `client`.
pub(crate) fn with_request_ids<F: Future>(
    ours: Arc<str>,
    client: Option<Arc<str>>,
    answer: F,
) -> impl Future<Output = F::Output> {
    REQUEST_ID.scope(RequestIds { ours, client }, answer)
}

/// The current arrival's request id (`None` outside a request).
pub(crate) fn request_id() -> Option<Arc<str>> {
    REQUEST_ID.try_with(|ids| ids.ours.clone()).ok()
}

/// The `X-Request-Id` the client sent with the current arrival, if any (`-` if none).
pub(crate) fn client_request_id() -> Arc<str> {
    REQUEST_ID
        .try_with(|ids| ids.client.clone())
        .ok()
        .flatten()
        .unwrap_or_else(|| Arc::from("-"))
}

/// Everything a request needs, shared by all connections of one gateway.
pub(crate) struct Ctx {
    pub config: GatewayConfig,
    pub routes: RouteTable,
    pub auth: ApiKeys,
    pub upstreams: Upstreams,
    pub window: Window,
    pub flights: Arc<Flights>,
    /// Keys each partition has executing here.
    pub in_progress: Arc<InProgress>,
    /// Bytes of keyed bodies buffered at once.
    pub body_budget: BodyBudget,
    pub metrics: Arc<GatewayMetrics>,
    pub instance: String,
    /// Owner ids of this instance's claims: `<instance>:<n>`.
    pub owners: OwnerIds,
    pub tenant_header: HeaderName,
    pub principal_header: HeaderName,
    pub token: Option<HeaderValue>,
    pub state_method: Method,
    /// Response headers never stored or replayed (always `set-cookie`).
    pub per_caller: Vec<HeaderName>,
    /// Request headers a state query repeats to authenticate as the caller.
    pub state_credentials: Vec<HeaderName>,
    /// Peers whose forwarding headers are believed.
    pub proxies: TrustedProxies,
    /// Executions under a claim; cut off once the shutdown grace has run out.
    pub executions: Arc<Executions>,
    /// Set once the shutdown began: `/readyz` answers 503 to the connections still open.
    pub draining: std::sync::atomic::AtomicBool,
}

impl Ctx {
    pub fn new(config: GatewayConfig) -> Result<Self, GatewayError> {
        config.validate()?;
        let instance = config
            .instance_id
            .clone()
            .unwrap_or_else(|| format!("gw-{}", uuid::Uuid::new_v4().simple()));
        // The instance id must leave room for the counter.
        let owners = OwnerIds::new(format!("{instance}:")).map_err(|_| {
            GatewayError::Config(format!(
                "instance_id {instance:?} must be visible ASCII, at most 100 characters"
            ))
        })?;
        let metrics = Arc::new(GatewayMetrics::new());
        let window = Window::from_config(&config, &instance, metrics.clone())?;
        let upstream_tls = config
            .upstream_ca_file
            .as_deref()
            .map(|ca| idem_net::tls::client_config(Some(ca), true))
            .transpose()
            .map_err(|e| GatewayError::Config(format!("upstream TLS: {e}")))?;
        let clients = config
            .upstream_urls()
            .into_iter()
            .map(|url| {
                let client = Upstream::new(
                    UpstreamBase::parse(url)?,
                    upstream_tls.clone(),
                    config.upstream_connect_timeout(),
                    config.upstream_idle_timeout(),
                    config.upstream_timeout(),
                    config.max_response_bytes,
                )?;
                Ok((client, url))
            })
            .collect::<Result<Vec<_>, GatewayError>>()?;
        let upstreams = Upstreams::new(
            clients,
            HealthPolicy {
                consecutive_failures: config.upstream_health.consecutive_failures,
                eject: config.upstream_eject(),
            },
            metrics.clone(),
        );
        let header = crate::auth::header_name;
        let auth = ApiKeys::new(&config.auth, config.redis_url.is_some())?;
        let mut per_caller = vec![http::header::SET_COOKIE];
        for h in &config.per_caller_response_headers {
            let h = header(h)?;
            if !per_caller.contains(&h) {
                per_caller.push(h);
            }
        }
        Ok(Self {
            routes: RouteTable::compile(&config.routes)?,
            state_credentials: auth.forwarded_credentials(),
            auth,
            per_caller,
            proxies: TrustedProxies::new(&config.trusted_proxies),
            executions: Arc::default(),
            draining: std::sync::atomic::AtomicBool::new(false),
            tenant_header: header(&config.tenant_header)?,
            principal_header: header(&config.principal_header)?,
            token: config
                .upstream_token
                .as_deref()
                .map(HeaderValue::from_str)
                .transpose()
                .map_err(|_| GatewayError::Config("bad upstream_token".into()))?,
            state_method: Method::from_bytes(config.state_query.method.as_bytes())
                .map_err(|_| GatewayError::Config("bad state_query.method".into()))?,
            upstreams,
            window,
            flights: Arc::default(),
            in_progress: Arc::new(InProgress::new(config.max_in_progress_per_caller)),
            body_budget: BodyBudget::new(config.max_buffered_body_bytes, metrics.clone()),
            metrics,
            instance,
            owners,
            config,
        })
    }

    /// The pipeline a keyed request runs in the window: duplicates wait for the first
    /// execution (here or on another instance); a finish is tried once (a shared window
    /// that fails is degraded mode, and the caller should not wait on it), and a result
    /// too large to keep is forgotten (later duplicates go to the upstream with the key).
    pub fn pipeline(&self) -> Pipeline<'_> {
        Pipeline {
            store: &self.window,
            wakeups: self.window.wakeups(),
            executions: &self.executions,
            lease: self.config.lease(),
            in_progress: InProgressMode::Wait {
                max_wait: self.config.max_wait(),
            },
            finish: FinishPolicy {
                attempts: 1,
                too_large: TooLarge::Forget,
                read_back: false,
            },
        }
    }

    /// A problem response, counted; its internal cause goes to the log with the
    /// request id, never to the client.
    pub fn problem(&self, p: Problem) -> Response<Body> {
        self.metrics.problem(p.kind.slug());
        let id = request_id();
        if let Some(cause) = &p.cause {
            tracing::warn!(request_id = id.as_deref().unwrap_or("-"), client_request_id = %client_request_id(), problem = p.kind.slug(), %cause, "answered with a problem");
        }
        crate::problem::to_response(&p, id.as_deref())
    }
}
