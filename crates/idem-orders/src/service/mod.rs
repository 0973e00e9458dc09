//! The business: creating, paying and cancelling orders, and the three consumers of the
//! automatic chain (payment confirmation, ticket issuing, inventory release).
//!
//! Owns the policy: limits, stock, which state-machine event a request means, the
//! business-derived keys (`pay:{order}`, `refund:{order}`, `ticket:{order}`,
//! `release:{order}`) every retry and every consumer reuses, freezes, and which lease
//! guards what:
//! - `order:{tenant}:{order}` serializes pay and cancel of one order, so a cancel never
//!   lands between a charge and its confirmation;
//! - `inventory:{tenant}:{show}` guards the release of stock, written through the fence
//!   with the lease's token, so a holder that lost its lease cannot write late.
//!
//! Request handlers get their business rows as an open transaction (`Unit`) so the
//! caller can finish the idempotency record in it and commit once. This module must not
//! know HTTP, must not mint keys for retries, and never deletes a row.
//!
//! One file per responsibility, each with its own `impl Orders`: `commands` (create,
//! pay, cancel, seed), `queries` (reads), `consumers` (the chain's consumers),
//! `keys` (business keys), `leases` (which lease guards what), `faults`
//! (injected faults). This file holds the type, its state and its construction.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use idem_core::LeaseStore;
use idem_lease::LeaseMetrics;
use tokio::sync::Notify;

use crate::db::Database;
use crate::metrics::OrdersMetrics;
use crate::provider::PaymentSimulator;

mod commands;
pub(crate) mod consumer_names;
pub mod consumers;
mod faults;
mod keys;
mod leases;
mod queries;

pub use commands::NewOrder;
pub(crate) use commands::{Created, PayAnswer, Unit};
pub use consumers::Handled;
pub(crate) use faults::FaultState;
pub use faults::{FaultHook, Faults, SlowCreate};
pub(crate) use keys::consumer_key;
pub use keys::{pay_key, refund_key};
pub use leases::LeaseTimings;

/// The business core. Cheap to clone.
#[derive(Clone)]
pub struct Orders {
    inner: Arc<Inner>,
}

struct Inner {
    db: Database,
    provider: PaymentSimulator,
    leases: Arc<dyn LeaseStore>,
    lease_metrics: LeaseMetrics,
    lease_timings: LeaseTimings,
    metrics: OrdersMetrics,
    faults: FaultState,
    /// Signalled after every commit that wrote to the outbox.
    outbox_written: Notify,
    owner_prefix: String,
    next_owner: AtomicU64,
}

/// How to build [`Orders`].
#[derive(Debug, Clone, Default)]
pub struct OrdersOptions {
    pub lease_timings: LeaseTimings,
    pub faults: Faults,
    /// Simulated provider latency per call.
    pub provider_latency: Duration,
}

impl Orders {
    pub fn new(
        db: Database,
        options: OrdersOptions,
        metrics: OrdersMetrics,
        lease_metrics: LeaseMetrics,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                provider: PaymentSimulator::new(db.clone(), options.provider_latency),
                leases: db.lease_store(),
                db,
                lease_metrics,
                lease_timings: options.lease_timings,
                metrics,
                faults: FaultState::new(&options.faults),
                outbox_written: Notify::new(),
                owner_prefix: format!("orders-{}", uuid::Uuid::now_v7().simple()),
                next_owner: AtomicU64::new(1),
            }),
        }
    }

    pub fn database(&self) -> &Database {
        &self.inner.db
    }

    pub fn provider(&self) -> &PaymentSimulator {
        &self.inner.provider
    }

    pub(crate) fn metrics(&self) -> &OrdersMetrics {
        &self.inner.metrics
    }

    pub(crate) fn faults(&self) -> &FaultState {
        &self.inner.faults
    }

    pub(crate) fn outbox_written(&self) -> &Notify {
        &self.inner.outbox_written
    }

    /// Wakes the relay: the outbox has something new.
    pub(crate) fn signal_outbox(&self) {
        self.inner.outbox_written.notify_one();
    }
}
