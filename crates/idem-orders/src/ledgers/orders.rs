//! The orders ledger: order rows, their status moves with the transition log, and the
//! one ticket a paid order gets.
//!
//! Owns the `orders`, `order_transitions` and `tickets` statements. Every status write
//! asks [`crate::machine::transition`] first and is a compare-and-set on the status the
//! caller read. It must not decide which event a request means, and never deletes a
//! row.

use idem_sql::Backend;
use serde::{Deserialize, Serialize};

use super::new_id;
use crate::db::{sql, Conn, Row};
use crate::error::Error;
use crate::machine::{transition, IllegalTransition, OrderEvent, OrderStatus};

fn status_of(row: &Row, column: &str) -> Result<OrderStatus, Error> {
    row.text(column)?
        .parse()
        .map_err(|e| Error::Backend(format!("{column}: {e}")))
}

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

/// Inserts the order and its first transition. False (nothing written) when an order
/// under the same idempotency key exists: a duplicate's order, committed while this
/// insert waited on it.
pub(crate) async fn insert_order(
    c: &mut Conn<'_>,
    order: &Order,
    actor: &Actor<'_>,
) -> Result<bool, Error> {
    let insert = c.pick(
        "INSERT INTO orders (order_id, tenant_id, user_id, show_id, quantity, \
           amount_cents, client_session, idempotency_key, status, version, created_at, \
           updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 1, $10, $10) \
         ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL \
         DO NOTHING",
        "INSERT INTO orders (order_id, tenant_id, user_id, show_id, quantity, \
           amount_cents, client_session, idempotency_key, status, version, created_at, \
           updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 1, $10, $10)",
    );
    let inserted = c
        .insert_new(
            sql(insert)
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
    if inserted == 0 {
        return Ok(false);
    }
    log_transition(
        c,
        order,
        None,
        order.status,
        "create",
        actor,
        order.created_at,
    )
    .await?;
    Ok(true)
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
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
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
    let update = c.pick(
        "UPDATE orders SET status = $4, version = version + 1, updated_at = $5, \
           paid_at = CASE WHEN $4 = 'paid' THEN $5 ELSE paid_at END, \
           ticketed_at = CASE WHEN $4 = 'ticketed' THEN $5 ELSE ticketed_at END, \
           refunded_at = CASE WHEN $4 = 'refunded' THEN $5 ELSE refunded_at END, \
           cancelled_at = CASE WHEN $4 = 'cancelled' THEN $5 ELSE cancelled_at END \
         WHERE tenant_id = $1 AND order_id = $2 AND status = $3 \
         RETURNING order_id, tenant_id, user_id, show_id, quantity, amount_cents, \
           client_session, idempotency_key, status, version, created_at, updated_at, \
           paid_at, ticketed_at, refunded_at, cancelled_at",
        // MySQL has no UPDATE … RETURNING: the moved row is read back below.
        "UPDATE orders SET status = $4, version = version + 1, updated_at = $5, \
           paid_at = CASE WHEN $4 = 'paid' THEN $5 ELSE paid_at END, \
           ticketed_at = CASE WHEN $4 = 'ticketed' THEN $5 ELSE ticketed_at END, \
           refunded_at = CASE WHEN $4 = 'refunded' THEN $5 ELSE refunded_at END, \
           cancelled_at = CASE WHEN $4 = 'cancelled' THEN $5 ELSE cancelled_at END \
         WHERE tenant_id = $1 AND order_id = $2 AND status = $3",
    );
    let q = sql(update)
        .bind(&order.tenant_id)
        .bind(&order.order_id)
        .bind(order.status.as_str())
        .bind(to.as_str())
        .bind(now);
    let row = if c.backend() == Backend::Mysql {
        if c.execute(q).await? == 0 {
            return Err(MoveError::Raced);
        }
        // This transaction's own write, which it holds locked.
        self::order(c, &order.tenant_id, &order.order_id).await?
    } else {
        c.optional(q)
            .await?
            .map(|row| order_from(&row))
            .transpose()?
    };
    let Some(moved) = row else {
        return Err(MoveError::Raced);
    };
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
    let insert = c.pick(
        "INSERT INTO tickets (ticket_id, tenant_id, order_id, user_id, show_id, quantity, \
           issued_at, message_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
         ON CONFLICT (order_id) DO NOTHING",
        "INSERT INTO tickets (ticket_id, tenant_id, order_id, user_id, show_id, quantity, \
           issued_at, message_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    );
    Ok(c.insert_new(
        sql(insert)
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
