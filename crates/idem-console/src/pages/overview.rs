//! The overview: decisions per second (when the host runs the layer), records by state,
//! PROCESSING records past their lease, the sweeper's last evidence, and the host's
//! section.

use axum::extract::State;
use axum::response::Response;
use idem_core::LeaseName;
use idem_http::metrics::Decision;
use maud::{html, Markup};

use super::shown;
use crate::access::Operator;
use crate::error::ConsoleError;
use crate::rates::Rates;
use crate::view::{self, key_href, seg, table, time, Series};
use crate::Console;

/// PROCESSING records past their lease listed on the overview.
const STALE_SHOWN: usize = 20;

/// Whether a decision counts in the duplicate-conflict rate's denominator: everything
/// but the refusals before a key is read (as the alert rule in `idem_http::metrics`).
fn keyed(d: Decision) -> bool {
    !matches!(
        d,
        Decision::MissingKey
            | Decision::InvalidKey
            | Decision::Unauthenticated
            | Decision::TooLarge
    )
}

fn index_of(d: Decision) -> usize {
    Decision::ALL.iter().position(|x| *x == d).unwrap_or(0)
}

const SHOWN: [Decision; 4] = [
    Decision::Executed,
    Decision::Replayed,
    Decision::InProgress,
    Decision::Mismatch,
];

pub(crate) async fn page(State(console): State<Console>, op: Operator) -> Response {
    shown(&op, "Overview", "Overview", body(&console).await)
}

fn rates_section(rates: &Rates) -> Markup {
    // Rates over the last minute (or since the server started).
    let history = rates.history();
    let now = rates.read();
    let base = history
        .iter()
        .find(|s| now.at.duration_since(s.at).as_secs() <= 60)
        .cloned()
        .filter(|b| now.at > b.at);
    let cards = base.map(|b| {
        let secs = now.at.duration_since(b.at).as_secs_f64();
        let rate = |d: Decision| (now.counts[index_of(d)] - b.counts[index_of(d)]) as f64 / secs;
        let keyed_rate: f64 = Decision::ALL.iter().filter(|d| keyed(**d)).map(|d| rate(*d)).sum();
        let conflicts = rate(Decision::Replayed) + rate(Decision::InProgress) + rate(Decision::Mismatch);
        let refused: f64 = Decision::ALL
            .iter()
            .filter(|d| !SHOWN.contains(d) && **d != Decision::Bypassed)
            .map(|d| rate(*d))
            .sum();
        let bypassed = rate(Decision::Bypassed);
        let conflict_rate = if keyed_rate > 0.0 {
            format!("{:.1} %", conflicts / keyed_rate * 100.0)
        } else {
            "—".into()
        };
        html! {
            p class="muted" { "Over the last " (format!("{secs:.0}")) " s." }
            div class="cards" {
                @for d in SHOWN {
                    div class="card" { div { (d.as_str()) } div class="n" { (format!("{:.2}", rate(d))) } }
                }
                div class="card" {
                    div { "refused (key, auth, size, store)" }
                    div class="n" { (format!("{refused:.2}")) }
                }
                div class=(if bypassed > 0.0 { "card bad" } else { "card" }) {
                    div { "bypassed (store down, fail-open routes)" }
                    div class="n" { (format!("{bypassed:.2}")) }
                }
                div class="card" id="conflict-rate" {
                    div { "duplicate-conflict rate" }
                    div class="n" { (conflict_rate) }
                }
            }
        }
    });
    let chart = (history.len() >= 2).then(|| {
        let t0 = history[0].at;
        let series: Vec<Series<'_>> = SHOWN
            .into_iter()
            .map(|d| Series {
                label: d.as_str(),
                class: d.as_str(),
                points: history
                    .windows(2)
                    .map(|w| {
                        let dt = w[1].at.duration_since(w[0].at).as_secs_f64().max(0.001);
                        let i = index_of(d);
                        (
                            w[1].at.duration_since(t0).as_secs_f64(),
                            (w[1].counts[i] - w[0].counts[i]) as f64 / dt,
                        )
                    })
                    .collect(),
            })
            .collect();
        view::line_chart(
            "Decisions per second over the last minutes",
            "seconds since the first sample",
            "per second",
            &series,
        )
    });
    html! {
        h2 { "Decisions per second" }
        @match cards {
            Some(c) => (c),
            None => p class="muted" { "The first rates appear a few seconds after the server started." },
        }
        @if let Some(c) = chart { (c) }
    }
}

async fn body(console: &Console) -> Result<Markup, ConsoleError> {
    let inspect = console.inspect();
    let rates = match console.rates() {
        Some(r) => rates_section(r),
        None => html! {
            h2 { "Decisions per second" }
            p class="muted" {
                "Decision rates are counted by a server running the layer (" code { "idem serve" }
                "); this console reads the store only."
            }
        },
    };
    let counts = inspect.counts_by_state().await?;
    // PROCESSING records past their lease, by the store clock.
    let store_now = inspect.now().await?;
    let stale = inspect
        .processing_past_lease(store_now, STALE_SHOWN)
        .await?;
    let stale_rows: Vec<Markup> = stale
        .first
        .iter()
        .map(|r| {
            html! {
                tr {
                    td { (r.tenant) }
                    td { a href=(key_href(&r.tenant, &r.key)) { (r.key) } }
                    td { (r.lease_expires_at.map(time).unwrap_or_default()) }
                    td { (r.attempts) }
                }
            }
        })
        .collect();
    let sweeper = sweeper_section(console).await?;
    let host = match console.extension() {
        Some(ext) => ext.overview_section(console).await?,
        None => None,
    };
    let dropped = console.timeline().map_or(0, |t| t.dropped());
    Ok(html! {
        h1 { "Overview" }
        (rates)
        h2 { "Records by state" }
        dl class="facts" id="state-counts" {
            @for (state, n) in &counts {
                dt { (state.as_str().to_lowercase()) }
                dd data-state=(state.as_str()) { (n) }
            }
        }
        h2 { "PROCESSING past its lease" }
        p id="stale-count" class=(if stale.count > 0 { "bad" } else { "ok" }) {
            (stale.count) " record(s)"
        }
        @if !stale_rows.is_empty() {
            (table(None, "", &["tenant", "key", "lease ended", "attempts"], &stale_rows))
        }
        (sweeper)
        @if let Some(h) = host { (h) }
        @if dropped > 0 {
            p class="note" { (dropped) " arrival(s) were not recorded in the timeline (its buffer was full)." }
        }
    })
}

/// The sweeper: its lease's last evidence.
async fn sweeper_section(console: &Console) -> Result<Markup, ConsoleError> {
    let name =
        LeaseName::new(idem_sweep::LEASE_NAME).map_err(|e| ConsoleError::backend(e.to_string()))?;
    let events = console.leases().events(&name, 1).await?;
    let status = console.leases().show(&name).await?;
    let lease_href = format!("/console/leases/{}", seg(name.as_str()));
    Ok(html! {
        h2 { "Sweeper" }
        @match (events.last(), &status.holder) {
            (_, Some(holder)) => p id="sweeper" {
                "Running now: " (holder.owner.as_str()) " since " (time(holder.acquired_at))
                " (" a href=(lease_href) { "lease" } ")."
            },
            (Some(last), None) => p id="sweeper" {
                "Last run: " (last.kind.as_str()) " at " (time(last.at))
                " (" a href=(lease_href) { "lease" } ")."
            },
            (None, None) => p id="sweeper" class="muted" {
                "No sweep has run on this database (" code { "idem sweep" } ")."
            },
        }
    })
}
