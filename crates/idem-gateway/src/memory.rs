//! The short window in this process's memory: an [`IdempotencyStore`] for a single
//! gateway instance (the default when no Redis is configured).
//!
//! Same contract as every store (the shared conformance suite runs against it): claims
//! are atomic (one mutex around the map), finish and extend are compare-and-sets on
//! version and owner, times come from the store's clock (the system clock plus a
//! [`ClockShift`]). Records expire like the Redis store's: a finished record `window`
//! after it finished, a PROCESSING one `window` after its lease deadline. Expired records
//! are invisible at once and removed by an amortised sweep (a min-heap of deadlines), so
//! memory stays bounded by the traffic of one window — and by `max_bytes`: when the
//! records held reach it, a claim on a new key fails as `Unavailable` (the gateway fails
//! closed) instead of growing without bound under a flood of fresh keys; existing keys
//! still replay, finish and renew. Each partition (the window tenant: an API key's tenant,
//! or one caller without API keys) may hold at most `partition_bytes` of it, so one
//! caller cannot fill the window for the others. Both refusals say when the first record
//! that would make room expires.
//!
//! Nothing survives the process: this store dedups bursts, the business layer stays the
//! source of truth.

use std::cmp::Reverse;
use std::collections::hash_map::RandomState;
use std::collections::BinaryHeap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use hashbrown::HashTable;
use idem_core::store::{lease_millis, verdict, Verdict};
use idem_core::{
    Claim, ClaimKind, ClaimRequest, ClaimToken, ClockShift, Finish, IdempotencyStore, Millis,
    Record, RecordState, Scope, StoreError, StoreLimits, TenantId,
};

/// How to build a [`MemoryStore`].
#[derive(Debug, Clone)]
pub struct MemoryOptions {
    /// How long a finished record is kept (and how long a PROCESSING record outlives its
    /// lease).
    pub window: Duration,
    pub limits: StoreLimits,
    /// Added to the system clock; zero in production.
    pub clock: ClockShift,
    /// Approximate bytes of records held (keys, identity, stored responses) past which
    /// new keys are refused.
    pub max_bytes: usize,
    /// The most one partition (tenant) may hold of `max_bytes`.
    pub partition_bytes: usize,
}

/// Default budget of the in-memory window.
pub const DEFAULT_MAX_BYTES: usize = 256 * 1024 * 1024;

impl Default for MemoryOptions {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(120),
            limits: StoreLimits::default(),
            clock: ClockShift::new(),
            max_bytes: DEFAULT_MAX_BYTES,
            partition_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

/// What a record costs in memory, roughly: its strings and response plus a fixed
/// overhead for the map entry, the heap entry and the record's other fields.
fn record_bytes(r: &Record) -> usize {
    const OVERHEAD: usize = 256;
    let result = r.result.as_ref().map_or(0, |x| {
        x.body.len()
            + x.result_ref.as_ref().map_or(0, String::len)
            + x.headers
                .iter()
                .map(|(n, v)| n.len() + v.len() + 16)
                .sum::<usize>()
    });
    OVERHEAD
        + 2 * (r.tenant.as_str().len() + r.key.as_str().len())
        + r.principal.as_str().len()
        + r.owner.as_ref().map_or(0, |o| o.as_str().len())
        + result
}

struct Entry {
    /// The map's key, shared with the expiry heap (no copy of the strings per write).
    scope: Arc<Scope>,
    /// `scope`'s hash, and its tenant's (where its partition is found).
    hash: u64,
    tenant_hash: u64,
    record: Record,
    expires_at: Millis,
    /// `record_bytes(&record)`, kept so removal and rewrites need not walk the record.
    bytes: usize,
}

/// A record's expiry in the heap (with its scope's hash): earliest first, by time only.
struct Due(Millis, Arc<Scope>, u64);

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Due {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.0.cmp(&self.0)
    }
}

/// What one partition holds.
struct Partition {
    tenant: TenantId,
    hash: u64,
    bytes: usize,
    records: usize,
    /// Expiry times of its records, earliest first; may hold stale (earlier) times of
    /// rewritten records, so the room it promises comes no later than this says.
    expiries: BinaryHeap<Reverse<Millis>>,
}

