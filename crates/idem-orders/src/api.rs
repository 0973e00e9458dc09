//! The HTTP API: routes, authentication, request parsing, problem responses, and the
//! one place a business transaction meets its idempotency record.
//!
//! The tenant API sits behind `idem-http`'s [`IdempotencyLayer`]: POSTs need an
//! `Idempotency-Key`; concurrent duplicates wait for the first and replay it. Handlers
//! write their business rows in an open transaction, finish the claim in that same
//! transaction ([`TransactionalClaim`] + `finish_in_tx`), and commit once — so the order
//! and the record that makes it idempotent exist together or not at all.
//!
//! Tenants come only from authentication (bearer API keys); another tenant's order is
//! 404. Admin routes (freezes, shows) and `/metrics` need the admin token and are
//! outside the layer.
//!
//! Every request carries a request id of our own (never the client's, which could
//! repeat another request's): answered in `x-request-id`, added as `request_id` to the
//! problem+json of server failures and 408s, and on the span of the request's logs,
//! beside the client's own `x-request-id` (when plain) as `client_request_id`. Internal errors are logged with it and answered with a stable message, never
//! the error's text. Request bodies are read in full, within the body read timeout,
//! before a handler or the layer sees them (408 otherwise).
//!
//! This module owns the wire; it must not decide business rules (that is
//! [`crate::service`]).

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRequestParts, Path, Query, Request, State};
use axum::http::header::{
    HeaderValue, AUTHORIZATION, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, LOCATION, RETRY_AFTER,
};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Extension, Router};
use idem_core::{IdempotencyKey, IdempotencyStore, RecordState, Scope, StoreError, TenantId};
use idem_http::body::{declared_too_large, read_limited, ReadError};
use idem_http::problem::{Problem, ProblemKind, ProblemResponse};
use idem_http::{Authenticate, IdempotencyLayer, Identity, TransactionalClaim, PROBLEM_JSON};
use prometheus_client::registry::Registry;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tracing::Instrument;

use crate::db::Database;
use crate::error::{Error, OrderError};
use crate::freeze::{self, FreezeRequest, FreezeScope, FreezeWhat};
use crate::ledgers::{self, OrderFilter, ShowSeed};
use crate::metrics::OrdersMetrics;
use crate::service::{Created, NewOrder, Orders, PayAnswer, Unit};
use crate::views::{OrderList, OrderView};

/// Problem `type`s of this service: `https://idem.dev/problems/orders/{slug}`.
pub const PROBLEM_TYPE_BASE: &str = "https://idem.dev/problems/orders/";

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
    pub(crate) console: Arc<crate::console::ConsoleState>,
}

impl AppState {
    fn db(&self) -> &Database {
        self.orders.database()
    }
}

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
    tenant_api
        .merge(admin)
        .merge(public)
        .merge(crate::console::routes())
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            read_body_in_time,
        ))
        .layer(middleware::from_fn(request_ids))
        .with_state(state)
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

// ---------------------------------------------------------------------------------------
// Errors

/// A problem+json answer of this service.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    slug: &'static str,
    title: &'static str,
    detail: String,
    retry_after: Option<u64>,
    extra: Option<serde_json::Value>,
}

impl ApiError {
    fn new(
        status: StatusCode,
        slug: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            status,
            slug,
            title,
            detail: detail.into(),
            retry_after: None,
            extra: None,
        }
    }

    fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }

    fn extra(mut self, extra: serde_json::Value) -> Self {
        self.extra = Some(extra);
        self
    }

    /// The error's text goes to the log (on the request's span, with its request id);
    /// the client gets a stable message and the request id to quote.
    fn internal(e: &Error) -> Self {
        if e.is_unavailable() {
            tracing::warn!(error = %e, "dependency unavailable");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "service-unavailable",
                "A dependency is unavailable; retry with the same key",
                "a database or broker the service needs did not answer; retry with the same \
                 key",
            )
            .retry_after(1)
        } else {
            tracing::error!(error = %e, "internal error");
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal-error",
                "Internal error; retry with the same key",
                "the service failed on this request; retry with the same key, and quote the \
                 request_id when reporting it",
            )
        }
    }

    fn malformed_json(e: &serde_json::Error) -> Self {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "malformed-json",
            "Malformed JSON body",
            e.to_string(),
        )
    }

    fn invalid_body(e: &serde_json::Error) -> Self {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-body",
            "The body does not have the expected fields",
            e.to_string(),
        )
    }
}

