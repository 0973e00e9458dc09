//! From a request to a claim decision: which rules apply, who is calling, which key,
//! the buffered body and its fingerprint, then the store's answer — execute, replay,
//! in progress (409 or wait), mismatch, or unavailable.
//!
//! Owns the order of the checks (authentication, key, body size, claim) and the wait
//! loop. Nothing is recorded before the claim, and the handler is never called before
//! a claim proceeded (except on routes configured to ignore keys, or to fail open when
//! the store is down). Running the handler under a claim is [`crate::execute`].

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{MatchedPath, OriginalUri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::request::Parts;
use http::Request;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idem_core::{Claim, ClaimKind, ClaimRequest, Fingerprint, RequestParts, Scope};
use tokio::time::Instant;
use tower::Service;
use tracing::Instrument;

use crate::auth::Identity;
use crate::config::{InProgressMode, KeyRequirement, StoreUnavailableMode};
use crate::headers::{read_key, KeyHeaderError, IDEMPOTENCY_KEY};
use crate::layer::{BoxError, Shared};
use crate::metrics::Decision;
use crate::problem::{Problem, ProblemKind};

/// Serves one request through the layer.
pub(crate) async fn serve<S, B>(shared: Arc<Shared>, inner: S, request: Request<Body>) -> Response
where
    S: Service<Request<Body>, Response = http::Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let (mut parts, body) = request.into_parts();
    let route = parts
        .extensions
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_else(|| parts.uri.path().to_owned());
    let rules = shared.config.resolve(&parts.method, &route);
    match rules.key {
        KeyRequirement::Ignored => {
            return pass_through(inner, Request::from_parts(parts, body)).await;
        }
        KeyRequirement::Optional if !parts.headers.contains_key(IDEMPOTENCY_KEY) => {
            return pass_through(inner, Request::from_parts(parts, body)).await;
        }
        KeyRequirement::Optional | KeyRequirement::Required => {}
    }
    let metrics = &shared.metrics;

    // Who is calling decides the tenant; nothing the client sets freely does.
    let identity = match shared.auth.authenticate(&parts).await {
        Ok(identity) => identity,
        Err(refused) => {
            metrics.decision(Decision::Unauthenticated);
            return Problem::new(ProblemKind::Unauthenticated, refused.detail)
                .challenge(refused.challenge)
                .into_response();
        }
    };
    let key = match read_key(&parts.headers) {
        Ok(key) => key,
        Err(KeyHeaderError::Missing) => {
            metrics.decision(Decision::MissingKey);
            return Problem::new(
                ProblemKind::MissingKey,
                format!(
                    "{} {route} requires an Idempotency-Key header, fixed by the client \
                     before the first send and reused on every retry",
                    parts.method
                ),
            )
            .into_response();
        }
        Err(invalid) => {
            metrics.decision(Decision::InvalidKey);
            return Problem::new(ProblemKind::InvalidKey, invalid.to_string()).into_response();
        }
    };

    let body = match read_body(&parts, body, shared.config.max_request_body).await {
        Ok(body) => body,
        Err(problem) => {
            metrics.decision(if problem.kind == ProblemKind::RequestTooLarge {
                Decision::TooLarge
            } else {
                Decision::UnreadableBody
            });
            return problem.into_response();
        }
    };
    let fingerprint = fingerprint(&shared, &parts, &identity, &body);
    let claim_request = ClaimRequest {
        scope: Scope::new(identity.tenant.clone(), key),
        principal: identity.principal.clone(),
        fingerprint,
        owner: shared.owners.next(),
        lease: shared.config.lease,
    };
    parts.extensions.insert(identity);

    // From the claim on, the decision runs in a task of its own: a client that hangs
    // up while the claim is being written (or before the handler's task starts) must
    // not leave a PROCESSING record behind for its whole lease.
    let decision = tokio::spawn(
        decide(shared, inner, parts, body, claim_request, rules, route)
            .instrument(tracing::Span::current()),
    );
    match decision.await {
        Ok(response) => response,
        Err(e) => {
            tracing::error!(error = %e, "the claim task failed");
            Problem::new(ProblemKind::ExecutionFailed, "the request failed").into_response()
        }
    }
}