/// A scope with its hash, computed once per call (its tenant's is kept by its entry).
#[derive(Clone, Copy)]
struct Hashed<'a> {
    scope: &'a Scope,
    hash: u64,
}

/// The records, their expiries and the partitions' tallies. The tables are keyed by
/// hashes the store computes once per call with its own keyed hasher, so a lookup
/// after the first costs no hashing.
#[derive(Default)]
struct State {
    /// Boxed: the table moves only pointers when it grows. Entries held inline made
    /// every doubling copy, and fault in, hundreds of bytes per record held.
    records: HashTable<Box<Entry>>,
    /// `record_bytes` of every record held.
    bytes: usize,
    /// (deadline, scope) pairs; stale pairs (the record was rewritten with a later
    /// deadline) are skipped by the sweep.
    expiries: BinaryHeap<Due>,
    partitions: HashTable<Partition>,
}

impl State {
    fn sweep(&mut self, now: Millis) {
        while let Some(Due(at, _, _)) = self.expiries.peek() {
            if *at > now {
                break;
            }
            let Some(Due(_, scope, hash)) = self.expiries.pop() else {
                break;
            };
            let at = Hashed {
                scope: &scope,
                hash,
            };
            if self.entry(at).is_some_and(|e| e.expires_at <= now) {
                self.remove(at);
            }
        }
    }

    fn entry(&mut self, at: Hashed<'_>) -> Option<&mut Entry> {
        self.records
            .find_mut(at.hash, |e| *e.scope == *at.scope)
            .map(|e| &mut **e)
    }

    fn partition_of(&mut self, tenant: &TenantId, hash: u64) -> Option<&mut Partition> {
        self.partitions.find_mut(hash, |p| p.tenant == *tenant)
    }

    fn remove(&mut self, at: Hashed<'_>) {
        let Ok(found) = self.records.find_entry(at.hash, |e| *e.scope == *at.scope) else {
            return;
        };
        let (gone, _) = found.remove();
        self.bytes = self.bytes.saturating_sub(gone.bytes);
        if let Ok(mut p) = self
            .partitions
            .find_entry(gone.tenant_hash, |p| p.tenant == gone.scope.tenant)
        {
            let p_mut = p.get_mut();
            p_mut.bytes = p_mut.bytes.saturating_sub(gone.bytes);
            p_mut.records = p_mut.records.saturating_sub(1);
            if p_mut.records == 0 {
                p.remove();
            }
        }
    }

    /// Bytes one partition holds.
    fn partition_bytes(&self, tenant: &TenantId, hash: u64) -> usize {
        self.partitions
            .find(hash, |p| p.tenant == *tenant)
            .map_or(0, |p| p.bytes)
    }

    /// When the earliest record of a partition expires.
    fn partition_frees_at(&mut self, tenant: &TenantId, hash: u64, now: Millis) -> Option<Millis> {
        let p = self.partition_of(tenant, hash)?;
        while p.expiries.peek().is_some_and(|Reverse(at)| *at <= now) {
            p.expiries.pop();
        }
        p.expiries.peek().map(|Reverse(at)| *at)
    }

    /// When the earliest record of the whole window expires.
    fn frees_at(&self) -> Option<Millis> {
        self.expiries.peek().map(|Due(at, _, _)| *at)
    }

    fn live(&mut self, at: Hashed<'_>, now: Millis) -> Option<&mut Entry> {
        self.entry(at).filter(|e| e.expires_at > now)
    }

    /// The partition of `tenant`, made on its first record (the tenant's name is
    /// shared, so its clone is a count).
    fn partition(&mut self, tenant: &TenantId, hash: u64) -> &mut Partition {
        self.partitions
            .entry(hash, |p| p.tenant == *tenant, |p| p.hash)
            .or_insert_with(|| Partition {
                tenant: tenant.clone(),
                hash,
                bytes: 0,
                records: 0,
                expiries: BinaryHeap::new(),
            })
            .into_mut()
    }

