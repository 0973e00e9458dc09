//! The tenant API's order routes: create (and the demo's legacy create), pay, cancel,
//! read and list — behind the idempotency layer, each write committed with its key's
//! record through [`commit`].
//!
//! Handlers translate between the wire and [`crate::service`]; they must not decide
//! business rules, and must not write outside the unit the service hands them.

use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use idem_http::TransactionalClaim;

use super::answer::{commit, Answer};
use super::auth::Caller;
use super::error::ApiError;
use super::extract::{parse_json, path_error, query_error};
use super::state::AppState;
use crate::error::{Error, OrderError};
use crate::ledgers::OrderFilter;
use crate::service::{Created, NewOrder, PayAnswer, Unit};
use crate::views::{OrderList, OrderView};

/// A refusal of the service, counted by its slug when it is the client's.
fn rejected(state: &AppState, e: OrderError) -> ApiError {
    let problem = ApiError::from(e);
    if problem.status.is_client_error() {
        state.metrics.rejected(problem.slug);
    }
    problem
}

#[utoipa::path(
    post,
    path = "/v1/orders",
    tag = crate::api::doc::TAG,
    summary = "Create an order (order, hold and order.created in one transaction with the key's record)",
    request_body = crate::service::NewOrder,
    responses(
        (status = 201, description = "Created; a replay carries the same body and Idempotent-Replayed: true", body = crate::views::OrderView),
        (status = 409, description = "Sold out", body = crate::api::doc::Problem, content_type = "application/problem+json"),
        (status = 422, description = "Unknown show, quantity out of range or invalid fields", body = crate::api::doc::Problem, content_type = "application/problem+json"),
        crate::api::doc::BodyRefusals,
        crate::api::doc::TenantRefusals
    ),
    security(("bearer" = []))
)]
pub(super) async fn create_order(
    State(state): State<AppState>,
    caller: Caller,
    claim: Option<Extension<TransactionalClaim>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let claim = claim.map(|Extension(c)| c);
    let key = claim.as_ref().map(|c| c.token().scope.key.to_string());
    create(
        &state,
        &caller,
        claim.as_ref(),
        key.as_deref(),
        &body,
        "idem",
    )
    .await
}

/// The legacy behaviour: no key, every arrival mints a new order id.
#[utoipa::path(
    post,
    path = "/v1/legacy/orders",
    tag = crate::api::doc::TAG,
    summary = "The pre-idem behaviour (demo only): no key, a new order per arrival",
    request_body = crate::service::NewOrder,
    responses(
        (status = 201, description = "Created", body = crate::views::OrderView),
        (status = 409, description = "Sold out", body = crate::api::doc::Problem, content_type = "application/problem+json"),
        (status = 422, description = "Unknown show, quantity out of range or invalid fields", body = crate::api::doc::Problem, content_type = "application/problem+json"),
        crate::api::doc::BodyRefusals,
        crate::api::doc::TenantRefusals
    ),
    security(("bearer" = []))
)]
pub(super) async fn legacy_create_order(
    State(state): State<AppState>,
    caller: Caller,
    body: Bytes,
) -> Result<Response, ApiError> {
    create(&state, &caller, None, None, &body, "legacy").await
}

