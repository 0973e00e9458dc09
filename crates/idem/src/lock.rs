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

use crate::cli::{parse_duration, passed, print_json, rfc3339, CliError, CliResult};

// `idem lock …`; a plain comment, so clap takes the about from the variant.
#[derive(clap::Args)]
pub struct LockArgs {
    #[command(subcommand)]
    command: LockCommand,
}

#[derive(clap::Subcommand)]
enum LockCommand {
    /// Acquire NAME for OWNER; non-zero exit when not acquired.
    Acquire {
        /// The lease name.
        name: String,
        /// The holder's owner id.
        #[arg(long)]
        owner: String,
        /// Lease length: 500ms, 3s, 2m …
        #[arg(long, value_parser = parse_duration)]
        ttl: Duration,
        /// Wait up to this long for the holder to go away.
        #[arg(long, value_parser = parse_duration, default_value = "0s")]
        wait: Duration,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
    /// Renew a lease you hold (owner and token must match).
    Renew {
        /// The lease name.
        name: String,
        /// The holder's owner id.
        #[arg(long)]
        owner: String,
        /// The fencing token the holder was granted.
        #[arg(long)]
        token: i64,
        /// How long the lease lasts from now, e.g. 3s.
        #[arg(long, value_parser = parse_duration)]
        ttl: Duration,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
    /// Release a lease you hold; non-zero exit when you are not the holder.
    Release {
        /// The lease name.
        name: String,
        /// The holder's owner id.
        #[arg(long)]
        owner: String,
        /// The fencing token the holder was granted.
        #[arg(long)]
        token: i64,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
    /// Holder, token, times, renewals and recent events.
    Show {
        /// The lease name.
        name: String,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
    /// Admin: release whoever holds NAME; the reason is recorded.
    ForceRelease {
        /// The lease name.
        name: String,
        /// Why, in words; recorded with the change.
        #[arg(long)]
        reason: String,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(url: &str, args: LockArgs) -> CliResult {
    let store = crate::open::open_lease_store(url).await?;
    let store = store.as_ref();
    let invalid = |e: idem_core::KeyError| CliError::invalid(e.to_string());
    let holder = |name: String, owner: String| -> Result<(LeaseName, OwnerId), CliError> {
        Ok((
            LeaseName::new(name).map_err(invalid)?,
            OwnerId::new(owner).map_err(invalid)?,
        ))
    };
    let (outcome, json) = match args.command {
        LockCommand::Acquire {
            name,
            owner,
            ttl,
            wait,
            json,
        } => {
            let (name, owner) = holder(name, owner)?;
            (acquire(store, &name, &owner, ttl, wait).await, json)
        }
        LockCommand::Renew {
            name,
            owner,
            token,
            ttl,
            json,
        } => {
            let (name, owner) = holder(name, owner)?;
            (
                renew(store, &name, &owner, FencingToken::new(token), ttl).await,
                json,
            )
        }
        LockCommand::Release {
            name,
            owner,
            token,
            json,
        } => {
            let (name, owner) = holder(name, owner)?;
            (
                release(store, &name, &owner, FencingToken::new(token)).await,
                json,
            )
        }
        LockCommand::Show { name, json } => {
            let name = LeaseName::new(name).map_err(invalid)?;
            (show(store, &name).await, json)
        }
        LockCommand::ForceRelease { name, reason, json } => {
            let name = LeaseName::new(name).map_err(invalid)?;
            (force_release(store, &name, &reason).await, json)
        }
    };
    let outcome = outcome.map_err(|e| CliError::backend(e.to_string()))?;
    if json {
        print_json(&outcome.json);
    } else if outcome.ok {
        println!("{}", outcome.text);
    } else {
        eprintln!("{}", outcome.text);
    }
    Ok(passed(outcome.ok))
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
