//! Running the handler under a claim and finishing the record.
//!
//! The handler runs in its own task, so a client that disconnects (dropping the
//! response future) cannot cancel it: the record always reaches a final state. Panics
//! are caught and a configurable timeout bounds the run; both leave the record
//! FAILED_RETRYABLE, never stuck in PROCESSING. So does a shutdown that cuts running
//! executions off ([`crate::pipeline::Executions::cancel`]): the record is open for a retry at once
//! instead of after its lease. While the handler runs, the lease is renewed every
//! `lease / 3` ([`crate::pipeline::under_lease`]). The response is captured (status, chosen headers, body up
//! to a limit) and the record finished by the outcome policy — unless the handler
//! finished it in its own transaction (see [`crate::transactional`]).
//!
//! This module must not decide whether to execute: it is only called with a claim that
//! proceeded.

use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::{FutureExt, StreamExt, TryStreamExt};
use http::request::Parts;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, BodyStream, StreamBody};
use idem_core::{ClaimRequest, ClaimToken, Finish, Record, RecordState};
use tower::Service;
use tracing::Instrument;

use crate::answer::{answer, store_failed};
use crate::body::{full, Body, BoxError};
use crate::config::ResolvedRules;
use crate::headers::IDEMPOTENCY_EXPIRES;
use crate::metrics::{Decision, ExecutionOutcome, FinishedBy};
use crate::pipeline::{self, Claimed, FinishPolicy, NotFinished, Ran, Running, TooLarge, Turn};
use crate::problem::{Problem, ProblemKind, ProblemResponse};
use crate::shared::Shared;
use crate::transactional::TransactionalClaim;

/// How the handler's run ended.
enum Ended<B> {
    Responded(http::response::Parts, CapturedBody<B>),
    Failed(Failure),
}

enum Failure {
    Panicked,
    /// The inner service returned an error instead of a response.
    ServiceError(String),
    /// The response body failed while it was being read.
    BodyFailed(String),
    TimedOut,
    /// The server shut down before the handler finished.
    CutOff,
}

enum CapturedBody<B> {
    Whole(Bytes),
    /// Larger than the capture limit: the bytes read so far and the rest, still unread.
    Oversized {
        prefix: Bytes,
        rest: Pin<Box<B>>,
    },
}

/// Executes the handler for a claim that proceeded.
pub(crate) async fn execute<S, ReqB, B>(
    shared: Arc<Shared>,
    inner: S,
    mut parts: Parts,
    body: Bytes,
    token: ClaimToken,
) -> Response<Body>
where
    S: Service<Request<ReqB>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    ReqB: From<Bytes> + Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    shared.metrics.decision(Decision::Executed);
    let claim = TransactionalClaim::new(token.clone(), shared.capture.clone());
    parts.extensions.insert(claim.clone());
    let request = Request::from_parts(parts, ReqB::from(body));
    // Counted from here, so a shutdown waits for this record even if the client left.
    let running = shared.executions.start();
    let task = tokio::spawn(crate::arrivals::carry(
        run_under_claim(
            shared.clone(),
            inner,
            request,
            token.clone(),
            claim,
            running,
        )
        // The request's span (its request id), for the handler's logs too.
        .instrument(tracing::Span::current()),
    ));
    match task.await {
        Ok(response) => response,
        Err(join_error) => {
            // Handler code is guarded inside the task; only the layer's own code can end
            // up here. Leave the key open for a retry rather than stuck.
            tracing::error!(scope = %token.scope, error = %join_error, "idempotency task failed");
            if let Err(e) = shared.store.fail(&token, true, None).await {
                tracing::error!(scope = %token.scope, error = %e, "could not release the claim");
                shared.metrics.finish_error();
            }
            shared.wakeups.wake(&token.scope);
            Problem::new(
                ProblemKind::ExecutionFailed,
                "the request failed; retry with the same key",
            )
            .response()
        }
    }
}

