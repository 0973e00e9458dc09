//! Leases and fencing tokens: the vocabulary and the lease store contract.
//!
//! A lease gives one owner a named critical section until a deadline set by the store's
//! clock. Every grant carries a [`FencingToken`] that strictly increases per name, so
//! the protected resource can refuse a late write from a holder whose lease ended
//! without it knowing (a long pause, a lost lease after a failover).
//!
//! Every lease store keeps the same promises, checked by `idem-conformance::lease`:
//! - at most one live lease per name; expiry is judged by the store's clock (plus the
//!   tests' [`ClockShift`]), never the caller's;
//! - tokens strictly increase per name on every grant: after release, after expiry,
//!   after the lease itself is deleted or lost, after the store restarts;
//! - renew and release are compare-and-sets on owner *and* token: a caller that no longer
//!   holds the lease gets a typed *not holder* answer and the current holder's lease is
//!   untouched;
//! - an expired lease is over: it cannot be renewed or released, only re-acquired;
//! - evidence is persisted as [`LeaseEvent`]s with owner, token and store times.
//!
//! This module does no I/O and knows no async runtime.
//!
//! [`ClockShift`]: crate::store::ClockShift

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::key::{IdempotencyKey, KeyError, OwnerId};
use crate::record::Millis;
use crate::store::{check_lease, ErrorKind, StoreError};

/// The name of a lease (what it protects, e.g. `inventory:event-42`): 1 to 255 visible
/// ASCII characters, the same rules as an idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct LeaseName(String);

impl LeaseName {
    pub fn new(value: impl Into<String>) -> Result<Self, KeyError> {
        // The key's validation, relabelled so errors name what was rejected.
        IdempotencyKey::new(value)
            .map(|k| Self(k.into()))
            .map_err(|e| match e {
                KeyError::Empty { .. } => KeyError::Empty { what: "lease name" },
                KeyError::TooLong { len, max, .. } => KeyError::TooLong {
                    what: "lease name",
                    len,
                    max,
                },
                KeyError::InvalidCharacter { position, .. } => KeyError::InvalidCharacter {
                    what: "lease name",
                    position,
                },
                KeyError::ReservedCharacter {
                    character,
                    position,
                    ..
                } => KeyError::ReservedCharacter {
                    what: "lease name",
                    character,
                    position,
                },
            })
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for LeaseName {
    type Error = KeyError;
    fn try_from(value: String) -> Result<Self, KeyError> {
        Self::new(value)
    }
}

impl FromStr for LeaseName {
    type Err = KeyError;
    fn from_str(value: &str) -> Result<Self, KeyError> {
        Self::new(value)
    }
}

impl From<LeaseName> for String {
    fn from(value: LeaseName) -> String {
        value.0
    }
}

impl fmt::Display for LeaseName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A fencing token: unique per grant, strictly increasing per lease name, starting at 1.
/// `i64` because every backend stores it as a signed 64-bit integer.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[serde(transparent)]
pub struct FencingToken(i64);

impl FencingToken {
    pub const fn new(value: i64) -> Self {
        Self(value)
    }

    pub const fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The fencing rule every protected resource applies: a write is accepted when its token
/// is at least the last token the resource accepted. Equal is accepted because a token
/// names one grant, so the current holder may write many times; anything older is fenced.
pub fn fence_accepts(last_accepted: Option<FencingToken>, token: FencingToken) -> bool {
    match last_accepted {
        None => true,
        Some(last) => token >= last,
    }
}

/// A granted lease. Times are store-clock epoch milliseconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub name: LeaseName,
    pub owner: OwnerId,
    pub token: FencingToken,
    pub acquired_at: Millis,
    /// Store-clock deadline; at or after it the lease is over.
    pub expires_at: Millis,
    /// Successful renewals since the grant.
    pub renewals: u32,
}

impl Lease {
    /// A lease just granted to `owner` with `token` (no renewals yet).
    pub fn granted(
        name: &LeaseName,
        owner: &OwnerId,
        token: FencingToken,
        acquired_at: Millis,
        expires_at: Millis,
    ) -> Self {
        Self {
            name: name.clone(),
            owner: owner.clone(),
            token,
            acquired_at,
            expires_at,
            renewals: 0,
        }
    }

    /// Whether the lease is live at store time `now`.
    pub fn is_live(&self, now: Millis) -> bool {
        self.expires_at > now
    }

    /// This lease renewed at store time `now`: live until `now + ttl`, one renewal more.
    pub fn renewed(mut self, now: Millis, ttl: Duration) -> Self {
        self.expires_at = now.saturating_add(crate::retention::millis(ttl));
        self.renewals += 1;
        self
    }
}

/// The answer to an acquire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquire {
    /// The caller holds the lease with a fresh token.
    Granted(Lease),
    /// Someone holds a live lease (possibly the caller itself: leases are not reentrant).
    Held { holder: Lease, now: Millis },
}

impl Acquire {
    pub fn granted(self) -> Option<Lease> {
        match self {
            Acquire::Granted(lease) => Some(lease),
            Acquire::Held { .. } => None,
        }
    }
}

/// The answer to a renew.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Renew {
    /// The deadline moved to store-now + ttl.
    Renewed(Lease),
    /// The caller's lease is over (expired, released, force-released, lost, or another
    /// grant exists). `current` is the live lease, if any. Nothing was changed.
    NotHolder { current: Option<Lease> },
}

