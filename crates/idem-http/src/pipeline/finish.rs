//! How a run's end becomes its record's end: the rule from a response to a [`Finish`]
//! ([`ending`]) and writing it ([`finish`]), with retries and the fallbacks for a result
//! the store will not keep.
//!
//! Owns the record's last write. It must not build responses.

use std::time::Duration;

use idem_core::{
    ClaimToken, ErrorKind, Finish, IdempotencyStore, Record, RecordState, StoreError, StoredResult,
};

/// How a response ends its record, for the layer and the gateway alike: `state` is the
/// outcome policy's class of its status; a retryable outcome keeps nothing (it is not
/// replayed); a body over the capture limit (`body_fits` false) is kept without its
/// body or not at all, by `too_large`. `stored(keep_body)` builds the kept form.
pub fn ending(
    state: RecordState,
    body_fits: bool,
    too_large: TooLarge,
    stored: impl FnOnce(bool) -> StoredResult,
) -> Finish {
    if !state.is_terminal() {
        return retryable();
    }
    match (body_fits, too_large) {
        (true, _) => Finish {
            state,
            result: Some(stored(true)),
        },
        (false, TooLarge::OmitBody) => Finish {
            state,
            result: Some(stored(false)),
        },
        (false, TooLarge::Forget) => retryable(),
    }
}

/// The end of a run that failed: open for a retry, nothing kept.
pub fn retryable() -> Finish {
    Finish {
        state: RecordState::FailedRetryable,
        result: None,
    }
}

/// Who wrote the record's final state (the `finished_by` label of the layer's metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishedBy {
    /// [`finish`] did.
    Pipeline,
    /// The executed code did, in its own transaction (found when the finish was
    /// superseded by this very owner).
    Handler,
}

/// What to do when the store keeps less than the captured result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TooLarge {
    /// Keep status and headers; replays say `Idempotent-Body-Omitted: true`.
    OmitBody,
    /// End the record retryable: later duplicates execute again (behind the gateway the
    /// upstream's own record answers them).
    Forget,
}

/// How [`finish`] treats failures.
#[derive(Debug, Clone, Copy)]
pub struct FinishPolicy {
    /// Attempts while the store is unavailable (the action has run, so giving up early
    /// leaves the key PROCESSING until its lease ends).
    pub attempts: u32,
    pub too_large: TooLarge,
    /// Whether the caller reads the written record (the layer does, for its expiry and
    /// metrics; the gateway does not, so its window is not asked for a copy).
    pub read_back: bool,
}

/// Why [`finish`] wrote nothing.
#[derive(Debug)]
pub enum NotFinished {
    /// Another request took the claim over.
    Lost,
    Failed(StoreError),
}

/// Finishes the record (see [`FinishPolicy`]); the record written, unless the policy
/// does not read it back (a record the handler finished itself is always read).
pub async fn finish(
    store: &dyn IdempotencyStore,
    token: &ClaimToken,
    mut finish: Finish,
    policy: FinishPolicy,
) -> Result<(Option<Record>, FinishedBy), NotFinished> {
    let mut delay = Duration::from_millis(25);
    let mut attempt = 0;
    loop {
        attempt += 1;
        // Kept only where a failure could send it again: a retry while the store is
        // unavailable, or the same result without its body. Otherwise it is moved (the
        // gateway's finish, one attempt that forgets a refused result, copies nothing).
        let had_result = finish.result.is_some();
        let sent = if attempt < policy.attempts
            || (had_result && policy.too_large == TooLarge::OmitBody)
        {
            finish.clone()
        } else {
            std::mem::replace(&mut finish, retryable())
        };
        let written = if policy.read_back {
            store.finish(token, sent).await.map(Some)
        } else {
            store.finish_quiet(token, sent).await.map(|()| None)
        };
        let error = match written {
            Ok(record) => return Ok((record, FinishedBy::Pipeline)),
            Err(e) => e,
        };
        match error {
            StoreError::Superseded { .. } => {
                // The handler may have finished in its own transaction without saying
                // so; otherwise another request took the claim over.
                return match store.get(&token.scope).await {
                    Ok(Some(record))
                        if record.owner.as_ref() == Some(&token.owner)
                            && record.state != RecordState::Processing =>
                    {
                        Ok((Some(record), FinishedBy::Handler))
                    }
                    _ => Err(NotFinished::Lost),
                };
            }
            // The layer keeps status and headers only for a body too large; the gateway
            // forgets any result its window refuses (the upstream still has it).
            e if had_result
                && (matches!(e, StoreError::ResultTooLarge { .. })
                    || (policy.too_large == TooLarge::Forget
                        && e.kind() == ErrorKind::InvalidInput)) =>
            {
                tracing::warn!(scope = %token.scope, error = %e, "result too large to keep");
                match (policy.too_large, finish.result.as_mut()) {
                    (TooLarge::OmitBody, Some(result)) if !result.body.is_empty() => {
                        result.body.clear();
                        result.headers.push((
                            crate::headers::IDEMPOTENT_BODY_OMITTED.as_str().to_owned(),
                            "true".to_owned(),
                        ));
                    }
                    (TooLarge::OmitBody, _) => finish.result = None,
                    (TooLarge::Forget, _) => {
                        finish = Finish {
                            state: RecordState::FailedRetryable,
                            result: None,
                        }
                    }
                }
            }
            e if e.is_unavailable() && attempt < policy.attempts => {
                tracing::warn!(scope = %token.scope, error = %e, attempt, "finish failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            e => return Err(NotFinished::Failed(e)),
        }
    }
}