/// Executes the handler of an in-transaction route ([`crate::ClaimMode::InTransaction`]):
/// nothing is claimed before it runs; the handler claims in its business transaction.
/// Afterwards the layer answers by what happened there: committed (the handler's
/// response), a claim that did not proceed (its replay, mismatch or in-progress answer),
/// or no committed claim at all (refused before writing, failed, lost its commit), in
/// which case the key is claimed now, as on any route, and that claim decides.
pub(crate) async fn execute_in_transaction<S, ReqB, B>(
    shared: Arc<Shared>,
    inner: S,
    mut parts: Parts,
    body: Bytes,
    req: ClaimRequest,
    rules: ResolvedRules,
) -> Response<Body>
where
    S: Service<Request<ReqB>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    ReqB: From<Bytes> + Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let claim = TransactionalClaim::deferred(req.clone(), shared.capture.clone());
    parts.extensions.insert(claim.clone());
    let request = Request::from_parts(parts, ReqB::from(body));
    let running = shared.executions.start();
    let scope = req.scope.clone();
    let task = tokio::spawn(crate::arrivals::carry(
        run_in_transaction(shared.clone(), inner, request, req, claim, rules, running)
            .instrument(tracing::Span::current()),
    ));
    match task.await {
        Ok(response) => response,
        Err(join_error) => {
            // Nothing was claimed outside the handler's transaction, which rolled back.
            tracing::error!(%scope, error = %join_error, "idempotency task failed");
            Problem::new(
                ProblemKind::ExecutionFailed,
                "the request failed; retry with the same key",
            )
            .response()
        }
    }
}

async fn run_in_transaction<S, ReqB, B>(
    shared: Arc<Shared>,
    inner: S,
    request: Request<ReqB>,
    req: ClaimRequest,
    claim: TransactionalClaim,
    rules: ResolvedRules,
    _running: Running,
) -> Response<Body>
where
    S: Service<Request<ReqB>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let ended = run_to_end(&shared, inner, request, None).await;
    let (response, finish, outcome) = settle(&shared, &req.scope, ended);
    if let Some(record) = claim.take_finished() {
        shared.metrics.decision(Decision::Executed);
        shared
            .metrics
            .execution(outcome_of(record.state), FinishedBy::Handler);
        shared.wakeups.wake(&req.scope);
        return with_expiry(&shared, response, Some(record));
    }
    match claim.take_answer().map(Turn::of) {
        // A handler that proceeded and did not commit: decided below.
        None | Some(Turn::Proceed(_)) => {}
        Some(turn) => return answer(&shared, turn, false, &rules).await,
    }
    let claimed = pipeline::claim(
        shared.store.as_ref(),
        &shared.wakeups,
        &req,
        rules.in_progress,
        &shared.executions,
    )
    .await;
    match claimed {
        Ok(Claimed {
            turn: Turn::Proceed(token),
            ..
        }) => {
            shared.metrics.decision(Decision::Executed);
            if outcome == ExecutionOutcome::Succeeded {
                // The handler answered success without committing a claim in its
                // transaction: whatever it wrote was not protected by the key.
                tracing::warn!(scope = %req.scope, "handler on an in-transaction route succeeded without claiming in its transaction");
            }
            let finished = finish_counted(&shared, &token, finish, outcome).await;
            shared.wakeups.wake(&req.scope);
            with_expiry(&shared, response, finished)
        }
        Ok(Claimed { turn, waited }) => answer(&shared, turn, waited, &rules).await,
        Err(e) => store_failed(&shared, &e, &req.scope),
    }
}

/// Adds `Idempotency-Expires` for a record that reached a final state.
fn with_expiry(
    shared: &Shared,
    mut response: Response<Body>,
    record: Option<Record>,
) -> Response<Body> {
    if let Some(completed_at) = record
        .filter(|r| r.state.is_terminal())
        .and_then(|r| r.completed_at)
    {
        response.headers_mut().insert(
            IDEMPOTENCY_EXPIRES,
            shared.capture.expires_header(completed_at),
        );
    }
    response
}

async fn run_under_claim<S, ReqB, B>(
    shared: Arc<Shared>,
    inner: S,
    request: Request<ReqB>,
    token: ClaimToken,
    claim: TransactionalClaim,
    _running: Running,
) -> Response<Body>
where
    S: Service<Request<ReqB>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let ended = run_to_end(&shared, inner, request, Some(&token)).await;
    let (response, finish, outcome) = settle(&shared, &token.scope, ended);
    let finished = match claim.take_finished() {
        Some(record) => {
            shared
                .metrics
                .execution(outcome_of(record.state), FinishedBy::Handler);
            Some(record)
        }
        None => finish_counted(&shared, &token, finish, outcome).await,
    };
    // Written before waking: a waiter either sees the record or is woken.
    shared.wakeups.wake(&token.scope);

    with_expiry(&shared, response, finished)
}

