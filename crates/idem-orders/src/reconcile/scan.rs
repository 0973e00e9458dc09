//! Reading the ledgers: one streamed, ordered pass over the orders (with each order's
//! hold and the reconciler's duplicate mark), grouped into intents as it goes; then, for
//! duplicate clusters only, their payments, the provider's charges and their messages.
//!
//! Reads only.

use futures::TryStreamExt;

use crate::db::{sql, Conn, Database, Row, Sql};
use crate::error::Error;
use crate::ledgers::{self, topics};
use crate::machine::OrderStatus;
use crate::service::{consumer_key, consumers, pay_key, refund_key};

use super::{Progress, ReconcileOptions, RECONCILER};

/// Messages of a duplicate that can still make the chain act (the duplicate's own
/// facts). Compensation's own messages (`order.cancelled`, `order.refunded`,
/// `inventory.released`) are never stopped.
pub(crate) const STOPPABLE: [&str; 4] = [
    topics::ORDER_CREATED,
    topics::PAYMENT_REQUESTED,
    topics::ORDER_PAID,
    topics::TICKET_ISSUED,
];

/// The reconciler's mark on an order it decided is a duplicate.
pub(crate) fn duplicate_key(order_id: &str) -> String {
    format!("duplicate:{order_id}")
}

/// The reconciler's mark on a message it stopped.
pub(crate) fn stop_key(message_id: &str) -> String {
    format!("stop:{message_id}")
}

/// An order as the scan reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ScanOrder {
    pub order_id: String,
    pub tenant_id: String,
    pub user_id: String,
    pub show_id: String,
    pub quantity: i64,
    pub amount_cents: i64,
    pub client_session: Option<String>,
    pub idempotency_key: Option<String>,
    pub status: OrderStatus,
    pub created_at: i64,
    /// The hold's status (`held` / `released`), if the order has one.
    pub hold: Option<String>,
    /// The reconciler's `duplicate:{order}` outcome, if an earlier run marked it.
    pub mark: Option<String>,
}

impl ScanOrder {
    /// Still an order the customer may get tickets for.
    pub(crate) fn is_live(&self) -> bool {
        matches!(
            self.status,
            OrderStatus::PendingPayment | OrderStatus::Paid | OrderStatus::Ticketed
        )
    }

    pub(crate) fn holds_voucher(&self) -> bool {
        self.hold.as_deref() == Some("held")
    }
}

/// Groups an ordered stream of orders into intents and keeps the duplicate clusters.
pub(crate) struct Grouper {
    window_ms: i64,
    run: Vec<ScanOrder>,
    pub(crate) intents: u64,
    pub(crate) clusters: Vec<Vec<ScanOrder>>,
}

impl Grouper {
    pub(crate) fn new(window_ms: i64) -> Self {
        Self {
            window_ms: window_ms.max(0),
            run: Vec::new(),
            intents: 0,
            clusters: Vec::new(),
        }
    }

    /// Orders arrive sorted by (tenant, user, show, created_at, order_id).
    pub(crate) fn push(&mut self, order: ScanOrder) {
        if let Some(last) = self.run.last() {
            if (&last.tenant_id, &last.user_id, &last.show_id)
                != (&order.tenant_id, &order.user_id, &order.show_id)
            {
                self.flush();
            }
        }
        self.run.push(order);
    }

    pub(crate) fn finish(mut self) -> Self {
        self.flush();
        self
    }

    /// One (tenant, user, show): split by session (a keyed order is its own intent),
    /// then by window anchored at each intent's first order.
    fn flush(&mut self) {
        let run = std::mem::take(&mut self.run);
        if run.len() == 1 {
            self.intents += 1;
            return;
        }
        let mut by_session: Vec<(Option<&str>, Vec<&ScanOrder>)> = Vec::new();
        for order in &run {
            if order.idempotency_key.is_some() {
                self.intents += 1;
                continue;
            }
            let session = order.client_session.as_deref();
            match by_session.iter_mut().find(|(s, _)| *s == session) {
                Some((_, orders)) => orders.push(order),
                None => by_session.push((session, vec![order])),
            }
        }
        for (_, orders) in by_session {
            let mut intent: Vec<&ScanOrder> = Vec::new();
            for order in orders {
                if let Some(first) = intent.first() {
                    if order.created_at - first.created_at > self.window_ms {
                        self.close(std::mem::take(&mut intent));
                    }
                }
                intent.push(order);
            }
            self.close(intent);
        }
    }

