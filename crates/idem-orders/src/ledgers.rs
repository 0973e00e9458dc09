//! The four ledgers — orders, payments, inventory, messages — as rows and the statements
//! that read and write them. Written once, in the SQL both backends accept.
//!
//! Owns the row shapes and every statement on the ledger tables. Every status write is a
//! compare-and-set on the status the caller read, and asks [`crate::machine::transition`]
//! first. It must not decide business policy (limits, freezes, who may do what: that is
//! [`crate::service`]), must not open or commit transactions (callers pass a `Conn`),
//! and never deletes a row: cancelling, refunding and releasing are updates that keep
//! the history.

use serde::{Deserialize, Serialize};

use crate::db::{sql, Conn, Row};
use crate::error::Error;
use crate::machine::{transition, IllegalTransition, OrderEvent, OrderStatus};

/// Message topics written to the outbox.
pub mod topics {
    pub const ORDER_CREATED: &str = "order.created";
    /// Written instead of confirming a payment while `payment-confirm` is frozen.
    pub const PAYMENT_REQUESTED: &str = "payment.requested";
    pub const ORDER_PAID: &str = "order.paid";
    pub const TICKET_ISSUED: &str = "ticket.issued";
    pub const ORDER_REFUNDED: &str = "order.refunded";
    pub const ORDER_CANCELLED: &str = "order.cancelled";
    pub const INVENTORY_RELEASED: &str = "inventory.released";
}

/// A fresh, time-ordered id with a readable prefix (`ord_…`, `pay_…`).
pub(crate) fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}

pub(crate) fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn status_of(row: &Row, column: &str) -> Result<OrderStatus, Error> {
    row.text(column)?
        .parse()
        .map_err(|e| Error::Backend(format!("{column}: {e}")))
}

// ---------------------------------------------------------------------------------------
// Inventory

/// A show's stock, per tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Show {
    pub show_id: String,
    pub title: String,
    pub capacity: i64,
    pub available: i64,
    pub per_order_limit: i64,
    pub price_cents: i64,
}

/// A show to create at startup (or through the admin API) if it does not exist yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShowSeed {
    pub show_id: String,
    pub title: String,
    pub capacity: i64,
    pub per_order_limit: i64,
    pub price_cents: i64,
}

impl ShowSeed {
    /// Show ids name leases and fences (`inventory:{tenant}:{show}`): 1 to 64 of
    /// `A-Z a-z 0-9 . _ -`. Capacity and price are not negative; the limit is positive.
    pub fn check(&self) -> Result<(), Error> {
        let id_ok = !self.show_id.is_empty()
            && self.show_id.len() <= 64
            && self
                .show_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !id_ok {
            return Err(Error::InvalidInput(format!(
                "show id {:?}: 1 to 64 of A-Z a-z 0-9 . _ -",
                self.show_id
            )));
        }
        if self.capacity < 0 || self.per_order_limit < 1 || self.price_cents < 0 {
            return Err(Error::InvalidInput(
                "capacity >= 0, per_order_limit >= 1, price_cents >= 0".into(),
            ));
        }
        if self.title.is_empty() || self.title.len() > 200 {
            return Err(Error::InvalidInput("title: 1 to 200 bytes".into()));
        }
        Ok(())
    }

    /// The flash-sale catalogue every tenant gets by default (S-204 is the incident's).
    pub fn default_catalogue() -> Vec<ShowSeed> {
        vec![
            ShowSeed {
                show_id: "S-204".into(),
                title: "Flash sale: S-204".into(),
                capacity: 10_000,
                per_order_limit: 6,
                price_cents: 68_000,
            },
            ShowSeed {
                show_id: "S-101".into(),
                title: "Matinee: S-101".into(),
                capacity: 500,
                per_order_limit: 4,
                price_cents: 28_000,
            },
        ]
    }
}

fn show_from(row: &Row) -> Result<Show, Error> {
    Ok(Show {
        show_id: row.text("show_id")?,
        title: row.text("title")?,
        capacity: row.int("capacity")?,
        available: row.int("available")?,
        per_order_limit: row.int("per_order_limit")?,
        price_cents: row.int("price_cents")?,
    })
}

