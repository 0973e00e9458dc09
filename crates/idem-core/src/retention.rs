//! Retention tiers: how long each kind of evidence stays, and the store contract the
//! sweeper works through (docs/DESIGN.md: retention tiers).
//!
//! ```text
//!  completed ──retry window──▶ REPLAY ──replay window──▶ DISPUTE ──dispute window──▶ ARCHIVE
//!  (RETRY: full response)     (key, fingerprint,        (refs, first processing     (key digest, result
//!                              result ref, state)        time, audit fields)          digest, result ref;
//!                                                                                     off the online index)
//! ```
//!
//! Windows are ages counted from completion (`completed_at`), so they are cumulative:
//! a record completed 30 days ago is due for the dispute tier under the defaults
//! (24 h, 7 d, 90 d). Only terminal records (SUCCEEDED, FAILED_TERMINAL) move; a record
//! whose business result still has a pending compensation (refund pending, outbox
//! message undelivered …, answered by the application's [`CompensationCheck`]) stays
//! where it is. PROCESSING records past their lease are not moved at all: a separate
//! stale scan turns them FAILED_RETRYABLE, never deletes them.
//!
//! **How a record's tier is visible without new `Record` fields.** Stores keep the tier
//! in a column of their own (for scans). When the response is dropped, the stored
//! result keeps its status and result reference, and its headers are replaced by the
//! reserved pseudo-header [`TIER_HEADER`] (plus [`RESULT_DIGEST_HEADER`], the digest of
//! the dropped response). [`dropped_response`] reads that marker, so the HTTP layer
//! knows to rebuild the response from the result reference instead of replaying it.
//!
//! **Archived keys.** Archive rows are out of the online index: a claim no longer finds
//! the key. The HTTP layer asks [`ArchiveLookup::archived`] on every *fresh* claim and,
//! on a hit, ends the claim FAILED_TERMINAL with a `key-expired` problem rather than
//! executing a second time.
//!
//! This module does no I/O: stores implement [`RetentionStore`], the `idem-sweep` crate
//! drives it.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::fingerprint::Fingerprint;
use crate::key::{IdempotencyKey, OwnerId, Scope, TenantId};
use crate::record::{Millis, Record, RecordState, StoredResult};
use crate::store::StoreError;

/// Reserved pseudo-header in a stored result whose response was dropped by the sweeper;
/// its value is the tier. Never replayed to a client.
pub const TIER_HEADER: &str = "idem-tier";
/// Reserved pseudo-header holding the hex digest of the dropped response.
pub const RESULT_DIGEST_HEADER: &str = "idem-result-digest";

const DAY: Duration = Duration::from_secs(24 * 3600);

/// Where a record's evidence lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// Full state and response (online).
    Retry,
    /// Key, fingerprint, result reference, final state (online; replays are rebuilt).
    Replay,
    /// Order and payment references, first processing time, audit fields (online).
    Dispute,
    /// Key digest and result digest, searchable by result reference (off the online
    /// index).
    Archive,
}

impl Tier {
    pub const ALL: [Tier; 4] = [Tier::Retry, Tier::Replay, Tier::Dispute, Tier::Archive];
    /// Tiers a record can be demoted from, in sweep order.
    pub const ONLINE: [Tier; 3] = [Tier::Retry, Tier::Replay, Tier::Dispute];

    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Retry => "retry",
            Tier::Replay => "replay",
            Tier::Dispute => "dispute",
            Tier::Archive => "archive",
        }
    }

    /// The tier a record leaves this one for; `None` for the archive.
    pub fn next(self) -> Option<Tier> {
        match self {
            Tier::Retry => Some(Tier::Replay),
            Tier::Replay => Some(Tier::Dispute),
            Tier::Dispute => Some(Tier::Archive),
            Tier::Archive => None,
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Tier {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Tier::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| format!("unknown tier {s:?}"))
    }
}

/// How long duplicates can still arrive, by source (the seed's sizing rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplaySources {
    /// The longest time a caller keeps retrying (client SDK, gateway).
    pub client_retry: Duration,
    /// How long the message transport keeps a message that may be redelivered.
    pub queue_retention: Duration,
    /// How late operators may replay dead letters or run a compensation batch.
    pub dead_letter_replay: Duration,
}