/// Runs the handler to its end: bounded by the execution timeout, renewing `lease_of`'s
/// lease meanwhile (an in-transaction claim has no committed record to renew), and cut
/// off by the shutdown.
async fn run_to_end<S, ReqB, B>(
    shared: &Shared,
    inner: S,
    request: Request<ReqB>,
    lease_of: Option<&ClaimToken>,
) -> Ended<B>
where
    S: Service<Request<ReqB>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let config = &shared.config;
    let work = tokio::time::timeout(
        config.execution_timeout,
        run_handler(inner, request, shared.capture.max_stored_body),
    );
    // Leaving the run drops the handler's future: a timed-out or cut-off handler is
    // cancelled, and an open transaction of its rolls back.
    let ran = match lease_of {
        Some(token) => {
            pipeline::under_lease(
                shared.store.as_ref(),
                token,
                config.lease,
                &shared.executions,
                work,
            )
            .await
        }
        None => pipeline::until_cut_off(&shared.executions, work).await,
    };
    match ran {
        Ran::Done(Ok(ended)) => ended,
        Ran::Done(Err(_elapsed)) => Ended::Failed(Failure::TimedOut),
        Ran::CutOff => Ended::Failed(Failure::CutOff),
    }
}

/// The response to send and how to finish the record, from how the run ended.
fn settle<B>(
    shared: &Shared,
    scope: &idem_core::Scope,
    ended: Ended<B>,
) -> (Response<Body>, Finish, ExecutionOutcome)
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let config = &shared.config;
    let capture = &shared.capture;
    match ended {
        Ended::Responded(parts, captured) => {
            let status = parts.status;
            let state = capture.classify(status);
            let (stored_body, body) = match captured {
                CapturedBody::Whole(bytes) => (Some(bytes.clone()), full(bytes)),
                CapturedBody::Oversized { prefix, rest } => (None, prefixed_body(prefix, rest)),
            };
            // A retryable outcome is not replayed, so its response is not kept.
            let result = (state != RecordState::FailedRetryable)
                .then(|| capture.stored_result(status, &parts.headers, stored_body.as_deref()));
            (
                Response::from_parts(parts, body),
                Finish { state, result },
                outcome_of(state),
            )
        }
        Ended::Failed(failure) => {
            let (kind, detail, outcome) = match failure {
                Failure::Panicked => (
                    ProblemKind::ExecutionFailed,
                    "the handler panicked; retry with the same key".to_owned(),
                    ExecutionOutcome::Panicked,
                ),
                Failure::ServiceError(e) => {
                    // The error text is for the log; clients get a stable message.
                    tracing::error!(scope = %scope, error = %e, "the handler failed");
                    (
                        ProblemKind::ExecutionFailed,
                        "the handler failed; retry with the same key".to_owned(),
                        ExecutionOutcome::FailedRetryable,
                    )
                }
                Failure::BodyFailed(e) => {
                    tracing::error!(scope = %scope, error = %e, "the response body failed");
                    (
                        ProblemKind::ExecutionFailed,
                        "the response body failed; retry with the same key".to_owned(),
                        ExecutionOutcome::FailedRetryable,
                    )
                }
                Failure::CutOff => {
                    tracing::warn!(scope = %scope, "execution cut off by the shutdown");
                    (
                        ProblemKind::ExecutionFailed,
                        "the server shut down before the request finished; retry with the \
                         same key"
                            .to_owned(),
                        ExecutionOutcome::FailedRetryable,
                    )
                }
                Failure::TimedOut => (
                    ProblemKind::ExecutionTimeout,
                    format!(
                        "the handler did not finish within {} ms; retry with the same key",
                        config.execution_timeout.as_millis()
                    ),
                    ExecutionOutcome::TimedOut,
                ),
            };
            let finish = Finish {
                state: RecordState::FailedRetryable,
                result: None,
            };
            (Problem::new(kind, detail).response(), finish, outcome)
        }
    }
}

