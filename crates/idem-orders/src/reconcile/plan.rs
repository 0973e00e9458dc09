//! The plan for one cluster: which order to keep and why, and what to do with every other
//! one. Pure: no I/O, no clock.

use crate::machine::OrderStatus;
use crate::service::refund_key;
use crate::views::rfc3339;

use super::scan::{Facts, STOPPABLE};
use super::{Action, ActionKind, ActionState, Cluster, ClusterOrder};

pub(crate) const KEEP_PAID: &str = "earliest order that is paid and holds an inventory voucher";
pub(crate) const KEEP_HELD: &str = "no order is paid: earliest order holding an inventory voucher";
pub(crate) const KEEP_FIRST: &str = "no order is paid or holds a voucher: the earliest order";

/// The keeper an earlier run recorded in a duplicate mark (`duplicate of ID: …`).
pub(crate) fn marked_keeper(mark: &str) -> Option<&str> {
    mark.strip_prefix("duplicate of ")?
        .split([':', ' '])
        .next()
        .filter(|s| !s.is_empty())
}

/// The keeper (index into `facts`) and why. Orders already marked as duplicates are
/// never kept, so a rerun keeps the same order however far the last run got.
pub(crate) fn choose_keeper(facts: &[Facts]) -> (Option<usize>, String) {
    let candidates: Vec<usize> = (0..facts.len())
        .filter(|&i| facts[i].order.mark.is_none() && facts[i].order.is_live())
        .collect();
    let first =
        |pred: &dyn Fn(&Facts) -> bool| candidates.iter().copied().find(|&i| pred(&facts[i]));
    if let Some(i) = first(&|f| f.order.status.is_paid() && f.order.holds_voucher()) {
        return (Some(i), KEEP_PAID.into());
    }
    if let Some(i) = first(&|f| f.order.holds_voucher()) {
        return (Some(i), KEEP_HELD.into());
    }
    if let Some(&i) = candidates.first() {
        return (Some(i), KEEP_FIRST.into());
    }
    let earlier = facts
        .iter()
        .find_map(|f| f.order.mark.as_deref().and_then(marked_keeper))
        .unwrap_or("?");
    (
        None,
        format!("no live order left to keep; an earlier run kept {earlier}"),
    )
}

