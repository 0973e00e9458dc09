//! Reading what Redis answered: errors classified (unavailable or not), and the claim
//! script's reply turned into a [`Claim`].
//!
//! Owns decoding only; it must not send a command.

use idem_core::{Claim, ClaimKind, ClaimRequest, ClaimToken, OwnerId, StoreError};
use redis::{RedisError, Value};

use crate::codec;

/// Redis error → store error: cannot-serve-now conditions are `Unavailable`.
pub fn map_err(e: &RedisError) -> StoreError {
    use redis::{ErrorKind as K, ServerErrorKind as S};
    let unavailable = e.is_io_error()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_connection_dropped()
        || matches!(
            e.kind(),
            K::Server(S::BusyLoading | S::TryAgain | S::ClusterDown | S::MasterDown | S::ReadOnly)
                | K::ClusterConnectionNotFound
        )
        || matches!(e.code(), Some("BUSY" | "OOM" | "LOADING" | "MASTERDOWN"));
    if let Some(tls) = idem_net::tls::describe_failure(e) {
        return StoreError::Unavailable(format!("redis: {tls}"));
    }
    if unavailable {
        StoreError::Unavailable(format!("redis: {e}"))
    } else {
        StoreError::Backend(format!("redis: {e}"))
    }
}

pub(crate) fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(format!("redis: malformed reply or record: {what}"))
}

pub(crate) fn int(v: &Value) -> Result<i64, StoreError> {
    match v {
        Value::Int(i) => Ok(*i),
        other => Err(corrupt(format!("expected an integer, got {other:?}"))),
    }
}

pub(crate) fn bytes(v: &Value) -> Result<&[u8], StoreError> {
    match v {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.as_bytes()),
        other => Err(corrupt(format!("expected a string, got {other:?}"))),
    }
}

pub(crate) fn opt_owner(v: &Value) -> Result<Option<OwnerId>, StoreError> {
    let b = bytes(v)?;
    if b.is_empty() {
        return Ok(None);
    }
    let s = std::str::from_utf8(b).map_err(|_| corrupt("owner is not UTF-8"))?;
    OwnerId::new(s).map(Some).map_err(corrupt)
}

/// Reads a `claim.lua` reply (see the script's header for the shapes).
pub(crate) fn parse_claim(req: &ClaimRequest, reply: Value) -> Result<Claim, StoreError> {
    let items = match reply {
        // The stored record itself: a replay.
        Value::BulkString(v) => return Ok(Claim::Replay(codec::decode_record(&v)?)),
        Value::Array(items) => items,
        other => return Err(corrupt(format!("claim reply {other:?}"))),
    };
    let item = |i: usize| {
        items
            .get(i)
            .ok_or_else(|| corrupt(format!("claim reply has {} items", items.len())))
    };
    match int(item(0)?)? {
        1 => {
            let kind = match int(item(1)?)? {
                1 => ClaimKind::Fresh,
                2 => ClaimKind::RetryAfterFailure,
                3 => ClaimKind::ExpiredLease {
                    previous_owner: opt_owner(item(5)?)?,
                },
                other => return Err(corrupt(format!("claim kind {other}"))),
            };
            let version = int(item(2)?)?;
            let lease_expires_at = int(item(3)?)?;
            let attempt = i32::try_from(int(item(4)?)?).map_err(corrupt)?;
            let token = ClaimToken::of(req, version, lease_expires_at, attempt, kind);
            Ok(Claim::Proceed(token))
        }
        2 => Ok(Claim::InProgress {
            now: int(item(1)?)?,
            lease_expires_at: int(item(2)?)?,
            owner: opt_owner(item(3)?)?,
        }),
        3 => {
            let state = match bytes(item(1)?)? {
                [code] => codec::state_of(*code)?,
                other => return Err(corrupt(format!("state {other:?}"))),
            };
            Ok(Claim::Mismatch { state })
        }
        other => Err(corrupt(format!("claim decision {other}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_mapping() {
        let io: RedisError = std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into();
        assert!(map_err(&io).is_unavailable());
        let dropped: RedisError = std::io::Error::from(std::io::ErrorKind::BrokenPipe).into();
        assert!(map_err(&dropped).is_unavailable());
        let timeout: RedisError = std::io::Error::from(std::io::ErrorKind::TimedOut).into();
        assert!(map_err(&timeout).is_unavailable());
        let loading: RedisError = (
            redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading),
            "loading",
        )
            .into();
        assert!(map_err(&loading).is_unavailable());
        let other: RedisError = (redis::ErrorKind::UnexpectedReturnType, "wrong type").into();
        assert_eq!(map_err(&other).kind(), idem_core::ErrorKind::Backend);
    }
}
