//! The console's pages. Each reads through the service's own queries (records through
//! the idempotency store, leases through the lease store, freezes and reconciliation
//! through their modules) and renders with [`super::html`]; the two that change state
//! (freezes, reconciliation's apply) go through the same functions as the CLI and are
//! audited.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use idem_core::retention::dropped_response;
use idem_core::{
    ArrivalDecision, IdempotencyKey, LeaseEvent, LeaseEventKind, LeaseName, Record, Scope, TenantId,
};
use idem_http::metrics::Decision;
use serde::Deserialize;

use super::html::{self, key_href, page, q, row, seg, t, table, time, Bar, Series};
use super::{audit, bad_request, failed, html_response, reason, redirect, Form, Operator, Params};
use crate::api::AppState;
use crate::db::sql;
use crate::error::Error;
use crate::freeze::{self, Freeze, FreezeRequest, FreezeScope, FreezeWhat};
use crate::reconcile::{self, ReconcileOptions, ReconcileReport};
use idem_sql::arrivals::{key_arrivals, KeyArrivals};

/// Stored bodies shown up to this many bytes.
const BODY_SHOWN: usize = 64 * 1024;
/// Lease holds at or above this fraction of the lease are marked.
const HOLD_WARN: f64 = 0.7;

fn ok(title: &str, op: &Operator, current: &str, body: &str) -> Response {
    html_response(
        StatusCode::OK,
        page(title, Some(&op.viewer()), current, body),
    )
}

/// A page whose body may have failed to build.
fn shown(op: &Operator, title: &str, current: &str, body: Result<String, Error>) -> Response {
    match body {
        Ok(body) => ok(title, op, current, &body),
        Err(e) => failed(&e),
    }
}

// ---------------------------------------------------------------------------------------
// Overview

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

pub(crate) async fn overview(State(state): State<AppState>, op: Operator) -> Response {
    shown(&op, "Overview", "Overview", overview_body(&state).await)
}

async fn overview_body(state: &AppState) -> Result<String, Error> {
    let db = state.orders.database();
    let mut h = String::from("<h1>Overview</h1>");

    // Rates over the last minute (or since the server started).
    let history = state.console.rates.history();
    let now = state.console.rates.read();
    let base = history
        .iter()
        .find(|s| now.at.duration_since(s.at).as_secs() <= 60)
        .cloned();
    h.push_str("<h2>Decisions per second</h2>");
    match base {
        Some(b) if now.at > b.at => {
            let secs = now.at.duration_since(b.at).as_secs_f64();
            let rate =
                |d: Decision| (now.counts[index_of(d)] - b.counts[index_of(d)]) as f64 / secs;
            let keyed_rate: f64 = Decision::ALL
                .iter()
                .filter(|d| keyed(**d))
                .map(|d| rate(*d))
                .sum();
            let conflicts =
                rate(Decision::Replayed) + rate(Decision::InProgress) + rate(Decision::Mismatch);
            let _ = write!(
                h,
                "<p class=\"muted\">Over the last {secs:.0} s.</p><div class=\"cards\">"
            );
            for d in [
                Decision::Executed,
                Decision::Replayed,
                Decision::InProgress,
                Decision::Mismatch,
            ] {
                let _ = write!(
                    h,
                    "<div class=\"card\"><div>{}</div><div class=\"n\">{:.2}</div></div>",
                    t(d.as_str()),
                    rate(d)
                );
            }
            let refused: f64 = Decision::ALL
                .iter()
                .filter(|d| {
                    !matches!(
                        d,
                        Decision::Executed
                            | Decision::Replayed
                            | Decision::InProgress
                            | Decision::Mismatch
                            | Decision::Bypassed
                    )
                })
                .map(|d| rate(*d))
                .sum();
            let bypassed = rate(Decision::Bypassed);
            let _ = write!(
                h,
                "<div class=\"card\"><div>refused (key, auth, size, store)</div><div class=\"n\">{refused:.2}</div></div>\
                 <div class=\"card{}\"><div>bypassed (store down, fail-open routes)</div><div class=\"n\">{bypassed:.2}</div></div>\
                 <div class=\"card\" id=\"conflict-rate\"><div>duplicate-conflict rate</div><div class=\"n\">{}</div></div></div>",
                if bypassed > 0.0 { " bad" } else { "" },
                if keyed_rate > 0.0 { format!("{:.1} %", conflicts / keyed_rate * 100.0) } else { "—".into() }
            );
        }
        _ => h.push_str(
            "<p class=\"muted\">The first rates appear a few seconds after the server started.</p>",
        ),
    }
    if history.len() >= 2 {
        let t0 = history[0].at;
        let series: Vec<Series<'_>> = [
            Decision::Executed,
            Decision::Replayed,
            Decision::InProgress,
            Decision::Mismatch,
        ]
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
        h.push_str(&html::line_chart(
            "Decisions per second over the last minutes",
            "seconds since the first sample",
            "per second",
            &series,
        ));
    }

    // PROCESSING records past their lease, by the store clock.
    let store_now = db.store().retention().now().await?;
    let (stale, stale_count) = {
        let mut conn = db.acquire().await?;
        let mut c = conn.conn();
        let stale = c
            .all(
                sql(
                    "SELECT tenant_id, key, lease_expires_at, CAST(attempts AS BIGINT) AS attempts \
                     FROM idem_records \
                     WHERE state = 'PROCESSING' AND lease_expires_at < $1 \
                     ORDER BY lease_expires_at LIMIT 20",
                )
                .bind(store_now),
            )
            .await?;
        (
            stale,
            crate::api::processing_past_lease(&mut c, store_now).await?,
        )
    };
    let _ = write!(
        h,
        "<h2>PROCESSING past its lease</h2><p id=\"stale-count\" class=\"{}\">{stale_count} record(s)</p>",
        if stale_count > 0 { "bad" } else { "ok" }
    );
    if !stale.is_empty() {
        let rows = stale
            .iter()
            .map(|r| {
                let (tenant, key) = (r.text("tenant_id")?, r.text("key")?);
                Ok(format!(
                    "<tr><td>{}</td><td><a href=\"{}\">{}</a></td><td>{}</td><td>{}</td></tr>",
                    t(&tenant),
                    key_href(&tenant, &key),
                    t(&key),
                    t(&r.opt_int("lease_expires_at")?.map(time).unwrap_or_default()),
                    r.int("attempts")?
                ))
            })
            .collect::<Result<Vec<_>, Error>>()?;
        h.push_str(&table(
            None,
            "",
            &["tenant", "key", "lease ended", "attempts"],
            &rows,
        ));
    }

    // The sweeper: its lease's last evidence.
    h.push_str("<h2>Sweeper</h2>");
    let name = LeaseName::new(idem_sweep::LEASE_NAME).map_err(|e| Error::Backend(e.to_string()))?;
    let events = state.console.leases.events(&name, 1).await?;
    let status = state.console.leases.show(&name).await?;
    match (events.last(), &status.holder) {
        (_, Some(holder)) => {
            let _ = write!(
                h,
                "<p id=\"sweeper\">Running now: {} since {} (<a href=\"/console/leases/{}\">lease</a>).</p>",
                t(holder.owner.as_str()),
                t(&time(holder.acquired_at)),
                seg(name.as_str())
            );
        }
        (Some(last), None) => {
            let _ = write!(
                h,
                "<p id=\"sweeper\">Last run: {} at {} (<a href=\"/console/leases/{}\">lease</a>).</p>",
                t(last.kind.as_str()),
                t(&time(last.at)),
                seg(name.as_str())
            );
        }
        (None, None) => h.push_str(
            "<p id=\"sweeper\" class=\"muted\">No sweep has run on this database (<code>idem sweep</code>).</p>",
        ),
    }

    // Freezes.
    let active = freeze::active_freezes(db).await?;
    let _ = write!(
        h,
        "<h2>Active freezes</h2><p id=\"freeze-count\">{} active (<a href=\"/console/freezes\">freeze switches</a>)</p>",
        active.len()
    );
    if !active.is_empty() {
        let rows: Vec<String> = active.iter().map(freeze_row).collect();
        h.push_str(&table(
            None,
            "",
            &["tenant", "scope", "part", "reason", "by", "since"],
            &rows,
        ));
    }
    if let Some(log) = &state.console.arrivals {
        if log.dropped() > 0 {
            let _ = write!(
                h,
                "<p class=\"note\">{} arrival(s) were not recorded in the timeline (its buffer was full).</p>",
                log.dropped()
            );
        }
    }
    Ok(h)
}

