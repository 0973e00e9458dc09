//! The report for people: terminal tables, and a self-contained HTML page (inline CSS,
//! no scripts, no external assets) an operator attaches to the incident.
//!
//! Rendering only: it decides nothing and changes no ledger. The text is here; the
//! page is in [`page`], maud markup that escapes every value it is given.

use std::fmt::Write as _;

use super::{Action, ActionKind, ActionState, Cluster, ReconcileReport};

mod page;

pub(super) use page::html;

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

#[cfg(test)]
mod tests {
    #[test]
    fn cents() {
        assert_eq!(super::cents(136_000), "1360.00");
        assert_eq!(super::cents(5), "0.05");
    }
}