    fn close(&mut self, intent: Vec<&ScanOrder>) {
        if intent.is_empty() {
            return;
        }
        self.intents += 1;
        // Members: live orders, and those an earlier run marked (so a half-done cluster
        // stays a cluster). An order cancelled for another reason is left alone.
        let members: Vec<ScanOrder> = intent
            .into_iter()
            .filter(|o| o.is_live() || o.mark.is_some())
            .cloned()
            .collect();
        if members.len() > 1 {
            self.clusters.push(members);
        }
    }
}

/// The orders in scope with their hold and reconciler mark; `$key` builds the mark's
/// business key (`'duplicate:' || id`; MySQL, where `||` is OR: `CONCAT`).
macro_rules! scan_sql {
    ($key:literal) => {
        concat!(
            "SELECT o.order_id, o.tenant_id, o.user_id, o.show_id, o.quantity, \
               o.amount_cents, o.client_session, o.idempotency_key, o.status, o.created_at, \
               h.status AS hold_status, m.outcome AS mark \
             FROM orders o \
             LEFT JOIN inventory_holds h ON h.order_id = o.order_id \
             LEFT JOIN consumer_processed m ON m.consumer = 'reconciler' \
               AND m.tenant_id = o.tenant_id AND m.business_key = ",
            $key,
            " WHERE ($1 IS NULL OR o.tenant_id = $1) AND ($2 IS NULL OR o.user_id = $2) \
               AND ($3 IS NULL OR o.show_id = $3) AND ($4 IS NULL OR o.created_at >= $4) \
               AND ($5 IS NULL OR o.created_at < $5) \
             ORDER BY o.tenant_id, o.user_id, o.show_id, o.created_at, o.order_id"
        )
    };
}
const SCAN: &str = scan_sql!("'duplicate:' || o.order_id");
const SCAN_MYSQL: &str = scan_sql!("CONCAT('duplicate:', o.order_id)");

const COUNT: &str = "SELECT COUNT(*) AS n FROM orders o \
     WHERE ($1 IS NULL OR o.tenant_id = $1) AND ($2 IS NULL OR o.user_id = $2) \
       AND ($3 IS NULL OR o.show_id = $3) AND ($4 IS NULL OR o.created_at >= $4) \
       AND ($5 IS NULL OR o.created_at < $5)";

fn scan_order(row: &Row) -> Result<ScanOrder, Error> {
    Ok(ScanOrder {
        order_id: row.text("order_id")?,
        tenant_id: row.text("tenant_id")?,
        user_id: row.text("user_id")?,
        show_id: row.text("show_id")?,
        quantity: row.int("quantity")?,
        amount_cents: row.int("amount_cents")?,
        client_session: row.opt_text("client_session")?,
        idempotency_key: row.opt_text("idempotency_key")?,
        status: row
            .text("status")?
            .parse()
            .map_err(|e| Error::Backend(format!("status: {e}")))?,
        created_at: row.int("created_at")?,
        hold: row.opt_text("hold_status")?,
        mark: row.opt_text("mark")?,
    })
}

/// `text` with the scope's filters bound (`$1` … `$5`: tenant, user, show, since, until).
fn in_scope(text: &'static str, o: &ReconcileOptions) -> Sql {
    sql(text)
        .bind(o.tenant.clone())
        .bind(o.user.clone())
        .bind(o.show.clone())
        .bind(o.since_ms)
        .bind(o.until_ms)
}

/// What the scan found.
pub(crate) struct Scanned {
    pub orders: u64,
    pub intents: u64,
    pub clusters: Vec<Vec<ScanOrder>>,
}

/// Orders in scope (for `no order row deleted` and the progress bar).
pub(crate) async fn count(db: &Database, o: &ReconcileOptions) -> Result<u64, Error> {
    let mut conn = db.acquire().await?;
    let row = conn.conn().one(in_scope(COUNT, o)).await?;
    Ok(row.int("n")?.max(0) as u64)
}