/// Creates the show if absent; an existing show is left as it is. Returns the show.
pub(crate) async fn seed_show(
    c: &mut Conn<'_>,
    tenant: &str,
    seed: &ShowSeed,
    now: i64,
) -> Result<Show, Error> {
    c.execute(
        sql(
            "INSERT INTO inventory (tenant_id, show_id, title, capacity, available, \
               per_order_limit, price_cents, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $4, $5, $6, $7, $7) \
             ON CONFLICT (tenant_id, show_id) DO NOTHING",
        )
        .bind(tenant)
        .bind(&seed.show_id)
        .bind(&seed.title)
        .bind(seed.capacity)
        .bind(seed.per_order_limit)
        .bind(seed.price_cents)
        .bind(now),
    )
    .await?;
    show(c, tenant, &seed.show_id)
        .await?
        .ok_or_else(|| Error::Backend("seeded show vanished".into()))
}

pub(crate) async fn show(
    c: &mut Conn<'_>,
    tenant: &str,
    show_id: &str,
) -> Result<Option<Show>, Error> {
    c.optional(
        sql(
            "SELECT show_id, title, capacity, available, per_order_limit, price_cents \
             FROM inventory WHERE tenant_id = $1 AND show_id = $2",
        )
        .bind(tenant)
        .bind(show_id),
    )
    .await?
    .as_ref()
    .map(show_from)
    .transpose()
}

/// Takes `quantity` from the show's stock if that much is left (one atomic statement).
pub(crate) async fn take_stock(
    c: &mut Conn<'_>,
    tenant: &str,
    show_id: &str,
    quantity: i64,
    now: i64,
) -> Result<bool, Error> {
    Ok(c.execute(
        sql(
            "UPDATE inventory SET available = available - $3, updated_at = $4 \
             WHERE tenant_id = $1 AND show_id = $2 AND available >= $3",
        )
        .bind(tenant)
        .bind(show_id)
        .bind(quantity)
        .bind(now),
    )
    .await?
        == 1)
}

/// One inventory hold (voucher) per order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    pub hold_id: String,
    pub order_id: String,
    pub show_id: String,
    pub quantity: i64,
    /// `held` or `released`.
    pub status: String,
    pub created_at: i64,
    pub released_at: Option<i64>,
    /// The fencing token the release was written with.
    pub release_token: Option<i64>,
    pub release_owner: Option<String>,
}

fn hold_from(row: &Row) -> Result<Hold, Error> {
    Ok(Hold {
        hold_id: row.text("hold_id")?,
        order_id: row.text("order_id")?,
        show_id: row.text("show_id")?,
        quantity: row.int("quantity")?,
        status: row.text("status")?,
        created_at: row.int("created_at")?,
        released_at: row.opt_int("released_at")?,
        release_token: row.opt_int("release_token")?,
        release_owner: row.opt_text("release_owner")?,
    })
}

pub(crate) async fn insert_hold(
    c: &mut Conn<'_>,
    tenant: &str,
    order_id: &str,
    show_id: &str,
    quantity: i64,
    now: i64,
) -> Result<Hold, Error> {
    let hold_id = new_id("hold");
    c.execute(
        sql(
            "INSERT INTO inventory_holds (hold_id, tenant_id, order_id, show_id, quantity, \
               status, created_at) VALUES ($1, $2, $3, $4, $5, 'held', $6)",
        )
        .bind(&hold_id)
        .bind(tenant)
        .bind(order_id)
        .bind(show_id)
        .bind(quantity)
        .bind(now),
    )
    .await?;
    Ok(Hold {
        hold_id,
        order_id: order_id.to_owned(),
        show_id: show_id.to_owned(),
        quantity,
        status: "held".into(),
        created_at: now,
        released_at: None,
        release_token: None,
        release_owner: None,
    })
}

