//! One request through the gateway: admin endpoints, authentication, the route's key
//! rule, then either the streamed pass-through or the keyed flow ([`crate::keyed`]).
//!
//! The service is infallible: every failure is a problem response. Headers bound for the
//! upstream are readied by [`crate::outbound`]: the pass-through readies them at once, a
//! keyed request only when it is forwarded.

use std::convert::Infallible;
use std::sync::Arc;

use http::header::{
    HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, COOKIE, HOST,
};
use http::{Request, Response, Version};
use http_body::Body as _;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use idem_core::Identity;
use idem_core::{IdempotencyStore as _, Scope};
use idem_http::headers::IDEMPOTENCY_KEY;
use idem_http::pipeline::request::{self, Refusal};

use crate::auth::Caller;
use crate::body::{empty, full, Body, IdleTimeout, ReadError};
use crate::buffers::BufferError;
use crate::ctx::{request_id, with_request_ids, Ctx, X_REQUEST_ID};
use crate::forward::KeyedRequest;
use crate::keyed;
use crate::outbound::{Outbound, Peer};
use crate::problem::{Problem, ProblemKind};
use crate::upstream::PassError;
use crate::upstreams::Heard;

/// The request check that reads `Connection`.
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
}

/// The hyper service function.
pub(crate) async fn serve(
    ctx: Arc<Ctx>,
    peer: Arc<Peer>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    Ok(route(ctx, peer, req).await)
}

async fn route(ctx: Arc<Ctx>, peer: Arc<Peer>, req: Request<Incoming>) -> Response<Body> {
    let id = idem_http::headers::new_request_id();
    let client = idem_core::wire::client_request_id(req.headers()).map(Arc::from);
    let mut response = with_request_ids(id.clone(), client, route_request(ctx, peer, req)).await;
    if let Ok(v) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(X_REQUEST_ID, v);
    }
    response
}

async fn route_request(ctx: Arc<Ctx>, peer: Arc<Peer>, req: Request<Incoming>) -> Response<Body> {
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
        passthrough(ctx, &peer, req, identity).await
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
    // Without API keys the upstream tenant is the caller's own partition too: an
    // upstream that keys on it never merges two callers.
    let tenant = identity.as_ref().map(|id| ctx.auth.window_tenant(id));
    let caller = tenant
        .as_ref()
        .zip(identity.as_ref().map(|id| &id.principal));
    parts.headers = ctx
        .ready_headers(
            std::mem::take(&mut parts.headers),
            caller,
            peer,
            request_id().as_deref(),
        )
        .into_map();
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
    peer: Arc<Peer>,
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
    let (parts, body) = req.into_parts();
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
    // Readied for the upstream only if it is sent: a replay never pays for it.
    let outbound = Outbound::new(parts.headers, peer, request_id());
    let req = KeyedRequest {
        scope: Scope::new(ctx.auth.window_tenant(&identity), key),
        principal: identity.principal,
        fingerprint,
        method: parts.method,
        uri: parts.uri,
        body,
        _buffered: buffered,
    };
    keyed::handle(ctx, req, outbound).await
}
