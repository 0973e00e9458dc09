//! The business-derived keys (`pay:{order}`, `refund:{order}`, `ticket:{order}`,
//! `release:{order}`) every retry and every consumer reuses.
//!
//! Owns their spelling only. It must not mint fresh keys and must not touch the
//! database.

use super::consumer_names as consumers;

/// The business key a retry or consumer reuses for charging an order.
pub fn pay_key(order_id: &str) -> String {
    format!("pay:{order_id}")
}

/// The business key for refunding an order.
pub fn refund_key(order_id: &str) -> String {
    format!("refund:{order_id}")
}

pub(super) fn ticket_key(order_id: &str) -> String {
    format!("ticket:{order_id}")
}

pub(super) fn release_key(order_id: &str) -> String {
    format!("release:{order_id}")
}

/// The business key `consumer` processes a message of `order_id` under, if it is one of
/// the chain's consumers. An operator tool that stops a duplicate's messages marks this
/// key processed, so the consumer acks the message as a duplicate instead of acting.
pub(crate) fn consumer_key(consumer: &str, order_id: &str) -> Option<String> {
    match consumer {
        consumers::PAYMENT_CONFIRMER => Some(pay_key(order_id)),
        consumers::TICKET_ISSUER => Some(ticket_key(order_id)),
        consumers::INVENTORY_RELEASER => Some(release_key(order_id)),
        _ => None,
    }
}
