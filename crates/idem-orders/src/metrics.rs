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
//! | `idem_orders_freeze_active` | `tenant`, `scope`, `what` | 1 per active freeze (read at scrape) |
//! | `idem_orders_pending_deliveries` | `consumer` | queued in-process deliveries (read at scrape) |
//! | `idem_orders_outbox_unpublished` | — | outbox messages not yet published (read at scrape) |
//!
//! Gauges read at scrape come from the database, so a freeze applied with `idem freeze`
//! directly on the database shows up too. This module only counts; it must not read the
//! database itself or register anything globally (the caller hands it the readings).

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::freeze::{Freeze, FreezeWhat};

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
    tenant: String,
    scope: String,
    what: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ConsumerLabel {
    consumer: String,
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
}

/// Cheap to clone; clones share the series.
#[derive(Debug, Clone, Default)]
pub struct OrdersMetrics {
    inner: Arc<Inner>,
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
            "Active freeze switches (1 each)",
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

    /// Replaces the scrape-time gauges with what the database says now.
    pub(crate) fn observe_state(
        &self,
        freezes: &[Freeze],
        pending: &[(String, i64)],
        unpublished: i64,
    ) {
        let i = &self.inner;
        i.freeze_active.clear();
        for f in freezes {
            i.freeze_active
                .get_or_create(&FreezeLabels {
                    tenant: f.tenant.clone().unwrap_or_else(|| "*".into()),
                    scope: f.scope.to_string(),
                    what: f.what.as_str(),
                })
                .set(1);
        }
        i.pending.clear();
        for (consumer, n) in pending {
            i.pending
                .get_or_create(&ConsumerLabel {
                    consumer: consumer.clone(),
                })
                .set(*n);
        }
        i.unpublished.set(unpublished);
    }
}
