//! Coalescing in-process duplicates: the first arrival of a key leads its flight,
//! later arrivals with the same fingerprint follow and share its outcome without
//! touching the store.
//!
//! Owns the map of flights, sharded by scope so arrivals of different keys rarely meet
//! on one lock. It must not run a flight: the caller leads it.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, PoisonError};

use idem_core::{Fingerprint, Scope};
use tokio::sync::watch;

/// Shards of the flight map: enough that two cores rarely contend on one lock.
const SHARDS: usize = 32;

type Shard<T> = Mutex<HashMap<Scope, Flight<T>>>;

/// Executions in flight in this process, by scope: the first arrival of a key leads,
/// later arrivals with the same fingerprint follow and share its outcome `T` without
/// touching the store.
pub struct Flights<T> {
    shards: Box<[Shard<T>]>,
    hasher: std::collections::hash_map::RandomState,
}

struct Flight<T> {
    fingerprint: Fingerprint,
    outcome: watch::Receiver<Option<Arc<T>>>,
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
    shard: usize,
    scope: Scope,
    tx: watch::Sender<Option<Arc<T>>>,
}

/// Waits for a flight's outcome.
pub struct Follower<T> {
    rx: watch::Receiver<Option<Arc<T>>>,
}

impl<T> Flights<T> {
    fn shard_of(&self, scope: &Scope) -> usize {
        (self.hasher.hash_one(scope) as usize) % self.shards.len()
    }

    fn lock(&self, shard: usize) -> std::sync::MutexGuard<'_, HashMap<Scope, Flight<T>>> {
        self.shards[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: Send + Sync + 'static> Flights<T> {
    /// Flights in progress.
    pub fn len(&self) -> usize {
        (0..self.shards.len()).map(|i| self.lock(i).len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Joins the flight of `scope`, or starts one.
    pub fn join(self: &Arc<Self>, scope: &Scope, fingerprint: Fingerprint) -> Joined<T> {
        let shard = self.shard_of(scope);
        let mut map = self.lock(shard);
        match map.get(scope) {
            Some(f) if f.fingerprint != fingerprint => Joined::Mismatch,
            Some(f) => Joined::Follow(Follower {
                rx: f.outcome.clone(),
            }),
            None => {
                let (tx, rx) = watch::channel(None);
                map.insert(
                    scope.clone(),
                    Flight {
                        fingerprint,
                        outcome: rx.clone(),
                    },
                );
                Joined::Lead(
                    Lead {
                        flights: self.clone(),
                        shard,
                        scope: scope.clone(),
                        tx,
                    },
                    Follower { rx },
                )
            }
        }
    }
}

impl<T> Lead<T> {
    /// Ends the flight with `outcome`: every follower gets it.
    pub fn complete(self, outcome: T) {
        self.tx.send_replace(Some(Arc::new(outcome)));
    }
}

impl<T> Drop for Lead<T> {
    fn drop(&mut self) {
        // Removed after the outcome was sent: a new arrival either follows this flight
        // (and gets the outcome) or finds none and claims the (finished) key itself.
        self.flights.lock(self.shard).remove(&self.scope);
    }
}

impl<T> Follower<T> {
    /// The flight's outcome; `None` when its lead was dropped without one.
    pub async fn outcome(mut self) -> Option<Arc<T>> {
        match self.rx.wait_for(Option::is_some).await {
            Ok(v) => v.clone(),
            Err(_) => None,
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
        assert_eq!(follower.outcome().await.as_deref(), Some(&7));
        assert_eq!(mine.outcome().await.as_deref(), Some(&7));
        assert!(flights.is_empty());
        let Joined::Lead(lead, follower) = flights.join(&key, fp) else {
            panic!("a finished flight is gone")
        };
        drop(lead);
        assert_eq!(
            follower.outcome().await,
            None,
            "a dropped lead ends with none"
        );
    }
}
