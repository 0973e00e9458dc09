//! The HTML page of the report: maud markup over the same helpers as the text.
//! Owns the page's layout and CSS; must not splice anything raw but that constant
//! CSS (ledger values are escaped by maud), nor load or run anything.

use maud::{html, Markup, PreEscaped, DOCTYPE};

use super::{action_summary, actions_of, cents, cluster_line, state_str};
use crate::reconcile::{Cluster, ReconcileReport};

/// Inlined as is: a constant with no `<`, and CSS inside `<style>` is raw text that
/// escaping would corrupt.
const CSS: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:2em;color:#222}\
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:2em}\
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}\
th{background:#f3f3f3}code{font-size:12px}.ok{color:#176b25;font-weight:bold}.fail{color:#b00020;font-weight:bold}\
.keeper{background:#eef8ee}.pending{color:#8a5a00}.applied{color:#176b25}.done{color:#555}\
.blocked,.failed{color:#b00020;font-weight:bold}.note{color:#555}";

/// Every value below comes from the ledgers or the command line and is escaped by
/// maud; only the constant CSS is spliced raw.
pub(in crate::reconcile) fn html(r: &ReconcileReport) -> String {
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { "idem reconcile " (r.run_id) }
                style { (PreEscaped(CSS)) }
            }
            body {
                (summary(r))
                @if let Some(why) = &r.refused {
                    p.fail { "Refused: " (why) }
                }
                @if !r.freeze_gaps.is_empty() {
                    (freeze_gaps(r))
                }
                @for (ci, c) in r.clusters.iter().enumerate() {
                    (cluster(r, ci, c))
                }
                (checks(r))
                p.note {
                    "Nothing was deleted: duplicates were cancelled and refunded through the order state machine, \
                     holds released under lease and fence, messages stopped through the consumers' processed keys."
                }
            }
        }
    };
    let mut out = page.into_string();
    out.push('\n');
    out
}

/// The heading, the run and its scope, and the totals table.
fn summary(r: &ReconcileReport) -> Markup {
    let t = &r.totals;
    let s = &r.scope;
    html! {
        h1 {
            "idem reconcile — " (r.mode) " — "
            @if r.passed {
                span.ok { "ledger check passed" }
            } @else {
                span.fail { "ledger check FAILED" }
            }
        }
        p.note {
            "run " code { (r.run_id) } " started " (r.started_at) " on " code { (r.database) }
            ", " (r.elapsed_ms) " ms. Scope: tenant " (s.tenant.as_deref().unwrap_or("any"))
            ", user " (s.user.as_deref().unwrap_or("any"))
            ", show " (s.show.as_deref().unwrap_or("any"))
            ", since " (s.since.as_deref().unwrap_or("-"))
            ", until " (s.until.as_deref().unwrap_or("-"))
            ", window " (s.window_ms / 1000) " s."
        }
        table {
            tr {
                th { "orders scanned" } th { "intents" } th { "clusters" } th { "cancels" }
                th { "refunds" } th { "money refunded" } th { "holds released" }
                th { "tickets released" } th { "messages stopped" } th { "pending" }
                th { "blocked" } th { "failed" } th { "applied by this run" }
            }
            tr {
                td { (t.orders_scanned) } td { (t.intents) } td { (t.clusters) } td { (t.cancels) }
                td { (t.refunds) } td { (cents(t.refund_cents)) } td { (t.released_holds) }
                td { (t.released_tickets) } td { (t.messages_stopped) } td { (t.pending) }
                td { (t.blocked) } td { (t.failed) } td { (r.applied) }
            }
        }
    }
}

fn freeze_gaps(r: &ReconcileReport) -> Markup {
    html! {
        h2 { "Not frozen" }
        table {
            tr { th { "tenant" } th { "user" } th { "show" } th { "missing" } th { "command" } }
            @for g in &r.freeze_gaps {
                @let missing: Vec<&str> = g.missing.iter().map(|w| w.as_str()).collect();
                tr {
                    td { (g.tenant) } td { (g.user_id) } td { (g.show_id) }
                    td { (missing.join(", ")) } td { code { (g.command) } }
                }
            }
        }
    }
}

