//! One request through the gateway: admin endpoints, authentication, the route's key
//! rule, then either the streamed pass-through or the keyed flow ([`crate::keyed`]).
//!
//! The service is infallible: every failure is a problem response. Headers bound for the
//! upstream lose their hop-by-hop fields and any client-sent identity header; the
//! gateway then sets the authenticated tenant and principal itself.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http::header::{
    HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, COOKIE,
    FORWARDED, HOST,
};
use http::{Request, Response, Version};
use http_body::Body as _;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use idem_core::wire::{TraceParent, TRACEPARENT};
use idem_core::Identity;
use idem_core::{IdempotencyStore as _, Scope};
use idem_http::headers::IDEMPOTENCY_KEY;
use idem_http::pipeline::request::{self, Refusal};

use crate::auth::Caller;
use crate::body::{empty, full, Body, IdleTimeout, ReadError};
use crate::buffers::BufferError;
use crate::ctx::{request_id, with_request_ids, Ctx, GATEWAY_TOKEN, X_REQUEST_ID};
use crate::forward::KeyedRequest;
use crate::keyed;
use crate::problem::{Problem, ProblemKind};
use crate::upstream::PassError;
use crate::upstreams::Heard;

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// How a request's headers are readied for the upstream.
impl Ctx {
    /// A request header a client's `Connection` must not name: removing it would
    /// forward the request without its key, its credential or what its fingerprint
    /// covers.
    fn end_to_end(&self, name: &HeaderName) -> bool {
        *name == IDEMPOTENCY_KEY
            || *name == AUTHORIZATION
            || *name == COOKIE
            || *name == HOST
            || *name == CONTENT_TYPE
            || *name == CONTENT_LENGTH
            || self.auth.identifies(name)
            || self
                .config
                .fingerprint
                .headers
                .iter()
                .any(|h| h.eq_ignore_ascii_case(name.as_str()))
    }

    /// The first end-to-end header the request's `Connection` names, if any.
    fn connection_conflict(&self, headers: &HeaderMap) -> Option<String> {
        crate::hop::connection_names(headers)
            .find(|n| self.end_to_end(n))
            .map(|n| n.as_str().to_string())
    }

    /// Readies client headers for the upstream: hop-by-hop fields, client-sent identity
    /// headers and (configured) the API key go; the gateway's identity headers come in.
    fn prepare_headers(&self, headers: &mut HeaderMap, identity: Option<&Identity>, peer: &Peer) {
        // Forwarding headers are believed only from a configured proxy.
        let trusted = self.proxies.trusts(peer.ip);
        // One scan first: requests rarely carry anything to remove.
        let dirty = headers.keys().any(|n| {
            crate::hop::is_hop_by_hop(n)
                || *n == self.tenant_header
                || *n == self.principal_header
                || *n == GATEWAY_TOKEN
                || self.auth.is_credential(n)
                || (!trusted && is_forwarding(n))
        });
        if dirty {
            crate::hop::strip_hop_by_hop(headers);
            headers.remove(&self.tenant_header);
            headers.remove(&self.principal_header);
            headers.remove(GATEWAY_TOKEN);
            self.auth.strip(headers);
            if !trusted {
                let forwarding: Vec<HeaderName> = headers
                    .keys()
                    .filter(|n| is_forwarding(n))
                    .cloned()
                    .collect();
                for n in forwarding {
                    headers.remove(n);
                }
            }
        }
        // The upstream gets its own authority as Host (set when it is chosen); the
        // client's goes along as X-Forwarded-Host (a trusted proxy's own stays).
        if let Some(host) = headers.remove(HOST) {
            if !headers.contains_key(X_FORWARDED_HOST) {
                headers.insert(X_FORWARDED_HOST, host);
            }
        }
        if let Some(id) = request_id().and_then(|id| HeaderValue::from_str(&id).ok()) {
            headers.insert(X_REQUEST_ID, id);
        }
        // W3C trace context: the upstream call is a child of the caller's span, or the
        // first span of a new trace. A malformed traceparent is replaced, not passed on.
        let span = uuid::Uuid::new_v4().as_bytes()[..8]
            .try_into()
            .unwrap_or([1; 8]);
        let next = match headers
            .get(&TRACEPARENT)
            .and_then(|v| v.to_str().ok())
            .and_then(TraceParent::parse)
        {
            Some(parent) => parent.child(span),
            None => TraceParent {
                trace_id: *uuid::Uuid::new_v4().as_bytes(),
                parent_id: span,
                flags: 0,
            },
        };
        if let Ok(v) = HeaderValue::from_bytes(&next.to_bytes()) {
            headers.insert(TRACEPARENT, v);
        }
        // A proxy may add its own line instead of extending one: every line counts,
        // in order.
        let prior: Vec<&str> = headers
            .get_all(&X_FORWARDED_FOR)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        if prior.is_empty() {
            headers.insert(X_FORWARDED_FOR, peer.xff.clone());
        } else {
            let chain = format!("{}, {}", prior.join(", "), peer.ip);
            match HeaderValue::from_str(&chain) {
                Ok(v) => {
                    headers.insert(X_FORWARDED_FOR, v);
                }
                Err(_) => {
                    headers.insert(X_FORWARDED_FOR, peer.xff.clone());
                }
            }
        }
        if let Some(id) = identity {
            // Without API keys the upstream tenant is the caller's own partition too:
            // an upstream that keys on it never merges two callers.
            let tenant = self.auth.window_tenant(id);
            if let Ok(v) = HeaderValue::from_str(tenant.as_str()) {
                headers.insert(self.tenant_header.clone(), v);
            }
            if let Ok(v) = HeaderValue::from_str(id.principal.as_str()) {
                headers.insert(self.principal_header.clone(), v);
            }
        }
        if let Some(token) = &self.token {
            headers.insert(GATEWAY_TOKEN, token.clone());
        }
    }
}

