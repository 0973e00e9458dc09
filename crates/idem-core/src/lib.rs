//! idem-core: the vocabulary of idem.
//!
//! Owns keys, scopes, identities, fingerprints, records and their states, the outcome
//! policy, the store traits, and the HTTP contract's wire vocabulary (header names, key
//! parsing, problem kinds). It does no I/O and knows no async runtime or database: stores implement
//! its traits, the HTTP layer and the CLI speak its types.

pub mod arrival;
pub mod fingerprint;
pub mod inspect;
pub mod key;
pub mod lease;
pub mod policy;
pub mod problem;
pub mod record;
pub mod retention;
pub mod store;
pub mod wire;

pub use arrival::{Arrival, ArrivalDecision, ArrivalSink};
pub use fingerprint::{
    canonical_path, canonical_query, BodyError, Fingerprint, Fingerprinter, RequestParts,
};
pub use inspect::{Inspect, PastLease, RecordSummary};
pub use key::{IdempotencyKey, Identity, KeyError, OwnerId, Principal, Scope, TenantId};
pub use lease::{
    Acquire, Fenced, FencingToken, Lease, LeaseError, LeaseEvent, LeaseEventKind, LeaseName,
    LeaseStatus, LeaseStore, Release, Renew,
};
pub use policy::{Outcome, OutcomePolicy};
pub use problem::{Problem, ProblemKind, PROBLEM_JSON, PROBLEM_TYPE_BASE};
pub use record::{Millis, Record, RecordState, StoredResult};
pub use retention::{
    ArchiveExpiry, ArchiveLookup, ArchivedRecord, CompensationCheck, Demotion, DueRecord,
    NoCompensation, PolicyError, ReplaySources, RetentionPolicy, RetentionStore, ScanCursor,
    StaleRecord, Tier, TierUsage,
};
pub use store::{
    decide, Claim, ClaimKind, ClaimRequest, ClaimToken, ClockShift, Decision, ErrorKind, Finish,
    IdempotencyStore, StoreError, StoreLimits,
};
pub use wire::{read_key, KeyHeaderError, KeyRule};