impl Default for ReplaySources {
    /// The seed's example: retries for 2 minutes, messages kept 24 h, dead letters
    /// replayed within 7 days.
    fn default() -> Self {
        Self {
            client_retry: Duration::from_secs(120),
            queue_retention: DAY,
            dead_letter_replay: 7 * DAY,
        }
    }
}

impl ReplaySources {
    /// The longest of the three, and its name.
    pub fn longest(&self) -> (&'static str, Duration) {
        [
            ("client retry", self.client_retry),
            ("queue retention", self.queue_retention),
            ("dead-letter replay", self.dead_letter_replay),
        ]
        .into_iter()
        .max_by_key(|(_, d)| *d)
        .expect("three sources")
    }
}

/// The four tiers' windows. Each window is an age counted from completion.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetentionPolicy {
    /// Full response kept this long (default 24 h).
    pub retry_window: Duration,
    /// Key, fingerprint and result reference kept online this long: the *hot window*
    /// in which duplicates still replay (default 7 days).
    pub replay_window: Duration,
    /// Audit fields kept online this long, then archived (default 90 days).
    pub dispute_window: Duration,
    /// Archive rows kept this long after archiving; `None`: forever. PostgreSQL expires
    /// whole monthly partitions, so rows may stay up to a month longer.
    pub archive_window: Option<Duration>,
    /// PROCESSING records whose lease ended more than this long ago are turned
    /// FAILED_RETRYABLE by the stale scan (default 0: as soon as the lease ends).
    pub stale_grace: Duration,
    /// Lease events (the evidence of who held what) kept this long after they were
    /// recorded; `None`: forever. At least the dispute window (checked by
    /// [`validate`](Self::validate)), so the evidence lives as long as the audit fields
    /// of the records it explains; the default is the default dispute window. Every lease
    /// change writes an event, so without a bound the log only grows.
    pub lease_event_window: Option<Duration>,
}

impl Default for RetentionPolicy {
    fn default() -> Self {
        Self {
            retry_window: DAY,
            replay_window: 7 * DAY,
            dispute_window: 90 * DAY,
            archive_window: None,
            stale_grace: Duration::ZERO,
            lease_event_window: Some(90 * DAY),
        }
    }
}

/// Why a policy was rejected at start-up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("retention window {name} must be longer than zero")]
    Zero { name: &'static str },
    #[error(
        "retention windows must grow tier by tier: {shorter_name} ({shorter:?}) is longer \
         than {longer_name} ({longer:?})"
    )]
    OutOfOrder {
        shorter_name: &'static str,
        shorter: Duration,
        longer_name: &'static str,
        longer: Duration,
    },
    #[error(
        "the hot window ({window_name} = {window:?}) is shorter than the longest replay \
         source ({source_name} = {source_len:?}): a duplicate arriving then would find no \
         record and execute a second time. Lengthen {window_name} to at least {source_len:?} \
         or shorten the {source_name}"
    )]
    HotWindowTooShort {
        window_name: &'static str,
        window: Duration,
        source_name: &'static str,
        source_len: Duration,
    },
}