/// Claims the key and acts on the store's answer (see the module docs).
async fn decide<S, B>(
    shared: Arc<Shared>,
    inner: S,
    parts: Parts,
    body: Bytes,
    claim_request: ClaimRequest,
    rules: crate::config::ResolvedRules,
    route: String,
) -> Response
where
    S: Service<Request<Body>, Response = http::Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let metrics = &shared.metrics;
    let mut waiting: Option<(Instant, crate::completion::Subscription)> = None;
    loop {
        match shared.store.claim(&claim_request).await {
            Ok(Claim::Proceed(token)) => {
                drop(waiting);
                if let (ClaimKind::Fresh, Some(archive)) = (&token.kind, &shared.archive) {
                    if let Some(answer) =
                        crate::retention::check_archive(&shared, archive, &token).await
                    {
                        return answer;
                    }
                }
                return crate::execute::execute(shared.clone(), inner, parts, body, token).await;
            }
            Ok(Claim::Replay(record)) => {
                metrics.decision(Decision::Replayed);
                if crate::retention::is_dropped(&record) {
                    return crate::retention::replay_dropped(&shared, &record).await;
                }
                return shared.capture.replay(&record).unwrap_or_else(|| {
                    Problem::new(
                        ProblemKind::ResultNotStored,
                        format!(
                            "the request with this key ended {} without a stored response",
                            record.state
                        ),
                    )
                    .into_response()
                });
            }
            Ok(Claim::Mismatch { .. }) => {
                metrics.decision(Decision::Mismatch);
                return Problem::new(
                    ProblemKind::KeyReused,
                    "this Idempotency-Key was first used with a different request (body, \
                     path, query, method, principal or fingerprinted headers); use a new \
                     key for a new intent",
                )
                .into_response();
            }
            Ok(Claim::InProgress {
                lease_expires_at,
                now,
                ..
            }) => {
                let max_wait = match rules.in_progress {
                    InProgressMode::Reject { retry_after } => {
                        metrics.decision(Decision::InProgress);
                        return in_progress(retry_after);
                    }
                    InProgressMode::Wait { max_wait } => max_wait,
                };
                let signals = &shared.signals;
                let scope = &claim_request.scope;
                let Some((deadline, subscription)) = waiting.as_mut() else {
                    // Subscribe, then claim again: a finish between the first claim and
                    // the subscription is then seen by the second claim.
                    waiting = Some((Instant::now() + max_wait, signals.subscribe(scope)));
                    continue;
                };
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    metrics.decision(Decision::InProgress);
                    return in_progress(Duration::from_secs(1));
                }
                // Woken by this process finishing the claim, or at the owner's lease
                // deadline (an owner elsewhere may have died: the claim then takes over).
                let until_lease = Duration::from_millis((lease_expires_at - now).max(0) as u64 + 1);
                let _ = tokio::time::timeout(left.min(until_lease), subscription.finished()).await;
                // A fired subscription stays fired: renew it before the next claim.
                *subscription = signals.subscribe(scope);
            }
            Err(e) if e.is_unavailable() => {
                if rules.on_store_unavailable == StoreUnavailableMode::FailOpen {
                    tracing::warn!(error = %e, route, "idempotency store unavailable; failing open");
                    metrics.decision(Decision::Bypassed);
                    let request = Request::from_parts(parts, Body::from(body));
                    return pass_through(inner, request).await;
                }
                tracing::warn!(error = %e, route, "idempotency store unavailable; failing closed");
                metrics.decision(Decision::Unavailable);
                return Problem::new(
                    ProblemKind::StoreUnavailable,
                    "the request was not executed; retry with the same key",
                )
                .retry_after(shared.config.store_unavailable_retry_after)
                .into_response();
            }
            Err(e) => {
                tracing::error!(error = %e, route, "idempotency store error");
                metrics.decision(Decision::StoreError);
                return Problem::new(
                    ProblemKind::StoreError,
                    "the request was not executed; the idempotency store answered with an error",
                )
                .into_response();
            }
        }
    }
}

fn in_progress(retry_after: Duration) -> Response {
    Problem::new(
        ProblemKind::RequestInProgress,
        "the first request with this key has not finished; retry later with the same key \
         to get its result",
    )
    .retry_after(retry_after)
    .into_response()
}

/// Buffers the body up to `limit` bytes; 413 beyond it, before anything is recorded.
async fn read_body(parts: &Parts, body: Body, limit: usize) -> Result<Bytes, Problem> {
    let too_large = || {
        Problem::new(
            ProblemKind::RequestTooLarge,
            format!("the body is larger than {limit} bytes; nothing was recorded"),
        )
    };
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(too_large());
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large()),
        Err(e) => {
            // The cause may name addresses or OS errors: log it, answer plainly.
            tracing::warn!(error = %e, "reading a keyed request body failed");
            Err(Problem::new(
                ProblemKind::UnreadableBody,
                "the request body could not be read",
            ))
        }
    }
}

fn fingerprint(shared: &Shared, parts: &Parts, identity: &Identity, body: &[u8]) -> Fingerprint {
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
    // The concrete target, not the route template: a key binds one resource. A nested
    // router strips its prefix from `parts.uri`; the original URI still has it.
    let uri = parts
        .extensions
        .get::<OriginalUri>()
        .map_or(&parts.uri, |original| &original.0);
    fingerprinter.fingerprint(&RequestParts {
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
pub(crate) async fn pass_through<S, B>(mut inner: S, request: Request<Body>) -> Response
where
    S: Service<Request<Body>, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    match inner.call(request).await {
        Ok(response) => response.map(Body::new),
        Err(e) => {
            let e: BoxError = e.into();
            tracing::error!(error = %e, "the inner service failed");
            Problem::new(ProblemKind::ExecutionFailed, "the request failed").into_response()
        }
    }
}
