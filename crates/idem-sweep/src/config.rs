//! The retention policy and replay sources from the environment, validated at start-up.
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `IDEM_RETENTION_RETRY` | `24h` | full responses kept (retry tier) |
//! | `IDEM_RETENTION_REPLAY` | `7d` | online replay window (the hot window) |
//! | `IDEM_RETENTION_DISPUTE` | `90d` | audit fields kept online, then archived |
//! | `IDEM_RETENTION_ARCHIVE` | unset (forever) | archive rows kept after archiving |
//! | `IDEM_RETENTION_STALE_GRACE` | `0s` | extra time past a lease before the stale scan acts |
//! | `IDEM_RETENTION_LEASE_EVENTS` | the dispute window | lease events kept, at least the dispute window (`forever`: never trimmed) |
//! | `IDEM_REPLAY_CLIENT_RETRY` | `2m` | callers' longest retry |
//! | `IDEM_REPLAY_QUEUE_RETENTION` | `24h` | message retention of the transport |
//! | `IDEM_REPLAY_DEAD_LETTER` | `7d` | latest dead-letter replay / compensation run |
//!
//! Durations: a number with `ms`, `s`, `m`, `h` or `d`.

use std::time::Duration;

use idem_core::{ReplaySources, RetentionPolicy};

/// A duration such as `500ms`, `30s`, `2m`, `24h`, `7d`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?}: add a unit (ms, s, m, h, d)"))?;
    let (n, unit) = text.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{text:?}: expected a number then a unit"))?;
    let secs = match unit {
        "ms" => return Ok(Duration::from_millis(n)),
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{text:?}: unknown unit {unit:?} (ms, s, m, h, d)")),
    };
    Ok(Duration::from_secs(n.saturating_mul(secs)))
}

fn var(
    lookup: &dyn Fn(&str) -> Option<String>,
    name: &str,
    default: Duration,
) -> Result<Duration, String> {
    match lookup(name) {
        Some(v) => parse_duration(&v).map_err(|e| format!("{name}: {e}")),
        None => Ok(default),
    }
}

/// Reads the policy and replay sources through `lookup` (the environment in
/// production), and validates them: an invalid policy is an error naming the window
/// and the replay source.
pub fn from_lookup(
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(RetentionPolicy, ReplaySources), String> {
    let d = RetentionPolicy::default();
    let s = ReplaySources::default();
    let policy = RetentionPolicy {
        retry_window: var(lookup, "IDEM_RETENTION_RETRY", d.retry_window)?,
        replay_window: var(lookup, "IDEM_RETENTION_REPLAY", d.replay_window)?,
        dispute_window: var(lookup, "IDEM_RETENTION_DISPUTE", d.dispute_window)?,
        archive_window: match lookup("IDEM_RETENTION_ARCHIVE") {
            Some(v) => {
                Some(parse_duration(&v).map_err(|e| format!("IDEM_RETENTION_ARCHIVE: {e}"))?)
            }
            None => None,
        },
        stale_grace: var(lookup, "IDEM_RETENTION_STALE_GRACE", d.stale_grace)?,
        lease_event_window: match lookup("IDEM_RETENTION_LEASE_EVENTS").as_deref() {
            Some("forever") => None,
            Some(v) => Some(
                parse_duration(v)
                    .map_err(|e| format!("IDEM_RETENTION_LEASE_EVENTS: {e} (or `forever`)"))?,
            ),
            // Unset: as long as the records' audit fields (the dispute window).
            None => Some(var(lookup, "IDEM_RETENTION_DISPUTE", d.dispute_window)?),
        },
    };
    let sources = ReplaySources {
        client_retry: var(lookup, "IDEM_REPLAY_CLIENT_RETRY", s.client_retry)?,
        queue_retention: var(lookup, "IDEM_REPLAY_QUEUE_RETENTION", s.queue_retention)?,
        dead_letter_replay: var(lookup, "IDEM_REPLAY_DEAD_LETTER", s.dead_letter_replay)?,
    };
    policy
        .validate(&sources)
        .map_err(|e| format!("retention policy rejected: {e}"))?;
    Ok((policy, sources))
}

/// [`from_lookup`] over the process environment.
pub fn from_env() -> Result<(RetentionPolicy, ReplaySources), String> {
    from_lookup(&|name| std::env::var(name).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert!(parse_duration("7").is_err());
        assert!(parse_duration("7w").is_err());
    }

    #[test]
    fn start_up_rejects_a_hot_window_shorter_than_dead_letter_replay() {
        let env = |name: &str| match name {
            "IDEM_RETENTION_REPLAY" => Some("3d".to_string()),
            _ => None,
        };
        let err = from_lookup(&env).unwrap_err();
        assert!(err.contains("replay_window"), "{err}");
        assert!(err.contains("dead-letter replay"), "{err}");
        let ok = from_lookup(&|_: &str| None).unwrap();
        assert_eq!(ok.0, RetentionPolicy::default());
    }

    #[test]
    fn lease_event_window_from_the_environment() {
        let with = |v: &'static str| {
            move |name: &str| (name == "IDEM_RETENTION_LEASE_EVENTS").then(|| v.to_string())
        };
        let default = from_lookup(&|_: &str| None).unwrap().0;
        assert_eq!(
            default.lease_event_window,
            Some(Duration::from_secs(90 * 86_400))
        );
        let policy = from_lookup(&with("120d")).unwrap().0;
        assert_eq!(
            policy.lease_event_window,
            Some(Duration::from_secs(120 * 86_400))
        );
        assert_eq!(
            from_lookup(&with("forever")).unwrap().0.lease_event_window,
            None
        );
        let zero = from_lookup(&with("0d")).unwrap_err();
        assert!(zero.contains("lease_event_window"), "{zero}");
        let short = from_lookup(&with("30d")).unwrap_err();
        assert!(short.contains("dispute_window"), "{short}");
        let longer_dispute = |name: &str| match name {
            "IDEM_RETENTION_DISPUTE" => Some("365d".to_string()),
            _ => None,
        };
        assert_eq!(
            from_lookup(&longer_dispute).unwrap().0.lease_event_window,
            Some(Duration::from_secs(365 * 86_400)),
            "unset follows the dispute window"
        );
        let bad = from_lookup(&with("soon")).unwrap_err();
        assert!(bad.contains("IDEM_RETENTION_LEASE_EVENTS"), "{bad}");
    }
}
