//! The keyed flow: one execution per `(tenant, key)`, shared by every duplicate.
//!
//! ```text
//! arrival ─▶ in-flight here? ── same fingerprint ─▶ wait for its outcome (coalesced)
//!                 │           └─ different ───────▶ 422 at once
//!                 └─ no ─▶ start a flight (a task of its own, so a client hanging up
//!                          cannot cancel it) and wait for its outcome like everyone else
//!
//! flight ─▶ claim in the window ─ proceed ─▶ forward (heartbeat the lease) ─▶ finish, publish
//!                               ─ replay ──▶ the stored response (window hit)
//!                               ─ mismatch ▶ 422
//!                               ─ in progress (another instance) ─▶ subscribe, re-claim,
//!                                  sleep until the wake-up or the lease deadline, re-claim
//!                               ─ in memory, full ─▶ 503 + Retry-After (fail closed)
//!                               ─ the caller's share full ─▶ 429 + Retry-After
//!                               ─ shared, unreachable ─▶ forward with the key (degraded)
//!
//! forward ─▶ complete response ─────────────▶ it
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
//! Coalescing, the claim-and-wait loop, the lease heartbeat with the shutdown's cut-off
//! and finishing the record are `idem_http::pipeline`'s, the same steps the server-side
//! layer runs; what is the gateway's own here is the window's failure modes, the
//! reverse-proxy exchange and the uncertain-result state query.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue};
use http::{Method, Response};
use idem_core::{
    ClaimRequest, ClaimToken, Fingerprint, Finish, IdempotencyStore as _, Principal, RecordState,
    Scope, StoreError,
};
use idem_http::headers::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
use idem_http::pipeline::{self, FinishPolicy, Joined, Lead, NotFinished, Ran, TooLarge, Turn};
use idem_http::InProgressMode;
use tokio::time::Instant;

use crate::body::Body;
use crate::ctx::{client_request_id, request_id, Ctx, GATEWAY_TOKEN, X_REQUEST_ID};
use crate::flights::{Outcome, Slot};
use crate::problem::{Problem, ProblemKind};
use crate::upstream::{Captured, Exchange, KeyState};
use crate::upstreams::Heard;

/// A keyed request, buffered and fingerprinted, its headers ready for the upstream.
#[derive(Debug)]
pub(crate) struct KeyedRequest {
    pub scope: Scope,
    pub principal: Principal,
    pub fingerprint: Fingerprint,
    pub method: Method,
    pub path_and_query: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The body's share of the buffering budget, given back when the request is done.
    pub _buffered: crate::buffers::Held,
}

/// Handles one keyed arrival: joins the flight for its scope or starts one.
pub(crate) async fn handle(ctx: Arc<Ctx>, req: KeyedRequest) -> Response<Body> {
    let (follower, leader) = match ctx.flights.join(&req.scope, req.fingerprint) {
        Joined::Mismatch => {
            return ctx.problem(Problem::new(
                ProblemKind::KeyReused,
                "this Idempotency-Key is being used right now for a different request",
            ))
        }
        Joined::Follow(follower) => {
            ctx.metrics.coalesced();
            (follower, false)
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
                    Some(outcome) => respond(&ctx, &outcome, false),
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
                store_ms = tracing::field::Empty,
            );
            // A task of its own, so a client hanging up cannot cancel the flight.
            tokio::spawn(tracing::Instrument::instrument(
                fly(ctx.clone(), req, lead, slot),
                span,
            ));
            (follower, true)
        }
    };
    match follower.outcome().await {
        Some(outcome) => respond(&ctx, &outcome, !leader),
        None => ctx.problem(Problem::new(
            ProblemKind::ExecutionFailed,
            "the gateway's execution of this key ended unexpectedly; retry with the same key",
        )),
    }
}

