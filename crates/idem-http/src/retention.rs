//! Answers for keys the retention sweeper has moved on (see `idem_core::retention`).
//!
//! - **Reconstructed replay.** Past the short retry window the sweeper drops the stored
//!   response and keeps its status and result reference (the order). A duplicate then
//!   gets a response the application rebuilds from that reference
//!   ([`ReconstructResponse`]): same status, same order id, with
//!   `Idempotent-Replayed: true` and `Idempotent-Reconstructed: true`. Without a
//!   reconstructor it gets a `result-not-stored` problem naming the reference — never a
//!   second execution.
//! - **Expired key.** After the dispute window the record is archived, out of the online
//!   index, so a claim of that key proceeds as fresh. With an [`ArchiveLookup`]
//!   configured the layer checks the archive on every *fresh* claim (one indexed read,
//!   only for keys never seen online) and, on a hit, does not run the handler: it ends
//!   the claim FAILED_TERMINAL with a stored `410 idempotency-key-expired` problem, so
//!   later duplicates replay the same 410. We chose this over re-executing because a
//!   second execution is exactly the incident idem exists to prevent; the client is told
//!   where the original result is (its reference) instead.
//!
//! This module must not decide whether a claim proceeds: the store does; it only
//! answers for records the store returned.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};
use idem_core::retention::{dropped_response, ArchiveLookup, ArchivedRecord};
use idem_core::{ClaimToken, Finish, Record, RecordState, StoredResult, TenantId};

use crate::body::{full, Body};
use crate::headers::{IDEMPOTENT_RECONSTRUCTED, IDEMPOTENT_REPLAYED};
use crate::layer::Shared;
use crate::metrics::Decision;
use crate::problem::{Problem, ProblemKind, ProblemResponse, PROBLEM_JSON};

/// A response rebuilt from a result reference. The status is the stored one.
#[derive(Debug, Clone, Default)]
pub struct Reconstructed {
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Rebuilds the response of a finished request from its result reference (for example,
/// reads the order and renders it as the create endpoint did).
#[async_trait]
pub trait ReconstructResponse: Send + Sync + 'static {
    /// `Ok(None)`: the reference is unknown to the application.
    async fn reconstruct(
        &self,
        tenant: &TenantId,
        result_ref: &str,
        record: &Record,
    ) -> Result<Option<Reconstructed>, Box<dyn std::error::Error + Send + Sync>>;
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