impl From<OrderError> for ApiError {
    fn from(e: OrderError) -> Self {
        let detail = e.to_string();
        match e {
            OrderError::UnknownShow { show_id } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "unknown-show",
                "Unknown show",
                detail,
            )
            .extra(json!({ "show_id": show_id })),
            OrderError::QuantityTooSmall { .. } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-quantity",
                "Quantity must be at least 1",
                detail,
            ),
            OrderError::QuantityAboveLimit { limit, .. } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "quantity-above-limit",
                "Quantity above the per-order limit",
                detail,
            )
            .extra(json!({ "limit": limit })),
            OrderError::SoldOut { available, .. } => ApiError::new(
                StatusCode::CONFLICT,
                "sold-out",
                "Not enough tickets left",
                detail,
            )
            .extra(json!({ "available": available })),
            OrderError::OrderNotFound { .. } => ApiError::new(
                StatusCode::NOT_FOUND,
                "order-not-found",
                "Order not found",
                detail,
            ),
            OrderError::InvalidField { field, .. } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-field",
                "Invalid field",
                detail,
            )
            .extra(json!({ "field": field })),
            OrderError::IllegalTransition(t) => ApiError::new(
                StatusCode::CONFLICT,
                "illegal-transition",
                "The order cannot take this step from its current status",
                detail,
            )
            .extra(json!({ "from": t.from, "event": t.event })),
            OrderError::Busy { .. } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "order-busy",
                "Another request is working on this order",
                detail,
            )
            .retry_after(1),
            OrderError::StockBusy { show_id } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "stock-busy",
                "The show's remaining tickets are being taken",
                detail,
            )
            .extra(json!({ "show_id": show_id }))
            .retry_after(1),
            OrderError::Internal(e) => ApiError::internal(&e),
        }
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        ApiError::internal(&e)
    }
}

impl ApiError {
    fn body(&self) -> Vec<u8> {
        let type_uri = format!("{PROBLEM_TYPE_BASE}{}", self.slug);
        let document = idem_core::problem::Document {
            type_uri: &type_uri,
            title: self.title,
            status: self.status,
            detail: &self.detail,
            request_id: None,
        };
        document.to_json(self.extra.as_ref().and_then(serde_json::Value::as_object))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, self.body()).into_response();
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(secs) = self.retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => ApiError::invalid_body(&e),
        _ => ApiError::malformed_json(&e),
    })
}

fn path_error(e: PathRejection) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid-path",
        "Invalid path",
        e.body_text(),
    )
}

fn query_error(e: QueryRejection) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid-query",
        "Invalid query",
        e.body_text(),
    )
}

// ---------------------------------------------------------------------------------------
// Authentication

/// The authenticated caller: from the idempotency layer when it ran (POSTs), otherwise
/// from the same authentication.
pub(crate) struct Caller(Identity);

impl FromRequestParts<AppState> for Caller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        if let Some(identity) = parts.extensions.get::<Identity>() {
            return Ok(Caller(identity.clone()));
        }
        match state.auth.authenticate(parts).await {
            Ok(identity) => Ok(Caller(identity)),
            Err(refused) => Err(Problem::new(ProblemKind::Unauthenticated, refused.detail)
                .challenge(refused.challenge)
                .response()
                .into_response()),
        }
    }
}

impl Caller {
    fn tenant(&self) -> &str {
        self.0.tenant.as_str()
    }
}

fn require_admin(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(expected) = &state.admin_token else {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "admin-disabled",
            "The admin API is disabled",
            "start the server with --admin-token",
        ));
    };
    let presented = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    match presented {
        // Digests compared in constant time: neither content nor length leaks.
        Some(token) if idem_http::auth::same_secret(token.as_bytes(), expected.as_bytes()) => {
            Ok(())
        }
        _ => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "admin-unauthenticated",
            "Admin token required",
            "send Authorization: Bearer ADMIN_TOKEN",
        )),
    }
}

