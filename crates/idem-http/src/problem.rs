//! The layer's error responses: `application/problem+json` (RFC 9457) with one stable
//! `type` URI per case.
//!
//! Owns the list of cases, their status codes and their wire form. It must not decide
//! when a case applies: the service does.

use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use http::StatusCode;
use serde::Serialize;

/// Common prefix of every problem `type` the layer emits.
pub const PROBLEM_TYPE_BASE: &str = "https://idem.dev/problems/";
/// The media type of every error the layer emits.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Every error the layer can answer with. `type_uri()` is stable: clients branch on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProblemKind {
    /// 400: the route requires `Idempotency-Key` and the request has none.
    MissingKey,
    /// 400: the key is not 1 to 255 visible ASCII characters, or is repeated/malformed.
    InvalidKey,
    /// 400: the request body could not be read.
    UnreadableBody,
    /// 401: the application's authentication did not accept the request.
    Unauthenticated,
    /// 409: the first request with this key is still being processed.
    RequestInProgress,
    /// 413: the body is larger than the layer buffers; nothing was recorded.
    RequestTooLarge,
    /// 422: the key was already used for a different request (payload, route, method,
    /// principal or fingerprinted headers).
    KeyReused,
    /// 500: the handler panicked; the key is open for a retry.
    ExecutionFailed,
    /// 500: the record ended without a stored response, so there is nothing to replay.
    ResultNotStored,
    /// 500: the store answered with an error that is not an outage.
    StoreError,
    /// 503: the idempotency store is unreachable; the request was not executed.
    StoreUnavailable,
    /// 504: the handler did not finish within the execution timeout; the key is open for
    /// a retry.
    ExecutionTimeout,
    /// 410: the key's record passed every retention window and was archived; the request
    /// is not executed again. Look the original result up by its reference.
    KeyExpired,
}

impl ProblemKind {
    pub const ALL: [ProblemKind; 13] = [
        ProblemKind::MissingKey,
        ProblemKind::InvalidKey,
        ProblemKind::UnreadableBody,
        ProblemKind::Unauthenticated,
        ProblemKind::RequestInProgress,
        ProblemKind::RequestTooLarge,
        ProblemKind::KeyReused,
        ProblemKind::ExecutionFailed,
        ProblemKind::ResultNotStored,
        ProblemKind::StoreError,
        ProblemKind::StoreUnavailable,
        ProblemKind::ExecutionTimeout,
        ProblemKind::KeyExpired,
    ];

    /// The last segment of the `type` URI.
    pub fn slug(self) -> &'static str {
        match self {
            ProblemKind::MissingKey => "missing-idempotency-key",
            ProblemKind::InvalidKey => "invalid-idempotency-key",
            ProblemKind::UnreadableBody => "unreadable-request-body",
            ProblemKind::Unauthenticated => "unauthenticated",
            ProblemKind::RequestInProgress => "request-in-progress",
            ProblemKind::RequestTooLarge => "request-too-large",
            ProblemKind::KeyReused => "idempotency-key-reused",
            ProblemKind::ExecutionFailed => "execution-failed",
            ProblemKind::ResultNotStored => "result-not-stored",
            ProblemKind::StoreError => "idempotency-store-error",
            ProblemKind::StoreUnavailable => "idempotency-store-unavailable",
            ProblemKind::ExecutionTimeout => "execution-timeout",
            ProblemKind::KeyExpired => "idempotency-key-expired",
        }
    }

    pub fn type_uri(self) -> String {
        format!("{PROBLEM_TYPE_BASE}{}", self.slug())
    }

    pub fn status(self) -> StatusCode {
        match self {
            ProblemKind::MissingKey | ProblemKind::InvalidKey | ProblemKind::UnreadableBody => {
                StatusCode::BAD_REQUEST
            }
            ProblemKind::Unauthenticated => StatusCode::UNAUTHORIZED,
            ProblemKind::RequestInProgress => StatusCode::CONFLICT,
            ProblemKind::RequestTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ProblemKind::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            ProblemKind::ExecutionFailed
            | ProblemKind::ResultNotStored
            | ProblemKind::StoreError => StatusCode::INTERNAL_SERVER_ERROR,
            ProblemKind::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            ProblemKind::ExecutionTimeout => StatusCode::GATEWAY_TIMEOUT,
            ProblemKind::KeyExpired => StatusCode::GONE,
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            ProblemKind::MissingKey => "Idempotency-Key header required",
            ProblemKind::InvalidKey => "Idempotency-Key header is invalid",
            ProblemKind::UnreadableBody => "Request body could not be read",
            ProblemKind::Unauthenticated => "Authentication required",
            ProblemKind::RequestInProgress => "A request with this Idempotency-Key is in progress",
            ProblemKind::RequestTooLarge => "Request body too large",
            ProblemKind::KeyReused => "Idempotency-Key reused with a different request",
            ProblemKind::ExecutionFailed => "The request failed; retry with the same key",
            ProblemKind::ResultNotStored => "No stored result to replay",
            ProblemKind::StoreError => "Idempotency store error",
            ProblemKind::StoreUnavailable => "Idempotency store unavailable",
            ProblemKind::ExecutionTimeout => "The request timed out; retry with the same key",
            ProblemKind::KeyExpired => "Idempotency-Key expired; the request was not executed",
        }
    }
}

