//! What the SQL stores share once a row is read: column values turned into the
//! vocabulary (records, due records, archive rows, tiers, the answer of the SQL
//! key-state machine), and, in [`lease`](self::lease) (re-exported here), lease rows and
//! the order of the steps of a fenced write and of the lease changes made under a name's
//! lock.
//!
//! Owns only pure code: each store reads its columns with its own driver into the plain
//! structs here ([`RecordRow`], [`LeaseRow`], [`LeaseEventRow`], [`ArchiveRow`]), and
//! this module validates them the same way for every store. It must not do I/O or know a
//! SQL dialect; statements, migrations and transactions stay in the stores. A value that
//! does not decode is a backend error, never skipped: a corrupt record must not look like
//! an absent one.

mod lease;

pub use lease::*;

use std::fmt::Display;

use idem_core::Fingerprint;
use idem_core::{IdempotencyKey, OwnerId, Principal, TenantId};

use idem_core::StoreError;
use idem_core::{ArchivedRecord, DueRecord, Tier};
use idem_core::{Claim, ClaimKind, ClaimRequest, ClaimToken};
use idem_core::{Millis, Record, RecordState, StoredResult};

/// A stored value that does not decode.
pub fn corrupt(what: &str, detail: impl Display) -> StoreError {
    StoreError::Backend(format!("corrupt stored {what}: {detail}"))
}

fn digest<const N: usize>(what: &str, bytes: Vec<u8>) -> Result<[u8; N], StoreError> {
    let len = bytes.len();
    bytes
        .try_into()
        .map_err(|_| corrupt(what, format!("{len} bytes, expected {N}")))
}

/// A stored fingerprint (32 bytes).
pub fn fingerprint(bytes: Vec<u8>) -> Result<Fingerprint, StoreError> {
    digest("fingerprint", bytes).map(Fingerprint::from_bytes)
}

/// A stored record state.
pub fn state(text: &str) -> Result<RecordState, StoreError> {
    text.parse().map_err(|e| corrupt("state", e))
}

pub fn principal(text: String) -> Result<Principal, StoreError> {
    Principal::new(text).map_err(|e| corrupt("principal", e))
}

pub fn owner(text: Option<String>) -> Result<Option<OwnerId>, StoreError> {
    text.map(OwnerId::new)
        .transpose()
        .map_err(|e| corrupt("owner", e))
}

/// A stored tier.
pub fn tier(text: &str) -> Result<Tier, StoreError> {
    text.parse().map_err(|e: String| corrupt("tier", e))
}

/// Result headers as stored: a JSON array of `[name, value]` pairs, order kept.
pub fn headers_json(headers: &[(String, String)]) -> String {
    serde_json::to_string(headers).expect("string pairs always serialize")
}

/// The stored result: one exists iff a status was stored; the other parts default to
/// empty.
pub fn stored_result(
    status: Option<i64>,
    headers: Option<&str>,
    body: Option<Vec<u8>>,
    result_ref: Option<String>,
) -> Result<Option<StoredResult>, StoreError> {
    let Some(status) = status else {
        return Ok(None);
    };
    Ok(Some(StoredResult {
        status: u16::try_from(status).map_err(|e| corrupt("result status", e))?,
        headers: match headers {
            None => Vec::new(),
            Some(text) => serde_json::from_str(text).map_err(|e| corrupt("result headers", e))?,
        },
        body: body.unwrap_or_default(),
        result_ref,
    }))
}

/// The columns of an idempotency record.
#[derive(Debug, Clone, Default)]
pub struct RecordRow {
    pub tenant_id: String,
    pub key: String,
    pub principal: String,
    pub fingerprint: Vec<u8>,
    pub state: String,
    pub version: i64,
    pub owner: Option<String>,
    pub lease_expires_at: Option<Millis>,
    pub result_status: Option<i64>,
    pub result_headers: Option<String>,
    pub result_body: Option<Vec<u8>>,
    pub result_ref: Option<String>,
    pub attempts: i32,
    pub created_at: Millis,
    pub updated_at: Millis,
    pub completed_at: Option<Millis>,
}

