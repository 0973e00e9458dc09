//! Leases: every lease with its holder and alarms, and one lease's evidence with each
//! hold measured against the lease (the 70 % line).

use axum::extract::{Path, State};
use axum::response::Response;
use idem_core::{LeaseEvent, LeaseEventKind, LeaseName};
use maud::{html, Markup};
use serde::Deserialize;

use super::shown;
use crate::access::{bad_request, Operator, Params};
use crate::error::ConsoleError;
use crate::view::{self, alert_class, q, seg, table, time, Bar};
use crate::Console;

/// Lease holds at or above this fraction of the lease are marked.
const HOLD_WARN: f64 = 0.7;
const LEASES_PAGE: usize = 100;

#[derive(Deserialize, Default)]
pub(crate) struct LeasesQuery {
    #[serde(default)]
    after: String,
}

/// Event kinds an operator should look at.
fn is_alarming(kind: LeaseEventKind) -> bool {
    matches!(
        kind,
        LeaseEventKind::ReleaseOwnerMismatch
            | LeaseEventKind::FencedWriteRejected
            | LeaseEventKind::RenewRejected
            | LeaseEventKind::Expired
            | LeaseEventKind::ForceReleased
    )
}

pub(crate) async fn list(
    State(console): State<Console>,
    op: Operator,
    Params(query): Params<LeasesQuery>,
) -> Response {
    shown(&op, "Leases", "Leases", list_body(&console, &query).await)
}

async fn list_body(console: &Console, query: &LeasesQuery) -> Result<Markup, ConsoleError> {
    let leases = console.leases();
    let after = match query.after.trim() {
        "" => None,
        a => Some(LeaseName::new(a).map_err(|e| ConsoleError::backend(e.to_string()))?),
    };
    let names = leases.names(after.as_ref(), LEASES_PAGE).await?;
    let mut rows = Vec::new();
    for name in &names {
        let status = leases.show(name).await?;
        let events = leases.events(name, 50).await?;
        let alarms = events.iter().filter(|e| is_alarming(e.kind)).count();
        let (holder, token, left, renewals) = match &status.holder {
            Some(l) => (
                l.owner.to_string(),
                l.token.get().to_string(),
                format!("{:.1} s", (l.expires_at - status.now) as f64 / 1000.0),
                l.renewals.to_string(),
            ),
            None => (
                "free".into(),
                status
                    .last_token
                    .map(|t| format!("last {}", t.get()))
                    .unwrap_or_default(),
                "—".into(),
                "—".into(),
            ),
        };
        rows.push(html! {
            tr class=[alert_class(alarms > 0)] {
                td { a href=(format!("/console/leases/{}", seg(name.as_str()))) { (name.as_str()) } }
                td { (holder) } td { (token) } td { (left) } td { (renewals) } td { (alarms) }
            }
        });
    }
    let head = [
        "name",
        "holder",
        "token",
        "time left",
        "renewals",
        "alarms (last 50 events)",
    ];
    let next = (names.len() == LEASES_PAGE).then(|| names.last()).flatten();
    Ok(html! {
        h1 { "Leases" }
        p class="muted" {
            "Times by the store's clock. Rows with owner-mismatch releases, fenced rejections, \
             rejected renewals, expiries or force-releases among their last 50 events are marked."
        }
        (table(Some("leases"), "", &head, &rows))
        @if let Some(last) = next {
            p { a href=(format!("/console/leases?after={}", q(last.as_str()))) { "Next names" } }
        }
    })
}

pub(crate) async fn one(
    State(console): State<Console>,
    op: Operator,
    Path(name): Path<String>,
) -> Response {
    let Ok(name) = LeaseName::new(name) else {
        return bad_request(&op, "That is not a lease name.");
    };
    let title = format!("Lease {name}");
    shown(&op, &title, "Leases", one_body(&console, &name).await)
}

/// One hold of a lease, from its grant to its end (or now).
struct Hold {
    token: i64,
    /// The lease's length, from the grant.
    ttl_ms: i64,
    /// The last grant or renewal, and the deadline it set.
    mark: i64,
    deadline: i64,
    /// The longest stretch from a grant or renewal to the next renewal or the end: what
    /// must stay well inside the lease.
    longest_ms: i64,
    end: Option<&'static str>,
}

impl Hold {
    fn stretch(&mut self, until: i64) {
        self.longest_ms = self.longest_ms.max(until - self.mark);
    }
}