async fn create(
    state: &AppState,
    caller: &Caller,
    claim: Option<&TransactionalClaim>,
    key: Option<&str>,
    body: &[u8],
    route: &'static str,
) -> Result<Response, ApiError> {
    let req: NewOrder = parse_json(body)?;
    let faults = state.orders.faults();
    let slow = faults.take_slow_create();
    if let Some(slow) = slow {
        // The incident's first request: slow upstream work before the write.
        tokio::time::sleep(slow.commit_after).await;
    }
    let deferred = claim.and_then(TransactionalClaim::deferred_request);
    let first_try = match (claim, deferred) {
        (Some(claim), Some(deferred)) => {
            create_final(state, caller, claim, deferred, &req, key, route).await?
        }
        _ => None,
    };
    let answer = match first_try {
        Some(answer) => answer,
        // The key has a record (or this is not an in-transaction claim): claim first,
        // in a new transaction.
        None => {
            let created = state
                .orders
                .create(caller.tenant(), &req, key, route, deferred)
                .await
                .map_err(|e| rejected(state, e))?;
            let unit = match created {
                Created::Written(unit, token) => {
                    if let (Some(claim), Some(token)) = (claim, token) {
                        claim.claimed(token);
                    }
                    *unit
                }
                Created::Answered(answer) => {
                    // The layer answers from the claim; this response is not sent.
                    if let Some(claim) = claim {
                        claim.answered(answer);
                    }
                    return Ok(StatusCode::CONFLICT.into_response());
                }
                // The key's record was claimed here, yet an order under it exists: the
                // record and the order disagree, which only an operator can sort out.
                Created::KeyTaken => {
                    return Err(ApiError::internal(&Error::Backend(
                        "an order under this idempotency key exists without its record".into(),
                    )))
                }
            };
            let location = format!("/v1/orders/{}", unit.value.order_id);
            let answer = Answer::json(StatusCode::CREATED, &unit.value, Some(location))?;
            commit(state, unit, claim, &answer).await?;
            answer
        }
    };
    if let (Some(hook), Some(_)) = (&faults.after_create_commit, claim) {
        // The drill: the order and its record are committed, the response not yet sent.
        tracing::warn!("fault injected after the create committed");
        hook();
    }
    if let Some(slow) = slow {
        // The response is stuck after the commit: the client gives up first.
        tokio::time::sleep(slow.respond_after).await;
    }
    Ok(answer.into_response())
}

/// The first try of a create on an in-transaction claim: the order's rows, then its
/// record inserted whole and final in the same transaction, so the record is one row
/// written once and the create one commit. `None` when the key has a record — seen
/// before writing, or committed meanwhile by a duplicate (whose row the insert waited
/// on) — after which nothing of this try remains and the caller claims first.
async fn create_final(
    state: &AppState,
    caller: &Caller,
    claim: &TransactionalClaim,
    deferred: &idem_core::ClaimRequest,
    req: &NewOrder,
    key: Option<&str>,
    route: &'static str,
) -> Result<Option<Answer>, ApiError> {
    let store = state.db().idempotency_store();
    let known = store
        .get(&deferred.scope)
        .await
        .map_err(|e| ApiError::internal(&e.into()))?;
    if known.is_some() {
        return Ok(None);
    }
    let created = state
        .orders
        .create(caller.tenant(), req, key, route, None)
        .await
        .map_err(|e| rejected(state, e))?;
    let Created::Written(unit, _) = created else {
        return Ok(None);
    };
    let Unit { mut tx, value, .. } = *unit;
    let location = format!("/v1/orders/{}", value.order_id);
    let answer = Answer::json(StatusCode::CREATED, &value, Some(location))?;
    let finish = claim.finish_for(answer.status, &answer.headers(), &answer.body);
    let record = state
        .db()
        .insert_final_in_tx(&mut tx, deferred, finish)
        .await
        .map_err(|e| ApiError::internal(&e.into()))?;
    let Some(record) = record else {
        // A duplicate's record is there: this try rolls back (the transaction drops).
        return Ok(None);
    };
    tx.commit().await?;
    claim.finished_in_transaction(record);
    state.orders.signal_outbox();
    Ok(Some(answer))
}

