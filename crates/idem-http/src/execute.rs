//! Running the handler under a claim and finishing the record.
//!
//! The handler runs in its own task, so a client that disconnects (dropping the
//! response future) cannot cancel it: the record always reaches a final state. Panics
//! are caught and a configurable timeout bounds the run; both leave the record
//! FAILED_RETRYABLE, never stuck in PROCESSING. So does a shutdown that cuts running
//! executions off ([`Executions::cancel`]): the record is open for a retry at once
//! instead of after its lease. While the handler runs, the lease is
//! renewed every `lease / 3`. The response is captured (status, chosen headers, body up
//! to a limit) and the record finished by the outcome policy — unless the handler
//! finished it in its own transaction (see [`crate::transactional`]).
//!
//! This module must not decide whether to execute: it is only called with a claim that
//! proceeded.

use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use futures::{FutureExt, StreamExt, TryStreamExt};
use http::request::Parts;
use http::Request;
use http_body::Frame;
use http_body_util::{BodyExt, BodyStream, StreamBody};
use idem_core::{ClaimToken, Finish, Record, RecordState, StoreError};
use tokio::sync::{watch, Notify};
use tokio::time::{Instant, MissedTickBehavior};
use tower::Service;
use tracing::Instrument;

use crate::headers::{IDEMPOTENCY_EXPIRES, IDEMPOTENT_BODY_OMITTED};
use crate::layer::{BoxError, Shared};
use crate::metrics::{Decision, ExecutionOutcome, FinishedBy};
use crate::problem::{Problem, ProblemKind};
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

/// The executions running under a claim in this layer, so a shutdown can cut them off
/// and wait until their records are written.
#[derive(Debug)]
pub(crate) struct Executions {
    cancelled: watch::Sender<bool>,
    running: AtomicUsize,
    idle: Notify,
}

impl Default for Executions {
    fn default() -> Self {
        Self {
            cancelled: watch::channel(false).0,
            running: AtomicUsize::new(0),
            idle: Notify::new(),
        }
    }
}

/// One running execution; dropping it counts it out.
struct Running(Arc<Executions>);

impl Drop for Running {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Executions {
    fn start(self: &Arc<Self>) -> Running {
        self.running.fetch_add(1, Ordering::AcqRel);
        Running(self.clone())
    }

    pub(crate) fn running(&self) -> usize {
        self.running.load(Ordering::Acquire)
    }

    /// Cuts off every running execution, and every one that starts from now on.
    pub(crate) fn cancel(&self) {
        self.cancelled.send_replace(true);
    }

    fn is_cancelled(&self) -> bool {
        *self.cancelled.borrow()
    }

    /// Resolves once cancelled.
    fn cancelled(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.cancelled.subscribe();
        async move {
            let _ = rx.wait_for(|c| *c).await;
        }
    }

    /// Resolves when no execution is running.
    pub(crate) async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if self.running() == 0 {
                return;
            }
            notified.await;
        }
    }
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
pub(crate) async fn execute<S, B>(
    shared: Arc<Shared>,
    inner: S,
    mut parts: Parts,
    body: Bytes,
    token: ClaimToken,
) -> Response
where
    S: Service<Request<Body>, Response = http::Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    shared.metrics.decision(Decision::Executed);
    let claim = TransactionalClaim::new(token.clone(), shared.capture.clone());
    parts.extensions.insert(claim.clone());
    let request = Request::from_parts(parts, Body::from(body));
    // Counted from here, so a shutdown waits for this record even if the client left.
    let running = shared.executions.start();
    let task = tokio::spawn(
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
    );
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
            shared.signals.finished(&token.scope);
            Problem::new(
                ProblemKind::ExecutionFailed,
                "the request failed; retry with the same key",
            )
            .into_response()
        }
    }
}

