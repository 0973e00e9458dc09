//! Running the handler under a claim: the layer's [`Execution`].
//!
//! The handler runs in the keyed request's work, which a client that disconnects
//! detaches into a task of its own ([`crate::layer`]) rather than cancels: the record
//! always reaches a final state. Panics are caught and a configurable timeout bounds the run; both leave
//! the record FAILED_RETRYABLE, never stuck in PROCESSING. So does a shutdown that cuts
//! running executions off ([`crate::pipeline::Executions::cancel`]): the record is open
//! for a retry at once instead of after its lease. The response is captured (status,
//! chosen headers, body up to a limit) and settled by the outcome policy
//! ([`pipeline::ending`]) — unless the handler finished the record in its own
//! transaction (see [`crate::transactional`]).
//!
//! This module must not decide whether to execute: it runs only under a claim that
//! proceeded, or on an in-transaction route whose handler claims itself.

use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::{FutureExt, StreamExt, TryStreamExt};
use http::request::Parts;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, BodyStream, StreamBody};
use idem_core::{Claim, ClaimKind, ClaimRequest, Scope};
use tower::Service;

use crate::answer::{check_archive, respond, store_failed, Handled};
use crate::body::{full, Body, BoxError};
use crate::config::ResolvedRules;
use crate::decision::Decision;
use crate::metrics::ExecutionOutcome;
use crate::pipeline::{
    self, Answer, Answered, Claimed, Ending, Execution, FinishedBy, Lease, Ran, Settled, TooLarge,
};
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

/// The services the layer wraps, their bounds written once.
pub(crate) trait Inner<ReqB, B>:
    Service<Request<ReqB>, Response = Response<B>, Future: Send + 'static, Error: Into<BoxError>>
    + Send
    + 'static
{
}

impl<S, ReqB, B> Inner<ReqB, B> for S
where
    S: Service<Request<ReqB>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
{
}

/// The response bodies of the services the layer wraps.
pub(crate) trait ResponseBody:
    http_body::Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static
{
}

impl<B> ResponseBody for B
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
}

/// The inner service and the request it runs for: the layer's [`Execution`].
pub(crate) struct Handler<S, ReqB, B> {
    pub shared: Arc<Shared>,
    pub inner: S,
    pub parts: Parts,
    pub body: Bytes,
    /// The request and response body types.
    pub bodies: PhantomData<fn() -> (ReqB, B)>,
}

impl<S, ReqB, B> Execution for Handler<S, ReqB, B>
where
    S: Inner<ReqB, B>,
    ReqB: From<Bytes> + Send + 'static,
    B: ResponseBody,
{
    type Output = Handled;

    async fn run(self, lease: Lease<'_>) -> Settled<Handled> {
        let Handler {
            shared,
            inner,
            mut parts,
            body,
            ..
        } = self;
        let token = lease.token();
        if let (ClaimKind::Fresh, Some(archive)) = (&token.kind, &shared.archive) {
            if let Some(settled) = check_archive(&shared, archive, token).await {
                return settled;
            }
        }
        shared.metrics.decision(Decision::Executed);
        let claim = TransactionalClaim::new(token.clone(), shared.capture.clone());
        parts.extensions.insert(claim.clone());
        let request = Request::from_parts(parts, ReqB::from(body));
        let work = tokio::time::timeout(
            shared.config.execution_timeout,
            run_handler(inner, request, shared.capture.max_stored_body),
        );
        // Leaving the run drops the handler's future: a timed-out or cut-off handler is
        // cancelled, and an open transaction of its rolls back.
        let ended = match lease.hold(work).await {
            Ran::Done(Ok(ended)) => ended,
            Ran::Done(Err(_elapsed)) => Ended::Failed(Failure::TimedOut),
            Ran::CutOff => Ended::Failed(Failure::CutOff),
        };
        let (response, finish, outcome) = settle(&shared, &token.scope, ended);
        let ending = match claim.take_finished() {
            Some(record) => Ending::Finished(record),
            None => Ending::Finish(finish),
        };
        Settled {
            output: Handled {
                response,
                outcome: Some(outcome),
            },
            ending,
        }
    }
}

/// A run that already happened (an in-transaction route's handler, whose claim is made
/// after it): the pipeline only finishes its record.
struct Done(Option<Settled<Handled>>);

impl Execution for Done {
    type Output = Handled;

