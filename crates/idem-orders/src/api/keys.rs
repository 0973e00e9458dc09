//! `GET /v1/idempotency-keys/{key}`: the gateway's state query — what a tenant's key
//! holds (state, result reference, the stored response once terminal), without
//! replaying it.
//!
//! Reads the idempotency store only; must not change a record.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::header::{HeaderValue, CONTENT_TYPE};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use idem_core::{IdempotencyKey, RecordState, Scope, TenantId};
use serde_json::json;

use super::answer::Answer;
use super::auth::Caller;
use super::error::ApiError;
use super::extract::path_error;
use super::state::AppState;
use crate::error::Error;

/// The gateway's state query: what this tenant's key holds, without replaying it.
#[utoipa::path(
    get,
    path = "/v1/idempotency-keys/{key}",
    tag = crate::api::doc::TAG,
    summary = "The key's state and result reference for this tenant (the gateway's state query)",
    params(("key" = String, Path, description = "The idempotency key")),
    responses(
        (status = 200, description = "The record's state", body = Object),
        (status = 400, description = "Invalid idempotency key", body = crate::api::doc::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No record for this key (state ABSENT)", body = crate::api::doc::Problem, content_type = "application/problem+json"),
        crate::api::doc::TenantRefusals
    ),
    security(("bearer" = []))
)]
pub(super) async fn key_state(
    State(state): State<AppState>,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(key) = path.map_err(path_error)?;
    let key = IdempotencyKey::new(key).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid-idempotency-key",
            "Invalid idempotency key",
            e.to_string(),
        )
    })?;
    let tenant = TenantId::new(caller.tenant())
        .map_err(|e| ApiError::internal(&Error::InvalidInput(e.to_string())))?;
    let record = state
        .store
        .get(&Scope::new(tenant, key.clone()))
        .await
        .map_err(|e| ApiError::internal(&e.into()))?;
    let Some(record) = record else {
        // `state: ABSENT` tells the gateway the request never took effect, so it may
        // re-send it under the same key.
        let body = json!({
            "type": "https://idem.dev/problems/orders/idempotency-key-not-found",
            "title": "No request with this key",
            "status": 404,
            "detail": format!("this tenant has no record for key {key}"),
            "key": key,
            "state": "ABSENT",
        });
        return Ok((
            StatusCode::NOT_FOUND,
            [(
                CONTENT_TYPE,
                HeaderValue::from_static("application/problem+json"),
            )],
            body.to_string(),
        )
            .into_response());
    };
    let result = record.result.as_ref().map(|r| {
        json!({
            "status": r.status,
            "result_ref": r.result_ref,
            "body_stored": !r.body.is_empty(),
        })
    });
    // The stored response itself, for the gateway's answer after an uncertain result.
    let response = record
        .result
        .as_ref()
        .filter(|_| record.state.is_terminal())
        .and_then(|r| {
            let body = std::str::from_utf8(&r.body).ok()?;
            Some(json!({"status": r.status, "headers": r.headers, "body": body}))
        });
    let order_id = record
        .result
        .as_ref()
        .and_then(|r| r.result_ref.as_deref())
        .and_then(|loc| loc.strip_prefix("/v1/orders/"))
        .map(str::to_owned);
    let body = json!({
        "tenant": record.tenant,
        "key": record.key,
        "state": record.state,
        "terminal": record.state.is_terminal(),
        "retryable": record.state == RecordState::FailedRetryable,
        "version": record.version,
        "attempts": record.attempts,
        "owner": record.owner,
        "lease_expires_at": record.lease_expires_at.map(crate::views::rfc3339),
        "created_at": crate::views::rfc3339(record.created_at),
        "updated_at": crate::views::rfc3339(record.updated_at),
        "completed_at": record.completed_at.map(crate::views::rfc3339),
        "result": result,
        "response": response,
        "order_id": order_id,
    });
    Ok(Answer::json(StatusCode::OK, &body, None)?.into_response())
}
