//! The checker: invariants I1–I8 from the ledgers and the workload log.
//!
//! Reads the campaign's database with its own SQL (it shares no code with the service
//! it checks) and compares with what the clients saw. Owns the invariants' definitions
//! and the anomaly records. It must not write to the database, and it must never be
//! made to pass by weakening an invariant: a finding is fixed in idem.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::report::{Anomaly, FaultEvent, InvariantResult};
use crate::workload::{IntentKind, IntentLog};
mod ledgers;
#[cfg(test)]
mod tests;

pub use ledgers::Ledgers;
use ledgers::{Hold, Order};

const TITLES: [(&str, &str); 8] = [
    (
        "I1",
        "every acknowledged intent has exactly one order, and every 2xx named it",
    ),
    ("I2", "no intent has more than one order"),
    (
        "I3",
        "payments belong to orders; no order charged twice; refunds only for charges",
    ),
    (
        "I4",
        "inventory conserved per show; one hold per order, released iff cancelled",
    ),
    (
        "I5",
        "each message's effect applied once per consumer despite redelivery",
    ),
    ("I6", "fencing tokens accepted per resource never go back"),
    ("I7", "nothing PROCESSING past its lease after settling"),
    (
        "I8",
        "at least 95 % of intents answered (2xx, or the refused half of a pay/cancel race)",
    ),
];

/// Minimum share of intents acknowledged by the end (I8).
pub const LIVENESS: f64 = 0.95;

struct Findings<'a> {
    faults: &'a [FaultEvent],
    anomalies: Vec<Anomaly>,
    checked: BTreeMap<&'static str, u64>,
}

impl Findings<'_> {
    fn count(&mut self, id: &'static str, n: u64) {
        *self.checked.entry(id).or_default() += n;
    }

    fn add(&mut self, id: &str, intent: Option<&IntentLog>, rows: Vec<String>, detail: String) {
        let faults = match intent {
            Some(i) => nearby(self.faults, i.first_ms(), i.last_ms()),
            None => Vec::new(),
        };
        self.anomalies.push(Anomaly {
            invariant: id.to_string(),
            intent: intent.map(|i| i.id.clone()),
            key: intent.map(|i| i.key.clone()),
            rows,
            detail,
            faults,
        });
    }
}

/// Faults active from 1 s before an intent's first send to 3 s after its last answer.
fn nearby(faults: &[FaultEvent], from: u64, to: u64) -> Vec<String> {
    faults
        .iter()
        .filter(|f| f.end_ms + 1_000 >= from && f.at_ms <= to + 3_000)
        .map(|f| format!("{} {} @{} ms", f.kind, f.target, f.at_ms))
        .collect()
}

/// Whether an intent ended in an answer: a 2xx, or for one of a pay/cancel pair sent
/// at once on purpose, the refusal of the one that lost.
pub fn answered(i: &IntentLog) -> bool {
    i.acknowledged || (i.race && i.refused == Some(409))
}