impl RetentionPolicy {
    /// Checks the windows against each other and against the replay sources.
    ///
    /// The seed's sizing rule: online evidence (the replay window, in which duplicates
    /// still replay the first result) must cover the longest replay source, and the
    /// full response must be kept at least as long as callers retry.
    pub fn validate(&self, sources: &ReplaySources) -> Result<(), PolicyError> {
        for (name, d) in [
            ("retry_window", self.retry_window),
            ("replay_window", self.replay_window),
            ("dispute_window", self.dispute_window),
        ] {
            if d.is_zero() {
                return Err(PolicyError::Zero { name });
            }
        }
        for (name, window) in [
            ("archive_window", self.archive_window),
            ("lease_event_window", self.lease_event_window),
        ] {
            if window.is_some_and(|d| d.is_zero()) {
                return Err(PolicyError::Zero { name });
            }
        }
        if let Some(window) = self.lease_event_window {
            if window < self.dispute_window {
                return Err(PolicyError::OutOfOrder {
                    shorter_name: "dispute_window",
                    shorter: self.dispute_window,
                    longer_name: "lease_event_window",
                    longer: window,
                });
            }
        }
        let order = [
            ("retry_window", self.retry_window),
            ("replay_window", self.replay_window),
            ("dispute_window", self.dispute_window),
        ];
        for pair in order.windows(2) {
            let ((a_name, a), (b_name, b)) = (pair[0], pair[1]);
            if a > b {
                return Err(PolicyError::OutOfOrder {
                    shorter_name: a_name,
                    shorter: a,
                    longer_name: b_name,
                    longer: b,
                });
            }
        }
        let (source_name, source_len) = sources.longest();
        if self.replay_window < source_len {
            return Err(PolicyError::HotWindowTooShort {
                window_name: "replay_window",
                window: self.replay_window,
                source_name,
                source_len,
            });
        }
        if self.retry_window < sources.client_retry {
            return Err(PolicyError::HotWindowTooShort {
                window_name: "retry_window",
                window: self.retry_window,
                source_name: "client retry",
                source_len: sources.client_retry,
            });
        }
        Ok(())
    }

    /// How long a record stays in `tier` counted from completion; `None` for the
    /// archive (its expiry is [`archive_window`](Self::archive_window), counted from
    /// archiving).
    pub fn window(&self, tier: Tier) -> Option<Duration> {
        match tier {
            Tier::Retry => Some(self.retry_window),
            Tier::Replay => Some(self.replay_window),
            Tier::Dispute => Some(self.dispute_window),
            Tier::Archive => None,
        }
    }

    /// Records of `tier` completed before this time are due for the next tier.
    pub fn cutoff(&self, tier: Tier, now: Millis) -> Option<Millis> {
        self.window(tier).map(|w| now.saturating_sub(millis(w)))
    }
}

/// Checks a demotion's direction: `to` must be deeper than `from` (never back up, never
/// in place).
pub fn demotion_span(from: Tier, to: Tier) -> Result<(), StoreError> {
    if to > from {
        Ok(())
    } else {
        Err(StoreError::InvalidInput(format!(
            "a demotion goes to a deeper tier, not {from} -> {to}"
        )))
    }
}

/// Checks a demotion batch before a store writes it: the direction (see
/// [`demotion_span`]), and `false` when the batch is empty and nothing is to be written.
pub fn demotes(from: Tier, to: Tier, batch: &[Demotion]) -> Result<bool, StoreError> {
    demotion_span(from, to)?;
    Ok(!batch.is_empty())
}

/// A duration in milliseconds, saturating.
pub fn millis(d: Duration) -> Millis {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Digest of a key as stored in the archive: the first 16 bytes of SHA-256 (the archive
/// keeps the tenant beside it, so collisions would have to be within one tenant).
pub fn key_digest(key: &IdempotencyKey) -> [u8; 16] {
    let full = Sha256::digest(key.as_str().as_bytes());
    let mut out = [0u8; 16];
    out.copy_from_slice(&full[..16]);
    out
}

/// Digest of a stored response (status, headers, body, reference): 16 bytes of SHA-256
/// over an unambiguous length-prefixed encoding.
pub fn result_digest(result: &StoredResult) -> [u8; 16] {
    let mut h = Sha256::new();
    let mut part = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    part(&result.status.to_be_bytes());
    for (n, v) in &result.headers {
        part(n.as_bytes());
        part(v.as_bytes());
    }
    part(&result.body);
    part(result.result_ref.as_deref().unwrap_or("").as_bytes());
    let full = h.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&full[..16]);
    out
}

/// The stored result a record keeps once its response is dropped (tier `tier`): status
/// and result reference, and the marker headers in place of the response headers.
pub fn dropped_result(original: &StoredResult, digest: [u8; 16], tier: Tier) -> StoredResult {
    StoredResult {
        status: original.status,
        headers: vec![
            (TIER_HEADER.to_string(), tier.as_str().to_string()),
            (RESULT_DIGEST_HEADER.to_string(), hex::encode(digest)),
        ],
        body: Vec::new(),
        result_ref: original.result_ref.clone(),
    }
}

/// The tier a stored result says it was dropped to, if the response was dropped.
pub fn dropped_response(result: &StoredResult) -> Option<Tier> {
    result
        .headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(TIER_HEADER))
        .and_then(|(_, v)| v.parse().ok())
}

