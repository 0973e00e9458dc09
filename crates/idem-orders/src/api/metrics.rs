//! Prometheus metrics: `/metrics` on the main address (the admin token) and on the
//! metrics address (no credentials), and the state gauges read from the database.
//!
//! A scrape encodes the registry as it is; it must not read the database (the gauges
//! are refreshed in the background and after admin changes).

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::auth::require_admin;
use super::error::ApiError;
use super::state::AppState;
use crate::db::Database;
use crate::error::Error;
use crate::freeze;
use crate::ledgers;
use crate::metrics::OrdersMetrics;

/// `/metrics` on the main address: the admin token is required (the series describe
/// every tenant's traffic).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = crate::api::doc::TAG,
    summary = "Prometheus metrics (the admin token; or without credentials on --metrics-listen)",
    responses(
        (status = 200, description = "OpenMetrics text", body = String, content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8"),
        (status = 401, description = "No or a wrong admin token", body = crate::api::doc::Problem, content_type = "application/problem+json"),
        (status = 403, description = "The admin API is disabled (no admin token configured)", body = crate::api::doc::Problem, content_type = "application/problem+json")
    ),
    security(("admin" = []))
)]
pub(super) async fn metrics(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    if state.admin_token.is_none() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "admin-disabled",
            "The admin API is disabled",
            "start the server with an admin token, or serve metrics on --metrics-listen",
        ));
    }
    require_admin(&state, &headers)?;
    open_metrics(State(state)).await
}

/// The registry as it is: a scrape reads no database (the state gauges are refreshed in
/// the background and after admin changes).
pub(super) async fn open_metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &state.registry)
        .map_err(|e| ApiError::internal(&Error::Backend(e.to_string())))?;
    Ok((
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

/// Reads the state gauges (freezes, pending deliveries, unpublished outbox) from the
/// database into `metrics`.
pub(crate) async fn refresh_state_gauges(
    db: &Database,
    metrics: &OrdersMetrics,
) -> Result<(), Error> {
    // One refresh at a time, read and write together: a background refresh that read
    // before a freeze changed must not write after the refresh that follows the change.
    static REFRESH: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _one = REFRESH.lock().await;
    let freezes = freeze::active_freezes(db).await?;
    // The store's clock decides whether a claim lease ran out, as it did when granting it.
    let now = db.store().retention().now().await?;
    let (pending, unpublished, stale) = {
        let mut conn = db.acquire().await?;
        let mut c = conn.conn();
        let pending = ledgers::pending_by_consumer(&mut c).await?;
        let unpublished = c
            .one(crate::db::sql(
                "SELECT COUNT(*) AS n FROM outbox_messages WHERE published_at IS NULL",
            ))
            .await?
            .int("n")?;
        let stale = processing_past_lease(&mut c, now).await?;
        (pending, unpublished, stale)
    };
    metrics.observe_state(&freezes, &pending, unpublished);
    metrics.observe_processing_past_lease(stale);
    Ok(())
}

/// Idempotency records PROCESSING whose claim lease ran out before `now` (store clock).
pub(crate) async fn processing_past_lease(
    c: &mut crate::db::Conn<'_>,
    now: i64,
) -> Result<i64, Error> {
    c.one(
        crate::db::sql(
            "SELECT COUNT(*) AS n FROM idem_records \
             WHERE state = 'PROCESSING' AND lease_expires_at < $1",
        )
        .bind(now),
    )
    .await?
    .int("n")
}