    async fn run(mut self, _lease: Lease<'_>) -> Settled<Handled> {
        let settled = self.0.take().expect("run once");
        if let Some(ExecutionOutcome::Succeeded) = settled.output.outcome {
            // The handler answered success without committing a claim in its
            // transaction: whatever it wrote was not protected by the key.
            tracing::warn!(
                "handler on an in-transaction route succeeded without claiming in its transaction"
            );
        }
        settled
    }
}

/// Executes the handler of an in-transaction route ([`crate::ClaimMode::InTransaction`]):
/// nothing is claimed before it runs; the handler claims in its business transaction.
/// Afterwards the layer answers by what happened there: committed (the handler's
/// response), a claim that did not proceed (its replay, mismatch or in-progress answer),
/// or no committed claim at all (refused before writing, failed, lost its commit), in
/// which case the key is claimed now, as on any route, and that claim decides.
pub(crate) async fn in_transaction<S, ReqB, B>(
    shared: Arc<Shared>,
    inner: S,
    mut parts: Parts,
    body: Bytes,
    req: ClaimRequest,
    rules: ResolvedRules,
) -> Response<Body>
where
    S: Inner<ReqB, B>,
    ReqB: From<Bytes> + Send + 'static,
    B: ResponseBody,
{
    let claim = TransactionalClaim::deferred(req.clone(), shared.capture.clone());
    parts.extensions.insert(claim.clone());
    let request = Request::from_parts(parts, ReqB::from(body));
    let running = shared.executions.start();
    let work = tokio::time::timeout(
        shared.config.execution_timeout,
        run_handler(inner, request, shared.capture.max_stored_body),
    );
    // No committed record to renew a lease of.
    let ended = match pipeline::until_cut_off(&shared.executions, work).await {
        Ran::Done(Ok(ended)) => ended,
        Ran::Done(Err(_elapsed)) => Ended::Failed(Failure::TimedOut),
        Ran::CutOff => Ended::Failed(Failure::CutOff),
    };
    let (response, finish, outcome) = settle(&shared, &req.scope, ended);
    if let Some(record) = claim.take_finished() {
        shared.metrics.decision(Decision::Executed);
        shared
            .metrics
            .execution(ExecutionOutcome::of(record.state), FinishedBy::Handler);
        shared.wakeups.wake(&req.scope);
        return crate::answer::with_expiry(&shared, response, &record);
    }
    drop(running);
    let pipeline = shared.pipeline(&rules);
    match claim.take_answer() {
        // A handler that proceeded and did not commit: decided below.
        None | Some(Claim::Proceed(_)) => {}
        Some(claim) => {
            let claimed = Claimed {
                claim,
                waited: false,
            };
            let answer = pipeline::answer::of_claim(claimed, rules.in_progress, false);
            return respond(&shared, answer).await;
        }
    }
    let done = Done(Some(Settled {
        output: Handled {
            response,
            outcome: Some(outcome),
        },
        ending: Ending::Finish(finish),
    }));
    match pipeline.run(&req, done).await {
        Ok(Answered { answer, .. }) => {
            if let Answer::Fresh(_) = answer {
                shared.metrics.decision(Decision::Executed);
            }
            respond(&shared, answer).await
        }
        Err((e, _)) => store_failed(&shared, &e, &req.scope),
    }
}

/// The response to send, how to finish the record and how the run counts, from how the
/// run ended.
fn settle<B>(
    shared: &Shared,
    scope: &Scope,
    ended: Ended<B>,
) -> (Response<Body>, idem_core::Finish, ExecutionOutcome)
where
    B: ResponseBody,
{
    let capture = &shared.capture;
    match ended {
        Ended::Responded(parts, captured) => {
            let status = parts.status;
            let state = capture.classify(status);
            let (stored_body, body) = match captured {
                CapturedBody::Whole(bytes) => (Some(bytes.clone()), full(bytes)),
                CapturedBody::Oversized { prefix, rest } => (None, prefixed_body(prefix, rest)),
            };
            let finish =
                pipeline::ending(state, stored_body.is_some(), TooLarge::OmitBody, |keep| {
                    let body = stored_body.as_deref().filter(|_| keep);
                    capture.stored_result(status, &parts.headers, body)
                });
            (
                Response::from_parts(parts, body),
                finish,
                ExecutionOutcome::of(state),
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
                        shared.config.execution_timeout.as_millis()
                    ),
                    ExecutionOutcome::TimedOut,
                ),
            };
            let response = Problem::new(kind, detail).response();
            (response, pipeline::retryable(), outcome)
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
