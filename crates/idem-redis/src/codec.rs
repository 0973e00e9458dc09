//! The record as one Redis string value (see the crate docs, *Record encoding*).
//!
//! The Lua scripts read only the fixed header and compare the owner and identity blocks
//! as opaque bytes; the result block is written and read by Rust alone. Everything is
//! length-prefixed, so any bytes (binary bodies, quotes, newlines in headers) round-trip.

use idem_core::{
    ClaimToken, Fingerprint, IdempotencyKey, OwnerId, Principal, Record, RecordState, Scope,
    StoreError, StoredResult, TenantId,
};

/// First byte of every record value. A value with another first byte is refused.
pub const FORMAT: u8 = 1;
/// Length of the fixed header: format, state, version, lease, attempts, created,
/// updated, completed.
pub const HEADER_LEN: usize = 1 + 1 + 8 + 8 + 4 + 8 + 8 + 8;

fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(format!("redis: malformed record: {what}"))
}

/// The one-letter state code stored in the header (and passed to `finish.lua`).
pub fn state_code(state: RecordState) -> u8 {
    match state {
        RecordState::Processing => b'P',
        RecordState::Succeeded => b'S',
        RecordState::FailedRetryable => b'R',
        RecordState::FailedTerminal => b'T',
    }
}

pub fn state_of(code: u8) -> Result<RecordState, StoreError> {
    Ok(match code {
        b'P' => RecordState::Processing,
        b'S' => RecordState::Succeeded,
        b'R' => RecordState::FailedRetryable,
        b'T' => RecordState::FailedTerminal,
        other => return Err(corrupt(format!("state code {other:#04x}"))),
    })
}

fn put_str16(out: &mut Vec<u8>, s: &str) {
    // Names are at most 255 bytes (idem_core::key), far inside u16.
    out.extend_from_slice(&(s.len() as u16).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_bytes32(out: &mut Vec<u8>, b: &[u8]) -> Result<(), StoreError> {
    let len = u32::try_from(b.len())
        .map_err(|_| StoreError::InvalidInput("result part longer than 4 GiB".into()))?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(b);
    Ok(())
}

/// `u16 length + owner`: how the owner sits in a record, compared byte for byte by the
/// scripts.
pub fn owner_block(owner: &OwnerId) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + owner.as_str().len());
    put_str16(&mut out, owner.as_str());
    out
}

/// `u16 length + (principal, fingerprint, tenant, key)`: what a claim must match for the
/// same request (principal and fingerprint; tenant and key are the key's own).
pub fn identity_block(
    principal: &Principal,
    fingerprint: &Fingerprint,
    tenant: &TenantId,
    key: &IdempotencyKey,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(identity_len(principal, tenant, key));
    put_identity(&mut out, principal, fingerprint, tenant, key);
    out
}

fn identity_len(principal: &Principal, tenant: &TenantId, key: &IdempotencyKey) -> usize {
    2 + 2 + principal.as_str().len() + 32 + 2 + tenant.as_str().len() + 2 + key.as_str().len()
}

fn put_identity(
    out: &mut Vec<u8>,
    principal: &Principal,
    fingerprint: &Fingerprint,
    tenant: &TenantId,
    key: &IdempotencyKey,
) {
    let inner = identity_len(principal, tenant, key) - 2;
    out.extend_from_slice(&(inner as u16).to_be_bytes());
    put_str16(out, principal.as_str());
    out.extend_from_slice(fingerprint.as_bytes());
    put_str16(out, tenant.as_str());
    put_str16(out, key.as_str());
}

/// The result block: empty for no result, otherwise `u16 status, u8 has_ref,
/// [u32 len + ref], u32 header count, (u32 len + name, u32 len + value)*, u32 len + body`.
pub fn result_block(result: Option<&StoredResult>) -> Result<Vec<u8>, StoreError> {
    let mut out = Vec::with_capacity(result.map_or(0, result_len));
    put_result(&mut out, result)?;
    Ok(out)
}

fn result_len(r: &StoredResult) -> usize {
    16 + r.size() + 8 * r.headers.len()
}

fn put_result(out: &mut Vec<u8>, result: Option<&StoredResult>) -> Result<(), StoreError> {
    let Some(r) = result else {
        return Ok(());
    };
    out.extend_from_slice(&r.status.to_be_bytes());
    match &r.result_ref {
        Some(rr) => {
            out.push(1);
            put_bytes32(out, rr.as_bytes())?;
        }
        None => out.push(0),
    }
    let count = u32::try_from(r.headers.len())
        .map_err(|_| StoreError::InvalidInput("too many result headers".into()))?;
    out.extend_from_slice(&count.to_be_bytes());
    for (name, value) in &r.headers {
        put_bytes32(out, name.as_bytes())?;
        put_bytes32(out, value.as_bytes())?;
    }
    put_bytes32(out, &r.body)
}

