//! The claimed part of the pipeline, in one order for the layer and the gateway: claim
//! (waiting per the in-progress policy), run the work under the claim's lease, finish
//! (or withdraw) the record, wake waiters, answer.
//!
//! Owns that order. It is generic over how the work runs ([`Execution`]: the layer calls
//! its inner service, the gateway forwards upstream) and must not know HTTP framing.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{Claim, ClaimRequest, ClaimToken, Finish, IdempotencyStore, Record, StoreError};

use crate::config::InProgressMode;
use crate::pipeline::answer::{of_claim, Answer, Answered, Executed};
use crate::pipeline::claim::{claim, Claimed};
use crate::pipeline::executions::{under_lease, Executions, Ran};
use crate::pipeline::finish::{finish, FinishPolicy, FinishedBy};
use crate::pipeline::wakeups::Wakeups;

/// How one keyed request's work runs under a claim that proceeded.
pub trait Execution: Send {
    /// What the caller gets of a run (a response, or an outcome a flight shares).
    type Output: Send;

    /// Runs the work, through `lease` where the claim must stay alive meanwhile, and
    /// says how its record ends.
    fn run(self, lease: Lease<'_>) -> impl Future<Output = Settled<Self::Output>> + Send;
}

/// What a run produced and how its record ends.
#[derive(Debug)]
pub struct Settled<T> {
    pub output: T,
    pub ending: Ending,
}

/// How a record ends after its run.
#[derive(Debug)]
pub enum Ending {
    /// The pipeline writes this.
    Finish(Finish),
    /// The run said nothing about the intent (a caller who could not authenticate): the
    /// claim is withdrawn.
    Withdraw,
    /// The executed code wrote the record itself, in its own transaction.
    Finished(Record),
}

/// The claim a run holds: renews its lease while work runs, and cuts the work off when
/// the shutdown's grace ran out.
pub struct Lease<'a> {
    store: &'a dyn IdempotencyStore,
    token: &'a ClaimToken,
    lease: Duration,
    cut_off: &'a Executions,
}

impl<'a> Lease<'a> {
    pub fn token(&self) -> &ClaimToken {
        self.token
    }

    /// Drives `work` under the lease (see [`under_lease`]).
    pub fn hold<F: Future + 'a>(&self, work: F) -> impl Future<Output = Ran<F::Output>> + 'a {
        under_lease(self.store, self.token, self.lease, self.cut_off, work)
    }
}

/// One caller's pipeline: its store, wake-ups, executions and policies.
pub struct Pipeline<'a> {
    pub store: &'a dyn IdempotencyStore,
    pub wakeups: &'a dyn Wakeups,
    pub executions: &'a Arc<Executions>,
    /// The claim's lease, renewed every third of it while the work runs.
    pub lease: Duration,
    pub in_progress: InProgressMode,
    pub finish: FinishPolicy,
}

impl Pipeline<'_> {
    /// Claims `request` and answers it: runs `execution` when the claim proceeds, else
    /// the replay or refusal. A store that failed hands `execution` back, for the
    /// caller's failure mode (fail closed, fail open, forward degraded).
    pub async fn run<E: Execution>(
        &self,
        request: &ClaimRequest,
        execution: E,
    ) -> Result<Answered<E::Output>, (StoreError, E)> {
        let claimed = match claim(
            self.store,
            self.wakeups,
            request,
            self.in_progress,
            self.executions,
        )
        .await
        {
            Ok(claimed) => claimed,
            Err(e) => return Err((e, execution)),
        };
        let waited = claimed.waited;
        let answer = match claimed.claim {
            // Boxed: only a claim that proceeds pays for the run's state.
            Claim::Proceed(token) => Answer::Fresh(Box::pin(self.execute(&token, execution)).await),
            claim => {
                let claimed = Claimed { claim, waited };
                of_claim(claimed, self.in_progress, self.executions.is_cancelled())
            }
        };
        Ok(Answered { answer, waited })
    }

    /// Runs `execution` under `token`'s claim, ends its record, wakes its waiters.
    pub async fn execute<E: Execution>(
        &self,
        token: &ClaimToken,
        execution: E,
    ) -> Executed<E::Output> {
        // Counted from here, so a shutdown waits for this record.
        let _running = self.executions.start();
        let lease = Lease {
            store: self.store,
            token,
            lease: self.lease,
            cut_off: self.executions,
        };
        let Settled { output, ending } = execution.run(lease).await;
        let finished = match ending {
            Ending::Finish(end) => finish(self.store, token, end, self.finish)
                .await
                .map(|(record, by)| record.map(|r| (r, by))),
            Ending::Withdraw => {
                if let Err(e) = self.store.abandon(token).await {
                    tracing::warn!(scope = %token.scope, error = %e, "withdrawing the claim failed; it frees when its lease ends");
                }
                Ok(None)
            }
            Ending::Finished(record) => Ok(Some((record, FinishedBy::Handler))),
        };
        // Written before waking: a waiter either sees the record or is woken.
        self.wakeups.publish(&token.scope).await;
        Executed { output, finished }
    }
}