/// A field that says where a request came from: believed only from trusted proxies.
fn is_forwarding(name: &HeaderName) -> bool {
    let n = name.as_str();
    n.starts_with("x-forwarded-") || n == FORWARDED.as_str() || n == "x-real-ip"
}

/// The client end of a connection, computed once per connection.
pub(crate) struct Peer {
    pub ip: std::net::IpAddr,
    /// The `X-Forwarded-For` value when the client sent none.
    pub xff: HeaderValue,
}

impl Peer {
    pub fn new(addr: SocketAddr) -> Self {
        let ip = addr.ip();
        Self {
            ip,
            xff: HeaderValue::from_str(&ip.to_string()).expect("an IP is a header value"),
        }
    }
}

/// The hyper service function.
pub(crate) async fn serve(
    ctx: Arc<Ctx>,
    peer: Arc<Peer>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    Ok(route(ctx, &peer, req).await)
}

async fn route(ctx: Arc<Ctx>, peer: &Peer, req: Request<Incoming>) -> Response<Body> {
    let id = idem_http::headers::new_request_id();
    let client = idem_core::wire::client_request_id(req.headers()).map(Arc::from);
    let mut response = with_request_ids(id.clone(), client, route_request(ctx, peer, req)).await;
    if let Ok(v) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(X_REQUEST_ID, v);
    }
    response
}

async fn route_request(ctx: Arc<Ctx>, peer: &Peer, req: Request<Incoming>) -> Response<Body> {
    if let Some(name) = ctx.connection_conflict(req.headers()) {
        return ctx.problem(Problem::new(
            ProblemKind::ConnectionNamesEndToEnd,
            format!("the Connection header names {name}, which the gateway must forward"),
        ));
    }
    let path = req.uri().path();
    if let Some(rest) = path.strip_prefix(ctx.config.admin_prefix.as_str()) {
        if rest.is_empty() || rest.starts_with('/') {
            ctx.metrics.request("admin");
            return admin(&ctx, rest);
        }
    }
    let (identity, authenticated) = match ctx.auth.identify(req.headers()) {
        Caller::Unknown => {
            return ctx.problem(Problem::new(
                ProblemKind::Unauthenticated,
                "the API key is not recognised",
            ))
        }
        Caller::Known(id) => (Some(id), true),
        Caller::Anonymous => (ctx.auth.anonymous().cloned(), false),
    };
    if request::needs_key(ctx.routes.key_rule(req.method(), path), req.headers()) {
        ctx.metrics.request("keyed");
        keyed_entry(ctx, peer, req, identity).await
    } else {
        ctx.metrics.request("passthrough");
        if !authenticated && ctx.auth.require_on_passthrough {
            return ctx.problem(Problem::new(
                ProblemKind::Unauthenticated,
                "an API key is required",
            ));
        }
        passthrough(ctx, peer, req, identity).await
    }
}

fn admin(ctx: &Ctx, rest: &str) -> Response<Body> {
    match rest {
        "/metrics" => {
            ctx.metrics.set_window_full(ctx.window.is_full());
            ctx.upstreams.healthy();
            let mut r = Response::new(full(ctx.metrics.encode()));
            r.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            r
        }
        "/livez" => json_answer(
            http::StatusCode::OK,
            serde_json::json!({"status": "alive", "instance": ctx.instance}),
        ),
        "/readyz" => {
            // Ready while it can take new keys: a degraded shared window still forwards
            // (the upstream guards), a full memory window answers 503 to new keys.
            let draining = ctx.draining.load(std::sync::atomic::Ordering::Relaxed);
            let window_full = ctx.window.is_full();
            let degraded = ctx.metrics.is_degraded();
            let ready = !draining && !window_full;
            let reason = if draining {
                Some("shutting down")
            } else if window_full {
                Some("window full: new keys are refused until records expire")
            } else {
                None
            };
            json_answer(
                if ready {
                    http::StatusCode::OK
                } else {
                    http::StatusCode::SERVICE_UNAVAILABLE
                },
                serde_json::json!({
                    "status": if ready { "ready" } else { "not_ready" },
                    "reason": reason,
                    "draining": draining,
                    "degraded": degraded,
                    "window_full": window_full,
                    "window": ctx.window.backend(),
                    "instance": ctx.instance,
                }),
            )
        }
        "/health" => {
            let window_full = ctx.window.is_full();
            let degraded = ctx.metrics.is_degraded() || window_full;
            json_answer(
                http::StatusCode::OK,
                serde_json::json!({
                    "status": if degraded { "degraded" } else { "ok" },
                    "window_full": window_full,
                    "window": ctx.window.backend(),
                    "shared_window": ctx.window.is_shared(),
                    "instance": ctx.instance,
                    "in_flight": ctx.flights.len(),
                    "upstreams": ctx.upstreams.len(),
                    "upstreams_healthy": ctx.upstreams.healthy(),
                    "upstreams_ejected": ctx.upstreams.ejected(),
                }),
            )
        }
        _ => ctx.problem(Problem::new(
            ProblemKind::NotFound,
            "no such gateway endpoint",
        )),
    }
}