impl RecordRow {
    pub fn decode(self) -> Result<Record, StoreError> {
        Ok(Record {
            tenant: TenantId::new(self.tenant_id).map_err(|e| corrupt("tenant", e))?,
            key: IdempotencyKey::from_stored(self.key).map_err(|e| corrupt("key", e))?,
            principal: principal(self.principal)?,
            fingerprint: fingerprint(self.fingerprint)?,
            state: state(&self.state)?,
            version: self.version,
            owner: owner(self.owner)?,
            lease_expires_at: self.lease_expires_at,
            result: stored_result(
                self.result_status,
                self.result_headers.as_deref(),
                self.result_body,
                self.result_ref,
            )?,
            attempts: self.attempts,
            created_at: self.created_at,
            updated_at: self.updated_at,
            completed_at: self.completed_at,
        })
    }
}

/// The columns of a record a due scan returns: the record's and its tier.
#[derive(Debug, Clone, Default)]
pub struct DueRow {
    pub record: RecordRow,
    pub tier: String,
}

impl DueRow {
    pub fn decode(self) -> Result<DueRecord, StoreError> {
        Ok(DueRecord {
            record: self.record.decode()?,
            tier: tier(&self.tier)?,
        })
    }
}

/// The columns of an archive row.
#[derive(Debug, Clone, Default)]
pub struct ArchiveRow {
    pub tenant_id: String,
    pub key_digest: Vec<u8>,
    pub fingerprint: Vec<u8>,
    pub result_digest: Option<Vec<u8>>,
    pub result_ref: Option<String>,
    pub state: String,
    pub status: Option<i64>,
    pub first_processed_at: Millis,
    pub completed_at: Option<Millis>,
    pub archived_at: Millis,
}

impl ArchiveRow {
    pub fn decode(self) -> Result<ArchivedRecord, StoreError> {
        Ok(ArchivedRecord {
            tenant: TenantId::new(self.tenant_id).map_err(|e| corrupt("archive tenant", e))?,
            key_digest: digest("archive key digest", self.key_digest)?,
            fingerprint: fingerprint(self.fingerprint)?,
            result_digest: self
                .result_digest
                .map(|d| digest("archive result digest", d))
                .transpose()?,
            result_ref: self.result_ref,
            state: state(&self.state)?,
            status: self
                .status
                .map(u16::try_from)
                .transpose()
                .map_err(|e| corrupt("archive status", e))?,
            first_processed_at: self.first_processed_at,
            completed_at: self.completed_at,
            archived_at: self.archived_at,
        })
    }
}

/// The columns of an `idem_claim` answer: the key-state machine in SQL (PostgreSQL's
/// functions, MySQL's procedures) answers the same row on both, decoded here once. The
/// columns a decision does not use may be NULL.
#[derive(Debug, Clone, Default)]
pub struct ClaimAnswerRow {
    pub decision: String,
    pub kind: Option<String>,
    pub version: Option<i64>,
    pub attempt: Option<i32>,
    pub lease_expires_at: Option<Millis>,
    pub now_ms: Millis,
    pub state: Option<String>,
    pub owner: Option<String>,
    pub status: Option<i64>,
    pub headers: Option<String>,
    pub body: Option<Vec<u8>>,
    pub result_ref: Option<String>,
    pub created_at: Option<Millis>,
    pub updated_at: Option<Millis>,
    pub completed_at: Option<Millis>,
}