/// The holds in `events` (oldest first), measured up to `now` for one still open.
fn holds(events: &[LeaseEvent], now: i64) -> Vec<Hold> {
    let mut out: Vec<Hold> = Vec::new();
    for e in events {
        let token = e.token.map(|t| t.get());
        let open = out.last_mut().filter(|h| h.end.is_none());
        match e.kind {
            LeaseEventKind::Acquired => {
                // A grant ends a hold nobody released: it ran out.
                if let Some(h) = open {
                    let until = h.deadline.min(e.at);
                    h.stretch(until);
                    h.end = Some("expired");
                }
                if let (Some(token), Some(a), Some(x)) = (token, e.acquired_at, e.expires_at) {
                    out.push(Hold {
                        token,
                        ttl_ms: (x - a).max(1),
                        mark: a,
                        deadline: x,
                        longest_ms: 0,
                        end: None,
                    });
                }
            }
            LeaseEventKind::Renewed => {
                if let Some(h) = open.filter(|h| Some(h.token) == token) {
                    h.stretch(e.at);
                    h.mark = e.at;
                    h.deadline = e.expires_at.unwrap_or(h.deadline);
                }
            }
            LeaseEventKind::Released | LeaseEventKind::Expired | LeaseEventKind::ForceReleased => {
                if let Some(h) = open.filter(|h| token.is_none() || Some(h.token) == token) {
                    let until = match e.kind {
                        LeaseEventKind::Expired => h.deadline,
                        _ => e.at.min(h.deadline),
                    };
                    h.stretch(until);
                    h.end = Some(e.kind.as_str());
                }
            }
            _ => {}
        }
    }
    if let Some(h) = out.last_mut().filter(|h| h.end.is_none()) {
        h.stretch(now.min(h.deadline));
        if now >= h.deadline {
            h.end = Some("expired");
        }
    }
    out
}

fn hold_chart(hs: &[Hold]) -> Markup {
    let bars: Vec<Bar> = hs
        .iter()
        .map(|x| {
            let value = x.longest_ms as f64 / x.ttl_ms as f64;
            let end = x.end.unwrap_or("held now");
            Bar {
                label: format!("token {} ({end})", x.token),
                value,
                alert: value >= HOLD_WARN || matches!(end, "expired" | "force_released"),
            }
        })
        .collect();
    html! {
        h2 { "Hold time against the lease" }
        (view::bar_chart(
            "Each hold's longest stretch between its grant, renewals and release, as a share of \
             its lease; at or past the 70 % line, or ended by expiry or force, in red",
            HOLD_WARN,
            "70 % of the lease",
            &bars,
        ))
    }
}

async fn one_body(console: &Console, name: &LeaseName) -> Result<Markup, ConsoleError> {
    let leases = console.leases();
    let status = leases.show(name).await?;
    let events = leases.events(name, 500).await?;
    let hs = holds(&events, status.now);
    let rows: Vec<Markup> = events
        .iter()
        .rev()
        .map(|e| {
            html! {
                tr class=[alert_class(is_alarming(e.kind))] {
                    td { (time(e.at)) }
                    td { (e.kind.as_str()) }
                    td { (e.owner.as_ref().map(|o| o.as_str()).unwrap_or("—")) }
                    td { (e.token.map(|t| t.get().to_string()).unwrap_or_default()) }
                    td { (e.expires_at.map(time).unwrap_or_default()) }
                    td { (e.detail.as_deref().unwrap_or("")) }
                }
            }
        })
        .collect();
    Ok(html! {
        h1 { "Lease " code { (name.as_str()) } }
        dl class="facts" {
            @match &status.holder {
                Some(l) => {
                    dt { "holder" } dd id="lease-holder" { (l.owner.as_str()) }
                    dt { "token" } dd { (l.token.get()) }
                    dt { "acquired" } dd { (time(l.acquired_at)) }
                    dt { "time left" } dd { (format!("{:.1} s", (l.expires_at - status.now) as f64 / 1000.0)) }
                    dt { "renewals" } dd { (l.renewals) }
                }
                None => { dt { "holder" } dd id="lease-holder" { "free" } }
            }
            dt { "last token" }
            dd { (status.last_token.map(|t| t.get().to_string()).unwrap_or("—".into())) }
        }
        @if !hs.is_empty() { (hold_chart(&hs)) }
        h2 { "Evidence (newest first)" }
        (table(Some("lease-events"), "", &["at", "event", "owner", "token", "lease until", "detail"], &rows))
    })
}
