//! The steps before a claim, in the order both the layer and the gateway take them:
//! does the route want a key, the key itself, the declared and the read body size, the
//! fingerprint, and the owner id the claim is made under.
//!
//! Owns those checks and the problems they answer (each with the [`Decision`] it counts
//! as). It must not authenticate, read bodies or claim: callers do, in this order.

use std::sync::atomic::{AtomicU64, Ordering};

use http::header::CONTENT_TYPE;
use http::{HeaderMap, Method, Uri};
use idem_core::problem::{Problem, ProblemKind};
use idem_core::wire::{read_key, KeyHeaderError, KeyRule, IDEMPOTENCY_KEY};
use idem_core::{Fingerprint, Fingerprinter, IdempotencyKey, OwnerId, Principal, RequestParts};

use crate::body::{declared_length, ReadError};
use crate::decision::Decision;

/// Why a request is answered before its claim: the decision and the problem.
pub type Refusal = (Decision, Problem);

/// Whether a request under `rule` goes through the pipeline: required, or optional and
/// sent with a key.
pub fn needs_key(rule: KeyRule, headers: &HeaderMap) -> bool {
    match rule {
        KeyRule::Ignored => false,
        KeyRule::Optional => headers.contains_key(IDEMPOTENCY_KEY),
        KeyRule::Required => true,
    }
}

/// The request's key (both header forms are one key).
pub fn key(headers: &HeaderMap, method: &Method, path: &str) -> Result<IdempotencyKey, Refusal> {
    read_key(headers).map_err(|e| match e {
        KeyHeaderError::Missing => (
            Decision::MissingKey,
            Problem::new(
                ProblemKind::MissingKey,
                format!(
                    "{method} {path} requires an Idempotency-Key header, fixed by the client \
                     before the first send and reused on every retry"
                ),
            ),
        ),
        invalid => (
            Decision::InvalidKey,
            Problem::new(ProblemKind::InvalidKey, invalid.to_string()),
        ),
    })
}

/// The declared body length, refused before a byte is read when it is over `limit`.
pub fn declared_body(headers: &HeaderMap, limit: usize) -> Result<Option<usize>, Refusal> {
    match declared_length(headers) {
        Some(n) if n > limit as u64 => Err(too_large(limit)),
        declared => Ok(declared.and_then(|n| usize::try_from(n).ok())),
    }
}

/// A body over `limit` bytes.
pub fn too_large(limit: usize) -> Refusal {
    (
        Decision::TooLarge,
        Problem::new(
            ProblemKind::RequestTooLarge,
            format!("the body is larger than {limit} bytes; nothing was recorded"),
        ),
    )
}

/// A body that could not be buffered. The cause may name addresses or OS errors: it
/// goes to the log, never to the client.
pub fn unread(e: ReadError) -> Refusal {
    match e {
        ReadError::TooLarge { limit } => too_large(limit),
        ReadError::TimedOut => (
            Decision::UnreadableBody,
            Problem::new(
                ProblemKind::RequestTimeout,
                "the request body was not received in time; nothing was recorded",
            ),
        ),
        ReadError::Broken(e) => {
            tracing::warn!(error = %e, "reading a keyed request body failed");
            (
                Decision::UnreadableBody,
                Problem::new(
                    ProblemKind::UnreadableBody,
                    "the request body could not be read",
                ),
            )
        }
    }
}

/// The request's fingerprint over the concrete target `uri` (never a route template: a
/// key binds one resource), or the refusal of a body naming a JSON member twice.
pub fn fingerprint(
    fingerprinter: &Fingerprinter,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    principal: &Principal,
    body: &[u8],
) -> Result<Fingerprint, Refusal> {
    // Only the configured headers count: none are gathered when none are configured.
    let chosen: Vec<(&str, &str)> = if fingerprinter.headers.is_empty() {
        Vec::new()
    } else {
        headers
            .iter()
            .filter(|(name, _)| {
                fingerprinter
                    .headers
                    .iter()
                    .any(|wanted| wanted.eq_ignore_ascii_case(name.as_str()))
            })
            .filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?)))
            .collect()
    };
    fingerprinter
        .try_fingerprint(&RequestParts {
            method: method.as_str(),
            path: uri.path(),
            query: uri.query(),
            principal: principal.as_str(),
            content_type: headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()),
            body,
            headers: &chosen,
        })
        .map_err(|refused| {
            (
                Decision::DuplicateMember,
                Problem::new(ProblemKind::DuplicateJsonMember, refused.to_string()),
            )
        })
}

/// Owner ids for claims: one prefix per process (layer or gateway instance), a sequence
/// number per claim, so a record's owner tells which process and which request held it.
#[derive(Debug)]
pub struct OwnerIds {
    prefix: String,
    next: AtomicU64,
}

impl OwnerIds {
    /// Ids `<prefix><n>`; fails when the prefix leaves no room for the counter.
    pub fn new(prefix: String) -> Result<Self, String> {
        OwnerId::new(format!("{prefix}{}", u64::MAX)).map_err(|_| {
            format!(
                "owner prefix {prefix:?} must be visible ASCII, at most {} characters",
                idem_core::key::MAX_NAME_LEN - u64::MAX.to_string().len()
            )
        })?;
        Ok(Self {
            prefix,
            next: AtomicU64::new(0),
        })
    }

    pub fn next(&self) -> OwnerId {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        // Written by hand: every claim takes one, and `format!` cost more than the
        // rest of making the id.
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        let mut rest = n;
        loop {
            at -= 1;
            digits[at] = b'0' + (rest % 10) as u8;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        let mut id = String::with_capacity(self.prefix.len() + digits.len() - at);
        id.push_str(&self.prefix);
        id.extend(digits[at..].iter().map(|&d| char::from(d)));
        OwnerId::new(id).expect("checked when built")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_ids_count_from_zero_under_their_prefix() {
        let ids = OwnerIds::new("gw-a#".into()).unwrap();
        let seen: Vec<String> = (0..12).map(|_| ids.next().as_str().to_owned()).collect();
        let expected: Vec<String> = (0..12).map(|n| format!("gw-a#{n}")).collect();
        assert_eq!(seen, expected);
        ids.next.store(u64::MAX, Ordering::Relaxed);
        assert_eq!(ids.next().as_str(), format!("gw-a#{}", u64::MAX));
        // Room is left for the largest counter.
        assert!(OwnerIds::new("x".repeat(108)).is_ok());
        let e = OwnerIds::new("x".repeat(109)).unwrap_err();
        assert!(e.contains("at most 108 characters"), "{e}");
    }
}
