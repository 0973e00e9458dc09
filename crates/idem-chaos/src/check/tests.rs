//! The invariants on hand-made ledgers and logs: each must catch what it names.

use super::*;
use crate::workload::SendLog;

fn send(order: &str, status: &str, replayed: bool) -> SendLog {
    SendLog {
        at_ms: 1_000,
        end_ms: 1_100,
        gateway: 0,
        attempts: 1,
        status: Some(201),
        replayed,
        order_id: Some(order.into()),
        order_status: Some(status.into()),
        error: None,
    }
}

fn create(id: &str, order: &str) -> IntentLog {
    IntentLog {
        id: id.into(),
        kind: IntentKind::Create,
        key: format!("create-{id}"),
        user: "U-0".into(),
        show: "S".into(),
        quantity: 2,
        order_id: Some(order.into()),
        double_click: true,
        sends: vec![
            send(order, "pending_payment", false),
            send(order, "pending_payment", true),
        ],
        acknowledged: true,
        refused: None,
        race: false,
    }
}

fn order(id: &str, session: &str, status: &str) -> Order {
    Order {
        id: id.into(),
        session: Some(session.into()),
        key: Some(format!("create-{session}")),
        show: "S".into(),
        quantity: 2,
        amount: 100,
        status: status.into(),
    }
}

fn hold(order: &str, status: &str) -> Hold {
    Hold {
        order: order.into(),
        show: "S".into(),
        quantity: 2,
        status: status.into(),
        released_at: None,
        token: None,
        owner: None,
    }
}

/// One intent, its order pending payment, stock 10 with 2 held.
fn clean() -> (Vec<IntentLog>, Ledgers) {
    let mut l = Ledgers::default();
    l.orders.push(order("o1", "i1", "pending_payment"));
    l.passed_through
        .insert("o1".into(), ["pending_payment".to_string()].into());
    l.holds.push(hold("o1", "held"));
    l.stock.push(("S".into(), 10, 8));
    (vec![create("i1", "o1")], l)
}

fn found(log: &[IntentLog], l: &Ledgers) -> Vec<String> {
    let (results, anomalies) = check(log, l, &[], false);
    for r in &results {
        assert_eq!(
            r.passed,
            !anomalies.iter().any(|a| a.invariant == r.id),
            "{}",
            r.id
        );
    }
    let mut ids: Vec<String> = anomalies.into_iter().map(|a| a.invariant).collect();
    ids.dedup();
    ids
}

#[test]
fn a_clean_history_passes_every_invariant() {
    let (log, l) = clean();
    assert_eq!(found(&log, &l), Vec::<String>::new());
}

#[test]
fn a_2xx_naming_another_order_breaks_i1() {
    let (mut log, l) = clean();
    log[0].sends[1].order_id = Some("o2".into());
    assert_eq!(found(&log, &l), ["I1"]);
    let (mut log, l) = clean();
    log[0].sends[1].order_status = Some("refunded".into());
    assert_eq!(found(&log, &l), ["I1"]);
}

#[test]
fn two_orders_for_one_intent_break_i2_and_i1() {
    let (log, mut l) = clean();
    l.orders.push(order("o2", "i1", "pending_payment"));
    l.holds.push(hold("o2", "held"));
    l.stock[0].2 = 6;
    let ids = found(&log, &l);
    assert!(ids.contains(&"I2".to_string()) && ids.contains(&"I1".to_string()));
    // An order no intent asked for.
    let (log, mut l) = clean();
    l.orders.push(order("o9", "nobody", "pending_payment"));
    l.holds.push(hold("o9", "held"));
    l.stock[0].2 = 6;
    assert_eq!(found(&log, &l), ["I2"]);
}

