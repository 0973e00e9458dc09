//! The store contract: claim, finish (complete / fail), extend, get.
//!
//! Every store keeps the same promises, checked by `idem-conformance`:
//! - claim is atomic: of any number of concurrent claims of one absent key exactly one
//!   proceeds; a takeover (of FAILED_RETRYABLE, or of PROCESSING whose lease expired) is a
//!   compare-and-set on the version, so exactly one taker wins;
//! - finish and extend are compare-and-sets on version and owner: a stale owner changes
//!   nothing and gets [`StoreError::Superseded`];
//! - lease deadlines come from the store's clock, never the caller's;
//! - bad input is rejected before anything is written.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::fingerprint::Fingerprint;
use crate::key::{OwnerId, Principal, Scope};
use crate::record::{Millis, Record, RecordState, StoredResult};

/// Default largest stored result (status, headers, body, reference).
pub const DEFAULT_MAX_RESULT_BYTES: usize = 1024 * 1024;
/// Longest lease a claim may ask for.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 3600);

/// A request to start (or resume) the execution of an intent.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    pub scope: Scope,
    pub principal: Principal,
    pub fingerprint: Fingerprint,
    pub owner: OwnerId,
    /// How long the owner may hold PROCESSING before others may take over.
    pub lease: Duration,
}

/// How a claim that proceeds got its right to execute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ClaimKind {
    /// The key was absent: first execution.
    Fresh,
    /// The record was FAILED_RETRYABLE; this claim won the retry.
    RetryAfterFailure,
    /// The record was PROCESSING with an expired lease; this claim took it over.
    ExpiredLease { previous_owner: Option<OwnerId> },
}

/// Proof of a successful claim, needed to finish or extend it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimToken {
    pub scope: Scope,
    pub owner: OwnerId,
    /// The record version this claim wrote; finish compares against it.
    pub version: i64,
    pub lease_expires_at: Millis,
    pub attempt: i32,
    pub kind: ClaimKind,
    /// The exact record value this claim wrote, kept by a store that can then finish
    /// with one plain compare-and-set on it (the Redis store's `SET … IFEQ`). Never
    /// serialized: a token without it finishes by the store's general path.
    #[serde(skip)]
    pub written: Option<Arc<[u8]>>,
}

impl ClaimToken {
    /// The token of a claim of `req` that wrote `version`, with its lease deadline and
    /// attempt number as the store returned them.
    pub fn of(
        req: &ClaimRequest,
        version: i64,
        lease_expires_at: Millis,
        attempt: i32,
        kind: ClaimKind,
    ) -> Self {
        Self {
            scope: req.scope.clone(),
            owner: req.owner.clone(),
            version,
            lease_expires_at,
            attempt,
            kind,
            written: None,
        }
    }

    /// The same token, remembering the value its claim wrote.
    pub fn with_written(mut self, value: Arc<[u8]>) -> Self {
        self.written = Some(value);
        self
    }
}

/// The answer to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Execute the action, then finish with the token.
    Proceed(ClaimToken),
    /// Someone else is executing it now; no second side effect.
    InProgress {
        owner: Option<OwnerId>,
        lease_expires_at: Millis,
        now: Millis,
    },
    /// The intent already ended: return this record's result.
    Replay(Record),
    /// Same key, different request (fingerprint or principal): a client error.
    Mismatch { state: RecordState },
}

impl Claim {
    pub fn decision(&self) -> &'static str {
        match self {
            Claim::Proceed(_) => "proceed",
            Claim::InProgress { .. } => "in_progress",
            Claim::Replay(_) => "replay",
            Claim::Mismatch { .. } => "mismatch",
        }
    }
}

/// What an existing record means for a new claim. Stores that decide in Rust use this;
/// stores that decide inside the database implement the same table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Replay,
    InProgress,
    Mismatch,
    TakeOver(ClaimKind),
}

/// The claim decision table (docs/DESIGN.md: key states) for an existing record.
pub fn decide(existing: &Record, req: &ClaimRequest, now: Millis) -> Decision {
    if existing.fingerprint != req.fingerprint || existing.principal != req.principal {
        return Decision::Mismatch;
    }
    match existing.state {
        RecordState::Succeeded | RecordState::FailedTerminal => Decision::Replay,
        RecordState::FailedRetryable => Decision::TakeOver(ClaimKind::RetryAfterFailure),
        RecordState::Processing => match existing.lease_expires_at {
            Some(deadline) if deadline > now => Decision::InProgress,
            _ => Decision::TakeOver(ClaimKind::ExpiredLease {
                previous_owner: existing.owner.clone(),
            }),
        },
    }
}

