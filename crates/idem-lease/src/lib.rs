//! idem-lease: holding a lease safely over any [`LeaseStore`].
//!
//! Owns the holder's side of leases:
//! - [`acquire_wait`]: try, or wait with backoff until a deadline, then give up;
//! - [`LeaseGuard`]: the keepalive that renews every ttl/3, tells the holder the moment a
//!   renewal fails ([`LeaseGuard::is_valid`], [`LeaseGuard::subscribe`]), stops before
//!   releasing, and stops renewing when dropped;
//! - [`LeaseMetrics`]: the Prometheus series `deploy/alerts/idem-alerts.yml` reads.
//!
//! It never talks to a database and never decides expiry for the store: the store's
//! answer is authoritative. The guard's local deadline only lets a holder give up
//! *earlier* than the store would, never hold longer. Stopping a stale holder's write is
//! the fence's job (`idem_sqlite::SqliteStore::fenced_write`), not this crate's.
//!
//! [`LeaseStore`]: idem_core::LeaseStore

mod guard;
mod metrics;
mod wait;

pub use guard::{Acquired, LeaseGuard, LeaseState, LostReason};
pub use metrics::LeaseMetrics;
pub use wait::{acquire_wait, MAX_BACKOFF, MIN_BACKOFF};