pub(crate) async fn hold_of(
    c: &mut Conn<'_>,
    tenant: &str,
    order_id: &str,
) -> Result<Option<Hold>, Error> {
    const Q: &str = "SELECT hold_id, order_id, show_id, quantity, status, created_at, \
         released_at, release_token, release_owner \
         FROM inventory_holds WHERE tenant_id = $1 AND order_id = $2";
    c.optional(sql(Q).bind(tenant).bind(order_id))
        .await?
        .as_ref()
        .map(hold_from)
        .transpose()
}

/// Releases the order's hold (held → released) and returns its quantity to the show's
/// stock, recording the fencing token and owner that did it. False when the hold was
/// already released (nothing changes).
pub(crate) async fn release_hold(
    c: &mut Conn<'_>,
    tenant: &str,
    order_id: &str,
    token: i64,
    owner: &str,
    now: i64,
) -> Result<bool, Error> {
    let released = c
        .optional(
            sql(
                "UPDATE inventory_holds SET status = 'released', released_at = $3, \
                   release_token = $4, release_owner = $5 \
                 WHERE tenant_id = $1 AND order_id = $2 AND status = 'held' \
                 RETURNING show_id, quantity",
            )
            .bind(tenant)
            .bind(order_id)
            .bind(now)
            .bind(token)
            .bind(owner),
        )
        .await?;
    let Some(row) = released else {
        return Ok(false);
    };
    c.execute(
        sql(
            "UPDATE inventory SET available = available + $3, updated_at = $4 \
             WHERE tenant_id = $1 AND show_id = $2",
        )
        .bind(tenant)
        .bind(row.text("show_id")?)
        .bind(row.int("quantity")?)
        .bind(now),
    )
    .await?;
    Ok(true)
}

// ---------------------------------------------------------------------------------------
// Orders

/// An order row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Order {
    pub order_id: String,
    pub tenant_id: String,
    pub user_id: String,
    pub show_id: String,
    pub quantity: i64,
    pub amount_cents: i64,
    pub client_session: Option<String>,
    pub idempotency_key: Option<String>,
    pub status: OrderStatus,
    pub version: i64,
    pub created_at: i64,
    pub updated_at: i64,
    pub paid_at: Option<i64>,
    pub ticketed_at: Option<i64>,
    pub refunded_at: Option<i64>,
    pub cancelled_at: Option<i64>,
}

fn order_from(row: &Row) -> Result<Order, Error> {
    Ok(Order {
        order_id: row.text("order_id")?,
        tenant_id: row.text("tenant_id")?,
        user_id: row.text("user_id")?,
        show_id: row.text("show_id")?,
        quantity: row.int("quantity")?,
        amount_cents: row.int("amount_cents")?,
        client_session: row.opt_text("client_session")?,
        idempotency_key: row.opt_text("idempotency_key")?,
        status: status_of(row, "status")?,
        version: row.int("version")?,
        created_at: row.int("created_at")?,
        updated_at: row.int("updated_at")?,
        paid_at: row.opt_int("paid_at")?,
        ticketed_at: row.opt_int("ticketed_at")?,
        refunded_at: row.opt_int("refunded_at")?,
        cancelled_at: row.opt_int("cancelled_at")?,
    })
}

/// Who made a change, for the transition log.
pub(crate) struct Actor<'a> {
    pub name: &'a str,
    pub detail: Option<String>,
}

impl<'a> Actor<'a> {
    pub(crate) fn new(name: &'a str) -> Self {
        Self { name, detail: None }
    }

    pub(crate) fn detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }
}

pub(crate) async fn insert_order(
    c: &mut Conn<'_>,
    order: &Order,
    actor: &Actor<'_>,
) -> Result<(), Error> {
    c.execute(
        sql(
            "INSERT INTO orders (order_id, tenant_id, user_id, show_id, quantity, \
               amount_cents, client_session, idempotency_key, status, version, created_at, \
               updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 1, $10, $10)",
        )
        .bind(&order.order_id)
        .bind(&order.tenant_id)
        .bind(&order.user_id)
        .bind(&order.show_id)
        .bind(order.quantity)
        .bind(order.amount_cents)
        .bind(order.client_session.clone())
        .bind(order.idempotency_key.clone())
        .bind(order.status.as_str())
        .bind(order.created_at),
    )
    .await?;
    log_transition(
        c,
        order,
        None,
        order.status,
        "create",
        actor,
        order.created_at,
    )
    .await
}

