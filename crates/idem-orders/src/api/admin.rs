//! The admin API (the admin token, outside the idempotency layer): freezes — list,
//! freeze, unfreeze — and seeding a tenant's show.
//!
//! Checks the token and the bodies, then hands over to [`crate::freeze`] and the
//! service; must not be reachable without [`require_admin`].

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use idem_core::TenantId;
use serde::Deserialize;
use serde_json::json;

use super::answer::Answer;
use super::auth::require_admin;
use super::error::ApiError;
use super::extract::{parse_json, path_error};
use super::metrics::refresh_state_gauges;
use super::state::AppState;
use crate::error::Error;
use crate::freeze::{self, FreezeRequest, FreezeScope, FreezeWhat};
use crate::ledgers::ShowSeed;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub(crate) struct FreezeBody {
    scope: String,
    /// A list, or a comma-separated string.
    what: WhatList,
    #[serde(default)]
    tenant: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    actor: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub(crate) enum WhatList {
    Text(String),
    List(Vec<String>),
}

impl FreezeBody {
    fn request(self) -> Result<FreezeRequest, ApiError> {
        let bad = |e: Error| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-freeze",
                "Invalid freeze",
                e.to_string(),
            )
        };
        let scope: FreezeScope = self.scope.parse().map_err(bad)?;
        let what = match self.what {
            WhatList::Text(s) => FreezeWhat::parse_list(&s),
            WhatList::List(l) => FreezeWhat::parse_list(&l.join(",")),
        }
        .map_err(bad)?;
        let given = |v: Option<String>| v.filter(|v| !v.is_empty());
        let request = FreezeRequest {
            tenant: self.tenant,
            scope,
            what,
            reason: given(self.reason),
            actor: Some(given(self.actor).unwrap_or_else(|| "admin-api".into())),
        };
        // A control character (a newline forging a log line) is the caller's mistake,
        // answered as the tenant API answers one in a name.
        request.check_text()?;
        if let Some(t) = &request.tenant {
            TenantId::new(t.clone()).map_err(|e| bad(Error::InvalidInput(e.to_string())))?;
        }
        Ok(request)
    }
}

#[utoipa::path(
    get,
    path = "/v1/admin/freezes",
    tag = crate::api::doc::TAG,
    summary = "Active freezes and their history (admin token)",
    responses(
        (status = 200, description = "Active freezes and their history", body = Object),
        crate::api::doc::AdminRefusals
    ),
    security(("admin" = []))
)]
pub(super) async fn list_freezes(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    require_admin(&state, &headers)?;
    let active = freeze::active_freezes(state.db()).await?;
    let history = freeze::freeze_history(state.db()).await?;
    Ok(Answer::json(
        StatusCode::OK,
        &json!({ "active": active, "history": history }),
        None,
    )?
    .into_response())
}

#[utoipa::path(
    post,
    path = "/v1/admin/freezes",
    tag = crate::api::doc::TAG,
    summary = "Freeze payment-confirm, ticketing and/or inventory-release for user:U, show:S or all (admin token)",
    request_body = FreezeBody,
    responses(
        (status = 201, description = "Frozen", body = Object),
        (status = 200, description = "Already frozen", body = Object),
        (status = 422, description = "Invalid scope, what, tenant, reason or actor", body = crate::api::doc::Problem, content_type = "application/problem+json"),
        crate::api::doc::BodyRefusals,
        crate::api::doc::AdminRefusals
    ),
    security(("admin" = []))
)]
pub(super) async fn post_freeze(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    require_admin(&state, &headers)?;
    let request = parse_json::<FreezeBody>(&body)?.request()?;
    let change = freeze::apply_freeze(state.db(), &request).await?;
    refresh_after_change(&state).await;
    let status = if change.changed.is_empty() {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok(Answer::json(status, &change, None)?.into_response())
}

#[utoipa::path(
    post,
    path = "/v1/admin/unfreeze",
    tag = crate::api::doc::TAG,
    summary = "End freezes; the queued work resumes (admin token)",
    request_body = FreezeBody,
    responses(
        (status = 200, description = "Unfrozen", body = Object),
        (status = 422, description = "Invalid scope, what, tenant, reason or actor", body = crate::api::doc::Problem, content_type = "application/problem+json"),
        crate::api::doc::BodyRefusals,
        crate::api::doc::AdminRefusals
    ),
    security(("admin" = []))
)]
pub(super) async fn post_unfreeze(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    require_admin(&state, &headers)?;
    let request = parse_json::<FreezeBody>(&body)?.request()?;
    let change = freeze::apply_unfreeze(state.db(), &request).await?;
    refresh_after_change(&state).await;
    // Frozen deliveries are due now: wake the chain.
    state.orders.signal_outbox();
    Ok(Answer::json(StatusCode::OK, &change, None)?.into_response())
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub(crate) struct ShowBody {
    #[serde(default)]
    title: Option<String>,
    capacity: i64,
    #[serde(default)]
    per_order_limit: Option<i64>,
    #[serde(default)]
    price_cents: Option<i64>,
}

/// Creates a show for a tenant if it does not exist (an existing show is returned as
/// it is: stock is a ledger, not a setting).
#[utoipa::path(
    put,
    path = "/v1/admin/shows/{tenant}/{show_id}",
    tag = crate::api::doc::TAG,
    summary = "Create a show for a tenant if missing (admin token)",
    params(("tenant" = String, Path), ("show_id" = String, Path)), request_body = ShowBody,
    responses(
        (status = 201, description = "Created", body = Object),
        (status = 200, description = "Existed", body = Object),
        (status = 422, description = "Invalid show or tenant", body = crate::api::doc::Problem, content_type = "application/problem+json"),
        crate::api::doc::BodyRefusals,
        crate::api::doc::AdminRefusals
    ),
    security(("admin" = []))
)]
pub(super) async fn put_show(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
    body: Bytes,
) -> Result<Response, ApiError> {
    require_admin(&state, &headers)?;
    let Path((tenant, show_id)) = path.map_err(path_error)?;
    let body: ShowBody = parse_json(&body)?;
    let invalid = |d: &str| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-show",
            "Invalid show",
            d,
        )
    };
    TenantId::new(tenant.clone()).map_err(|e| invalid(&e.to_string()))?;
    let seed = ShowSeed {
        title: body.title.unwrap_or_else(|| show_id.clone()),
        show_id,
        capacity: body.capacity,
        per_order_limit: body.per_order_limit.unwrap_or(6),
        price_cents: body.price_cents.unwrap_or(10_000),
    };
    seed.check().map_err(|e| invalid(&e.to_string()))?;
    let existed = state.orders.show(&tenant, &seed.show_id).await?.is_some();
    let shows = state
        .orders
        .seed(&tenant, std::slice::from_ref(&seed))
        .await?;
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok(Answer::json(status, &shows[0], None)?.into_response())
}

/// A freeze changed through this server: the gauges show it at once.
async fn refresh_after_change(state: &AppState) {
    if let Err(e) = refresh_state_gauges(state.db(), &state.metrics).await {
        tracing::warn!(error = %e, "could not refresh the state gauges");
    }
}