/// The cluster as reported, and its actions in the order they run: per duplicate, stop
/// its messages first (so no consumer acts on it meanwhile), then refund, cancel and
/// release.
pub(crate) fn plan(index: usize, facts: &[Facts]) -> (Cluster, Vec<Action>) {
    let (keeper, keeper_reason) = choose_keeper(facts);
    let mut actions = Vec::new();
    let mut orders = Vec::new();
    for (i, f) in facts.iter().enumerate() {
        let o = &f.order;
        let is_keeper = Some(i) == keeper;
        orders.push(ClusterOrder {
            order_id: o.order_id.clone(),
            role: if is_keeper { "keeper" } else { "duplicate" }.into(),
            status: o.status.as_str().into(),
            created_at: rfc3339(o.created_at),
            quantity: o.quantity,
            amount_cents: o.amount_cents,
            paid: f.is_paid(),
            hold: o.hold.clone(),
            charged_cents: f.charged_cents.unwrap_or(0),
            refunded_cents: f.refunded_cents.unwrap_or(0),
            messages: f.messages.len(),
        });
        if is_keeper {
            continue;
        }
        let ticketed = o.status == OrderStatus::Ticketed;
        let action = |kind: ActionKind, state: ActionState, detail: String| Action {
            cluster: index,
            order_id: o.order_id.clone(),
            kind,
            state,
            detail,
            amount_cents: None,
            provider_key: None,
            quantity: None,
            message_id: None,
            topic: None,
            error: None,
        };
        let blocked_or = |state: ActionState| {
            if ticketed {
                ActionState::Blocked
            } else {
                state
            }
        };
        for m in f
            .messages
            .iter()
            .filter(|m| STOPPABLE.contains(&m.topic.as_str()))
        {
            let state = if m.stopped {
                ActionState::Done
            } else {
                ActionState::Pending
            };
            let where_ = if m.published {
                "published"
            } else {
                "still queued"
            };
            let mut a = action(
                ActionKind::StopMessage,
                state,
                format!(
                    "stop {} ({where_}): its consumers ack it as a duplicate",
                    m.topic
                ),
            );
            a.message_id = Some(m.message_id.clone());
            a.topic = Some(m.topic.clone());
            actions.push(a);
        }
        if let Some(cents) = f.charged_cents {
            let state = if f.refunded_cents.is_some() {
                ActionState::Done
            } else {
                blocked_or(ActionState::Pending)
            };
            let key = refund_key(&o.order_id);
            let mut a = action(
                ActionKind::Refund,
                state,
                format!("refund {cents} cents through the provider under {key}"),
            );
            a.amount_cents = Some(cents);
            a.provider_key = Some(key);
            actions.push(a);
        }
        let state = match o.status {
            OrderStatus::Cancelled => ActionState::Done,
            _ => blocked_or(ActionState::Pending),
        };
        let path = match o.status {
            OrderStatus::PendingPayment if f.charged_cents.is_none() => {
                "pending_payment → cancelled"
            }
            OrderStatus::Cancelled => "cancelled",
            OrderStatus::Ticketed => {
                "ticketed: the machine has no cancel edge; void the ticket by hand"
            }
            _ => "→ refund_pending → refunded → cancelled",
        };
        actions.push(action(
            ActionKind::Cancel,
            state,
            format!("cancel ({path})"),
        ));
        if let Some(hold) = &o.hold {
            let state = if hold == "released" {
                ActionState::Done
            } else {
                blocked_or(ActionState::Pending)
            };
            let mut a = action(
                ActionKind::Release,
                state,
                format!(
                    "release the hold of {} tickets under the show's lease and fence",
                    o.quantity
                ),
            );
            a.quantity = Some(o.quantity);
            actions.push(a);
        }
    }
    let of = |kind: ActionKind| actions.iter().filter(move |a| a.kind == kind);
    let first = facts.first().map_or(0, |f| f.order.created_at);
    let last = facts.last().map_or(0, |f| f.order.created_at);
    let o0 = &facts[0].order;
    let cluster = Cluster {
        id: format!(
            "{}/{}/{}/{}/{}",
            o0.tenant_id,
            o0.user_id,
            o0.show_id,
            o0.client_session.as_deref().unwrap_or("-"),
            first
        ),
        tenant: o0.tenant_id.clone(),
        user_id: o0.user_id.clone(),
        show_id: o0.show_id.clone(),
        client_session: o0.client_session.clone(),
        first_at: rfc3339(first),
        last_at: rfc3339(last),
        span_ms: last - first,
        keeper: keeper.map(|i| facts[i].order.order_id.clone()),
        keeper_reason,
        orders,
        refund_cents: of(ActionKind::Refund).filter_map(|a| a.amount_cents).sum(),
        refunds: of(ActionKind::Refund).count(),
        released_holds: of(ActionKind::Release).count(),
        released_tickets: of(ActionKind::Release).filter_map(|a| a.quantity).sum(),
        messages_stopped: of(ActionKind::StopMessage).count(),
        cancels: of(ActionKind::Cancel).count(),
        pending: actions
            .iter()
            .filter(|a| a.state == ActionState::Pending)
            .count(),
    };
    (cluster, actions)
}

#[cfg(test)]
mod tests {
    use super::super::scan::{MessageFacts, ScanOrder};
    use super::*;

    fn facts(id: &str, at: i64, status: OrderStatus, hold: &str, charged: bool) -> Facts {
        Facts {
            order: ScanOrder {
                order_id: id.into(),
                tenant_id: "t".into(),
                user_id: "U".into(),
                show_id: "S".into(),
                quantity: 2,
                amount_cents: 500,
                client_session: Some("s".into()),
                idempotency_key: None,
                status,
                created_at: at,
                hold: Some(hold.into()),
                mark: None,
            },
            charged_cents: charged.then_some(500),
            refunded_cents: None,
            messages: vec![MessageFacts {
                message_id: format!("m-{id}"),
                topic: "order.created".into(),
                published: false,
                stopped: false,
            }],
        }
    }

