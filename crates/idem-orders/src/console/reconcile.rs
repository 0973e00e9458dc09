//! Duplicates and reconciliation: the dry run of a scope (clusters, keeper, plan, ledger
//! checks, freeze gaps) and applying it, which needs a reason, the confirmation and a
//! frozen chain. Runs `crate::reconcile` as the CLI does; applying is audited.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use axum::Extension;
use idem_console::view::{q, table};
use idem_console::{audit, bad_request, failed, ok_page, reason, Console, Form, Operator, Params};
use maud::{html, Markup};
use serde::Deserialize;

use super::{console_error, OrdersConsole};
use crate::error::Error;
use crate::reconcile::{self, ReconcileOptions, ReconcileReport};

#[derive(Deserialize, Default, Clone)]
pub(super) struct ScopeQuery {
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

    fn fields(&self) -> [(&'static str, &String); 5] {
        [
            ("tenant", &self.tenant),
            ("user", &self.user),
            ("show", &self.show),
            ("since", &self.since),
            ("until", &self.until),
        ]
    }

    fn is_empty(&self) -> bool {
        self.fields().iter().all(|(_, s)| s.trim().is_empty())
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
        for (what, v) in &self.fields()[..3] {
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
}

fn scope_form(s: &ScopeQuery) -> Markup {
    let fields = [
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
    ];
    html! {
        form class="inline" method="get" action="/console/reconcile" aria-label="Scope" {
            @for (n, label, v, hint) in fields {
                div class="field" {
                    label for=(format!("r-{n}")) { (label) }
                    input id=(format!("r-{n}")) name=(n) value=(v) placeholder=(hint) maxlength="128";
                }
            }
            button type="submit" { "Run the dry run" }
        }
    }
}

pub(super) async fn page(
    Extension(orders): Extension<Arc<OrdersConsole>>,
    op: Operator,
    Params(scope): Params<ScopeQuery>,
) -> Response {
    if scope.is_empty() {
        let body = html! {
            h1 { "Duplicates and reconciliation" }
            (scope_form(&scope))
            p class="muted" {
                "Pick a scope (a tenant at least, usually a user or a show) and run the dry run: \
                 it writes nothing."
            }
        };
        return ok_page(&op, "Reconcile", "Reconcile", body);
    }
    let options = match scope.options(&format!("console:{}", op.name)) {
        Ok(o) => o,
        Err(e) => return bad_request(&op, &e),
    };
    match run(orders.db.clone(), options).await {
        Ok(report) => {
            let body = html! {
                h1 { "Duplicates and reconciliation" }
                (scope_form(&scope))
                (report_body(&report, &scope, &op, false))
            };
            ok_page(&op, "Reconcile", "Reconcile", body)
        }
        Err(e) => failed(&console_error(e)),
    }
}

pub(super) async fn apply(
    State(console): State<Console>,
    Extension(orders): Extension<Arc<OrdersConsole>>,
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
    let (name, action, why) = (&op.name, "reconcile-apply", Some(why.as_str()));
    match run(orders.db.clone(), options).await {
        Ok(report) => {
            let outcome = match &report.refused {
                Some(why) => format!("refused: {why}"),
                None => format!(
                    "applied {} action(s); checks {}",
                    report.applied,
                    if report.passed { "passed" } else { "failed" }
                ),
            };
            audit(&console, name, action, &target, why, &outcome).await;
            let body = html! {
                h1 { "Duplicates and reconciliation" }
                (scope_form(&scope))
                (report_body(&report, &scope, &op, true))
            };
            ok_page(&op, "Reconcile", "Reconcile", body)
        }
        Err(e) => {
            audit(&console, name, action, &target, why, "failed").await;
            failed(&console_error(e))
        }
    }
}

/// Runs a reconciliation for a page. Its future is not `Send` (the compiler cannot prove
/// it for some of its closures), so it runs on a blocking thread of its own.
async fn run(db: crate::db::Database, options: ReconcileOptions) -> Result<ReconcileReport, Error> {
    let handle = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || handle.block_on(reconcile::reconcile(&db, &options)))
        .await
        .map_err(|e| Error::Backend(format!("reconciliation task: {e}")))?
}

fn card(label: &str, value: String, bad: bool) -> Markup {
    html! {
        div class=(if bad { "card bad" } else { "card" }) { div { (label) } div class="n" { (value) } }
    }
}

fn cluster_section(i: usize, c: &reconcile::Cluster) -> Markup {
    let rows: Vec<Markup> = c
        .orders
        .iter()
        .map(|o| {
            let money = format!(
                "{:.2} / {:.2}",
                o.charged_cents as f64 / 100.0,
                o.refunded_cents as f64 / 100.0
            );
            html! {
                tr class=[(o.role == "keeper").then_some("keeper")] {
                    td { a href=(format!("/console/search?by=order&q={}", q(&o.order_id))) { code { (o.order_id) } } }
                    td { (o.role) } td { (o.status) } td { (o.created_at) }
                    td { (if o.paid { "yes" } else { "no" }) }
                    td { (o.hold.as_deref().unwrap_or("—")) } td { (o.messages) } td { (money) }
                }
            }
        })
        .collect();
    let head = [
        "order",
        "role",
        "status",
        "created",
        "paid",
        "hold",
        "messages",
        "charged / refunded",
    ];
    let id = format!("cluster-{i}");
    html! {
        section class="cluster" aria-labelledby=(id) {
            h3 id=(id) {
                "Cluster " (i + 1) ": user " code { (c.user_id) } ", show " code { (c.show_id) }
                ", " (c.orders.len()) " orders in " (c.span_ms) " ms"
            }
            p class="keeper" {
                "Keeper: " code { (c.keeper.as_deref().unwrap_or("none")) } " — " (c.keeper_reason)
            }
            (cluster_chart(c))
            (table(None, "cluster-orders", &head, &rows))
        }
    }
}

fn report_body(r: &ReconcileReport, scope: &ScopeQuery, op: &Operator, applied: bool) -> Markup {
    let tot = &r.totals;
    let actions: Vec<Markup> = r
        .actions
        .iter()
        .map(|a| {
            let alert = matches!(
                a.state,
                reconcile::ActionState::Blocked | reconcile::ActionState::Failed
            );
            let what = match &a.error {
                Some(e) => format!("{} ({e})", a.detail),
                None => a.detail.clone(),
            };
            html! {
                tr class=[alert.then_some("alert")] {
                    td { (a.cluster + 1) } td { code { (a.order_id) } } td { (a.kind.as_str()) }
                    td { (format!("{:?}", a.state).to_lowercase()) } td { (what) }
                }
            }
        })
        .collect();
    let disabled = !r.freeze_gaps.is_empty();
    html! {
        h2 { @if applied { "Applied: " (r.applied) " action(s)" } @else { "Dry run (nothing written)" } }
        div class="cards" id="totals" {
            (card("orders scanned", tot.orders_scanned.to_string(), false))
            (card("intents", tot.intents.to_string(), false))
            (card("duplicate clusters", tot.clusters.to_string(), tot.clusters > 0))
            (card("cancels / refunds", format!("{} / {}", tot.cancels, tot.refunds), false))
            (card("refund total", format!("{:.2}", tot.refund_cents as f64 / 100.0), false))
            (card("pending actions", tot.pending.to_string(), false))
        }
        @if let Some(why) = &r.refused { p role="alert" { "Not applied: " (why) } }
        @for (i, c) in r.clusters.iter().enumerate() { (cluster_section(i, c)) }
        h2 { "Plan" }
        (table(Some("plan"), "", &["cluster", "order", "action", "state", "what it does"], &actions))
        h2 { "Ledger checks" }
        ul id="checks" {
            @for c in &r.checks {
                li {
                    span class=(if c.passed { "ok" } else { "bad" }) { (if c.passed { "passed" } else { "FAILED" }) }
                    " " (c.name) " — " (c.detail)
                    @if !c.failures.is_empty() { ": " (c.failures.join("; ")) }
                }
            }
        }
        @if !r.freeze_gaps.is_empty() {
            h2 { "Freeze first" }
            p class="note" {
                "Applying is refused while the automatic chain of a cluster's scope is not frozen \
                 (as with " code { "idem reconcile --apply" } ")."
            }
            ul id="freeze-gaps" {
                @for g in &r.freeze_gaps {
                    @let missing: Vec<&str> = g.missing.iter().map(|w| w.as_str()).collect();
                    li {
                        "tenant " code { (g.tenant) } ", user " code { (g.user_id) } ": " (missing.join(", ")) " — "
                        a href=(format!("/console/freezes?tenant={}&scope_kind=user&scope_value={}", q(&g.tenant), q(&g.user_id))) { "freeze it" }
                    }
                }
            }
        }
        @if tot.pending > 0 {
            h2 { "Apply" }
            form class="stack" method="post" action="/console/reconcile" {
                input type="hidden" name="csrf" value=(op.csrf);
                @for (n, v) in scope.fields() { input type="hidden" name=(n) value=(v); }
                div class="field" {
                    label for="apply-reason" { "Reason" }
                    input id="apply-reason" name="reason" required maxlength="500" disabled[disabled];
                }
                label class="check" {
                    input type="checkbox" name="confirm" value="yes" required disabled[disabled];
                    " I have read the plan: cancel, refund and release as listed"
                }
                button type="submit" class="danger" disabled[disabled] { "Apply the plan" }
            }
        }
    }
}

/// The cluster's orders on a time line: when each arrived, the keeper marked.
fn cluster_chart(c: &reconcile::Cluster) -> Markup {
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
        return html! {};
    };
    let span = (times.iter().map(|x| x.0).max().unwrap_or(first) - first).max(1) as f64;
    let (w, hgt, pad) = (640.0_f64, 90.0_f64, 24.0_f64);
    let f1 = |v: f64| format!("{v:.1}");
    html! {
        figure class="chart" {
            svg viewBox=(format!("0 0 {w} {hgt}")) role="img" aria-label="Orders of this cluster over time" {
                line class="axis" x1=(pad) y1="50" x2=(w - pad) y2="50" {}
                @for (i, (ms, keeper)) in times.iter().enumerate() {
                    @let x = pad + (*ms - first) as f64 / span * (w - 2.0 * pad);
                    @let y = 50.0 - ((i % 3) as f64) * 10.0;
                    circle class=(if *keeper { "dot keeper" } else { "dot duplicate" }) cx=(f1(x)) cy=(f1(y)) r="6" {
                        title { "+" (ms - first) " ms" @if *keeper { " (keeper)" } }
                    }
                }
                text class="tick" x=(pad) y="80" { "0 ms" }
                text class="tick" x=(w - pad - 60.0) y="80" { "+" (span as i64) " ms" }
            }
            figcaption {
                "Orders over time: " span class="key replayed" { "keeper" } ", "
                span class="key mismatch" { "duplicates" } "."
            }
        }
    }
}
