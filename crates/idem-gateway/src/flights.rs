//! Executions in flight in this process: the coalescing of duplicates by scope
//! ([`Flights`], the pipeline's, carrying an [`Outcome`]) and the bound on keys each
//! partition may have executing at once ([`InProgress`]).
//!
//! Owns those two tallies and what a flight ends with. It must not run a flight: that
//! is [`crate::keyed`]'s.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};

use hashbrown::HashTable;
use idem_core::TenantId;
use idem_http::pipeline;

use crate::problem::Problem;
use crate::upstream::Captured;

/// Shards of the per-partition tally: arrivals of different callers rarely meet on one
/// lock.
const SHARDS: usize = 16;

/// A partition's count, with its tenant's hash (computed once per arrival).
#[derive(Debug)]
struct Count {
    tenant: TenantId,
    hash: u64,
    n: usize,
}

type Counts = HashTable<Count>;

/// Keys each partition has executing on this instance, bounded per partition so one
/// caller cannot hold every execution slot.
#[derive(Debug)]
pub(crate) struct InProgress {
    per_partition: usize,
    shards: Box<[Mutex<Counts>]>,
    hasher: RandomState,
}

/// One execution's slot; frees it when dropped.
pub(crate) struct Slot {
    owner: Arc<InProgress>,
    hash: u64,
    tenant: TenantId,
}

impl InProgress {
    pub fn new(per_partition: usize) -> Self {
        Self {
            per_partition,
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
        }
    }

    /// The shard of a tenant's hash, from bits the table's bucket index does not use.
    fn counts(&self, hash: u64) -> MutexGuard<'_, Counts> {
        let shard = ((hash >> 32) as usize) % self.shards.len();
        // Every update is a single insert or remove: a poisoned map is still consistent.
        self.shards[shard].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for `tenant`, unless it has every slot of its partition in use.
    pub fn enter(self: &Arc<Self>, tenant: &TenantId) -> Option<Slot> {
        let hash = self.hasher.hash_one(tenant);
        let mut counts = self.counts(hash);
        let count = counts
            .entry(hash, |c| c.tenant == *tenant, |c| c.hash)
            .or_insert_with(|| Count {
                tenant: tenant.clone(),
                hash,
                n: 0,
            })
            .into_mut();
        if count.n >= self.per_partition {
            return None;
        }
        count.n += 1;
        Some(Slot {
            owner: self.clone(),
            hash,
            tenant: tenant.clone(),
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.owner.counts(self.hash);
        if let Ok(mut count) = counts.find_entry(self.hash, |c| c.tenant == self.tenant) {
            count.get_mut().n -= 1;
            if count.get().n == 0 {
                count.remove();
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
