//! The gateway's execution ([`Forward`], the pipeline's [`Execution`]): forwarding a
//! keyed request upstream, and settling an uncertain result through the upstream's key
//! state query.
//!
//! Owns the reverse-proxy exchange of a keyed request, the choice of upstream per try,
//! the re-send rule and how an upstream answer ends the window's record. It must not
//! claim or answer: [`crate::keyed`] runs it as the pipeline's execution.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Uri};
use idem_core::{Fingerprint, Principal, Scope};

use http::header::HeaderMap;
use idem_http::headers::IDEMPOTENCY_KEY;
use idem_http::pipeline::{self, Ending, Execution, Lease, Ran, Settled, TooLarge};
use tokio::time::Instant;

use crate::ctx::{Ctx, GATEWAY_TOKEN, X_REQUEST_ID};
use crate::flights::Outcome;
use crate::outbound::{Outbound, Readied};
use crate::problem::{Problem, ProblemKind};
use crate::upstream::{Captured, Exchange, KeyState};
use crate::upstreams::Heard;

/// A keyed request, buffered and fingerprinted; its headers travel apart, as an
/// [`Outbound`] the execution readies when it sends.
#[derive(Debug)]
pub(crate) struct KeyedRequest {
    pub scope: Scope,
    pub principal: Principal,
    pub fingerprint: Fingerprint,
    pub method: Method,
    pub uri: Uri,
    pub body: Bytes,
    /// The body's share of the buffering budget, given back when the request is done.
    pub _buffered: crate::buffers::Held,
}

/// The gateway's [`Execution`]: forward upstream, under the claim's lease.
pub(crate) struct Forward<'a> {
    ctx: &'a Ctx,
    req: &'a KeyedRequest,
    outbound: Outbound,
}

impl<'a> Forward<'a> {
    pub fn new(ctx: &'a Ctx, req: &'a KeyedRequest, outbound: Outbound) -> Self {
        Self { ctx, req, outbound }
    }

    /// Readies the headers and forwards, settling an uncertain result; no lease is
    /// held here (the window's degraded mode sends this way).
    pub async fn send(self) -> Settled<Outcome> {
        let headers = self
            .outbound
            .prepare(self.ctx, &self.req.scope.tenant, &self.req.principal);
        forward(self.ctx, self.req, &headers).await
    }
}

impl Execution for Forward<'_> {
    type Output = Outcome;

    async fn run(self, lease: Lease<'_>) -> Settled<Outcome> {
        let scope = &self.req.scope;
        match lease.hold(self.send()).await {
            Ran::Done(settled) => settled,
            Ran::CutOff => {
                // Shutting down past the grace: free the key now rather than when the
                // lease runs out. The upstream may still complete; its own record
                // answers a retry.
                tracing::warn!(%scope, "shutdown grace over; ending the execution as retryable");
                problem(
                    Problem::new(
                        ProblemKind::UpstreamResultUnknown,
                        "the gateway shut down before the upstream answered; retry with the same key",
                    )
                    .retry_after(Duration::from_secs(1)),
                )
            }
        }
    }
}

/// How an upstream's complete answer ends the window's record: by the outcome policy,
/// a body over the stored limit forgotten (the upstream still has it). "Who are you"
/// answers (401, 403, 407, 511) are about the credential, not the intent: the claim is
/// withdrawn, so callers who cannot authenticate take no room and the key stays free for
/// the caller who can.
fn response(ctx: &Ctx, captured: Captured) -> Settled<Outcome> {
    let ending = if matches!(captured.status.as_u16(), 401 | 403 | 407 | 511) {
        Ending::Withdraw
    } else {
        let state = ctx
            .config
            .outcome_policy
            .classify(idem_core::Outcome::Status(captured.status.as_u16()));
        let fits = captured.body.len() <= ctx.config.max_stored_bytes;
        Ending::Finish(pipeline::ending(state, fits, TooLarge::Forget, |_| {
            captured.to_stored(&ctx.per_caller)
        }))
    };
    Settled {
        output: Outcome::Response {
            captured,
            replayed: false,
        },
        ending,
    }
}