/// What [`decide`] means for the store: the answer itself when nothing is written, or a
/// takeover of `existing` to try (a compare-and-set on its version).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Answer(Claim),
    TakeOver { existing: Record, kind: ClaimKind },
}

/// The decision table applied to an existing record, as the claim's answer: every store
/// answers replays, mismatches and in-progress claims the same way.
pub fn verdict(existing: Record, req: &ClaimRequest, now: Millis) -> Verdict {
    let answer = match decide(&existing, req, now) {
        Decision::Replay => Claim::Replay(existing),
        Decision::Mismatch => Claim::Mismatch {
            state: existing.state,
        },
        Decision::InProgress => Claim::InProgress {
            lease_expires_at: existing.lease_expires_at.unwrap_or(now),
            owner: existing.owner,
            now,
        },
        Decision::TakeOver(kind) => return Verdict::TakeOver { existing, kind },
    };
    Verdict::Answer(answer)
}

/// How to end a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finish {
    /// SUCCEEDED, FAILED_TERMINAL or FAILED_RETRYABLE.
    pub state: RecordState,
    pub result: Option<StoredResult>,
}

/// Limits a store enforces before writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreLimits {
    pub max_result_bytes: usize,
}

impl Default for StoreLimits {
    fn default() -> Self {
        Self {
            max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
        }
    }
}

impl StoreLimits {
    /// Limits with the largest stored result (status, headers and body) a store accepts.
    pub fn with_max_result_bytes(max_result_bytes: usize) -> Self {
        Self { max_result_bytes }
    }

    pub fn check_claim(&self, req: &ClaimRequest) -> Result<(), StoreError> {
        check_lease(req.lease)
    }

    /// [`check_claim`](Self::check_claim), then the claim's lease in milliseconds.
    pub fn claim_lease(&self, req: &ClaimRequest) -> Result<Millis, StoreError> {
        self.check_claim(req)?;
        lease_millis(req.lease)
    }

    pub fn check_finish(&self, finish: &Finish) -> Result<(), StoreError> {
        if finish.state == RecordState::Processing {
            return Err(StoreError::InvalidInput(
                "a claim cannot finish in PROCESSING".into(),
            ));
        }
        if let Some(result) = &finish.result {
            let size = result.size();
            if size > self.max_result_bytes {
                return Err(StoreError::ResultTooLarge {
                    size,
                    limit: self.max_result_bytes,
                });
            }
        }
        Ok(())
    }
}

impl StoreLimits {
    /// A record inserted whole and final (the one-commit create): a valid claim, a
    /// result within the limit, and a final outcome.
    pub fn check_final(&self, req: &ClaimRequest, finish: &Finish) -> Result<(), StoreError> {
        self.check_claim(req)?;
        self.check_finish(finish)?;
        if !finish.state.is_terminal() {
            return Err(StoreError::InvalidInput(format!(
                "a record inserted final must be SUCCEEDED or FAILED_TERMINAL, not {}",
                finish.state
            )));
        }
        Ok(())
    }
}

/// The record a fresh claim of `req` writes at store time `now`: PROCESSING, version 1,
/// first attempt, leased until `deadline`.
pub fn fresh_record(req: &ClaimRequest, now: Millis, deadline: Millis) -> Record {
    Record {
        tenant: req.scope.tenant.clone(),
        key: req.scope.key.clone(),
        principal: req.principal.clone(),
        fingerprint: req.fingerprint,
        state: RecordState::Processing,
        version: 1,
        owner: Some(req.owner.clone()),
        lease_expires_at: Some(deadline),
        result: None,
        attempts: 1,
        created_at: now,
        updated_at: now,
        completed_at: None,
    }
}

/// The record a store wrote when it inserted `req`'s key whole with `finish`'s outcome
/// at store time `at`: version 1, first attempt, no lease.
pub fn final_record(req: &ClaimRequest, finish: Finish, at: Millis) -> Record {
    Record {
        state: finish.state,
        lease_expires_at: None,
        result: finish.result,
        completed_at: Some(at),
        ..fresh_record(req, at, at)
    }
}

/// Leases must be positive and bounded.
pub fn check_lease(lease: Duration) -> Result<(), StoreError> {
    if lease.is_zero() || lease > MAX_LEASE {
        return Err(StoreError::InvalidInput(format!(
            "lease must be between 1 ms and {} s, got {} ms",
            MAX_LEASE.as_secs(),
            lease.as_millis()
        )));
    }
    Ok(())
}

/// A lease checked by [`check_lease`], in milliseconds (the bound keeps it far inside
/// `i64`).
pub fn lease_millis(lease: Duration) -> Result<Millis, StoreError> {
    check_lease(lease)?;
    Ok(i64::try_from(lease.as_millis()).unwrap_or(i64::MAX))
}

