//! `idem lock`: leases with fencing tokens from the command line, for runbooks (the
//! manual unlock of the seed's "no expiry" failure) and scripts.
//!
//! Direct database access is the admin credential here: `force-release` needs a reason,
//! which is recorded with the event.

use std::time::Duration;

use idem_core::{
    Acquire, FencingToken, Lease, LeaseError, LeaseName, LeaseStatus, LeaseStore, OwnerId, Release,
    Renew,
};
use serde::Serialize;

use crate::keys::rfc3339;

/// Parses `500ms`, `3s`, `2m`, `1h` (a bare number is seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    parse_any_duration(s)
}

/// A duration that must not be zero (leases, timeouts that would expire at once).
pub fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    match parse_any_duration(s)? {
        d if d.is_zero() => Err(format!("{s:?}: must be more than zero")),
        d => Ok(d),
    }
}

fn parse_any_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: expected e.g. 500ms, 3s, 2m"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("invalid duration unit in {s:?}: use ms, s, m or h")),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| format!("invalid duration {s:?}"))
}

#[derive(Serialize)]
pub struct LeaseView {
    pub name: String,
    pub owner: String,
    pub token: i64,
    pub acquired_at: String,
    pub expires_at: String,
    pub renewals: u32,
}

pub fn view(l: &Lease) -> LeaseView {
    LeaseView {
        name: l.name.to_string(),
        owner: l.owner.to_string(),
        token: l.token.get(),
        acquired_at: rfc3339(l.acquired_at),
        expires_at: rfc3339(l.expires_at),
        renewals: l.renewals,
    }
}

/// What a lock command printed and whether it succeeded.
pub struct Outcome {
    pub ok: bool,
    pub json: serde_json::Value,
    pub text: String,
}

fn holder_text(l: Option<&Lease>) -> String {
    match l {
        Some(l) => format!(
            "held by {} with token {} until {}",
            l.owner,
            l.token.get(),
            rfc3339(l.expires_at)
        ),
        None => "not held by anyone".into(),
    }
}

pub async fn acquire(
    store: &dyn LeaseStore,
    name: &LeaseName,
    owner: &OwnerId,
    ttl: Duration,
    wait: Duration,
) -> Result<Outcome, LeaseError> {
    let got = if wait.is_zero() {
        store.try_acquire(name, owner, ttl).await?
    } else {
        idem_lease::acquire_wait(store, name, owner, ttl, wait).await?
    };
    Ok(match got {
        Acquire::Granted(l) => Outcome {
            ok: true,
            text: format!(
                "acquired {} for {} with token {} until {}",
                l.name,
                l.owner,
                l.token.get(),
                rfc3339(l.expires_at)
            ),
            json: serde_json::to_value(view(&l)).expect("view"),
        },
        Acquire::Held { holder, .. } => Outcome {
            ok: false,
            text: format!("not acquired: {name} is {}", holder_text(Some(&holder))),
            json: serde_json::json!({"name": name.to_string(), "acquired": false, "holder": view(&holder)}),
        },
    })
}

pub async fn renew(
    store: &dyn LeaseStore,
    name: &LeaseName,
    owner: &OwnerId,
    token: FencingToken,
    ttl: Duration,
) -> Result<Outcome, LeaseError> {
    Ok(match store.renew(name, owner, token, ttl).await? {
        Renew::Renewed(l) => Outcome {
            ok: true,
            text: format!("renewed {} until {}", l.name, rfc3339(l.expires_at)),
            json: serde_json::to_value(view(&l)).expect("view"),
        },
        Renew::NotHolder { current } => Outcome {
            ok: false,
            text: format!(
                "not the holder: {owner} with token {} does not hold {name}; it is {}",
                token.get(),
                holder_text(current.as_ref())
            ),
            json: serde_json::json!({"name": name.to_string(), "renewed": false, "not_holder": true,
                "current": current.as_ref().map(view)}),
        },
    })
}

pub async fn release(
    store: &dyn LeaseStore,
    name: &LeaseName,
    owner: &OwnerId,
    token: FencingToken,
) -> Result<Outcome, LeaseError> {
    Ok(match store.release(name, owner, token).await? {
        Release::Released { lease, released_at } => Outcome {
            ok: true,
            text: format!("released {} (token {})", lease.name, lease.token.get()),
            json: serde_json::json!({"name": lease.name.to_string(), "released": true,
                "token": lease.token.get(), "released_at": rfc3339(released_at)}),
        },
        Release::NotHolder { current } => Outcome {
            ok: false,
            text: format!(
                "not the holder: {owner} with token {} does not hold {name}; it is {}. \
                 Nothing was changed; the attempt is recorded as an owner-mismatch release.",
                token.get(),
                holder_text(current.as_ref())
            ),
            json: serde_json::json!({"name": name.to_string(), "released": false, "not_holder": true,
                "current": current.as_ref().map(view)}),
        },
    })
}

pub async fn force_release(
    store: &dyn LeaseStore,
    name: &LeaseName,
    reason: &str,
) -> Result<Outcome, LeaseError> {
    let was = store.force_release(name, reason).await?;
    Ok(Outcome {
        ok: true,
        text: match &was {
            Some(l) => format!(
                "force-released {name} from {} (token {}); reason recorded",
                l.owner,
                l.token.get()
            ),
            None => format!("{name} was not held; the request is recorded"),
        },
        json: serde_json::json!({"name": name.to_string(), "force_released": was.is_some(),
            "previous": was.as_ref().map(view), "reason": reason}),
    })
}

pub async fn show(store: &dyn LeaseStore, name: &LeaseName) -> Result<Outcome, LeaseError> {
    let LeaseStatus {
        holder,
        last_token,
        now,
        ..
    } = store.show(name).await?;
    let events = store.events(name, 20).await?;
    let events_json: Vec<_> = events
        .iter()
        .map(|e| {
            serde_json::json!({"kind": format!("{:?}", e.kind), "at": rfc3339(e.at),
                "owner": e.owner.as_ref().map(ToString::to_string),
                "token": e.token.map(|t| t.get()), "detail": e.detail})
        })
        .collect();
    let mut text = format!(
        "{name}: {}\nlast token issued: {}\nstore time: {}\nrecent events:",
        holder_text(holder.as_ref()),
        last_token.map_or("none".into(), |t| t.get().to_string()),
        rfc3339(now)
    );
    for e in &events {
        text.push_str(&format!(
            "\n  {} {:?} owner={} token={} {}",
            rfc3339(e.at),
            e.kind,
            e.owner.as_ref().map_or("-".into(), ToString::to_string),
            e.token.map_or("-".into(), |t| t.get().to_string()),
            e.detail.clone().unwrap_or_default()
        ));
    }
    Ok(Outcome {
        ok: true,
        text,
        json: serde_json::json!({"name": name.to_string(), "holder": holder.as_ref().map(view),
            "last_token": last_token.map(|t| t.get()), "now": rfc3339(now), "events": events_json}),
    })
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations() {
        let check = |s: &str, ms: Option<u64>| {
            assert_eq!(
                parse_duration(s).ok().map(|d| d.as_millis() as u64),
                ms,
                "{s}"
            )
        };
        check("3s", Some(3000));
        check("500ms", Some(500));
        check("2m", Some(120_000));
        check("1.5s", Some(1500));
        check("4", Some(4000));
        check("3x", None);
        check("", None);
        check("-1s", None);
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
    }
}