// ---------------------------------------------------------------------------------------
// Key inspector

pub(crate) async fn key(
    State(state): State<AppState>,
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
    match key_body(&state, &tenant_id, &key_id).await {
        Ok((status, body)) => html_response(
            status,
            page(&format!("Key {key}"), Some(&op.viewer()), "Search", &body),
        ),
        Err(e) => failed(&e),
    }
}

async fn key_body(
    state: &AppState,
    tenant: &TenantId,
    key: &IdempotencyKey,
) -> Result<(StatusCode, String), Error> {
    let db = state.orders.database();
    let scope = Scope::new(tenant.clone(), key.clone());
    let record = state.store.get(&scope).await?;
    let arrivals = key_arrivals(db.store(), tenant.as_str(), key.as_str()).await?;
    let order = {
        let mut conn = db.acquire().await?;
        conn.conn()
            .optional(
                sql("SELECT order_id, status FROM orders WHERE tenant_id = $1 AND idempotency_key = $2")
                    .bind(tenant.as_str())
                    .bind(key.as_str()),
            )
            .await?
    };
    let mut h = String::new();
    let _ = write!(
        h,
        "<h1>Key <code>{}</code></h1><p>Tenant <code>{}</code></p>",
        t(key.as_str()),
        t(tenant.as_str())
    );
    let mut status = StatusCode::OK;
    // The order this key made or names.
    let order_id = match &order {
        Some(o) => Some((o.text("order_id")?, Some(o.text("status")?))),
        None => record
            .as_ref()
            .and_then(|r| r.result.as_ref())
            .and_then(|res| {
                res.result_ref.clone().or_else(|| {
                    serde_json::from_slice::<serde_json::Value>(&res.body)
                        .ok()?
                        .get("order_id")?
                        .as_str()
                        .map(str::to_owned)
                })
            })
            .map(|id| (id, None)),
    };
    if let Some((id, order_status)) = &order_id {
        let _ = write!(
            h,
            "<p id=\"key-order\">Order <a href=\"/console/search?by=order&amp;q={}\"><code>{}</code></a>{}</p>",
            q(id),
            t(id),
            order_status
                .as_ref()
                .map(|s| format!(" — {}", t(s)))
                .unwrap_or_default()
        );
    }
    match &record {
        Some(r) => h.push_str(&record_section(r)),
        None => match state.console.archive.archived(tenant, key).await? {
            Some(a) => {
                let _ = write!(
                    h,
                    "<h2>Archived</h2><p class=\"note\">Out of the online index: this key is not \
                     replayed; the stored response is gone and only this evidence is kept.</p><dl class=\"facts\">\
                     <dt>state</dt><dd id=\"record-state\">{}</dd><dt>status</dt><dd>{}</dd>\
                     <dt>fingerprint</dt><dd><code>{}</code></dd><dt>result reference</dt><dd>{}</dd>\
                     <dt>first processed</dt><dd>{}</dd><dt>completed</dt><dd>{}</dd>\
                     <dt>archived</dt><dd>{}</dd><dt>key digest</dt><dd><code>{}</code></dd></dl>",
                    t(&a.state.to_string().to_lowercase()),
                    a.status.map(|s| s.to_string()).unwrap_or_default(),
                    t(&a.fingerprint.to_hex()),
                    t(a.result_ref.as_deref().unwrap_or("—")),
                    t(&time(a.first_processed_at)),
                    t(&a.completed_at.map(time).unwrap_or_default()),
                    t(&time(a.archived_at)),
                    hex::encode(a.key_digest),
                );
            }
            None => {
                if arrivals.is_none() {
                    status = StatusCode::NOT_FOUND;
                }
                h.push_str("<p class=\"note\" id=\"record-state\">No record for this key (never claimed, or past every retention window).</p>");
            }
        },
    }
    h.push_str(&timeline_section(arrivals.as_ref()));
    Ok((status, h))
}

fn record_section(r: &Record) -> String {
    let mut h = String::from("<h2>Record</h2><dl class=\"facts\">");
    let tier = r
        .result
        .as_ref()
        .and_then(dropped_response)
        .map(|tier| format!("{} (response dropped; replays are rebuilt)", tier.as_str()))
        .unwrap_or_else(|| match &r.result {
            Some(_) => "replay (response kept)".into(),
            None => "— (no stored result yet)".into(),
        });
    let facts: [(&str, String); 12] = [
        ("version", r.version.to_string()),
        ("attempts", r.attempts.to_string()),
        ("fingerprint", r.fingerprint.to_hex()),
        ("principal", r.principal.to_string()),
        (
            "owner",
            r.owner
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or("—".into()),
        ),
        (
            "lease deadline",
            r.lease_expires_at.map(time).unwrap_or("—".into()),
        ),
        ("tier", tier),
        ("created", time(r.created_at)),
        ("updated", time(r.updated_at)),
        ("completed", r.completed_at.map(time).unwrap_or("—".into())),
        (
            "result reference",
            r.result
                .as_ref()
                .and_then(|x| x.result_ref.clone())
                .unwrap_or("—".into()),
        ),
        (
            "stored response",
            r.result
                .as_ref()
                .map(|x| format!("status {}, {} bytes", x.status, x.body.len()))
                .unwrap_or("—".into()),
        ),
    ];
    let _ = write!(
        h,
        "<dt>state</dt><dd id=\"record-state\">{}</dd>",
        t(&r.state.to_string().to_lowercase())
    );
    for (k, v) in facts {
        let _ = write!(h, "<dt>{}</dt><dd>{}</dd>", t(k), t(&v));
    }
    h.push_str("</dl>");
    if let Some(res) = &r.result {
        h.push_str("<h3>Stored response</h3>");
        let rows: Vec<String> = res.headers.iter().map(|(n, v)| row(&[n, v])).collect();
        h.push_str(&table(None, "", &["header", "value"], &rows));
        let shown = &res.body[..res.body.len().min(BODY_SHOWN)];
        let text = match serde_json::from_slice::<serde_json::Value>(&res.body) {
            Ok(v) => serde_json::to_string_pretty(&v).unwrap_or_default(),
            Err(_) => match std::str::from_utf8(shown) {
                Ok(s) => s.to_owned(),
                Err(_) => format!("({} bytes, not text)", res.body.len()),
            },
        };
        let text: String = text.chars().take(BODY_SHOWN).collect();
        let _ = write!(h, "<pre id=\"stored-body\"><code>{}</code></pre>", t(&text));
    }
    h
}

