//! The key inspector: a key's record (or its archive entry), its stored response, the
//! host's section (an order it made), and its arrival timeline.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use idem_core::retention::dropped_response;
use idem_core::{ArchivedRecord, ArrivalDecision, IdempotencyKey, Record, Scope, TenantId};
use maud::{html, Markup};

use crate::access::{bad_request, failed, html_response, Operator};
use crate::error::ConsoleError;
use crate::timeline::KeyArrivals;
use crate::view::{self, row, table, time, Series};
use crate::Console;

/// Stored bodies shown up to this many bytes.
const BODY_SHOWN: usize = 64 * 1024;

pub(crate) async fn page(
    State(console): State<Console>,
    op: Operator,
    Path((tenant, key)): Path<(String, String)>,
) -> Response {
    let (Ok(tenant_id), Ok(key_id)) = (
        TenantId::new(tenant.clone()),
        IdempotencyKey::new(key.clone()),
    ) else {
        return bad_request(
            &op,
            "That is not a tenant and an idempotency key (1–255 visible ASCII).",
        );
    };
    match body(&console, &tenant_id, &key_id).await {
        Ok((status, body)) => html_response(status, op.page(&format!("Key {key}"), "Search", body)),
        Err(e) => failed(&e),
    }
}

async fn body(
    console: &Console,
    tenant: &TenantId,
    key: &IdempotencyKey,
) -> Result<(StatusCode, Markup), ConsoleError> {
    let scope = Scope::new(tenant.clone(), key.clone());
    let record = console.records().get(&scope).await?;
    let arrivals = match console.timeline() {
        Some(t) => t.key_arrivals(tenant.as_str(), key.as_str()).await?,
        None => None,
    };
    let host = match console.extension() {
        Some(ext) => {
            ext.key_section(console, tenant, key, record.as_ref())
                .await?
        }
        None => None,
    };
    let archived = match &record {
        Some(_) => None,
        None => console.archive().archived(tenant, key).await?,
    };
    let status = if record.is_none() && archived.is_none() && arrivals.is_none() {
        StatusCode::NOT_FOUND
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        html! {
            h1 { "Key " code { (key.as_str()) } }
            p { "Tenant " code { (tenant.as_str()) } }
            @if let Some(h) = host { (h) }
            @match (&record, &archived) {
                (Some(r), _) => (record_section(r)),
                (None, Some(a)) => (archive_section(a)),
                (None, None) => p class="note" id="record-state" {
                    "No record for this key (never claimed, or past every retention window)."
                },
            }
            (timeline_section(arrivals.as_ref()))
        },
    ))
}

fn archive_section(a: &ArchivedRecord) -> Markup {
    html! {
        h2 { "Archived" }
        p class="note" {
            "Out of the online index: this key is not replayed; the stored response is gone \
             and only this evidence is kept."
        }
        dl class="facts" {
            dt { "state" } dd id="record-state" { (a.state.to_string().to_lowercase()) }
            dt { "status" } dd { (a.status.map(|s| s.to_string()).unwrap_or_default()) }
            dt { "fingerprint" } dd { code { (a.fingerprint.to_hex()) } }
            dt { "result reference" } dd { (a.result_ref.as_deref().unwrap_or("—")) }
            dt { "first processed" } dd { (time(a.first_processed_at)) }
            dt { "completed" } dd { (a.completed_at.map(time).unwrap_or_default()) }
            dt { "archived" } dd { (time(a.archived_at)) }
            dt { "key digest" } dd { code { (hex::encode(a.key_digest)) } }
        }
    }
}