/// The answer to a release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// The caller's lease ended at store time `released_at`.
    Released { lease: Lease, released_at: Millis },
    /// The caller no longer held the lease: an owner-mismatch release, recorded as such.
    /// `current` is the live lease, if any; it was not touched.
    NotHolder { current: Option<Lease> },
}

/// What `show` reports for a name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseStatus {
    pub name: LeaseName,
    /// The live lease; an expired one is no holder.
    pub holder: Option<Lease>,
    /// The highest token ever granted under this name, if any.
    pub last_token: Option<FencingToken>,
    /// Store time of the read.
    pub now: Millis,
}

impl LeaseStatus {
    /// What a read at store time `now` found: `lease` (live or not) and the last token.
    pub fn of(
        name: &LeaseName,
        lease: Option<Lease>,
        last_token: Option<FencingToken>,
        now: Millis,
    ) -> Self {
        Self {
            name: name.clone(),
            holder: lease.filter(|l| l.is_live(now)),
            last_token,
            now,
        }
    }
}

/// What happened to a lease. The string forms are stored and shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseEventKind {
    Acquired,
    Renewed,
    /// A renew by a caller that no longer held the lease.
    RenewRejected,
    Released,
    /// The lease passed its deadline unreleased (recorded when the store notices).
    Expired,
    /// A release by a caller that no longer held the lease.
    ReleaseOwnerMismatch,
    /// A protected resource refused a write carrying an old token.
    FencedWriteRejected,
    /// An operator removed the lease; `detail` holds the reason.
    ForceReleased,
}

impl LeaseEventKind {
    pub const ALL: [LeaseEventKind; 8] = [
        LeaseEventKind::Acquired,
        LeaseEventKind::Renewed,
        LeaseEventKind::RenewRejected,
        LeaseEventKind::Released,
        LeaseEventKind::Expired,
        LeaseEventKind::ReleaseOwnerMismatch,
        LeaseEventKind::FencedWriteRejected,
        LeaseEventKind::ForceReleased,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            LeaseEventKind::Acquired => "acquired",
            LeaseEventKind::Renewed => "renewed",
            LeaseEventKind::RenewRejected => "renew_rejected",
            LeaseEventKind::Released => "released",
            LeaseEventKind::Expired => "expired",
            LeaseEventKind::ReleaseOwnerMismatch => "release_owner_mismatch",
            LeaseEventKind::FencedWriteRejected => "fenced_write_rejected",
            LeaseEventKind::ForceReleased => "force_released",
        }
    }
}

impl fmt::Display for LeaseEventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LeaseEventKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("unknown lease event kind {s:?}"))
    }
}

