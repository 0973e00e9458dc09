//! The checker: invariants I1–I8 from the ledgers and the workload log.
//!
//! Reads the campaign's database with its own SQL (it shares no code with the service
//! it checks) and compares with what the clients saw. Owns the invariants' definitions
//! and the anomaly records. It must not write to the database, and it must never be
//! made to pass by weakening an invariant: a finding is fixed in idem.

use std::collections::{BTreeMap, HashMap, HashSet};

use sqlx::{Connection, PgConnection, Row};

use crate::report::{Anomaly, FaultEvent, InvariantResult};
use crate::workload::{IntentKind, IntentLog};
use crate::ChaosError;

#[derive(Debug, Clone)]
struct Order {
    id: String,
    session: Option<String>,
    key: Option<String>,
    show: String,
    quantity: i64,
    amount: i64,
    status: String,
}

#[derive(Debug, Clone)]
struct Hold {
    order: String,
    show: String,
    quantity: i64,
    status: String,
    released_at: Option<i64>,
    token: Option<i64>,
    owner: Option<String>,
}

/// What the ledgers hold, read once after the settle phase.
#[derive(Debug, Default)]
pub struct Ledgers {
    orders: Vec<Order>,
    passed_through: HashMap<String, HashSet<String>>,
    payments: Vec<(String, String, String, i64)>,
    stock: Vec<(String, i64, i64)>,
    holds: Vec<Hold>,
    tickets: HashMap<String, i64>,
    processed: HashSet<(String, String)>,
    unpublished: Vec<(String, String)>,
    stale_processing: Vec<(String, String, Option<String>)>,
    lease_grants: Vec<(String, i64, String)>,
    fences: HashMap<String, i64>,
    records: u64,
    /// Provider operations (charges, refunds) with no payment row: money moved unrecorded.
    unrecorded_provider_ops: Vec<(String, String)>,
    /// (order, event, times) for an event recorded more than once.
    repeated_transitions: Vec<(String, String, i64)>,
    pub observed: BTreeMap<String, u64>,
}

fn db_err(e: sqlx::Error) -> ChaosError {
    ChaosError::Check(e.to_string())
}

/// The rows of `query`, with the tenant bound as `$1` when given.
async fn rows(
    c: &mut PgConnection,
    query: &'static str,
    tenant: Option<&str>,
) -> Result<Vec<sqlx::postgres::PgRow>, ChaosError> {
    let mut q = sqlx::query(query);
    if let Some(t) = tenant {
        q = q.bind(t);
    }
    q.fetch_all(c).await.map_err(db_err)
}