/// A whole record value, as the scripts would have written it (tests, tools).
pub fn encode_record(rec: &Record) -> Result<Vec<u8>, StoreError> {
    // One allocation of the exact size: every fresh claim encodes one.
    let mut out = Vec::with_capacity(
        HEADER_LEN
            + 2
            + rec.owner.as_ref().map_or(0, |o| o.as_str().len())
            + identity_len(&rec.principal, &rec.tenant, &rec.key)
            + rec.result.as_ref().map_or(0, result_len),
    );
    out.push(FORMAT);
    out.push(state_code(rec.state));
    out.extend_from_slice(&rec.version.to_be_bytes());
    out.extend_from_slice(&rec.lease_expires_at.unwrap_or(0).to_be_bytes());
    out.extend_from_slice(&rec.attempts.to_be_bytes());
    out.extend_from_slice(&rec.created_at.to_be_bytes());
    out.extend_from_slice(&rec.updated_at.to_be_bytes());
    out.extend_from_slice(&rec.completed_at.unwrap_or(0).to_be_bytes());
    put_str16(&mut out, rec.owner.as_ref().map_or("", |o| o.as_str()));
    put_identity(
        &mut out,
        &rec.principal,
        &rec.fingerprint,
        &rec.tenant,
        &rec.key,
    );
    put_result(&mut out, rec.result.as_ref())?;
    Ok(out)
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], StoreError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.buf.len())
            .ok_or_else(|| corrupt(format!("truncated at {what}")))?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], StoreError> {
        Ok(self.take(N, what)?.try_into().expect("length checked"))
    }

    fn u8(&mut self, what: &str) -> Result<u8, StoreError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<u16, StoreError> {
        Ok(u16::from_be_bytes(self.array(what)?))
    }

    fn u32(&mut self, what: &str) -> Result<u32, StoreError> {
        Ok(u32::from_be_bytes(self.array(what)?))
    }

    fn i32(&mut self, what: &str) -> Result<i32, StoreError> {
        Ok(i32::from_be_bytes(self.array(what)?))
    }

    fn i64(&mut self, what: &str) -> Result<i64, StoreError> {
        Ok(i64::from_be_bytes(self.array(what)?))
    }

    fn text(&mut self, n: usize, what: &str) -> Result<&'a str, StoreError> {
        std::str::from_utf8(self.take(n, what)?)
            .map_err(|_| corrupt(format!("{what} is not UTF-8")))
    }

    fn bytes16(&mut self, what: &str) -> Result<&'a [u8], StoreError> {
        let n = self.u16(what)? as usize;
        self.take(n, what)
    }

    fn str16(&mut self, what: &str) -> Result<&'a str, StoreError> {
        let n = self.u16(what)? as usize;
        self.text(n, what)
    }

    fn bytes32(&mut self, what: &str) -> Result<&'a [u8], StoreError> {
        let n = self.u32(what)? as usize;
        self.take(n, what)
    }

    fn str32(&mut self, what: &str) -> Result<String, StoreError> {
        let b = self.bytes32(what)?;
        String::from_utf8(b.to_vec()).map_err(|_| corrupt(format!("{what} is not UTF-8")))
    }

    fn done(&self) -> bool {
        self.pos == self.buf.len()
    }
}

/// Names a caller already holds: a decoded name equal to one of them shares it instead
/// of being checked and copied again.
#[derive(Clone, Copy, Default)]
struct Known<'k> {
    scope: Option<&'k Scope>,
    owner: Option<&'k OwnerId>,
}

/// `known` when it spells `raw`, else `make` of `raw` read as text (`what` names it).
fn shared_or<T: Clone>(
    known: Option<&T>,
    spelled: impl Fn(&T) -> &str,
    raw: &[u8],
    what: &str,
    make: impl FnOnce(&str) -> Result<T, idem_core::KeyError>,
) -> Result<T, StoreError> {
    match known {
        Some(k) if spelled(k).as_bytes() == raw => Ok(k.clone()),
        _ => {
            let s =
                std::str::from_utf8(raw).map_err(|_| corrupt(format!("{what} is not UTF-8")))?;
            make(s).map_err(corrupt)
        }
    }
}

