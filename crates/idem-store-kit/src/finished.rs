//! A bounded, process-local copy of finished records: replays without a round trip.
//!
//! A record in a final state (SUCCEEDED, FAILED_TERMINAL) changes only by disappearing —
//! its expiry, or a removal outside idem (a flush, eviction). So a store that has read
//! one may answer the next claim on its scope from memory: the same decision
//! table ([`idem_core::store::verdict`]) decides, so a different principal or fingerprint
//! is still a mismatch. An entry is used only while the store's clock (its upper bound)
//! is before both the record's own expiry and the entry's time to live; the time to live
//! bounds how long a record removed from outside can still be replayed here.
//!
//! Memory is bounded by count and by bytes in two generations: when the current one
//! fills, the older one is dropped. A hit is not moved to the current generation: a hot
//! scope is read from the store again after two rotations, one round trip. A record
//! larger than a quarter of the byte bound is not kept.
//!
//! It must not hold records that can still change (PROCESSING, FAILED_RETRYABLE), and
//! must not decide with any other rule than the stores'.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use idem_core::store::{verdict, Verdict};
use idem_core::{Claim, ClaimRequest, Millis, Record, Scope};

/// Default records per generation.
pub const DEFAULT_FINISHED_CAPACITY: usize = 4_096;
/// Default bound on the bytes of the records held, both generations.
pub const DEFAULT_FINISHED_BYTES: usize = 16 * 1024 * 1024;
/// Default time an entry is used for after it was read.
pub const DEFAULT_FINISHED_TTL: Duration = Duration::from_secs(10);

/// How large the copy may grow and how long an entry lives; a zero capacity, byte
/// bound or time to live turns it off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FinishedLimits {
    pub capacity: usize,
    pub max_bytes: usize,
    pub ttl: Duration,
}

impl Default for FinishedLimits {
    fn default() -> Self {
        Self {
            capacity: DEFAULT_FINISHED_CAPACITY,
            max_bytes: DEFAULT_FINISHED_BYTES,
            ttl: DEFAULT_FINISHED_TTL,
        }
    }
}

impl FinishedLimits {
    /// Nothing is kept.
    pub fn off() -> Self {
        Self {
            capacity: 0,
            max_bytes: 0,
            ttl: Duration::ZERO,
        }
    }

    fn is_off(&self) -> bool {
        self.capacity == 0 || self.max_bytes == 0 || self.ttl.is_zero()
    }
}

#[derive(Debug)]
struct Entry {
    record: Arc<Record>,
    /// Store time (ms) from which the entry is no longer used.
    until: Millis,
    bytes: usize,
}

#[derive(Debug, Default)]
struct Generation {
    entries: HashMap<Scope, Entry>,
    bytes: usize,
}

impl Generation {
    fn remove(&mut self, scope: &Scope) {
        if let Some(e) = self.entries.remove(scope) {
            self.bytes -= e.bytes;
        }
    }
}

/// A kept record and the store time from which it is no longer used.
#[derive(Debug, Clone)]
pub struct Kept {
    record: Arc<Record>,
    until: Millis,
}

impl Kept {
    /// The claim's answer at store time `now`: a replay or a mismatch by the stores'
    /// decision table, `None` once the entry's time is over.
    pub fn answer(self, req: &ClaimRequest, now: Millis) -> Option<Claim> {
        if now >= self.until {
            return None;
        }
        match verdict(Arc::unwrap_or_clone(self.record), req, now) {
            Verdict::Answer(claim @ (Claim::Replay(_) | Claim::Mismatch { .. })) => Some(claim),
            // Unreachable for a final record; decided by the store if it ever is not.
            Verdict::Answer(_) | Verdict::TakeOver { .. } => None,
        }
    }
}

/// See the module docs.
#[derive(Debug)]
pub struct FinishedRecords {
    limits: FinishedLimits,
    /// Current, older.
    generations: Mutex<(Generation, Generation)>,
}

impl Default for FinishedRecords {
    fn default() -> Self {
        Self::new(FinishedLimits::default())
    }
}

