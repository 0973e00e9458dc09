//! The middleware every request passes: our own request id (answered in `x-request-id`,
//! on the request's log span, and added to the problem of a failure that is never
//! replayed), and reading the whole body within the body read timeout before any route
//! or the layer sees it (408, 413, or 401 for a caller nobody knows).
//!
//! Must not alter a body that may be replayed, and must not buffer a body for an
//! unauthenticated caller.

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header::{HeaderValue, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use idem_http::body::{declared_too_large, read_limited, ReadError};
use idem_http::headers::REQUEST_ID;
use idem_http::problem::{Problem, ProblemKind, ProblemResponse};
use idem_http::PROBLEM_JSON;
use tracing::Instrument;

use super::auth::{require_admin, unauthenticated};
use super::error::ApiError;
use super::state::AppState;

/// Problem bodies are small; anything larger is passed on untouched.
const MAX_PROBLEM_BODY: usize = 64 * 1024;

pub(super) async fn request_ids(request: Request, next: Next) -> Response {
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
pub(super) async fn read_body_in_time(
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
            return unauthenticated(refused);
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
