//! The routes: the tenant API behind the idempotency layer, the admin API and the
//! public endpoints beside it, the console, and the middleware around them all; and the
//! metrics address's own router.
//!
//! Only wires handlers to paths; must not hold a handler's logic.

use axum::http::StatusCode;
use axum::middleware;
use axum::routing::{get, post, put};
use axum::Router;
use idem_http::IdempotencyLayer;

use super::admin::{list_freezes, post_freeze, post_unfreeze, put_show};
use super::error::ApiError;
use super::keys::key_state;
use super::metrics::{metrics, open_metrics};
use super::middleware::{read_body_in_time, request_ids};
use super::orders::{
    cancel_order, create_order, get_order, legacy_create_order, list_orders, pay_order,
};
use super::public::{healthz, livez, openapi, readyz};
use super::state::AppState;

/// The routes. `legacy` adds `POST /v1/legacy/orders`, the pre-idem behaviour (no key,
/// a server-minted id per arrival) the incident demo compares against.
pub(crate) fn router(state: AppState, layer: IdempotencyLayer, legacy: bool) -> Router {
    let mut tenant_api = Router::new()
        .route("/v1/orders", post(create_order).get(list_orders))
        .route("/v1/orders/{order_id}", get(get_order))
        .route("/v1/orders/{order_id}/pay", post(pay_order))
        .route("/v1/orders/{order_id}/cancel", post(cancel_order))
        .route("/v1/idempotency-keys/{key}", get(key_state));
    if legacy {
        tenant_api = tenant_api.route(LEGACY_ROUTE, post(legacy_create_order));
    }
    let tenant_api = tenant_api.layer(layer);
    let admin = Router::new()
        .route("/v1/admin/freezes", get(list_freezes).post(post_freeze))
        .route("/v1/admin/unfreeze", post(post_unfreeze))
        .route("/v1/admin/shows/{tenant}/{show_id}", put(put_show));
    let public = Router::new()
        .route("/healthz", get(healthz))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi));
    let console = crate::console::router(state.console.clone(), state.db(), &state.metrics);
    tenant_api
        .merge(admin)
        .merge(public)
        .with_state(state.clone())
        .merge(console)
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            read_body_in_time,
        ))
        .layer(middleware::from_fn(request_ids))
}

/// The routes of the separate metrics address: `/metrics` only, without credentials
/// (that address is meant for an internal interface).
pub(crate) fn metrics_router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(open_metrics))
        .fallback(not_found)
        .layer(middleware::from_fn(request_ids))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not-found", "No such route", "")
}

/// The legacy route (demo only).
pub const LEGACY_ROUTE: &str = "/v1/legacy/orders";
