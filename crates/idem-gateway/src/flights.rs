//! Executions in flight in this process: the coalescing of duplicates by scope
//! ([`Flights`], the pipeline's, carrying an [`Outcome`]) and the bound on keys each
//! partition may have executing at once ([`InProgress`]).
//!
//! Owns those two tallies and what a flight ends with. It must not run a flight: that
//! is [`crate::keyed`]'s.

use std::sync::Arc;

use idem_http::pipeline;

use crate::problem::Problem;
use crate::upstream::Captured;

/// Keys each partition has executing on this instance, bounded per partition so one
/// caller cannot hold every execution slot.
#[derive(Debug)]
pub(crate) struct InProgress {
    per_partition: usize,
    counts: std::sync::Mutex<std::collections::HashMap<idem_core::TenantId, usize>>,
}

/// One execution's slot; frees it when dropped.
pub(crate) struct Slot {
    owner: Arc<InProgress>,
    tenant: idem_core::TenantId,
}

impl InProgress {
    pub fn new(per_partition: usize) -> Self {
        Self {
            per_partition,
            counts: Default::default(),
        }
    }

    fn counts(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<idem_core::TenantId, usize>> {
        // Every update is a single insert or remove: a poisoned map is still consistent.
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for `tenant`, unless it has every slot of its partition in use.
    pub fn enter(self: &Arc<Self>, tenant: &idem_core::TenantId) -> Option<Slot> {
        let mut counts = self.counts();
        let n = counts.entry(tenant.clone()).or_default();
        if *n >= self.per_partition {
            return None;
        }
        *n += 1;
        Some(Slot {
            owner: self.clone(),
            tenant: tenant.clone(),
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.owner.counts();
        if let Some(n) = counts.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.tenant);
            }
        }
    }
}

/// What every arrival of one flight gets.
#[derive(Debug)]
pub(crate) enum Outcome {
    Response {
        captured: Captured,
        /// Came from a stored record (the window or the upstream's state endpoint).
        replayed: bool,
    },
    Problem(Problem),
}

/// Executions in flight in this process, by scope (the pipeline's coalescing).
pub(crate) type Flights = pipeline::Flights<Outcome>;
