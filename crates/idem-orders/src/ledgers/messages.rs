//! The messages ledger: the transactional outbox (one message per topic and order),
//! the in-process deliveries per consumer, and the business keys each consumer
//! processed.
//!
//! Owns the `outbox_messages`, `message_deliveries` and `consumer_processed`
//! statements and the topic names. It must not publish to a transport or run a
//! consumer; the chain and the service do, in the caller's transaction.

use idem_sql::Backend;
use serde::{Deserialize, Serialize};

use super::{new_id, Order};
use crate::db::{sql, Conn, Row};
use crate::error::Error;

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
    let insert = c.pick(
        "INSERT INTO outbox_messages (message_id, tenant_id, topic, order_id, user_id, \
           show_id, payload, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
         ON CONFLICT (tenant_id, topic, order_id) DO NOTHING",
        "INSERT INTO outbox_messages (message_id, tenant_id, topic, order_id, user_id, \
           show_id, payload, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    );
    let written = c
        .insert_new(
            sql(insert)
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

/// The oldest unpublished messages, locked for the caller's transaction, skipping rows
/// another relay holds (PostgreSQL, MySQL): relays of several instances take disjoint
/// batches, and a paused one holds back only its own. (On MySQL the sort is served by the
/// `(published_at, created_at)` index, so InnoDB locks only the rows it returns.)
pub(crate) async fn lock_unpublished(c: &mut Conn<'_>, limit: i64) -> Result<Vec<Message>, Error> {
    let q = if c.backend() != Backend::Sqlite {
        "SELECT message_id, tenant_id, topic, order_id, user_id, show_id, payload, \
           created_at, published_at FROM outbox_messages WHERE published_at IS NULL \
         ORDER BY created_at, message_id LIMIT $1 FOR UPDATE SKIP LOCKED"
    } else {
        "SELECT message_id, tenant_id, topic, order_id, user_id, show_id, payload, \
           created_at, published_at FROM outbox_messages WHERE published_at IS NULL \
         ORDER BY created_at, message_id LIMIT $1"
    };
    c.all(sql(q).bind(limit))
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
    let insert = c.pick(
        "INSERT INTO message_deliveries (consumer, message_id, state, attempts, \
           available_at, created_at) VALUES ($1, $2, 'pending', 0, $3, $3) \
         ON CONFLICT (consumer, message_id) DO NOTHING",
        "INSERT INTO message_deliveries (consumer, message_id, state, attempts, \
           available_at, created_at) VALUES ($1, $2, 'pending', 0, $3, $3)",
    );
    c.insert_new(sql(insert).bind(consumer).bind(message_id).bind(now))
        .await?;
    Ok(())
}

/// Claims up to `limit` due pending deliveries of `consumer` for this instance: they
/// are not due again until `until` (a visibility timeout, as a queue's), so instances
/// of one consumer work on disjoint deliveries, and the claim of an instance that died
/// or paused comes due again by itself. Returns the claimed messages, oldest first.
/// Run it in a transaction of its own (the claim commits before the work starts).
pub(crate) async fn claim_deliveries(
    c: &mut Conn<'_>,
    consumer: &str,
    now: i64,
    until: i64,
    limit: i64,
) -> Result<Vec<Message>, Error> {
    let claim = new_id("claim");
    let claimed = if c.backend() == Backend::Mysql {
        claim_mysql(c, consumer, now, until, limit, &claim).await?
    } else {
        let q = if c.backend() == Backend::Postgres {
            "UPDATE message_deliveries SET available_at = $4, claim = $5 \
         WHERE consumer = $1 AND message_id IN ( \
           SELECT message_id FROM message_deliveries \
           WHERE consumer = $1 AND state = 'pending' AND available_at <= $2 \
           ORDER BY available_at, message_id LIMIT $3 FOR UPDATE SKIP LOCKED)"
        } else {
            "UPDATE message_deliveries SET available_at = $4, claim = $5 \
         WHERE consumer = $1 AND message_id IN ( \
           SELECT message_id FROM message_deliveries \
           WHERE consumer = $1 AND state = 'pending' AND available_at <= $2 \
           ORDER BY available_at, message_id LIMIT $3)"
        };
        c.execute(
            sql(q)
                .bind(consumer)
                .bind(now)
                .bind(limit)
                .bind(until)
                .bind(claim.as_str()),
        )
        .await?
    };
    if claimed == 0 {
        return Ok(Vec::new());
    }
    c.all(
        sql(
            "SELECT m.message_id, m.tenant_id, m.topic, m.order_id, m.user_id, m.show_id, \
               m.payload, m.created_at, m.published_at \
             FROM message_deliveries d JOIN outbox_messages m ON m.message_id = d.message_id \
             WHERE d.consumer = $1 AND d.claim = $2 \
             ORDER BY m.created_at, m.message_id",
        )
        .bind(consumer)
        .bind(claim.as_str()),
    )
    .await?
    .iter()
    .map(message_from)
    .collect()
}

/// MySQL: the due deliveries are locked first, then claimed one by one. MySQL refuses an
/// `UPDATE` whose subquery reads the same table, and `LIMIT` inside `IN (…)`.
async fn claim_mysql(
    c: &mut Conn<'_>,
    consumer: &str,
    now: i64,
    until: i64,
    limit: i64,
    claim: &str,
) -> Result<u64, Error> {
    let due = c
        .all(
            sql("SELECT message_id FROM message_deliveries \
                 WHERE consumer = $1 AND state = 'pending' AND available_at <= $2 \
                 ORDER BY available_at, message_id LIMIT $3 FOR UPDATE SKIP LOCKED")
            .bind(consumer)
            .bind(now)
            .bind(limit),
        )
        .await?;
    let mut claimed = 0;
    for row in due {
        c.execute(
            sql(
                "UPDATE message_deliveries SET available_at = $3, claim = $4 \
                 WHERE consumer = $1 AND message_id = $2",
            )
            .bind(consumer)
            .bind(row.text("message_id")?)
            .bind(until)
            .bind(claim),
        )
        .await?;
        claimed += 1;
    }
    Ok(claimed)
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
    let insert = c.pick(
        "INSERT INTO consumer_processed (consumer, tenant_id, business_key, order_id, \
           message_id, outcome, processed_at) VALUES ($1, $2, $3, $4, $5, $6, $7) \
         ON CONFLICT (consumer, tenant_id, business_key) DO NOTHING",
        "INSERT INTO consumer_processed (consumer, tenant_id, business_key, order_id, \
           message_id, outcome, processed_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
    );
    Ok(c.insert_new(
        sql(insert)
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