/// Decodes the header, owner and identity blocks; returns the record without its
/// result and the reader positioned at the result block.
fn decode_head<'a>(buf: &'a [u8], known: Known<'_>) -> Result<(Record, Reader<'a>), StoreError> {
    let mut r = Reader { buf, pos: 0 };
    let format = r.u8("format")?;
    if format != FORMAT {
        return Err(corrupt(format!("unknown format {format}")));
    }
    let state = state_of(r.u8("state")?)?;
    let version = r.i64("version")?;
    let lease = r.i64("lease")?;
    let attempts = r.i32("attempts")?;
    let created_at = r.i64("created")?;
    let updated_at = r.i64("updated")?;
    let completed = r.i64("completed")?;
    let owner = r.bytes16("owner")?;
    let owner = if owner.is_empty() {
        None
    } else {
        Some(shared_or(
            known.owner,
            OwnerId::as_str,
            owner,
            "owner",
            |s| OwnerId::new(s),
        )?)
    };
    let ident_len = r.u16("identity")? as usize;
    let ident_end = r.pos + ident_len;
    let principal = Principal::new(r.str16("principal")?).map_err(corrupt)?;
    let fingerprint = Fingerprint::from_bytes(r.array("fingerprint")?);
    let tenant = shared_or(
        known.scope.map(|s| &s.tenant),
        TenantId::as_str,
        r.bytes16("tenant")?,
        "tenant",
        |s| TenantId::new(s),
    )?;
    let key = shared_or(
        known.scope.map(|s| &s.key),
        IdempotencyKey::as_str,
        r.bytes16("key")?,
        "key",
        |s| IdempotencyKey::from_stored(s),
    )?;
    if r.pos != ident_end {
        return Err(corrupt("identity block length"));
    }
    let rec = Record {
        tenant,
        key,
        principal,
        fingerprint,
        state,
        version,
        owner,
        // Only PROCESSING holds a lease; only terminal outcomes have ended.
        lease_expires_at: (state == RecordState::Processing).then_some(lease),
        result: None,
        attempts,
        created_at,
        updated_at,
        completed_at: state.is_terminal().then_some(completed),
    };
    Ok((rec, r))
}

/// Decodes a whole record value (`GET` of a record key).
pub fn decode_record(buf: &[u8]) -> Result<Record, StoreError> {
    let (mut rec, mut r) = decode_head(buf, Known::default())?;
    if r.done() {
        return Ok(rec);
    }
    let status = r.u16("result status")?;
    let result_ref = match r.u8("result ref flag")? {
        0 => None,
        1 => Some(r.str32("result ref")?),
        other => return Err(corrupt(format!("result ref flag {other}"))),
    };
    let count = r.u32("header count")? as usize;
    let mut headers = Vec::with_capacity(count.min(1024));
    for _ in 0..count {
        let name = r.str32("header name")?;
        let value = r.str32("header value")?;
        headers.push((name, value));
    }
    let body = r.bytes32("body")?.to_vec();
    if !r.done() {
        return Err(corrupt("trailing bytes after the result"));
    }
    rec.result = Some(StoredResult {
        status,
        headers,
        body,
        result_ref,
    });
    Ok(rec)
}

