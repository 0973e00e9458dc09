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

/// Completed answers per second inside one fault kind's windows against outside every
/// fault window, over the active phase (see `docs/CHAOS.md`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Availability {
    /// Faults of this kind injected.
    pub windows: u64,
    /// The kind's windows merged and clipped to the active phase, in seconds.
    pub seconds: f64,
    /// Completed answers that arrived inside them.
    pub answers: u64,
    /// `None` when the windows last no time.
    pub inside_per_s: Option<f64>,
    /// The calm rate: the same for every kind. `None` when no time was outside a fault.
    pub outside_per_s: Option<f64>,
    /// inside / outside; `None` when either is missing or the calm rate is 0.
    pub ratio: Option<f64>,
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
    /// Every kind of `faults_by_kind`.
    pub availability_by_fault: BTreeMap<String, Availability>,
    pub invariants: Vec<InvariantResult>,
    pub anomalies_by_invariant: BTreeMap<String, usize>,
    pub anomalies: Vec<Anomaly>,
    pub arrivals: Vec<Bucket>,
    /// Evidence the faults bit: redeliveries seen by consumers, fenced writes refused,
    /// stale claims taken over, and so on.
    pub observed: BTreeMap<String, u64>,
    pub passed: bool,
}

/// Half-open `[from, to)` windows clipped to `[0, span)`, sorted, merged where they
/// overlap or touch; empty ones dropped.
fn merged(windows: impl Iterator<Item = (u64, u64)>, span: u64) -> Vec<(u64, u64)> {
    let mut w: Vec<(u64, u64)> = windows
        .map(|(a, b)| (a.min(span), b.min(span)))
        .filter(|(a, b)| a < b)
        .collect();
    w.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(w.len());
    for (a, b) in w {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// Length in ms and answers inside `windows` (merged); `sorted` holds answer times.
fn inside(windows: &[(u64, u64)], sorted: &[u64]) -> (u64, u64) {
    let count = |a: u64, b: u64| {
        (sorted.partition_point(|t| *t < b) - sorted.partition_point(|t| *t < a)) as u64
    };
    windows
        .iter()
        .fold((0, 0), |(ms, n), &(a, b)| (ms + b - a, n + count(a, b)))
}

fn per_s(answers: u64, ms: u64) -> Option<f64> {
    (ms > 0).then(|| answers as f64 * 1000.0 / ms as f64)
}

/// The availability of each of `kinds` over the active phase `[0, span_ms)`:
/// `answers_ms` are the campaign times completed answers arrived at (any order; those
/// past the active phase are left out). A moment inside windows of two kinds counts for
/// both; the calm rate is measured over the time in no window at all.
pub fn availability_by_fault<'a>(
    kinds: impl IntoIterator<Item = &'a str>,
    faults: &[FaultEvent],
    mut answers_ms: Vec<u64>,
    span_ms: u64,
) -> BTreeMap<String, Availability> {
    answers_ms.retain(|t| *t < span_ms);
    answers_ms.sort_unstable();
    let window = |f: &FaultEvent| (f.at_ms, f.end_ms);
    let (faulted_ms, faulted) = inside(&merged(faults.iter().map(window), span_ms), &answers_ms);
    let outside = per_s(answers_ms.len() as u64 - faulted, span_ms - faulted_ms);
    kinds
        .into_iter()
        .map(|kind| {
            let of_kind = || faults.iter().filter(move |f| f.kind == kind);
            let (ms, answers) = inside(&merged(of_kind().map(window), span_ms), &answers_ms);
            let inside_per_s = per_s(answers, ms);
            let ratio = match (inside_per_s, outside) {
                (Some(i), Some(o)) if o > 0.0 => Some(i / o),
                _ => None,
            };
            let a = Availability {
                windows: of_kind().count() as u64,
                seconds: ms as f64 / 1000.0,
                answers,
                inside_per_s,
                outside_per_s: outside,
                ratio,
            };
            (kind.to_string(), a)
        })
        .collect()
}

/// A rate with one decimal, or `n/a`.
pub fn rate(r: Option<f64>) -> String {
    r.map_or_else(|| "n/a".to_string(), |r| format!("{r:.1}"))
}

/// A ratio as a percentage with one decimal, or `n/a`.
pub fn percent(r: Option<f64>) -> String {
    r.filter(|r| r.is_finite())
        .map_or_else(|| "n/a".to_string(), |r| format!("{:.1}%", r * 100.0))
}

impl Report {
    /// The text summary's availability lines, one per fault kind.
    pub fn availability_lines(&self) -> Vec<String> {
        self.availability_by_fault
            .iter()
            .map(|(kind, a)| {
                let with_unit = |r: Option<f64>| r.map_or_else(|| "n/a".into(), |r| format!("{r:.1}/s"));
                format!(
                    "{kind:<8} {:>3} fault(s) {:>6.1} s  inside {:>9}  outside {:>9}  availability {}",
                    a.windows,
                    a.seconds,
                    with_unit(a.inside_per_s),
                    with_unit(a.outside_per_s),
                    percent(a.ratio)
                )
            })
            .collect()
    }
}

#[cfg(test)]
impl Report {
    /// A report of nothing: no topology, no intents, ratios of 0 by 0 (NaN).
    pub(crate) fn empty(passed: bool) -> Report {
        Report {
            seed: 7,
            control: None,
            services: 0,
            gateways: 0,
            nats: false,
            duration_ms: 0,
            settle_ms: 0,
            intents: 0,
            acknowledged: 0,
            acknowledged_ratio: f64::NAN,
            answered: 0,
            answered_ratio: f64::NAN,
            attempts: 0,
            faults_by_kind: BTreeMap::new(),
            faults: Vec::new(),
            availability_by_fault: BTreeMap::new(),
            invariants: Vec::new(),
            anomalies_by_invariant: BTreeMap::new(),
            anomalies: Vec::new(),
            arrivals: Vec::new(),
            observed: BTreeMap::new(),
            passed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(at_ms: u64, end_ms: u64, kind: &str) -> FaultEvent {
        FaultEvent {
            at_ms,
            end_ms,
            kind: kind.into(),
            target: "t".into(),
            detail: String::new(),
        }
    }

    fn figures(a: &Availability) -> (u64, f64, u64, Option<f64>, Option<f64>, Option<f64>) {
        (
            a.windows,
            a.seconds,
            a.answers,
            a.inside_per_s,
            a.outside_per_s,
            a.ratio,
        )
    }

    #[test]
    fn rates_inside_each_kind_against_the_calm_rate() {
        let faults = [fault(2_000, 4_000, "stop"), fault(6_000, 7_000, "gateway")];
        // Every 100 ms outside the windows (4 000 and 7 000 are outside: windows are
        // half-open): 70 answers in 7 s.
        let mut answers: Vec<u64> = (0..100)
            .map(|n| n * 100)
            .filter(|t| !(2_000..4_000).contains(t) && !(6_000..7_000).contains(t))
            .collect();
        assert_eq!(answers.len(), 70);
        answers.extend([2_000, 2_500, 3_000, 3_999]);
        answers.extend([6_000, 6_200, 6_400, 6_600, 6_800]);
        // After the active phase: left out.
        answers.push(12_000);
        let a = availability_by_fault(["gateway", "stop"], &faults, answers, 10_000);
        assert_eq!(
            figures(&a["stop"]),
            (1, 2.0, 4, Some(2.0), Some(10.0), Some(0.2))
        );
        assert_eq!(
            figures(&a["gateway"]),
            (1, 1.0, 5, Some(5.0), Some(10.0), Some(0.5))
        );
    }

    #[test]
    fn overlapping_windows_merge_and_count_for_every_kind_they_belong_to() {
        let faults = [
            fault(1_000, 3_000, "stop"),
            fault(2_000, 4_000, "stop"),
            fault(3_000, 5_000, "net"),
            fault(5_000, 6_000, "net"),
        ];
        // 3 500 and 3 600 lie in a stop and a net window at once.
        let answers = vec![
            1_100, 1_200, 1_300, 2_500, 3_500, 3_600, 5_500, 500, 7_000, 8_000, 9_000, 9_999,
        ];
        let a = availability_by_fault(["net", "stop"], &faults, answers, 10_000);
        // stop [1 s, 4 s): 6 answers; net [3 s, 6 s): 3; outside [0, 1 s) and [6 s, 10 s): 5.
        assert_eq!(
            figures(&a["stop"]),
            (2, 3.0, 6, Some(2.0), Some(1.0), Some(2.0))
        );
        assert_eq!(
            figures(&a["net"]),
            (2, 3.0, 3, Some(1.0), Some(1.0), Some(1.0))
        );
    }

    #[test]
    fn empty_and_clipped_windows() {
        let faults = [
            fault(8_000, 8_000, "db-conn"),
            fault(9_000, 15_000, "redis"),
        ];
        let answers = (0..10).map(|n| n * 1_000).collect();
        let a = availability_by_fault(["db-conn", "kill", "redis"], &faults, answers, 10_000);
        // A zero-length window and a kind never injected: no time, no rate, no ratio.
        assert_eq!(figures(&a["db-conn"]), (1, 0.0, 0, None, Some(1.0), None));
        assert_eq!(figures(&a["kill"]), (0, 0.0, 0, None, Some(1.0), None));
        // Clipped to the active phase: [9 s, 10 s).
        assert_eq!(
            figures(&a["redis"]),
            (1, 1.0, 1, Some(1.0), Some(1.0), Some(1.0))
        );
    }

    #[test]
    fn no_calm_time_or_no_calm_answer_gives_no_ratio() {
        let faults = [fault(0, 5_000, "stop"), fault(5_000, 10_000, "net")];
        let a = availability_by_fault(["stop", "net"], &faults, vec![100, 6_000], 10_000);
        assert_eq!(figures(&a["stop"]), (1, 5.0, 1, Some(0.2), None, None));
        let json = serde_json::to_string(&a).unwrap();
        assert!(
            json.contains("\"outside_per_s\":null,\"ratio\":null"),
            "{json}"
        );
        assert!(!json.contains("NaN"));

        let faults = [fault(0, 5_000, "stop")];
        let a = availability_by_fault(["stop"], &faults, vec![100], 10_000);
        assert_eq!(figures(&a["stop"]), (1, 5.0, 1, Some(0.2), Some(0.0), None));

        // An empty campaign: nothing to measure, nothing to panic on.
        let a = availability_by_fault(["stop"], &[], Vec::new(), 0);
        assert_eq!(figures(&a["stop"]), (0, 0.0, 0, None, None, None));
    }

    #[test]
    fn text_lines_say_each_kind_or_n_a() {
        let faults = [fault(2_000, 4_000, "stop")];
        let answers = vec![0, 1_000, 3_000, 5_000, 6_000, 7_000, 8_000, 9_000];
        let mut r = Report::empty(true);
        r.availability_by_fault = availability_by_fault(["kill", "stop"], &faults, answers, 10_000);
        assert_eq!(
            r.availability_lines(),
            [
                "kill       0 fault(s)    0.0 s  inside       n/a  outside     0.9/s  availability n/a",
                "stop       1 fault(s)    2.0 s  inside     0.5/s  outside     0.9/s  availability 57.1%",
            ]
        );
    }
}