async fn log_transition(
    c: &mut Conn<'_>,
    order: &Order,
    from: Option<OrderStatus>,
    to: OrderStatus,
    event: &str,
    actor: &Actor<'_>,
    now: i64,
) -> Result<(), Error> {
    c.execute(
        sql(
            "INSERT INTO order_transitions (transition_id, tenant_id, order_id, from_status, \
               to_status, event, at, actor, detail) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(new_id("tr"))
        .bind(&order.tenant_id)
        .bind(&order.order_id)
        .bind(from.map(OrderStatus::as_str))
        .bind(to.as_str())
        .bind(event)
        .bind(now)
        .bind(actor.name)
        .bind(actor.detail.clone()),
    )
    .await?;
    Ok(())
}

pub(crate) async fn order(
    c: &mut Conn<'_>,
    tenant: &str,
    order_id: &str,
) -> Result<Option<Order>, Error> {
    const Q: &str = "SELECT order_id, tenant_id, user_id, show_id, quantity, amount_cents, \
         client_session, idempotency_key, status, version, created_at, updated_at, paid_at, \
         ticketed_at, refunded_at, cancelled_at FROM orders WHERE tenant_id = $1 AND order_id = $2";
    c.optional(sql(Q).bind(tenant).bind(order_id))
        .await?
        .as_ref()
        .map(order_from)
        .transpose()
}

/// Filters for listing orders.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct OrderFilter {
    pub user_id: Option<String>,
    pub show_id: Option<String>,
    pub client_session: Option<String>,
    pub limit: Option<i64>,
}

pub(crate) async fn list_orders(
    c: &mut Conn<'_>,
    tenant: &str,
    filter: &OrderFilter,
) -> Result<Vec<Order>, Error> {
    let limit = filter.limit.unwrap_or(100).clamp(1, 1000);
    c.all(
        sql(
            "SELECT order_id, tenant_id, user_id, show_id, quantity, amount_cents, \
               client_session, idempotency_key, status, version, created_at, updated_at, paid_at, \
               ticketed_at, refunded_at, cancelled_at FROM orders \
             WHERE tenant_id = $1 AND ($2 IS NULL OR user_id = $2) \
               AND ($3 IS NULL OR show_id = $3) AND ($4 IS NULL OR client_session = $4) \
             ORDER BY created_at, order_id LIMIT $5",
        )
        .bind(tenant)
        .bind(filter.user_id.clone())
        .bind(filter.show_id.clone())
        .bind(filter.client_session.clone())
        .bind(limit),
    )
    .await?
    .iter()
    .map(order_from)
    .collect()
}

/// Why an order could not be moved.
#[derive(Debug)]
pub(crate) enum MoveError {
    /// The machine has no such edge from the status the caller read.
    Illegal(IllegalTransition),
    /// The order was moved by someone else since the caller read it.
    Raced,
    Db(Error),
}

impl From<Error> for MoveError {
    fn from(e: Error) -> Self {
        MoveError::Db(e)
    }
}