// ---------------------------------------------------------------------------------------
// Answering: business rows + record, one commit

/// A successful answer to a request: its status, body and `Location`.
struct Answer {
    status: StatusCode,
    body: Vec<u8>,
    location: Option<String>,
}

impl Answer {
    fn json(
        status: StatusCode,
        value: &impl Serialize,
        location: Option<String>,
    ) -> Result<Self, ApiError> {
        let body = serde_json::to_vec(value)
            .map_err(|e| ApiError::internal(&Error::Backend(e.to_string())))?;
        Ok(Self {
            status,
            body,
            location,
        })
    }

    fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(loc) = self
            .location
            .as_deref()
            .and_then(|l| HeaderValue::from_str(l).ok())
        {
            headers.insert(LOCATION, loc);
        }
        headers
    }

    fn into_response(self) -> Response {
        let headers = self.headers();
        (self.status, headers, self.body).into_response()
    }
}

/// Finishes the claim (if the request runs under one) in the business transaction,
/// commits once, then releases the unit's lease and wakes the relay.
async fn commit<T>(
    state: &AppState,
    unit: Unit<T>,
    claim: Option<&TransactionalClaim>,
    answer: &Answer,
) -> Result<(), ApiError> {
    let Unit { mut tx, lease, .. } = unit;
    let result = async {
        let record = match claim {
            Some(claim) => {
                let finish = claim.finish_for(answer.status, &answer.headers(), &answer.body);
                match state
                    .db()
                    .finish_in_tx(&mut tx, claim.token(), finish)
                    .await
                {
                    Ok(record) => Some(record),
                    Err(e @ StoreError::Superseded { .. }) => {
                        // The claim moved on (its lease ran out and another request took
                        // it over): this transaction must not commit.
                        tracing::warn!(error = %e, "claim superseded before the commit");
                        return Err(ApiError::new(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "claim-superseded",
                            "This request lost its claim on the key; retry with the same key",
                            "another request took the key over before this one committed; \
                             nothing was written",
                        ));
                    }
                    Err(e) => return Err(ApiError::internal(&e.into())),
                }
            }
            None => None,
        };
        tx.commit().await?;
        if let (Some(claim), Some(record)) = (claim, record) {
            claim.finished_in_transaction(record);
        }
        Ok(())
    }
    .await;
    if let Some(guard) = lease {
        state.orders.release(guard).await;
    }
    if result.is_ok() {
        state.orders.signal_outbox();
    }
    result
}

fn rejected(state: &AppState, e: OrderError) -> ApiError {
    let problem = ApiError::from(e);
    if problem.status.is_client_error() {
        state.metrics.rejected(problem.slug);
    }
    problem
}

// ---------------------------------------------------------------------------------------
// Tenant API