#[utoipa::path(
    post,
    path = "/v1/orders/{order_id}/pay",
    tag = crate::api::doc::TAG,
    summary = "Pay (charge under pay:{order_id}, then confirm); concurrent pays make one charge",
    params(("order_id" = String, Path, description = "The order")),
    responses(
        (status = 200, description = "Paid (now or before)", body = crate::views::OrderView),
        (status = 202, description = "Queued: payment-confirm is frozen for this order; it runs on unfreeze", body = crate::views::OrderView),
        (status = 400, description = "Invalid order id", body = crate::api::doc::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such order for this tenant", body = crate::api::doc::Problem, content_type = "application/problem+json"),
        (status = 409, description = "The order cannot be paid from its status", body = crate::api::doc::Problem, content_type = "application/problem+json"),
        crate::api::doc::TenantRefusals
    ),
    security(("bearer" = []))
)]
pub(super) async fn pay_order(
    State(state): State<AppState>,
    caller: Caller,
    claim: Option<Extension<TransactionalClaim>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(order_id) = path.map_err(path_error)?;
    let claim = claim.map(|Extension(c)| c);
    let unit = state
        .orders
        .pay(caller.tenant(), &order_id)
        .await
        .map_err(|e| rejected(&state, e))?;
    let (status, order, queued) = match &unit.value {
        PayAnswer::Paid(o) | PayAnswer::AlreadyPaid(o) => (StatusCode::OK, o, None),
        PayAnswer::Queued(o, f) => (StatusCode::ACCEPTED, o, Some(f)),
    };
    let mut view = OrderView::summary(order, None);
    if let Some(freeze) = queued {
        view.payment = Some("queued".into());
        view.frozen = Some(vec![(**freeze).clone()]);
    }
    let answer = Answer::json(status, &view, Some(format!("/v1/orders/{order_id}")))?;
    commit(&state, unit, claim.as_ref(), &answer).await?;
    Ok(answer.into_response())
}

#[utoipa::path(
    post,
    path = "/v1/orders/{order_id}/cancel",
    tag = crate::api::doc::TAG,
    summary = "Cancel (refunding under refund:{order_id} when paid); the hold is released by the chain",
    params(("order_id" = String, Path, description = "The order")),
    responses(
        (status = 200, description = "Cancelled (now or before)", body = crate::views::OrderView),
        (status = 400, description = "Invalid order id", body = crate::api::doc::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such order for this tenant", body = crate::api::doc::Problem, content_type = "application/problem+json"),
        (status = 409, description = "A ticketed order cannot be cancelled", body = crate::api::doc::Problem, content_type = "application/problem+json"),
        crate::api::doc::TenantRefusals
    ),
    security(("bearer" = []))
)]
pub(super) async fn cancel_order(
    State(state): State<AppState>,
    caller: Caller,
    claim: Option<Extension<TransactionalClaim>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(order_id) = path.map_err(path_error)?;
    let claim = claim.map(|Extension(c)| c);
    let unit = state
        .orders
        .cancel(caller.tenant(), &order_id)
        .await
        .map_err(|e| rejected(&state, e))?;
    let view = OrderView::summary(&unit.value, None);
    let answer = Answer::json(
        StatusCode::OK,
        &view,
        Some(format!("/v1/orders/{order_id}")),
    )?;
    commit(&state, unit, claim.as_ref(), &answer).await?;
    Ok(answer.into_response())
}

#[utoipa::path(
    get,
    path = "/v1/orders/{order_id}",
    tag = crate::api::doc::TAG,
    summary = "An order with its payments, hold, ticket, messages, active freezes and history",
    params(("order_id" = String, Path, description = "The order")),
    responses(
        (status = 200, description = "The order", body = crate::views::OrderView),
        (status = 400, description = "Invalid order id", body = crate::api::doc::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such order for this tenant", body = crate::api::doc::Problem, content_type = "application/problem+json"),
        crate::api::doc::TenantRefusals
    ),
    security(("bearer" = []))
)]
pub(super) async fn get_order(
    State(state): State<AppState>,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(order_id) = path.map_err(path_error)?;
    let view = state.orders.view(caller.tenant(), &order_id).await?;
    Ok(Answer::json(StatusCode::OK, &view, None)?.into_response())
}

#[utoipa::path(
    get,
    path = "/v1/orders",
    tag = crate::api::doc::TAG,
    summary = "List the tenant's orders, oldest first",
    params(crate::ledgers::OrderFilter),
    responses(
        (status = 200, description = "Orders, oldest first", body = crate::views::OrderList),
        (status = 400, description = "Invalid query parameters", body = crate::api::doc::Problem, content_type = "application/problem+json"),
        crate::api::doc::TenantRefusals
    ),
    security(("bearer" = []))
)]
pub(super) async fn list_orders(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<OrderFilter>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(filter) = query.map_err(query_error)?;
    let orders = state.orders.list(caller.tenant(), &filter).await?;
    Ok(Answer::json(StatusCode::OK, &OrderList { orders }, None)?.into_response())
}