/// Moves `order` along `event`: asks the machine, then writes with a compare-and-set on
/// the status the caller read, and logs the transition. Returns the moved order.
pub(crate) async fn move_order(
    c: &mut Conn<'_>,
    order: &Order,
    event: OrderEvent,
    actor: &Actor<'_>,
    now: i64,
) -> Result<Order, MoveError> {
    let to = transition(order.status, event).map_err(MoveError::Illegal)?;
    let row = c
        .optional(
            sql(
                "UPDATE orders SET status = $4, version = version + 1, updated_at = $5, \
                   paid_at = CASE WHEN $4 = 'paid' THEN $5 ELSE paid_at END, \
                   ticketed_at = CASE WHEN $4 = 'ticketed' THEN $5 ELSE ticketed_at END, \
                   refunded_at = CASE WHEN $4 = 'refunded' THEN $5 ELSE refunded_at END, \
                   cancelled_at = CASE WHEN $4 = 'cancelled' THEN $5 ELSE cancelled_at END \
                 WHERE tenant_id = $1 AND order_id = $2 AND status = $3 \
                 RETURNING order_id, tenant_id, user_id, show_id, quantity, amount_cents, \
                   client_session, idempotency_key, status, version, created_at, updated_at, \
                   paid_at, ticketed_at, refunded_at, cancelled_at",
            )
            .bind(&order.tenant_id)
            .bind(&order.order_id)
            .bind(order.status.as_str())
            .bind(to.as_str())
            .bind(now),
        )
        .await?;
    let Some(row) = row else {
        return Err(MoveError::Raced);
    };
    let moved = order_from(&row)?;
    log_transition(
        c,
        &moved,
        Some(order.status),
        to,
        event.as_str(),
        actor,
        now,
    )
    .await?;
    Ok(moved)
}

/// One line of an order's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transition {
    pub from_status: Option<String>,
    pub to_status: String,
    pub event: String,
    pub at: i64,
    pub actor: String,
    pub detail: Option<String>,
}

pub(crate) async fn transitions(
    c: &mut Conn<'_>,
    tenant: &str,
    order_id: &str,
) -> Result<Vec<Transition>, Error> {
    c.all(
        sql(
            "SELECT from_status, to_status, event, at, actor, detail FROM order_transitions \
             WHERE tenant_id = $1 AND order_id = $2 ORDER BY at, transition_id",
        )
        .bind(tenant)
        .bind(order_id),
    )
    .await?
    .iter()
    .map(|r| {
        Ok(Transition {
            from_status: r.opt_text("from_status")?,
            to_status: r.text("to_status")?,
            event: r.text("event")?,
            at: r.int("at")?,
            actor: r.text("actor")?,
            detail: r.opt_text("detail")?,
        })
    })
    .collect()
}

// ---------------------------------------------------------------------------------------
// Payments

/// A charge or refund the provider confirmed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payment {
    pub payment_id: String,
    pub order_id: String,
    /// `charge` or `refund`.
    pub kind: String,
    /// The business-derived key the provider deduplicated on.
    pub provider_key: String,
    pub provider_ref: String,
    pub amount_cents: i64,
    pub status: String,
    pub created_at: i64,
}

/// Records a provider-confirmed payment once per provider key. False when it was
/// already recorded.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn record_payment(
    c: &mut Conn<'_>,
    tenant: &str,
    order_id: &str,
    kind: &str,
    provider_key: &str,
    provider_ref: &str,
    amount_cents: i64,
    now: i64,
) -> Result<bool, Error> {
    Ok(c.execute(
        sql(
            "INSERT INTO payments (payment_id, tenant_id, order_id, kind, provider_key, \
               provider_ref, amount_cents, status, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, 'succeeded', $8) \
             ON CONFLICT (tenant_id, provider_key) DO NOTHING",
        )
        .bind(new_id("pay"))
        .bind(tenant)
        .bind(order_id)
        .bind(kind)
        .bind(provider_key)
        .bind(provider_ref)
        .bind(amount_cents)
        .bind(now),
    )
    .await?
        == 1)
}

pub(crate) async fn payments_of(
    c: &mut Conn<'_>,
    tenant: &str,
    order_id: &str,
) -> Result<Vec<Payment>, Error> {
    c.all(
        sql(
            "SELECT payment_id, order_id, kind, provider_key, provider_ref, amount_cents, \
               status, created_at FROM payments WHERE tenant_id = $1 AND order_id = $2 \
             ORDER BY created_at, payment_id",
        )
        .bind(tenant)
        .bind(order_id),
    )
    .await?
    .iter()
    .map(|r| {
        Ok(Payment {
            payment_id: r.text("payment_id")?,
            order_id: r.text("order_id")?,
            kind: r.text("kind")?,
            provider_key: r.text("provider_key")?,
            provider_ref: r.text("provider_ref")?,
            amount_cents: r.int("amount_cents")?,
            status: r.text("status")?,
            created_at: r.int("created_at")?,
        })
    })
    .collect()
}

