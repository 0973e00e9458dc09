//! Waiting acquire: retries `try_acquire` with jittered exponential backoff until a
//! deadline, then gives up with the last answer.
//!
//! Pacing: the pause starts at [`MIN_BACKOFF`] and doubles up to [`MAX_BACKOFF`], scaled
//! by a random 50–100 % so waiters spread out; it never runs past the holder's deadline
//! (read from the store's answer) nor past the caller's. A held lease is therefore polled
//! at most about once per [`MIN_BACKOFF`] at first and once per [`MAX_BACKOFF`] later;
//! a release is noticed within [`MAX_BACKOFF`].

use std::time::Duration;

use idem_core::{Acquire, LeaseError, LeaseName, LeaseStore, OwnerId};
use rand::RngExt;
use tokio::time::Instant;

/// The shortest pause between two attempts.
pub const MIN_BACKOFF: Duration = Duration::from_millis(10);
/// The longest pause between two attempts.
pub const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// Acquires `name`, waiting up to `wait` while someone else holds it. Returns
/// `Acquire::Granted`, or the last `Acquire::Held` once the wait is over (a zero wait
/// tries once). Store unavailability is retried until the deadline, then returned;
/// other errors return at once.
pub async fn acquire_wait(
    store: &dyn LeaseStore,
    name: &LeaseName,
    owner: &OwnerId,
    ttl: Duration,
    wait: Duration,
) -> Result<Acquire, LeaseError> {
    acquire_wait_at(store, name, owner, ttl, wait)
        .await
        .map(|(answer, _)| answer)
}

/// [`acquire_wait`], also returning when the answering attempt was sent: the holder's
/// local deadline counts from there, since the store's deadline counts from later.
pub(crate) async fn acquire_wait_at(
    store: &dyn LeaseStore,
    name: &LeaseName,
    owner: &OwnerId,
    ttl: Duration,
    wait: Duration,
) -> Result<(Acquire, Instant), LeaseError> {
    let deadline = Instant::now() + wait;
    let mut backoff = MIN_BACKOFF;
    loop {
        let sent = Instant::now();
        let answer = store.try_acquire(name, owner, ttl).await;
        let until_free = match &answer {
            Ok(Acquire::Granted(_)) => return answer.map(|a| (a, sent)),
            Ok(Acquire::Held { holder, now }) => {
                Duration::from_millis(u64::try_from(holder.expires_at - now).unwrap_or(0))
            }
            Err(e) if e.is_unavailable() => backoff,
            Err(_) => return answer.map(|a| (a, sent)),
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return answer.map(|a| (a, sent));
        }
        let scale = rand::rng().random_range(0.5..=1.0);
        let pause = backoff
            .min(until_free)
            .mul_f64(scale)
            .max(MIN_BACKOFF)
            .min(left);
        tokio::time::sleep(pause).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}
