//! The order service's Prometheus series. Registered on the app's own registry (never a
//! global one), next to the idempotency layer's and the lease metrics.
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `idem_orders_created_total` | `route` (`idem`, `legacy`) | orders inserted |
//! | `idem_orders_rejections_total` | `reason` | business refusals (sold out, limits, …) |
//! | `idem_orders_payments_total` | `kind` | charges and refunds recorded |
//! | `idem_orders_tickets_issued_total` | — | tickets issued |
//! | `idem_orders_messages_published_total` | `transport` | outbox messages handed to a transport |
//! | `idem_orders_deliveries_total` | `consumer`, `result` | consumer runs: `done`, `duplicate`, `deferred`, `failed` |
//! | `idem_orders_frozen_deferrals_total` | `what` | work put back because of a freeze |
//! | `idem_orders_freeze_active` | `scope_kind` (`user`, `show`, `all`), `what` | active freezes |
//! | `idem_orders_pending_deliveries` | `consumer` | queued in-process deliveries |
//! | `idem_orders_outbox_unpublished` | — | outbox messages not yet published |
//! | `idem_orders_processing_past_lease` | — | idempotency records PROCESSING whose claim lease ran out (by the store clock) |
//!
//! Every label has a fixed set of values: no user, show or tenant id is ever a label
//! (they would be personal data and unbounded). The three state gauges come from the
//! database, so a freeze applied with `idem freeze` directly on the database shows up
//! too — read by the server in the background, never by a scrape. This module only
//! counts; it must not read the database itself or register anything globally (the
//! caller hands it the readings).

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::freeze::{Freeze, FreezeWhat};
use crate::service::consumer_names as consumers;