// ---------------------------------------------------------------------------------------
// Tickets

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ticket {
    pub ticket_id: String,
    pub order_id: String,
    pub quantity: i64,
    pub issued_at: i64,
    /// The `order.paid` message it was issued for.
    pub message_id: String,
}

/// Issues the order's ticket; false when it already has one (UNIQUE(order_id)).
pub(crate) async fn insert_ticket(
    c: &mut Conn<'_>,
    order: &Order,
    message_id: &str,
    now: i64,
) -> Result<bool, Error> {
    Ok(c.execute(
        sql(
            "INSERT INTO tickets (ticket_id, tenant_id, order_id, user_id, show_id, quantity, \
               issued_at, message_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (order_id) DO NOTHING",
        )
        .bind(new_id("tkt"))
        .bind(&order.tenant_id)
        .bind(&order.order_id)
        .bind(&order.user_id)
        .bind(&order.show_id)
        .bind(order.quantity)
        .bind(now)
        .bind(message_id),
    )
    .await?
        == 1)
}

pub(crate) async fn ticket_of(
    c: &mut Conn<'_>,
    tenant: &str,
    order_id: &str,
) -> Result<Option<Ticket>, Error> {
    c.optional(
        sql(
            "SELECT ticket_id, order_id, quantity, issued_at, message_id FROM tickets \
             WHERE tenant_id = $1 AND order_id = $2",
        )
        .bind(tenant)
        .bind(order_id),
    )
    .await?
    .map(|r| {
        Ok(Ticket {
            ticket_id: r.text("ticket_id")?,
            order_id: r.text("order_id")?,
            quantity: r.int("quantity")?,
            issued_at: r.int("issued_at")?,
            message_id: r.text("message_id")?,
        })
    })
    .transpose()
}

// ---------------------------------------------------------------------------------------
// Messages

/// An outbox message, as stored and as carried by every transport.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub message_id: String,
    pub tenant_id: String,
    pub topic: String,
    pub order_id: String,
    pub user_id: String,
    pub show_id: String,
    pub payload: serde_json::Value,
    pub created_at: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published_at: Option<i64>,
}

fn message_from(row: &Row) -> Result<Message, Error> {
    let payload = row.text("payload")?;
    Ok(Message {
        message_id: row.text("message_id")?,
        tenant_id: row.text("tenant_id")?,
        topic: row.text("topic")?,
        order_id: row.text("order_id")?,
        user_id: row.text("user_id")?,
        show_id: row.text("show_id")?,
        payload: serde_json::from_str(&payload)
            .map_err(|e| Error::Backend(format!("message payload: {e}")))?,
        created_at: row.int("created_at")?,
        published_at: row.opt_int("published_at")?,
    })
}

/// Writes `topic` for `order` to the outbox, in the caller's transaction. One message
/// per (topic, order): a second emission returns `None` and writes nothing.
pub(crate) async fn emit(
    c: &mut Conn<'_>,
    order: &Order,
    topic: &str,
    now: i64,
) -> Result<Option<String>, Error> {
    let message_id = new_id("msg");
    let payload = serde_json::json!({
        "order_id": order.order_id,
        "user_id": order.user_id,
        "show_id": order.show_id,
        "quantity": order.quantity,
        "amount_cents": order.amount_cents,
        "client_session": order.client_session,
        "status": order.status,
    });
    let written = c
        .execute(
            sql(
                "INSERT INTO outbox_messages (message_id, tenant_id, topic, order_id, user_id, \
                   show_id, payload, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
                 ON CONFLICT (tenant_id, topic, order_id) DO NOTHING",
            )
            .bind(&message_id)
            .bind(&order.tenant_id)
            .bind(topic)
            .bind(&order.order_id)
            .bind(&order.user_id)
            .bind(&order.show_id)
            .bind(payload.to_string())
            .bind(now),
        )
        .await?;
    Ok((written == 1).then_some(message_id))
}