/// The digest of the dropped response recorded in a dropped result.
pub fn dropped_digest(result: &StoredResult) -> Option<[u8; 16]> {
    let (_, v) = result
        .headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(RESULT_DIGEST_HEADER))?;
    hex::decode(v).ok()?.try_into().ok()
}

/// Whether a business result still has work that may need this evidence (refund
/// pending, outbox message undelivered …). Answered by the business layer.
#[async_trait]
pub trait CompensationCheck: Send + Sync + 'static {
    /// True: keep the record in its tier for now.
    async fn pending(&self, tenant: &TenantId, result_ref: &str) -> Result<bool, StoreError>;
}

/// The default check: nothing is ever pending.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoCompensation;

#[async_trait]
impl CompensationCheck for NoCompensation {
    async fn pending(&self, _: &TenantId, _: &str) -> Result<bool, StoreError> {
        Ok(false)
    }
}

/// Position in a tier scan: records are walked by `(completed_at, tenant, key)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanCursor {
    pub completed_at: Millis,
    pub tenant: String,
    pub key: String,
}

impl ScanCursor {
    /// Where a scan resumes, as `(completed_at, tenant, key)`: strictly after `after`, or
    /// before every record.
    pub fn start(after: Option<&ScanCursor>) -> (Millis, &str, &str) {
        match after {
            Some(a) => (a.completed_at, a.tenant.as_str(), a.key.as_str()),
            None => (i64::MIN, "", ""),
        }
    }
}

/// A terminal record due for its next tier, as a scan returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueRecord {
    pub record: Record,
    pub tier: Tier,
}

impl DueRecord {
    pub fn cursor(&self) -> ScanCursor {
        ScanCursor {
            completed_at: self.record.completed_at.unwrap_or(0),
            tenant: self.record.tenant.to_string(),
            key: self.record.key.to_string(),
        }
    }
}

/// One demotion, a compare-and-set on `version`: it applies only if the record is still
/// at that version and in the tier the batch names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Demotion {
    pub scope: Scope,
    pub version: i64,
    /// For Retry → Replay: what the stored result becomes (see [`dropped_result`]).
    /// For Replay → Dispute: the result with the tier marker updated. `None`: unchanged.
    pub result: Option<StoredResult>,
    /// For Dispute → Archive: the row the archive gets.
    pub archive: Option<ArchivedRecord>,
}

impl Demotion {
    /// The archive row of a demotion to the archive, which must carry one.
    pub fn archive_row(&self) -> Result<&ArchivedRecord, StoreError> {
        self.archive.as_ref().ok_or_else(|| {
            StoreError::InvalidInput("an archive demotion needs its archive row".into())
        })
    }
}

/// What the archive keeps of a record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchivedRecord {
    pub tenant: TenantId,
    #[serde(with = "hex16")]
    pub key_digest: [u8; 16],
    pub fingerprint: Fingerprint,
    /// Digest of the first response (taken when it was dropped).
    #[serde(with = "hex16_opt")]
    pub result_digest: Option<[u8; 16]>,
    /// The business result (order number); searchable.
    pub result_ref: Option<String>,
    pub state: RecordState,
    pub status: Option<u16>,
    /// First processing time (the record's creation).
    pub first_processed_at: Millis,
    pub completed_at: Option<Millis>,
    /// Set by the store when it archives.
    pub archived_at: Millis,
}

impl ArchivedRecord {
    /// The archive row for a record leaving the dispute tier.
    pub fn of(record: &Record) -> Self {
        let result = record.result.as_ref();
        Self {
            tenant: record.tenant.clone(),
            key_digest: key_digest(&record.key),
            fingerprint: record.fingerprint,
            result_digest: result
                .and_then(|r| dropped_digest(r).or_else(|| Some(result_digest(r)))),
            result_ref: result.and_then(|r| r.result_ref.clone()),
            state: record.state,
            status: result.map(|r| r.status),
            first_processed_at: record.created_at,
            completed_at: record.completed_at,
            archived_at: 0,
        }
    }
}

