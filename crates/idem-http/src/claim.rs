//! From a request to a claim decision: who is calling, which key, the buffered body and
//! its fingerprint, then the store's answer — execute, replay, in progress (409 or wait),
//! mismatch, or unavailable.
//!
//! Owns the order of the checks (authentication, key, body size, a body the fingerprint
//! refuses, claim) and which way each answer of the store goes; the answers the handler
//! does not write are [`crate::answer`]'s, the claim-and-wait loop itself is
//! [`crate::pipeline::claim`]. Nothing is recorded before the claim, and the handler is never called before
//! a claim proceeded (except on routes configured to ignore keys, or to fail open when
//! the store is down). Running the handler under a claim is [`crate::execute`].

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::request::Parts;
use http::{Request, Response, Uri};
use idem_core::{
    BodyError, ClaimKind, ClaimRequest, Fingerprint, IdempotencyKey, KeyRule, RequestParts, Scope,
};
use tower::Service;

use crate::answer::{answer, check_archive, store_failed};
use crate::auth::Identity;
use crate::body::{boxed, declared_too_large, read_limited, Body, BoxError, ReadError};
use crate::config::{ClaimMode, ResolvedRules, StoreUnavailableMode};
use crate::headers::{read_key, KeyHeaderError};
use crate::metrics::Decision;
use crate::pipeline::{self, Turn};
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
    S: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    ReqB: http_body::Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ResB: http_body::Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    let uri = target(&request).clone();
    let (parts, body) = request.into_parts();
    let metrics = &shared.metrics;

    // Who is calling decides the tenant; nothing the client sets freely does.
    let identity = match shared.auth.authenticate(&parts).await {
        Ok(identity) => identity,
        Err(refused) => {
            metrics.decision(Decision::Unauthenticated);
            return Problem::new(ProblemKind::Unauthenticated, refused.detail)
                .challenge(refused.challenge)
                .response();
        }
    };
    let key = match read_key(&parts.headers) {
        Ok(key) => key,
        Err(KeyHeaderError::Missing) => {
            debug_assert_eq!(rules.key, KeyRule::Required);
            metrics.decision(Decision::MissingKey);
            return Problem::new(
                ProblemKind::MissingKey,
                format!(
                    "{} {} requires an Idempotency-Key header, fixed by the client \
                     before the first send and reused on every retry",
                    parts.method,
                    uri.path()
                ),
            )
            .response();
        }
        Err(invalid) => {
            metrics.decision(Decision::InvalidKey);
            return Problem::new(ProblemKind::InvalidKey, invalid.to_string()).response();
        }
    };

    match shared.arrivals.clone() {
        None => keyed(shared, inner, parts, body, uri, identity, key, rules).await,
        Some(sink) => {
            let scope = Scope::new(identity.tenant.clone(), key.clone());
            let principal = identity.principal.clone();
            let answer = keyed(shared, inner, parts, body, uri, identity, key, rules);
            crate::arrivals::observe(&sink, scope, principal, answer).await
        }
    }
}

/// The rest of [`serve`] once the caller and the key are known.
#[allow(clippy::too_many_arguments)]
async fn keyed<S, ReqB, ResB>(
    shared: Arc<Shared>,
    inner: S,
    mut parts: Parts,
    body: ReqB,
    uri: Uri,
    identity: Identity,
    key: IdempotencyKey,
    rules: ResolvedRules,
) -> Response<Body>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    ReqB: http_body::Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ResB: http_body::Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    let metrics = &shared.metrics;
    let body = match read_body(&parts, body, shared.config.max_request_body).await {
        Ok(body) => body,
        Err(problem) => {
            metrics.decision(if problem.kind == ProblemKind::RequestTooLarge {
                Decision::TooLarge
            } else {
                Decision::UnreadableBody
            });
            return problem.response();
        }
    };
    let fingerprint = match fingerprint(&shared, &parts, &uri, &identity, &body) {
        Ok(fingerprint) => fingerprint,
        Err(refused) => {
            metrics.decision(Decision::DuplicateMember);
            return Problem::new(ProblemKind::DuplicateJsonMember, refused.to_string()).response();
        }
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
    decide(shared, inner, parts, body, claim_request, rules).await
}

