//! Counters for what the layer decided, in Prometheus form.
//!
//! Owns the metric names and labels (the decisions are [`crate::decision`]'s, which also
//! says what each is as an arrival's); the application owns the [`Registry`] and the
//! `/metrics` route. Register once per process (or per registry): tests that start the
//! app several times share one [`IdempotencyMetrics`] handle instead of registering again.
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `idem_http_requests_total` | `decision` | every request the layer looked at, by [`Decision`] |
//! | `idem_http_duplicate_key_conflicts_total` | `kind` = `replayed`, `in_progress`, `mismatch` | arrivals whose key already had a record |
//! | `idem_http_executions_total` | `outcome`, `finished_by` | handler runs under a claim, by how they ended |
//! | `idem_http_finish_errors_total` | — | claims the layer could not finish (store error, lost lease) |
//!
//! The duplicate-key conflict rate the alert rules use:
//! `sum(rate(idem_http_duplicate_key_conflicts_total[5m])) /
//!  sum(rate(idem_http_requests_total{decision!~"missing_key|invalid_key|unauthenticated|too_large|duplicate_member"}[5m]))`.

use std::sync::Arc;

use std::fmt::Write as _;

use idem_core::RecordState;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

pub use crate::decision::Decision;
pub use crate::pipeline::FinishedBy;

/// Declares a label enum whose Prometheus value is the given snake_case text.
macro_rules! label_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident => $text:literal,)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vm])* $variant,)*
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The label value.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)*
                }
            }
        }

        impl EncodeLabelValue for $name {
            fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
                encoder.write_str(self.as_str())
            }
        }
    };
}

impl EncodeLabelValue for Decision {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

label_enum! {
    /// Which kind of duplicate met an existing record (`kind` label).
    Conflict {
        Replayed => "replayed",
        InProgress => "in_progress",
        Mismatch => "mismatch",
    }
}

label_enum! {
    /// How an execution under a claim ended (`outcome` label).
    ExecutionOutcome {
        Succeeded => "succeeded",
        FailedTerminal => "failed_terminal",
        FailedRetryable => "failed_retryable",
        Panicked => "panicked",
        TimedOut => "timed_out",
    }
}

impl ExecutionOutcome {
    /// How an execution counts by the state its record ended in.
    pub fn of(state: RecordState) -> Self {
        match state {
            RecordState::Succeeded => ExecutionOutcome::Succeeded,
            RecordState::FailedTerminal => ExecutionOutcome::FailedTerminal,
            RecordState::FailedRetryable | RecordState::Processing => {
                ExecutionOutcome::FailedRetryable
            }
        }
    }
}

/// The pipeline's [`FinishedBy`] as the `finished_by` label: `layer` when the pipeline
/// wrote the record (the label dashboards already read), `handler` when the handler's
/// own transaction did.
fn finished_by_label(by: FinishedBy) -> &'static str {
    match by {
        FinishedBy::Pipeline => "layer",
        FinishedBy::Handler => "handler",
    }
}

impl EncodeLabelValue for FinishedBy {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(finished_by_label(*self))
    }
}