    /// Holds a record for a scope that has none (an expired one not yet swept is
    /// replaced). `hash` is the scope's, `tenant_hash` its tenant's.
    fn insert(&mut self, record: Record, hash: u64, tenant_hash: u64, expires_at: Millis) {
        let scope = Arc::new(Scope::new(record.tenant.clone(), record.key.clone()));
        let at = Hashed {
            scope: &scope,
            hash,
        };
        // An expired record not yet swept: its bytes leave the tallies first.
        self.remove(at);
        self.expiries.push(Due(expires_at, scope.clone(), hash));
        let bytes = record_bytes(&record);
        self.bytes += bytes;
        let p = self.partition(&scope.tenant, tenant_hash);
        p.bytes += bytes;
        p.records += 1;
        p.expiries.push(Reverse(expires_at));
        let entry = Entry {
            scope,
            hash,
            tenant_hash,
            record,
            expires_at,
            bytes,
        };
        self.records
            .insert_unique(hash, Box::new(entry), |e| e.hash);
    }

    /// Changes the record held for a scope in place (`change` must keep its tenant and
    /// key) and gives it a new expiry.
    fn rewrite(
        &mut self,
        at: Hashed<'_>,
        expires_at: Millis,
        change: impl FnOnce(&mut Record),
    ) -> Option<&Record> {
        // Field by field, so the entry stays borrowed: one lookup of the scope.
        let State {
            records,
            bytes,
            expiries,
            partitions,
        } = self;
        let entry = records.find_mut(at.hash, |e| *e.scope == *at.scope)?;
        change(&mut entry.record);
        let (old, new) = (entry.bytes, record_bytes(&entry.record));
        entry.bytes = new;
        entry.expires_at = expires_at;
        expiries.push(Due(expires_at, entry.scope.clone(), entry.hash));
        *bytes = bytes.saturating_sub(old) + new;
        if let Some(p) = partitions.find_mut(entry.tenant_hash, |p| p.tenant == entry.scope.tenant)
        {
            p.bytes = p.bytes.saturating_sub(old) + new;
            p.expiries.push(Reverse(expires_at));
        }
        Some(&entry.record)
    }
}

/// Idempotency records in process memory. Cheap to clone; clones share the records.
#[derive(Clone)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
    /// Keys the tables' hashes (shared by clones, like the records).
    hasher: RandomState,
    window_ms: i64,
    limits: StoreLimits,
    clock: ClockShift,
    max_bytes: usize,
    partition_bytes: usize,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("window_ms", &self.window_ms)
            .finish_non_exhaustive()
    }
}

impl MemoryStore {
    pub fn new(options: MemoryOptions) -> Self {
        Self {
            state: Arc::new(Mutex::new(State::default())),
            hasher: RandomState::new(),
            window_ms: i64::try_from(options.window.as_millis()).unwrap_or(i64::MAX / 4),
            limits: options.limits,
            clock: options.clock,
            max_bytes: options.max_bytes,
            partition_bytes: options.partition_bytes,
        }
    }

    /// Approximate bytes of the records held (expired ones not yet swept included).
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Whether a new key would be refused now (expired records swept first).
    pub fn is_full(&self) -> bool {
        let now = self.now();
        let mut st = self.lock();
        st.sweep(now);
        st.bytes >= self.max_bytes
    }

    /// Records currently held (expired ones not yet swept included).
    pub fn len(&self) -> usize {
        self.lock().records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn now(&self) -> Millis {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        wall + self.clock.millis()
    }

    /// Finishes the claim and hands `read` the record written.
    fn finish_with<T>(
        &self,
        token: &ClaimToken,
        finish: Finish,
        read: impl FnOnce(&Record) -> T,
    ) -> Result<T, StoreError> {
        self.limits.check_finish(&finish)?;
        let (mut st, at, now) = self.holding(token)?;
        let done = st.rewrite(at, now + self.window_ms, |r| {
            r.state = finish.state;
            r.version += 1;
            r.lease_expires_at = None;
            r.result = finish.result;
            r.updated_at = now;
            r.completed_at = finish.state.is_terminal().then_some(now);
        });
        Ok(read(done.expect("checked live above")))
    }

    /// The locked state, where `token`'s claim is still the live record of its scope
    /// (else superseded), with the scope's place and the store's time.
    fn holding<'t>(
        &self,
        token: &'t ClaimToken,
    ) -> Result<(std::sync::MutexGuard<'_, State>, Hashed<'t>, Millis), StoreError> {
        let now = self.now();
        let at = self.at(&token.scope);
        let mut st = self.lock();
        st.live(at, now)
            .filter(|e| current(&e.record, token))
            .ok_or_else(|| StoreError::superseded(token))?;
        Ok((st, at, now))
    }