fn timeline_section(arrivals: Option<&KeyArrivals>) -> String {
    let mut h = String::from("<h2>Arrival timeline</h2>");
    let Some(a) = arrivals else {
        h.push_str("<p id=\"arrival-summary\" class=\"muted\">No arrival recorded for this key (recorded since the console exists, by this service's layer).</p>");
        return h;
    };
    let _ = write!(
        h,
        "<p id=\"arrival-summary\"><strong>{}</strong> — first {}, last {}.</p><dl class=\"facts\" id=\"arrival-counts\">",
        t(&a.summary()),
        t(&time(a.first_at)),
        t(&time(a.last_at))
    );
    for (d, n) in &a.counts {
        let _ = write!(
            h,
            "<dt>{}</dt><dd data-decision=\"{}\">{n}</dd>",
            t(d.label()),
            t(d.as_str())
        );
    }
    h.push_str("</dl>");
    if a.arrivals.len() as i64 > 1 {
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
        h.push_str(&html::line_chart(
            "Arrivals of this key over time, by decision",
            "seconds since the first arrival",
            "arrivals",
            &series,
        ));
    }
    if (a.arrivals.len() as i64) < a.total {
        let _ = write!(
            h,
            "<p class=\"muted\">The first {} of {} arrivals, one by one; all are counted above.</p>",
            a.arrivals.len(),
            a.total
        );
    }
    let rows: Vec<String> = a
        .arrivals
        .iter()
        .map(|x| {
            let class = match x.decision {
                ArrivalDecision::Mismatch | ArrivalDecision::Refused => " class=\"alert\"",
                _ => "",
            };
            format!(
                "<tr{class}><td>{}</td><td>{}</td><td>+{} ms</td><td>{}</td><td>{}</td><td>{} ms</td><td>{}</td></tr>",
                x.seq,
                t(&time(x.at)),
                x.at - a.first_at,
                t(x.decision.label()),
                x.status,
                x.elapsed_ms,
                t(&x.principal)
            )
        })
        .collect();
    h.push_str(&table(
        Some("arrivals"),
        "",
        &[
            "#",
            "arrived",
            "after first",
            "decision",
            "status",
            "answered in",
            "principal",
        ],
        &rows,
    ));
    h
}

// ---------------------------------------------------------------------------------------
// Search

#[derive(Deserialize, Default)]
pub(crate) struct SearchQuery {
    #[serde(default)]
    q: String,
    #[serde(default)]
    by: String,
    #[serde(default)]
    tenant: String,
}

pub(crate) async fn search(
    State(state): State<AppState>,
    op: Operator,
    Params(query): Params<SearchQuery>,
) -> Response {
    shown(&op, "Search", "Search", search_body(&state, &query).await)
}