/// The values of `consumer`; a consumer the database names otherwise counts as `other`.
const CONSUMERS: [&str; 3] = [
    consumers::PAYMENT_CONFIRMER,
    consumers::TICKET_ISSUER,
    consumers::INVENTORY_RELEASER,
];
const SCOPE_KINDS: [&str; 3] = ["user", "show", "all"];

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RouteLabel {
    route: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TransportLabel {
    transport: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DeliveryLabels {
    consumer: &'static str,
    result: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct WhatLabel {
    what: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct FreezeLabels {
    scope_kind: &'static str,
    what: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ConsumerLabel {
    consumer: &'static str,
}

#[derive(Debug, Default)]
struct Inner {
    created: Family<RouteLabel, Counter>,
    rejections: Family<ReasonLabel, Counter>,
    payments: Family<KindLabel, Counter>,
    tickets: Counter,
    published: Family<TransportLabel, Counter>,
    deliveries: Family<DeliveryLabels, Counter>,
    deferrals: Family<WhatLabel, Counter>,
    freeze_active: Family<FreezeLabels, Gauge>,
    pending: Family<ConsumerLabel, Gauge>,
    unpublished: Gauge,
    processing_past_lease: Gauge,
}

/// Cheap to clone; clones share the series.
#[derive(Debug, Clone)]
pub struct OrdersMetrics {
    inner: Arc<Inner>,
}

/// The business refusals counted by `idem_orders_rejections` (problem slugs).
const REJECTION_REASONS: [&str; 7] = [
    "unknown-show",
    "invalid-quantity",
    "quantity-above-limit",
    "sold-out",
    "order-not-found",
    "invalid-field",
    "illegal-transition",
];

impl Default for OrdersMetrics {
    /// Every known series starts at zero: a family without series is not exported, and
    /// a series appearing mid-incident hides its first increments from `rate()`.
    fn default() -> Self {
        let i = Inner::default();
        for route in ["idem", "legacy"] {
            let _ = i.created.get_or_create(&RouteLabel { route });
        }
        for reason in REJECTION_REASONS {
            let _ = i.rejections.get_or_create(&ReasonLabel { reason });
        }
        for kind in ["charge", "refund"] {
            let _ = i.payments.get_or_create(&KindLabel { kind });
        }
        for transport in ["in_process", "nats"] {
            let _ = i.published.get_or_create(&TransportLabel { transport });
        }
        for consumer in CONSUMERS {
            for result in ["done", "duplicate", "deferred", "failed"] {
                let _ = i
                    .deliveries
                    .get_or_create(&DeliveryLabels { consumer, result });
            }
        }
        for what in FreezeWhat::ALL {
            let _ = i.deferrals.get_or_create(&WhatLabel {
                what: what.as_str(),
            });
        }
        Self { inner: Arc::new(i) }
    }
}

impl OrdersMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let i = &self.inner;
        registry.register(
            "idem_orders_created",
            "Orders inserted, by route",
            i.created.clone(),
        );
        registry.register(
            "idem_orders_rejections",
            "Business refusals, by reason",
            i.rejections.clone(),
        );
        registry.register(
            "idem_orders_payments",
            "Charges and refunds recorded in the payments ledger",
            i.payments.clone(),
        );
        registry.register(
            "idem_orders_tickets_issued",
            "Tickets issued",
            i.tickets.clone(),
        );
        registry.register(
            "idem_orders_messages_published",
            "Outbox messages handed to a transport",
            i.published.clone(),
        );
        registry.register(
            "idem_orders_deliveries",
            "Consumer runs, by consumer and result",
            i.deliveries.clone(),
        );
        registry.register(
            "idem_orders_frozen_deferrals",
            "Work put back because a freeze covers it",
            i.deferrals.clone(),
        );
        registry.register(
            "idem_orders_freeze_active",
            "Active freeze switches, by kind of scope and what they stop",
            i.freeze_active.clone(),
        );
        registry.register(
            "idem_orders_pending_deliveries",
            "In-process deliveries waiting for their consumer",
            i.pending.clone(),
        );
        registry.register(
            "idem_orders_outbox_unpublished",
            "Outbox messages not yet published",
            i.unpublished.clone(),
        );
        registry.register(
            "idem_orders_processing_past_lease",
            "Idempotency records PROCESSING whose claim lease ran out (the sweeper turns them retryable)",
            i.processing_past_lease.clone(),
        );
    }

    pub(crate) fn observe_processing_past_lease(&self, n: i64) {
        self.inner.processing_past_lease.set(n);
    }

    pub(crate) fn created(&self, route: &'static str) {
        self.inner
            .created
            .get_or_create(&RouteLabel { route })
            .inc();
    }

    pub(crate) fn rejected(&self, reason: &'static str) {
        self.inner
            .rejections
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    pub(crate) fn payment(&self, kind: &'static str) {
        self.inner.payments.get_or_create(&KindLabel { kind }).inc();
    }

    pub(crate) fn ticket_issued(&self) {
        self.inner.tickets.inc();
    }

    pub(crate) fn published(&self, transport: &'static str) {
        self.inner
            .published
            .get_or_create(&TransportLabel { transport })
            .inc();
    }

    pub(crate) fn delivery(&self, consumer: &'static str, result: &'static str) {
        self.inner
            .deliveries
            .get_or_create(&DeliveryLabels { consumer, result })
            .inc();
    }

    pub(crate) fn deferred(&self, what: FreezeWhat) {
        self.inner
            .deferrals
            .get_or_create(&WhatLabel {
                what: what.as_str(),
            })
            .inc();
    }

    /// Replaces the state gauges with what the database says now. Every label value is
    /// written (zero when nothing matches), so the series do not come and go.
    pub(crate) fn observe_state(
        &self,
        freezes: &[Freeze],
        pending: &[(String, i64)],
        unpublished: i64,
    ) {
        let i = &self.inner;
        for scope_kind in SCOPE_KINDS {
            for what in FreezeWhat::ALL {
                let n = freezes
                    .iter()
                    .filter(|f| f.scope.kind() == scope_kind && f.what == what)
                    .count();
                i.freeze_active
                    .get_or_create(&FreezeLabels {
                        scope_kind,
                        what: what.as_str(),
                    })
                    .set(n as i64);
            }
        }
        let mut by_consumer = [0i64; CONSUMERS.len()];
        let mut other = 0;
        for (consumer, n) in pending {
            match CONSUMERS.iter().position(|c| c == consumer) {
                Some(at) => by_consumer[at] += n,
                None => other += n,
            }
        }
        for (consumer, n) in CONSUMERS.iter().zip(by_consumer) {
            i.pending.get_or_create(&ConsumerLabel { consumer }).set(n);
        }
        i.pending
            .get_or_create(&ConsumerLabel { consumer: "other" })
            .set(other);
        i.unpublished.set(unpublished);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::freeze::FreezeScope;

    fn freeze(scope: FreezeScope, what: FreezeWhat) -> Freeze {
        Freeze {
            freeze_id: "frz-1".into(),
            tenant: Some("acme".into()),
            scope,
            what,
            reason: None,
            frozen_by: "op".into(),
            frozen_at: "2025-01-01T00:00:00Z".into(),
            unfrozen_at: None,
            unfrozen_by: None,
        }
    }

    #[test]
    fn state_labels_carry_no_ids() {
        let m = OrdersMetrics::default();
        let mut registry = Registry::default();
        m.register(&mut registry);
        let user = FreezeScope::User("alice@example.com".into());
        m.observe_state(
            &[
                freeze(user.clone(), FreezeWhat::Ticketing),
                freeze(FreezeScope::User("bob".into()), FreezeWhat::Ticketing),
                freeze(FreezeScope::Show("S-1".into()), FreezeWhat::PaymentConfirm),
            ],
            &[("ticket-issuer".into(), 2), ("someone-else".into(), 1)],
            3,
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for id in ["alice", "bob", "S-1", "acme", "someone-else"] {
            assert!(!text.contains(id), "{id} in:\n{text}");
        }
        for series in [
            "idem_orders_freeze_active{scope_kind=\"user\",what=\"ticketing\"} 2",
            "idem_orders_freeze_active{scope_kind=\"show\",what=\"payment-confirm\"} 1",
            "idem_orders_freeze_active{scope_kind=\"all\",what=\"ticketing\"} 0",
            "idem_orders_pending_deliveries{consumer=\"ticket-issuer\"} 2",
            "idem_orders_pending_deliveries{consumer=\"other\"} 1",
            "idem_orders_outbox_unpublished 3",
        ] {
            assert!(text.contains(series), "{series} missing:\n{text}");
        }
        // Unfrozen: the series stay, at zero.
        m.observe_state(&[], &[], 0);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("idem_orders_freeze_active{scope_kind=\"user\",what=\"ticketing\"} 0")
        );
    }
}
