//! The names of the chain's consumers (also their durable consumer names on NATS):
//! spelled once here, for the consumers, the keys they process under and the metrics'
//! labels. Imports nothing.

/// Confirms payments that were queued while `payment-confirm` was frozen.
pub const PAYMENT_CONFIRMER: &str = "payment-confirmer";
/// Issues exactly one ticket per paid order.
pub const TICKET_ISSUER: &str = "ticket-issuer";
/// Releases a cancelled order's hold back to stock, under lease and fence.
pub const INVENTORY_RELEASER: &str = "inventory-releaser";