    fn at<'a>(&self, scope: &'a Scope) -> Hashed<'a> {
        Hashed {
            scope,
            hash: self.hasher.hash_one(scope),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a record half-written (every
        // mutation is a single insert), so a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl IdempotencyStore for MemoryStore {
    fn backend(&self) -> &'static str {
        "memory"
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        let lease = self.limits.claim_lease(req)?;
        let now = self.now();
        let deadline = now + lease;
        let at = self.at(&req.scope);
        let mut st = self.lock();
        st.sweep(now);
        let expires_at = deadline + self.window_ms;
        if let Some(entry) = st.live(at, now) {
            let (mut r, kind) = match verdict(entry.record.clone(), req, now) {
                Verdict::Answer(claim) => return Ok(claim),
                Verdict::TakeOver { existing, kind } => (existing, kind),
            };
            r.state = RecordState::Processing;
            r.version += 1;
            r.attempts += 1;
            r.owner = Some(req.owner.clone());
            r.lease_expires_at = Some(deadline);
            r.result = None;
            r.completed_at = None;
            r.updated_at = now;
            let token = ClaimToken::of(req, r.version, deadline, r.attempts, kind);
            st.rewrite(at, expires_at, |held| *held = r);
            return Ok(Claim::Proceed(token));
        }
        // A new key: admitted while the window and the caller's share have room.
        let held = st.bytes;
        if held >= self.max_bytes {
            let frees_at = st.frees_at();
            return Err(full(
                format!(
                    "the in-memory window is full ({held} of {} bytes); share the window \
                     through Redis or raise its budget",
                    self.max_bytes
                ),
                false,
                frees_at,
                now,
            ));
        }
        let tenant = &req.scope.tenant;
        let tenant_hash = self.hasher.hash_one(tenant);
        let mine = st.partition_bytes(tenant, tenant_hash);
        if mine >= self.partition_bytes {
            let frees_at = st.partition_frees_at(tenant, tenant_hash, now);
            return Err(full(
                format!(
                    "this caller's share of the window is full ({mine} of {} bytes)",
                    self.partition_bytes
                ),
                true,
                frees_at,
                now,
            ));
        }
        let record = idem_core::store::fresh_record(req, now, deadline);
        let token = ClaimToken::of(
            req,
            record.version,
            deadline,
            record.attempts,
            ClaimKind::Fresh,
        );
        st.insert(record, at.hash, tenant_hash, expires_at);
        Ok(Claim::Proceed(token))
    }

    async fn finish(&self, token: &ClaimToken, finish: Finish) -> Result<Record, StoreError> {
        self.finish_with(token, finish, Record::clone)
    }

    async fn finish_quiet(&self, token: &ClaimToken, finish: Finish) -> Result<(), StoreError> {
        self.finish_with(token, finish, |_| ())
    }

    async fn extend_lease(
        &self,
        token: &ClaimToken,
        lease: Duration,
    ) -> Result<Millis, StoreError> {
        let lease = lease_millis(lease)?;
        let (mut st, at, now) = self.holding(token)?;
        let deadline = now + lease;
        st.rewrite(at, deadline + self.window_ms, |r| {
            r.lease_expires_at = Some(deadline);
            r.updated_at = now;
        });
        Ok(deadline)
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        let now = self.now();
        let at = self.at(scope);
        let mut st = self.lock();
        Ok(st.live(at, now).map(|e| e.record.clone()))
    }

    async fn abandon(&self, token: &ClaimToken) -> Result<(), StoreError> {
        let (mut st, at, _) = self.holding(token)?;
        st.remove(at);
        Ok(())
    }

    async fn unique_guard(&self) -> Result<bool, StoreError> {
        Ok(true)
    }
}

