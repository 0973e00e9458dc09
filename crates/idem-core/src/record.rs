//! The idempotency record and its state machine.
//!
//! ```text
//! absent ──claim──▶ PROCESSING ──complete──▶ SUCCEEDED          (replayed)
//!                       │      ──fail(terminal)──▶ FAILED_TERMINAL (replayed)
//!                       │      ──fail(retryable)─▶ FAILED_RETRYABLE ──claim (CAS)──▶ PROCESSING
//!                       └─ lease expired ──claim (CAS, takeover)──▶ PROCESSING (new owner)
//! ```

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::fingerprint::Fingerprint;
use crate::key::{IdempotencyKey, OwnerId, Principal, TenantId};

/// Milliseconds since the Unix epoch, read from the store's clock.
pub type Millis = i64;

/// The state of a record. "Absent" is the lack of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RecordState {
    Processing,
    Succeeded,
    FailedRetryable,
    /// A failure that must replay, like a success (Stripe replays even 500s once
    /// execution started, if the policy says so).
    FailedTerminal,
}

impl RecordState {
    pub const ALL: [RecordState; 4] = [
        RecordState::Processing,
        RecordState::Succeeded,
        RecordState::FailedRetryable,
        RecordState::FailedTerminal,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RecordState::Processing => "PROCESSING",
            RecordState::Succeeded => "SUCCEEDED",
            RecordState::FailedRetryable => "FAILED_RETRYABLE",
            RecordState::FailedTerminal => "FAILED_TERMINAL",
        }
    }

    /// Terminal states replay their stored result to every later arrival.
    pub fn is_terminal(self) -> bool {
        matches!(self, RecordState::Succeeded | RecordState::FailedTerminal)
    }
}

impl fmt::Display for RecordState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown record state {0:?}")]
pub struct UnknownState(pub String);

impl FromStr for RecordState {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, UnknownState> {
        RecordState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| UnknownState(s.to_string()))
    }
}

/// What the first execution produced, persisted for replay.
///
/// `status` and `headers` are opaque to the core: the HTTP layer stores a response there,
/// a consumer a result code. `result_ref` points at the business result (an order id) so
/// that it can be rebuilt when the full response is no longer kept.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredResult {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub result_ref: Option<String>,
}

impl StoredResult {
    /// Bytes this result takes in a record, for the size limit.
    pub fn size(&self) -> usize {
        self.body.len()
            + self
                .headers
                .iter()
                .map(|(n, v)| n.len() + v.len())
                .sum::<usize>()
            + self.result_ref.as_ref().map_or(0, String::len)
    }
}

/// The idempotency record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub tenant: TenantId,
    pub key: IdempotencyKey,
    pub principal: Principal,
    pub fingerprint: Fingerprint,
    pub state: RecordState,
    /// Incremented by every transition; every compare-and-set names it.
    pub version: i64,
    /// The current (PROCESSING) or last owner.
    pub owner: Option<OwnerId>,
    pub lease_expires_at: Option<Millis>,
    pub result: Option<StoredResult>,
    /// Executions started: 1 for the first claim, +1 for each takeover.
    pub attempts: i32,
    pub created_at: Millis,
    pub updated_at: Millis,
    pub completed_at: Option<Millis>,
}