/// A problem answer; the record opens for a retry.
pub(crate) fn problem(problem: Problem) -> Settled<Outcome> {
    Settled {
        output: Outcome::Problem(problem),
        ending: Ending::Finish(pipeline::retryable()),
    }
}

/// The headers a state query carries: the identity the gateway set, the caller's own
/// forwarded credential (the upstream authenticates the query as that caller) and the
/// key.
fn state_query_headers(ctx: &Ctx, headers: &Readied) -> HeaderMap {
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
async fn forward(ctx: &Ctx, req: &KeyedRequest, headers: &Readied) -> Settled<Outcome> {
    let (mut last, mut exchange) = send(ctx, req, headers, None).await;
    let mut resends_left = ctx.config.state_query.max_retries;
    let mut resent = false;
    loop {
        let why = match exchange {
            // The re-send met the first attempt still executing upstream: wait for it.
            Exchange::Complete(captured) if resent && in_progress(&captured) => {
                "the re-send found the first attempt still in progress".to_string()
            }
            Exchange::Complete(captured) => return response(ctx, captured),
            Exchange::NotSent(e) => {
                return problem(
                    Problem::new(
                        ProblemKind::UpstreamUnavailable,
                        "the upstream could not be reached; the request was not sent",
                    )
                    .cause(e)
                    .retry_after(Duration::from_secs(1)),
                )
            }
            Exchange::TooLarge => {
                return problem(Problem::new(
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
        // Boxed: only an uncertain result pays for the state query's loop.
        let reason = match Box::pin(settle(ctx, req, headers, &why, last)).await {
            StateAnswer::Answer(r) => return *r,
            StateAnswer::Stored => "the upstream holds a result for the key",
            StateAnswer::Absent => "the upstream reports the key absent",
        };
        if resends_left == 0 {
            return problem(
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
        (last, exchange) = send(ctx, req, headers, Some(last)).await;
    }
}

/// One send of the request, to an upstream other than `avoid` when another is healthy.
/// A send that never left (connect failed) goes to the next upstream, up to one try
/// each: it cannot have taken effect. Returns the upstream the last try went to.
async fn send(
    ctx: &Ctx,
    req: &KeyedRequest,
    headers: &Readied,
    mut avoid: Option<usize>,
) -> (usize, Exchange) {
    let mut tries = ctx.upstreams.len();
    loop {
        ctx.metrics.upstream_call("keyed");
        let upstream = ctx.upstreams.pick(avoid);
        let exchange = upstream
            .client()
            .exchange(
                &req.method,
                req.uri.path_and_query().map_or("/", |p| p.as_str()),
                &headers.headers,
                &headers.set,
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

enum StateAnswer {
    /// The answer for the caller (still processing past the wait, or unknown).
    Answer(Box<Settled<Outcome>>),
    /// The upstream has a record of the key: a same-key re-send gets its own verdict.
    Stored,
    /// The upstream has no record of the key: a re-send with the same key is safe.
    Absent,
}

/// Asks the upstream for the key's state after an uncertain exchange. While it reports
/// the key in progress (the first attempt is still running there, say after a pause),
/// asks again until the duplicate wait runs out: the business state decides, never a
/// new key.
async fn settle(
    ctx: &Ctx,
    req: &KeyedRequest,
    headers: &Readied,
    why: &str,
    failed_on: usize,
) -> StateAnswer {
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
                &state_query_headers(ctx, headers),
                ctx.config.state_query_timeout(),
            )
            .await;
        upstream.heard(Heard::from(&state));
        drop(upstream);
        match state {
            Ok(KeyState::Done(_)) => {
                ctx.metrics.state_query("succeeded");
                return StateAnswer::Stored;
            }
            Ok(KeyState::Processing { retry_after }) => {
                ctx.metrics.state_query("processing");
                let pause = retry_after
                    .unwrap_or(Duration::from_millis(200))
                    .clamp(Duration::from_millis(50), Duration::from_secs(1));
                if Instant::now() + pause >= deadline {
                    return StateAnswer::Answer(Box::new(problem(
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
                return StateAnswer::Absent;
            }
            Err(e) => {
                ctx.metrics.state_query("error");
                tracing::warn!(scope = %req.scope, error = %e, "key state query failed; not re-sending");
                return StateAnswer::Answer(Box::new(problem(
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