async fn search_body(state: &AppState, query: &SearchQuery) -> Result<String, Error> {
    let needle = query.q.trim();
    let by = if query.by.is_empty() {
        "key"
    } else {
        query.by.as_str()
    };
    let tenant = query.tenant.trim();
    let mut h = String::from("<h1>Search</h1><form class=\"inline\" method=\"get\" action=\"/console/search\" role=\"search\">");
    let _ = write!(
        h,
        "<div class=\"field\"><label for=\"q\">Find</label><input id=\"q\" name=\"q\" value=\"{}\" maxlength=\"255\"></div>\
         <div class=\"field\"><label for=\"by\">By</label><select id=\"by\" name=\"by\">",
        t(needle)
    );
    for (value, label) in [
        ("key", "idempotency key"),
        ("order", "order id"),
        ("user", "user id"),
        ("show", "show id"),
    ] {
        let sel = if value == by { " selected" } else { "" };
        let _ = write!(h, "<option value=\"{value}\"{sel}>{label}</option>");
    }
    let _ = write!(
        h,
        "</select></div><div class=\"field\"><label for=\"tenant\">Tenant (not needed for an order id)</label><input id=\"tenant\" name=\"tenant\" value=\"{}\" maxlength=\"128\"></div>\
         <button type=\"submit\">Search</button></form>",
        t(tenant)
    );
    if needle.is_empty() {
        return Ok(h);
    }
    let tenant_arg = (!tenant.is_empty()).then(|| tenant.to_owned());
    // Keys, users and shows are indexed per tenant: without one, a search would read
    // every record or order.
    if by != "order" && tenant_arg.is_none() {
        h.push_str(
            "<p role=\"alert\">Give the tenant: a search by key, user or show reads one \
             tenant's index.</p>",
        );
        return Ok(h);
    }
    let db = state.orders.database();
    let mut conn = db.acquire().await?;
    let mut c = conn.conn();
    h.push_str("<h2>Results</h2>");
    match by {
        "key" => {
            let rows = c
                .all(
                    sql(
                        "SELECT tenant_id, key, state, updated_at FROM idem_records \
                         WHERE key = $1 AND ($2 IS NULL OR tenant_id = $2) ORDER BY tenant_id LIMIT 100",
                    )
                    .bind(needle)
                    .bind(tenant_arg.clone()),
                )
                .await?;
            let mut found = key_rows(&rows, "key", true, "updated_at")?;
            if found.is_empty() {
                // Keys that only arrived (refused before a record) or whose record is gone.
                let rows = c
                    .all(
                        sql(
                            "SELECT tenant_id, idem_key, last_at FROM idem_arrival_keys \
                             WHERE idem_key = $1 AND ($2 IS NULL OR tenant_id = $2) LIMIT 100",
                        )
                        .bind(needle)
                        .bind(tenant_arg),
                    )
                    .await?;
                found = key_rows(&rows, "idem_key", false, "last_at")?;
            }
            h.push_str(&table(
                Some("results"),
                "",
                &["tenant", "key", "state", "updated"],
                &found,
            ));
        }
        "order" => {
            let orders = c
                .all(
                    sql(
                        "SELECT order_id, tenant_id, user_id, show_id, status, idempotency_key, \
                           created_at FROM orders WHERE order_id = $1 AND ($2 IS NULL OR tenant_id = $2)",
                    )
                    .bind(needle)
                    .bind(tenant_arg.clone()),
                )
                .await?;
            h.push_str(&orders_table(&orders)?);
            // Every key whose stored result names this order (create, pay, cancel): the
            // service's result reference is the order's path. Within the order's tenant;
            // the column has no index, so this reads that tenant's records.
            let order_path = format!("/v1/orders/{needle}");
            let mut keys = Vec::new();
            for o in &orders {
                keys.extend(
                    c.all(
                        sql(
                            "SELECT tenant_id, key, state, updated_at FROM idem_records \
                             WHERE tenant_id = $1 AND (result_ref = $2 OR result_ref = $3) \
                             ORDER BY created_at LIMIT 20",
                        )
                        .bind(o.text("tenant_id")?)
                        .bind(needle)
                        .bind(order_path.clone()),
                    )
                    .await?,
                );
            }
            let rows = key_rows(&keys, "key", true, "updated_at")?;
            h.push_str("<h3>Keys whose result names this order</h3>");
            h.push_str(&table(
                Some("order-keys"),
                "",
                &["tenant", "key", "state", "updated"],
                &rows,
            ));
            drop(conn);
            let tenant_id = tenant_arg.as_deref().and_then(|x| TenantId::new(x).ok());
            let mut archived = state
                .console
                .archive
                .archived_by_ref(tenant_id.as_ref(), needle)
                .await?;
            archived.extend(
                state
                    .console
                    .archive
                    .archived_by_ref(tenant_id.as_ref(), &order_path)
                    .await?,
            );
            if !archived.is_empty() {
                let rows: Vec<String> = archived
                    .iter()
                    .map(|a| {
                        row(&[
                            a.tenant.to_string(),
                            hex::encode(a.key_digest),
                            a.state.to_string().to_lowercase(),
                            time(a.archived_at),
                        ])
                    })
                    .collect();
                h.push_str("<h3>Archived keys naming this order</h3>");
                h.push_str(&table(
                    None,
                    "",
                    &["tenant", "key digest", "state", "archived"],
                    &rows,
                ));
            }
        }
        "user" | "show" => {
            let stmt = if by == "user" {
                sql(
                    "SELECT order_id, tenant_id, user_id, show_id, status, idempotency_key, created_at \
                     FROM orders WHERE user_id = $1 AND ($2 IS NULL OR tenant_id = $2) \
                     ORDER BY created_at DESC LIMIT 100",
                )
            } else {
                sql(
                    "SELECT order_id, tenant_id, user_id, show_id, status, idempotency_key, created_at \
                     FROM orders WHERE show_id = $1 AND ($2 IS NULL OR tenant_id = $2) \
                     ORDER BY created_at DESC LIMIT 100",
                )
            };
            let orders = c.all(stmt.bind(needle).bind(tenant_arg)).await?;
            h.push_str(&orders_table(&orders)?);
            let _ = write!(
                h,
                "<p><a href=\"/console/reconcile?tenant={}&amp;{}={}\">Look for duplicates of this {by}</a></p>",
                q(tenant),
                by,
                q(needle)
            );
        }
        _ => h.push_str("<p role=\"alert\">Search by key, order, user or show.</p>"),
    }
    Ok(h)
}

/// Rows of (tenant, key link, state, time) from `tenant_id`, `key_col`, `state` (or "no
/// record") and `at_col`.
fn key_rows(
    rows: &[crate::db::Row],
    key_col: &str,
    with_state: bool,
    at_col: &str,
) -> Result<Vec<String>, Error> {
    rows.iter()
        .map(|r| {
            let (tenant, key) = (r.text("tenant_id")?, r.text(key_col)?);
            let state = match with_state {
                true => r.text("state")?.to_lowercase(),
                false => "no record".to_owned(),
            };
            Ok(format!(
                "<tr><td>{}</td><td><a href=\"{}\">{}</a></td><td>{}</td><td>{}</td></tr>",
                t(&tenant),
                key_href(&tenant, &key),
                t(&key),
                t(&state),
                t(&time(r.int(at_col)?))
            ))
        })
        .collect()
}

fn orders_table(orders: &[crate::db::Row]) -> Result<String, Error> {
    let rows = orders
        .iter()
        .map(|r| {
            let tenant = r.text("tenant_id")?;
            let key = match r.opt_text("idempotency_key")? {
                Some(k) => format!("<a href=\"{}\">{}</a>", key_href(&tenant, &k), t(&k)),
                None => "<span class=\"muted\">none (legacy)</span>".into(),
            };
            Ok(format!(
                "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{key}</td><td>{}</td></tr>",
                t(&r.text("order_id")?),
                t(&tenant),
                t(&r.text("user_id")?),
                t(&r.text("show_id")?),
                t(&r.text("status")?),
                t(&time(r.int("created_at")?))
            ))
        })
        .collect::<Result<Vec<_>, Error>>()?;
    Ok(table(
        Some("orders"),
        "",
        &[
            "order", "tenant", "user", "show", "status", "key", "created",
        ],
        &rows,
    ))
}

// ---------------------------------------------------------------------------------------
// Reconciliation

#[derive(Deserialize, Default, Clone)]
pub(crate) struct ScopeQuery {
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    user: String,
    #[serde(default)]
    show: String,
    #[serde(default)]
    since: String,
    #[serde(default)]
    until: String,
}

impl ScopeQuery {
    fn from_form(form: &Form) -> Self {
        let v = |n: &str| form.get(n).unwrap_or("").to_owned();
        Self {
            tenant: v("tenant"),
            user: v("user"),
            show: v("show"),
            since: v("since"),
            until: v("until"),
        }
    }

    fn is_empty(&self) -> bool {
        [
            &self.tenant,
            &self.user,
            &self.show,
            &self.since,
            &self.until,
        ]
        .iter()
        .all(|s| s.trim().is_empty())
    }

    fn options(&self, actor: &str) -> Result<ReconcileOptions, String> {
        let opt = |s: &str| (!s.trim().is_empty()).then(|| s.trim().to_owned());
        let at = |s: &str, what: &str| -> Result<Option<i64>, String> {
            match opt(s) {
                None => Ok(None),
                Some(s) => chrono::DateTime::parse_from_rfc3339(&s)
                    .map(|d| Some(d.timestamp_millis()))
                    .map_err(|_| format!("{what} is not an RFC 3339 time (2026-12-01T20:14:00Z)")),
            }
        };
        for (v, what) in [
            (&self.tenant, "tenant"),
            (&self.user, "user"),
            (&self.show, "show"),
        ] {
            if v.chars().count() > 128 || v.chars().any(char::is_control) {
                return Err(format!("the {what} is at most 128 characters on one line"));
            }
        }
        Ok(ReconcileOptions {
            tenant: opt(&self.tenant),
            user: opt(&self.user),
            show: opt(&self.show),
            since_ms: at(&self.since, "since")?,
            until_ms: at(&self.until, "until")?,
            actor: actor.to_owned(),
            ..ReconcileOptions::default()
        })
    }