mod hex16 {
    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(v: &[u8; 16], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(v))
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 16], D::Error> {
        let s = String::deserialize(d)?;
        hex::decode(&s)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| serde::de::Error::custom("expected 32 hex digits"))
    }
}

mod hex16_opt {
    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(v: &Option<[u8; 16]>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.serialize_some(&hex::encode(v)),
            None => s.serialize_none(),
        }
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<[u8; 16]>, D::Error> {
        let s = Option::<String>::deserialize(d)?;
        s.map(|s| {
            hex::decode(&s)
                .ok()
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| serde::de::Error::custom("expected 32 hex digits"))
        })
        .transpose()
    }
}

/// A PROCESSING record whose lease ran out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StaleRecord {
    pub scope: Scope,
    pub version: i64,
    pub owner: Option<OwnerId>,
    pub lease_expires_at: Millis,
}

impl StaleRecord {
    /// From a store row's columns; a tenant, key or owner the vocabulary refuses makes
    /// the row corrupt (a backend error).
    pub fn from_columns(
        tenant: String,
        key: String,
        version: i64,
        owner: Option<String>,
        lease_expires_at: Millis,
    ) -> Result<Self, StoreError> {
        let bad = |e: crate::key::KeyError| {
            StoreError::Backend(format!("corrupt stale record scope: {e}"))
        };
        Ok(Self {
            scope: Scope::new(
                TenantId::new(tenant).map_err(bad)?,
                IdempotencyKey::from_stored(key).map_err(bad)?,
            ),
            version,
            owner: owner.map(OwnerId::new).transpose().map_err(bad)?,
            lease_expires_at,
        })
    }
}

/// The columns a stale scan reads: tenant, key, version, owner, lease deadline.
pub type StaleColumns = (String, String, i64, Option<String>, Millis);

impl TryFrom<StaleColumns> for StaleRecord {
    type Error = StoreError;
    fn try_from(
        (tenant, key, version, owner, lease_expires_at): StaleColumns,
    ) -> Result<Self, StoreError> {
        Self::from_columns(tenant, key, version, owner, lease_expires_at)
    }
}

/// Space a tier takes, for the benchmark and operators.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TierUsage {
    pub tier: Tier,
    pub records: u64,
    /// Average bytes per record as the backend measures them (PostgreSQL:
    /// `pg_column_size` of the row; SQLite: the summed lengths of the stored values).
    pub bytes_per_record: f64,
}

impl TierUsage {
    /// Every tier's usage, from the online counts per tier name (`(tier, records, average
    /// bytes)`; a tier without records is absent) and the archive's `(records, average
    /// bytes)`.
    pub fn per_tier(
        online: &[(String, i64, Option<f64>)],
        archive: (i64, Option<f64>),
    ) -> Vec<Self> {
        Tier::ALL
            .into_iter()
            .map(|tier| {
                let (records, bytes) = if tier == Tier::Archive {
                    archive
                } else {
                    online
                        .iter()
                        .find(|(t, _, _)| t == tier.as_str())
                        .map(|(_, n, b)| (*n, *b))
                        .unwrap_or((0, None))
                };
                TierUsage {
                    tier,
                    records: u64::try_from(records).unwrap_or(0),
                    bytes_per_record: bytes.unwrap_or(0.0),
                }
            })
            .collect()
    }
}

/// What an archive expiry removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchiveExpiry {
    pub rows: u64,
    /// PostgreSQL: the monthly partitions dropped.
    pub partitions_dropped: Vec<String>,
}

/// Audit lookups in the archive. Separate from [`RetentionStore`] so the HTTP layer
/// needs only this.
#[async_trait]
pub trait ArchiveLookup: Send + Sync + 'static {
    /// The archive row of a key, if the key was archived.
    async fn archived(
        &self,
        tenant: &TenantId,
        key: &IdempotencyKey,
    ) -> Result<Option<ArchivedRecord>, StoreError>;

    /// Archive rows whose result reference is `result_ref` (an order number), in any
    /// tenant when `tenant` is `None`. Oldest first.
    async fn archived_by_ref(
        &self,
        tenant: Option<&TenantId>,
        result_ref: &str,
    ) -> Result<Vec<ArchivedRecord>, StoreError>;
}