/// Calls the handler and reads its response body, catching panics at every step that
/// runs handler code.
async fn run_handler<S, ReqB, B>(mut inner: S, request: Request<ReqB>, max_body: usize) -> Ended<B>
where
    S: Service<Request<ReqB>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let future = match std::panic::catch_unwind(AssertUnwindSafe(|| inner.call(request))) {
        Ok(future) => future,
        Err(_) => return Ended::Failed(Failure::Panicked),
    };
    let response = match AssertUnwindSafe(future).catch_unwind().await {
        Err(_) => return Ended::Failed(Failure::Panicked),
        Ok(Err(e)) => return Ended::Failed(Failure::ServiceError(e.into().to_string())),
        Ok(Ok(response)) => response,
    };
    let (parts, body) = response.into_parts();
    match AssertUnwindSafe(capture_body(body, max_body))
        .catch_unwind()
        .await
    {
        Err(_) => Ended::Failed(Failure::Panicked),
        Ok(Err(e)) => Ended::Failed(Failure::BodyFailed(e)),
        Ok(Ok(captured)) => Ended::Responded(parts, captured),
    }
}

/// Reads the body up to `limit` bytes. Trailers are not kept.
async fn capture_body<B>(body: B, limit: usize) -> Result<CapturedBody<B>, String>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = Box::pin(body);
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut len = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| e.into().to_string())?;
        if let Ok(data) = frame.into_data() {
            len += data.len();
            chunks.push(data);
            if len > limit {
                return Ok(CapturedBody::Oversized {
                    prefix: concat(chunks, len),
                    rest: body,
                });
            }
        }
    }
    Ok(CapturedBody::Whole(concat(chunks, len)))
}

fn concat(mut chunks: Vec<Bytes>, len: usize) -> Bytes {
    if chunks.len() == 1 {
        return chunks.pop().unwrap_or_default();
    }
    let mut out = BytesMut::with_capacity(len);
    for chunk in chunks {
        out.extend_from_slice(&chunk);
    }
    out.freeze()
}

/// The bytes already read followed by the rest of the handler's body.
fn prefixed_body<B>(prefix: Bytes, rest: Pin<Box<B>>) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let head = futures::stream::once(async move { Ok::<_, BoxError>(Frame::data(prefix)) });
    let tail = TryStreamExt::map_err(BodyStream::new(rest), Into::into);
    crate::body::boxed(StreamBody::new(head.chain(tail)))
}

fn outcome_of(state: RecordState) -> ExecutionOutcome {
    match state {
        RecordState::Succeeded => ExecutionOutcome::Succeeded,
        RecordState::FailedTerminal => ExecutionOutcome::FailedTerminal,
        RecordState::FailedRetryable | RecordState::Processing => ExecutionOutcome::FailedRetryable,
    }
}

/// Finishes the record through the pipeline and counts the execution: as `outcome`
/// when the layer's finish wrote it, by the record's state when the handler's own
/// transaction had.
async fn finish_counted(
    shared: &Shared,
    token: &ClaimToken,
    finish: Finish,
    outcome: ExecutionOutcome,
) -> Option<Record> {
    let (record, by) = finish_claim(shared, token, finish).await?;
    let outcome = match by {
        FinishedBy::Layer => outcome,
        FinishedBy::Handler => outcome_of(record.state),
    };
    shared.metrics.execution(outcome, by);
    Some(record)
}

/// Finishes the record through the pipeline, counting what did not work.
async fn finish_claim(
    shared: &Shared,
    token: &ClaimToken,
    finish: Finish,
) -> Option<(Record, FinishedBy)> {
    let policy = FinishPolicy {
        attempts: 6,
        too_large: TooLarge::OmitBody,
    };
    match pipeline::finish(shared.store.as_ref(), token, finish, policy).await {
        Ok((record, pipeline::FinishedBy::Pipeline)) => Some((record, FinishedBy::Layer)),
        Ok((record, pipeline::FinishedBy::Handler)) => Some((record, FinishedBy::Handler)),
        Err(NotFinished::Lost) => {
            tracing::warn!(scope = %token.scope, "claim lost before it was finished");
            shared.metrics.finish_error();
            None
        }
        Err(NotFinished::Failed(e)) => {
            tracing::error!(scope = %token.scope, error = %e, "could not finish the claim");
            shared.metrics.finish_error();
            None
        }
    }
}