/// Checks every invariant. `legacy` is the keyless control: its orders carry no key, and
/// the duplicates it makes are reported like any others.
pub fn check(
    log: &[IntentLog],
    l: &Ledgers,
    faults: &[FaultEvent],
    legacy: bool,
) -> (Vec<InvariantResult>, Vec<Anomaly>) {
    let mut f = Findings {
        faults,
        anomalies: Vec::new(),
        checked: BTreeMap::new(),
    };
    let by_id: HashMap<&str, &Order> = l.orders.iter().map(|o| (o.id.as_str(), o)).collect();
    let mut by_session: HashMap<&str, Vec<&Order>> = HashMap::new();
    for o in &l.orders {
        if let Some(s) = &o.session {
            by_session.entry(s.as_str()).or_default().push(o);
        }
    }
    let creates: HashMap<&str, &IntentLog> = log
        .iter()
        .filter(|i| i.kind == IntentKind::Create)
        .map(|i| (i.id.as_str(), i))
        .collect();
    let statuses_of = |o: &Order| -> HashSet<String> {
        let mut s = l.passed_through.get(&o.id).cloned().unwrap_or_default();
        s.insert(o.status.clone());
        s
    };

    // I1 and I2.
    for i in log {
        let ok: Vec<_> = i.sends.iter().filter(|s| s.ok()).collect();
        if let Some(status) = i.refused {
            if !(i.race && status == 409) {
                f.add(
                    "I1",
                    Some(i),
                    i.order_id.iter().cloned().collect(),
                    format!("refused with {status}, which nothing in the workload should cause"),
                );
            }
        }
        match i.kind {
            IntentKind::Create => {
                let orders = by_session.get(i.id.as_str()).cloned().unwrap_or_default();
                f.count("I2", 1);
                if orders.len() > 1 {
                    f.add(
                        "I2",
                        Some(i),
                        orders.iter().map(|o| o.id.clone()).collect(),
                        format!("{} orders for one intent", orders.len()),
                    );
                }
                if !i.acknowledged {
                    continue;
                }
                f.count("I1", 1);
                let [order] = orders.as_slice() else {
                    f.add(
                        "I1",
                        Some(i),
                        orders.iter().map(|o| o.id.clone()).collect(),
                        format!("acknowledged, but {} orders exist", orders.len()),
                    );
                    continue;
                };
                let key_ok = if legacy {
                    order.key.is_none()
                } else {
                    order.key.as_deref() == Some(i.key.as_str())
                };
                if !key_ok {
                    f.add(
                        "I1",
                        Some(i),
                        vec![order.id.clone()],
                        format!("order created under key {:?}", order.key),
                    );
                }
                let passed = statuses_of(order);
                for s in &ok {
                    if s.order_id.as_deref() != Some(order.id.as_str()) {
                        f.add(
                            "I1",
                            Some(i),
                            vec![order.id.clone()],
                            format!("a 2xx named order {:?}", s.order_id),
                        );
                    }
                    match &s.order_status {
                        Some(st) if passed.contains(st) => {}
                        Some(st) => f.add(
                            "I1",
                            Some(i),
                            vec![order.id.clone()],
                            format!("a 2xx said status {st}, the order never had it"),
                        ),
                        None => f.add(
                            "I1",
                            Some(i),
                            vec![order.id.clone()],
                            "a 2xx without the order's status".into(),
                        ),
                    }
                }
            }
            IntentKind::Pay | IntentKind::Cancel => {
                let wanted = if i.kind == IntentKind::Pay {
                    "paid"
                } else {
                    "cancelled"
                };
                let target = i.order_id.as_deref().unwrap_or_default();
                if i.race && i.refused.is_some() {
                    f.count("I1", 1);
                    // The loser may still have moved the order on the way (a cancel
                    // that finds the pay's charge records it, then refunds it): what
                    // must not hold is the loser's outcome at the end.
                    let ended_as_asked = by_id.get(target).is_some_and(|o| match i.kind {
                        IntentKind::Pay => matches!(o.status.as_str(), "paid" | "ticketed"),
                        _ => o.status == "cancelled",
                    });
                    if ended_as_asked {
                        let why = i
                            .sends
                            .iter()
                            .rev()
                            .find_map(|s| s.error.clone())
                            .unwrap_or_default();
                        f.add(
                            "I1",
                            Some(i),
                            vec![target.into()],
                            format!("refused, yet the order ended {wanted}: {why}"),
                        );
                    }
                }
                if !i.acknowledged {
                    continue;
                }
                f.count("I1", 1);
                let Some(order) = by_id.get(target) else {
                    f.add(
                        "I1",
                        Some(i),
                        vec![target.into()],
                        "acknowledged for an order that does not exist".into(),
                    );
                    continue;
                };
                let passed = statuses_of(order);
                if !passed.contains(wanted) {
                    f.add(
                        "I1",
                        Some(i),
                        vec![order.id.clone()],
                        format!("acknowledged, but the order never became {wanted}"),
                    );
                }
                for s in &ok {
                    if s.order_id.as_deref() != Some(target) {
                        f.add(
                            "I1",
                            Some(i),
                            vec![target.into()],
                            format!("a 2xx named order {:?}", s.order_id),
                        );
                    }
                    match &s.order_status {
                        Some(st) if passed.contains(st) => {}
                        Some(st) => f.add(
                            "I1",
                            Some(i),
                            vec![target.into()],
                            format!("a 2xx said status {st}, the order never had it"),
                        ),
                        None => f.add(
                            "I1",
                            Some(i),
                            vec![target.into()],
                            "a 2xx without the order's status".into(),
                        ),
                    }
                }
            }
        }
    }
    // Orders no intent asked for.
    for o in &l.orders {
        let known = o
            .session
            .as_deref()
            .is_some_and(|s| creates.contains_key(s));
        if !known {
            f.add(
                "I2",
                None,
                vec![o.id.clone()],
                format!("order of no intent (session {:?})", o.session),
            );
        }
    }

    // I3.
    let mut charges: HashMap<&str, Vec<i64>> = HashMap::new();
    let mut refunds: HashMap<&str, usize> = HashMap::new();
    for (id, order, kind, amount) in &l.payments {
        f.count("I3", 1);
        if !by_id.contains_key(order.as_str()) {
            f.add(
                "I3",
                None,
                vec![id.clone(), order.clone()],
                "payment for no order".into(),
            );
        }
        match kind.as_str() {
            "charge" => charges.entry(order).or_default().push(*amount),
            _ => *refunds.entry(order).or_default() += 1,
        }
    }
    for (order, kind) in &l.unrecorded_provider_ops {
        f.add(
            "I3",
            None,
            vec![order.clone()],
            format!("the provider recorded a {kind} the payments ledger does not have"),
        );
    }
    for o in &l.orders {
        let c = charges.get(o.id.as_str()).map(Vec::as_slice).unwrap_or(&[]);
        if c.len() > 1 {
            f.add(
                "I3",
                None,
                vec![o.id.clone()],
                format!("charged {} times", c.len()),
            );
        }
        if c.iter().any(|a| *a != o.amount) {
            f.add(
                "I3",
                None,
                vec![o.id.clone()],
                format!("charge {c:?} differs from the order's {}", o.amount),
            );
        }
        let paid = matches!(o.status.as_str(), "paid" | "ticketed");
        if paid && c.is_empty() {
            f.add(
                "I3",
                None,
                vec![o.id.clone()],
                format!("{} without a charge", o.status),
            );
        }
        let r = refunds.get(o.id.as_str()).copied().unwrap_or(0);
        // A charge the customer got nothing for: the order was cancelled, not refunded.
        if o.status == "cancelled" && c.len() > r {
            f.add(
                "I3",
                None,
                vec![o.id.clone()],
                format!("cancelled with {} charge(s) and {r} refund(s)", c.len()),
            );
        }
        if r > c.len() {
            f.add(
                "I3",
                None,
                vec![o.id.clone()],
                format!("{r} refund(s) for {} charge(s)", c.len()),
            );
        }
    }

    // I4.
    let mut held: HashMap<&str, i64> = HashMap::new();
    let mut holds_of: HashMap<&str, Vec<&Hold>> = HashMap::new();
    for h in &l.holds {
        f.count("I4", 1);
        holds_of.entry(h.order.as_str()).or_default().push(h);
        if h.status == "held" {
            *held.entry(h.show.as_str()).or_default() += h.quantity;
        }
        match by_id.get(h.order.as_str()) {
            None => f.add(
                "I4",
                None,
                vec![h.order.clone()],
                "hold without an order".into(),
            ),
            Some(o) if o.show != h.show || o.quantity != h.quantity => f.add(
                "I4",
                None,
                vec![o.id.clone()],
                "hold does not match its order's show or quantity".into(),
            ),
            Some(_) => {}
        }
    }
    for (show, capacity, available) in &l.stock {
        let h = held.get(show.as_str()).copied().unwrap_or(0);
        if available + h != *capacity {
            f.add(
                "I4",
                None,
                vec![show.clone()],
                format!("available {available} + held {h} ≠ initial stock {capacity}"),
            );
        }
    }
    for o in &l.orders {
        let hs = holds_of
            .get(o.id.as_str())
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let cancelled = o.status == "cancelled";
        match hs {
            [h] if cancelled && h.status != "released" => f.add(
                "I4",
                None,
                vec![o.id.clone()],
                "cancelled, but its hold is still held".into(),
            ),
            [h] if !cancelled && h.status != "held" => f.add(
                "I4",
                None,
                vec![o.id.clone()],
                format!("{}, but its hold was released", o.status),
            ),
            [_] => {}
            _ => f.add(
                "I4",
                None,
                vec![o.id.clone()],
                format!("{} holds for one order", hs.len()),
            ),
        }
    }

    // I5.
    for o in &l.orders {
        f.count("I5", 1);
        let tickets = l.tickets.get(&o.id).copied().unwrap_or(0);
        let wants_ticket = matches!(o.status.as_str(), "paid" | "ticketed");
        if o.status == "paid" {
            f.add(
                "I5",
                None,
                vec![o.id.clone()],
                "paid, but the ticket issuer never acted".into(),
            );
        }
        if (wants_ticket && tickets != 1) || (!wants_ticket && tickets != 0) {
            f.add(
                "I5",
                None,
                vec![o.id.clone()],
                format!("{} with {tickets} ticket(s)", o.status),
            );
        }
        if o.status == "ticketed"
            && !l
                .processed
                .contains(&("ticket-issuer".into(), format!("ticket:{}", o.id)))
        {
            f.add(
                "I5",
                None,
                vec![o.id.clone()],
                "ticketed without the issuer's processed key".into(),
            );
        }
        if o.status == "cancelled"
            && !l
                .processed
                .contains(&("inventory-releaser".into(), format!("release:{}", o.id)))
        {
            f.add(
                "I5",
                None,
                vec![o.id.clone()],
                "cancelled, but the inventory releaser never acted".into(),
            );
        }
    }
    for (order, event, n) in &l.repeated_transitions {
        f.add(
            "I5",
            None,
            vec![order.clone()],
            format!("event {event} applied {n} times"),
        );
    }
    for (topic, order) in &l.unpublished {
        f.add(
            "I5",
            None,
            vec![order.clone()],
            format!("outbox message {topic} never published"),
        );
    }

    // I6.
    let mut last_grant: HashMap<&str, i64> = HashMap::new();
    let mut granted: HashSet<(&str, i64, &str)> = HashSet::new();
    for (name, token, owner) in &l.lease_grants {
        f.count("I6", 1);
        if let Some(prev) = last_grant.insert(name, *token) {
            if *token <= prev {
                f.add(
                    "I6",
                    None,
                    vec![name.clone()],
                    format!("token {token} granted after {prev}"),
                );
            }
        }
        granted.insert((name, *token, owner));
    }
    let mut releases: HashMap<&str, Vec<&Hold>> = HashMap::new();
    for h in l.holds.iter().filter(|h| h.status == "released") {
        releases.entry(h.show.as_str()).or_default().push(h);
    }
    for (show, mut rs) in releases {
        rs.sort_by_key(|h| h.released_at);
        let mut prev: Option<(i64, i64)> = None;
        for h in rs {
            f.count("I6", 1);
            let (Some(token), Some(at)) = (h.token, h.released_at) else {
                f.add(
                    "I6",
                    None,
                    vec![h.order.clone()],
                    "released without a fencing token".into(),
                );
                continue;
            };
            if let Some((pt, pat)) = prev {
                // Each release takes the lease anew: a later one carries a larger token.
                if token <= pt && at > pat {
                    f.add(
                        "I6",
                        None,
                        vec![h.order.clone()],
                        format!("show {show}: token {token} accepted after {pt}"),
                    );
                }
            }
            let owner = h.owner.as_deref().unwrap_or_default();
            let lease = |n: &str| n.starts_with("inventory:") && n.ends_with(&format!(":{show}"));
            if !granted
                .iter()
                .any(|(n, t, o)| *t == token && *o == owner && lease(n))
            {
                f.add(
                    "I6",
                    None,
                    vec![h.order.clone()],
                    format!("token {token} of {owner} was never granted for {show}"),
                );
            }
            prev = Some((token.max(prev.map_or(0, |p| p.0)), at));
        }
    }
    for (resource, last) in &l.fences {
        if let Some(highest) = l
            .lease_grants
            .iter()
            .filter(|(n, _, _)| n == resource)
            .map(|(_, t, _)| *t)
            .max()
        {
            if *last > highest {
                f.add(
                    "I6",
                    None,
                    vec![resource.clone()],
                    format!("fence at {last}, above every token granted ({highest})"),
                );
            }
        }
    }

    // I7.
    f.count("I7", l.records);
    for (tenant, key, owner) in &l.stale_processing {
        let intent = log.iter().find(|i| &i.key == key);
        f.add(
            "I7",
            intent,
            vec![format!("{tenant}/{key}")],
            format!("PROCESSING past its lease (owner {owner:?})"),
        );
    }

    // I8.
    let acked = log.iter().filter(|i| answered(i)).count();
    f.count("I8", log.len() as u64);
    let ratio = if log.is_empty() {
        0.0
    } else {
        acked as f64 / log.len() as f64
    };
    if ratio < LIVENESS {
        f.add(
            "I8",
            None,
            Vec::new(),
            format!(
                "{acked} of {} intents answered ({:.1} %)",
                log.len(),
                ratio * 100.0
            ),
        );
    }

    let results = TITLES
        .iter()
        .map(|(id, title)| {
            let n = f.anomalies.iter().filter(|a| a.invariant == *id).count();
            InvariantResult {
                id: id.to_string(),
                title: title.to_string(),
                checked: f.checked.get(id).copied().unwrap_or(0),
                anomalies: n,
                passed: n == 0,
            }
        })
        .collect();
    (results, f.anomalies)
}