/// One ordered pass over the orders in scope.
pub(crate) async fn scan(db: &Database, o: &ReconcileOptions) -> Result<Scanned, Error> {
    let total = match &o.progress {
        Some(_) => Some(count(db, o).await?),
        None => None,
    };
    let report = |scanned: u64| {
        if let Some(hook) = &o.progress {
            hook(Progress { scanned, total });
        }
    };
    report(0);
    let window_ms = i64::try_from(o.window.as_millis()).unwrap_or(i64::MAX);
    let mut grouper = Grouper::new(window_ms);
    let mut scanned = 0u64;
    let mut next_report = 16_384;
    let mut conn = db.acquire().await?;
    let mut c = conn.conn();
    let query = in_scope(c.pick(SCAN, SCAN_MYSQL), o);
    let mut rows = c.fetch(&query);
    while let Some(row) = rows.try_next().await? {
        grouper.push(scan_order(&row)?);
        scanned += 1;
        if scanned == next_report {
            report(scanned);
            next_report += 16_384;
        }
    }
    drop(rows);
    report(scanned);
    let grouper = grouper.finish();
    Ok(Scanned {
        orders: scanned,
        intents: grouper.intents,
        clusters: grouper.clusters,
    })
}

/// A message of a cluster order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MessageFacts {
    pub message_id: String,
    pub topic: String,
    pub published: bool,
    /// The reconciler's `stop:{message}` mark and every consumer's key are written.
    pub stopped: bool,
}

/// An order of a cluster with what the other three ledgers say about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Facts {
    pub order: ScanOrder,
    /// A charge recorded in the payments ledger, or one the provider made under
    /// `pay:{order}` that the order never saw.
    pub charged_cents: Option<i64>,
    pub refunded_cents: Option<i64>,
    pub messages: Vec<MessageFacts>,
}

impl Facts {
    pub(crate) fn is_paid(&self) -> bool {
        self.charged_cents.is_some() && self.refunded_cents.is_none()
    }
}

/// Reads the other ledgers for one order.
pub(crate) async fn facts(c: &mut Conn<'_>, order: ScanOrder) -> Result<Facts, Error> {
    let tenant = order.tenant_id.clone();
    let id = order.order_id.clone();
    let payments = ledgers::payments_of(c, &tenant, &id).await?;
    let mut charged_cents = payments
        .iter()
        .find(|p| p.kind == "charge")
        .map(|p| p.amount_cents);
    let refunded_cents = payments
        .iter()
        .find(|p| p.kind == "refund" && p.provider_key == refund_key(&id))
        .map(|p| p.amount_cents);
    if charged_cents.is_none() {
        // A pay that died between the provider and its commit: the money moved anyway.
        let row = c
            .optional(
                sql("SELECT amount_cents FROM psp_operations \
                     WHERE tenant_id = $1 AND provider_key = $2 AND kind = 'charge'")
                .bind(&tenant)
                .bind(pay_key(&id)),
            )
            .await?;
        charged_cents = row.map(|r| r.int("amount_cents")).transpose()?;
    }
    let mut messages = Vec::new();
    for m in ledgers::messages_of(c, &tenant, &id).await? {
        let stoppable = STOPPABLE.contains(&m.topic.as_str());
        let stopped =
            stoppable && message_stopped(c, &tenant, &id, &m.message_id, &m.topic).await?;
        messages.push(MessageFacts {
            message_id: m.message_id,
            topic: m.topic,
            published: m.published_at.is_some(),
            stopped,
        });
    }
    Ok(Facts {
        order,
        charged_cents,
        refunded_cents,
        messages,
    })
}