/// Bytes an entry is counted as: the record's variable parts and a fixed overhead.
fn size_of(record: &Record) -> usize {
    const OVERHEAD: usize = 256;
    OVERHEAD
        + record.tenant.as_str().len()
        + record.key.as_str().len()
        + record.principal.as_str().len()
        + record.owner.as_ref().map_or(0, |o| o.as_str().len())
        + record.result.as_ref().map_or(0, |r| r.size())
}

impl FinishedRecords {
    pub fn new(limits: FinishedLimits) -> Self {
        Self {
            limits,
            generations: Mutex::default(),
        }
    }

    pub fn limits(&self) -> FinishedLimits {
        self.limits
    }

    /// Whether the limits keep nothing (a store then need not read its clock to keep).
    pub fn is_off(&self) -> bool {
        self.limits.is_off()
    }

    fn lock(&self) -> MutexGuard<'_, (Generation, Generation)> {
        // Every update leaves the maps consistent; a panicking holder changes nothing.
        self.generations
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Keeps `record` (when final) for its scope, until the store's clock reaches
    /// `expires_at` (the record's own expiry) or `now` plus the time to live.
    pub fn keep(&self, record: &Record, now: Millis, expires_at: Millis) {
        if self.limits.is_off() || !record.state.is_terminal() {
            return;
        }
        let ttl = Millis::try_from(self.limits.ttl.as_millis()).unwrap_or(Millis::MAX);
        let until = expires_at.min(now.saturating_add(ttl));
        let bytes = size_of(record);
        if until <= now || bytes > self.limits.max_bytes / 4 {
            return;
        }
        let scope = Scope::new(record.tenant.clone(), record.key.clone());
        let entry = Entry {
            record: Arc::new(record.clone()),
            until,
            bytes,
        };
        let mut g = self.lock();
        let (current, older) = &mut *g;
        older.remove(&scope);
        current.remove(&scope);
        if current.entries.len() >= self.limits.capacity
            || current.bytes + bytes > self.limits.max_bytes / 2
        {
            *older = std::mem::take(current);
        }
        current.bytes += bytes;
        current.entries.insert(scope, entry);
    }

    /// The entry kept for `scope`, whatever its age: a store looks first and reads its
    /// clock only when there is one (most claims are of new keys).
    pub fn lookup(&self, scope: &Scope) -> Option<Kept> {
        if self.limits.is_off() {
            return None;
        }
        let g = self.lock();
        let entry = g.0.entries.get(scope).or_else(|| g.1.entries.get(scope))?;
        Some(Kept {
            record: entry.record.clone(),
            until: entry.until,
        })
    }

    /// The claim's answer from a kept record — a replay or a mismatch — or `None` when
    /// no entry for its scope is in use at store time `now` (an entry past its time is
    /// dropped).
    pub fn answer(&self, req: &ClaimRequest, now: Millis) -> Option<Claim> {
        self.answer_from(self.lookup(&req.scope)?, req, now)
    }

    /// As [`answer`](Self::answer), from an entry [`lookup`](Self::lookup) found before
    /// the store read its clock.
    pub fn answer_from(&self, kept: Kept, req: &ClaimRequest, now: Millis) -> Option<Claim> {
        let answer = kept.answer(req, now);
        if answer.is_none() {
            self.forget(&req.scope);
        }
        answer
    }

    /// Drops the entry of `scope` (its record is known to be gone or changed).
    pub fn forget(&self, scope: &Scope) {
        let mut g = self.lock();
        g.0.remove(scope);
        g.1.remove(scope);
    }