pub(crate) async fn messages_of(
    c: &mut Conn<'_>,
    tenant: &str,
    order_id: &str,
) -> Result<Vec<Message>, Error> {
    const Q: &str = "SELECT message_id, tenant_id, topic, order_id, user_id, show_id, payload, \
         created_at, published_at FROM outbox_messages WHERE tenant_id = $1 AND order_id = $2 \
         ORDER BY created_at, message_id";
    c.all(sql(Q).bind(tenant).bind(order_id))
        .await?
        .iter()
        .map(message_from)
        .collect()
}

pub(crate) async fn unpublished(c: &mut Conn<'_>, limit: i64) -> Result<Vec<Message>, Error> {
    c.all(
        sql(
            "SELECT message_id, tenant_id, topic, order_id, user_id, show_id, payload, \
               created_at, published_at FROM outbox_messages WHERE published_at IS NULL \
             ORDER BY created_at, message_id LIMIT $1",
        )
        .bind(limit),
    )
    .await?
    .iter()
    .map(message_from)
    .collect()
}

pub(crate) async fn mark_published(
    c: &mut Conn<'_>,
    message_id: &str,
    now: i64,
) -> Result<(), Error> {
    c.execute(
        sql("UPDATE outbox_messages SET published_at = $2, \
               publish_attempts = publish_attempts + 1 \
             WHERE message_id = $1 AND published_at IS NULL")
        .bind(message_id)
        .bind(now),
    )
    .await?;
    Ok(())
}

pub(crate) async fn count_publish_failure(c: &mut Conn<'_>, message_id: &str) -> Result<(), Error> {
    c.execute(
        sql(
            "UPDATE outbox_messages SET publish_attempts = publish_attempts + 1 \
             WHERE message_id = $1",
        )
        .bind(message_id),
    )
    .await?;
    Ok(())
}

/// Queues `message_id` for `consumer` (in-process transport). Idempotent.
pub(crate) async fn enqueue_delivery(
    c: &mut Conn<'_>,
    consumer: &str,
    message_id: &str,
    now: i64,
) -> Result<(), Error> {
    c.execute(
        sql(
            "INSERT INTO message_deliveries (consumer, message_id, state, attempts, \
               available_at, created_at) VALUES ($1, $2, 'pending', 0, $3, $3) \
             ON CONFLICT (consumer, message_id) DO NOTHING",
        )
        .bind(consumer)
        .bind(message_id)
        .bind(now),
    )
    .await?;
    Ok(())
}

/// Pending deliveries of `consumer` that are due, oldest message first.
pub(crate) async fn due_deliveries(
    c: &mut Conn<'_>,
    consumer: &str,
    now: i64,
    limit: i64,
) -> Result<Vec<Message>, Error> {
    c.all(
        sql(
            "SELECT m.message_id, m.tenant_id, m.topic, m.order_id, m.user_id, m.show_id, \
               m.payload, m.created_at, m.published_at \
             FROM message_deliveries d JOIN outbox_messages m ON m.message_id = d.message_id \
             WHERE d.consumer = $1 AND d.state = 'pending' AND d.available_at <= $2 \
             ORDER BY m.created_at, m.message_id LIMIT $3",
        )
        .bind(consumer)
        .bind(now)
        .bind(limit),
    )
    .await?
    .iter()
    .map(message_from)
    .collect()
}

/// Ends a delivery: acked, or back to pending until `retry_at` with the reason.
pub(crate) async fn settle_delivery(
    c: &mut Conn<'_>,
    consumer: &str,
    message_id: &str,
    outcome: Result<i64, (i64, String)>,
) -> Result<(), Error> {
    match outcome {
        Ok(now) => {
            c.execute(
                sql(
                    "UPDATE message_deliveries SET state = 'acked', attempts = attempts + 1, \
                       acked_at = $3, last_error = NULL \
                     WHERE consumer = $1 AND message_id = $2 AND state = 'pending'",
                )
                .bind(consumer)
                .bind(message_id)
                .bind(now),
            )
            .await?
        }
        Err((retry_at, reason)) => {
            c.execute(
                sql(
                    "UPDATE message_deliveries SET attempts = attempts + 1, available_at = $3, \
                       last_error = $4 \
                     WHERE consumer = $1 AND message_id = $2 AND state = 'pending'",
                )
                .bind(consumer)
                .bind(message_id)
                .bind(retry_at)
                .bind(reason),
            )
            .await?
        }
    };
    Ok(())
}