async fn run_under_claim<S, B>(
    shared: Arc<Shared>,
    inner: S,
    request: Request<Body>,
    token: ClaimToken,
    claim: TransactionalClaim,
    _running: Running,
) -> Response
where
    S: Service<Request<Body>, Response = http::Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let config = &shared.config;
    let ended = if shared.executions.is_cancelled() {
        // Claimed after the cut-off: do not start the handler at all.
        Ended::Failed(Failure::CutOff)
    } else {
        let work = std::pin::pin!(run_handler(inner, request, shared.capture.max_stored_body));
        let mut work = work;
        let timeout = tokio::time::sleep(config.execution_timeout);
        let mut timeout = std::pin::pin!(timeout);
        let period = (config.lease / 3).max(Duration::from_millis(10));
        let mut heartbeat = tokio::time::interval_at(Instant::now() + period, period);
        heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut cut_off = std::pin::pin!(shared.executions.cancelled());
        loop {
            tokio::select! {
                biased;
                ended = &mut work => break ended,
                _ = &mut timeout => break Ended::Failed(Failure::TimedOut),
                _ = &mut cut_off => break Ended::Failed(Failure::CutOff),
                _ = heartbeat.tick() => renew_lease(&shared, &token).await,
            }
        }
        // Leaving this block drops the handler's future: a timed-out or cut-off handler
        // is cancelled, and an open transaction of its rolls back.
    };

    let capture = &shared.capture;
    let (mut response, finish, outcome) = match ended {
        Ended::Responded(parts, captured) => {
            let status = parts.status;
            let state = capture.classify(status);
            let (stored_body, body) = match captured {
                CapturedBody::Whole(bytes) => (Some(bytes.clone()), Body::from(bytes)),
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
                    tracing::error!(scope = %token.scope, error = %e, "the handler failed");
                    (
                        ProblemKind::ExecutionFailed,
                        "the handler failed; retry with the same key".to_owned(),
                        ExecutionOutcome::FailedRetryable,
                    )
                }
                Failure::BodyFailed(e) => {
                    tracing::error!(scope = %token.scope, error = %e, "the response body failed");
                    (
                        ProblemKind::ExecutionFailed,
                        "the response body failed; retry with the same key".to_owned(),
                        ExecutionOutcome::FailedRetryable,
                    )
                }
                Failure::CutOff => {
                    tracing::warn!(scope = %token.scope, "execution cut off by the shutdown");
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
            (Problem::new(kind, detail).into_response(), finish, outcome)
        }
    };

    let finished = match claim.take_finished() {
        Some(record) => {
            shared
                .metrics
                .execution(outcome_of(record.state), FinishedBy::Handler);
            Some(record)
        }
        None => {
            let finished = finish_claim(&shared, &token, finish).await;
            if let Some((record, by)) = &finished {
                let outcome = match by {
                    FinishedBy::Layer => outcome,
                    FinishedBy::Handler => outcome_of(record.state),
                };
                shared.metrics.execution(outcome, *by);
            }
            finished.map(|(record, _)| record)
        }
    };
    // Written before waking: a waiter either sees the record or is woken.
    shared.signals.finished(&token.scope);

    if let Some(record) = finished.filter(|r| r.state.is_terminal()) {
        if let Some(completed_at) = record.completed_at {
            response
                .headers_mut()
                .insert(IDEMPOTENCY_EXPIRES, capture.expires_header(completed_at));
        }
    }
    response
}

/// Calls the handler and reads its response body, catching panics at every step that
/// runs handler code.
async fn run_handler<S, B>(mut inner: S, request: Request<Body>, max_body: usize) -> Ended<B>
where
    S: Service<Request<Body>, Response = http::Response<B>>,
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
    Body::new(StreamBody::new(head.chain(tail)))
}

fn outcome_of(state: RecordState) -> ExecutionOutcome {
    match state {
        RecordState::Succeeded => ExecutionOutcome::Succeeded,
        RecordState::FailedTerminal => ExecutionOutcome::FailedTerminal,
        RecordState::FailedRetryable | RecordState::Processing => ExecutionOutcome::FailedRetryable,
    }
}

async fn renew_lease(shared: &Shared, token: &ClaimToken) {
    match shared.store.extend_lease(token, shared.config.lease).await {
        Ok(_) => {}
        // Finished meanwhile (in the handler's transaction) or taken over: the finish
        // will tell which.
        Err(e) if e.is_superseded() => {
            tracing::debug!(scope = %token.scope, "lease renewal found the claim moved on")
        }
        Err(e) => tracing::warn!(scope = %token.scope, error = %e, "lease renewal failed"),
    }
}

/// Finishes the record, retrying a store outage briefly: the action has run, so giving
/// up early would leave the key PROCESSING until its lease expires.
async fn finish_claim(
    shared: &Shared,
    token: &ClaimToken,
    mut finish: Finish,
) -> Option<(Record, FinishedBy)> {
    const ATTEMPTS: u32 = 6;
    let mut delay = Duration::from_millis(25);
    for attempt in 1..=ATTEMPTS {
        let error = match shared.store.finish(token, finish.clone()).await {
            Ok(record) => return Some((record, FinishedBy::Layer)),
            Err(e) => e,
        };
        match error {
            StoreError::Superseded { .. } => {
                // The handler may have finished in its own transaction without saying
                // so; otherwise another request took the claim over.
                match shared.store.get(&token.scope).await {
                    Ok(Some(record))
                        if record.owner.as_ref() == Some(&token.owner)
                            && record.state != RecordState::Processing =>
                    {
                        return Some((record, FinishedBy::Handler));
                    }
                    _ => {
                        tracing::warn!(scope = %token.scope, "claim lost before it was finished");
                        shared.metrics.finish_error();
                        return None;
                    }
                }
            }
            StoreError::ResultTooLarge { size, limit } => {
                // The store keeps less than the layer captured: keep status and headers.
                tracing::warn!(scope = %token.scope, size, limit, "stored response body omitted");
                match finish.result.as_mut() {
                    Some(result) if !result.body.is_empty() => {
                        result.body.clear();
                        result.headers.push((
                            IDEMPOTENT_BODY_OMITTED.as_str().to_owned(),
                            "true".to_owned(),
                        ));
                    }
                    _ => finish.result = None,
                }
            }
            e if e.is_unavailable() && attempt < ATTEMPTS => {
                tracing::warn!(scope = %token.scope, error = %e, attempt, "finish failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            e => {
                tracing::error!(scope = %token.scope, error = %e, "could not finish the claim");
                shared.metrics.finish_error();
                return None;
            }
        }
    }
    shared.metrics.finish_error();
    None
}
