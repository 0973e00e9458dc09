//! Counters for what the layer decided, in Prometheus form.
//!
//! Owns the metric names and labels, and what each decision counts as for an
//! [`ArrivalSink`](idem_core::ArrivalSink); the application owns the [`Registry`] and the
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

use idem_core::ArrivalDecision;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

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

label_enum! {
    /// What the layer did with a request (`decision` label).
    Decision {
        /// Claimed and executed the handler.
        Executed => "executed",
        /// Returned a stored result.
        Replayed => "replayed",
        /// Answered 409 (at once, or after waiting `max_wait`).
        InProgress => "in_progress",
        /// Same key, different request: 422.
        Mismatch => "mismatch",
        MissingKey => "missing_key",
        InvalidKey => "invalid_key",
        Unauthenticated => "unauthenticated",
        TooLarge => "too_large",
        /// The request body could not be read (client went away mid-upload).
        UnreadableBody => "unreadable_body",
        /// The JSON body names a member twice: 400, nothing recorded.
        DuplicateMember => "duplicate_member",
        /// Store unreachable: 503, handler not called.
        Unavailable => "unavailable",
        /// Store unreachable on a fail-open route: handler called without protection.
        Bypassed => "bypassed",
        /// The store answered with an error that is not an outage: 500.
        StoreError => "store_error",
        /// The key was archived: 410, handler not called.
        KeyExpired => "key_expired",
    }
}

impl Decision {
    /// What an arrival's story says for this decision. A fail-open bypass ran the
    /// handler (unprotected), so it executed; decisions without a key never get there.
    fn arrival(self) -> ArrivalDecision {
        match self {
            Decision::Executed | Decision::Bypassed => ArrivalDecision::Executed,
            Decision::Replayed => ArrivalDecision::Replayed,
            Decision::InProgress => ArrivalDecision::InProgress,
            Decision::Mismatch => ArrivalDecision::Mismatch,
            _ => ArrivalDecision::Refused,
        }
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

label_enum! {
    /// Who wrote the final state of an execution's record (`finished_by` label).
    FinishedBy {
        /// The layer, after the handler returned.
        Layer => "layer",
        /// The handler, inside its own transaction (transactional mode).
        Handler => "handler",
    }
}

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
        let inner = Inner::default();
        for &decision in Decision::ALL {
            let _ = inner.requests.get_or_create(&DecisionLabels { decision });
        }
        for &kind in Conflict::ALL {
            let _ = inner.conflicts.get_or_create(&ConflictLabels { kind });
        }
        for &outcome in ExecutionOutcome::ALL {
            for &finished_by in FinishedBy::ALL {
                let _ = inner.executions.get_or_create(&ExecutionLabels {
                    outcome,
                    finished_by,
                });
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
        tracing::Span::current().record("decision", decision.as_str());
        crate::arrivals::note(decision.arrival());
        self.inner
            .requests
            .get_or_create(&DecisionLabels { decision })
            .inc();
        let conflict = match decision {
            Decision::Replayed => Conflict::Replayed,
            Decision::InProgress => Conflict::InProgress,
            Decision::Mismatch => Conflict::Mismatch,
            _ => return,
        };
        self.inner
            .conflicts
            .get_or_create(&ConflictLabels { kind: conflict })
            .inc();
    }

    pub(crate) fn execution(&self, outcome: ExecutionOutcome, finished_by: FinishedBy) {
        self.inner
            .executions
            .get_or_create(&ExecutionLabels {
                outcome,
                finished_by,
            })
            .inc();
    }

    pub(crate) fn finish_error(&self) {
        self.inner.finish_errors.inc();
    }

    /// Requests counted under `decision` so far.
    pub fn requests(&self, decision: Decision) -> u64 {
        self.inner
            .requests
            .get_or_create(&DecisionLabels { decision })
            .get()
    }

    /// Duplicate arrivals of `kind` so far.
    pub fn conflicts(&self, kind: Conflict) -> u64 {
        self.inner
            .conflicts
            .get_or_create(&ConflictLabels { kind })
            .get()
    }

    /// Executions that ended in `outcome`, finished by `finished_by`, so far.
    pub fn executions(&self, outcome: ExecutionOutcome, finished_by: FinishedBy) -> u64 {
        self.inner
            .executions
            .get_or_create(&ExecutionLabels {
                outcome,
                finished_by,
            })
            .get()
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
        assert_eq!(Decision::ALL.len(), 14);
    }

    #[test]
    fn decisions_as_arrivals() {
        assert_eq!(Decision::KeyExpired.arrival(), ArrivalDecision::Refused);
        assert_eq!(Decision::Bypassed.arrival(), ArrivalDecision::Executed);
        assert_eq!(Decision::Replayed.arrival(), ArrivalDecision::Replayed);
    }
}