/// Makes every pending delivery due now (after an unfreeze).
pub(crate) async fn wake_deliveries(c: &mut Conn<'_>, now: i64) -> Result<u64, Error> {
    c.execute(
        sql("UPDATE message_deliveries SET available_at = $1 \
             WHERE state = 'pending' AND available_at > $1")
        .bind(now),
    )
    .await
}

/// Pending deliveries per consumer.
pub(crate) async fn pending_by_consumer(c: &mut Conn<'_>) -> Result<Vec<(String, i64)>, Error> {
    c.all(sql(
        "SELECT consumer, COUNT(*) AS n FROM message_deliveries WHERE state = 'pending' \
         GROUP BY consumer ORDER BY consumer",
    ))
    .await?
    .iter()
    .map(|r| Ok((r.text("consumer")?, r.int("n")?)))
    .collect()
}

/// Whether `consumer` already processed `business_key`.
pub(crate) async fn processed(
    c: &mut Conn<'_>,
    consumer: &str,
    tenant: &str,
    business_key: &str,
) -> Result<bool, Error> {
    Ok(c.optional(
        sql("SELECT outcome FROM consumer_processed \
                 WHERE consumer = $1 AND tenant_id = $2 AND business_key = $3")
        .bind(consumer)
        .bind(tenant)
        .bind(business_key),
    )
    .await?
    .is_some())
}

/// Records that `consumer` processed `business_key`; false when it already had.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn mark_processed(
    c: &mut Conn<'_>,
    consumer: &str,
    tenant: &str,
    business_key: &str,
    order_id: &str,
    message_id: &str,
    outcome: &str,
    now: i64,
) -> Result<bool, Error> {
    Ok(c.execute(
        sql(
            "INSERT INTO consumer_processed (consumer, tenant_id, business_key, order_id, \
               message_id, outcome, processed_at) VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (consumer, tenant_id, business_key) DO NOTHING",
        )
        .bind(consumer)
        .bind(tenant)
        .bind(business_key)
        .bind(order_id)
        .bind(message_id)
        .bind(outcome)
        .bind(now),
    )
    .await?
        == 1)
}

// ---------------------------------------------------------------------------------------
// Counts

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

pub(crate) async fn counts(c: &mut Conn<'_>, tenant: &str) -> Result<LedgerCounts, Error> {
    let row = c
        .one(
            sql("SELECT \
                   (SELECT COUNT(*) FROM orders WHERE tenant_id = $1) AS orders, \
                   (SELECT COUNT(*) FROM payments WHERE tenant_id = $1 AND kind = 'charge') AS charges, \
                   (SELECT COUNT(*) FROM payments WHERE tenant_id = $1 AND kind = 'refund') AS refunds, \
                   (SELECT COUNT(*) FROM inventory_holds WHERE tenant_id = $1 AND status = 'held') AS held, \
                   (SELECT COUNT(*) FROM inventory_holds WHERE tenant_id = $1 AND status = 'released') AS released, \
                   (SELECT COUNT(*) FROM tickets WHERE tenant_id = $1) AS tickets, \
                   (SELECT COUNT(*) FROM outbox_messages WHERE tenant_id = $1) AS messages, \
                   (SELECT COUNT(*) FROM outbox_messages WHERE tenant_id = $1 AND published_at IS NULL) AS unpublished, \
                   (SELECT CAST(COALESCE(SUM(calls), 0) AS BIGINT) FROM psp_operations WHERE tenant_id = $1) AS calls")
            .bind(tenant),
        )
        .await?;
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