impl ClaimAnswerRow {
    /// The claim this answer gives `req`.
    pub fn decode(self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        fn needed<T>(value: Option<T>, column: &str) -> Result<T, StoreError> {
            value.ok_or_else(|| corrupt(column, "NULL in this answer"))
        }
        let prior_owner = owner(self.owner)?;
        let lease = self.lease_expires_at;
        match self.decision.as_str() {
            "proceed" => {
                let kind = match self.kind.as_deref() {
                    Some("fresh") => ClaimKind::Fresh,
                    Some("retry_after_failure") => ClaimKind::RetryAfterFailure,
                    Some("expired_lease") => ClaimKind::ExpiredLease {
                        previous_owner: prior_owner,
                    },
                    other => return Err(corrupt("claim kind", format!("{other:?}"))),
                };
                let lease = lease.ok_or_else(|| corrupt("lease_expires_at", "proceed has none"))?;
                Ok(Claim::Proceed(ClaimToken::of(
                    req,
                    needed(self.version, "version")?,
                    lease,
                    needed(self.attempt, "attempt")?,
                    kind,
                )))
            }
            "in_progress" => Ok(Claim::InProgress {
                owner: prior_owner,
                lease_expires_at: lease.unwrap_or(self.now_ms),
                now: self.now_ms,
            }),
            "mismatch" => Ok(Claim::Mismatch {
                state: state(&needed(self.state, "state")?)?,
            }),
            "replay" => Ok(Claim::Replay(Record {
                tenant: req.scope.tenant.clone(),
                key: req.scope.key.clone(),
                // A replay matched both, so the record holds the request's.
                principal: req.principal.clone(),
                fingerprint: req.fingerprint,
                state: state(&needed(self.state, "state")?)?,
                version: needed(self.version, "version")?,
                owner: prior_owner,
                lease_expires_at: lease,
                result: stored_result(
                    self.status,
                    self.headers.as_deref(),
                    self.body,
                    self.result_ref,
                )?,
                attempts: needed(self.attempt, "attempt")?,
                created_at: needed(self.created_at, "created_at")?,
                updated_at: needed(self.updated_at, "updated_at")?,
                completed_at: self.completed_at,
            })),
            other => Err(corrupt("claim decision", other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record_row() -> RecordRow {
        RecordRow {
            tenant_id: "t".into(),
            key: "k".into(),
            principal: "p".into(),
            fingerprint: vec![7; 32],
            state: "SUCCEEDED".into(),
            version: 2,
            owner: Some("o".into()),
            result_status: Some(201),
            result_headers: Some(r#"[["content-type","application/json"]]"#.into()),
            result_body: None,
            result_ref: Some("order-1".into()),
            attempts: 1,
            created_at: 1,
            updated_at: 2,
            completed_at: Some(2),
            ..RecordRow::default()
        }
    }

    #[test]
    fn records_decode_and_refuse_corruption() {
        let rec = record_row().decode().unwrap();
        assert_eq!(rec.state, RecordState::Succeeded);
        let result = rec.result.unwrap();
        assert_eq!(result.status, 201);
        assert_eq!(result.headers[0].0, "content-type");
        assert!(result.body.is_empty());

        let no_result = RecordRow {
            result_status: None,
            ..record_row()
        };
        assert_eq!(no_result.decode().unwrap().result, None);
        for bad in [
            RecordRow {
                fingerprint: vec![1; 31],
                ..record_row()
            },
            RecordRow {
                state: "DONE".into(),
                ..record_row()
            },
            RecordRow {
                result_status: Some(70_000),
                ..record_row()
            },
            RecordRow {
                result_headers: Some("{".into()),
                ..record_row()
            },
            RecordRow {
                tenant_id: String::new(),
                ..record_row()
            },
        ] {
            let err = bad.decode().unwrap_err();
            assert_eq!(err.kind(), idem_core::ErrorKind::Backend, "{err}");
        }
    }

    #[test]
    fn headers_round_trip() {
        let h = vec![("a".to_string(), "1".to_string()), ("b".into(), "2".into())];
        let back = stored_result(Some(200), Some(&headers_json(&h)), None, None)
            .unwrap()
            .unwrap();
        assert_eq!(back.headers, h);
    }

    #[test]
    fn archive_rows_check_their_digests() {
        let row = ArchiveRow {
            tenant_id: "t".into(),
            key_digest: vec![1; 16],
            fingerprint: vec![2; 32],
            result_digest: Some(vec![3; 16]),
            state: "FAILED_TERMINAL".into(),
            status: Some(500),
            ..ArchiveRow::default()
        };
        let a = row.clone().decode().unwrap();
        assert_eq!(a.result_digest, Some([3; 16]));
        assert_eq!(a.status, Some(500));
        let bad = ArchiveRow {
            key_digest: vec![1; 15],
            ..row
        };
        assert!(bad.decode().is_err());
        assert_eq!(tier("dispute").unwrap(), Tier::Dispute);
        assert!(tier("cold").is_err());
    }

    #[test]
    fn due_rows_carry_their_tier() {
        let due = DueRow {
            record: record_row(),
            tier: "replay".into(),
        }
        .decode()
        .unwrap();
        assert_eq!(due.tier, Tier::Replay);
        let bad = DueRow {
            record: record_row(),
            tier: "cold".into(),
        };
        assert!(bad.decode().is_err());
    }
}
