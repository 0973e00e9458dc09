//! What every request of one layer shares: the store, authentication, configuration,
//! capture, metrics, in-process wake-ups, owner ids, the retention seams and the
//! executions running under a claim.
//!
//! Owns that state and the owner ids of claims. It must not decide anything about a
//! request; [`crate::layer`] builds it, the request path only reads it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use idem_core::{ArchiveLookup, ArrivalSink, IdempotencyStore, OwnerId};

use crate::auth::Authenticate;
use crate::config::IdempotencyConfig;
use crate::metrics::IdempotencyMetrics;
use crate::pipeline::{Executions, LocalWakeups};
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

/// Owner ids for claims: one prefix per layer instance, a sequence number per claim, so
/// a record's owner tells which process and which request held it.
pub(crate) struct OwnerIds {
    prefix: String,
    next: AtomicU64,
}

impl OwnerIds {
    pub(crate) fn new() -> Self {
        Self {
            prefix: format!("http-{}", uuid::Uuid::now_v7().simple()),
            next: AtomicU64::new(1),
        }
    }

    pub(crate) fn next(&self) -> OwnerId {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        OwnerId::new(format!("{}#{n}", self.prefix)).expect("owner ids are visible ASCII")
    }
}
