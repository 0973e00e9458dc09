//! Why an intent did not produce a response: rejected at once, or given up on.
//!
//! Owns the error types; the problem+json body they carry is [`crate::response`]'s. It
//! must not decide what is retried (that is [`crate::RetryPolicy`]).

use std::fmt;
use std::time::Duration;

use idem_core::IdempotencyKey;

use crate::response::{IdempotentResponse, Problem};

/// What went wrong with one attempt that will be (or would have been) retried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptFailure {
    /// No complete response within the attempt timeout.
    TimedOut { after: Duration },
    /// Connecting, sending or reading failed (reset, closed, refused).
    Connection(String),
    /// A status the policy retries.
    Status {
        status: u16,
        retry_after: Option<Duration>,
        problem: Option<Problem>,
    },
}

impl AttemptFailure {
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        match self {
            AttemptFailure::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

impl fmt::Display for AttemptFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttemptFailure::TimedOut { after } => {
                write!(f, "no response within {} ms", after.as_millis())
            }
            AttemptFailure::Connection(e) => write!(f, "connection error: {e}"),
            AttemptFailure::Status {
                status, problem, ..
            } => {
                write!(f, "status {status}")?;
                if let Some(p) = problem {
                    write!(f, " ({})", p.type_uri)?;
                }
                Ok(())
            }
        }
    }
}

/// Why the client stopped retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUpReason {
    AttemptsExhausted {
        max_attempts: u32,
    },
    TimeBudgetExhausted {
        budget: Duration,
    },
    /// The server asked to wait longer than the budget has left.
    RetryAfterBeyondBudget {
        retry_after: Duration,
        remaining: Duration,
    },
}

impl fmt::Display for GiveUpReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GiveUpReason::AttemptsExhausted { max_attempts } => {
                write!(f, "all {max_attempts} attempts used")
            }
            GiveUpReason::TimeBudgetExhausted { budget } => {
                write!(f, "time budget of {} ms used", budget.as_millis())
            }
            GiveUpReason::RetryAfterBeyondBudget {
                retry_after,
                remaining,
            } => write!(
                f,
                "server asked to retry after {} ms; only {} ms of the budget left",
                retry_after.as_millis(),
                remaining.as_millis()
            ),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// 400, 401, 413 or 422: the request itself is wrong; the same key cannot fix it.
    #[error("rejected with status {}{}", .response.status, problem_suffix(.problem))]
    Rejected {
        response: Box<IdempotentResponse>,
        problem: Option<Problem>,
    },
    /// Retrying stopped; the intent's outcome is unknown to this client, and the same key
    /// may be sent again later (`Intent::send` once more) to learn it.
    #[error("gave up on key {key} after {attempts} attempt(s) in {} ms: {reason}; last: {last}", .elapsed.as_millis())]
    GaveUp {
        key: IdempotencyKey,
        attempts: u32,
        elapsed: Duration,
        reason: GiveUpReason,
        /// The failure of the last attempt.
        last: Box<AttemptFailure>,
    },
    /// The request could not be built (bad URL, header, key or body).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
}

fn problem_suffix(problem: &Option<Problem>) -> String {
    match problem {
        Some(p) => format!(
            " ({}{})",
            p.type_uri,
            p.detail
                .as_ref()
                .map(|d| format!(": {d}"))
                .unwrap_or_default()
        ),
        None => String::new(),
    }
}

impl ClientError {
    /// The problem `type` of a rejection, to branch on.
    pub fn problem_type(&self) -> Option<&str> {
        match self {
            ClientError::Rejected {
                problem: Some(p), ..
            } => Some(&p.type_uri),
            ClientError::GaveUp { last, .. } => match &**last {
                AttemptFailure::Status {
                    problem: Some(p), ..
                } => Some(&p.type_uri),
                _ => None,
            },
            _ => None,
        }
    }

    /// The HTTP status of a rejection.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Rejected { response, .. } => Some(response.status.as_u16()),
            ClientError::GaveUp { last, .. } => match &**last {
                AttemptFailure::Status { status, .. } => Some(*status),
                _ => None,
            },
            _ => None,
        }
    }
}
