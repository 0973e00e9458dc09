//! The ledger check that ends every run: what must hold after compensation, read back
//! from the ledgers (never from what the run believes it did).

use crate::db::{sql, Database};
use crate::error::Error;
use crate::machine::OrderStatus;

use super::gather::Survey;
use super::scan::{self, STOPPABLE};
use super::{Check, ReconcileOptions};

/// Refunds in scope with no charge of the same order and amount.
const UNMATCHED_REFUNDS: &str = "SELECT r.order_id, r.amount_cents FROM payments r \
     WHERE r.kind = 'refund' AND ($1 IS NULL OR r.tenant_id = $1) \
       AND NOT EXISTS (SELECT 1 FROM payments c WHERE c.tenant_id = r.tenant_id \
         AND c.order_id = r.order_id AND c.kind = 'charge' AND c.amount_cents = r.amount_cents) \
     ORDER BY r.order_id LIMIT 20";

const ORPHAN_TRANSITIONS: &str = "SELECT COUNT(*) AS n FROM order_transitions t \
     WHERE t.event = 'create' AND ($1 IS NULL OR t.tenant_id = $1) \
       AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.order_id = t.order_id)";
const ORPHAN_HOLDS: &str = "SELECT COUNT(*) AS n FROM inventory_holds h \
     WHERE ($1 IS NULL OR h.tenant_id = $1) \
       AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.order_id = h.order_id)";
const ORPHAN_PAYMENTS: &str = "SELECT COUNT(*) AS n FROM payments p \
     WHERE ($1 IS NULL OR p.tenant_id = $1) \
       AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.order_id = p.order_id)";
const ORPHAN_MESSAGES: &str = "SELECT COUNT(*) AS n FROM outbox_messages m \
     WHERE ($1 IS NULL OR m.tenant_id = $1) \
       AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.order_id = m.order_id)";

fn check(name: &str, detail: &str, failures: Vec<String>) -> Check {
    Check {
        name: name.into(),
        passed: failures.is_empty(),
        detail: detail.into(),
        failures,
    }
}

pub(crate) async fn run(
    db: &Database,
    o: &ReconcileOptions,
    survey: &Survey,
    orders_before: u64,
) -> Result<Vec<Check>, Error> {
    let mut checks = Vec::new();
    let duplicates = survey
        .facts
        .iter()
        .zip(&survey.clusters)
        .flat_map(|(facts, cl)| {
            facts
                .iter()
                .filter(move |f| cl.keeper.as_deref() != Some(f.order.order_id.as_str()))
        });
    let cancelled = || {
        survey
            .facts
            .iter()
            .flatten()
            .filter(|f| f.order.status == OrderStatus::Cancelled)
    };

    let held: Vec<String> = cancelled()
        .filter(|f| f.order.holds_voucher())
        .map(|f| format!("{}: cancelled, hold still held", f.order.order_id))
        .collect();
    checks.push(check(
        "holds-released",
        "every cancelled order of the clusters has its inventory hold released",
        held,
    ));

    let mut money = Vec::new();
    let mut conn = db.acquire().await?;
    for row in conn
        .conn()
        .all(sql(UNMATCHED_REFUNDS).bind(o.tenant.clone()))
        .await?
    {
        money.push(format!(
            "{}: refund of {} cents matches no charge",
            row.text("order_id")?,
            row.int("amount_cents")?
        ));
    }
    drop(conn);
    for f in cancelled() {
        if f.charged_cents.is_some() && f.refunded_cents.is_none() {
            money.push(format!(
                "{}: cancelled but its charge of {} cents is not refunded",
                f.order.order_id,
                f.charged_cents.unwrap_or(0)
            ));
        }
    }
    checks.push(check(
        "refunds-match-charges",
        "every refund matches a charge of the same order and amount; no cancelled order keeps its money",
        money,
    ));

    let mut unstopped = Vec::new();
    for f in duplicates.filter(|f| f.order.status == OrderStatus::Cancelled) {
        for m in &f.messages {
            if STOPPABLE.contains(&m.topic.as_str()) && !m.stopped {
                unstopped.push(format!(
                    "{}: {} {} not stopped",
                    f.order.order_id, m.topic, m.message_id
                ));
            }
        }
    }
    checks.push(check(
        "messages-stopped",
        "every message of a cancelled duplicate that could make the chain act is stopped",
        unstopped,
    ));

    let mut deleted = Vec::new();
    let now = orders_now(db, o).await?;
    if now < orders_before {
        deleted.push(format!(
            "{} orders in scope at the start, {now} now",
            orders_before
        ));
    }
    let tenant = o.tenant.as_deref();
    for (what, q) in [
        ("order_transitions (create)", ORPHAN_TRANSITIONS),
        ("inventory_holds", ORPHAN_HOLDS),
        ("payments", ORPHAN_PAYMENTS),
        ("outbox_messages", ORPHAN_MESSAGES),
    ] {
        let n = orphans(db, tenant, q).await?;
        if n > 0 {
            deleted.push(format!(
                "{n} {what} rows name an order that no longer exists"
            ));
        }
    }
    checks.push(check(
        "no-order-deleted",
        "no order row was deleted: the scope's count did not drop and no ledger row names a missing order",
        deleted,
    ));
    Ok(checks)
}

/// Orders in scope now, for the deletion check.
async fn orders_now(db: &Database, o: &ReconcileOptions) -> Result<u64, Error> {
    scan::count(db, o).await
}

/// Rows of `table` whose order is gone (`table` is one of the ledger tables).
async fn orphans(db: &Database, tenant: Option<&str>, query: &'static str) -> Result<i64, Error> {
    let mut conn = db.acquire().await?;
    conn.conn().one(sql(query).bind(tenant)).await?.int("n")
}