#[utoipa::path(
    post,
    path = "/v1/orders",
    tag = crate::openapi::TAG,
    summary = "Create an order (order, hold and order.created in one transaction with the key's record)",
    request_body = crate::service::NewOrder,
    responses(
        (status = 201, description = "Created; a replay carries the same body and Idempotent-Replayed: true", body = crate::views::OrderView),
        (status = 409, description = "Sold out", body = crate::openapi::Problem, content_type = "application/problem+json"),
        (status = 422, description = "Unknown show, quantity out of range or invalid fields", body = crate::openapi::Problem, content_type = "application/problem+json"),
        crate::openapi::BodyRefusals,
        crate::openapi::TenantRefusals
    ),
    security(("bearer" = []))
)]
async fn create_order(
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
    tag = crate::openapi::TAG,
    summary = "The pre-idem behaviour (demo only): no key, a new order per arrival",
    request_body = crate::service::NewOrder,
    responses(
        (status = 201, description = "Created", body = crate::views::OrderView),
        (status = 409, description = "Sold out", body = crate::openapi::Problem, content_type = "application/problem+json"),
        (status = 422, description = "Unknown show, quantity out of range or invalid fields", body = crate::openapi::Problem, content_type = "application/problem+json"),
        crate::openapi::BodyRefusals,
        crate::openapi::TenantRefusals
    ),
    security(("bearer" = []))
)]
async fn legacy_create_order(
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
    tag = crate::openapi::TAG,
    summary = "Pay (charge under pay:{order_id}, then confirm); concurrent pays make one charge",
    params(("order_id" = String, Path, description = "The order")),
    responses(
        (status = 200, description = "Paid (now or before)", body = crate::views::OrderView),
        (status = 202, description = "Queued: payment-confirm is frozen for this order; it runs on unfreeze", body = crate::views::OrderView),
        (status = 400, description = "Invalid order id", body = crate::openapi::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such order for this tenant", body = crate::openapi::Problem, content_type = "application/problem+json"),
        (status = 409, description = "The order cannot be paid from its status", body = crate::openapi::Problem, content_type = "application/problem+json"),
        crate::openapi::TenantRefusals
    ),
    security(("bearer" = []))
)]
async fn pay_order(
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
    tag = crate::openapi::TAG,
    summary = "Cancel (refunding under refund:{order_id} when paid); the hold is released by the chain",
    params(("order_id" = String, Path, description = "The order")),
    responses(
        (status = 200, description = "Cancelled (now or before)", body = crate::views::OrderView),
        (status = 400, description = "Invalid order id", body = crate::openapi::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such order for this tenant", body = crate::openapi::Problem, content_type = "application/problem+json"),
        (status = 409, description = "A ticketed order cannot be cancelled", body = crate::openapi::Problem, content_type = "application/problem+json"),
        crate::openapi::TenantRefusals
    ),
    security(("bearer" = []))
)]
async fn cancel_order(
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
    tag = crate::openapi::TAG,
    summary = "An order with its payments, hold, ticket, messages, active freezes and history",
    params(("order_id" = String, Path, description = "The order")),
    responses(
        (status = 200, description = "The order", body = crate::views::OrderView),
        (status = 400, description = "Invalid order id", body = crate::openapi::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such order for this tenant", body = crate::openapi::Problem, content_type = "application/problem+json"),
        crate::openapi::TenantRefusals
    ),
    security(("bearer" = []))
)]
async fn get_order(
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
    tag = crate::openapi::TAG,
    summary = "List the tenant's orders, oldest first",
    params(crate::ledgers::OrderFilter),
    responses(
        (status = 200, description = "Orders, oldest first", body = crate::views::OrderList),
        (status = 400, description = "Invalid query parameters", body = crate::openapi::Problem, content_type = "application/problem+json"),
        crate::openapi::TenantRefusals
    ),
    security(("bearer" = []))
)]
async fn list_orders(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<OrderFilter>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(filter) = query.map_err(query_error)?;
    let orders = state.orders.list(caller.tenant(), &filter).await?;
    Ok(Answer::json(StatusCode::OK, &OrderList { orders }, None)?.into_response())
}

