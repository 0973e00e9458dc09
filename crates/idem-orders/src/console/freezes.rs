//! The freeze switches page: freeze a scope, the active freezes with one unfreeze form
//! per scope, the history; and the active freezes on the overview. Changes go through
//! `crate::freeze` (as the CLI and the admin API do) and are audited.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use axum::Extension;
use idem_console::view::{row, table};
use idem_console::{
    audit, bad_request, failed, ok_page, reason, redirect, Console, Form, Operator, Params,
};
use idem_core::TenantId;
use maud::{html, Markup};
use serde::Deserialize;

use super::{console_error, OrdersConsole};
use crate::db::Database;
use crate::error::Error;
use crate::freeze::{self, Freeze, FreezeRequest, FreezeScope, FreezeWhat};

#[derive(Deserialize, Default)]
pub(super) struct FreezePrefill {
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    scope_kind: String,
    #[serde(default)]
    scope_value: String,
}

fn freeze_row(f: &Freeze) -> Markup {
    row(&[
        f.tenant.clone().unwrap_or_else(|| "every tenant".into()),
        f.scope.to_string(),
        f.what.as_str().to_owned(),
        f.reason.clone().unwrap_or_default(),
        f.frozen_by.clone(),
        f.frozen_at.clone(),
    ])
}

/// The overview's section: the active freezes.
pub(super) async fn overview(db: &Database) -> Result<Markup, Error> {
    let active = freeze::active_freezes(db).await?;
    let rows: Vec<Markup> = active.iter().map(freeze_row).collect();
    Ok(html! {
        h2 { "Active freezes" }
        p id="freeze-count" {
            (active.len()) " active (" a href="/console/freezes" { "freeze switches" } ")"
        }
        @if !rows.is_empty() {
            (table(None, "", &["tenant", "scope", "part", "reason", "by", "since"], &rows))
        }
    })
}

fn freeze_form(op: &Operator, prefill: &FreezePrefill) -> Markup {
    html! {
        h2 { "Freeze a scope" }
        form class="stack" method="post" action="/console/freezes" aria-label="Freeze a scope" {
            input type="hidden" name="csrf" value=(op.csrf);
            div class="field" {
                label for="f-tenant" { "Tenant" }
                input id="f-tenant" name="tenant" value=(prefill.tenant) maxlength="128"
                    placeholder="empty: every tenant";
            }
            div class="field" {
                label for="f-kind" { "Scope" }
                select id="f-kind" name="scope_kind" {
                    @for kind in ["user", "show", "all"] {
                        option value=(kind) selected[kind == prefill.scope_kind] { (kind) }
                    }
                }
            }
            div class="field" {
                label for="f-value" { "Value" }
                input id="f-value" name="scope_value" value=(prefill.scope_value) maxlength="128"
                    placeholder="the user or show id";
            }
            fieldset {
                legend { "Parts of the automatic chain" }
                @for w in FreezeWhat::ALL {
                    label class="check" {
                        input type="checkbox" name="what" value=(w.as_str()) checked;
                        " " (w.as_str())
                    }
                }
            }
            div class="field" {
                label for="f-reason" { "Reason" }
                input id="f-reason" name="reason" required maxlength="500";
            }
            button type="submit" { "Freeze" }
        }
    }
}

/// The active freezes, one unfreeze form per scope.
fn active_table(op: &Operator, active: &[Freeze]) -> Markup {
    let mut groups: BTreeMap<(String, String), Vec<&Freeze>> = BTreeMap::new();
    for f in active {
        groups
            .entry((f.tenant.clone().unwrap_or_default(), f.scope.to_string()))
            .or_default()
            .push(f);
    }
    let rows: Vec<Markup> = groups
        .iter()
        .map(|((tenant, scope), fs)| {
            let parts: Vec<&str> = fs.iter().map(|f| f.what.as_str()).collect();
            let reasons: Vec<String> = fs.iter().filter_map(|f| f.reason.clone()).collect();
            html! {
                tr {
                    td { (if tenant.is_empty() { "every tenant" } else { tenant })}
                    td { (scope) }
                    td { (parts.join(", ")) }
                    td { (reasons.join("; ")) }
                    td { (fs[0].frozen_by) }
                    td { (fs[0].frozen_at) }
                    td {
                        form class="inline" method="post" action="/console/freezes/unfreeze" {
                            input type="hidden" name="csrf" value=(op.csrf);
                            input type="hidden" name="tenant" value=(tenant);
                            input type="hidden" name="scope" value=(scope);
                            @for p in &parts { input type="hidden" name="what" value=(p); }
                            label {
                                "Reason to unfreeze"
                                input name="reason" required maxlength="500"
                                    aria-label=(format!("Reason to unfreeze {scope}"));
                            }
                            button type="submit" { "Unfreeze" }
                        }
                    }
                }
            }
        })
        .collect();
    let head = [
        "tenant", "scope", "parts", "reason", "by", "since", "unfreeze",
    ];
    table(Some("active-freezes"), "", &head, &rows)
}

pub(super) async fn page(
    Extension(orders): Extension<Arc<OrdersConsole>>,
    op: Operator,
    Params(prefill): Params<FreezePrefill>,
) -> Response {
    let db = &orders.db;
    let (active, history) = match (
        freeze::active_freezes(db).await,
        freeze::freeze_history(db).await,
    ) {
        (Ok(a), Ok(h)) => (a, h),
        (Err(e), _) | (_, Err(e)) => return failed(&console_error(e)),
    };
    let history: Vec<Markup> = history
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
    let head = ["tenant", "scope", "part", "reason", "frozen", "unfrozen"];
    let body = html! {
        h1 { "Freeze switches" }
        (freeze_form(&op, &prefill))
        h2 { "Active" }
        (active_table(&op, &active))
        h2 { "History" }
        (table(Some("freeze-history"), "", &head, &history))
    };
    ok_page(&op, "Freezes", "Freezes", body)
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

pub(super) async fn freeze(
    State(console): State<Console>,
    Extension(orders): Extension<Arc<OrdersConsole>>,
    op: Operator,
    body: Bytes,
) -> Response {
    change(&console, &orders, op, body, true).await
}

pub(super) async fn unfreeze(
    State(console): State<Console>,
    Extension(orders): Extension<Arc<OrdersConsole>>,
    op: Operator,
    body: Bytes,
) -> Response {
    change(&console, &orders, op, body, false).await
}

async fn change(
    console: &Console,
    orders: &OrdersConsole,
    op: Operator,
    body: Bytes,
    freezing: bool,
) -> Response {
    let form = Form::parse(&body);
    if let Some(refused) = op.csrf_refusal(&form) {
        return refused;
    }
    let request = match freeze_request(&form, &op) {
        Ok(r) => r,
        Err(e) => return bad_request(&op, &e),
    };
    let db = &orders.db;
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
    let why = request.reason.as_deref();
    match changed {
        Ok(change) => {
            let outcome = format!("{} row(s) changed", change.changed.len());
            audit(console, &op.name, action, &target, why, &outcome).await;
            if let Err(e) = crate::api::refresh_state_gauges(db, &orders.metrics).await {
                tracing::warn!(error = %e, "could not refresh the state gauges");
            }
            redirect("/console/freezes")
        }
        Err(e) => {
            audit(console, &op.name, action, &target, why, "failed").await;
            match e {
                Error::InvalidInput(m) => bad_request(&op, &m),
                e => failed(&console_error(e)),
            }
        }
    }
}