/// The store side of the sweeper. Every write is a compare-and-set, so two sweepers
/// at once, or a rerun after a crash, reach the same final state.
///
/// Time: scans take `now` (or a cutoff derived from it) from the caller, so a sweep can
/// be run "as of" a date (`idem sweep --now`); [`now`](Self::now) is the store's own
/// clock (plus [`ClockShift`](crate::ClockShift)), which the sweeper uses by default
/// and always for the stale scan, so a lease is never judged by a clock ahead of the
/// store's.
#[async_trait]
pub trait RetentionStore: ArchiveLookup {
    fn backend(&self) -> &'static str;

    /// The store clock, in epoch milliseconds.
    async fn now(&self) -> Result<Millis, StoreError>;

    /// Up to `limit` terminal records in `tier` completed before `completed_before`,
    /// ordered by `(completed_at, tenant, key)`, strictly after `after`.
    async fn scan_due(
        &self,
        tier: Tier,
        completed_before: Millis,
        after: Option<&ScanCursor>,
        limit: usize,
    ) -> Result<Vec<DueRecord>, StoreError>;

    /// Applies a batch of demotions from `from` to the deeper tier `to` in one
    /// transaction (a record past several windows moves in one write, not one per tier:
    /// see [`demotion_span`]); each is a compare-and-set on version and tier, bumping the
    /// version. A move to the archive deletes the online row and inserts its archive row
    /// (with `archived_at = now`) atomically. Returns how many applied (the rest lost a
    /// race and changed nothing).
    async fn demote(
        &self,
        from: Tier,
        to: Tier,
        batch: &[Demotion],
        now: Millis,
    ) -> Result<u64, StoreError>;

    /// Up to `limit` PROCESSING records whose lease ended before `lease_before`.
    async fn scan_stale(
        &self,
        lease_before: Millis,
        limit: usize,
    ) -> Result<Vec<StaleRecord>, StoreError>;

    /// Turns stale records FAILED_RETRYABLE (compare-and-set on version, state, and a
    /// lease still ending before `lease_before`, since a heartbeat moves the lease
    /// without a new version), recording a `stale_recovered` event per record. Returns
    /// the ones that applied.
    async fn recover_stale(
        &self,
        batch: &[StaleRecord],
        lease_before: Millis,
        now: Millis,
    ) -> Result<Vec<StaleRecord>, StoreError>;

    /// Removes archive rows archived before `archived_before`.
    async fn expire_archive(&self, archived_before: Millis) -> Result<ArchiveExpiry, StoreError>;

    /// The online tier of a record (`None`: no online record).
    async fn tier_of(&self, scope: &Scope) -> Result<Option<Tier>, StoreError>;

    /// Records and average size per tier.
    async fn usage(&self) -> Result<Vec<TierUsage>, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: Duration = Duration::from_secs(3600);

    #[test]
    fn default_policy_is_valid_for_the_seed_example() {
        RetentionPolicy::default()
            .validate(&ReplaySources::default())
            .unwrap();
    }

    #[test]
    fn hot_window_shorter_than_dead_letter_replay_is_rejected() {
        let p = RetentionPolicy {
            replay_window: 3 * DAY,
            ..RetentionPolicy::default()
        };
        let err = p.validate(&ReplaySources::default()).unwrap_err();
        assert!(matches!(
            err,
            PolicyError::HotWindowTooShort {
                source_name: "dead-letter replay",
                ..
            }
        ));
        let text = err.to_string();
        assert!(
            text.contains("replay_window") && text.contains("dead-letter"),
            "{text}"
        );

        let sources = ReplaySources {
            client_retry: 2 * DAY,
            ..ReplaySources::default()
        };
        let err = RetentionPolicy::default().validate(&sources).unwrap_err();
        assert!(matches!(
            err,
            PolicyError::HotWindowTooShort {
                window_name: "retry_window",
                ..
            }
        ));
    }

