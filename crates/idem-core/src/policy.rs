//! Outcome policy: which results end an intent (stored and replayed) and which leave it
//! open for a retry under the same key.

use serde::{Deserialize, Serialize};

use crate::record::RecordState;

/// How an execution ended, as seen by whoever ran it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A response with this status code.
    Status(u16),
    /// The action did not finish in time.
    Timeout,
    /// The action panicked or was aborted.
    Aborted,
}

/// Maps outcomes to the state the record ends in.
///
/// Default: 2xx → SUCCEEDED; 4xx other than 408/409/429 → FAILED_TERMINAL (replayed);
/// 408/409/429, 5xx, timeouts and aborts → FAILED_RETRYABLE.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutcomePolicy {
    /// 4xx codes that leave the key open for a retry.
    pub retryable_client_errors: Vec<u16>,
    /// Replay 5xx responses instead of allowing a retry (Stripe's choice).
    pub server_errors_terminal: bool,
}

impl Default for OutcomePolicy {
    fn default() -> Self {
        Self {
            retryable_client_errors: vec![408, 409, 429],
            server_errors_terminal: false,
        }
    }
}

impl OutcomePolicy {
    pub fn classify(&self, outcome: Outcome) -> RecordState {
        match outcome {
            Outcome::Status(s) if (200..300).contains(&s) => RecordState::Succeeded,
            Outcome::Status(s) if (400..500).contains(&s) => {
                if self.retryable_client_errors.contains(&s) {
                    RecordState::FailedRetryable
                } else {
                    RecordState::FailedTerminal
                }
            }
            Outcome::Status(s) if s >= 500 && self.server_errors_terminal => {
                RecordState::FailedTerminal
            }
            // 1xx/3xx are final answers too; anything else (5xx) may be retried.
            Outcome::Status(s) if s < 500 => RecordState::Succeeded,
            Outcome::Status(_) | Outcome::Timeout | Outcome::Aborted => {
                RecordState::FailedRetryable
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_policy() {
        let p = OutcomePolicy::default();
        let check = |o, want| assert_eq!(p.classify(o), want, "{o:?}");
        check(Outcome::Status(200), RecordState::Succeeded);
        check(Outcome::Status(201), RecordState::Succeeded);
        check(Outcome::Status(302), RecordState::Succeeded);
        check(Outcome::Status(400), RecordState::FailedTerminal);
        check(Outcome::Status(422), RecordState::FailedTerminal);
        check(Outcome::Status(408), RecordState::FailedRetryable);
        check(Outcome::Status(409), RecordState::FailedRetryable);
        check(Outcome::Status(429), RecordState::FailedRetryable);
        check(Outcome::Status(500), RecordState::FailedRetryable);
        check(Outcome::Status(503), RecordState::FailedRetryable);
        check(Outcome::Timeout, RecordState::FailedRetryable);
        check(Outcome::Aborted, RecordState::FailedRetryable);
    }

    #[test]
    fn configurable() {
        let p = OutcomePolicy {
            retryable_client_errors: vec![404],
            server_errors_terminal: true,
        };
        assert_eq!(
            p.classify(Outcome::Status(500)),
            RecordState::FailedTerminal
        );
        assert_eq!(
            p.classify(Outcome::Status(404)),
            RecordState::FailedRetryable
        );
        assert_eq!(
            p.classify(Outcome::Status(429)),
            RecordState::FailedTerminal
        );
        assert_eq!(p.classify(Outcome::Timeout), RecordState::FailedRetryable);
    }
}
