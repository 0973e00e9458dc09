//! Coalescing in-process duplicates: the first arrival of a key leads its flight,
//! later arrivals with the same fingerprint follow and share its outcome without
//! touching the store.
//!
//! Owns the map of flights, sharded by scope so arrivals of different keys rarely meet
//! on one lock. A scope is hashed once per arrival: the hash picks the shard, finds the
//! flight and, kept by the lead, removes it. It must not run a flight: the caller leads
//! it.

use std::hash::BuildHasher;
use std::ops::Deref;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use hashbrown::HashTable;
use idem_core::{Fingerprint, Scope};
use tokio::sync::Notify;

/// Shards of the flight map: enough that two cores rarely contend on one lock.
const SHARDS: usize = 32;

type Shard<T> = Mutex<HashTable<Flight<T>>>;

/// Executions in flight in this process, by scope: the first arrival of a key leads,
/// later arrivals with the same fingerprint follow and share its outcome `T` without
/// touching the store.
pub struct Flights<T> {
    shards: Box<[Shard<T>]>,
    hasher: std::collections::hash_map::RandomState,
}

struct Flight<T> {
    scope: Scope,
    /// `scope`'s hash, for the table's rehashing.
    hash: u64,
    fingerprint: Fingerprint,
    outcome: Arc<Cell<T>>,
}

/// A flight's outcome, written once: `Some` by its lead's completion, `None` when the
/// lead was dropped without one. Followers wait on `done`.
struct Cell<T> {
    value: OnceLock<Option<T>>,
    done: Notify,
}

impl<T> Cell<T> {
    /// Writes the outcome unless one was written, and wakes every follower.
    fn end(&self, outcome: Option<T>) {
        if self.value.set(outcome).is_ok() {
            self.done.notify_waiters();
        }
    }
}

impl<T> Default for Flights<T> {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: Default::default(),
        }
    }
}

/// An arrival's place in its key's flight.
pub enum Joined<T> {
    /// No flight: this arrival runs it and completes it through the lead.
    Lead(Lead<T>, Follower<T>),
    /// A flight with the same fingerprint: wait for its outcome.
    Follow(Follower<T>),
    /// A flight of a different request under the same key.
    Mismatch,
}

/// The right to complete a flight. Dropping it without completing ends the flight with
/// no outcome (followers see `None`).
pub struct Lead<T> {
    flights: Arc<Flights<T>>,
    hash: u64,
    scope: Scope,
    cell: Arc<Cell<T>>,
}

/// Waits for a flight's outcome.
pub struct Follower<T> {
    cell: Arc<Cell<T>>,
}

/// A flight's outcome, shared by its lead and followers.
pub struct Done<T> {
    cell: Arc<Cell<T>>,
}

impl<T> Flights<T> {
    /// The shard of a scope's hash: from bits the table's bucket index does not use, so
    /// the scopes of one shard still spread over its buckets.
    fn lock(&self, hash: u64) -> std::sync::MutexGuard<'_, HashTable<Flight<T>>> {
        let shard = ((hash >> 32) as usize) % self.shards.len();
        self.shards[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: Send + Sync + 'static> Flights<T> {
    /// Flights in progress.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Joins the flight of `scope`, or starts one.
    pub fn join(self: &Arc<Self>, scope: &Scope, fingerprint: Fingerprint) -> Joined<T> {
        let hash = self.hasher.hash_one(scope);
        let mut map = self.lock(hash);
        match map.find(hash, |f| f.scope == *scope) {
            Some(f) if f.fingerprint != fingerprint => Joined::Mismatch,
            Some(f) => Joined::Follow(Follower {
                cell: f.outcome.clone(),
            }),
            None => {
                let cell = Arc::new(Cell {
                    value: OnceLock::new(),
                    done: Notify::new(),
                });
                map.insert_unique(
                    hash,
                    Flight {
                        scope: scope.clone(),
                        hash,
                        fingerprint,
                        outcome: cell.clone(),
                    },
                    |f| f.hash,
                );
                Joined::Lead(
                    Lead {
                        flights: self.clone(),
                        hash,
                        scope: scope.clone(),
                        cell: cell.clone(),
                    },
                    Follower { cell },
                )
            }
        }
    }
}

impl<T> Lead<T> {
    /// Ends the flight with `outcome`: every follower gets it.
    pub fn complete(self, outcome: T) {
        self.cell.end(Some(outcome));
    }
}

impl<T> Drop for Lead<T> {
    fn drop(&mut self) {
        // Removed after the outcome was sent: a new arrival either follows this flight
        // (and gets the outcome) or finds none and claims the (finished) key itself.
        let mut map = self.flights.lock(self.hash);
        if let Ok(flight) = map.find_entry(self.hash, |f| f.scope == self.scope) {
            flight.remove();
        }
        drop(map);
        // A lead dropped without completing ends the flight with none.
        self.cell.end(None);
    }
}

impl<T> Follower<T> {
    /// The flight's outcome; `None` when its lead was dropped without one.
    pub async fn outcome(self) -> Option<Done<T>> {
        let written = loop {
            // Listening before looking: an outcome written in between still wakes us.
            let notified = self.cell.done.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            match self.cell.value.get() {
                Some(outcome) => break outcome.is_some(),
                None => notified.await,
            }
        };
        written.then_some(Done { cell: self.cell })
    }
}

impl<T> Done<T> {
    /// The outcome itself, when nobody else holds it (no follower, the flight over).
    pub fn try_into_inner(self) -> Result<T, Self> {
        match Arc::try_unwrap(self.cell) {
            Ok(cell) => Ok(cell
                .value
                .into_inner()
                .flatten()
                .expect("a Done holds an outcome")),
            Err(cell) => Err(Self { cell }),
        }
    }
}

impl<T> Deref for Done<T> {
    type Target = T;

