//! What the API shows: the JSON shapes of orders and their ledgers.
//!
//! Owns the wire form (RFC 3339 times, snake_case statuses) and nothing else: it reads
//! no database and decides nothing. The create response is built from the rows just
//! written and stored with the idempotency record, so every replay is byte-identical.

use serde::{Deserialize, Serialize};

use crate::freeze::Freeze;
use crate::ledgers::{Hold, Message, Order, Payment, Ticket, Transition};
use crate::machine::OrderStatus;
pub use crate::text::rfc3339;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HoldView {
    pub hold_id: String,
    pub quantity: i64,
    /// `held` or `released`.
    pub status: String,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_at: Option<String>,
    /// The fencing token the release carried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_token: Option<i64>,
}

impl From<&Hold> for HoldView {
    fn from(h: &Hold) -> Self {
        Self {
            hold_id: h.hold_id.clone(),
            quantity: h.quantity,
            status: h.status.clone(),
            created_at: rfc3339(h.created_at),
            released_at: h.released_at.map(rfc3339),
            release_token: h.release_token,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PaymentView {
    pub payment_id: String,
    /// `charge` or `refund`.
    pub kind: String,
    pub provider_key: String,
    pub provider_ref: String,
    pub amount_cents: i64,
    pub status: String,
    pub created_at: String,
}

impl From<&Payment> for PaymentView {
    fn from(p: &Payment) -> Self {
        Self {
            payment_id: p.payment_id.clone(),
            kind: p.kind.clone(),
            provider_key: p.provider_key.clone(),
            provider_ref: p.provider_ref.clone(),
            amount_cents: p.amount_cents,
            status: p.status.clone(),
            created_at: rfc3339(p.created_at),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TicketView {
    pub ticket_id: String,
    pub quantity: i64,
    pub issued_at: String,
}

impl From<&Ticket> for TicketView {
    fn from(t: &Ticket) -> Self {
        Self {
            ticket_id: t.ticket_id.clone(),
            quantity: t.quantity,
            issued_at: rfc3339(t.issued_at),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MessageView {
    pub message_id: String,
    pub topic: String,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published_at: Option<String>,
}

impl From<&Message> for MessageView {
    fn from(m: &Message) -> Self {
        Self {
            message_id: m.message_id.clone(),
            topic: m.topic.clone(),
            created_at: rfc3339(m.created_at),
            published_at: m.published_at.map(rfc3339),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TransitionView {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    pub to: String,
    pub event: String,
    pub at: String,
    pub actor: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl From<&Transition> for TransitionView {
    fn from(t: &Transition) -> Self {
        Self {
            from: t.from_status.clone(),
            to: t.to_status.clone(),
            event: t.event.clone(),
            at: rfc3339(t.at),
            actor: t.actor.clone(),
            detail: t.detail.clone(),
        }
    }
}

/// An order as the API shows it. The create response carries the order and its hold;
/// reads add the other ledgers, the active freezes that apply to it and its history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OrderView {
    pub order_id: String,
    pub status: OrderStatus,
    pub user_id: String,
    pub show_id: String,
    pub quantity: i64,
    pub amount_cents: i64,
    pub client_session: Option<String>,
    /// The key the order was created under (`null` on the legacy route).
    pub idempotency_key: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paid_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ticketed_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refunded_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancelled_at: Option<String>,
    pub hold: Option<HoldView>,
    /// `queued` when a payment was accepted while `payment-confirm` was frozen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payment: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payments: Option<Vec<PaymentView>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ticket: Option<TicketView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<MessageView>>,
    /// Active freezes that hold this order's automatic chain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub frozen: Option<Vec<Freeze>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transitions: Option<Vec<TransitionView>>,
}

impl OrderView {
    /// The order and its hold only (the create response).
    pub fn summary(order: &Order, hold: Option<&Hold>) -> Self {
        Self {
            order_id: order.order_id.clone(),
            status: order.status,
            user_id: order.user_id.clone(),
            show_id: order.show_id.clone(),
            quantity: order.quantity,
            amount_cents: order.amount_cents,
            client_session: order.client_session.clone(),
            idempotency_key: order.idempotency_key.clone(),
            created_at: rfc3339(order.created_at),
            updated_at: rfc3339(order.updated_at),
            paid_at: order.paid_at.map(rfc3339),
            ticketed_at: order.ticketed_at.map(rfc3339),
            refunded_at: order.refunded_at.map(rfc3339),
            cancelled_at: order.cancelled_at.map(rfc3339),
            hold: hold.map(HoldView::from),
            payment: None,
            payments: None,
            ticket: None,
            messages: None,
            frozen: None,
            transitions: None,
        }
    }
}

/// A page of orders.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OrderList {
    pub orders: Vec<OrderView>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
    }
}
