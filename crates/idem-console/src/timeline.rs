//! The arrival timeline as the console reads it: a key's arrivals counted by decision
//! and the first ones one by one. A host implements [`ArrivalTimeline`] over wherever it
//! records arrivals; the console only reads through it and must not know that storage.

use async_trait::async_trait;
use idem_core::{ArrivalDecision, Millis};

use crate::error::ConsoleError;

/// One arrival as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArrivalRow {
    pub seq: i64,
    pub at: Millis,
    pub decision: ArrivalDecision,
    pub status: u16,
    pub elapsed_ms: i64,
    pub principal: String,
}

/// A key's timeline: the counts of every arrival, and the first ones one by one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyArrivals {
    pub first_at: Millis,
    pub last_at: Millis,
    pub total: i64,
    /// By decision, in [`ArrivalDecision::ALL`] order.
    pub counts: Vec<(ArrivalDecision, i64)>,
    pub arrivals: Vec<ArrivalRow>,
}

impl KeyArrivals {
    pub fn count(&self, decision: ArrivalDecision) -> i64 {
        self.counts
            .iter()
            .find(|(d, _)| *d == decision)
            .map_or(0, |(_, n)| *n)
    }

    /// `8 arrivals: 1 executed, 7 replayed` (decisions that never happened left out).
    pub fn summary(&self) -> String {
        let parts: Vec<String> = self
            .counts
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(d, n)| format!("{n} {}", d.label()))
            .collect();
        let noun = if self.total == 1 {
            "arrival"
        } else {
            "arrivals"
        };
        format!("{} {noun}: {}", self.total, parts.join(", "))
    }
}

/// A key that arrived, found by the search (it may have no record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArrivedKey {
    pub tenant: String,
    pub key: String,
    pub last_at: Millis,
}

/// Where the console reads arrivals from.
#[async_trait]
pub trait ArrivalTimeline: Send + Sync + 'static {
    /// The timeline of `(tenant, key)`, if it had an arrival.
    async fn key_arrivals(
        &self,
        tenant: &str,
        key: &str,
    ) -> Result<Option<KeyArrivals>, ConsoleError>;

    /// Keys of `tenant` named exactly `key` that arrived (refused before a record, or
    /// whose record is gone), up to `limit`.
    async fn arrived_keys(
        &self,
        tenant: &str,
        key: &str,
        limit: usize,
    ) -> Result<Vec<ArrivedKey>, ConsoleError>;

    /// Arrivals not recorded because the recorder's buffer was full.
    fn dropped(&self) -> u64 {
        0
    }
}
