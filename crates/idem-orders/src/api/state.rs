//! The state every handler and middleware of the API shares.
//!
//! Holds what the server built; must not hold per-request data or logic beyond
//! handing its parts out.

use std::sync::Arc;
use std::time::Duration;

use idem_core::IdempotencyStore;
use idem_http::Authenticate;
use prometheus_client::registry::Registry;

use crate::db::Database;
use crate::metrics::OrdersMetrics;
use crate::service::Orders;

/// What every handler shares.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) orders: Orders,
    pub(crate) auth: Arc<dyn Authenticate>,
    pub(crate) store: Arc<dyn IdempotencyStore>,
    pub(crate) admin_token: Option<Arc<str>>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) metrics: OrdersMetrics,
    pub(crate) openapi: Arc<serde_json::Value>,
    /// A request body must arrive in full within this.
    pub(crate) body_read_timeout: Duration,
    /// Bodies larger than this are refused (the layer's limit, applied to every route).
    pub(crate) max_body: usize,
    /// Set once a shutdown began: `/readyz` answers 503 so balancers stop sending.
    pub(crate) draining: Arc<std::sync::atomic::AtomicBool>,
    pub(crate) console: idem_console::Console,
}

impl AppState {
    pub(super) fn db(&self) -> &Database {
        self.orders.database()
    }
}
