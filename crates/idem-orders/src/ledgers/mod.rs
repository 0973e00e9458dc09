//! The four ledgers — orders, payments, inventory, messages — as rows and the statements
//! that read and write them. Written once, in the SQL SQLite and PostgreSQL both accept;
//! where MySQL/MariaDB needs another form (no `ON CONFLICT`, no `RETURNING`, no `UPDATE`
//! of a table its own subquery reads), that form sits next to the shared one, chosen by
//! the connection's backend.
//!
//! Owns the row shapes and every statement on the ledger tables. Every status write is a
//! compare-and-set on the status the caller read, and asks [`crate::machine::transition`]
//! first. It must not decide business policy (limits, freezes, who may do what: that is
//! [`crate::service`]), must not open or commit transactions (callers pass a `Conn`),
//! and never deletes a row: cancelling, refunding and releasing are updates that keep
//! the history.
//!
//! One file per ledger — `orders` (with transitions and tickets), `inventory`,
//! `payments`, `messages` — re-exported here; this file keeps the shared helpers and
//! the row counts across all of them.

use serde::{Deserialize, Serialize};

use crate::db::{sql, Conn};
use crate::error::Error;

mod inventory;
mod messages;
mod orders;
mod payments;

pub(crate) use inventory::{hold_of, insert_hold, release_hold, seed_show, show, take_stock, Take};
pub use inventory::{Hold, Show, ShowSeed};
pub(crate) use messages::{
    claim_deliveries, count_publish_failure, emit, enqueue_delivery, lock_unpublished,
    mark_processed, mark_published, messages_of, pending_by_consumer, processed, settle_delivery,
    wake_deliveries,
};
pub use messages::{topics, Message};
pub(crate) use orders::{
    insert_order, insert_ticket, list_orders, move_order, order, ticket_of, transitions, Actor,
    MoveError,
};
pub use orders::{Order, OrderFilter, Ticket, Transition};
pub use payments::Payment;
pub(crate) use payments::{payments_of, record_payment};

/// A fresh, time-ordered id with a readable prefix (`ord_…`, `pay_…`).
pub(crate) fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}

pub(crate) fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// How many rows a tenant has in each ledger.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerCounts {
    pub orders: i64,
    pub charges: i64,
    pub refunds: i64,
    pub holds_held: i64,
    pub holds_released: i64,
    pub tickets: i64,
    pub messages: i64,
    pub messages_unpublished: i64,
    /// Calls the provider simulator received for this tenant.
    pub provider_calls: i64,
}

/// The row counts of a tenant in one statement, with the integer cast of `$calls`.
macro_rules! counts_sql {
    ($calls:literal) => {
        concat!(
            "SELECT \
               (SELECT COUNT(*) FROM orders WHERE tenant_id = $1) AS orders, \
               (SELECT COUNT(*) FROM payments WHERE tenant_id = $1 AND kind = 'charge') AS charges, \
               (SELECT COUNT(*) FROM payments WHERE tenant_id = $1 AND kind = 'refund') AS refunds, \
               (SELECT COUNT(*) FROM inventory_holds WHERE tenant_id = $1 AND status = 'held') AS held, \
               (SELECT COUNT(*) FROM inventory_holds WHERE tenant_id = $1 AND status = 'released') AS released, \
               (SELECT COUNT(*) FROM tickets WHERE tenant_id = $1) AS tickets, \
               (SELECT COUNT(*) FROM outbox_messages WHERE tenant_id = $1) AS messages, \
               (SELECT COUNT(*) FROM outbox_messages WHERE tenant_id = $1 AND published_at IS NULL) AS unpublished, \
               (SELECT CAST(COALESCE(SUM(calls), 0) AS ",
            $calls,
            ") FROM psp_operations WHERE tenant_id = $1) AS calls"
        )
    };
}

pub(crate) async fn counts(c: &mut Conn<'_>, tenant: &str) -> Result<LedgerCounts, Error> {
    // MySQL's `SUM` is a DECIMAL and its 64-bit integer cast is `SIGNED`.
    let q = c.pick(counts_sql!("BIGINT"), counts_sql!("SIGNED"));
    let row = c.one(sql(q).bind(tenant)).await?;
    Ok(LedgerCounts {
        orders: row.int("orders")?,
        charges: row.int("charges")?,
        refunds: row.int("refunds")?,
        holds_held: row.int("held")?,
        holds_released: row.int("released")?,
        tickets: row.int("tickets")?,
        messages: row.int("messages")?,
        messages_unpublished: row.int("unpublished")?,
        provider_calls: row.int("calls")?,
    })
}
