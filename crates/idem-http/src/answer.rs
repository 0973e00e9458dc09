//! The answers the layer gives without running the handler: to a claim that did not
//! proceed (a replay — stored, or rebuilt past retention — a mismatch, in progress), to
//! a fresh claim of an archived key (410), and to a store that failed (fail closed).
//!
//! Owns those answers and what each counts as. It must not claim or run anything:
//! [`crate::claim`] and [`crate::execute`] decide when an answer is due.

use std::sync::Arc;
use std::time::Duration;

use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};
use idem_core::retention::{dropped_response, ArchiveLookup, ArchivedRecord};
use idem_core::{ClaimToken, Finish, Record, RecordState, Scope, StoredResult};

use crate::body::{full, Body};
use crate::config::{InProgressMode, ResolvedRules};
use crate::headers::{IDEMPOTENT_RECONSTRUCTED, IDEMPOTENT_REPLAYED};
use crate::metrics::Decision;
use crate::pipeline::Turn;
use crate::problem::{Problem, ProblemKind, ProblemResponse, PROBLEM_JSON};
use crate::shared::Shared;

/// The answer to a claim that did not proceed: a replay, a mismatch or in progress.
pub(crate) async fn answer(
    shared: &Shared,
    turn: Turn,
    waited: bool,
    rules: &ResolvedRules,
) -> Response<Body> {
    let metrics = &shared.metrics;
    match turn {
        Turn::Replay(record) => {
            metrics.decision(Decision::Replayed);
            if is_dropped(&record) {
                return replay_dropped(shared, &record).await;
            }
            shared.capture.replay(&record).unwrap_or_else(|| {
                Problem::new(
                    ProblemKind::ResultNotStored,
                    format!(
                        "the request with this key ended {} without a stored response",
                        record.state
                    ),
                )
                .response()
            })
        }
        Turn::Mismatch => {
            metrics.decision(Decision::Mismatch);
            Problem::new(
                ProblemKind::KeyReused,
                "this Idempotency-Key was first used with a different request (body, \
                 path, query, method, principal or fingerprinted headers); use a new \
                 key for a new intent",
            )
            .response()
        }
        Turn::InProgress { .. } => {
            metrics.decision(Decision::InProgress);
            let retry_after = match rules.in_progress {
                InProgressMode::Reject { retry_after } if !waited => retry_after,
                _ => Duration::from_secs(1),
            };
            in_progress(retry_after)
        }
        Turn::Proceed(token) => {
            // Callers act on a claim that proceeded themselves.
            tracing::error!(scope = %token.scope, "a claim that proceeded reached the answer path");
            metrics.decision(Decision::StoreError);
            Problem::new(
                ProblemKind::StoreError,
                "the request was not executed; retry with the same key",
            )
            .response()
        }
    }
}

/// The answer when the store failed: fail closed.
pub(crate) fn store_failed(
    shared: &Shared,
    e: &idem_core::StoreError,
    scope: &Scope,
) -> Response<Body> {
    let metrics = &shared.metrics;
    if e.is_unavailable() {
        tracing::warn!(error = %e, %scope, "idempotency store unavailable; failing closed");
        metrics.decision(Decision::Unavailable);
        return Problem::new(
            ProblemKind::StoreUnavailable,
            "the request was not executed; retry with the same key",
        )
        .retry_after(shared.config.store_unavailable_retry_after)
        .response();
    }
    tracing::error!(error = %e, %scope, "idempotency store error");
    metrics.decision(Decision::StoreError);
    Problem::new(
        ProblemKind::StoreError,
        "the request was not executed; the idempotency store answered with an error",
    )
    .response()
}

fn in_progress(retry_after: Duration) -> Response<Body> {
    Problem::new(
        ProblemKind::RequestInProgress,
        "the first request with this key has not finished; retry later with the same key \
         to get its result",
    )
    .retry_after(retry_after)
    .response()
}

/// Whether a replayed record's response was dropped by the sweeper.
pub(crate) fn is_dropped(record: &Record) -> bool {
    record.result.as_ref().and_then(dropped_response).is_some()
}