fn respond(ctx: &Ctx, outcome: &Outcome, follower: bool) -> Response<Body> {
    match outcome {
        Outcome::Response { captured, replayed } => {
            let mut r = captured.to_response();
            // Found by `idem chaos`: a follower used to get an upstream "in progress" 409
            // marked as a replay, and a client took that for the key's final answer.
            let retryable = matches!(
                ctx.config
                    .outcome_policy
                    .classify(idem_core::Outcome::Status(captured.status.as_u16())),
                idem_core::RecordState::FailedRetryable
            );
            if *replayed || follower {
                // Another caller's request executed (or a stored copy answers): what
                // belonged to that one exchange stays with it.
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
        Outcome::Problem(p) => ctx.problem(p.clone()),
    }
}

async fn fly(ctx: Arc<Ctx>, req: KeyedRequest, lead: Lead<Outcome>, slot: Slot) {
    let outcome = resolve(&ctx, &req).await;
    // The slot and the body's buffer are free before the callers hear the outcome.
    drop(slot);
    drop(req);
    lead.complete(outcome);
}

/// Claims the key in the window and acts on the answer (see the module docs).
async fn resolve(ctx: &Arc<Ctx>, req: &KeyedRequest) -> Outcome {
    let claim = ClaimRequest {
        scope: req.scope.clone(),
        principal: req.principal.clone(),
        fingerprint: req.fingerprint,
        owner: ctx.next_owner(),
        lease: ctx.config.lease(),
    };
    let wait = InProgressMode::Wait {
        max_wait: ctx.config.max_wait(),
    };
    let claimed = pipeline::claim(
        &ctx.window,
        ctx.window.wakeups(),
        &claim,
        wait,
        &ctx.executions,
    )
    .await;
    let claimed = match claimed {
        Ok(claimed) => claimed,
        Err(StoreError::Full {
            what,
            partition: true,
            retry_after_ms,
        }) => {
            // This caller's share is used up: only its new keys wait.
            ctx.metrics.caller_quota();
            return Outcome::Problem(
                Problem::new(
                    ProblemKind::CallerQuotaExceeded,
                    "this caller's share of the gateway's short window is full; retry with the same key later",
                )
                .cause(what)
                .retry_after(Duration::from_millis(retry_after_ms)),
            );
        }
        Err(e) if !ctx.window.is_shared() => {
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
            return Outcome::Problem(
                Problem::new(
                    ProblemKind::StoreUnavailable,
                    "the gateway's short window is full; retry with the same key later",
                )
                .cause(e.to_string())
                .retry_after(retry_after),
            );
        }
        Err(e) => {
            if e.is_unavailable() {
                tracing::debug!(scope = %req.scope, error = %e, "window unreachable; forwarding with the key");
            } else {
                tracing::error!(scope = %req.scope, error = %e, "window error; forwarding with the key");
            }
            ctx.metrics.degraded_request();
            return forward(ctx, req).await.outcome;
        }
    };
    if claimed.waited {
        ctx.metrics.coalesced();
    }
    match claimed.turn {
        Turn::Proceed(token) => execute(ctx, req, token).await,
        Turn::Replay(record) => {
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
        Turn::Mismatch => Outcome::Problem(Problem::new(
            ProblemKind::KeyReused,
            "this Idempotency-Key was already used for a different request",
        )),
        Turn::InProgress { lease_left } => {
            let detail = if ctx.executions.is_cancelled() {
                "the gateway is shutting down; the first request with this key is still being processed"
            } else {
                "the first request with this key is still being processed"
            };
            Outcome::Problem(
                Problem::new(ProblemKind::RequestInProgress, detail)
                    .retry_after(lease_left.max(Duration::from_secs(1))),
            )
        }
    }
}

/// Runs the claimed execution: forward with a lease heartbeat, finish the record, wake
/// other instances.
async fn execute(ctx: &Arc<Ctx>, req: &KeyedRequest, token: ClaimToken) -> Outcome {
    let ran = pipeline::under_lease(
        &ctx.window,
        &token,
        ctx.config.lease(),
        &ctx.executions,
        forward(ctx, req),
    )
    .await;
    let resolution = match ran {
        Ran::Done(resolution) => resolution,
        Ran::CutOff => {
            // Shutting down past the grace: free the key now rather than when the
            // lease runs out. The upstream may still complete; its own record answers
            // a retry.
            tracing::warn!(scope = %req.scope, "shutdown grace over; ending the execution as retryable");
            Resolution::problem(
                Problem::new(
                    ProblemKind::UpstreamResultUnknown,
                    "the gateway shut down before the upstream answered; retry with the same key",
                )
                .retry_after(Duration::from_secs(1)),
            )
        }
    };
    // Too large to keep: later duplicates go to the upstream with the key. One attempt:
    // a shared window that fails is degraded mode, and the caller should not wait on it.
    let policy = FinishPolicy {
        attempts: 1,
        too_large: TooLarge::Forget,
    };
    match resolution.finish {
        Some(finish) => match pipeline::finish(&ctx.window, &token, finish, policy).await {
            Ok(_) => {}
            Err(NotFinished::Lost) => {
                tracing::warn!(scope = %req.scope, "the window record was taken over before it was finished")
            }
            Err(NotFinished::Failed(e)) => {
                tracing::warn!(scope = %req.scope, error = %e, "finishing the window record failed; it frees when its lease ends")
            }
        },
        None => {
            if let Err(e) = ctx.window.abandon(&token).await {
                tracing::warn!(scope = %req.scope, error = %e, "withdrawing the window record failed; it frees when its lease ends")
            }
        }
    }
    if ctx.window.is_shared() {
        // Other instances may wait on this key; local duplicates get the outcome
        // directly, so this need not delay them.
        let ctx2 = ctx.clone();
        let scope = req.scope.clone();
        tokio::spawn(async move {
            idem_http::pipeline::Wakeups::publish(ctx2.window.wakeups(), &scope).await
        });
    }
    resolution.outcome
}

/// An outcome and how the window record ends (`None`: it is withdrawn).
pub(crate) struct Resolution {
    outcome: Outcome,
    finish: Option<Finish>,
}

impl Resolution {
    fn response(ctx: &Ctx, captured: Captured) -> Self {
        let state = ctx
            .config
            .outcome_policy
            .classify(idem_core::Outcome::Status(captured.status.as_u16()));
        // "Who are you" answers are about the credential, not the intent: nothing of
        // them stays in the window, so callers who cannot authenticate take no room and
        // the key is free for the caller who can.
        let identity_answer = matches!(captured.status.as_u16(), 401 | 403 | 407 | 511);
        let keep = state.is_terminal() && captured.body.len() <= ctx.config.max_stored_bytes;
        let finish = if identity_answer {
            None
        } else if keep {
            Some(Finish {
                state,
                result: Some(captured.to_stored(&ctx.per_caller)),
            })
        } else {
            Some(Finish {
                state: RecordState::FailedRetryable,
                result: None,
            })
        };
        Self {
            outcome: Outcome::Response {
                captured,
                replayed: false,
            },
            finish,
        }
    }

    fn problem(problem: Problem) -> Self {
        Self {
            outcome: Outcome::Problem(problem),
            finish: Some(Finish {
                state: RecordState::FailedRetryable,
                result: None,
            }),
        }
    }
}

/// The headers a state query carries: the identity the gateway set, the caller's own
/// forwarded credential (the upstream authenticates the query as that caller) and the
/// key.
fn state_query_headers(ctx: &Ctx, headers: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for name in [
        &ctx.tenant_header,
        &ctx.principal_header,
        &GATEWAY_TOKEN,
        &X_REQUEST_ID,
        &IDEMPOTENCY_KEY,
    ]
    .into_iter()
    .chain(&ctx.state_credentials)
    {
        for v in headers.get_all(name) {
            out.append(name.clone(), v.clone());
        }
    }
    out
}

/// Sends the request upstream and settles an uncertain result through the state query.
///
/// The state query says whether the upstream has a record for the key, not whether
/// that record is this request's: the key may have been used on another resource, or by
/// another caller of the same upstream tenant, after this gateway's window forgot it. So
/// a stored answer is never taken from the state endpoint: the same request is re-sent
/// with the same key and the upstream's own record decides (its replay, or 422). That is
/// safe exactly because the upstream has a record of the key; the state query's job is
/// to wait out an execution still running there.
async fn forward(ctx: &Ctx, req: &KeyedRequest) -> Resolution {
    let (mut last, mut exchange) = send(ctx, req, None).await;
    let mut resends_left = ctx.config.state_query.max_retries;
    let mut resent = false;
    loop {
        let why = match exchange {
            // The re-send met the first attempt still executing upstream: wait for it.
            Exchange::Complete(captured) if resent && in_progress(&captured) => {
                "the re-send found the first attempt still in progress".to_string()
            }
            Exchange::Complete(captured) => return Resolution::response(ctx, captured),
            Exchange::NotSent(e) => {
                return Resolution::problem(
                    Problem::new(
                        ProblemKind::UpstreamUnavailable,
                        "the upstream could not be reached; the request was not sent",
                    )
                    .cause(e)
                    .retry_after(Duration::from_secs(1)),
                )
            }
            Exchange::TooLarge => {
                return Resolution::problem(Problem::new(
                    ProblemKind::UpstreamResponseTooLarge,
                    format!(
                        "the upstream answered with more than {} bytes",
                        ctx.config.max_response_bytes
                    ),
                ))
            }
            Exchange::Uncertain(why) => {
                ctx.metrics.uncertain();
                tracing::warn!(scope = %req.scope, reason = %why, "uncertain upstream result; asking the upstream for the key's state");
                why
            }
        };
        let reason = match settle(ctx, req, &why, last).await {
            Settled::Answer(r) => return *r,
            Settled::Stored => "the upstream holds a result for the key",
            Settled::Absent => "the upstream reports the key absent",
        };
        if resends_left == 0 {
            return Resolution::problem(
                Problem::new(
                    ProblemKind::UpstreamResultUnknown,
                    "the upstream's answer to this request is unknown; retry with the same key",
                )
                .cause(format!("{why}; {reason}; no re-send left"))
                .retry_after(Duration::from_secs(1)),
            );
        }
        resends_left -= 1;
        resent = true;
        ctx.metrics.resend();
        tracing::info!(scope = %req.scope, reason, "re-sending with the same key");
        (last, exchange) = send(ctx, req, Some(last)).await;
    }
}

/// One send of the request, to an upstream other than `avoid` when another is healthy.
/// A send that never left (connect failed) goes to the next upstream, up to one try
/// each: it cannot have taken effect. Returns the upstream the last try went to.
async fn send(ctx: &Ctx, req: &KeyedRequest, mut avoid: Option<usize>) -> (usize, Exchange) {
    let mut tries = ctx.upstreams.len();
    loop {
        ctx.metrics.upstream_call("keyed");
        let upstream = ctx.upstreams.pick(avoid);
        let exchange = upstream
            .client()
            .exchange(
                &req.method,
                &req.path_and_query,
                &req.headers,
                req.body.clone(),
            )
            .await;
        upstream.heard(Heard::from(&exchange));
        tries -= 1;
        match exchange {
            Exchange::NotSent(e) if tries > 0 => {
                tracing::debug!(scope = %req.scope, error = %e, "not sent; trying the next upstream");
                avoid = Some(upstream.index());
            }
            exchange => return (upstream.index(), exchange),
        }
    }
}

/// An idem layer's "a request with this key is in progress" answer.
fn in_progress(captured: &Captured) -> bool {
    captured.status == http::StatusCode::CONFLICT
        && serde_json::from_slice::<serde_json::Value>(&captured.body)
            .ok()
            .and_then(|v| v.get("type")?.as_str().map(str::to_string))
            .is_some_and(|t| t == ProblemKind::RequestInProgress.type_uri())
}

enum Settled {
    /// The answer for the caller (still processing past the wait, or unknown).
    Answer(Box<Resolution>),
    /// The upstream has a record of the key: a same-key re-send gets its own verdict.
    Stored,
    /// The upstream has no record of the key: a re-send with the same key is safe.
    Absent,
}

/// Asks the upstream for the key's state after an uncertain exchange. While it reports
/// the key in progress (the first attempt is still running there, say after a pause),
/// asks again until the duplicate wait runs out: the business state decides, never a
/// new key.
async fn settle(ctx: &Ctx, req: &KeyedRequest, why: &str, failed_on: usize) -> Settled {
    let deadline = Instant::now() + ctx.config.max_wait();
    loop {
        // Any upstream will do (they share one database); the one that just failed to
        // answer only when no other is healthy.
        let upstream = ctx.upstreams.pick(Some(failed_on));
        let state = upstream
            .client()
            .query_state(
                &ctx.state_method,
                &ctx.config.state_query.path,
                req.scope.key.as_str(),
                &state_query_headers(ctx, &req.headers),
                ctx.config.state_query_timeout(),
            )
            .await;
        upstream.heard(Heard::from(&state));
        drop(upstream);
        match state {
            Ok(KeyState::Done(_)) => {
                ctx.metrics.state_query("succeeded");
                return Settled::Stored;
            }
            Ok(KeyState::Processing { retry_after }) => {
                ctx.metrics.state_query("processing");
                let pause = retry_after
                    .unwrap_or(Duration::from_millis(200))
                    .clamp(Duration::from_millis(50), Duration::from_secs(1));
                if Instant::now() + pause >= deadline {
                    return Settled::Answer(Box::new(Resolution::problem(
                        Problem::new(
                            ProblemKind::RequestInProgress,
                            "the upstream is still processing this key",
                        )
                        .retry_after(retry_after.unwrap_or(Duration::from_secs(1))),
                    )));
                }
                tokio::time::sleep(pause).await;
            }
            Ok(KeyState::Absent) => {
                ctx.metrics.state_query("absent");
                return Settled::Absent;
            }
            Err(e) => {
                ctx.metrics.state_query("error");
                tracing::warn!(scope = %req.scope, error = %e, "key state query failed; not re-sending");
                return Settled::Answer(Box::new(Resolution::problem(
                    Problem::new(
                        ProblemKind::UpstreamResultUnknown,
                        "the outcome is unknown and the key's state could not be read; retry with the same key",
                    )
                    .cause(format!("{why}; state query: {e}"))
                    .retry_after(Duration::from_secs(1)),
                )));
            }
        }
    }
}