/// One problem response.
#[derive(Debug, Clone)]
pub struct Problem {
    pub kind: ProblemKind,
    pub detail: String,
    /// Sent as `Retry-After` (whole seconds, at least 1).
    pub retry_after: Option<Duration>,
    /// Sent as `WWW-Authenticate` on 401.
    pub challenge: Option<HeaderValue>,
}

#[derive(Serialize)]
struct ProblemBody<'a> {
    #[serde(rename = "type")]
    type_uri: String,
    title: &'a str,
    status: u16,
    detail: &'a str,
}

impl Problem {
    pub fn new(kind: ProblemKind, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
            retry_after: None,
            challenge: None,
        }
    }

    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    pub fn challenge(mut self, challenge: Option<HeaderValue>) -> Self {
        self.challenge = challenge;
        self
    }

    /// The JSON body, as sent.
    pub fn body(&self) -> Vec<u8> {
        serde_json::to_vec(&ProblemBody {
            type_uri: self.kind.type_uri(),
            title: self.kind.title(),
            status: self.kind.status().as_u16(),
            detail: &self.detail,
        })
        .unwrap_or_default()
    }
}

/// Whole seconds for `Retry-After`, rounded up, at least 1.
pub(crate) fn retry_after_secs(after: Duration) -> u64 {
    let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
    secs.max(1)
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let mut response = Response::new(Body::from(self.body()));
        *response.status_mut() = self.kind.status();
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(after) = self.retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(after)));
        }
        if let Some(challenge) = self.challenge {
            headers.insert(WWW_AUTHENTICATE, challenge);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_are_distinct_and_stable() {
        let mut seen = std::collections::HashSet::new();
        for kind in ProblemKind::ALL {
            assert!(seen.insert(kind.type_uri()), "{kind:?}");
            assert!(kind.type_uri().starts_with(PROBLEM_TYPE_BASE));
        }
        assert_eq!(
            ProblemKind::KeyReused.type_uri(),
            "https://idem.dev/problems/idempotency-key-reused"
        );
        assert_eq!(ProblemKind::KeyReused.status(), 422);
        assert_eq!(ProblemKind::RequestInProgress.status(), 409);
    }

    #[test]
    fn wire_form() {
        let p = Problem::new(ProblemKind::RequestInProgress, "k")
            .retry_after(Duration::from_millis(1500));
        let r = p.into_response();
        assert_eq!(r.status(), 409);
        assert_eq!(r.headers()[CONTENT_TYPE], PROBLEM_JSON);
        assert_eq!(r.headers()[RETRY_AFTER], "2");
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }
}