    #[test]
    fn windows_must_grow() {
        let p = RetentionPolicy {
            retry_window: 10 * DAY,
            ..RetentionPolicy::default()
        };
        assert!(matches!(
            p.validate(&ReplaySources::default()),
            Err(PolicyError::OutOfOrder { .. })
        ));
        let p = RetentionPolicy {
            retry_window: Duration::ZERO,
            ..RetentionPolicy::default()
        };
        assert!(matches!(
            p.validate(&ReplaySources::default()),
            Err(PolicyError::Zero { .. })
        ));
    }

    #[test]
    fn cutoffs_and_tiers() {
        let p = RetentionPolicy::default();
        assert_eq!(p.cutoff(Tier::Retry, 100 * 3_600_000), Some(76 * 3_600_000));
        assert_eq!(p.cutoff(Tier::Archive, 0), None);
        assert_eq!(Tier::Retry.next(), Some(Tier::Replay));
        assert_eq!(Tier::Archive.next(), None);
        for t in Tier::ALL {
            assert_eq!(t.as_str().parse::<Tier>(), Ok(t));
        }
        assert_eq!(millis(H), 3_600_000);
    }

    #[test]
    fn scans_and_batches() {
        assert_eq!(ScanCursor::start(None), (i64::MIN, "", ""));
        let c = ScanCursor {
            completed_at: 5,
            tenant: "t".into(),
            key: "k".into(),
        };
        assert_eq!(ScanCursor::start(Some(&c)), (5, "t", "k"));

        assert_eq!(demotes(Tier::Retry, Tier::Dispute, &[]), Ok(false));
        assert!(demotes(Tier::Replay, Tier::Replay, &[]).is_err());
        let scope = Scope::new(
            TenantId::new("t").unwrap(),
            IdempotencyKey::new("k").unwrap(),
        );
        let d = Demotion {
            scope,
            version: 1,
            result: None,
            archive: None,
        };
        assert_eq!(
            demotes(Tier::Dispute, Tier::Archive, std::slice::from_ref(&d)),
            Ok(true)
        );
        assert!(d.archive_row().is_err());

        let stale = StaleRecord::try_from(("t".into(), "k".into(), 3, None, 9)).unwrap();
        assert_eq!((stale.version, stale.lease_expires_at), (3, 9));
        assert!(StaleRecord::try_from((String::new(), "k".into(), 3, None, 9)).is_err());

        let usage = TierUsage::per_tier(&[("replay".into(), 2, Some(10.0))], (1, None));
        let by_tier: Vec<_> = usage
            .iter()
            .map(|u| (u.tier, u.records, u.bytes_per_record))
            .collect();
        assert_eq!(
            by_tier,
            [
                (Tier::Retry, 0, 0.0),
                (Tier::Replay, 2, 10.0),
                (Tier::Dispute, 0, 0.0),
                (Tier::Archive, 1, 0.0)
            ]
        );
    }

    #[test]
    fn dropped_results_carry_their_marker() {
        let full = StoredResult {
            status: 201,
            headers: vec![("content-type".into(), "application/json".into())],
            body: b"{\"order\":\"o-1\"}".to_vec(),
            result_ref: Some("o-1".into()),
        };
        assert_eq!(dropped_response(&full), None);
        let d = result_digest(&full);
        let dropped = dropped_result(&full, d, Tier::Replay);
        assert_eq!(dropped_response(&dropped), Some(Tier::Replay));
        assert_eq!(dropped_digest(&dropped), Some(d));
        assert_eq!(dropped.status, 201);
        assert_eq!(dropped.result_ref.as_deref(), Some("o-1"));
        assert!(dropped.body.is_empty());
        let mut other = full.clone();
        other.body.push(b' ');
        assert_ne!(result_digest(&other), d);
        let k = IdempotencyKey::new("k-1").unwrap();
        assert_eq!(key_digest(&k), key_digest(&k));
        assert_ne!(
            key_digest(&k),
            key_digest(&IdempotencyKey::new("k-2").unwrap())
        );
    }
}