    fn hidden_fields(&self) -> String {
        let mut h = String::new();
        for (n, v) in [
            ("tenant", &self.tenant),
            ("user", &self.user),
            ("show", &self.show),
            ("since", &self.since),
            ("until", &self.until),
        ] {
            let _ = write!(h, "<input type=\"hidden\" name=\"{n}\" value=\"{}\">", t(v));
        }
        h
    }
}

fn scope_form(s: &ScopeQuery) -> String {
    let mut h = String::from(
        "<form class=\"inline\" method=\"get\" action=\"/console/reconcile\" aria-label=\"Scope\">",
    );
    for (n, label, v, hint) in [
        ("tenant", "Tenant", &s.tenant, ""),
        ("user", "User", &s.user, ""),
        ("show", "Show", &s.show, ""),
        (
            "since",
            "Since (RFC 3339)",
            &s.since,
            "2026-12-01T20:00:00Z",
        ),
        ("until", "Until (RFC 3339)", &s.until, ""),
    ] {
        let _ = write!(
            h,
            "<div class=\"field\"><label for=\"r-{n}\">{label}</label><input id=\"r-{n}\" name=\"{n}\" value=\"{}\" placeholder=\"{hint}\" maxlength=\"128\"></div>",
            t(v)
        );
    }
    h.push_str("<button type=\"submit\">Run the dry run</button></form>");
    h
}

pub(crate) async fn reconcile(
    State(state): State<AppState>,
    op: Operator,
    Params(query): Params<ScopeQuery>,
) -> Response {
    let scope = query;
    let mut h = String::from("<h1>Duplicates and reconciliation</h1>");
    h.push_str(&scope_form(&scope));
    if scope.is_empty() {
        h.push_str("<p class=\"muted\">Pick a scope (a tenant at least, usually a user or a show) and run the dry run: it writes nothing.</p>");
        return ok("Reconcile", &op, "Reconcile", &h);
    }
    let options = match scope.options(&format!("console:{}", op.name)) {
        Ok(o) => o,
        Err(e) => return bad_request(&op, &e),
    };
    match run_reconcile(state.orders.database().clone(), options).await {
        Ok(report) => {
            h.push_str(&report_body(&report, &scope, &op, false));
            ok("Reconcile", &op, "Reconcile", &h)
        }
        Err(e) => failed(&e),
    }
}

pub(crate) async fn reconcile_apply(
    State(state): State<AppState>,
    op: Operator,
    body: Bytes,
) -> Response {
    let form = Form::parse(&body);
    if let Some(refused) = op.csrf_refusal(&form) {
        return refused;
    }
    let scope = ScopeQuery::from_form(&form);
    let why = match reason(&form) {
        Ok(r) => r,
        Err(e) => return bad_request(&op, e),
    };
    if form.get("confirm") != Some("yes") {
        return bad_request(
            &op,
            "Tick the confirmation: applying cancels, refunds and releases for real.",
        );
    }
    if scope.is_empty() {
        return bad_request(&op, "Applying needs a scope.");
    }
    let mut options = match scope.options(&format!("console:{}", op.name)) {
        Ok(o) => o,
        Err(e) => return bad_request(&op, &e),
    };
    options.apply = true;
    let target = format!(
        "tenant={} user={} show={} since={} until={}",
        scope.tenant, scope.user, scope.show, scope.since, scope.until
    );
    match run_reconcile(state.orders.database().clone(), options).await {
        Ok(report) => {
            let outcome = match &report.refused {
                Some(why) => format!("refused: {why}"),
                None => format!(
                    "applied {} action(s); checks {}",
                    report.applied,
                    if report.passed { "passed" } else { "failed" }
                ),
            };
            audit(
                &state,
                &op.name,
                "reconcile-apply",
                &target,
                Some(&why),
                &outcome,
            )
            .await;
            let mut h = String::from("<h1>Duplicates and reconciliation</h1>");
            h.push_str(&scope_form(&scope));
            h.push_str(&report_body(&report, &scope, &op, true));
            ok("Reconcile", &op, "Reconcile", &h)
        }
        Err(e) => {
            audit(
                &state,
                &op.name,
                "reconcile-apply",
                &target,
                Some(&why),
                "failed",
            )
            .await;
            failed(&e)
        }
    }
}

/// Runs a reconciliation for a page. Its future is not `Send` (the compiler cannot prove
/// it for some of its closures), so it runs on a blocking thread of its own.
async fn run_reconcile(
    db: crate::db::Database,
    options: ReconcileOptions,
) -> Result<ReconcileReport, Error> {
    let handle = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || handle.block_on(reconcile::reconcile(&db, &options)))
        .await
        .map_err(|e| Error::Backend(format!("reconciliation task: {e}")))?
}

