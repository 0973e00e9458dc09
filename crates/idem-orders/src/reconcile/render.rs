//! The report for people: terminal tables, and a self-contained HTML page (inline CSS,
//! no scripts, no external assets) an operator attaches to the incident.

use std::fmt::Write as _;

use super::{Action, ActionKind, ActionState, Cluster, ReconcileReport};

fn state_str(s: ActionState) -> &'static str {
    match s {
        ActionState::Pending => "pending",
        ActionState::Done => "done",
        ActionState::Applied => "applied",
        ActionState::Blocked => "BLOCKED",
        ActionState::Failed => "FAILED",
    }
}

fn cents(c: i64) -> String {
    format!("{}.{:02}", c / 100, (c % 100).abs())
}

fn actions_of<'a>(
    r: &'a ReconcileReport,
    ci: usize,
    order: &'a str,
) -> impl Iterator<Item = &'a Action> {
    r.actions
        .iter()
        .filter(move |a| a.cluster == ci && a.order_id == order)
}

fn action_summary(a: &Action) -> String {
    match a.kind {
        ActionKind::StopMessage => format!("stop {}", a.topic.as_deref().unwrap_or("message")),
        ActionKind::Refund => format!("refund {}", cents(a.amount_cents.unwrap_or(0))),
        ActionKind::Cancel => "cancel".into(),
        ActionKind::Release => format!("release {}", a.quantity.unwrap_or(0)),
    }
}

fn cluster_line(c: &Cluster) -> String {
    format!(
        "tenant {}, user {}, show {}, session {}, {} orders within {:.1} s",
        c.tenant,
        c.user_id,
        c.show_id,
        c.client_session.as_deref().unwrap_or("(none)"),
        c.orders.len(),
        c.span_ms as f64 / 1000.0
    )
}

pub(super) fn text(r: &ReconcileReport) -> String {
    let mut out = String::new();
    let t = &r.totals;
    let _ = writeln!(
        out,
        "idem reconcile ({}) on {}: {} orders scanned, {} intents, {} duplicate cluster(s); window {} s",
        r.mode,
        r.database,
        t.orders_scanned,
        t.intents,
        t.clusters,
        r.scope.window_ms / 1000
    );
    for (ci, c) in r.clusters.iter().enumerate() {
        let _ = writeln!(out, "\ncluster {}: {}", ci + 1, cluster_line(c));
        match &c.keeper {
            Some(k) => {
                let _ = writeln!(out, "  keeper {k}: {}", c.keeper_reason);
            }
            None => {
                let _ = writeln!(out, "  no keeper: {}", c.keeper_reason);
            }
        }
        let _ = writeln!(
            out,
            "  {:<36} {:<16} {:<9} {:<9} actions",
            "order", "status", "paid", "hold"
        );
        for o in &c.orders {
            let acts: Vec<String> = actions_of(r, ci, &o.order_id)
                .map(|a| format!("{} [{}]", action_summary(a), state_str(a.state)))
                .collect();
            let acts = if o.role == "keeper" {
                "keep".to_owned()
            } else {
                acts.join(", ")
            };
            let _ = writeln!(
                out,
                "  {:<36} {:<16} {:<9} {:<9} {acts}",
                o.order_id,
                o.status,
                if o.paid {
                    cents(o.charged_cents)
                } else {
                    "-".into()
                },
                o.hold.as_deref().unwrap_or("-"),
            );
        }
        let _ = writeln!(
            out,
            "  money refunded: {} ({} refund(s)); stock released: {} tickets ({} hold(s)); messages stopped: {}; cancels: {}; pending: {}",
            cents(c.refund_cents),
            c.refunds,
            c.released_tickets,
            c.released_holds,
            c.messages_stopped,
            c.cancels,
            c.pending
        );
        for a in r
            .actions
            .iter()
            .filter(|a| a.cluster == ci && a.error.is_some())
        {
            let _ = writeln!(
                out,
                "  ! {} {}: {}",
                a.kind.as_str(),
                a.order_id,
                a.error.as_deref().unwrap_or("")
            );
        }
    }
    let _ = writeln!(
        out,
        "\ntotal: {} cancel(s), {} refund(s) ({}), {} hold(s) released ({} tickets), {} message(s) stopped; {} pending, {} blocked, {} failed; applied by this run: {}",
        t.cancels,
        t.refunds,
        cents(t.refund_cents),
        t.released_holds,
        t.released_tickets,
        t.messages_stopped,
        t.pending,
        t.blocked,
        t.failed,
        r.applied
    );
    if !r.freeze_gaps.is_empty() {
        let _ = writeln!(out, "\nthe automatic chain is not frozen for:");
        for g in &r.freeze_gaps {
            let missing: Vec<&str> = g.missing.iter().map(|w| w.as_str()).collect();
            let _ = writeln!(
                out,
                "  tenant {} user {} show {} (missing: {})\n    {}",
                g.tenant,
                g.user_id,
                g.show_id,
                missing.join(", "),
                g.command
            );
        }
    }
    if let Some(why) = &r.refused {
        let _ = writeln!(out, "\nREFUSED: {why}");
    } else if r.forced {
        let _ = writeln!(out, "\napplied with --force while the chain was not frozen");
    }
    let _ = writeln!(out, "\nledger check:");
    for c in &r.checks {
        let _ = writeln!(
            out,
            "  [{}] {}: {}",
            if c.passed { "ok" } else { "FAIL" },
            c.name,
            c.detail
        );
        for f in &c.failures {
            let _ = writeln!(out, "      {f}");
        }
    }
    if r.mode == "dry-run" && t.pending > 0 {
        let _ = writeln!(
            out,
            "\ndry run: nothing was changed. Freeze the scope, then rerun with --apply."
        );
    }
    out
}

fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const CSS: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:2em;color:#222}\
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:2em}\
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}\
th{background:#f3f3f3}code{font-size:12px}.ok{color:#176b25;font-weight:bold}.fail{color:#b00020;font-weight:bold}\
.keeper{background:#eef8ee}.pending{color:#8a5a00}.applied{color:#176b25}.done{color:#555}\
.blocked,.failed{color:#b00020;font-weight:bold}.note{color:#555}";

pub(super) fn html(r: &ReconcileReport) -> String {
    let t = &r.totals;
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>idem reconcile {}</title><style>{CSS}</style></head><body>",
        esc(&r.run_id)
    );
    let _ = write!(
        h,
        "<h1>idem reconcile — {} — {}</h1><p class=\"note\">run <code>{}</code> started {} on <code>{}</code>, {} ms. Scope: tenant {}, user {}, show {}, since {}, until {}, window {} s.</p>",
        esc(&r.mode),
        if r.passed { "<span class=\"ok\">ledger check passed</span>" } else { "<span class=\"fail\">ledger check FAILED</span>" },
        esc(&r.run_id),
        esc(&r.started_at),
        esc(&r.database),
        r.elapsed_ms,
        esc(r.scope.tenant.as_deref().unwrap_or("any")),
        esc(r.scope.user.as_deref().unwrap_or("any")),
        esc(r.scope.show.as_deref().unwrap_or("any")),
        esc(r.scope.since.as_deref().unwrap_or("-")),
        esc(r.scope.until.as_deref().unwrap_or("-")),
        r.scope.window_ms / 1000
    );
    let _ = write!(
        h,
        "<table><tr><th>orders scanned</th><th>intents</th><th>clusters</th><th>cancels</th><th>refunds</th><th>money refunded</th><th>holds released</th><th>tickets released</th><th>messages stopped</th><th>pending</th><th>blocked</th><th>failed</th><th>applied by this run</th></tr>\
         <tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr></table>",
        t.orders_scanned, t.intents, t.clusters, t.cancels, t.refunds, cents(t.refund_cents),
        t.released_holds, t.released_tickets, t.messages_stopped, t.pending, t.blocked, t.failed, r.applied
    );
    if let Some(why) = &r.refused {
        let _ = write!(h, "<p class=\"fail\">Refused: {}</p>", esc(why));
    }
    if !r.freeze_gaps.is_empty() {
        h.push_str("<h2>Not frozen</h2><table><tr><th>tenant</th><th>user</th><th>show</th><th>missing</th><th>command</th></tr>");
        for g in &r.freeze_gaps {
            let missing: Vec<&str> = g.missing.iter().map(|w| w.as_str()).collect();
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
                esc(&g.tenant),
                esc(&g.user_id),
                esc(&g.show_id),
                esc(&missing.join(", ")),
                esc(&g.command)
            );
        }
        h.push_str("</table>");
    }
    for (ci, c) in r.clusters.iter().enumerate() {
        let _ = write!(
            h,
            "<h2>Cluster {}: {}</h2><p>Keeper <code>{}</code>: {}.<br>Money refunded {} ({} refunds); stock released {} tickets ({} holds); messages stopped {}; cancels {}; pending {}.</p>",
            ci + 1,
            esc(&cluster_line(c)),
            esc(c.keeper.as_deref().unwrap_or("none")),
            esc(&c.keeper_reason),
            cents(c.refund_cents),
            c.refunds,
            c.released_tickets,
            c.released_holds,
            c.messages_stopped,
            c.cancels,
            c.pending
        );
        h.push_str("<table><tr><th>order</th><th>created</th><th>status</th><th>charged</th><th>refunded</th><th>hold</th><th>actions</th></tr>");
        for o in &c.orders {
            let mut acts = String::new();
            if o.role == "keeper" {
                acts.push_str("keep");
            }
            for a in actions_of(r, ci, &o.order_id) {
                let state = state_str(a.state);
                let _ = write!(
                    acts,
                    "<div class=\"{}\">{} — {}{}</div>",
                    state.to_lowercase(),
                    esc(&action_summary(a)),
                    esc(state),
                    a.error
                        .as_deref()
                        .map(|e| format!(": {}", esc(e)))
                        .unwrap_or_default()
                );
            }
            let _ = write!(
                h,
                "<tr{}><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                if o.role == "keeper" { " class=\"keeper\"" } else { "" },
                esc(&o.order_id),
                esc(&o.created_at),
                esc(&o.status),
                cents(o.charged_cents),
                cents(o.refunded_cents),
                esc(o.hold.as_deref().unwrap_or("-")),
                acts
            );
        }
        h.push_str("</table>");
    }
    h.push_str("<h2>Ledger check</h2><table><tr><th>check</th><th>result</th><th>what it means</th><th>failures</th></tr>");
    for c in &r.checks {
        let _ = write!(
            h,
            "<tr><td>{}</td><td class=\"{}\">{}</td><td>{}</td><td>{}</td></tr>",
            esc(&c.name),
            if c.passed { "ok" } else { "fail" },
            if c.passed { "passed" } else { "FAILED" },
            esc(&c.detail),
            c.failures
                .iter()
                .map(|f| esc(f))
                .collect::<Vec<_>>()
                .join("<br>")
        );
    }
    h.push_str("</table><p class=\"note\">Nothing was deleted: duplicates were cancelled and refunded through the order state machine, holds released under lease and fence, messages stopped through the consumers' processed keys.</p></body></html>\n");
    h
}

#[cfg(test)]
mod tests {
    #[test]
    fn escapes() {
        assert_eq!(
            super::esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
        assert_eq!(super::cents(136_000), "1360.00");
        assert_eq!(super::cents(5), "0.05");
    }
}