/// One persisted piece of lease evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseEvent {
    pub name: LeaseName,
    pub kind: LeaseEventKind,
    /// Store time the event was recorded.
    pub at: Millis,
    /// The lease's owner; for rejected renews, mismatched releases and fenced writes, the
    /// caller that presented the stale lease.
    pub owner: Option<OwnerId>,
    /// The token of that lease.
    pub token: Option<FencingToken>,
    pub acquired_at: Option<Millis>,
    pub expires_at: Option<Millis>,
    /// Free text: the force-release reason, the fenced resource, the holder at a mismatch.
    pub detail: Option<String>,
}

impl LeaseEvent {
    /// An event with no lease attached (a force-release that found nobody).
    pub fn new(name: &LeaseName, kind: LeaseEventKind, at: Millis) -> Self {
        Self {
            name: name.clone(),
            kind,
            at,
            owner: None,
            token: None,
            acquired_at: None,
            expires_at: None,
            detail: None,
        }
    }

    /// An event about a lease: its owner, token and times.
    pub fn of_lease(kind: LeaseEventKind, at: Millis, lease: &Lease) -> Self {
        Self {
            owner: Some(lease.owner.clone()),
            token: Some(lease.token),
            acquired_at: Some(lease.acquired_at),
            expires_at: Some(lease.expires_at),
            ..Self::new(&lease.name, kind, at)
        }
    }

    /// An event about a caller presenting `owner` and `token` (a stale renew, release or
    /// write): the times of its lease are no longer known to the store.
    pub fn of_caller(
        kind: LeaseEventKind,
        at: Millis,
        name: &LeaseName,
        owner: &OwnerId,
        token: FencingToken,
    ) -> Self {
        Self {
            owner: Some(owner.clone()),
            token: Some(token),
            ..Self::new(name, kind, at)
        }
    }

    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// A renew or release refused to a caller that no longer holds the lease
    /// (`renew_rejected`, `release_owner_mismatch`), naming the live lease, if any.
    pub fn rejected(
        kind: LeaseEventKind,
        at: Millis,
        name: &LeaseName,
        owner: &OwnerId,
        token: FencingToken,
        current: Option<&Lease>,
    ) -> Self {
        Self::of_caller(kind, at, name, owner, token).with_detail(holder_detail(current))
    }
}

/// The `detail` every backend records with a rejected renew or an owner-mismatch release.
pub fn holder_detail(current: Option<&Lease>) -> String {
    match current {
        Some(l) => format!(
            "held by {} with token {} until {}",
            l.owner, l.token, l.expires_at
        ),
        None => "no live lease".into(),
    }
}

/// A write refused by a protected resource because a newer token was accepted there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fenced {
    pub resource: String,
    pub name: LeaseName,
    pub owner: OwnerId,
    pub token: FencingToken,
    pub last_accepted: FencingToken,
}

impl Fenced {
    /// The `detail` of the `fenced_write_rejected` event every store records for it.
    pub fn detail(&self) -> String {
        format!(
            "resource {} accepted token {}",
            self.resource, self.last_accepted
        )
    }
}

impl fmt::Display for Fenced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "write to {} with token {} of lease {} (owner {}) fenced: token {} was accepted",
            self.resource, self.token, self.name, self.owner, self.last_accepted
        )
    }
}

/// Why a lease operation failed. Not-holder answers are results, not errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The protected resource refused the write (see [`fence_accepts`]).
    #[error("{0}")]
    Fenced(Box<Fenced>),
    /// The holder's keepalive knows the lease is over; nothing was attempted.
    #[error("lease {name} with token {token} is lost: {reason}")]
    Lost {
        name: LeaseName,
        token: FencingToken,
        reason: String,
    },
    /// The store could not be reached or timed out. Callers fail closed.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    #[error("store error: {0}")]
    Backend(String),
}