fn report_body(r: &ReconcileReport, scope: &ScopeQuery, op: &Operator, applied: bool) -> String {
    let mut h = String::new();
    let tot = &r.totals;
    let _ = write!(
        h,
        "<h2>{}</h2><div class=\"cards\" id=\"totals\">\
         <div class=\"card\"><div>orders scanned</div><div class=\"n\">{}</div></div>\
         <div class=\"card\"><div>intents</div><div class=\"n\">{}</div></div>\
         <div class=\"card{}\"><div>duplicate clusters</div><div class=\"n\">{}</div></div>\
         <div class=\"card\"><div>cancels / refunds</div><div class=\"n\">{} / {}</div></div>\
         <div class=\"card\"><div>refund total</div><div class=\"n\">{:.2}</div></div>\
         <div class=\"card\"><div>pending actions</div><div class=\"n\">{}</div></div></div>",
        if applied {
            format!("Applied: {} action(s)", r.applied)
        } else {
            "Dry run (nothing written)".into()
        },
        tot.orders_scanned,
        tot.intents,
        if tot.clusters > 0 { " bad" } else { "" },
        tot.clusters,
        tot.cancels,
        tot.refunds,
        tot.refund_cents as f64 / 100.0,
        tot.pending,
    );
    if let Some(why) = &r.refused {
        let _ = write!(h, "<p role=\"alert\">Not applied: {}</p>", t(why));
    }
    for (i, c) in r.clusters.iter().enumerate() {
        let _ = write!(
            h,
            "<section class=\"cluster\" aria-labelledby=\"cluster-{i}\"><h3 id=\"cluster-{i}\">Cluster {}: user <code>{}</code>, show <code>{}</code>, {} orders in {} ms</h3>\
             <p class=\"keeper\">Keeper: <code>{}</code> — {}</p>",
            i + 1,
            t(&c.user_id),
            t(&c.show_id),
            c.orders.len(),
            c.span_ms,
            t(c.keeper.as_deref().unwrap_or("none")),
            t(&c.keeper_reason),
        );
        h.push_str(&cluster_chart(c));
        let rows: Vec<String> = c
            .orders
            .iter()
            .map(|o| {
                let class = if o.role == "keeper" { " class=\"keeper\"" } else { "" };
                format!(
                    "<tr{class}><td><a href=\"/console/search?by=order&amp;q={}\"><code>{}</code></a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    q(&o.order_id),
                    t(&o.order_id),
                    t(&o.role),
                    t(&o.status),
                    t(&o.created_at),
                    if o.paid { "yes" } else { "no" },
                    t(o.hold.as_deref().unwrap_or("—")),
                    o.messages,
                    format_args!("{:.2} / {:.2}", o.charged_cents as f64 / 100.0, o.refunded_cents as f64 / 100.0),
                )
            })
            .collect();
        h.push_str(&table(
            None,
            "cluster-orders",
            &[
                "order",
                "role",
                "status",
                "created",
                "paid",
                "hold",
                "messages",
                "charged / refunded",
            ],
            &rows,
        ));
        h.push_str("</section>");
    }
    let rows: Vec<String> = r
        .actions
        .iter()
        .map(|a| {
            let class = if matches!(a.state, reconcile::ActionState::Blocked | reconcile::ActionState::Failed) {
                " class=\"alert\""
            } else {
                ""
            };
            format!(
                "<tr{class}><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td></tr>",
                a.cluster + 1,
                t(&a.order_id),
                t(a.kind.as_str()),
                t(&format!("{:?}", a.state).to_lowercase()),
                t(&match &a.error {
                    Some(e) => format!("{} ({e})", a.detail),
                    None => a.detail.clone(),
                })
            )
        })
        .collect();
    h.push_str("<h2>Plan</h2>");
    h.push_str(&table(
        Some("plan"),
        "",
        &["cluster", "order", "action", "state", "what it does"],
        &rows,
    ));
    h.push_str("<h2>Ledger checks</h2><ul id=\"checks\">");
    for c in &r.checks {
        let _ = write!(
            h,
            "<li><span class=\"{}\">{}</span> {} — {}{}</li>",
            if c.passed { "ok" } else { "bad" },
            if c.passed { "passed" } else { "FAILED" },
            t(&c.name),
            t(&c.detail),
            if c.failures.is_empty() {
                String::new()
            } else {
                format!(": {}", t(&c.failures.join("; ")))
            }
        );
    }
    h.push_str("</ul>");
    if !r.freeze_gaps.is_empty() {
        h.push_str("<h2>Freeze first</h2><p class=\"note\">Applying is refused while the automatic chain of a cluster's scope is not frozen (as with <code>idem reconcile --apply</code>).</p><ul id=\"freeze-gaps\">");
        for g in &r.freeze_gaps {
            let missing: Vec<&str> = g.missing.iter().map(|w| w.as_str()).collect();
            let _ = write!(
                h,
                "<li>tenant <code>{}</code>, user <code>{}</code>: {} — <a href=\"/console/freezes?tenant={}&amp;scope_kind=user&amp;scope_value={}\">freeze it</a></li>",
                t(&g.tenant),
                t(&g.user_id),
                t(&missing.join(", ")),
                q(&g.tenant),
                q(&g.user_id)
            );
        }
        h.push_str("</ul>");
    }
    if tot.pending > 0 {
        let disabled = if r.freeze_gaps.is_empty() {
            ""
        } else {
            " disabled"
        };
        let _ = write!(
            h,
            "<h2>Apply</h2><form class=\"stack\" method=\"post\" action=\"/console/reconcile\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{}\">{}\
             <div class=\"field\"><label for=\"apply-reason\">Reason</label><input id=\"apply-reason\" name=\"reason\" required maxlength=\"500\"{disabled}></div>\
             <label class=\"check\"><input type=\"checkbox\" name=\"confirm\" value=\"yes\" required{disabled}> \
             I have read the plan: cancel, refund and release as listed</label>\
             <button type=\"submit\" class=\"danger\"{disabled}>Apply the plan</button></form>",
            t(&op.csrf),
            scope.hidden_fields()
        );
    }
    h
}

/// The cluster's orders on a time line: when each arrived, the keeper marked.
fn cluster_chart(c: &reconcile::Cluster) -> String {
    let at = |s: &str| {
        chrono::DateTime::parse_from_rfc3339(s)
            .map(|d| d.timestamp_millis())
            .ok()
    };
    let times: Vec<(i64, bool)> = c
        .orders
        .iter()
        .filter_map(|o| at(&o.created_at).map(|t| (t, o.role == "keeper")))
        .collect();
    let Some(first) = times.iter().map(|x| x.0).min() else {
        return String::new();
    };
    let span = (times.iter().map(|x| x.0).max().unwrap_or(first) - first).max(1) as f64;
    let (w, hgt, pad) = (640.0, 90.0, 24.0);
    let mut h = String::new();
    let _ = write!(
        h,
        "<figure class=\"chart\"><svg viewBox=\"0 0 {w} {hgt}\" role=\"img\" aria-label=\"Orders of this cluster over time\">\
         <line class=\"axis\" x1=\"{pad}\" y1=\"50\" x2=\"{r}\" y2=\"50\"/>",
        r = w - pad
    );
    for (i, (ms, keeper)) in times.iter().enumerate() {
        let x = pad + (*ms - first) as f64 / span * (w - 2.0 * pad);
        let y = 50.0 - ((i % 3) as f64) * 10.0;
        let class = if *keeper {
            "dot keeper"
        } else {
            "dot duplicate"
        };
        let _ = write!(
            h,
            "<circle class=\"{class}\" cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"6\"><title>+{} ms{}</title></circle>",
            ms - first,
            if *keeper { " (keeper)" } else { "" }
        );
    }
    let _ = write!(
        h,
        "<text class=\"tick\" x=\"{pad}\" y=\"80\">0 ms</text><text class=\"tick\" x=\"{tx}\" y=\"80\">+{} ms</text></svg>\
         <figcaption>Orders over time: <span class=\"key replayed\">keeper</span>, <span class=\"key mismatch\">duplicates</span>.</figcaption></figure>",
        span as i64,
        tx = w - pad - 60.0
    );
    h
}

// ---------------------------------------------------------------------------------------
// Freezes

#[derive(Deserialize, Default)]
pub(crate) struct FreezePrefill {
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    scope_kind: String,
    #[serde(default)]
    scope_value: String,
}

fn freeze_row(f: &Freeze) -> String {
    row(&[
        f.tenant.clone().unwrap_or_else(|| "every tenant".into()),
        f.scope.to_string(),
        f.what.as_str().to_owned(),
        f.reason.clone().unwrap_or_default(),
        f.frozen_by.clone(),
        f.frozen_at.clone(),
    ])
}