const FINISHED_BY: [FinishedBy; 2] = [FinishedBy::Pipeline, FinishedBy::Handler];

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DecisionLabels {
    decision: Decision,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ConflictLabels {
    kind: Conflict,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ExecutionLabels {
    outcome: ExecutionOutcome,
    finished_by: FinishedBy,
}

#[derive(Debug, Default)]
struct Inner {
    requests: Family<DecisionLabels, Counter>,
    conflicts: Family<ConflictLabels, Counter>,
    executions: Family<ExecutionLabels, Counter>,
    finish_errors: Counter,
    /// The families' series, resolved once: counting takes no family lock and no hash.
    /// Indexed by each enum's position in its `ALL` (its declaration order).
    request_series: Vec<Counter>,
    conflict_series: Vec<Counter>,
    /// `outcome * 2 + finished_by`.
    execution_series: Vec<Counter>,
}

fn finished_by_index(by: FinishedBy) -> usize {
    match by {
        FinishedBy::Pipeline => 0,
        FinishedBy::Handler => 1,
    }
}

fn execution_index(outcome: ExecutionOutcome, by: FinishedBy) -> usize {
    outcome as usize * FINISHED_BY.len() + finished_by_index(by)
}

/// A cheap-to-clone handle on the layer's counters.
#[derive(Debug, Clone)]
pub struct IdempotencyMetrics {
    inner: Arc<Inner>,
}

impl Default for IdempotencyMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl IdempotencyMetrics {
    /// Every series starts at zero (a family with no series is not exported at all, and
    /// a rate over a series that appears mid-incident misses its first increments).
    pub fn new() -> Self {
        let mut inner = Inner::default();
        for (i, &decision) in Decision::ALL.iter().enumerate() {
            debug_assert_eq!(decision as usize, i);
            let series = inner.requests.get_or_create(&DecisionLabels { decision });
            inner.request_series.push(series.clone());
        }
        for (i, &kind) in Conflict::ALL.iter().enumerate() {
            debug_assert_eq!(kind as usize, i);
            let series = inner.conflicts.get_or_create(&ConflictLabels { kind });
            inner.conflict_series.push(series.clone());
        }
        for &outcome in ExecutionOutcome::ALL {
            for finished_by in FINISHED_BY {
                debug_assert_eq!(
                    execution_index(outcome, finished_by),
                    inner.execution_series.len()
                );
                let series = inner.executions.get_or_create(&ExecutionLabels {
                    outcome,
                    finished_by,
                });
                inner.execution_series.push(series.clone());
            }
        }
        Self {
            inner: Arc::new(inner),
        }
    }

    /// Adds the counters to `registry` (names above).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "idem_http_requests",
            "Requests seen by the idempotency layer, by decision",
            self.inner.requests.clone(),
        );
        registry.register(
            "idem_http_duplicate_key_conflicts",
            "Arrivals whose idempotency key already had a record",
            self.inner.conflicts.clone(),
        );
        registry.register(
            "idem_http_executions",
            "Handler executions under a claim, by outcome",
            self.inner.executions.clone(),
        );
        registry.register(
            "idem_http_finish_errors",
            "Claims the layer could not finish",
            self.inner.finish_errors.clone(),
        );
    }

    /// Counts `decision`, and names it on the request's span (its `decision` field).
    pub(crate) fn decision(&self, decision: Decision) {
        decision.on_span();
        crate::arrivals::note(decision.arrival());
        self.inner.request_series[decision as usize].inc();
        let conflict = match decision {
            Decision::Replayed => Conflict::Replayed,
            Decision::InProgress => Conflict::InProgress,
            Decision::Mismatch => Conflict::Mismatch,
            _ => return,
        };
        self.inner.conflict_series[conflict as usize].inc();
    }

    pub(crate) fn execution(&self, outcome: ExecutionOutcome, finished_by: FinishedBy) {
        self.inner.execution_series[execution_index(outcome, finished_by)].inc();
    }

    pub(crate) fn finish_error(&self) {
        self.inner.finish_errors.inc();
    }

    /// Requests counted under `decision` so far.
    pub fn requests(&self, decision: Decision) -> u64 {
        self.inner.request_series[decision as usize].get()
    }

    /// Duplicate arrivals of `kind` so far.
    pub fn conflicts(&self, kind: Conflict) -> u64 {
        self.inner.conflict_series[kind as usize].get()
    }

    /// Executions that ended in `outcome`, finished by `finished_by`, so far.
    pub fn executions(&self, outcome: ExecutionOutcome, finished_by: FinishedBy) -> u64 {
        self.inner.execution_series[execution_index(outcome, finished_by)].get()
    }

    pub fn finish_errors(&self) -> u64 {
        self.inner.finish_errors.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_names_and_labels() {
        let m = IdempotencyMetrics::new();
        let mut registry = Registry::default();
        m.register(&mut registry);
        m.decision(Decision::Replayed);
        m.decision(Decision::Executed);
        m.execution(ExecutionOutcome::Succeeded, FinishedBy::Handler);
        m.execution(ExecutionOutcome::Succeeded, FinishedBy::Pipeline);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("idem_http_requests_total{decision=\"replayed\"} 1"),
            "{text}"
        );
        assert!(text.contains("idem_http_duplicate_key_conflicts_total{kind=\"replayed\"} 1"));
        assert!(text.contains(
            "idem_http_executions_total{outcome=\"succeeded\",finished_by=\"handler\"} 1"
        ));
        assert_eq!(m.conflicts(Conflict::InProgress), 0);
        assert_eq!(m.requests(Decision::Executed), 1);
        assert!(text
            .contains("idem_http_executions_total{outcome=\"succeeded\",finished_by=\"layer\"} 1"));
    }
}