/// The gateway's state query: what this tenant's key holds, without replaying it.
#[utoipa::path(
    get,
    path = "/v1/idempotency-keys/{key}",
    tag = crate::openapi::TAG,
    summary = "The key's state and result reference for this tenant (the gateway's state query)",
    params(("key" = String, Path, description = "The idempotency key")),
    responses(
        (status = 200, description = "The record's state", body = Object),
        (status = 400, description = "Invalid idempotency key", body = crate::openapi::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No record for this key (state ABSENT)", body = crate::openapi::Problem, content_type = "application/problem+json"),
        crate::openapi::TenantRefusals
    ),
    security(("bearer" = []))
)]
async fn key_state(
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

// ---------------------------------------------------------------------------------------
// Admin API

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
    tag = crate::openapi::TAG,
    summary = "Active freezes and their history (admin token)",
    responses(
        (status = 200, description = "Active freezes and their history", body = Object),
        crate::openapi::AdminRefusals
    ),
    security(("admin" = []))
)]
async fn list_freezes(
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
    tag = crate::openapi::TAG,
    summary = "Freeze payment-confirm, ticketing and/or inventory-release for user:U, show:S or all (admin token)",
    request_body = FreezeBody,
    responses(
        (status = 201, description = "Frozen", body = Object),
        (status = 200, description = "Already frozen", body = Object),
        (status = 422, description = "Invalid scope, what, tenant, reason or actor", body = crate::openapi::Problem, content_type = "application/problem+json"),
        crate::openapi::BodyRefusals,
        crate::openapi::AdminRefusals
    ),
    security(("admin" = []))
)]
async fn post_freeze(
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
    tag = crate::openapi::TAG,
    summary = "End freezes; the queued work resumes (admin token)",
    request_body = FreezeBody,
    responses(
        (status = 200, description = "Unfrozen", body = Object),
        (status = 422, description = "Invalid scope, what, tenant, reason or actor", body = crate::openapi::Problem, content_type = "application/problem+json"),
        crate::openapi::BodyRefusals,
        crate::openapi::AdminRefusals
    ),
    security(("admin" = []))
)]
async fn post_unfreeze(
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
    tag = crate::openapi::TAG,
    summary = "Create a show for a tenant if missing (admin token)",
    params(("tenant" = String, Path), ("show_id" = String, Path)), request_body = ShowBody,
    responses(
        (status = 201, description = "Created", body = Object),
        (status = 200, description = "Existed", body = Object),
        (status = 422, description = "Invalid show or tenant", body = crate::openapi::Problem, content_type = "application/problem+json"),
        crate::openapi::BodyRefusals,
        crate::openapi::AdminRefusals
    ),
    security(("admin" = []))
)]
async fn put_show(
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

// ---------------------------------------------------------------------------------------
// Public

#[utoipa::path(
    get,
    path = "/healthz",
    tag = crate::openapi::TAG,
    summary = "Liveness and database reachability",
    responses(
        (status = 200, description = "ok", body = Object),
        (status = 503, description = "The database does not answer", body = Object)
    ),
    security(())
)]
async fn healthz(State(state): State<AppState>) -> Response {
    let ok = match state.db().acquire().await {
        Ok(mut conn) => conn
            .conn()
            .one(crate::db::sql("SELECT 1 AS one"))
            .await
            .is_ok(),
        Err(_) => false,
    };
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        axum::Json(json!({ "status": if ok { "ok" } else { "unavailable" }, "database": state.db().backend() })),
    )
        .into_response()
}

/// `/livez`: the process serves HTTP. Nothing else is checked, so a slow database never
/// gets a live process restarted.
#[utoipa::path(
    get,
    path = "/livez",
    tag = crate::openapi::TAG,
    summary = "Liveness: the process serves HTTP",
    responses(
        (status = 200, description = "alive", body = Object)
    ),
    security(())
)]
async fn livez() -> Response {
    axum::Json(json!({ "status": "alive" })).into_response()
}

/// `/readyz`: 200 only when the database answers, its schemas are the ones this build
/// needs, and no shutdown has begun; otherwise 503 with the check that failed.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = crate::openapi::TAG,
    summary = "Readiness: database reachable, schemas current, not shutting down",
    responses(
        (status = 200, description = "ready", body = Object),
        (status = 503, description = "not ready, with the reason", body = Object)
    ),
    security(())
)]
async fn readyz(State(state): State<AppState>) -> Response {
    let draining = state.draining.load(std::sync::atomic::Ordering::Relaxed);
    let schema = state.db().schema_status().await;
    let (status, body) = readiness(draining, &schema, state.db().backend());
    (status, axum::Json(body)).into_response()
}

fn readiness(
    draining: bool,
    schema: &Result<crate::db::SchemaStatus, crate::error::Error>,
    backend: &str,
) -> (StatusCode, serde_json::Value) {
    let (database, schema_ok, schema_json) = match schema {
        Ok(s) => ("reachable", s.current(), json!(s)),
        Err(_) => ("unreachable", false, serde_json::Value::Null),
    };
    let ready = !draining && database == "reachable" && schema_ok;
    let reason = if draining {
        Some("shutting down")
    } else if database != "reachable" {
        Some("database unreachable")
    } else if !schema_ok {
        Some("schema older than this build needs: run idem migrate")
    } else {
        None
    };
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        json!({
            "status": if ready { "ready" } else { "not_ready" },
            "reason": reason,
            "draining": draining,
            "database": database,
            "backend": backend,
            "schema": schema_json,
        }),
    )
}

