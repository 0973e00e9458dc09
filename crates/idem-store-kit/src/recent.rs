//! A bounded, process-local hint of scopes known to hold a record: the replay shortcut.
//!
//! A retry storm or a double click sends the same key again and again, usually to the
//! instance that answered first. For a scope in this set a store reads first (a plain
//! read, as cheap as the raw driver's) and decides from it what needs no write (Redis:
//! a finished record's replay or mismatch; PostgreSQL: every decision, a takeover still
//! being its compare-and-set); when the record is absent it runs its full claim.
//! The hint never decides anything: a stale entry costs one extra read, a missing one
//! costs nothing. Memory is bounded by two generations of at most `capacity` 64-bit
//! digests each; when the current generation fills, the older one is dropped.
//!
//! It must not hold records or answers — only "this scope had a record lately".

use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

use idem_core::Scope;

/// Default digests per generation (two generations: ~2 × 16 k × 8 bytes plus set overhead).
pub const DEFAULT_RECENT_CAPACITY: usize = 16_384;

#[derive(Debug)]
pub struct RecentKeys {
    capacity: usize,
    generations: Mutex<(HashSet<u64>, HashSet<u64>)>,
}

impl Default for RecentKeys {
    fn default() -> Self {
        Self::new(DEFAULT_RECENT_CAPACITY)
    }
}

impl RecentKeys {
    /// At most `capacity` digests per generation; 0 disables the hint.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            generations: Mutex::new((HashSet::new(), HashSet::new())),
        }
    }

    fn digest(scope: &Scope) -> u64 {
        // Fixed keys: the same digest in every process run (no DoS concern: a crafted
        // collision only makes a fresh key take one extra read).
        let mut h = std::hash::DefaultHasher::new();
        scope.tenant.as_str().hash(&mut h);
        scope.key.as_str().hash(&mut h);
        h.finish()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (HashSet<u64>, HashSet<u64>)> {
        // The sets stay consistent whatever a panicking holder did: a hint.
        self.generations
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Remembers that `scope` has a record.
    pub fn note(&self, scope: &Scope) {
        if self.capacity == 0 {
            return;
        }
        let d = Self::digest(scope);
        let mut g = self.lock();
        if g.0.len() >= self.capacity {
            let current = std::mem::take(&mut g.0);
            g.1 = current;
        }
        g.0.insert(d);
    }

    /// Whether `scope` had a record lately.
    pub fn contains(&self, scope: &Scope) -> bool {
        if self.capacity == 0 {
            return false;
        }
        let d = Self::digest(scope);
        let g = self.lock();
        g.0.contains(&d) || g.1.contains(&d)
    }

    /// Forgets `scope` (its record is gone: expired, swept, archived).
    pub fn forget(&self, scope: &Scope) {
        let d = Self::digest(scope);
        let mut g = self.lock();
        g.0.remove(&d);
        g.1.remove(&d);
    }

    /// Digests held, both generations.
    pub fn len(&self) -> usize {
        let g = self.lock();
        g.0.len() + g.1.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{IdempotencyKey, TenantId};

    fn scope(t: &str, k: &str) -> Scope {
        Scope::new(TenantId::new(t).unwrap(), IdempotencyKey::new(k).unwrap())
    }

    #[test]
    fn notes_forgets_and_separates_tenants() {
        let r = RecentKeys::new(8);
        assert!(!r.contains(&scope("a", "k")));
        r.note(&scope("a", "k"));
        assert!(r.contains(&scope("a", "k")));
        assert!(!r.contains(&scope("b", "k")));
        r.forget(&scope("a", "k"));
        assert!(!r.contains(&scope("a", "k")));
    }

    #[test]
    fn bounded_by_two_generations() {
        let r = RecentKeys::new(4);
        for i in 0..100 {
            r.note(&scope("t", &format!("k{i}")));
            assert!(r.len() <= 8, "{}", r.len());
        }
        // The latest are kept, the oldest dropped.
        assert!(r.contains(&scope("t", "k99")));
        assert!(!r.contains(&scope("t", "k0")));
    }

    #[test]
    fn zero_capacity_disables() {
        let r = RecentKeys::new(0);
        r.note(&scope("t", "k"));
        assert!(!r.contains(&scope("t", "k")));
        assert!(r.is_empty());
    }
}
