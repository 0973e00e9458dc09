//! The leases of the service: their timings, the owner ids this process takes them
//! under, and the per-order lease `order:{tenant}:{order}` that serializes pay and
//! cancel.
//!
//! Owns taking and releasing those leases. It must not write business rows; the show
//! lease of the inventory releaser is taken where its fenced write is
//! (`consumers`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use idem_core::{LeaseName, OwnerId};
use idem_lease::{Acquired, LeaseGuard};

use super::Orders;
use crate::error::OrderError;

/// Lease timings of the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTimings {
    /// TTL of the per-order and per-show leases (renewed every ttl/3 while held).
    pub ttl: Duration,
    /// How long a request waits for a lease another request holds.
    pub wait: Duration,
}

impl Default for LeaseTimings {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(30),
            wait: Duration::from_secs(10),
        }
    }
}

impl Orders {
    pub(super) fn owner(&self) -> OwnerId {
        let n = self.inner.next_owner.fetch_add(1, Ordering::Relaxed);
        OwnerId::new(format!("{}#{n}", self.inner.owner_prefix)).expect("visible ASCII")
    }

    /// Takes the per-order lease that serializes pay and cancel.
    pub(super) async fn lock_order(
        &self,
        tenant: &str,
        order_id: &str,
    ) -> Result<LeaseGuard, OrderError> {
        let name = LeaseName::new(format!("order:{tenant}:{order_id}")).map_err(|_| {
            OrderError::OrderNotFound {
                order_id: order_id.to_owned(),
            }
        })?;
        let t = self.inner.lease_timings;
        match LeaseGuard::acquire(
            self.inner.leases.clone(),
            &name,
            &self.owner(),
            t.ttl,
            t.wait,
            self.inner.lease_metrics.clone(),
        )
        .await?
        {
            Acquired::Guard(g) => Ok(g),
            Acquired::Busy { .. } => Err(OrderError::Busy {
                order_id: order_id.to_owned(),
            }),
        }
    }

    pub(crate) async fn release(&self, guard: LeaseGuard) {
        let name = guard.lease().name;
        if let Err(e) = guard.release().await {
            tracing::warn!(error = %e, lease = %name, "lease release failed; it will expire");
        }
    }
}
