//! How the layer renders the pipeline's answers: a run's response (with
//! `Idempotency-Expires`, counting the execution), a replay — stored, or rebuilt past
//! retention — a refusal, a store that failed (fail closed), and the archive's answer
//! to a fresh claim of an expired key (410).
//!
//! Owns those responses and what each counts as. It must not claim or run anything:
//! [`crate::keyed`] and [`crate::execute`] decide when an answer is due.

use std::sync::Arc;

use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};
use idem_core::retention::{dropped_response, ArchiveLookup, ArchivedRecord};
use idem_core::{ClaimToken, Finish, Record, RecordState, Scope, StoreError, StoredResult};

use crate::body::{full, Body};
use crate::decision::Decision;
use crate::headers::{IDEMPOTENCY_EXPIRES, IDEMPOTENT_RECONSTRUCTED, IDEMPOTENT_REPLAYED};
use crate::metrics::ExecutionOutcome;
use crate::pipeline::{self, Answer, Ending, Executed, FinishedBy, NotFinished, Refusal, Settled};
use crate::problem::{Problem, ProblemKind, ProblemResponse, PROBLEM_JSON};
use crate::shared::Shared;

/// What a run under a claim answers: the response and, when the handler ran, how it
/// counts (`None` for the archive's answers, which ran nothing).
pub(crate) struct Handled {
    pub response: Response<Body>,
    pub outcome: Option<ExecutionOutcome>,
}

/// The response for the pipeline's answer.
pub(crate) async fn respond(shared: &Shared, answer: Answer<Handled>) -> Response<Body> {
    match answer {
        Answer::Fresh(executed) => fresh(shared, executed),
        Answer::Replay(record) => {
            shared.metrics.decision(Decision::Replayed);
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
        Answer::Refused(decision, problem) => refuse(shared, (decision, problem)),
    }
}

/// A refusal, counted.
pub(crate) fn refuse(shared: &Shared, (decision, problem): Refusal) -> Response<Body> {
    shared.metrics.decision(decision);
    problem.response()
}

/// The run's response once its record ended, the execution counted: as the run said
/// when the pipeline wrote the record, by the record's state when the handler did.
fn fresh(shared: &Shared, executed: Executed<Handled>) -> Response<Body> {
    let Handled { response, outcome } = executed.output;
    let Some(outcome) = outcome else {
        return response;
    };
    match executed.finished {
        Ok(Some((record, by))) => {
            let outcome = match by {
                FinishedBy::Pipeline => outcome,
                FinishedBy::Handler => ExecutionOutcome::of(record.state),
            };
            shared.metrics.execution(outcome, by);
            with_expiry(shared, response, &record)
        }
        // Withdrawn: the layer's policy reads every record it finishes back.
        Ok(None) => response,
        Err(NotFinished::Lost) => {
            tracing::warn!("claim lost before it was finished");
            shared.metrics.finish_error();
            response
        }
        Err(NotFinished::Failed(e)) => {
            tracing::error!(error = %e, "could not finish the claim");
            shared.metrics.finish_error();
            response
        }
    }
}

/// Adds `Idempotency-Expires` for a record that reached a final state.
pub(crate) fn with_expiry(
    shared: &Shared,
    mut response: Response<Body>,
    record: &Record,
) -> Response<Body> {
    if let Some(completed_at) = record.completed_at.filter(|_| record.state.is_terminal()) {
        response.headers_mut().insert(
            IDEMPOTENCY_EXPIRES,
            shared.capture.expires_header(completed_at),
        );
    }
    response
}

/// The answer when the store failed: fail closed.
pub(crate) fn store_failed(shared: &Shared, e: &StoreError, scope: &Scope) -> Response<Body> {
    if e.is_unavailable() {
        tracing::warn!(error = %e, %scope, "idempotency store unavailable; failing closed");
    } else {
        tracing::error!(error = %e, %scope, "idempotency store error");
    }
    refuse(shared, unavailable(shared, e, "the idempotency store"))
}

/// The refusal for a store (or archive) that failed: 503 for an outage, 500 otherwise.
fn unavailable(shared: &Shared, e: &StoreError, what: &str) -> Refusal {
    if e.is_unavailable() {
        return (
            Decision::Unavailable,
            Problem::new(
                ProblemKind::StoreUnavailable,
                "the request was not executed; retry with the same key",
            )
            .retry_after(shared.config.store_unavailable_retry_after),
        );
    }
    (
        Decision::StoreError,
        Problem::new(
            ProblemKind::StoreError,
            format!("the request was not executed; {what} answered with an error"),
        ),
    )
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

/// Checks the archive for a fresh claim; `Some` when the key expired (the claim is
/// then finished FAILED_TERMINAL with the 410) or the check could not be made (the claim
/// is released for a retry).
pub(crate) async fn check_archive(
    shared: &Shared,
    archive: &Arc<dyn ArchiveLookup>,
    token: &ClaimToken,
) -> Option<Settled<Handled>> {
    let answered = |(decision, problem): Refusal, ending| {
        shared.metrics.decision(decision);
        Some(Settled {
            output: Handled {
                response: problem.response(),
                outcome: None,
            },
            ending,
        })
    };
    let found = match archive
        .archived(&token.scope.tenant, &token.scope.key)
        .await
    {
        Ok(None) => return None,
        Ok(Some(found)) => found,
        Err(e) => {
            // Fail closed: without knowing, executing could be a second execution.
            tracing::warn!(scope = %token.scope, error = %e, "archive lookup failed");
            let refusal = unavailable(shared, &e, "the archive lookup");
            return answered(refusal, Ending::Finish(pipeline::retryable()));
        }
    };
    let problem = expired_problem(&found);
    let stored = StoredResult {
        status: problem.kind.status().as_u16(),
        headers: vec![(CONTENT_TYPE.as_str().to_owned(), PROBLEM_JSON.to_owned())],
        body: problem.body(),
        result_ref: found.result_ref.clone(),
    };
    let finish = Finish {
        state: RecordState::FailedTerminal,
        result: Some(stored),
    };
    answered((Decision::KeyExpired, problem), Ending::Finish(finish))
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
