//! The order state machine: statuses, events, and the one function that says where an
//! event takes an order.
//!
//! ```text
//! pending_payment ──payment_confirmed──▶ paid ──ticket_issued──▶ ticketed
//!        │                                │
//!        └──cancel──▶ cancelled           └──refund_requested──▶ refund_pending
//!                        ▲                                           │
//!                        └────────close──── refunded ◀──refund_confirmed┘
//! ```
//!
//! Pure: no I/O, no clock. Every writer of `orders.status` asks [`transition`] first and
//! then writes with a compare-and-set on the status it read, so an order never moves
//! along an edge that is not drawn above. Anything else is an [`IllegalTransition`], a
//! typed error the API answers with 409.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Where an order is.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum OrderStatus {
    PendingPayment,
    Paid,
    Ticketed,
    Cancelled,
    RefundPending,
    Refunded,
}

impl OrderStatus {
    pub const ALL: [OrderStatus; 6] = [
        OrderStatus::PendingPayment,
        OrderStatus::Paid,
        OrderStatus::Ticketed,
        OrderStatus::Cancelled,
        OrderStatus::RefundPending,
        OrderStatus::Refunded,
    ];

    /// The stored and wire form.
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::PendingPayment => "pending_payment",
            OrderStatus::Paid => "paid",
            OrderStatus::Ticketed => "ticketed",
            OrderStatus::Cancelled => "cancelled",
            OrderStatus::RefundPending => "refund_pending",
            OrderStatus::Refunded => "refunded",
        }
    }

    /// No event moves the order any further.
    pub fn is_final(self) -> bool {
        OrderEvent::ALL
            .into_iter()
            .all(|event| transition(self, event).is_err())
    }

    /// The customer has paid and the money has not gone back.
    pub fn is_paid(self) -> bool {
        matches!(self, OrderStatus::Paid | OrderStatus::Ticketed)
    }
}

impl fmt::Display for OrderStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A status string that is not one of [`OrderStatus::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown order status {0:?}")]
pub struct UnknownStatus(pub String);

impl FromStr for OrderStatus {
    type Err = UnknownStatus;
    fn from_str(s: &str) -> Result<Self, UnknownStatus> {
        OrderStatus::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| UnknownStatus(s.to_owned()))
    }
}

/// What can happen to an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderEvent {
    /// The provider confirmed the charge.
    PaymentConfirmed,
    /// The ticket issuer issued the ticket.
    TicketIssued,
    /// Cancel an order nobody has paid for.
    Cancel,
    /// Start giving the money back (cancelling a paid order).
    RefundRequested,
    /// The provider confirmed the refund.
    RefundConfirmed,
    /// A refunded order ends cancelled.
    Close,
}

impl OrderEvent {
    pub const ALL: [OrderEvent; 6] = [
        OrderEvent::PaymentConfirmed,
        OrderEvent::TicketIssued,
        OrderEvent::Cancel,
        OrderEvent::RefundRequested,
        OrderEvent::RefundConfirmed,
        OrderEvent::Close,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OrderEvent::PaymentConfirmed => "payment_confirmed",
            OrderEvent::TicketIssued => "ticket_issued",
            OrderEvent::Cancel => "cancel",
            OrderEvent::RefundRequested => "refund_requested",
            OrderEvent::RefundConfirmed => "refund_confirmed",
            OrderEvent::Close => "close",
        }
    }
}

impl fmt::Display for OrderEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An event that has no edge from the order's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error, Serialize)]
#[error("an order that is {from} cannot take the event {event}")]
pub struct IllegalTransition {
    pub from: OrderStatus,
    pub event: OrderEvent,
}

/// Where `event` takes an order that is `from`.
pub fn transition(from: OrderStatus, event: OrderEvent) -> Result<OrderStatus, IllegalTransition> {
    use OrderEvent as E;
    use OrderStatus as S;
    match (from, event) {
        (S::PendingPayment, E::PaymentConfirmed) => Ok(S::Paid),
        (S::PendingPayment, E::Cancel) => Ok(S::Cancelled),
        (S::Paid, E::TicketIssued) => Ok(S::Ticketed),
        (S::Paid, E::RefundRequested) => Ok(S::RefundPending),
        (S::RefundPending, E::RefundConfirmed) => Ok(S::Refunded),
        (S::Refunded, E::Close) => Ok(S::Cancelled),
        _ => Err(IllegalTransition { from, event }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use OrderEvent as E;
    use OrderStatus as S;

    fn check(from: OrderStatus, event: OrderEvent, expected: Option<OrderStatus>) {
        let got = transition(from, event);
        match expected {
            Some(to) => assert_eq!(got, Ok(to), "{from} --{event}-->"),
            None => assert_eq!(
                got,
                Err(IllegalTransition { from, event }),
                "{from} --{event}--> must be illegal"
            ),
        }
    }

    #[test]
    fn edges() {
        check(S::PendingPayment, E::PaymentConfirmed, Some(S::Paid));
        check(S::PendingPayment, E::Cancel, Some(S::Cancelled));
        check(S::Paid, E::TicketIssued, Some(S::Ticketed));
        check(S::Paid, E::RefundRequested, Some(S::RefundPending));
        check(S::RefundPending, E::RefundConfirmed, Some(S::Refunded));
        check(S::Refunded, E::Close, Some(S::Cancelled));
    }

    #[test]
    fn illegal_edges() {
        check(S::PendingPayment, E::TicketIssued, None);
        check(S::PendingPayment, E::RefundRequested, None);
        check(S::PendingPayment, E::RefundConfirmed, None);
        check(S::PendingPayment, E::Close, None);
        check(S::Paid, E::PaymentConfirmed, None);
        check(S::Paid, E::Cancel, None);
        check(S::Ticketed, E::Cancel, None);
        check(S::Ticketed, E::RefundRequested, None);
        check(S::Ticketed, E::TicketIssued, None);
        check(S::Cancelled, E::PaymentConfirmed, None);
        check(S::Cancelled, E::Cancel, None);
        check(S::RefundPending, E::Cancel, None);
        check(S::RefundPending, E::TicketIssued, None);
        check(S::Refunded, E::PaymentConfirmed, None);
        check(S::Refunded, E::RefundConfirmed, None);
    }

    #[test]
    fn exactly_six_edges() {
        let legal = S::ALL
            .iter()
            .flat_map(|&s| E::ALL.iter().map(move |&e| (s, e)))
            .filter(|&(s, e)| transition(s, e).is_ok())
            .count();
        assert_eq!(legal, 6);
    }

    #[test]
    fn final_states() {
        let finals: Vec<_> = S::ALL.into_iter().filter(|s| s.is_final()).collect();
        assert_eq!(finals, vec![S::Ticketed, S::Cancelled]);
        assert!(S::Ticketed.is_paid() && S::Paid.is_paid());
        assert!(!S::Refunded.is_paid());
    }

    #[test]
    fn wire_forms_round_trip() {
        for s in S::ALL {
            assert_eq!(s.as_str().parse::<S>(), Ok(s));
            assert_eq!(
                serde_json::to_string(&s).unwrap(),
                format!("\"{}\"", s.as_str())
            );
        }
        for e in E::ALL {
            assert_eq!(
                serde_json::to_string(&e).unwrap(),
                format!("\"{}\"", e.as_str())
            );
        }
        assert!("shipped".parse::<S>().is_err());
        let err = transition(S::Cancelled, E::PaymentConfirmed).unwrap_err();
        assert_eq!(
            err.to_string(),
            "an order that is cancelled cannot take the event payment_confirmed"
        );
    }
}
