//! What a keyed request is answered with, before either caller renders it: the run's
//! own output, the record a finished key replays, or a problem — and the one rule that
//! turns a claim that did not proceed into that answer.
//!
//! Owns that rule (texts, `Retry-After`, the decision each counts as). It must not
//! render responses: the layer and the gateway each have their body and header rules.

use std::time::Duration;

use idem_core::problem::{Problem, ProblemKind};
use idem_core::{Claim, Record};

use crate::config::InProgressMode;
use crate::decision::Decision;
use crate::pipeline::claim::{lease_left, Claimed};
use crate::pipeline::finish::{FinishedBy, NotFinished};

/// How a keyed request is answered.
#[derive(Debug)]
pub enum Answer<T> {
    /// The work ran under this request's claim.
    Fresh(Executed<T>),
    /// The key ended earlier with a stored result: replay it.
    Replay(Record),
    /// Not executed: another request's key, one still in progress, or a finished key
    /// without a stored result.
    Refused(Decision, Problem),
}

/// An answer, and whether the request waited on another execution of its key for it.
#[derive(Debug)]
pub struct Answered<T> {
    pub answer: Answer<T>,
    pub waited: bool,
}

/// A run under a claim and how its record ended.
#[derive(Debug)]
pub struct Executed<T> {
    pub output: T,
    /// The final record and who wrote it; `None` when the run withdrew its claim, or
    /// when the pipeline finished it and its policy does not read the record back.
    pub finished: Result<Option<(Record, FinishedBy)>, NotFinished>,
}

impl<T> Answer<T> {
    /// The decision this answer counts as.
    pub fn decision(&self) -> Decision {
        match self {
            Answer::Fresh(_) => Decision::Executed,
            Answer::Replay(_) => Decision::Replayed,
            Answer::Refused(decision, _) => *decision,
        }
    }
}

/// The answer to a claim that did not proceed (callers run a claim that did). In
/// progress says when to retry: the configured `Retry-After` when rejected at once, the
/// owner's remaining lease (at least a second) after a wait.
pub fn of_claim<T>(claimed: Claimed, mode: InProgressMode, shutting_down: bool) -> Answer<T> {
    let Claimed { claim, waited } = claimed;
    let retry_after = match mode {
        InProgressMode::Reject { retry_after } if !waited => retry_after,
        _ => lease_left(&claim).max(Duration::from_secs(1)),
    };
    match claim {
        Claim::Proceed(token) => {
            tracing::error!(scope = %token.scope, "a claim that proceeded reached the answer path");
            Answer::Refused(
                Decision::StoreError,
                Problem::new(
                    ProblemKind::StoreError,
                    "the request was not executed; retry with the same key",
                ),
            )
        }
        Claim::Replay(record) if record.result.is_some() => Answer::Replay(record),
        Claim::Replay(record) => Answer::Refused(
            Decision::Replayed,
            Problem::new(
                ProblemKind::ResultNotStored,
                format!(
                    "the request with this key ended {} without a stored response",
                    record.state
                ),
            ),
        ),
        Claim::Mismatch { .. } => Answer::Refused(
            Decision::Mismatch,
            Problem::new(
                ProblemKind::KeyReused,
                "this Idempotency-Key was first used with a different request (body, \
                 path, query, method, principal or fingerprinted headers); use a new \
                 key for a new intent",
            ),
        ),
        Claim::InProgress { .. } => Answer::Refused(
            Decision::InProgress,
            Problem::new(
                ProblemKind::RequestInProgress,
                if shutting_down {
                    "shutting down; the first request with this key has not finished; \
                     retry later with the same key to get its result"
                } else {
                    "the first request with this key has not finished; retry later with \
                     the same key to get its result"
                },
            )
            .retry_after(retry_after),
        ),
    }
}