/// The reconciler marked the message stopped and no consumer of its topic can act on it.
pub(crate) async fn message_stopped(
    c: &mut Conn<'_>,
    tenant: &str,
    order_id: &str,
    message_id: &str,
    topic: &str,
) -> Result<bool, Error> {
    if !ledgers::processed(c, RECONCILER, tenant, &stop_key(message_id)).await? {
        return Ok(false);
    }
    for consumer in consumers::of_topic(topic) {
        if let Some(key) = consumer_key(consumer, order_id) {
            if !ledgers::processed(c, consumer, tenant, &key).await? {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(id: &str, session: Option<&str>, at: i64, status: OrderStatus) -> ScanOrder {
        ScanOrder {
            order_id: id.into(),
            tenant_id: "t".into(),
            user_id: "U".into(),
            show_id: "S".into(),
            quantity: 1,
            amount_cents: 100,
            client_session: session.map(str::to_owned),
            idempotency_key: None,
            status,
            created_at: at,
            hold: Some("held".into()),
            mark: None,
        }
    }

    fn groups(orders: Vec<ScanOrder>, window_ms: i64) -> (u64, Vec<Vec<String>>) {
        let mut g = Grouper::new(window_ms);
        for o in orders {
            g.push(o);
        }
        let g = g.finish();
        let ids = g
            .clusters
            .iter()
            .map(|c| c.iter().map(|o| o.order_id.clone()).collect())
            .collect();
        (g.intents, ids)
    }

    use OrderStatus::*;

    #[test]
    fn one_session_in_the_window_is_one_cluster() {
        let (intents, clusters) = groups(
            vec![
                order("a", Some("s"), 0, PendingPayment),
                order("b", Some("s"), 500, Paid),
                order("c", Some("s"), 2_000, PendingPayment),
            ],
            120_000,
        );
        assert_eq!(intents, 1);
        assert_eq!(clusters, vec![vec!["a", "b", "c"]]);
    }

    #[test]
    fn other_sessions_and_other_windows_are_other_intents() {
        let (intents, clusters) = groups(
            vec![
                order("a", Some("s1"), 0, PendingPayment),
                order("b", Some("s2"), 10, PendingPayment),
                order("c", Some("s1"), 200_000, PendingPayment),
                order("d", None, 300_000, PendingPayment),
            ],
            120_000,
        );
        assert_eq!(intents, 4);
        assert!(clusters.is_empty(), "{clusters:?}");
    }

    #[test]
    fn the_window_is_anchored_at_the_first_order() {
        // A chain of orders 90 s apart is not one intent forever.
        let (intents, clusters) = groups(
            vec![
                order("a", Some("s"), 0, PendingPayment),
                order("b", Some("s"), 90_000, PendingPayment),
                order("c", Some("s"), 180_000, PendingPayment),
                order("d", Some("s"), 200_000, PendingPayment),
            ],
            120_000,
        );
        assert_eq!(intents, 2);
        assert_eq!(clusters, vec![vec!["a", "b"], vec!["c", "d"]]);
    }

    #[test]
    fn keyed_orders_are_their_own_intents() {
        let mut a = order("a", Some("s"), 0, PendingPayment);
        a.idempotency_key = Some("k1".into());
        let mut b = order("b", Some("s"), 10, PendingPayment);
        b.idempotency_key = Some("k2".into());
        let (intents, clusters) = groups(vec![a, b], 120_000);
        assert_eq!(intents, 2);
        assert!(clusters.is_empty());
    }

    #[test]
    fn cancelled_orders_count_only_when_an_earlier_run_marked_them() {
        let (_, clusters) = groups(
            vec![
                order("a", Some("s"), 0, Cancelled),
                order("b", Some("s"), 10, Paid),
            ],
            120_000,
        );
        assert!(
            clusters.is_empty(),
            "a customer's own cancel is not a duplicate"
        );
        let mut a = order("a", Some("s"), 0, Cancelled);
        a.mark = Some("duplicate of b".into());
        let (_, clusters) = groups(vec![a, order("b", Some("s"), 10, Paid)], 120_000);
        assert_eq!(clusters, vec![vec!["a", "b"]]);
    }

    #[test]
    fn users_and_shows_split_runs() {
        let mut b = order("b", Some("s"), 10, PendingPayment);
        b.show_id = "S2".into();
        let (intents, clusters) = groups(vec![order("a", Some("s"), 0, PendingPayment), b], 1000);
        assert_eq!(intents, 2);
        assert!(clusters.is_empty());
    }
}