impl Ledgers {
    pub async fn read(db_url: &str, tenant: &str) -> Result<Ledgers, ChaosError> {
        let mut conn = PgConnection::connect(db_url).await.map_err(db_err)?;
        // One snapshot: a consumer or sweeper finishing mid-read cannot tear the ledgers.
        let mut c = conn.begin().await.map_err(db_err)?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .execute(&mut *c)
            .await
            .map_err(db_err)?;
        let mut l = Ledgers::default();
        for r in rows(
            &mut c,
            "SELECT order_id, client_session, idempotency_key, show_id, quantity, amount_cents, \
             status FROM orders WHERE tenant_id = $1",
            Some(tenant),
        )
        .await?
        {
            l.orders.push(Order {
                id: r.get(0),
                session: r.get(1),
                key: r.get(2),
                show: r.get(3),
                quantity: r.get(4),
                amount: r.get(5),
                status: r.get(6),
            });
        }
        for r in rows(
            &mut c,
            "SELECT order_id, to_status FROM order_transitions WHERE tenant_id = $1",
            Some(tenant),
        )
        .await?
        {
            l.passed_through
                .entry(r.get(0))
                .or_default()
                .insert(r.get(1));
        }
        for r in rows(
            &mut c,
            "SELECT payment_id, order_id, kind, amount_cents FROM payments WHERE tenant_id = $1",
            Some(tenant),
        )
        .await?
        {
            l.payments.push((r.get(0), r.get(1), r.get(2), r.get(3)));
        }
        for r in rows(
            &mut c,
            // Stock is the show's reserve plus its buckets.
            "SELECT i.show_id, i.capacity, i.available + CAST(COALESCE((SELECT \
             SUM(b.available) FROM inventory_buckets b WHERE b.tenant_id = i.tenant_id \
             AND b.show_id = i.show_id), 0) AS BIGINT) FROM inventory i WHERE i.tenant_id = $1",
            Some(tenant),
        )
        .await?
        {
            l.stock.push((r.get(0), r.get(1), r.get(2)));
        }
        for r in rows(
            &mut c,
            "SELECT order_id, show_id, quantity, status, released_at, release_token, \
             release_owner FROM inventory_holds WHERE tenant_id = $1",
            Some(tenant),
        )
        .await?
        {
            l.holds.push(Hold {
                order: r.get(0),
                show: r.get(1),
                quantity: r.get(2),
                status: r.get(3),
                released_at: r.get(4),
                token: r.get(5),
                owner: r.get(6),
            });
        }
        for r in rows(
            &mut c,
            "SELECT order_id, count(*) FROM tickets WHERE tenant_id = $1 GROUP BY order_id",
            Some(tenant),
        )
        .await?
        {
            l.tickets.insert(r.get(0), r.get(1));
        }
        for r in rows(
            &mut c,
            "SELECT consumer, business_key FROM consumer_processed WHERE tenant_id = $1",
            Some(tenant),
        )
        .await?
        {
            l.processed.insert((r.get(0), r.get(1)));
        }
        for r in rows(
            &mut c,
            "SELECT topic, order_id FROM outbox_messages WHERE tenant_id = $1 AND \
             published_at IS NULL",
            Some(tenant),
        )
        .await?
        {
            l.unpublished.push((r.get(0), r.get(1)));
        }
        for r in rows(
            &mut c,
            "SELECT tenant_id, key, owner FROM idem_records WHERE state = 'PROCESSING' AND \
             (lease_expires_at IS NULL OR \
              lease_expires_at < (extract(epoch FROM clock_timestamp()) * 1000)::bigint)",
            None,
        )
        .await?
        {
            l.stale_processing.push((r.get(0), r.get(1), r.get(2)));
        }
        for r in rows(
            &mut c,
            "SELECT name, token, coalesce(owner, '') FROM idem_lease_events \
             WHERE kind = 'acquired' ORDER BY id",
            None,
        )
        .await?
        {
            l.lease_grants.push((r.get(0), r.get(1), r.get(2)));
        }
        for r in rows(&mut c, "SELECT resource, last_token FROM idem_fences", None).await? {
            l.fences.insert(r.get(0), r.get(1));
        }
        for r in rows(
            &mut c,
            "SELECT kind, count(*) FROM idem_lease_events GROUP BY kind",
            None,
        )
        .await?
        {
            let kind: String = r.get(0);
            let n: i64 = r.get(1);
            l.observed.insert(format!("lease_events.{kind}"), n as u64);
        }
        for r in rows(
            &mut c,
            "SELECT o.order_id, o.kind FROM psp_operations o WHERE o.tenant_id = $1 AND \
             NOT EXISTS (SELECT 1 FROM payments p WHERE p.tenant_id = o.tenant_id AND \
             p.provider_key = o.provider_key)",
            Some(tenant),
        )
        .await?
        {
            l.unrecorded_provider_ops.push((r.get(0), r.get(1)));
        }
        for r in rows(
            &mut c,
            "SELECT order_id, event, count(*) FROM order_transitions WHERE tenant_id = $1 \
             GROUP BY order_id, event HAVING count(*) > 1",
            Some(tenant),
        )
        .await?
        {
            l.repeated_transitions.push((r.get(0), r.get(1), r.get(2)));
        }
        let records: i64 = sqlx::query_scalar("SELECT count(*) FROM idem_records")
            .fetch_one(&mut *c)
            .await
            .map_err(db_err)?;
        l.records = records as u64;
        let reexecuted: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM idem_records WHERE tenant_id = $1 AND attempts > 1",
        )
        .bind(tenant)
        .fetch_one(&mut *c)
        .await
        .map_err(db_err)?;
        l.observed
            .insert("records_claimed_again".into(), reexecuted as u64);
        c.commit().await.map_err(db_err)?;
        let _ = conn.close().await;
        Ok(l)
    }
}

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

#[cfg(test)]
mod tests {
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
}