impl LeaseError {
    /// The backend-neutral kind: fenced and lost are conflicts.
    pub fn kind(&self) -> ErrorKind {
        match self {
            LeaseError::InvalidInput(_) => ErrorKind::InvalidInput,
            LeaseError::Fenced(_) | LeaseError::Lost { .. } => ErrorKind::Conflict,
            LeaseError::Unavailable(_) => ErrorKind::Unavailable,
            LeaseError::Backend(_) => ErrorKind::Backend,
        }
    }

    pub fn fenced(&self) -> Option<&Fenced> {
        match self {
            LeaseError::Fenced(f) => Some(f),
            _ => None,
        }
    }

    pub fn is_fenced(&self) -> bool {
        self.fenced().is_some()
    }

    pub fn is_unavailable(&self) -> bool {
        self.kind() == ErrorKind::Unavailable
    }
}

impl From<Fenced> for LeaseError {
    fn from(f: Fenced) -> Self {
        LeaseError::Fenced(Box::new(f))
    }
}

impl From<StoreError> for LeaseError {
    fn from(e: StoreError) -> Self {
        match e.kind() {
            ErrorKind::InvalidInput => LeaseError::InvalidInput(e.to_string()),
            ErrorKind::Unavailable => LeaseError::Unavailable(e.to_string()),
            _ => LeaseError::Backend(e.to_string()),
        }
    }
}

impl From<KeyError> for LeaseError {
    fn from(e: KeyError) -> Self {
        LeaseError::InvalidInput(e.to_string())
    }
}

/// Lease durations follow the claim lease bounds: 1 ms to [`crate::store::MAX_LEASE`].
pub fn check_ttl(ttl: Duration) -> Result<(), LeaseError> {
    check_lease(ttl).map_err(LeaseError::from)
}

/// A force-release needs a reason: it is the evidence an operator leaves.
pub fn check_reason(reason: &str) -> Result<(), LeaseError> {
    if reason.trim().is_empty() {
        return Err(LeaseError::InvalidInput(
            "a force-release needs a reason".into(),
        ));
    }
    Ok(())
}

