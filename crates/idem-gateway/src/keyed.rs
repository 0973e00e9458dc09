//! The keyed flow: one execution per `(tenant, key)`, shared by every duplicate.
//!
//! ```text
//! arrival ─▶ in-flight here? ── same fingerprint ─▶ wait for its outcome (coalesced)
//!                 │           └─ different ───────▶ 422 at once
//!                 └─ no ─▶ fly it in place (a leader hanging up detaches the rest into
//!                          a task of its own, so it is never cancelled), then take its
//!                          outcome like everyone else
//!
//! flight ─▶ the pipeline in the window:
//!           claim ─ proceed ─▶ forward (heartbeat the lease) ─▶ finish, publish
//!                 ─ replay ──▶ the stored response (window hit)
//!                 ─ mismatch ▶ 422
//!                 ─ in progress (another instance) ─▶ subscribe, re-claim,
//!                    sleep until the wake-up or the lease deadline, re-claim
//!                 ─ in memory, full ─▶ 503 + Retry-After (fail closed)
//!                 ─ the caller's share full ─▶ 429 + Retry-After
//!                 ─ shared, unreachable ─▶ forward with the key (degraded)
//!
//! forward ([`crate::forward`]) ─▶ complete response ─────────────▶ it
//!         ─▶ not sent (connect failed) ──────▶ the next upstream; 502 once each failed
//!         ─▶ uncertain (timeout, broken) ───▶ ask an upstream (another one, if healthy)
//!                                               for the key's state:
//!              processing ─▶ ask again until the wait runs out, then 409 + Retry-After;
//!              done or absent ─▶ re-send the same request with the same key (bounded):
//!                 the upstream's record answers (its replay, or 422 for another request);
//!              unknown ▶ 504, nothing re-sent
//! ```
//!
//! The gateway never mints a key and never re-sends without the upstream's own word on
//! the key: a re-send follows its "done" (the record replays) or "absent" answer, and
//! carries the same key.
//!
//! Coalescing, the claim-and-wait loop, the lease heartbeat with the shutdown's cut-off,
//! finishing the record, waking waiters and the claim's answers are
//! `idem_http::pipeline`'s, the same steps the server-side layer runs; this module owns
//! the flight, the window's failure modes and the answer's per-caller headers, and runs
//! the pipeline with [`crate::forward`] as its execution.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use http::header::HeaderValue;
use http::Response;
use idem_core::{ClaimRequest, StoreError};
use idem_http::headers::IDEMPOTENT_REPLAYED;
use idem_http::pipeline::{Answer, Detached, Done, Joined, Lead, NotFinished};

use crate::body::Body;
use crate::ctx::{client_request_id, request_id, Ctx};
use crate::flights::{Outcome, Slot};
use crate::forward::{Forward, KeyedRequest};
use crate::outbound::Outbound;
use crate::problem::{Problem, ProblemKind};
use crate::upstream::Captured;

/// Handles one keyed arrival: joins the flight for its scope or starts one.
pub(crate) async fn handle(ctx: Arc<Ctx>, req: KeyedRequest, outbound: Outbound) -> Response<Body> {
    let (follower, flight) = match ctx.flights.join(&req.scope, req.fingerprint) {
        Joined::Mismatch => {
            return ctx.problem(Problem::new(
                ProblemKind::KeyReused,
                "this Idempotency-Key is being used right now for a different request",
            ))
        }
        Joined::Follow(follower) => {
            ctx.metrics.coalesced();
            (follower, None)
        }
        Joined::Lead(lead, follower) => {
            let Some(slot) = ctx.in_progress.enter(&req.scope.tenant) else {
                ctx.metrics.caller_quota();
                lead.complete(Outcome::Problem(
                    Problem::new(
                        ProblemKind::CallerQuotaExceeded,
                        format!(
                            "this caller already has {} keys in progress; retry with the same key",
                            ctx.config.max_in_progress_per_caller
                        ),
                    )
                    .retry_after(Duration::from_secs(1)),
                ));
                return match follower.outcome().await {
                    Some(outcome) => respond(&ctx, outcome, false),
                    None => ctx.problem(Problem::new(
                        ProblemKind::ExecutionFailed,
                        "the gateway's execution of this key ended unexpectedly; retry with the same key",
                    )),
                };
            };
            let span = tracing::info_span!(
                "keyed",
                request_id = request_id().as_deref().unwrap_or("-"),
                client_request_id = %client_request_id(),
                tenant = %req.scope.tenant,
                key = %req.scope.key,
                decision = tracing::field::Empty,
                store_ms = tracing::field::Empty,
            );
            // Flown in place by the leader; a leader hanging up hands the rest to a task
            // of its own, so the flight is never cancelled.
            let flight = Detached::new(tracing::Instrument::instrument(
                fly(ctx.clone(), req, outbound, lead, slot),
                span,
            ));
            (follower, Some(flight))
        }
    };
    let leader = flight.is_some();
    if let Some(flight) = flight {
        // A flight that panics ends this caller's request like its followers': with the
        // problem below, not a reset connection.
        if AssertUnwindSafe(flight).catch_unwind().await.is_err() {
            tracing::error!("the flight panicked");
        }
    }
    match follower.outcome().await {
        Some(outcome) => respond(&ctx, outcome, !leader),
        None => ctx.problem(Problem::new(
            ProblemKind::ExecutionFailed,
            "the gateway's execution of this key ended unexpectedly; retry with the same key",
        )),
    }
}

