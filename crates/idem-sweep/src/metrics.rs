//! The sweeper's Prometheus series. The application owns the registry; register once
//! per process and share the handle.
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `idem_sweep_transitions_total` | `from` = `retry`, `replay`, `dispute` | transitions out of the tier (a backlog record moved several tiers in one write counts in each) |
//! | `idem_sweep_stale_recovered_total` | — | PROCESSING records past their lease turned FAILED_RETRYABLE |
//! | `idem_sweep_skipped_pending_total` | `tier` | records kept in their tier because compensation is pending |
//! | `idem_sweep_archive_expired_total` | — | archive rows removed by the archive window |

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use idem_core::Tier;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct FromLabels {
    from: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TierLabels {
    tier: String,
}

/// Cheap to clone: every clone counts into the same series.
#[derive(Debug, Clone, Default)]
pub struct SweepMetrics {
    transitions: Family<FromLabels, Counter>,
    stale: Counter,
    skipped: Family<TierLabels, Counter>,
    archive_expired: Counter,
}

impl SweepMetrics {
    /// New series registered in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "idem_sweep_transitions",
            "Records moved one retention tier down",
            m.transitions.clone(),
        );
        registry.register(
            "idem_sweep_stale_recovered",
            "PROCESSING records past their lease turned FAILED_RETRYABLE",
            m.stale.clone(),
        );
        registry.register(
            "idem_sweep_skipped_pending",
            "Records kept in their tier because compensation is pending",
            m.skipped.clone(),
        );
        registry.register(
            "idem_sweep_archive_expired",
            "Archive rows removed by the archive window",
            m.archive_expired.clone(),
        );
        m
    }

    pub(crate) fn transitions(&self, from: Tier, n: u64) {
        self.transitions
            .get_or_create(&FromLabels {
                from: from.as_str().into(),
            })
            .inc_by(n);
    }

    pub(crate) fn stale_recovered(&self) {
        self.stale.inc();
    }

    pub(crate) fn skipped_pending(&self, tier: Tier) {
        self.skipped
            .get_or_create(&TierLabels {
                tier: tier.as_str().into(),
            })
            .inc();
    }

    pub(crate) fn archive_expired(&self, n: u64) {
        self.archive_expired.inc_by(n);
    }

    /// Stale recoveries counted so far.
    pub fn stale_recovered_total(&self) -> u64 {
        self.stale.get()
    }

    /// Records moved out of `from` so far.
    pub fn transitions_total(&self, from: Tier) -> u64 {
        self.transitions
            .get_or_create(&FromLabels {
                from: from.as_str().into(),
            })
            .get()
    }
}