fn cluster(r: &ReconcileReport, ci: usize, c: &Cluster) -> Markup {
    html! {
        h2 { "Cluster " (ci + 1) ": " (cluster_line(c)) }
        p {
            "Keeper " code { (c.keeper.as_deref().unwrap_or("none")) } ": " (c.keeper_reason) "."
            br;
            "Money refunded " (cents(c.refund_cents)) " (" (c.refunds) " refunds); stock released "
            (c.released_tickets) " tickets (" (c.released_holds) " holds); messages stopped "
            (c.messages_stopped) "; cancels " (c.cancels) "; pending " (c.pending) "."
        }
        table {
            tr {
                th { "order" } th { "created" } th { "status" } th { "charged" }
                th { "refunded" } th { "hold" } th { "actions" }
            }
            @for o in &c.orders {
                @let keeper = o.role == "keeper";
                // An optional attribute, not a class toggle: no empty `class=""` on duplicates.
                tr class=[keeper.then_some("keeper")] {
                    td { code { (o.order_id) } }
                    td { (o.created_at) } td { (o.status) } td { (cents(o.charged_cents)) }
                    td { (cents(o.refunded_cents)) } td { (o.hold.as_deref().unwrap_or("-")) }
                    td {
                        @if keeper { "keep" }
                        @for a in actions_of(r, ci, &o.order_id) {
                            @let state = state_str(a.state);
                            div class=(state.to_lowercase()) {
                                (action_summary(a)) " — " (state)
                                @if let Some(e) = &a.error { ": " (e) }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn checks(r: &ReconcileReport) -> Markup {
    html! {
        h2 { "Ledger check" }
        table {
            tr { th { "check" } th { "result" } th { "what it means" } th { "failures" } }
            @for c in &r.checks {
                tr {
                    td { (c.name) }
                    @if c.passed { td.ok { "passed" } } @else { td.fail { "FAILED" } }
                    td { (c.detail) }
                    td {
                        @for (i, f) in c.failures.iter().enumerate() {
                            @if i > 0 { br; }
                            (f)
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::freeze::FreezeWhat;
    use crate::reconcile::{
        Action, ActionKind, ActionState, Check, Cluster, ClusterOrder, FreezeGap, ReconcileReport,
        Scope, Totals,
    };

    /// The hostile value: markup, and every character HTML gives a meaning to.
    const EVIL: &str = "<script>alert(1)</script> & \"q\" 'a'";

    fn order(id: &str, role: &str) -> ClusterOrder {
        ClusterOrder {
            order_id: id.into(),
            role: role.into(),
            status: "paid".into(),
            created_at: "2026-12-03T20:14:00Z".into(),
            quantity: 2,
            amount_cents: 13_600,
            paid: true,
            hold: Some("h-1".into()),
            charged_cents: 13_600,
            refunded_cents: 0,
            messages: 1,
        }
    }

    fn sample() -> ReconcileReport {
        let mut dup = order("o-2", "duplicate");
        dup.hold = None;
        ReconcileReport {
            mode: "dry-run".into(),
            run_id: format!("run {EVIL}"),
            database: "postgres".into(),
            scope: Scope {
                tenant: Some("t-1".into()),
                user: Some(EVIL.into()),
                show: None,
                since: None,
                until: Some("2026-12-04".into()),
                window_ms: 2_000,
            },
            started_at: "2026-12-03T20:20:00Z".into(),
            elapsed_ms: 12,
            clusters: vec![Cluster {
                id: "c-1".into(),
                tenant: "t-1".into(),
                user_id: "U-1".into(),
                show_id: "S-204".into(),
                client_session: Some(EVIL.into()),
                first_at: "2026-12-03T20:14:00Z".into(),
                last_at: "2026-12-03T20:14:01Z".into(),
                span_ms: 1_200,
                keeper: Some("o-1".into()),
                keeper_reason: "earliest paid".into(),
                orders: vec![order("o-1", "keeper"), dup],
                refund_cents: 13_600,
                refunds: 1,
                released_holds: 0,
                released_tickets: 0,
                messages_stopped: 1,
                cancels: 1,
                pending: 2,
            }],
            actions: vec![
                Action {
                    cluster: 0,
                    order_id: "o-2".into(),
                    kind: ActionKind::Refund,
                    state: ActionState::Pending,
                    detail: "refund".into(),
                    amount_cents: Some(13_600),
                    provider_key: None,
                    quantity: None,
                    message_id: None,
                    topic: None,
                    error: None,
                },
                Action {
                    cluster: 0,
                    order_id: "o-2".into(),
                    kind: ActionKind::StopMessage,
                    state: ActionState::Failed,
                    detail: "stop".into(),
                    amount_cents: None,
                    provider_key: None,
                    quantity: None,
                    message_id: Some("m-1".into()),
                    topic: Some("order.paid".into()),
                    error: Some(EVIL.into()),
                },
            ],
            applied: 0,
            totals: Totals {
                orders_scanned: 10,
                intents: 9,
                clusters: 1,
                refund_cents: 13_600,
                refunds: 1,
                cancels: 1,
                pending: 2,
                failed: 1,
                ..Totals::default()
            },
            freeze_gaps: vec![FreezeGap {
                tenant: "t-1".into(),
                user_id: "U-1".into(),
                show_id: "S-204".into(),
                missing: vec![FreezeWhat::PaymentConfirm, FreezeWhat::Ticketing],
                command: format!("idem freeze --user {EVIL}"),
            }],
            refused: Some(EVIL.into()),
            forced: false,
            checks: vec![
                Check {
                    name: "one keeper".into(),
                    passed: true,
                    detail: "each cluster keeps one order".into(),
                    failures: vec![],
                },
                Check {
                    name: "refunds".into(),
                    passed: false,
                    detail: EVIL.into(),
                    failures: vec!["o-2 <b>".into(), "o-3 &".into()],
                },
            ],
            passed: false,
        }
    }

    #[test]
    fn a_hostile_value_is_escaped_wherever_it_lands() {
        const SAFE: &str = "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &quot;q&quot; 'a'";
        let html = super::html(&sample());
        assert!(html.starts_with("<!DOCTYPE html>") && html.ends_with("</html>\n"));
        assert!(!html.contains("<script"), "raw script tag in output");
        // Title and run id, scope user, cluster heading, action error, freeze command,
        // refusal, check detail.
        assert_eq!(html.matches(SAFE).count(), 8, "{html}");
        assert_eq!(html.matches(EVIL).count(), 0);
        assert!(html.contains("<td>o-2 &lt;b&gt;<br>o-3 &amp;</td>"));
        // The keeper row is marked; the duplicate has no empty class attribute.
        assert!(html.contains("<tr class=\"keeper\"><td><code>o-1</code>"));
        assert!(html.contains("<tr><td><code>o-2</code>"));
        assert!(html.contains("<div class=\"failed\">stop order.paid — FAILED: &lt;script&gt;"));
    }
}
