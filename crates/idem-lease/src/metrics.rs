//! Lease metrics on an explicit `prometheus-client` [`Registry`] (no global recorder, so
//! tests can build as many as they like).
//!
//! Series (names as scraped):
//! - `idem_lease_hold_fraction` (histogram): hold time of a released lease divided by its
//!   ttl; the alert fires on holds above 0.7;
//! - `idem_lease_owner_mismatch_releases_total`: releases by a caller that no longer held
//!   the lease;
//! - `idem_lease_fenced_rejections_total`: protected writes refused by a fence;
//! - `idem_lease_renew_failures_total{reason}`: `not_holder` (the store said the lease
//!   is over), `error` (the store failed or timed out), `expired` (the local deadline
//!   passed without a renewal).

use std::time::Duration;

use idem_core::{Millis, Release};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Bucket bounds of the hold fraction; 0.7 is the alert threshold.
const HOLD_FRACTION_BUCKETS: [f64; 9] = [0.1, 0.25, 0.5, 0.7, 0.9, 1.0, 2.0, 5.0, 10.0];

type ReasonLabel = [(&'static str, &'static str); 1];

/// The lease metrics; clones share the same series.
#[derive(Debug, Clone)]
pub struct LeaseMetrics {
    hold_fraction: Histogram,
    owner_mismatch_releases: Counter,
    fenced_rejections: Counter,
    renew_failures: Family<ReasonLabel, Counter>,
}

impl Default for LeaseMetrics {
    /// Metrics registered nowhere: counted, never scraped. Every reason's series
    /// starts at zero, so the family is exported before its first failure.
    fn default() -> Self {
        let renew_failures: Family<ReasonLabel, Counter> = Family::default();
        for reason in ["not_holder", "error", "expired"] {
            let _ = renew_failures.get_or_create(&[("reason", reason)]);
        }
        Self {
            hold_fraction: Histogram::new(HOLD_FRACTION_BUCKETS),
            owner_mismatch_releases: Counter::default(),
            fenced_rejections: Counter::default(),
            renew_failures,
        }
    }
}

impl LeaseMetrics {
    /// Creates the series and registers them on `registry` (the root one: names carry
    /// their full `idem_lease_` prefix).
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "idem_lease_hold_fraction",
            "Hold time of a released lease as a fraction of its ttl",
            m.hold_fraction.clone(),
        );
        registry.register(
            "idem_lease_owner_mismatch_releases",
            "Releases by a caller that no longer held the lease",
            m.owner_mismatch_releases.clone(),
        );
        registry.register(
            "idem_lease_fenced_rejections",
            "Protected writes refused because a newer fencing token was accepted",
            m.fenced_rejections.clone(),
        );
        registry.register(
            "idem_lease_renew_failures",
            "Lease renewals that failed, by reason",
            m.renew_failures.clone(),
        );
        m
    }

    /// Records a release answer: the hold fraction of a release, or an owner mismatch.
    pub fn observe_release(&self, release: &Release, ttl: Duration) {
        match release {
            Release::Released { lease, released_at } => {
                self.observe_hold(released_at - lease.acquired_at, ttl)
            }
            Release::NotHolder { .. } => {
                self.owner_mismatch_releases.inc();
            }
        }
    }

    pub fn observe_hold(&self, held_ms: Millis, ttl: Duration) {
        let ttl_ms = ttl.as_secs_f64() * 1000.0;
        if ttl_ms > 0.0 {
            self.hold_fraction.observe(held_ms.max(0) as f64 / ttl_ms);
        }
    }

    pub fn fenced_rejection(&self) {
        self.fenced_rejections.inc();
    }

    /// `reason`: `not_holder`, `error` or `expired`.
    pub fn renew_failure(&self, reason: &'static str) {
        self.renew_failures
            .get_or_create(&[("reason", reason)])
            .inc();
    }
}