/// Decodes what `finish.lua` returns (the new record without its result) and attaches
/// the result the caller sent; names equal to the claim's share them.
pub fn decode_finished(
    buf: &[u8],
    token: Option<&ClaimToken>,
    result: Option<StoredResult>,
) -> Result<Record, StoreError> {
    let known = Known {
        scope: token.map(|t| &t.scope),
        owner: token.map(|t| &t.owner),
    };
    let (mut rec, r) = decode_head(buf, known)?;
    if !r.done() {
        return Err(corrupt("finish reply carries a result"));
    }
    rec.result = result;
    Ok(rec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(state: RecordState, result: Option<StoredResult>) -> Record {
        Record {
            tenant: TenantId::new("t{1}:x").unwrap(),
            key: IdempotencyKey::new("k%3A").unwrap(),
            principal: Principal::new("user-7318").unwrap(),
            fingerprint: Fingerprint::of_bytes(b"payload"),
            state,
            version: 7,
            owner: Some(OwnerId::new("gw-1").unwrap()),
            lease_expires_at: (state == RecordState::Processing).then_some(1_700_000_030_000),
            result,
            attempts: 2,
            created_at: 1_700_000_000_000,
            updated_at: 1_700_000_010_000,
            completed_at: state.is_terminal().then_some(1_700_000_010_000),
        }
    }

    #[test]
    fn round_trips() {
        let binary = StoredResult {
            status: 500,
            headers: vec![
                ("x-\"q\"".into(), "a\nb".into()),
                ("content-type".into(), "application/octet-stream".into()),
            ],
            body: (0..=255u8).chain([0, 0xff, 0xc3, 0x28]).collect(),
            result_ref: None,
        };
        let with_ref = StoredResult {
            status: 201,
            headers: vec![],
            body: vec![],
            result_ref: Some("order:1".into()),
        };
        for st in RecordState::ALL {
            for result in [None, Some(binary.clone()), Some(with_ref.clone())] {
                let rec = record(st, result);
                let bytes = encode_record(&rec).unwrap();
                assert_eq!(bytes[0], FORMAT);
                assert_eq!(decode_record(&bytes).unwrap(), rec);
            }
        }
    }

    #[test]
    fn header_layout_matches_the_scripts() {
        // The scripts read the header with struct format '>Bc1i8i8i4i8i8i8' and find the
        // owner block at byte 47 (1-based).
        let rec = record(RecordState::Processing, None);
        let bytes = encode_record(&rec).unwrap();
        assert_eq!(bytes[1], b'P');
        assert_eq!(&bytes[2..10], &7i64.to_be_bytes());
        assert_eq!(&bytes[10..18], &1_700_000_030_000i64.to_be_bytes());
        assert_eq!(&bytes[18..22], &2i32.to_be_bytes());
        let owner = owner_block(rec.owner.as_ref().unwrap());
        assert_eq!(
            &bytes[HEADER_LEN..HEADER_LEN + owner.len()],
            owner.as_slice()
        );
        let ident = identity_block(&rec.principal, &rec.fingerprint, &rec.tenant, &rec.key);
        let at = HEADER_LEN + owner.len();
        assert_eq!(&bytes[at..at + ident.len()], ident.as_slice());
        assert_eq!(
            bytes.len(),
            at + ident.len(),
            "no result, nothing after identity"
        );
    }

    #[test]
    fn a_finish_reply_shares_the_claims_names() {
        let rec = record(RecordState::Succeeded, None);
        let head = encode_record(&rec).unwrap();
        let token = ClaimToken::of(
            &idem_core::ClaimRequest {
                scope: Scope::new(rec.tenant.clone(), rec.key.clone()),
                principal: rec.principal.clone(),
                fingerprint: rec.fingerprint,
                owner: rec.owner.clone().unwrap(),
                lease: std::time::Duration::from_secs(30),
            },
            7,
            0,
            2,
            idem_core::ClaimKind::Fresh,
        );
        let shared = decode_finished(&head, Some(&token), None).unwrap();
        assert_eq!(shared, rec);
        assert!(std::ptr::eq(
            shared.tenant.as_str(),
            token.scope.tenant.as_str()
        ));
        assert!(std::ptr::eq(shared.key.as_str(), token.scope.key.as_str()));
        assert!(std::ptr::eq(
            shared.owner.as_ref().unwrap().as_str(),
            token.owner.as_str()
        ));
        // Names that differ from the claim's are the stored ones.
        let mut other = token.clone();
        other.owner = OwnerId::new("someone-else").unwrap();
        other.scope = Scope::new(
            TenantId::new("t2").unwrap(),
            IdempotencyKey::new("k2").unwrap(),
        );
        assert_eq!(decode_finished(&head, Some(&other), None).unwrap(), rec);
    }

    #[test]
    fn refuses_damage() {
        let rec = record(
            RecordState::Succeeded,
            Some(StoredResult {
                status: 200,
                headers: vec![("a".into(), "b".into())],
                body: b"body".to_vec(),
                result_ref: None,
            }),
        );
        let bytes = encode_record(&rec).unwrap();
        for cut in [0, 1, 10, HEADER_LEN, HEADER_LEN + 3, bytes.len() - 1] {
            assert!(decode_record(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode_record(&longer).is_err());
        let mut other_format = bytes.clone();
        other_format[0] = 2;
        assert!(decode_record(&other_format).is_err());
        let mut bad_state = bytes;
        bad_state[1] = b'X';
        assert!(decode_record(&bad_state).is_err());
    }

    #[test]
    fn finished_reply_takes_the_sent_result() {
        let result = Some(StoredResult {
            status: 201,
            headers: vec![],
            body: b"x".to_vec(),
            result_ref: None,
        });
        let rec = record(RecordState::Succeeded, result.clone());
        let bytes = encode_record(&record(RecordState::Succeeded, None)).unwrap();
        assert_eq!(decode_finished(&bytes, None, result.clone()).unwrap(), rec);
        let full = encode_record(&rec).unwrap();
        assert!(decode_finished(&full, None, None).is_err());
    }
}