/// A place leases live. Dyn-compatible: callers hold `Arc<dyn LeaseStore>`.
#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// Grants the lease with a fresh token unless a live lease exists. An expired lease
    /// found on the way is recorded as `expired`.
    async fn try_acquire(
        &self,
        name: &LeaseName,
        owner: &OwnerId,
        ttl: Duration,
    ) -> Result<Acquire, LeaseError>;

    /// Moves the deadline to store-now + `ttl` if `owner` and `token` still hold a live
    /// lease; otherwise records `renew_rejected` and changes nothing.
    async fn renew(
        &self,
        name: &LeaseName,
        owner: &OwnerId,
        token: FencingToken,
        ttl: Duration,
    ) -> Result<Renew, LeaseError>;

    /// Ends the lease if `owner` and `token` still hold it (atomic compare-and-delete);
    /// otherwise records `release_owner_mismatch` and leaves any current lease alone.
    async fn release(
        &self,
        name: &LeaseName,
        owner: &OwnerId,
        token: FencingToken,
    ) -> Result<Release, LeaseError>;

    /// Operator action: removes whatever lease exists and records `force_released` with
    /// the reason (also when no live lease existed). Returns the live lease it removed.
    /// The token counter is kept: the next grant still gets a higher token.
    async fn force_release(
        &self,
        name: &LeaseName,
        reason: &str,
    ) -> Result<Option<Lease>, LeaseError>;

    /// The live holder, the last token granted, and the store's time.
    async fn show(&self, name: &LeaseName) -> Result<LeaseStatus, LeaseError>;

    /// The most recent `limit` events for `name`, oldest first.
    async fn events(&self, name: &LeaseName, limit: usize) -> Result<Vec<LeaseEvent>, LeaseError>;

    /// Names that have a lease row (live or ended, as the store keeps them), in name order,
    /// starting after `after` (exclusive; `None` from the start), at most `limit`.
    ///
    /// Name order is the byte order of the name (the order of [`LeaseName`]'s `Ord`), so
    /// a paging loop that passes the last name of each page as the next `after` visits
    /// every name once and ends on an empty page. A name is listed while the store
    /// remembers its last token (what [`show`](Self::show) reports as `last_token`), also
    /// after its lease ended; a name the store has forgotten (a Redis key collected after
    /// the retention period) is not. For operator consoles: the cost differs by store
    /// (see each store's implementation).
    async fn names(
        &self,
        after: Option<&LeaseName>,
        limit: usize,
    ) -> Result<Vec<LeaseName>, LeaseError>;

    /// Retention of the evidence: deletes up to `limit` events (of any name) recorded
    /// before `before` (store clock) and returns how many went. Leases, token counters
    /// and fences are untouched, so tokens keep rising. The sweeper calls it with the
    /// policy's `lease_event_window`.
    async fn trim_events(&self, before: Millis, limit: usize) -> Result<u64, LeaseError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_key_rules() {
        assert!(LeaseName::new("inventory:event-42").is_ok());
        assert_eq!(
            LeaseName::new(""),
            Err(KeyError::Empty { what: "lease name" })
        );
        assert!(matches!(
            LeaseName::new("k".repeat(256)),
            Err(KeyError::TooLong {
                what: "lease name",
                len: 256,
                ..
            })
        ));
        assert!(matches!(
            LeaseName::new("a b"),
            Err(KeyError::InvalidCharacter {
                what: "lease name",
                position: 1
            })
        ));
        assert!(serde_json::from_str::<LeaseName>("\"\"").is_err());
    }

    #[test]
    fn fencing_rule() {
        let t = FencingToken::new;
        assert!(fence_accepts(None, t(1)));
        assert!(fence_accepts(Some(t(3)), t(3)));
        assert!(fence_accepts(Some(t(3)), t(4)));
        assert!(!fence_accepts(Some(t(3)), t(2)));
    }

    #[test]
    fn event_kinds_round_trip() {
        for kind in LeaseEventKind::ALL {
            assert_eq!(kind.as_str().parse::<LeaseEventKind>(), Ok(kind));
            assert_eq!(
                serde_json::to_string(&kind).unwrap(),
                format!("\"{}\"", kind.as_str())
            );
        }
        assert!("nope".parse::<LeaseEventKind>().is_err());
    }

    #[test]
    fn leases_events_and_status() {
        let name = LeaseName::new("n").unwrap();
        let a = OwnerId::new("a").unwrap();
        let lease = Lease::granted(&name, &a, FencingToken::new(4), 10, 20);
        assert_eq!(lease.renewals, 0);
        let renewed = lease.clone().renewed(15, Duration::from_millis(30));
        assert_eq!((renewed.expires_at, renewed.renewals), (45, 1));

        let b = OwnerId::new("b").unwrap();
        let kind = LeaseEventKind::RenewRejected;
        let e = LeaseEvent::rejected(kind, 15, &name, &b, FencingToken::new(2), Some(&lease));
        assert_eq!(e.owner.as_ref(), Some(&b));
        assert_eq!(e.detail.as_deref(), Some("held by a with token 4 until 20"));
        assert_eq!(e.acquired_at, None);

        let live = LeaseStatus::of(&name, Some(lease.clone()), Some(FencingToken::new(4)), 15);
        assert_eq!(live.holder, Some(lease.clone()));
        assert_eq!(LeaseStatus::of(&name, Some(lease), None, 20).holder, None);
    }

    #[test]
    fn errors_are_typed() {
        assert_eq!(
            check_ttl(Duration::ZERO).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        assert!(check_reason("  ").is_err());
        let fenced = LeaseError::from(Fenced {
            resource: "r".into(),
            name: LeaseName::new("n").unwrap(),
            owner: OwnerId::new("a").unwrap(),
            token: FencingToken::new(1),
            last_accepted: FencingToken::new(2),
        });
        assert!(fenced.is_fenced());
        assert_eq!(fenced.kind(), ErrorKind::Conflict);
        assert!(LeaseError::from(StoreError::Unavailable("x".into())).is_unavailable());
    }
}
