//! Claiming a key and waiting for the execution that holds it.
//!
//! Owns the claim-and-wait loop: the store's answer is idem-core's [`Claim`], unchanged.
//! It must not run anything: a claim that proceeded goes back to the caller.

use std::time::Duration;

use idem_core::{Claim, ClaimRequest, IdempotencyStore, StoreError};
use tokio::time::Instant;

use crate::config::InProgressMode;
use crate::pipeline::executions::Executions;
use crate::pipeline::wakeups::{Waiter, Wakeups};

/// The owner's remaining lease in an "in progress" answer (zero for any other).
pub fn lease_left(claim: &Claim) -> Duration {
    match claim {
        Claim::InProgress {
            lease_expires_at,
            now,
            ..
        } => {
            Duration::from_millis(u64::try_from(lease_expires_at.saturating_sub(*now)).unwrap_or(0))
        }
        _ => Duration::ZERO,
    }
}

/// The store's answer to a claim, and whether the request waited on another execution
/// for it.
#[derive(Debug)]
pub struct Claimed {
    pub claim: Claim,
    pub waited: bool,
}

/// Claims the key; while another execution holds it, either answers at once
/// ([`InProgressMode::Reject`]) or waits for its end ([`InProgressMode::Wait`]): woken
/// by `wakeups`, or at the owner's lease deadline (an owner elsewhere may have died, and
/// the next claim then takes over), bounded by the wait and by `cut_off`.
pub async fn claim(
    store: &dyn IdempotencyStore,
    wakeups: &dyn Wakeups,
    request: &ClaimRequest,
    mode: InProgressMode,
    cut_off: &Executions,
) -> Result<Claimed, StoreError> {
    let mut waiting: Option<(Instant, Box<dyn Waiter>)> = None;
    // Subscribed on first poll: only a claim that waits listens for the cut-off.
    let mut cancelled = std::pin::pin!(async { cut_off.cancelled().await });
    loop {
        let asked = Instant::now();
        let answer = store.claim(request).await;
        // The request's span (the layer's and the gateway's) carries the store's latency.
        tracing::Span::current().record("store_ms", asked.elapsed().as_secs_f64() * 1000.0);
        let claim = answer?;
        let waited = waiting.is_some();
        if !matches!(claim, Claim::InProgress { .. }) {
            return Ok(Claimed { claim, waited });
        }
        let max_wait = match mode {
            InProgressMode::Wait { max_wait } if !max_wait.is_zero() => max_wait,
            _ => return Ok(Claimed { claim, waited }),
        };
        let Some((deadline, waiter)) = waiting.as_mut() else {
            // Subscribe, then claim again: an end between the first claim and the
            // subscription is then seen by the second claim.
            waiting = Some((
                Instant::now() + max_wait,
                wakeups.subscribe(&request.scope).await,
            ));
            continue;
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || cut_off.is_cancelled() {
            return Ok(Claimed {
                claim,
                waited: true,
            });
        }
        // A little past the deadline, so the store's clock has passed it too.
        let sleep = (lease_left(&claim) + Duration::from_millis(20)).min(left);
        tokio::select! {
            _ = waiter.woken() => {}
            _ = tokio::time::sleep(sleep) => {}
            // Shutting down: answer now; claiming again could start an execution past
            // the grace.
            _ = &mut cancelled => return Ok(Claimed { claim, waited: true }),
        }
    }
}