/// `/metrics` on the main address: the admin token is required (the series describe
/// every tenant's traffic).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = crate::openapi::TAG,
    summary = "Prometheus metrics (the admin token; or without credentials on --metrics-listen)",
    responses(
        (status = 200, description = "OpenMetrics text", body = String, content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8"),
        (status = 401, description = "No or a wrong admin token", body = crate::openapi::Problem, content_type = "application/problem+json"),
        (status = 403, description = "The admin API is disabled (no admin token configured)", body = crate::openapi::Problem, content_type = "application/problem+json")
    ),
    security(("admin" = []))
)]
async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
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
async fn open_metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
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

/// A freeze changed through this server: the gauges show it at once.
async fn refresh_after_change(state: &AppState) {
    if let Err(e) = refresh_state_gauges(state.db(), &state.metrics).await {
        tracing::warn!(error = %e, "could not refresh the state gauges");
    }
}

#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = crate::openapi::TAG,
    summary = "This document",
    responses(
        (status = 200, description = "OpenAPI 3.1", body = Object)
    ),
    security(())
)]
async fn openapi(State(state): State<AppState>) -> Response {
    axum::Json((*state.openapi).clone()).into_response()
}

// ---------------------------------------------------------------------------------------
// Request ids and request bodies

/// `x-request-id`: always answered with our own id; the client's is logged beside it.
pub use idem_http::headers::REQUEST_ID;

/// Problem bodies are small; anything larger is passed on untouched.
const MAX_PROBLEM_BODY: usize = 64 * 1024;

async fn request_ids(request: Request, next: Next) -> Response {
    // Minted here every time: a client's id may repeat another request's, and a log
    // searched by it would mix the two. The client's id (a gateway's, an app's) stays
    // findable as a field of its own; it is not echoed, the client has it already.
    let id = uuid::Uuid::now_v7().simple().to_string();
    let client_id = idem_core::wire::client_request_id(request.headers());
    // The caller's W3C trace (the gateway always sends one): its id joins our log lines
    // to the caller's trace.
    let trace_id = request
        .headers()
        .get(&idem_core::wire::TRACEPARENT)
        .and_then(|v| v.to_str().ok())
        .and_then(idem_core::wire::TraceParent::parse)
        .map(|t| t.trace_id_hex());
    // An error-level span, so its id shows on every logged warning and error.
    let span = tracing::error_span!(
        "request",
        request_id = %id,
        client_request_id = tracing::field::Empty,
        trace_id = trace_id.as_deref().unwrap_or("-")
    );
    if let Some(client_id) = client_id {
        span.record("client_request_id", client_id);
    }
    let response = next.run(request).instrument(span).await;
    with_request_id(response, &id).await
}

/// Adds `x-request-id` to the answer, and `request_id` to the problem+json of a failure
/// that is never replayed (5xx, 408): a refusal stored under its key must replay byte
/// for byte, so its body stays as the layer stored it.
async fn with_request_id(response: Response, id: &str) -> Response {
    let (mut parts, body) = response.into_parts();
    if let Ok(value) = HeaderValue::from_str(id) {
        parts.headers.insert(REQUEST_ID, value);
    }
    let never_replayed =
        parts.status.is_server_error() || parts.status == StatusCode::REQUEST_TIMEOUT;
    let is_problem = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(PROBLEM_JSON));
    if !(never_replayed && is_problem) {
        return Response::from_parts(parts, body);
    }
    let bytes = match axum::body::to_bytes(body, MAX_PROBLEM_BODY).await {
        Ok(bytes) => bytes,
        Err(e) => {
            tracing::warn!(error = %e, "problem body unreadable");
            parts.headers.remove(CONTENT_LENGTH);
            return Response::from_parts(parts, Body::empty());
        }
    };
    let body = match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(serde_json::Value::Object(mut problem)) => {
            problem
                .entry("request_id")
                .or_insert_with(|| serde_json::Value::from(id));
            Bytes::from(serde_json::to_vec(&problem).unwrap_or_else(|_| bytes.to_vec()))
        }
        _ => bytes,
    };
    parts.headers.remove(CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body))
}