pub(crate) async fn freezes(
    State(state): State<AppState>,
    op: Operator,
    Params(prefill): Params<FreezePrefill>,
) -> Response {
    let db = state.orders.database();
    let (active, history) = match (
        freeze::active_freezes(db).await,
        freeze::freeze_history(db).await,
    ) {
        (Ok(a), Ok(h)) => (a, h),
        (Err(e), _) | (_, Err(e)) => return failed(&e),
    };
    let mut h = String::from("<h1>Freeze switches</h1>");
    let _ = write!(
        h,
        "<h2>Freeze a scope</h2><form class=\"stack\" method=\"post\" action=\"/console/freezes\" aria-label=\"Freeze a scope\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <div class=\"field\"><label for=\"f-tenant\">Tenant</label><input id=\"f-tenant\" name=\"tenant\" value=\"{}\" maxlength=\"128\" placeholder=\"empty: every tenant\"></div>\
         <div class=\"field\"><label for=\"f-kind\">Scope</label><select id=\"f-kind\" name=\"scope_kind\">",
        t(&op.csrf),
        t(&prefill.tenant)
    );
    for kind in ["user", "show", "all"] {
        let sel = if kind == prefill.scope_kind {
            " selected"
        } else {
            ""
        };
        let _ = write!(h, "<option value=\"{kind}\"{sel}>{kind}</option>");
    }
    let _ = write!(
        h,
        "</select></div><div class=\"field\"><label for=\"f-value\">Value</label><input id=\"f-value\" name=\"scope_value\" value=\"{}\" maxlength=\"128\" placeholder=\"the user or show id\"></div>\
         <fieldset><legend>Parts of the automatic chain</legend>",
        t(&prefill.scope_value)
    );
    for w in FreezeWhat::ALL {
        let _ = write!(
            h,
            "<label class=\"check\"><input type=\"checkbox\" name=\"what\" value=\"{0}\" checked> {0}</label>",
            w.as_str()
        );
    }
    h.push_str(
        "</fieldset><div class=\"field\"><label for=\"f-reason\">Reason</label><input id=\"f-reason\" name=\"reason\" required maxlength=\"500\"></div>\
         <button type=\"submit\">Freeze</button></form>",
    );

    // Active freezes, one unfreeze form per scope.
    let mut groups: BTreeMap<(String, String), Vec<&Freeze>> = BTreeMap::new();
    for f in &active {
        groups
            .entry((f.tenant.clone().unwrap_or_default(), f.scope.to_string()))
            .or_default()
            .push(f);
    }
    h.push_str("<h2>Active</h2>");
    let mut rows = Vec::new();
    for ((tenant, scope), fs) in &groups {
        let parts: Vec<&str> = fs.iter().map(|f| f.what.as_str()).collect();
        let reasons: Vec<String> = fs.iter().filter_map(|f| f.reason.clone()).collect();
        let mut r = format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>",
            t(if tenant.is_empty() {
                "every tenant"
            } else {
                tenant
            }),
            t(scope),
            t(&parts.join(", ")),
            t(&reasons.join("; ")),
            t(&fs[0].frozen_by),
            t(&fs[0].frozen_at),
        );
        let _ = write!(
            r,
            "<form class=\"inline\" method=\"post\" action=\"/console/freezes/unfreeze\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{}\"><input type=\"hidden\" name=\"tenant\" value=\"{}\">\
             <input type=\"hidden\" name=\"scope\" value=\"{}\">",
            t(&op.csrf),
            t(tenant),
            t(scope)
        );
        for p in &parts {
            let _ = write!(
                r,
                "<input type=\"hidden\" name=\"what\" value=\"{}\">",
                t(p)
            );
        }
        let _ = write!(
            r,
            "<label>Reason to unfreeze<input name=\"reason\" required maxlength=\"500\" aria-label=\"Reason to unfreeze {}\"></label>\
             <button type=\"submit\">Unfreeze</button></form></td></tr>",
            t(scope)
        );
        rows.push(r);
    }
    h.push_str(&table(
        Some("active-freezes"),
        "",
        &[
            "tenant", "scope", "parts", "reason", "by", "since", "unfreeze",
        ],
        &rows,
    ));
    h.push_str("<h2>History</h2>");
    let rows: Vec<String> = history
        .iter()
        .map(|f| {
            row(&[
                f.tenant.clone().unwrap_or_else(|| "every tenant".into()),
                f.scope.to_string(),
                f.what.as_str().to_owned(),
                f.reason.clone().unwrap_or_default(),
                format!("{} at {}", f.frozen_by, f.frozen_at),
                match (&f.unfrozen_by, &f.unfrozen_at) {
                    (Some(by), Some(at)) => format!("{by} at {at}"),
                    (None, Some(at)) => at.clone(),
                    _ => "active".into(),
                },
            ])
        })
        .collect();
    h.push_str(&table(
        Some("freeze-history"),
        "",
        &["tenant", "scope", "part", "reason", "frozen", "unfrozen"],
        &rows,
    ));
    ok("Freezes", &op, "Freezes", &h)
}

/// The freeze request a form describes (scope from `scope` or `scope_kind` + value).
fn freeze_request(form: &Form, op: &Operator) -> Result<FreezeRequest, String> {
    let tenant = form.value("tenant").map(str::to_owned);
    if let Some(t) = &tenant {
        TenantId::new(t.clone()).map_err(|e| format!("tenant: {e}"))?;
    }
    let scope: FreezeScope = match form.value("scope") {
        Some(s) => s.parse().map_err(|e: Error| e.to_string())?,
        None => match form.value("scope_kind").unwrap_or("user") {
            "all" => FreezeScope::All,
            kind => format!("{kind}:{}", form.get("scope_value").unwrap_or(""))
                .parse()
                .map_err(|e: Error| e.to_string())?,
        },
    };
    let what = FreezeWhat::parse_list(&form.all("what").join(",")).map_err(|e| e.to_string())?;
    Ok(FreezeRequest {
        tenant,
        scope,
        what,
        reason: Some(reason(form).map_err(str::to_owned)?),
        actor: Some(format!("console:{}", op.name)),
    })
}

pub(crate) async fn freeze(State(state): State<AppState>, op: Operator, body: Bytes) -> Response {
    change_freeze(state, op, body, true).await
}

pub(crate) async fn unfreeze(State(state): State<AppState>, op: Operator, body: Bytes) -> Response {
    change_freeze(state, op, body, false).await
}

