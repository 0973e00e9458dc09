//! What a claim token keeps for its finish: the record's principal, fingerprint and
//! creation time, which the finish's compare-and-set cannot hand back (MySQL returns no
//! rows from an `UPDATE`; only one value comes back, in the OK packet).
//!
//! Owns the encoding of that value in [`ClaimToken::written`] (never serialized, so a
//! token that crossed a process boundary has none). A finish with it is one round trip;
//! without it (or when it does not decode) the finish reads them back after the
//! compare-and-set, as before. It must not be trusted for anything the compare-and-set
//! does not pin: the three values never change while the row exists (a takeover must
//! match principal and fingerprint), and the row the compare-and-set matched is the
//! claim's own version, so they are that row's.

use std::sync::Arc;

use idem_core::{ClaimRequest, ClaimToken, Fingerprint, Millis, Principal};

/// Marks the value as this store's (a token from another store is not decoded).
const TAG: &[u8; 8] = b"idem-my1";

/// The kept values of a claim of `req` whose record was created at `created_at`.
pub(crate) fn keep(req: &ClaimRequest, created_at: Millis) -> Arc<[u8]> {
    let principal = req.principal.as_str().as_bytes();
    let mut v = Vec::with_capacity(TAG.len() + 8 + 32 + principal.len());
    v.extend_from_slice(TAG);
    v.extend_from_slice(&created_at.to_be_bytes());
    v.extend_from_slice(req.fingerprint.as_bytes());
    v.extend_from_slice(principal);
    v.into()
}

/// The kept (principal, fingerprint, created_at) of `token`, if it has them.
pub(crate) fn kept(token: &ClaimToken) -> Option<(Principal, Fingerprint, Millis)> {
    let v = token.written.as_deref()?.strip_prefix(TAG.as_slice())?;
    let (created, rest) = v.split_first_chunk::<8>()?;
    let (fingerprint, principal) = rest.split_first_chunk::<32>()?;
    let principal = Principal::new(std::str::from_utf8(principal).ok()?).ok()?;
    Some((
        principal,
        Fingerprint::from_bytes(*fingerprint),
        i64::from_be_bytes(*created),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{ClaimKind, IdempotencyKey, OwnerId, Scope, TenantId};

    #[test]
    fn kept_values_come_back_and_foreign_ones_do_not() {
        let req = ClaimRequest {
            scope: Scope::new(
                TenantId::new("t").unwrap(),
                IdempotencyKey::new("k").unwrap(),
            ),
            principal: Principal::new("alice").unwrap(),
            fingerprint: Fingerprint::of_bytes(b"body"),
            owner: OwnerId::new("o").unwrap(),
            lease: std::time::Duration::from_secs(30),
        };
        let token = ClaimToken::of(&req, 1, 10, 1, ClaimKind::Fresh);
        assert!(kept(&token).is_none());
        let token = token.with_written(keep(&req, 1_700_000_000_123));
        assert_eq!(
            kept(&token),
            Some((req.principal.clone(), req.fingerprint, 1_700_000_000_123))
        );
        let foreign = ClaimToken::of(&req, 1, 10, 1, ClaimKind::Fresh)
            .with_written(Arc::from(&b"some other store's value"[..]));
        assert!(kept(&foreign).is_none());
    }
}