/// The largest body a console form may post.
const CONSOLE_FORM_LIMIT: usize = 64 * 1024;

/// Reads the whole request body, at most `max_body` bytes and within the body read
/// timeout, before any route sees it: a client that stalls gets 408 and its connection
/// closed, having recorded nothing.
async fn read_body_in_time(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    if http_body::Body::is_end_stream(&body) {
        return next.run(Request::from_parts(parts, body)).await;
    }
    // Nobody buffers a body for a caller it does not know: every route that takes one
    // needs a tenant key or the admin token — except the console's forms, which carry
    // the admin token (login) or a session, checked by the console before acting.
    let console = parts.uri.path().starts_with("/console/");
    let refused = if console {
        None
    } else {
        state.auth.authenticate(&parts).await.err()
    };
    if let Some(refused) = refused {
        if parts.uri.path().starts_with("/v1/admin/") {
            if let Err(e) = require_admin(&state, &parts.headers) {
                return e.into_response();
            }
        } else {
            return Problem::new(ProblemKind::Unauthenticated, refused.detail)
                .challenge(refused.challenge)
                .response()
                .into_response();
        }
    }
    // A console form is a few fields; nobody needs more before logging in.
    let limit = if console {
        state.max_body.min(CONSOLE_FORM_LIMIT)
    } else {
        state.max_body
    };
    if declared_too_large(&parts.headers, limit) {
        return too_large(limit);
    }
    match read_limited(body, limit, state.body_read_timeout).await {
        Ok(bytes) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Err(ReadError::TooLarge { .. }) => too_large(limit),
        Err(ReadError::Broken(e)) => {
            tracing::warn!(error = %e, "reading the request body failed");
            Problem::new(
                ProblemKind::UnreadableBody,
                "the request body could not be read; nothing was recorded",
            )
            .response()
            .into_response()
        }
        Err(ReadError::TimedOut) => {
            let mut response = ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "request-timeout",
                "The request body was not received in time",
                format!(
                    "the request body did not arrive within {} ms; nothing was recorded, \
                     retry with the same key",
                    state.body_read_timeout.as_millis()
                ),
            )
            .into_response();
            // The rest of the body will not be read: the connection cannot be reused.
            response
                .headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
            response
        }
    }
}

/// The layer's own 413, for bodies refused before they reach it.
fn too_large(limit: usize) -> Response {
    Problem::new(
        ProblemKind::RequestTooLarge,
        format!("the body is larger than {limit} bytes; nothing was recorded"),
    )
    .response()
    .into_response()
}

#[cfg(test)]
mod readiness_tests {
    use super::*;
    use crate::db::SchemaStatus;

    fn current() -> SchemaStatus {
        SchemaStatus {
            store: 9,
            store_needed: 9,
            ledgers: 1,
            ledgers_needed: 1,
        }
    }

    #[test]
    fn ready_only_when_reachable_current_and_not_draining() {
        let (s, body) = readiness(false, &Ok(current()), "sqlite");
        assert_eq!(
            (s, body["status"].as_str()),
            (StatusCode::OK, Some("ready"))
        );
        let (s, body) = readiness(true, &Ok(current()), "sqlite");
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body["reason"], "shutting down");
        let old = SchemaStatus {
            ledgers: 0,
            ..current()
        };
        let (s, body) = readiness(false, &Ok(old), "sqlite");
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body["reason"].as_str().unwrap().contains("idem migrate"));
        let newer = SchemaStatus {
            store: 10,
            ..current()
        };
        assert_eq!(readiness(false, &Ok(newer), "sqlite").0, StatusCode::OK);
        let down = Err(crate::error::Error::Unavailable("down".into()));
        let (s, body) = readiness(false, &down, "postgres");
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body["database"], "unreachable");
    }
}