/// Claims the key and acts on the store's answer (see the module docs).
async fn decide<S, ReqB, ResB>(
    shared: Arc<Shared>,
    inner: S,
    parts: Parts,
    body: Bytes,
    claim_request: ClaimRequest,
    rules: ResolvedRules,
) -> Response<Body>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    ReqB: From<Bytes> + Send + 'static,
    ResB: http_body::Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    let metrics = &shared.metrics;
    // With an archive the key must be claimed before it is looked up there (a record
    // swept to the archive in between would look fresh to the handler's claim): such a
    // layer claims ahead on every route.
    if rules.claim == ClaimMode::InTransaction && shared.archive.is_none() {
        return crate::execute::execute_in_transaction(
            shared.clone(),
            inner,
            parts,
            body,
            claim_request,
            rules,
        )
        .await;
    }
    let claimed = pipeline::claim(
        shared.store.as_ref(),
        &shared.wakeups,
        &claim_request,
        rules.in_progress,
        &shared.executions,
    )
    .await;
    let scope = &claim_request.scope;
    match claimed.map(|c| (c.turn, c.waited)) {
        Ok((Turn::Proceed(token), _)) => {
            if let (ClaimKind::Fresh, Some(archive)) = (&token.kind, &shared.archive) {
                if let Some(answer) = check_archive(&shared, archive, &token).await {
                    return answer;
                }
            }
            crate::execute::execute(shared.clone(), inner, parts, body, token).await
        }
        Ok((turn, waited)) => answer(&shared, turn, waited, &rules).await,
        Err(e)
            if e.is_unavailable()
                && rules.on_store_unavailable == StoreUnavailableMode::FailOpen =>
        {
            tracing::warn!(error = %e, %scope, "idempotency store unavailable; failing open");
            metrics.decision(Decision::Bypassed);
            let request = Request::from_parts(parts, ReqB::from(body));
            pass_through(inner, request).await
        }
        Err(e) => store_failed(&shared, &e, scope),
    }
}

/// Buffers the body up to `limit` bytes; 413 beyond it, before anything is recorded.
async fn read_body<B>(parts: &Parts, body: B, limit: usize) -> Result<Bytes, Problem>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let too_large = || {
        Problem::new(
            ProblemKind::RequestTooLarge,
            format!("the body is larger than {limit} bytes; nothing was recorded"),
        )
    };
    if declared_too_large(&parts.headers, limit) {
        return Err(too_large());
    }
    // No time limit here: the server in front bounds how long a body may take.
    match read_limited(body, limit, Duration::MAX).await {
        Ok(bytes) => Ok(bytes),
        Err(ReadError::TooLarge { .. }) => Err(too_large()),
        Err(ReadError::TimedOut) => Err(Problem::new(
            ProblemKind::RequestTimeout,
            "the request body was not received in time; nothing was recorded",
        )),
        Err(ReadError::Broken(e)) => {
            // The cause may name addresses or OS errors: log it, answer plainly.
            tracing::warn!(error = %e, "reading a keyed request body failed");
            Err(Problem::new(
                ProblemKind::UnreadableBody,
                "the request body could not be read",
            ))
        }
    }
}

fn fingerprint(
    shared: &Shared,
    parts: &Parts,
    uri: &Uri,
    identity: &Identity,
    body: &[u8],
) -> Result<Fingerprint, BodyError> {
    let fingerprinter = &shared.config.fingerprint;
    let headers: Vec<(&str, &str)> = if fingerprinter.headers.is_empty() {
        Vec::new()
    } else {
        parts
            .headers
            .iter()
            .filter(|(name, _)| {
                fingerprinter
                    .headers
                    .iter()
                    .any(|wanted| wanted.eq_ignore_ascii_case(name.as_str()))
            })
            .filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?)))
            .collect()
    };
    // The concrete target, not the route template: a key binds one resource.
    fingerprinter.try_fingerprint(&RequestParts {
        method: parts.method.as_str(),
        path: uri.path(),
        query: uri.query(),
        principal: identity.principal.as_str(),
        content_type: parts
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
        body,
        headers: &headers,
    })
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