#[test]
fn a_second_charge_or_a_refund_without_one_breaks_i3() {
    let (log, mut l) = clean();
    l.orders[0].status = "ticketed".into();
    l.tickets.insert("o1".into(), 1);
    l.processed
        .insert(("ticket-issuer".into(), "ticket:o1".into()));
    l.payments
        .push(("p1".into(), "o1".into(), "charge".into(), 100));
    assert_eq!(found(&log, &l), Vec::<String>::new());
    l.payments
        .push(("p2".into(), "o1".into(), "charge".into(), 100));
    assert_eq!(found(&log, &l), ["I3"]);
    let (log, mut l) = clean();
    l.payments
        .push(("r1".into(), "o1".into(), "refund".into(), 100));
    assert_eq!(found(&log, &l), ["I3"]);
}

#[test]
fn stock_that_does_not_add_up_breaks_i4() {
    let (log, mut l) = clean();
    l.stock[0].2 = 9;
    assert_eq!(found(&log, &l), ["I4"]);
    let (log, mut l) = clean();
    l.holds[0].status = "released".into();
    l.stock[0].2 = 10;
    l.holds[0].token = Some(1);
    l.holds[0].released_at = Some(5);
    l.lease_grants
        .push(("inventory:t:S".into(), 1, String::new()));
    assert_eq!(found(&log, &l), ["I4"]);
}

#[test]
fn a_missing_or_repeated_effect_breaks_i5() {
    let (log, mut l) = clean();
    l.orders[0].status = "paid".into();
    l.payments
        .push(("p1".into(), "o1".into(), "charge".into(), 100));
    assert_eq!(found(&log, &l), ["I5"]);
    let (log, mut l) = clean();
    l.tickets.insert("o1".into(), 1);
    assert_eq!(found(&log, &l), ["I5"]);
    let (log, mut l) = clean();
    l.unpublished.push(("order.paid".into(), "o1".into()));
    assert_eq!(found(&log, &l), ["I5"]);
}

#[test]
fn a_token_going_back_breaks_i6() {
    let (log, mut l) = clean();
    l.lease_grants.push(("order:t:o1".into(), 5, "a".into()));
    l.lease_grants.push(("order:t:o1".into(), 4, "b".into()));
    assert_eq!(found(&log, &l), ["I6"]);
    // A release written with a token after a larger one.
    let (log, mut l) = clean();
    l.orders.push(order("o2", "i2", "cancelled"));
    l.orders.push(order("o3", "i3", "cancelled"));
    let mut log = log;
    log.push(create("i2", "o2"));
    log.push(create("i3", "o3"));
    for (o, token, at) in [("o2", 7, 10), ("o3", 6, 20)] {
        let mut h = hold(o, "released");
        h.token = Some(token);
        h.released_at = Some(at);
        h.owner = Some(format!("w{token}"));
        l.holds.push(h);
        l.lease_grants
            .push(("inventory:t:S".into(), token, format!("w{token}")));
        l.processed
            .insert(("inventory-releaser".into(), format!("release:{o}")));
        l.passed_through.insert(
            o.into(),
            ["pending_payment".to_string(), "cancelled".to_string()].into(),
        );
    }
    let ids = found(&log, &l);
    assert!(ids.contains(&"I6".to_string()), "{ids:?}");
}

#[test]
fn a_claim_left_processing_breaks_i7() {
    let (log, mut l) = clean();
    l.stale_processing
        .push(("chaos".into(), "create-i1".into(), Some("w".into())));
    assert_eq!(found(&log, &l), ["I7"]);
}

#[test]
fn too_few_acknowledgements_break_i8() {
    let (mut log, l) = clean();
    for n in 0..2 {
        let mut i = create(&format!("lost{n}"), "x");
        i.sends.clear();
        i.acknowledged = false;
        log.push(i);
    }
    assert_eq!(found(&log, &l), ["I8"]);
}