/// Backend-neutral kind of a store failure; callers branch on this, never on text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    InvalidInput,
    Conflict,
    NotFound,
    Unavailable,
    Backend,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error("result is {size} bytes; the limit is {limit}")]
    ResultTooLarge { size: usize, limit: usize },
    /// A compare-and-set lost: the record moved on (taken over, finished) since the
    /// caller's claim. Nothing was changed.
    #[error("claim on {scope} at version {version} is no longer current")]
    Superseded { scope: String, version: i64 },
    #[error("no record for {0}")]
    NotFound(String),
    /// The store could not be reached or timed out. Callers fail closed.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A bounded store holds as much as it may, overall or for this caller's partition:
    /// new keys are refused (existing ones still replay and finish) until records
    /// expire, the first of them in about `retry_after_ms`.
    #[error("{what}: new keys are refused until records expire")]
    Full {
        what: String,
        /// Only this caller's share is used up; other callers are still admitted.
        partition: bool,
        retry_after_ms: u64,
    },
    #[error("store error: {0}")]
    Backend(String),
}

impl StoreError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            StoreError::InvalidInput(_) | StoreError::ResultTooLarge { .. } => {
                ErrorKind::InvalidInput
            }
            StoreError::Superseded { .. } => ErrorKind::Conflict,
            StoreError::NotFound(_) => ErrorKind::NotFound,
            StoreError::Unavailable(_) | StoreError::Full { .. } => ErrorKind::Unavailable,
            StoreError::Backend(_) => ErrorKind::Backend,
        }
    }

    pub fn is_superseded(&self) -> bool {
        self.kind() == ErrorKind::Conflict
    }

    pub fn is_unavailable(&self) -> bool {
        self.kind() == ErrorKind::Unavailable
    }

    pub fn superseded(token: &ClaimToken) -> Self {
        StoreError::Superseded {
            scope: token.scope.to_string(),
            version: token.version,
        }
    }
}

/// A shift added to the store's clock. Production leaves it at zero; tests advance it
/// to control timelines while time still comes from the store.
#[derive(Debug, Clone, Default)]
pub struct ClockShift(Arc<AtomicI64>);

impl ClockShift {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn millis(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }

    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as i64, Ordering::SeqCst);
    }
}

