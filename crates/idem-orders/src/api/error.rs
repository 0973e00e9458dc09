//! The API's errors as RFC 9457 problems: [`ApiError`], the mapping of the service's
//! [`OrderError`] and [`Error`] to statuses, slugs and extra members, and its
//! `application/problem+json` response.
//!
//! An internal error's text goes to the log, never to the client. This module must not
//! read requests or touch the database.

use axum::http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use idem_http::PROBLEM_JSON;
use serde_json::json;

use crate::error::{Error, OrderError};

/// Problem `type`s of this service: `https://idem.dev/problems/orders/{slug}`.
pub const PROBLEM_TYPE_BASE: &str = "https://idem.dev/problems/orders/";

/// A problem+json answer of this service.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(super) status: StatusCode,
    pub(super) slug: &'static str,
    title: &'static str,
    detail: String,
    retry_after: Option<u64>,
    extra: Option<serde_json::Value>,
}

impl ApiError {
    pub(super) fn new(
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
    pub(super) fn internal(e: &Error) -> Self {
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

    pub(super) fn malformed_json(e: &serde_json::Error) -> Self {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "malformed-json",
            "Malformed JSON body",
            e.to_string(),
        )
    }

    pub(super) fn invalid_body(e: &serde_json::Error) -> Self {
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