#[test]
fn a_refusal_is_an_answer_only_for_the_loser_of_a_race() {
    let (mut log, l) = clean();
    let mut cancel = create("i1-cancel", "o1");
    cancel.kind = IntentKind::Cancel;
    cancel.sends[0].status = Some(409);
    cancel.sends.truncate(1);
    cancel.acknowledged = false;
    cancel.refused = Some(409);
    cancel.race = true;
    log.push(cancel.clone());
    assert_eq!(found(&log, &l), Vec::<String>::new());
    assert!(answered(&cancel));
    // Refused, yet the order was cancelled: the refusal lied.
    let mut l2 = Ledgers {
        orders: l.orders.clone(),
        ..Default::default()
    };
    l2.orders[0].status = "cancelled".into();
    l2.passed_through.insert(
        "o1".into(),
        ["pending_payment".to_string(), "cancelled".to_string()].into(),
    );
    let mut released = hold("o1", "released");
    released.token = Some(1);
    released.released_at = Some(1);
    released.owner = Some("w".into());
    l2.holds.push(released);
    l2.lease_grants
        .push(("inventory:t:S".into(), 1, "w".into()));
    l2.processed
        .insert(("inventory-releaser".into(), "release:o1".into()));
    l2.stock.push(("S".into(), 10, 10));
    assert_eq!(found(&log, &l2), ["I1"]);
    // Outside a race, nothing in the workload should be refused.
    cancel.race = false;
    log[1] = cancel;
    assert_eq!(found(&log, &l), ["I1", "I8"]);
}

#[test]
fn money_moved_unrecorded_or_an_event_applied_twice_is_found() {
    let (log, mut l) = clean();
    l.unrecorded_provider_ops
        .push(("o1".into(), "charge".into()));
    assert_eq!(found(&log, &l), ["I3"]);
    let (log, mut l) = clean();
    l.repeated_transitions.push(("o1".into(), "pay".into(), 2));
    assert_eq!(found(&log, &l), ["I5"]);
}

#[test]
fn a_cancelled_order_that_kept_its_charge_breaks_i3() {
    let (log, mut l) = clean();
    l.orders[0].status = "cancelled".into();
    l.passed_through.insert(
        "o1".into(),
        ["pending_payment".to_string(), "cancelled".to_string()].into(),
    );
    l.holds[0].status = "released".into();
    l.holds[0].token = Some(1);
    l.holds[0].released_at = Some(1);
    l.holds[0].owner = Some("w".into());
    l.lease_grants.push(("inventory:t:S".into(), 1, "w".into()));
    l.processed
        .insert(("inventory-releaser".into(), "release:o1".into()));
    l.stock[0].2 = 10;
    assert_eq!(found(&log, &l), Vec::<String>::new());
    l.payments
        .push(("p1".into(), "o1".into(), "charge".into(), 100));
    assert_eq!(found(&log, &l), ["I3"]);
    l.payments
        .push(("r1".into(), "o1".into(), "refund".into(), 100));
    assert_eq!(found(&log, &l), Vec::<String>::new());
}

#[test]
fn a_refused_pay_whose_charge_the_cancel_refunded_is_consistent() {
    // The pay charged, then lost the race; the cancel recorded and refunded it.
    let (mut log, mut l) = clean();
    l.orders[0].status = "cancelled".into();
    l.passed_through.insert(
        "o1".into(),
        [
            "pending_payment",
            "paid",
            "refund_pending",
            "refunded",
            "cancelled",
        ]
        .map(String::from)
        .into(),
    );
    l.payments
        .push(("p1".into(), "o1".into(), "charge".into(), 100));
    l.payments
        .push(("r1".into(), "o1".into(), "refund".into(), 100));
    l.holds[0].status = "released".into();
    l.holds[0].token = Some(1);
    l.holds[0].released_at = Some(1);
    l.holds[0].owner = Some("w".into());
    l.lease_grants.push(("inventory:t:S".into(), 1, "w".into()));
    l.processed
        .insert(("inventory-releaser".into(), "release:o1".into()));
    l.stock[0].2 = 10;
    let mut pay = create("i1-pay", "o1");
    pay.kind = IntentKind::Pay;
    pay.sends.truncate(1);
    pay.sends[0].status = Some(409);
    pay.acknowledged = false;
    pay.refused = Some(409);
    pay.race = true;
    log.push(pay);
    assert_eq!(found(&log, &l), Vec::<String>::new());
    // Had the order ended paid, the refusal would have been a lie.
    l.orders[0].status = "paid".into();
    assert!(found(&log, &l).contains(&"I1".to_string()));
}