    /// Records held, both generations.
    pub fn len(&self) -> usize {
        let g = self.lock();
        g.0.entries.len() + g.1.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the held records are counted as, both generations.
    pub fn bytes(&self) -> usize {
        let g = self.lock();
        g.0.bytes + g.1.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{
        Fingerprint, IdempotencyKey, OwnerId, Principal, RecordState, StoredResult, TenantId,
    };

    fn request(tenant: &str, key: &str, principal: &str, body: &[u8]) -> ClaimRequest {
        ClaimRequest {
            scope: Scope::new(
                TenantId::new(tenant).unwrap(),
                IdempotencyKey::new(key).unwrap(),
            ),
            principal: Principal::new(principal).unwrap(),
            fingerprint: Fingerprint::of_bytes(body),
            owner: OwnerId::new("o1").unwrap(),
            lease: Duration::from_secs(30),
        }
    }

    fn record(req: &ClaimRequest, state: RecordState, body_len: usize) -> Record {
        Record {
            tenant: req.scope.tenant.clone(),
            key: req.scope.key.clone(),
            principal: req.principal.clone(),
            fingerprint: req.fingerprint,
            state,
            version: 2,
            owner: Some(req.owner.clone()),
            lease_expires_at: None,
            result: Some(StoredResult {
                status: 201,
                headers: vec![("content-type".into(), "application/json".into())],
                body: vec![b'x'; body_len],
                result_ref: None,
            }),
            attempts: 1,
            created_at: 1_000,
            updated_at: 1_100,
            completed_at: Some(1_100),
        }
    }

    #[test]
    fn replays_and_mismatches_by_the_stores_rule() {
        let cache = FinishedRecords::default();
        let req = request("t", "k", "alice", b"a");
        cache.keep(&record(&req, RecordState::Succeeded, 10), 1_100, 100_000);
        match cache.answer(&req, 1_200) {
            Some(Claim::Replay(r)) => assert_eq!(r.result.unwrap().status, 201),
            other => panic!("expected a replay, got {other:?}"),
        }
        // Another principal, another body: a mismatch, never the stored result.
        for other in [
            request("t", "k", "mallory", b"a"),
            request("t", "k", "alice", b"b"),
        ] {
            assert!(matches!(
                cache.answer(&other, 1_200),
                Some(Claim::Mismatch {
                    state: RecordState::Succeeded
                })
            ));
        }
        // The same key in another tenant is another intent.
        assert!(cache
            .answer(&request("u", "k", "alice", b"a"), 1_200)
            .is_none());
        cache.forget(&req.scope);
        assert!(cache.answer(&req, 1_200).is_none());
    }

    #[test]
    fn only_final_records_are_kept() {
        let cache = FinishedRecords::default();
        for state in [RecordState::Processing, RecordState::FailedRetryable] {
            let req = request("t", &format!("k-{state}"), "alice", b"a");
            cache.keep(&record(&req, state, 10), 1_100, 100_000);
            assert!(cache.answer(&req, 1_200).is_none(), "{state}");
        }
        let req = request("t", "final", "alice", b"a");
        cache.keep(
            &record(&req, RecordState::FailedTerminal, 10),
            1_100,
            100_000,
        );
        assert!(matches!(cache.answer(&req, 1_200), Some(Claim::Replay(_))));
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn an_entry_ends_at_the_records_expiry_or_its_time_to_live() {
        let cache = FinishedRecords::new(FinishedLimits {
            ttl: Duration::from_millis(500),
            ..FinishedLimits::default()
        });
        let short = request("t", "short", "alice", b"a");
        cache.keep(&record(&short, RecordState::Succeeded, 1), 1_000, 1_200);
        assert!(cache.answer(&short, 1_199).is_some());
        assert!(cache.answer(&short, 1_200).is_none(), "the record expired");
        let long = request("t", "long", "alice", b"a");
        cache.keep(&record(&long, RecordState::Succeeded, 1), 1_000, 100_000);
        assert!(cache.answer(&long, 1_499).is_some());
        assert!(
            cache.answer(&long, 1_500).is_none(),
            "the time to live ended"
        );
        assert!(cache.is_empty(), "expired entries are dropped when met");
        // Already expired when read: not kept.
        cache.keep(&record(&long, RecordState::Succeeded, 1), 2_000, 1_900);
        assert!(cache.is_empty());
    }

    #[test]
    fn bounded_by_count_and_bytes() {
        let cache = FinishedRecords::new(FinishedLimits {
            capacity: 4,
            max_bytes: 64 * 1024,
            ttl: Duration::from_secs(60),
        });
        for i in 0..100 {
            let req = request("t", &format!("k{i}"), "alice", b"a");
            cache.keep(&record(&req, RecordState::Succeeded, 10), 1_000, 100_000);
            assert!(cache.len() <= 8, "two generations of at most 4");
        }
        let last = request("t", "k99", "alice", b"a");
        assert!(cache.answer(&last, 1_001).is_some(), "the newest is kept");
        let first = request("t", "k0", "alice", b"a");
        assert!(cache.answer(&first, 1_001).is_none(), "the oldest went");

        let cache = FinishedRecords::new(FinishedLimits {
            capacity: 1_000,
            max_bytes: 64 * 1024,
            ttl: Duration::from_secs(60),
        });
        for i in 0..100 {
            let req = request("t", &format!("k{i}"), "alice", b"a");
            cache.keep(&record(&req, RecordState::Succeeded, 4_000), 1_000, 100_000);
            assert!(cache.bytes() <= 64 * 1024, "{}", cache.bytes());
        }
        let huge = request("t", "huge", "alice", b"a");
        cache.keep(
            &record(&huge, RecordState::Succeeded, 20_000),
            1_000,
            100_000,
        );
        assert!(
            cache.answer(&huge, 1_001).is_none(),
            "over a quarter of the bound"
        );
        // Kept again: one entry, counted once.
        let again = request("t", "k99", "alice", b"a");
        let before = cache.bytes();
        cache.keep(
            &record(&again, RecordState::Succeeded, 4_000),
            1_000,
            100_000,
        );
        assert_eq!(cache.bytes(), before);
    }

    #[test]
    fn an_entry_kept_again_from_the_older_generation_is_held_once() {
        let cache = FinishedRecords::new(FinishedLimits {
            capacity: 2,
            max_bytes: 64 * 1024,
            ttl: Duration::from_secs(60),
        });
        let reqs: Vec<_> = (0..3)
            .map(|i| request("t", &format!("k{i}"), "alice", b"a"))
            .collect();
        for r in &reqs {
            cache.keep(&record(r, RecordState::Succeeded, 10), 1_000, 100_000);
        }
        // k0 and k1 were rotated to the older generation when k2 came.
        assert_eq!(cache.len(), 3);
        let before = cache.bytes();
        cache.keep(
            &record(&reqs[0], RecordState::Succeeded, 10),
            1_000,
            100_000,
        );
        assert_eq!(cache.len(), 3, "moved, not copied");
        assert_eq!(cache.bytes(), before);
        let g = cache.lock();
        assert!(g.0.entries.contains_key(&reqs[0].scope));
        assert!(!g.1.entries.contains_key(&reqs[0].scope));
    }

    #[test]
    fn off_keeps_nothing() {
        let cache = FinishedRecords::new(FinishedLimits::off());
        let req = request("t", "k", "alice", b"a");
        cache.keep(&record(&req, RecordState::Succeeded, 10), 1_000, 100_000);
        assert!(cache.answer(&req, 1_001).is_none());
        assert!(cache.is_empty());
    }

    #[test]
    fn concurrent_keeps_and_answers_stay_within_bounds() {
        let cache = Arc::new(FinishedRecords::new(FinishedLimits {
            capacity: 16,
            max_bytes: 1024 * 1024,
            ttl: Duration::from_secs(60),
        }));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let cache = cache.clone();
                std::thread::spawn(move || {
                    for i in 0..2_000 {
                        let req = request("t", &format!("k{}", i % 40), "alice", b"a");
                        if (i + t) % 2 == 0 {
                            cache.keep(&record(&req, RecordState::Succeeded, 8), 1_000, 100_000);
                        } else if let Some(claim) = cache.answer(&req, 1_001) {
                            assert!(
                                matches!(claim, Claim::Replay(ref r) if r.key == req.scope.key)
                            );
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(cache.len() <= 32);
        let counted: usize = {
            let g = cache.lock();
            g.0.entries
                .values()
                .chain(g.1.entries.values())
                .map(|e| e.bytes)
                .sum()
        };
        assert_eq!(counted, cache.bytes(), "the byte count matches the entries");
    }
}
