//! When and how long to wait before the next attempt of an intent.
//!
//! Owns the retry policy, exponential backoff with jitter and the reading of
//! `Retry-After`. It must not decide what an attempt sends: every attempt of an intent
//! sends the same key and body.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{HeaderMap, RETRY_AFTER};
use rand::RngExt;

/// How an intent is retried. `Default`: 5 attempts within 30 s, 10 s per attempt,
/// backoff from 100 ms doubling to 5 s, retrying 409, 429, 502, 503 and 504.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Attempts in total, the first included (at least 1).
    pub max_attempts: u32,
    /// Time from the first send after which no new attempt starts.
    pub time_budget: Duration,
    /// One attempt (send and read the response) may take this long; then it counts as a
    /// timeout and is retried.
    pub attempt_timeout: Duration,
    /// Backoff cap before the first retry; it doubles for every retry after.
    pub base_delay: Duration,
    /// Largest backoff cap.
    pub max_delay: Duration,
    /// Statuses that mean "not now, same key later".
    pub retry_statuses: Vec<u16>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            time_budget: Duration::from_secs(30),
            attempt_timeout: Duration::from_secs(10),
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(5),
            retry_statuses: vec![409, 429, 502, 503, 504],
        }
    }
}

/// Statuses returned as errors at once: retrying them with the same key cannot help.
pub(crate) const REJECTED: [u16; 4] = [400, 401, 413, 422];

impl RetryPolicy {
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    pub fn time_budget(mut self, budget: Duration) -> Self {
        self.time_budget = budget;
        self
    }

    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.base_delay = base;
        self.max_delay = max.max(base);
        self
    }

    /// The backoff cap before retry number `retry` (1 for the first retry).
    pub fn cap(&self, retry: u32) -> Duration {
        let factor = 1u32
            .checked_shl(retry.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.base_delay
            .checked_mul(factor)
            .unwrap_or(self.max_delay)
            .min(self.max_delay)
    }

    /// The wait before retry number `retry`: "equal jitter" (half the cap plus a random
    /// part of the other half, so duplicates spread out yet never hammer at once), and
    /// never less than what the server asked with `Retry-After`.
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        let cap = self.cap(retry);
        let half = cap / 2;
        let jitter = rand::rng().random_range(Duration::ZERO..=cap - half);
        (half + jitter).max(retry_after.unwrap_or_default())
    }
}

/// `Retry-After` as a duration: delta-seconds or an HTTP-date (IMF-fixdate).
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = parse_http_date(value)?;
    Some(at.duration_since(SystemTime::now()).unwrap_or_default())
}

/// Parses `Sun, 06 Nov 1994 08:49:37 GMT`.
pub(crate) fn parse_http_date(s: &str) -> Option<SystemTime> {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (_, rest) = s.split_once(", ")?;
    let mut parts = rest.split(' ');
    let day: i64 = parts.next()?.parse().ok()?;
    let month_name = parts.next()?;
    let month = MONTHS.iter().position(|m| *m == month_name)? as i64 + 1;
    let year: i64 = parts.next()?.parse().ok()?;
    let mut hms = parts.next()?.split(':').map(|p| p.parse::<i64>().ok());
    let (h, m, sec) = (hms.next()??, hms.next()??, hms.next()??);
    if parts.next()? != "GMT" || parts.next().is_some() || !(1..=31).contains(&day) {
        return None;
    }
    // Howard Hinnant's days-from-civil.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + m * 60 + sec;
    Some(UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn backoff_doubles_to_the_cap_and_jitters_within_it() {
        let p = RetryPolicy::default().backoff(Duration::from_millis(100), Duration::from_secs(1));
        assert_eq!(p.cap(1), Duration::from_millis(100));
        assert_eq!(p.cap(2), Duration::from_millis(200));
        assert_eq!(p.cap(4), Duration::from_millis(800));
        assert_eq!(p.cap(5), Duration::from_secs(1));
        assert_eq!(p.cap(60), Duration::from_secs(1));
        let delays: Vec<Duration> = (0..200).map(|_| p.delay(3, None)).collect();
        assert!(delays
            .iter()
            .all(|d| *d >= Duration::from_millis(200) && *d <= Duration::from_millis(400)));
        assert!(delays.iter().any(|d| *d != delays[0]), "jittered");
        assert_eq!(
            p.delay(1, Some(Duration::from_secs(2))),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn reads_retry_after() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert(RETRY_AFTER, HeaderValue::from_static("3"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(3)));
        h.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT"),
        );
        assert_eq!(
            retry_after(&h),
            Some(Duration::ZERO),
            "a past date means now"
        );
        assert_eq!(
            parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(UNIX_EPOCH + Duration::from_secs(784_111_777))
        );
        assert_eq!(
            parse_http_date("Tue, 29 Feb 2000 00:00:00 GMT"),
            Some(UNIX_EPOCH + Duration::from_secs(951_782_400))
        );
        assert_eq!(parse_http_date("yesterday"), None);
        assert_eq!(parse_http_date("Sun, 06 Nov 1994 08:49:37 PST"), None);
    }
}
