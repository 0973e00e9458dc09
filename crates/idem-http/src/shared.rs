//! What every request of one layer shares: the store, authentication, configuration,
//! capture, metrics, in-process wake-ups, owner ids, the retention seams and the
//! executions running under a claim.
//!
//! Owns that state and the layer's [`Pipeline`] over it. It must not decide anything
//! about a request; [`crate::layer`] builds it, the request path only reads it.

use std::sync::Arc;

use idem_core::{ArchiveLookup, ArrivalSink, IdempotencyStore};

use crate::auth::Authenticate;
use crate::config::{IdempotencyConfig, ResolvedRules};
use crate::metrics::IdempotencyMetrics;
use crate::pipeline::{Executions, FinishPolicy, LocalWakeups, OwnerIds, Pipeline, TooLarge};
use crate::replay::Capture;
use crate::retention::ReconstructResponse;

/// What every request of one layer shares.
#[derive(Clone)]
pub(crate) struct Shared {
    pub store: Arc<dyn IdempotencyStore>,
    pub auth: Arc<dyn Authenticate>,
    pub config: IdempotencyConfig,
    pub capture: Arc<Capture>,
    pub metrics: IdempotencyMetrics,
    pub wakeups: LocalWakeups,
    pub owners: Arc<OwnerIds>,
    /// Rebuilds responses the retention sweeper dropped.
    pub reconstruct: Option<Arc<dyn ReconstructResponse>>,
    /// Checked on fresh claims: archived keys answer 410 instead of executing.
    pub archive: Option<Arc<dyn ArchiveLookup>>,
    /// Handlers running under a claim (shared by every clone of the layer).
    pub executions: Arc<Executions>,
    /// Told of every keyed arrival and its decision.
    pub arrivals: Option<Arc<dyn ArrivalSink>>,
}

impl Shared {
    /// The pipeline a request under `rules` runs: a finish is retried while the store is
    /// unavailable (the handler has run, so giving up early leaves the key PROCESSING
    /// until its lease ends), and a result too large to keep is kept without its body.
    pub fn pipeline(&self, rules: &ResolvedRules) -> Pipeline<'_> {
        Pipeline {
            store: self.store.as_ref(),
            wakeups: &self.wakeups,
            executions: &self.executions,
            lease: self.config.lease,
            in_progress: rules.in_progress,
            finish: FinishPolicy {
                attempts: 6,
                too_large: TooLarge::OmitBody,
                read_back: true,
            },
        }
    }
}
