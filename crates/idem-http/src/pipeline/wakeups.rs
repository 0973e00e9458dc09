//! Wake-ups: how waiters of a key hear that its execution ended, in-process
//! ([`LocalWakeups`]) or across instances (the gateway's Redis pub/sub implements
//! [`Wakeups`]).
//!
//! Owns the waiting side of a claim. It must not read or write records.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use idem_core::Scope;
use tokio::sync::watch;

/// Tells waiters that a key's execution ended. In-process ([`LocalWakeups`]) or shared
/// between instances (the gateway's Redis pub/sub). Best effort: a lost wake-up costs a
/// waiter its sleep until the owner's lease deadline, never a second execution.
#[async_trait]
pub trait Wakeups: Send + Sync + 'static {
    /// Starts listening for `scope`. Called before re-reading the record, so an end
    /// between the read and the wait is not missed.
    async fn subscribe(&self, scope: &Scope) -> Box<dyn Waiter>;
    /// Wakes every waiter of `scope`; called after the record was written.
    async fn publish(&self, scope: &Scope);
}

/// One waiter's interest in a scope.
#[async_trait]
pub trait Waiter: Send {
    /// Resolves at the next wake-up since subscribing or since it last resolved.
    async fn woken(&mut self);
}

/// Wake-ups within one process: waiters of a scope share one channel, dropped (which
/// wakes them all) by whoever finishes the scope's record.
#[derive(Debug, Default, Clone)]
pub struct LocalWakeups {
    inner: Arc<LocalInner>,
}

#[derive(Debug, Default)]
struct LocalInner {
    waiting: Mutex<HashMap<Scope, (u64, watch::Sender<()>)>>,
    generation: AtomicU64,
    /// Scopes in `waiting`, read without the lock: most finishes have no waiter, and
    /// then no request takes the lock every request shares.
    scopes: AtomicUsize,
}

struct LocalWaiter {
    wakeups: LocalWakeups,
    scope: Scope,
    generation: u64,
    receiver: watch::Receiver<()>,
}

impl LocalWakeups {
    fn waiter(&self, scope: &Scope) -> LocalWaiter {
        let mut waiting = self.lock();
        let (generation, sender) = waiting.entry(scope.clone()).or_insert_with(|| {
            // Counted before the waiter re-reads the record: a finish that reads zero
            // wrote its record before this waiter's read, which then sees it.
            self.inner.scopes.fetch_add(1, Ordering::SeqCst);
            let generation = self.inner.generation.fetch_add(1, Ordering::Relaxed);
            (generation, watch::channel(()).0)
        });
        LocalWaiter {
            wakeups: self.clone(),
            scope: scope.clone(),
            generation: *generation,
            receiver: sender.subscribe(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Scope, (u64, watch::Sender<()>)>> {
        self.inner
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes every waiter of `scope` (synchronous form of [`Wakeups::publish`]).
    pub fn wake(&self, scope: &Scope) {
        // Orders the record's write before the count's read (against the waiter's
        // count-then-read).
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.inner.scopes.load(Ordering::SeqCst) == 0 {
            return;
        }
        let removed = {
            let mut waiting = self.lock();
            let removed = waiting.remove(scope);
            if removed.is_some() {
                self.inner.scopes.fetch_sub(1, Ordering::SeqCst);
            }
            removed
        };
        // Dropping the sender ends every receiver's `changed()`.
        drop(removed);
    }

    /// Scopes with waiters (for tests and gauges).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[async_trait]
impl Wakeups for LocalWakeups {
    async fn subscribe(&self, scope: &Scope) -> Box<dyn Waiter> {
        Box::new(self.waiter(scope))
    }

    async fn publish(&self, scope: &Scope) {
        self.wake(scope);
    }
}

#[async_trait]
impl Waiter for LocalWaiter {
    async fn woken(&mut self) {
        // Err means the sender was dropped: that is the wake-up. A fired channel stays
        // fired, so the next wait listens on a fresh one.
        let _ = self.receiver.changed().await;
        *self = self.wakeups.waiter(&self.scope);
    }
}

impl Drop for LocalWaiter {
    fn drop(&mut self) {
        let mut waiting = self.wakeups.lock();
        if let Some((generation, sender)) = waiting.get(&self.scope) {
            // Our own receiver is still alive here, hence 1.
            if *generation == self.generation && sender.receiver_count() <= 1 {
                waiting.remove(&self.scope);
                self.wakeups.inner.scopes.fetch_sub(1, Ordering::SeqCst);
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
    async fn local_wakeups_wake_subscribers_and_clean_up() {
        let w = LocalWakeups::default();
        let mut a = w.subscribe(&scope("k")).await;
        let mut b = w.subscribe(&scope("k")).await;
        let mut other = w.subscribe(&scope("other")).await;
        w.publish(&scope("k")).await;
        tokio::time::timeout(Duration::from_secs(1), a.woken())
            .await
            .expect("a woken");
        tokio::time::timeout(Duration::from_secs(1), b.woken())
            .await
            .expect("b woken");
        assert!(
            tokio::time::timeout(Duration::from_millis(50), other.woken())
                .await
                .is_err(),
            "a different scope is not woken"
        );
        // Woken once, a waiter listens again: the next publish wakes it again.
        assert!(
            tokio::time::timeout(Duration::from_millis(50), a.woken())
                .await
                .is_err(),
            "no second wake-up without a second publish"
        );
        w.publish(&scope("k")).await;
        tokio::time::timeout(Duration::from_secs(1), a.woken())
            .await
            .expect("a woken again");
        drop((a, b, other));
        assert!(w.is_empty(), "the map is cleaned up");
    }
}
