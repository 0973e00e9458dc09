//! The Redis server's clock as seen from this process, for the commands that write a
//! time without a script (a fresh claim's `SET … NX GET`, a completion's `SET … IFEQ`)
//! and for deciding when a replay kept in memory is no longer used.
//!
//! A `TIME` reply read between the local instants `sent` and `received` bounds the
//! server's clock at any later local instant `t`: it is at least `time + (t - received)`
//! and at most `time + (t - sent) + 1 ms` (`TIME` is cut to whole milliseconds here),
//! up to the drift between the two clocks since the reading, which is taken again once
//! it is older than [`REFRESH`]. Writes use the upper bound, so a lease written without
//! a script is never shorter than asked. Nothing that ends someone else's lease is
//! decided on these bounds: a takeover always goes to the claim script, which reads
//! `TIME` itself.
//!
//! This module owns the reading only; it must not talk to Redis.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use idem_core::Millis;

/// How old a reading may get before the next caller takes a new one.
pub(crate) const REFRESH: Duration = Duration::from_secs(1);
/// Past this age every caller takes a new reading itself.
pub(crate) const STALE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy)]
struct Reading {
    time_ms: Millis,
    sent: Instant,
    received: Instant,
}

/// Bounds on the server's clock now (shift included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bounds {
    pub(crate) lower: Millis,
    pub(crate) upper: Millis,
}

#[derive(Debug)]
pub(crate) struct ServerClock {
    reading: Mutex<Option<Reading>>,
    refreshing: AtomicBool,
}

fn millis(d: Duration) -> Millis {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl ServerClock {
    pub(crate) fn new() -> Self {
        Self {
            reading: Mutex::new(None),
            refreshing: AtomicBool::new(false),
        }
    }

    fn reading(&self) -> Option<Reading> {
        *self.reading.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether this caller should take a new reading: there is none, or it is older
    /// than [`REFRESH`] and nobody else is taking one — or older than [`STALE`] whatever
    /// the flag says, so a bound is never stretched over a reading that old. A `true` is
    /// followed by [`refresh`](Self::refresh), whose guard always ends it.
    pub(crate) fn begin_refresh(&self) -> bool {
        let age = match self.reading() {
            None => return !self.refreshing.swap(true, Ordering::AcqRel),
            Some(r) => r.received.elapsed(),
        };
        if age >= STALE {
            self.refreshing.store(true, Ordering::Release);
            return true;
        }
        age >= REFRESH && !self.refreshing.swap(true, Ordering::AcqRel)
    }

    /// Stores a `TIME` reply (seconds, microseconds) read between `sent` and `received`.
    pub(crate) fn record(&self, secs: i64, micros: i64, sent: Instant, received: Instant) {
        let time_ms = secs.saturating_mul(1000).saturating_add(micros / 1000);
        *self.reading.lock().unwrap_or_else(PoisonError::into_inner) = Some(Reading {
            time_ms,
            sent,
            received,
        });
        self.refreshing.store(false, Ordering::Release);
    }

    /// A refresh that failed: the next caller tries again.
    pub(crate) fn abandon(&self) {
        self.refreshing.store(false, Ordering::Release);
    }

    /// A refresh in progress that is abandoned if it is dropped before
    /// [`Refresh::record`] (its caller's future was cancelled mid-`TIME`).
    pub(crate) fn refresh(&self) -> Refresh<'_> {
        Refresh {
            clock: self,
            done: false,
        }
    }

    /// The bounds now, with the test clock `shift` added; `None` before the first
    /// reading.
    pub(crate) fn bounds(&self, shift: Millis) -> Option<Bounds> {
        let r = self.reading()?;
        let now = Instant::now();
        let base = r.time_ms.saturating_add(shift);
        Some(Bounds {
            lower: base.saturating_add(millis(now.saturating_duration_since(r.received))),
            upper: base
                .saturating_add(millis(now.saturating_duration_since(r.sent)))
                .saturating_add(1),
        })
    }
}

/// See [`ServerClock::refresh`].
pub(crate) struct Refresh<'a> {
    clock: &'a ServerClock,
    done: bool,
}

impl Refresh<'_> {
    pub(crate) fn record(mut self, secs: i64, micros: i64, sent: Instant, received: Instant) {
        self.done = true;
        self.clock.record(secs, micros, sent, received);
    }
}

impl Drop for Refresh<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.clock.abandon();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_bracket_the_reading_and_grow_with_local_time() {
        let clock = ServerClock::new();
        assert!(clock.bounds(0).is_none());
        assert!(clock.begin_refresh());
        assert!(!clock.begin_refresh(), "one refresh at a time");
        let sent = Instant::now();
        let received = sent + Duration::from_millis(3);
        clock.record(1_700_000_000, 250_999, sent, received);
        let b = clock.bounds(0).unwrap();
        // The server read TIME somewhere in [sent, received]: now is within the bounds.
        assert!(b.lower <= b.upper);
        assert!(b.upper > 1_700_000_000_250);
        assert!(b.upper - b.lower <= 3 + 1 + 5, "{b:?}");
        let shifted = clock.bounds(60_000).unwrap();
        assert!(shifted.lower >= b.lower + 60_000);
        assert!(!clock.begin_refresh(), "a fresh reading is not due");
    }

    #[test]
    fn a_dropped_refresh_lets_the_next_caller_try() {
        let clock = ServerClock::new();
        assert!(clock.begin_refresh());
        drop(clock.refresh());
        assert!(clock.begin_refresh(), "the cancelled refresh ended");
        let sent = Instant::now();
        clock.refresh().record(1_700_000_000, 0, sent, sent);
        assert!(!clock.begin_refresh(), "a fresh reading is not due");
    }

    #[test]
    fn a_failed_refresh_lets_the_next_caller_try() {
        let clock = ServerClock::new();
        assert!(clock.begin_refresh());
        clock.abandon();
        assert!(clock.begin_refresh());
    }
}
