//! Arrivals: every request that reached a key, with what was decided for it — the key's
//! story as an operator reads it (1 executed, 7 replayed).
//!
//! Owns the words ([`Arrival`], [`ArrivalDecision`]) and the hand-off ([`ArrivalSink`]).
//! A sink is called on the request path, after the answer is known: it must not block
//! nor fail the request. Buffering, bounds and storage are the sink's.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::key::{Principal, Scope};
use crate::record::Millis;

/// What was decided for one arrival of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArrivalDecision {
    /// It ran the handler (the key's first execution, or a retry of a retryable failure).
    Executed,
    /// It got the stored result.
    Replayed,
    /// Another arrival of the key was executing: 409.
    InProgress,
    /// Same key, different request: 422.
    Mismatch,
    /// Refused before a decision: body too large or unreadable, store unavailable or
    /// failing, key archived.
    Refused,
}

impl ArrivalDecision {
    pub const ALL: [ArrivalDecision; 5] = [
        ArrivalDecision::Executed,
        ArrivalDecision::Replayed,
        ArrivalDecision::InProgress,
        ArrivalDecision::Mismatch,
        ArrivalDecision::Refused,
    ];

    /// The stored and shown form.
    pub fn as_str(self) -> &'static str {
        match self {
            ArrivalDecision::Executed => "executed",
            ArrivalDecision::Replayed => "replayed",
            ArrivalDecision::InProgress => "in_progress",
            ArrivalDecision::Mismatch => "mismatch",
            ArrivalDecision::Refused => "refused",
        }
    }

    /// For people: `in progress` rather than `in_progress`.
    pub fn label(self) -> &'static str {
        match self {
            ArrivalDecision::InProgress => "in progress",
            other => other.as_str(),
        }
    }
}

impl fmt::Display for ArrivalDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ArrivalDecision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|d| d.as_str() == s)
            .ok_or_else(|| format!("unknown arrival decision {s:?}"))
    }
}

/// One arrival of a key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Arrival {
    pub scope: Scope,
    /// Who sent it (authenticated).
    pub principal: Principal,
    pub decision: ArrivalDecision,
    /// The status of the answer.
    pub status: u16,
    /// When it arrived, by the receiving process's clock (epoch ms). Arrivals are
    /// evidence for people, not input to a decision, so the store clock is not needed.
    pub at: Millis,
    /// How long the answer took.
    pub elapsed_ms: u32,
}

/// Takes arrivals off the request path.
pub trait ArrivalSink: Send + Sync + 'static {
    /// Hands `arrival` over. Must return at once and never fail the request: a full
    /// buffer drops the arrival (and says so in the sink's own metrics).
    fn record(&self, arrival: Arrival);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_round_trip() {
        for d in ArrivalDecision::ALL {
            assert_eq!(d.as_str().parse::<ArrivalDecision>(), Ok(d));
        }
        assert!("executed ".parse::<ArrivalDecision>().is_err());
        assert_eq!(ArrivalDecision::InProgress.label(), "in progress");
    }
}