    use OrderStatus::*;

    #[test]
    fn keeps_the_earliest_paid_order_holding_a_voucher() {
        let f = vec![
            facts("a", 0, PendingPayment, "held", false),
            facts("b", 1, Paid, "released", true),
            facts("c", 2, Paid, "held", true),
            facts("d", 3, Paid, "held", true),
        ];
        let (keeper, why) = choose_keeper(&f);
        assert_eq!(keeper, Some(2));
        assert_eq!(why, KEEP_PAID);
    }

    #[test]
    fn without_a_paid_order_keeps_the_earliest_voucher_then_the_earliest() {
        let f = vec![
            facts("a", 0, PendingPayment, "released", false),
            facts("b", 1, PendingPayment, "held", false),
        ];
        assert_eq!(choose_keeper(&f), (Some(1), KEEP_HELD.to_string()));
        let f = vec![
            facts("a", 0, PendingPayment, "released", false),
            facts("b", 1, PendingPayment, "released", false),
        ];
        assert_eq!(choose_keeper(&f), (Some(0), KEEP_FIRST.to_string()));
    }

    #[test]
    fn marked_orders_are_never_kept() {
        let mut f = vec![
            facts("a", 0, Paid, "held", true),
            facts("b", 1, Paid, "held", true),
        ];
        f[0].order.mark = Some("duplicate of b: whatever".into());
        assert_eq!(choose_keeper(&f).0, Some(1));
        f[1].order.mark = Some("duplicate of x: whatever".into());
        let (k, why) = choose_keeper(&f);
        assert_eq!(k, None);
        assert!(why.contains("kept b"), "{why}");
    }

    #[test]
    fn plans_stop_refund_cancel_release_per_duplicate() {
        let f = vec![
            facts("a", 0, PendingPayment, "held", false),
            facts("b", 1, Paid, "held", true),
            facts("c", 2, Paid, "held", true),
        ];
        let (cluster, actions) = plan(0, &f);
        assert_eq!(cluster.keeper.as_deref(), Some("b"));
        let kinds: Vec<(&str, &str)> = actions
            .iter()
            .map(|a| (a.order_id.as_str(), a.kind.as_str()))
            .collect();
        assert_eq!(
            kinds,
            vec![
                ("a", "stop-message"),
                ("a", "cancel"),
                ("a", "release"),
                ("c", "stop-message"),
                ("c", "refund"),
                ("c", "cancel"),
                ("c", "release"),
            ]
        );
        assert_eq!(cluster.refund_cents, 500);
        assert_eq!(cluster.released_tickets, 4);
        assert_eq!(cluster.pending, 7);
        assert_eq!(actions[4].provider_key.as_deref(), Some("refund:c"));
    }

    #[test]
    fn a_ticketed_duplicate_is_blocked_and_done_work_is_done() {
        let mut f = vec![
            facts("a", 0, Paid, "held", true),
            facts("b", 1, Ticketed, "held", true),
            facts("c", 2, Cancelled, "released", false),
        ];
        f[2].order.mark = Some("duplicate of a: x".into());
        f[2].messages[0].stopped = true;
        let (cluster, actions) = plan(0, &f);
        assert_eq!(cluster.keeper.as_deref(), Some("a"));
        let b: Vec<ActionState> = actions
            .iter()
            .filter(|x| x.order_id == "b" && x.kind != ActionKind::StopMessage)
            .map(|x| x.state)
            .collect();
        assert_eq!(b, vec![ActionState::Blocked; 3]);
        assert!(actions
            .iter()
            .filter(|x| x.order_id == "c")
            .all(|x| x.state == ActionState::Done));
    }

    #[test]
    fn marks_name_their_keeper() {
        assert_eq!(
            marked_keeper("duplicate of ord_1: why (run r)"),
            Some("ord_1")
        );
        assert_eq!(marked_keeper("something else"), None);
    }
}