fn json_answer(status: http::StatusCode, body: serde_json::Value) -> Response<Body> {
    let mut r = Response::new(full(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

async fn passthrough(
    ctx: Arc<Ctx>,
    peer: &Peer,
    req: Request<Incoming>,
    identity: Option<Identity>,
) -> Response<Body> {
    let (mut parts, body) = req.into_parts();
    ctx.prepare_headers(&mut parts.headers, identity.as_ref(), peer);
    let upstream = ctx.upstreams.pick(None);
    parts.uri = upstream.client().base().target(&parts.uri);
    parts.version = Version::HTTP_11;
    // Streamed, not buffered; a stalled client body fails the upstream request.
    let body = if body.is_end_stream() {
        empty()
    } else {
        IdleTimeout::new(body, ctx.config.body_read_timeout()).boxed_unsync()
    };
    ctx.metrics.upstream_call("passthrough");
    let passed = upstream
        .client()
        .pass(Request::from_parts(parts, body))
        .await;
    upstream.heard(Heard::from(&passed));
    drop(upstream);
    match passed {
        Ok(resp) => resp,
        Err(PassError::NotSent(e)) => ctx.problem(
            Problem::new(
                ProblemKind::UpstreamUnavailable,
                "the upstream could not be reached; the request was not sent",
            )
            .cause(e)
            .retry_after(std::time::Duration::from_secs(1)),
        ),
        Err(PassError::Timeout) => ctx.problem(Problem::new(
            ProblemKind::UpstreamTimeout,
            format!(
                "no response head within {} ms",
                ctx.config.upstream_timeout_ms
            ),
        )),
        Err(PassError::ClientStalled) => ctx.problem(Problem::new(
            ProblemKind::RequestTimeout,
            format!(
                "the request body paused for more than {} ms",
                ctx.config.body_read_timeout_ms
            ),
        )),
        Err(PassError::Failed(e)) => ctx.problem(
            Problem::new(
                ProblemKind::UpstreamUnavailable,
                "the upstream exchange failed",
            )
            .cause(e),
        ),
    }
}

async fn keyed_entry(
    ctx: Arc<Ctx>,
    peer: &Peer,
    req: Request<Incoming>,
    identity: Option<Identity>,
) -> Response<Body> {
    let Some(identity) = identity else {
        return ctx.problem(Problem::new(
            ProblemKind::Unauthenticated,
            "a credential is required on this route: stored results are kept per caller",
        ));
    };
    // The pipeline's steps before the claim, in its order.
    let refused = |(_, problem): Refusal| ctx.problem(problem);
    let key = match request::key(req.headers(), req.method(), req.uri().path()) {
        Ok(k) => k,
        Err(r) => return refused(r),
    };
    let limit = ctx.config.max_body_bytes;
    let declared = match request::declared_body(req.headers(), limit) {
        Ok(declared) => declared,
        Err(r) => return refused(r),
    };
    let (mut parts, body) = req.into_parts();
    let read = ctx
        .body_budget
        .read(body, declared, limit, ctx.config.body_read_timeout());
    let (body, buffered) = match read.await {
        Ok(b) => b,
        Err(BufferError::NoRoom) => {
            return ctx.problem(
                Problem::new(
                    ProblemKind::StoreUnavailable,
                    "the gateway is buffering as many request bodies as it may; retry with the same key",
                )
                .retry_after(std::time::Duration::from_secs(1)),
            )
        }
        Err(BufferError::TooLarge) => return refused(request::too_large(limit)),
        Err(BufferError::TimedOut) => return refused(request::unread(ReadError::TimedOut)),
        Err(BufferError::Broken(e)) => {
            return refused(request::unread(ReadError::Broken(e)))
        }
    };
    let fingerprint = match request::fingerprint(
        &ctx.config.fingerprint,
        &parts.method,
        &parts.uri,
        &parts.headers,
        &identity.principal,
        &body,
    ) {
        Ok(f) => f,
        Err(r) => return refused(r),
    };
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    ctx.prepare_headers(&mut parts.headers, Some(&identity), peer);
    let req = KeyedRequest {
        scope: Scope::new(ctx.auth.window_tenant(&identity), key),
        principal: identity.principal,
        fingerprint,
        method: parts.method,
        path_and_query,
        headers: parts.headers,
        body,
        _buffered: buffered,
    };
    keyed::handle(ctx, req).await
}
