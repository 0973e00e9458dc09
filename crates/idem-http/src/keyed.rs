//! One keyed request through the layer: who is calling, then the pipeline's steps —
//! key, bounded body, fingerprint ([`crate::pipeline::request`]), claim and run
//! ([`crate::pipeline::Pipeline`], with the inner service as its [`Execution`](crate::pipeline::Execution))
//! — and the answer ([`crate::answer`]).
//!
//! Owns the layer's own pieces around the pipeline: authentication, the application's
//! arrival sink, the in-transaction claim mode and failing open when the store is down.
//! Nothing is recorded before the claim, and the handler is never called before a
//! claim proceeded (except on routes configured to ignore keys, or to fail open when
//! the store is down, or to claim in the handler's own transaction).

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response, Uri};
use idem_core::{ClaimRequest, Scope};
use tower::Service;

use crate::answer::{refuse, respond, store_failed};
use crate::body::{boxed, read_limited, Body, BoxError};
use crate::config::{ClaimMode, ResolvedRules, StoreUnavailableMode};
use crate::decision::Decision;
use crate::execute::{Handler, Inner, ResponseBody};
use crate::pipeline::request::{self, Refusal};
use crate::problem::{inner_failed, Problem, ProblemKind, ProblemResponse};
use crate::shared::Shared;

/// The request's target as the client sent it. A nested axum router strips its prefix
/// from the request's URI; the original URI still has it, and a key binds the resource
/// the client named.
pub(crate) fn target<B>(request: &Request<B>) -> &Uri {
    #[cfg(feature = "axum")]
    if let Some(original) = request.extensions().get::<axum::extract::OriginalUri>() {
        return &original.0;
    }
    request.uri()
}

/// Serves one request that needs a claim (see [`crate::layer`]), in a task of its own.
pub(crate) async fn serve<S, ReqB, ResB>(
    shared: Arc<Shared>,
    inner: S,
    request: Request<ReqB>,
    rules: ResolvedRules,
) -> Response<Body>
where
    S: Inner<ReqB, ResB>,
    ReqB: http_body::Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ResB: ResponseBody,
{
    let uri = target(&request).clone();
    let (mut parts, body) = request.into_parts();

    // Who is calling decides the tenant; nothing the client sets freely does.
    let identity = match shared.auth.authenticate(&parts).await {
        Ok(identity) => identity,
        Err(refused) => {
            shared.metrics.decision(Decision::Unauthenticated);
            return Problem::new(ProblemKind::Unauthenticated, refused.detail)
                .challenge(refused.challenge)
                .response();
        }
    };
    let key = match request::key(&parts.headers, &parts.method, uri.path()) {
        Ok(key) => key,
        Err(refusal) => return refuse(&shared, refusal),
    };
    // From here the arrival is observed (when the application takes arrivals).
    let arrival = shared.arrivals.clone().map(|sink| {
        let scope = Scope::new(identity.tenant.clone(), key.clone());
        (sink, scope, identity.principal.clone())
    });
    // Boxed, and its rare paths within it: the task holds this request's state by
    // pointer, and what a path never taken would need is not copied with it.
    let answer = Box::pin(async move {
        let body = match read_body(&parts, body, shared.config.max_request_body).await {
            Ok(body) => body,
            Err(refusal) => return refuse(&shared, refusal),
        };
        let fingerprint = match request::fingerprint(
            &shared.config.fingerprint,
            &parts.method,
            &uri,
            &parts.headers,
            &identity.principal,
            &body,
        ) {
            Ok(fingerprint) => fingerprint,
            Err(refusal) => return refuse(&shared, refusal),
        };
        let span = tracing::Span::current();
        span.record("tenant", identity.tenant.as_str());
        span.record("key", key.as_str());
        let claim_request = ClaimRequest {
            scope: Scope::new(identity.tenant.clone(), key),
            principal: identity.principal.clone(),
            fingerprint,
            owner: shared.owners.next(),
            lease: shared.config.lease,
        };
        parts.extensions.insert(identity);
        // With an archive the key must be claimed before it is looked up there (a
        // record swept to the archive in between would look fresh to the handler's
        // claim): such a layer claims ahead on every route.
        if rules.claim == ClaimMode::InTransaction && shared.archive.is_none() {
            return Box::pin(crate::execute::in_transaction(
                shared.clone(),
                inner,
                parts,
                body,
                claim_request,
                rules,
            ))
            .await;
        }
        let handler = Handler {
            shared: shared.clone(),
            inner,
            parts,
            body,
            bodies: PhantomData,
        };
        let scope = &claim_request.scope;
        match shared.pipeline(&rules).run(&claim_request, handler).await {
            Ok(answered) => respond(&shared, answered.answer).await,
            Err((e, handler))
                if e.is_unavailable()
                    && rules.on_store_unavailable == StoreUnavailableMode::FailOpen =>
            {
                tracing::warn!(error = %e, %scope, "idempotency store unavailable; failing open");
                shared.metrics.decision(Decision::Bypassed);
                let request = Request::from_parts(handler.parts, ReqB::from(handler.body));
                Box::pin(pass_through(handler.inner, request)).await
            }
            Err((e, _)) => store_failed(&shared, &e, scope),
        }
    });
    match arrival {
        None => answer.await,
        Some((sink, scope, principal)) => {
            crate::arrivals::observe(&sink, scope, principal, answer).await
        }
    }
}

/// Buffers the body up to `limit` bytes; 413 beyond it, before anything is recorded.
async fn read_body<B>(parts: &Parts, body: B, limit: usize) -> Result<Bytes, Refusal>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    request::declared_body(&parts.headers, limit)?;
    // No time limit here: the server in front bounds how long a body may take.
    read_limited(body, limit, Duration::MAX)
        .await
        .map_err(request::unread)
}

/// Calls the inner service without any idempotency handling.
pub(crate) async fn pass_through<S, ReqB, ResB>(
    mut inner: S,
    request: Request<ReqB>,
) -> Response<Body>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
    ResB: http_body::Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    match inner.call(request).await {
        Ok(response) => response.map(boxed),
        Err(e) => inner_failed(e.into()),
    }
}
