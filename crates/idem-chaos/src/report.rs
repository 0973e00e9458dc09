//! What a campaign found: the summary printed as JSON, the text rendering, and the data
//! the HTML report draws. Owns no checking logic; `check` fills it.

use std::collections::BTreeMap;

use serde::Serialize;

/// One fault as it was injected: from `at_ms` to `end_ms`, campaign-relative.
#[derive(Debug, Clone, Serialize)]
pub struct FaultEvent {
    pub at_ms: u64,
    pub end_ms: u64,
    /// `kill`, `stop`, `gateway`, `db-conn`, `redis`, `bus` or `net`.
    pub kind: String,
    /// The process or link it hit (`serve-1`, `gateway-0`, `serve-0→postgres`, …).
    pub target: String,
    pub detail: String,
}

/// An invariant that does not hold for one intent or row set.
#[derive(Debug, Clone, Serialize)]
pub struct Anomaly {
    /// `I1` … `I8`.
    pub invariant: String,
    pub intent: Option<String>,
    pub key: Option<String>,
    /// Order ids (or other row ids) involved.
    pub rows: Vec<String>,
    pub detail: String,
    /// Faults active around the intent (`kind target @ms`).
    pub faults: Vec<String>,
}

/// One invariant's result.
#[derive(Debug, Clone, Serialize)]
pub struct InvariantResult {
    pub id: String,
    pub title: String,
    /// How many intents, orders or rows it looked at.
    pub checked: u64,
    pub anomalies: usize,
    pub passed: bool,
}

/// Arrivals per second of the campaign, by how the attempt ended.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Bucket {
    pub second: u64,
    /// Attempts answered 2xx.
    pub ok: u64,
    /// Of those, replays.
    pub replayed: u64,
    /// Attempts that ended otherwise (status or transport error) and were retried.
    pub retried: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub seed: u64,
    /// `None` for the keyed workload, `Some("legacy")` for the control.
    pub control: Option<String>,
    pub services: usize,
    pub gateways: usize,
    pub nats: bool,
    pub duration_ms: u64,
    pub settle_ms: u64,
    pub intents: u64,
    /// Intents a 2xx acknowledged.
    pub acknowledged: u64,
    /// acknowledged / intents.
    pub acknowledged_ratio: f64,
    /// Acknowledged, plus the refused halves of the pay/cancel races (I8 counts these).
    pub answered: u64,
    pub answered_ratio: f64,
    pub attempts: u64,
    pub faults_by_kind: BTreeMap<String, u64>,
    pub faults: Vec<FaultEvent>,
    pub invariants: Vec<InvariantResult>,
    pub anomalies_by_invariant: BTreeMap<String, usize>,
    pub anomalies: Vec<Anomaly>,
    pub arrivals: Vec<Bucket>,
    /// Evidence the faults bit: redeliveries seen by consumers, fenced writes refused,
    /// stale claims taken over, and so on.
    pub observed: BTreeMap<String, u64>,
    pub passed: bool,
}