    fn deref(&self) -> &T {
        match self.cell.value.get() {
            Some(Some(outcome)) => outcome,
            // Made only once the outcome is written.
            _ => unreachable!("a Done holds an outcome"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{IdempotencyKey, TenantId};

    #[tokio::test]
    async fn flights_share_one_outcome_and_refuse_another_request() {
        let flights: Arc<Flights<u32>> = Arc::default();
        let key = Scope::new(
            TenantId::new("t").unwrap(),
            IdempotencyKey::new("k").unwrap(),
        );
        let fp = Fingerprint::from_bytes([1; 32]);
        let Joined::Lead(lead, mine) = flights.join(&key, fp) else {
            panic!("first arrival leads")
        };
        let Joined::Follow(follower) = flights.join(&key, fp) else {
            panic!("second arrival follows")
        };
        assert!(matches!(
            flights.join(&key, Fingerprint::from_bytes([2; 32])),
            Joined::Mismatch
        ));
        lead.complete(7);
        let theirs = follower.outcome().await.expect("an outcome");
        assert_eq!(*theirs, 7);
        let mine = mine.outcome().await.expect("an outcome");
        assert!(flights.is_empty());
        // Shared while another holds it; then the last holder takes it.
        let mine = mine
            .try_into_inner()
            .expect_err("the follower still holds it");
        drop(theirs);
        assert_eq!(mine.try_into_inner().ok(), Some(7));
        let Joined::Lead(lead, follower) = flights.join(&key, fp) else {
            panic!("a finished flight is gone")
        };
        drop(lead);
        assert!(
            follower.outcome().await.is_none(),
            "a dropped lead ends with none"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn followers_on_other_threads_all_hear_the_end() {
        let key = Scope::new(
            TenantId::new("t").unwrap(),
            IdempotencyKey::new("k").unwrap(),
        );
        let fp = Fingerprint::from_bytes([1; 32]);
        for round in 0..300u32 {
            let flights: Arc<Flights<u32>> = Arc::default();
            let Joined::Lead(lead, mine) = flights.join(&key, fp) else {
                panic!("first arrival leads")
            };
            let waiting: Vec<_> = (0..6)
                .map(|_| {
                    let Joined::Follow(f) = flights.join(&key, fp) else {
                        panic!("later arrivals follow")
                    };
                    tokio::spawn(async move { f.outcome().await.map(|d| *d) })
                })
                .collect();
            // Some followers are waiting by now, some not yet: both must hear the end.
            if round % 3 == 0 {
                tokio::task::yield_now().await;
            }
            let expected = (round % 2 == 0).then_some(round);
            match expected {
                Some(v) => lead.complete(v),
                None => drop(lead),
            }
            for w in waiting {
                assert_eq!(w.await.unwrap(), expected, "round {round}");
            }
            assert_eq!(mine.outcome().await.map(|d| *d), expected);
            assert!(flights.is_empty());
        }
    }
}