/// The replay of a record whose response was dropped.
pub(crate) async fn replay_dropped(shared: &Shared, record: &Record) -> Response<Body> {
    let result = record.result.as_ref();
    let status = result.map_or(200, |r| r.status);
    let Some(result_ref) = result.and_then(|r| r.result_ref.as_deref()) else {
        return Problem::new(
            ProblemKind::ResultNotStored,
            format!(
                "the request with this key ended {} (status {status}); its stored response \
                 was dropped by retention and it has no result reference to rebuild it from",
                record.state
            ),
        )
        .response();
    };
    let rebuilt = match &shared.reconstruct {
        Some(r) => r.reconstruct(&record.tenant, result_ref, record).await,
        None => Ok(None),
    };
    match rebuilt {
        Ok(Some(rebuilt)) => {
            let mut response = Response::new(full(rebuilt.body));
            *response.status_mut() =
                StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            *response.headers_mut() = rebuilt.headers;
            let headers = response.headers_mut();
            headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            headers.insert(IDEMPOTENT_RECONSTRUCTED, HeaderValue::from_static("true"));
            response
        }
        Ok(None) => Problem::new(
            ProblemKind::ResultNotStored,
            format!(
                "the request with this key ended {} (status {status}) with result \
                 {result_ref}; its stored response was dropped by retention and could not be \
                 rebuilt",
                record.state
            ),
        )
        .response(),
        Err(e) => {
            tracing::error!(scope = %record.tenant, error = %e, result_ref, "reconstruction failed");
            Problem::new(
                ProblemKind::ResultNotStored,
                format!(
                    "the request with this key ended {} with result {result_ref}; rebuilding \
                     its response failed, retry later with the same key",
                    record.state
                ),
            )
            .response()
        }
    }
}

/// Checks the archive for a fresh claim; `Some(response)` when the key expired (the
/// claim is then finished FAILED_TERMINAL) or the check could not be made (the claim is
/// released for a retry).
pub(crate) async fn check_archive(
    shared: &Shared,
    archive: &Arc<dyn ArchiveLookup>,
    token: &ClaimToken,
) -> Option<Response<Body>> {
    let found = match archive
        .archived(&token.scope.tenant, &token.scope.key)
        .await
    {
        Ok(None) => return None,
        Ok(Some(found)) => found,
        Err(e) => {
            // Fail closed: without knowing, executing could be a second execution.
            tracing::warn!(scope = %token.scope, error = %e, "archive lookup failed");
            if let Err(e) = shared.store.fail(token, true, None).await {
                tracing::error!(scope = %token.scope, error = %e, "could not release the claim");
                shared.metrics.finish_error();
            }
            shared.wakeups.wake(&token.scope);
            shared.metrics.decision(if e.is_unavailable() {
                Decision::Unavailable
            } else {
                Decision::StoreError
            });
            let problem = if e.is_unavailable() {
                Problem::new(
                    ProblemKind::StoreUnavailable,
                    "the request was not executed; retry with the same key",
                )
                .retry_after(shared.config.store_unavailable_retry_after)
            } else {
                Problem::new(
                    ProblemKind::StoreError,
                    "the request was not executed; the archive lookup answered with an error",
                )
            };
            return Some(problem.response());
        }
    };
    shared.metrics.decision(Decision::KeyExpired);
    let problem = expired_problem(&found);
    let body = problem.body();
    let stored = StoredResult {
        status: problem.kind.status().as_u16(),
        headers: vec![(CONTENT_TYPE.as_str().to_owned(), PROBLEM_JSON.to_owned())],
        body: body.clone(),
        result_ref: found.result_ref.clone(),
    };
    let finish = Finish {
        state: RecordState::FailedTerminal,
        result: Some(stored),
    };
    if let Err(e) = shared.store.finish(token, finish).await {
        tracing::error!(scope = %token.scope, error = %e, "could not record the expired key");
        shared.metrics.finish_error();
    }
    shared.wakeups.wake(&token.scope);
    Some(problem.response())
}

fn expired_problem(found: &ArchivedRecord) -> Problem {
    let reference = match &found.result_ref {
        Some(r) => format!("; its result was {r}"),
        None => String::new(),
    };
    Problem::new(
        ProblemKind::KeyExpired,
        format!(
            "this Idempotency-Key was used for a request that ended {}{reference}; its record \
             has passed every retention window and was archived, so the request is not \
             executed again. Use a new key for a new intent",
            found.state
        ),
    )
}
