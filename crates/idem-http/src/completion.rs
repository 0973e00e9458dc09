//! In-process wake-ups for requests waiting on a key that is being processed.
//!
//! A waiter subscribes to its scope *before* re-reading the store; whoever finishes a
//! claim in this process signals the scope *after* writing the store. So a waiter either
//! sees the final record on its re-read or is woken by the signal: no lost wake-up and no
//! polling. Owners in other processes cannot signal here; the waiter bounds its sleep by
//! the record's lease deadline instead (see the service).
//!
//! This module owns only the map of waiters. It must not read the store or decide what
//! a waiter does when woken.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use idem_core::Scope;
use tokio::sync::watch;

#[derive(Debug, Default)]
pub(crate) struct CompletionSignals {
    waiting: Mutex<HashMap<Scope, (u64, watch::Sender<()>)>>,
    generation: AtomicU64,
}

/// One waiter's interest in a scope; dropping it cleans the map up.
pub(crate) struct Subscription {
    signals: Arc<CompletionSignals>,
    scope: Scope,
    generation: u64,
    receiver: watch::Receiver<()>,
}

impl CompletionSignals {
    pub(crate) fn subscribe(self: &Arc<Self>, scope: &Scope) -> Subscription {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        let (generation, sender) = waiting.entry(scope.clone()).or_insert_with(|| {
            let generation = self.generation.fetch_add(1, Ordering::Relaxed);
            (generation, watch::channel(()).0)
        });
        Subscription {
            signals: self.clone(),
            scope: scope.clone(),
            generation: *generation,
            receiver: sender.subscribe(),
        }
    }

    /// Wakes every waiter of `scope`: the record has just been finished by this process.
    pub(crate) fn finished(&self, scope: &Scope) {
        let removed = {
            let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
            if waiting.is_empty() {
                return;
            }
            waiting.remove(scope)
        };
        // Dropping the sender ends every receiver's `changed()`.
        drop(removed);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Subscription {
    /// Resolves when the scope is signalled (or was signalled since subscribing).
    pub(crate) async fn finished(&mut self) {
        // Err means the sender was dropped: that is the signal.
        let _ = self.receiver.changed().await;
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut waiting = self
            .signals
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((generation, sender)) = waiting.get(&self.scope) {
            // Our own receiver is still alive here, hence 1.
            if *generation == self.generation && sender.receiver_count() <= 1 {
                waiting.remove(&self.scope);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{IdempotencyKey, TenantId};
    use std::time::Duration;

    fn scope(k: &str) -> Scope {
        Scope::new(TenantId::new("t").unwrap(), IdempotencyKey::new(k).unwrap())
    }

    #[tokio::test]
    async fn wakes_waiters_subscribed_before_the_signal() {
        let s = Arc::new(CompletionSignals::default());
        let mut a = s.subscribe(&scope("k"));
        let mut b = s.subscribe(&scope("k"));
        let mut other = s.subscribe(&scope("other"));
        s.finished(&scope("k"));
        tokio::time::timeout(Duration::from_secs(1), a.finished())
            .await
            .expect("a woken");
        tokio::time::timeout(Duration::from_secs(1), b.finished())
            .await
            .expect("b woken");
        assert!(
            tokio::time::timeout(Duration::from_millis(50), other.finished())
                .await
                .is_err(),
            "a different scope is not woken"
        );
        drop((a, b, other));
        assert_eq!(s.len(), 0, "the map is cleaned up");
    }

    #[tokio::test]
    async fn late_subscriber_gets_a_fresh_channel() {
        let s = Arc::new(CompletionSignals::default());
        let old = s.subscribe(&scope("k"));
        s.finished(&scope("k"));
        let mut new = s.subscribe(&scope("k"));
        drop(old); // must not remove the new waiter's entry
        assert_eq!(s.len(), 1);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), new.finished())
                .await
                .is_err()
        );
        s.finished(&scope("k"));
        tokio::time::timeout(Duration::from_secs(1), new.finished())
            .await
            .expect("woken");
    }
}