fn record_section(r: &Record) -> Markup {
    let tier = r
        .result
        .as_ref()
        .and_then(dropped_response)
        .map(|tier| format!("{} (response dropped; replays are rebuilt)", tier.as_str()))
        .unwrap_or_else(|| match &r.result {
            Some(_) => "replay (response kept)".into(),
            None => "— (no stored result yet)".into(),
        });
    let dash = || "—".to_owned();
    let facts: [(&str, String); 12] = [
        ("version", r.version.to_string()),
        ("attempts", r.attempts.to_string()),
        ("fingerprint", r.fingerprint.to_hex()),
        ("principal", r.principal.to_string()),
        (
            "owner",
            r.owner.as_ref().map_or_else(dash, ToString::to_string),
        ),
        ("lease deadline", r.lease_expires_at.map_or_else(dash, time)),
        ("tier", tier),
        ("created", time(r.created_at)),
        ("updated", time(r.updated_at)),
        ("completed", r.completed_at.map_or_else(dash, time)),
        (
            "result reference",
            r.result
                .as_ref()
                .and_then(|x| x.result_ref.clone())
                .unwrap_or_else(dash),
        ),
        (
            "stored response",
            r.result.as_ref().map_or_else(dash, |x| {
                format!("status {}, {} bytes", x.status, x.body.len())
            }),
        ),
    ];
    let stored = r.result.as_ref().map(|res| {
        let shown = &res.body[..res.body.len().min(BODY_SHOWN)];
        let text = match serde_json::from_slice::<serde_json::Value>(&res.body) {
            Ok(v) => serde_json::to_string_pretty(&v).unwrap_or_default(),
            Err(_) => match std::str::from_utf8(shown) {
                Ok(s) => s.to_owned(),
                Err(_) => format!("({} bytes, not text)", res.body.len()),
            },
        };
        let text: String = text.chars().take(BODY_SHOWN).collect();
        let headers: Vec<Markup> = res.headers.iter().map(|(n, v)| row(&[n, v])).collect();
        html! {
            h3 { "Stored response" }
            (table(None, "", &["header", "value"], &headers))
            pre id="stored-body" { code { (text) } }
        }
    });
    html! {
        h2 { "Record" }
        dl class="facts" {
            dt { "state" } dd id="record-state" { (r.state.to_string().to_lowercase()) }
            @for (k, v) in facts { dt { (k) } dd { (v) } }
        }
        @if let Some(s) = stored { (s) }
    }
}

fn timeline_chart(a: &KeyArrivals) -> Markup {
    let series: Vec<Series<'_>> = ArrivalDecision::ALL
        .into_iter()
        .filter(|d| a.count(*d) > 0)
        .map(|d| {
            let mut n = 0.0;
            let mut points = vec![(0.0, 0.0)];
            for x in &a.arrivals {
                if x.decision == d {
                    n += 1.0;
                }
                points.push(((x.at - a.first_at) as f64 / 1000.0, n));
            }
            Series {
                label: d.label(),
                class: d.as_str(),
                points,
            }
        })
        .collect();
    view::line_chart(
        "Arrivals of this key over time, by decision",
        "seconds since the first arrival",
        "arrivals",
        &series,
    )
}

fn timeline_section(arrivals: Option<&KeyArrivals>) -> Markup {
    let Some(a) = arrivals else {
        return html! {
            h2 { "Arrival timeline" }
            p id="arrival-summary" class="muted" {
                "No arrival recorded for this key (recorded since the console exists, by this \
                 service's layer)."
            }
        };
    };
    let rows: Vec<Markup> = a
        .arrivals
        .iter()
        .map(|x| {
            let alert = matches!(
                x.decision,
                ArrivalDecision::Mismatch | ArrivalDecision::Refused
            );
            html! {
                tr class=[view::alert_class(alert)] {
                    td { (x.seq) }
                    td { (time(x.at)) }
                    td { "+" (x.at - a.first_at) " ms" }
                    td { (x.decision.label()) }
                    td { (x.status) }
                    td { (x.elapsed_ms) " ms" }
                    td { (x.principal) }
                }
            }
        })
        .collect();
    let head = [
        "#",
        "arrived",
        "after first",
        "decision",
        "status",
        "answered in",
        "principal",
    ];
    html! {
        h2 { "Arrival timeline" }
        p id="arrival-summary" {
            strong { (a.summary()) } " — first " (time(a.first_at)) ", last " (time(a.last_at)) "."
        }
        dl class="facts" id="arrival-counts" {
            @for (d, n) in &a.counts {
                dt { (d.label()) } dd data-decision=(d.as_str()) { (n) }
            }
        }
        @if a.arrivals.len() > 1 { (timeline_chart(a)) }
        @if (a.arrivals.len() as i64) < a.total {
            p class="muted" {
                "The first " (a.arrivals.len()) " of " (a.total)
                " arrivals, one by one; all are counted above."
            }
        }
        (table(Some("arrivals"), "", &head, &rows))
    }
}