/// A place idempotency records live.
#[async_trait]
pub trait IdempotencyStore: Send + Sync + 'static {
    /// Short backend name: `sqlite`, `postgres`, `redis`.
    fn backend(&self) -> &'static str;

    /// Atomically decides what an arrival of this intent may do (see [`Claim`]).
    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError>;

    /// Ends a claim: compare-and-set on version and owner.
    async fn finish(&self, token: &ClaimToken, finish: Finish) -> Result<Record, StoreError>;

    /// Ends a claim like [`finish`](Self::finish) for a caller that does not read the
    /// record back, so a store need not build it (the gateway's window keeps the result
    /// and would otherwise copy it once more, to be dropped).
    async fn finish_quiet(&self, token: &ClaimToken, finish: Finish) -> Result<(), StoreError> {
        self.finish(token, finish).await.map(drop)
    }

    /// Heartbeat: pushes the lease deadline to store-now + `lease`. Returns the new deadline.
    async fn extend_lease(&self, token: &ClaimToken, lease: Duration)
        -> Result<Millis, StoreError>;

    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError>;

    /// Whether the store's uniqueness guard on `(tenant_id, key)` is in place, read from
    /// the live schema (stores with atomic single-key writes always answer true).
    async fn unique_guard(&self) -> Result<bool, StoreError>;

    /// SUCCEEDED with this result.
    async fn complete(
        &self,
        token: &ClaimToken,
        result: StoredResult,
    ) -> Result<Record, StoreError> {
        self.finish(
            token,
            Finish {
                state: RecordState::Succeeded,
                result: Some(result),
            },
        )
        .await
    }

    /// Withdraws a claim whose execution said nothing about the intent (the caller
    /// could not authenticate): the key is as if never claimed. Compare-and-set on
    /// version and owner, like [`IdempotencyStore::finish`]. Stores that keep every
    /// claim end it FAILED_RETRYABLE without a result (the default), which a retry also
    /// takes over at once; bounded stores remove the record so it costs no room.
    async fn abandon(&self, token: &ClaimToken) -> Result<(), StoreError> {
        self.finish(
            token,
            Finish {
                state: RecordState::FailedRetryable,
                result: None,
            },
        )
        .await
        .map(|_| ())
    }

    /// FAILED_TERMINAL (stored, replayed) or FAILED_RETRYABLE (open for a retry).
    async fn fail(
        &self,
        token: &ClaimToken,
        retryable: bool,
        result: Option<StoredResult>,
    ) -> Result<Record, StoreError> {
        let state = if retryable {
            RecordState::FailedRetryable
        } else {
            RecordState::FailedTerminal
        };
        self.finish(token, Finish { state, result }).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{IdempotencyKey, TenantId};

    fn req(fp: &[u8]) -> ClaimRequest {
        ClaimRequest {
            scope: Scope::new(
                TenantId::new("t").unwrap(),
                IdempotencyKey::new("k").unwrap(),
            ),
            principal: Principal::new("p").unwrap(),
            fingerprint: Fingerprint::of_bytes(fp),
            owner: OwnerId::new("o2").unwrap(),
            lease: Duration::from_secs(3),
        }
    }

    fn record(state: RecordState, lease: Option<Millis>) -> Record {
        Record {
            tenant: TenantId::new("t").unwrap(),
            key: IdempotencyKey::new("k").unwrap(),
            principal: Principal::new("p").unwrap(),
            fingerprint: Fingerprint::of_bytes(b"a"),
            state,
            version: 1,
            owner: Some(OwnerId::new("o1").unwrap()),
            lease_expires_at: lease,
            result: None,
            attempts: 1,
            created_at: 0,
            updated_at: 0,
            completed_at: None,
        }
    }

    #[test]
    fn decision_table() {
        use RecordState::*;
        let r = req(b"a");
        let check = |rec: Record, now, want: Decision| assert_eq!(decide(&rec, &r, now), want);
        check(record(Succeeded, None), 0, Decision::Replay);
        check(record(FailedTerminal, None), 0, Decision::Replay);
        check(
            record(FailedRetryable, None),
            0,
            Decision::TakeOver(ClaimKind::RetryAfterFailure),
        );
        check(record(Processing, Some(100)), 99, Decision::InProgress);
        check(
            record(Processing, Some(100)),
            100,
            Decision::TakeOver(ClaimKind::ExpiredLease {
                previous_owner: Some(OwnerId::new("o1").unwrap()),
            }),
        );
        let other = req(b"b");
        for st in RecordState::ALL {
            assert_eq!(
                decide(&record(st, Some(100)), &other, 0),
                Decision::Mismatch
            );
        }
        let mut other_principal = req(b"a");
        other_principal.principal = Principal::new("q").unwrap();
        assert_eq!(
            decide(&record(Succeeded, None), &other_principal, 0),
            Decision::Mismatch
        );
    }

    #[test]
    fn verdicts_answer_or_take_over() {
        use RecordState::*;
        let r = req(b"a");
        let answer = |rec, now| match verdict(rec, &r, now) {
            Verdict::Answer(claim) => Some(claim),
            Verdict::TakeOver { .. } => None,
        };
        assert!(matches!(
            answer(record(Succeeded, None), 0),
            Some(Claim::Replay(_))
        ));
        assert_eq!(
            answer(record(Processing, Some(100)), 99),
            Some(Claim::InProgress {
                owner: Some(OwnerId::new("o1").unwrap()),
                lease_expires_at: 100,
                now: 99,
            })
        );
        assert_eq!(
            verdict(record(Succeeded, None), &req(b"b"), 0),
            Verdict::Answer(Claim::Mismatch { state: Succeeded })
        );
        let Verdict::TakeOver { existing, kind } = verdict(record(FailedRetryable, None), &r, 0)
        else {
            panic!("a retryable failure is taken over");
        };
        assert_eq!((existing.version, kind), (1, ClaimKind::RetryAfterFailure));

        let token = ClaimToken::of(&r, 2, 500, 2, ClaimKind::Fresh);
        assert_eq!((&token.scope, &token.owner), (&r.scope, &r.owner));
        assert_eq!(
            (token.version, token.lease_expires_at, token.attempt),
            (2, 500, 2)
        );
        assert_eq!(StoreLimits::default().claim_lease(&r), Ok(3000));
        assert!(lease_millis(MAX_LEASE + Duration::from_millis(1)).is_err());
    }

    #[test]
    fn limits() {
        let l = StoreLimits {
            max_result_bytes: 4,
        };
        let big = Finish {
            state: RecordState::Succeeded,
            result: Some(StoredResult {
                body: vec![0; 5],
                ..Default::default()
            }),
        };
        assert_eq!(
            l.check_finish(&big).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        let processing = Finish {
            state: RecordState::Processing,
            result: None,
        };
        assert!(l.check_finish(&processing).is_err());
        assert!(check_lease(Duration::ZERO).is_err());
        assert!(check_lease(Duration::from_secs(3)).is_ok());
    }
}