/// The answer to one caller: the outcome itself when nobody else holds it (the usual
/// lone leader), else a copy.
fn respond(ctx: &Ctx, outcome: Done<Outcome>, follower: bool) -> Response<Body> {
    let (mut r, replayed) = match outcome.try_into_inner() {
        Ok(Outcome::Response { captured, replayed }) => (captured.into_response(), replayed),
        Ok(Outcome::Problem(p)) => return ctx.problem(p),
        Err(shared) => match &*shared {
            Outcome::Response { captured, replayed } => (captured.to_response(), *replayed),
            Outcome::Problem(p) => return ctx.problem(p.clone()),
        },
    };
    if replayed || follower {
        // Found by `idem chaos`: a follower used to get an upstream "in progress" 409
        // marked as a replay, and a client took that for the key's final answer.
        let retryable = matches!(
            ctx.config
                .outcome_policy
                .classify(idem_core::Outcome::Status(r.status().as_u16())),
            idem_core::RecordState::FailedRetryable
        );
        // Another caller's request executed (or a stored copy answers): what belonged
        // to that one exchange stays with it.
        for h in &ctx.per_caller {
            r.headers_mut().remove(h);
        }
        if !retryable {
            r.headers_mut()
                .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        }
    }
    r
}

async fn fly(
    ctx: Arc<Ctx>,
    req: KeyedRequest,
    outbound: Outbound,
    lead: Lead<Outcome>,
    slot: Slot,
) {
    let outcome = resolve(&ctx, &req, outbound).await;
    // The slot and the body's buffer are free before the callers hear the outcome.
    drop(slot);
    drop(req);
    lead.complete(outcome);
}

/// Runs the pipeline in the window and turns its answer into the flight's outcome, or
/// applies the window's failure modes (see the module docs).
async fn resolve(ctx: &Arc<Ctx>, req: &KeyedRequest, outbound: Outbound) -> Outcome {
    let claim = ClaimRequest {
        scope: req.scope.clone(),
        principal: req.principal.clone(),
        fingerprint: req.fingerprint,
        owner: ctx.owners.next(),
        lease: ctx.config.lease(),
    };
    let forward = Forward::new(ctx, req, outbound);
    let answered = match ctx.pipeline().run(&claim, forward).await {
        Ok(answered) => answered,
        // Boxed: only a window that failed pays for its failure modes' state.
        Err((e, forward)) => return Box::pin(window_failed(ctx, req, e, forward)).await,
    };
    if answered.waited {
        ctx.metrics.coalesced();
    }
    answered.answer.decision().on_span();
    match answered.answer {
        Answer::Fresh(executed) => {
            match executed.finished {
                Ok(_) => {}
                Err(NotFinished::Lost) => {
                    tracing::warn!(scope = %req.scope, "the window record was taken over before it was finished")
                }
                Err(NotFinished::Failed(e)) => {
                    tracing::warn!(scope = %req.scope, error = %e, "finishing the window record failed; it frees when its lease ends")
                }
            }
            executed.output
        }
        Answer::Replay(record) => {
            ctx.metrics.window_hit();
            match record.result.as_ref().and_then(Captured::from_stored) {
                Some(captured) => Outcome::Response {
                    captured,
                    replayed: true,
                },
                None => Outcome::Problem(Problem::new(
                    ProblemKind::ResultNotStored,
                    "the first request with this key ended without a stored response",
                )),
            }
        }
        Answer::Refused(_, problem) => Outcome::Problem(problem),
    }
}

/// The window could not claim: the caller's share or the in-memory window is full
/// (refused, fail closed), or the shared window is unreachable (forwarded with the key:
/// the upstream guards).
async fn window_failed(
    ctx: &Ctx,
    req: &KeyedRequest,
    e: StoreError,
    forward: Forward<'_>,
) -> Outcome {
    match e {
        StoreError::Full {
            what,
            partition: true,
            retry_after_ms,
        } => {
            // This caller's share is used up: only its new keys wait.
            ctx.metrics.caller_quota();
            Outcome::Problem(
                Problem::new(
                    ProblemKind::CallerQuotaExceeded,
                    "this caller's share of the gateway's short window is full; retry with the same key later",
                )
                .cause(what)
                .retry_after(Duration::from_millis(retry_after_ms)),
            )
        }
        e if !ctx.window.is_shared() => {
            // The in-memory window is full (its only failure): forwarding would turn
            // de-duplication off silently, so new keys are refused until records
            // expire, the first of them when Retry-After says.
            let retry_after = match &e {
                StoreError::Full { retry_after_ms, .. } => Duration::from_millis(*retry_after_ms),
                _ => Duration::from_secs(1),
            };
            if e.is_unavailable() {
                ctx.metrics.window_full();
            }
            Outcome::Problem(
                Problem::new(
                    ProblemKind::StoreUnavailable,
                    "the gateway's short window is full; retry with the same key later",
                )
                .cause(e.to_string())
                .retry_after(retry_after),
            )
        }
        e => {
            if e.is_unavailable() {
                tracing::debug!(scope = %req.scope, error = %e, "window unreachable; forwarding with the key");
            } else {
                tracing::error!(scope = %req.scope, error = %e, "window error; forwarding with the key");
            }
            ctx.metrics.degraded_request();
            forward.send().await.output
        }
    }
}