async fn change_freeze(state: AppState, op: Operator, body: Bytes, freezing: bool) -> Response {
    let form = Form::parse(&body);
    if let Some(refused) = op.csrf_refusal(&form) {
        return refused;
    }
    let request = match freeze_request(&form, &op) {
        Ok(r) => r,
        Err(e) => return bad_request(&op, &e),
    };
    let db = state.orders.database();
    let changed = if freezing {
        freeze::apply_freeze(db, &request).await
    } else {
        freeze::apply_unfreeze(db, &request).await
    };
    let what: Vec<&str> = request.what.iter().map(|w| w.as_str()).collect();
    let target = format!(
        "tenant={} {} [{}]",
        request.tenant.as_deref().unwrap_or("*"),
        request.scope,
        what.join(",")
    );
    let action = if freezing { "freeze" } else { "unfreeze" };
    match changed {
        Ok(change) => {
            audit(
                &state,
                &op.name,
                action,
                &target,
                request.reason.as_deref(),
                &format!("{} row(s) changed", change.changed.len()),
            )
            .await;
            if let Err(e) = crate::api::refresh_state_gauges(db, &state.metrics).await {
                tracing::warn!(error = %e, "could not refresh the state gauges");
            }
            redirect("/console/freezes")
        }
        Err(e) => {
            audit(
                &state,
                &op.name,
                action,
                &target,
                request.reason.as_deref(),
                "failed",
            )
            .await;
            match e {
                Error::InvalidInput(m) => bad_request(&op, &m),
                e => failed(&e),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Leases

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

const LEASES_PAGE: usize = 100;

pub(crate) async fn leases(
    State(state): State<AppState>,
    op: Operator,
    Params(query): Params<LeasesQuery>,
) -> Response {
    shown(&op, "Leases", "Leases", leases_body(&state, &query).await)
}

async fn leases_body(state: &AppState, query: &LeasesQuery) -> Result<String, Error> {
    let leases = &state.console.leases;
    let after = match query.after.trim() {
        "" => None,
        a => Some(LeaseName::new(a).map_err(|e| Error::InvalidInput(e.to_string()))?),
    };
    let names = leases.names(after.as_ref(), LEASES_PAGE).await?;
    let mut h = String::from("<h1>Leases</h1><p class=\"muted\">Times by the store's clock. Rows with owner-mismatch releases, fenced rejections, rejected renewals, expiries or force-releases among their last 50 events are marked.</p>");
    let mut rows = Vec::new();
    for name in &names {
        let status = leases.show(name).await?;
        let events = leases.events(name, 50).await?;
        let alarms = events.iter().filter(|e| is_alarming(e.kind)).count();
        let class = if alarms > 0 { " class=\"alert\"" } else { "" };
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
        rows.push(format!(
            "<tr{class}><td><a href=\"/console/leases/{}\">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{alarms}</td></tr>",
            seg(name.as_str()),
            t(name.as_str()),
            t(&holder),
            t(&token),
            t(&left),
            t(&renewals)
        ));
    }
    h.push_str(&table(
        Some("leases"),
        "",
        &[
            "name",
            "holder",
            "token",
            "time left",
            "renewals",
            "alarms (last 50 events)",
        ],
        &rows,
    ));
    if names.len() == LEASES_PAGE {
        if let Some(last) = names.last() {
            let _ = write!(
                h,
                "<p><a href=\"/console/leases?after={}\">Next names</a></p>",
                q(last.as_str())
            );
        }
    }
    Ok(h)
}

pub(crate) async fn lease(
    State(state): State<AppState>,
    op: Operator,
    Path(name): Path<String>,
) -> Response {
    let Ok(name) = LeaseName::new(name) else {
        return bad_request(&op, "That is not a lease name.");
    };
    match lease_body(&state, &name).await {
        Ok(body) => ok(&format!("Lease {name}"), &op, "Leases", &body),
        Err(e) => failed(&e),
    }
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

async fn lease_body(state: &AppState, name: &LeaseName) -> Result<String, Error> {
    let leases = &state.console.leases;
    let status = leases.show(name).await?;
    let events = leases.events(name, 500).await?;
    let mut h = format!(
        "<h1>Lease <code>{}</code></h1><dl class=\"facts\">",
        t(name.as_str())
    );
    match &status.holder {
        Some(l) => {
            let _ = write!(
                h,
                "<dt>holder</dt><dd id=\"lease-holder\">{}</dd><dt>token</dt><dd>{}</dd><dt>acquired</dt><dd>{}</dd>\
                 <dt>time left</dt><dd>{:.1} s</dd><dt>renewals</dt><dd>{}</dd>",
                t(l.owner.as_str()),
                l.token.get(),
                t(&time(l.acquired_at)),
                (l.expires_at - status.now) as f64 / 1000.0,
                l.renewals
            );
        }
        None => h.push_str("<dt>holder</dt><dd id=\"lease-holder\">free</dd>"),
    }
    let _ = write!(
        h,
        "<dt>last token</dt><dd>{}</dd></dl>",
        status
            .last_token
            .map(|t| t.get().to_string())
            .unwrap_or("—".into())
    );
    let hs = holds(&events, status.now);
    if !hs.is_empty() {
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
        h.push_str("<h2>Hold time against the lease</h2>");
        h.push_str(&html::bar_chart(
            "Each hold's longest stretch between its grant, renewals and release, as a share of \
             its lease; at or past the 70 % line, or ended by expiry or force, in red",
            HOLD_WARN,
            "70 % of the lease",
            &bars,
        ));
    }
    let rows: Vec<String> = events
        .iter()
        .rev()
        .map(|e| {
            let class = if is_alarming(e.kind) { " class=\"alert\"" } else { "" };
            format!(
                "<tr{class}><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                t(&time(e.at)),
                t(e.kind.as_str()),
                t(e.owner.as_ref().map(|o| o.as_str()).unwrap_or("—")),
                e.token.map(|t| t.get().to_string()).unwrap_or_default(),
                t(&e.expires_at.map(time).unwrap_or_default()),
                t(e.detail.as_deref().unwrap_or(""))
            )
        })
        .collect();
    h.push_str("<h2>Evidence (newest first)</h2>");
    h.push_str(&table(
        Some("lease-events"),
        "",
        &["at", "event", "owner", "token", "lease until", "detail"],
        &rows,
    ));
    Ok(h)
}

// ---------------------------------------------------------------------------------------
// Audit

pub(crate) async fn audit_page(State(state): State<AppState>, op: Operator) -> Response {
    let rows = async {
        let mut conn = state.orders.database().acquire().await?;
        conn.conn()
            .all(sql(
                "SELECT at, operator, action, target, reason, outcome FROM console_audit \
                 ORDER BY at DESC, audit_id DESC LIMIT 200",
            ))
            .await
    }
    .await;
    let rows = match rows {
        Ok(r) => r,
        Err(e) => return failed(&e),
    };
    let cells: Result<Vec<String>, Error> = rows
        .iter()
        .map(|r| {
            Ok(row(&[
                time(r.int("at")?),
                r.text("operator")?,
                r.text("action")?,
                r.text("target")?,
                r.opt_text("reason")?.unwrap_or_default(),
                r.text("outcome")?,
            ]))
        })
        .collect();
    let cells = match cells {
        Ok(c) => c,
        Err(e) => return failed(&e),
    };
    let mut h = String::from("<h1>Audit</h1><p class=\"muted\">Every console action, newest first (the last 200). Freezes made with the CLI are in the freeze history.</p>");
    h.push_str(&table(
        Some("audit"),
        "",
        &["at", "operator", "action", "target", "reason", "outcome"],
        &cells,
    ));
    ok("Audit", &op, "Audit", &h)
}