/// A refusal of new keys, with when the first record that makes room expires.
fn full(what: String, partition: bool, frees_at: Option<Millis>, now: Millis) -> StoreError {
    StoreError::Full {
        what,
        partition,
        retry_after_ms: frees_at.map_or(1_000, |at| u64::try_from(at - now).unwrap_or(0).max(1)),
    }
}

/// The record is still the one this token's claim wrote.
fn current(record: &Record, token: &ClaimToken) -> bool {
    record.state == RecordState::Processing
        && record.version == token.version
        && record.owner.as_ref() == Some(&token.owner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{Fingerprint, IdempotencyKey, OwnerId, Principal, StoredResult};

    fn req(k: &str) -> ClaimRequest {
        ClaimRequest {
            scope: Scope::new(TenantId::new("t").unwrap(), IdempotencyKey::new(k).unwrap()),
            principal: Principal::new("p").unwrap(),
            fingerprint: Fingerprint::of_bytes(b"x"),
            owner: OwnerId::new("o").unwrap(),
            lease: Duration::from_secs(1),
        }
    }

    #[tokio::test]
    async fn records_expire_after_the_window() {
        let clock = ClockShift::new();
        let store = MemoryStore::new(MemoryOptions {
            window: Duration::from_secs(120),
            clock: clock.clone(),
            ..MemoryOptions::default()
        });
        let r = req("k");
        let Claim::Proceed(tok) = store.claim(&r).await.unwrap() else {
            panic!()
        };
        store.complete(&tok, StoredResult::default()).await.unwrap();
        clock.advance(Duration::from_secs(119));
        assert!(matches!(store.claim(&r).await.unwrap(), Claim::Replay(_)));
        clock.advance(Duration::from_secs(2));
        assert_eq!(store.get(&r.scope).await.unwrap(), None);
        // The sweep removed it; a new claim is a fresh execution.
        let Claim::Proceed(tok) = store.claim(&req("other")).await.unwrap() else {
            panic!()
        };
        assert_eq!(store.len(), 1);
        assert_eq!(tok.kind, ClaimKind::Fresh);
        assert!(matches!(store.claim(&r).await.unwrap(), Claim::Proceed(_)));
    }

    #[tokio::test]
    async fn processing_outlives_its_lease_by_the_window() {
        let clock = ClockShift::new();
        let store = MemoryStore::new(MemoryOptions {
            window: Duration::from_secs(10),
            clock: clock.clone(),
            ..MemoryOptions::default()
        });
        let r = req("k");
        store.claim(&r).await.unwrap();
        clock.advance(Duration::from_secs(10));
        assert_eq!(
            store.get(&r.scope).await.unwrap().unwrap().state,
            RecordState::Processing
        );
        clock.advance(Duration::from_secs(2));
        assert_eq!(store.get(&r.scope).await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_full_window_refuses_new_keys_and_serves_the_old() {
        let clock = ClockShift::new();
        let store = MemoryStore::new(MemoryOptions {
            window: Duration::from_secs(60),
            clock: clock.clone(),
            max_bytes: 4096,
            ..MemoryOptions::default()
        });
        let body = vec![b'x'; 600];
        let mut held = Vec::new();
        let refused = loop {
            let r = req(&format!("k{}", held.len()));
            match store.claim(&r).await {
                Ok(Claim::Proceed(tok)) => {
                    let result = StoredResult {
                        status: 201,
                        body: body.clone(),
                        ..StoredResult::default()
                    };
                    store.complete(&tok, result).await.unwrap();
                    held.push(r);
                }
                Ok(other) => panic!("fresh key answered {other:?}"),
                Err(e) => break e,
            }
            assert!(held.len() < 100, "the budget never bit");
        };
        assert!(refused.is_unavailable(), "{refused:?}");
        assert!(refused.to_string().contains("window is full"), "{refused}");
        assert!(!held.is_empty());
        // Admission is checked before the record: the budget is overshot by one record
        // at most.
        assert!(store.bytes() < 4096 + 1024, "{}", store.bytes());
        // Keys already held still replay.
        for r in &held {
            assert!(matches!(store.claim(r).await.unwrap(), Claim::Replay(_)));
        }
        // Once the window passes, the records go and new keys are taken again.
        clock.advance(Duration::from_secs(61));
        assert!(matches!(
            store.claim(&req("after")).await.unwrap(),
            Claim::Proceed(_)
        ));
        assert!(store.bytes() < 1024, "{}", store.bytes());
    }

    fn req_of(tenant: &str, k: &str) -> ClaimRequest {
        ClaimRequest {
            scope: Scope::new(
                TenantId::new(tenant).unwrap(),
                IdempotencyKey::new(k).unwrap(),
            ),
            ..req(k)
        }
    }

    #[tokio::test]
    async fn one_partition_cannot_fill_the_window_for_the_others() {
        let clock = ClockShift::new();
        let store = MemoryStore::new(MemoryOptions {
            window: Duration::from_secs(60),
            clock: clock.clone(),
            max_bytes: 64 * 1024,
            partition_bytes: 2048,
            ..MemoryOptions::default()
        });
        let mut n = 0;
        let refused = loop {
            match store.claim(&req_of("greedy", &format!("k{n}"))).await {
                Ok(Claim::Proceed(tok)) => {
                    store.fail(&tok, true, None).await.unwrap();
                    n += 1;
                    clock.advance(Duration::from_secs(1));
                }
                Ok(other) => panic!("fresh key answered {other:?}"),
                Err(e) => break e,
            }
            assert!(n < 100, "the partition budget never bit");
        };
        let StoreError::Full {
            partition: true,
            retry_after_ms,
            ..
        } = refused
        else {
            panic!("{refused:?}")
        };
        // Room comes back when the partition's first record expires: 60 s after it
        // finished, `n` seconds ago (the wall clock moved a little too).
        let expected = (60 - n) * 1000;
        assert!(
            (expected - 500..=expected).contains(&retry_after_ms),
            "{retry_after_ms} ms after {n} records"
        );
        // Everyone else is still admitted, and the greedy partition's keys replay.
        assert!(matches!(
            store.claim(&req_of("other", "k0")).await.unwrap(),
            Claim::Proceed(_)
        ));
        clock.advance(Duration::from_millis(retry_after_ms));
        assert!(matches!(
            store.claim(&req_of("greedy", "after")).await.unwrap(),
            Claim::Proceed(_)
        ));
    }

    #[tokio::test]
    async fn rewrites_in_place_keep_the_byte_count() {
        let clock = ClockShift::new();
        let store = MemoryStore::new(MemoryOptions {
            window: Duration::from_secs(60),
            clock: clock.clone(),
            ..MemoryOptions::default()
        });
        let r = req("k");
        let Claim::Proceed(tok) = store.claim(&r).await.unwrap() else {
            panic!()
        };
        let claimed = store.bytes();
        store
            .extend_lease(&tok, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(store.bytes(), claimed);
        let result = StoredResult {
            status: 201,
            body: vec![b'x'; 1000],
            ..StoredResult::default()
        };
        let done = store.complete(&tok, result).await.unwrap();
        assert_eq!(store.bytes(), record_bytes(&done));
        assert_eq!(store.get(&r.scope).await.unwrap(), Some(done));
        // A takeover of a retryable failure rewrites the same entry.
        let Claim::Proceed(tok) = store.claim(&req("f")).await.unwrap() else {
            panic!()
        };
        store.fail(&tok, true, None).await.unwrap();
        let Claim::Proceed(again) = store.claim(&req("f")).await.unwrap() else {
            panic!()
        };
        assert_eq!(again.kind, ClaimKind::RetryAfterFailure);
        assert_eq!(store.len(), 2);
        // Every record expires within the window of its last write (finish, or the
        // takeover's lease): the sweep leaves nothing counted.
        clock.advance(Duration::from_secs(62));
        assert!(!store.is_full());
        assert_eq!(store.bytes(), 0);
        assert!(store.is_empty());
    }

    /// The tallies agree with the records held: the window's bytes, and each
    /// partition's bytes and count.
    fn assert_tallies(store: &MemoryStore) {
        let st = store.lock();
        let held: usize = st.records.iter().map(|e| e.bytes).sum();
        assert_eq!(st.bytes, held);
        for p in st.partitions.iter() {
            let mine: Vec<_> = st
                .records
                .iter()
                .filter(|e| e.scope.tenant == p.tenant)
                .collect();
            assert_eq!(p.records, mine.len(), "{}", p.tenant);
            assert_eq!(p.bytes, mine.iter().map(|e| e.bytes).sum::<usize>());
        }
        assert!(st
            .records
            .iter()
            .all(|e| st.partitions.iter().any(|p| p.tenant == e.scope.tenant)));
    }

    #[tokio::test]
    async fn many_keys_of_many_partitions_keep_their_tallies_through_expiry() {
        let clock = ClockShift::new();
        let store = MemoryStore::new(MemoryOptions {
            window: Duration::from_secs(30),
            clock: clock.clone(),
            ..MemoryOptions::default()
        });
        for n in 0..600 {
            let r = req_of(&format!("t{}", n % 7), &format!("k{n}"));
            let Claim::Proceed(tok) = store.claim(&r).await.unwrap() else {
                panic!("fresh key {n}")
            };
            match n % 4 {
                0 => store.abandon(&tok).await.unwrap(),
                1 => drop(store.fail(&tok, true, None).await.unwrap()),
                2 => {
                    let result = StoredResult {
                        status: 201,
                        body: vec![b'x'; n % 300],
                        ..StoredResult::default()
                    };
                    store.complete(&tok, result).await.unwrap();
                }
                _ => {}
            }
            if n % 50 == 49 {
                clock.advance(Duration::from_secs(7));
                assert_tallies(&store);
            }
        }
        // Keys finished a while ago replay or retry; the newest are still held.
        assert!(matches!(
            store.claim(&req_of("t2", "k590")).await.unwrap(),
            Claim::Replay(_)
        ));
        assert_tallies(&store);
        clock.advance(Duration::from_secs(120));
        assert!(!store.is_full());
        assert_tallies(&store);
        assert_eq!(store.bytes(), 0);
        assert!(store.is_empty());
        assert!(store.lock().partitions.is_empty());
    }

    #[tokio::test]
    async fn every_record_replays_its_own_result_after_the_table_grew_many_times() {
        let store = MemoryStore::new(MemoryOptions::default());
        let keys = 5_000;
        // A lease no slow run outlives: the keys left in progress stay so.
        let held = |n: usize| ClaimRequest {
            lease: Duration::from_secs(600),
            ..req(&format!("k{n}"))
        };
        for n in 0..keys {
            let Claim::Proceed(tok) = store.claim(&held(n)).await.unwrap() else {
                panic!("fresh key {n}")
            };
            // Every fourth key is left in progress while the table grows around it.
            if n % 4 != 3 {
                let result = StoredResult {
                    status: 201,
                    body: format!("order {n}").into_bytes(),
                    ..StoredResult::default()
                };
                store.complete(&tok, result).await.unwrap();
            }
        }
        assert_eq!(store.len(), keys);
        for n in 0..keys {
            match store.claim(&held(n)).await.unwrap() {
                Claim::Replay(record) if n % 4 != 3 => {
                    let body = record.result.expect("a stored result").body;
                    assert_eq!(body, format!("order {n}").into_bytes(), "key {n}");
                }
                Claim::InProgress { .. } if n % 4 == 3 => {}
                other => panic!("key {n}: {other:?}"),
            }
        }
        assert_tallies(&store);
    }

    #[tokio::test]
    async fn an_abandoned_claim_takes_no_room() {
        let store = MemoryStore::new(MemoryOptions::default());
        let r = req("k");
        let Claim::Proceed(tok) = store.claim(&r).await.unwrap() else {
            panic!()
        };
        assert!(store.bytes() > 0);
        store.abandon(&tok).await.unwrap();
        assert_eq!(store.bytes(), 0);
        assert!(store.is_empty());
        assert!(store.abandon(&tok).await.unwrap_err().is_superseded());
    }
}
