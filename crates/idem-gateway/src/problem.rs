//! The gateway's error responses: `application/problem+json` (RFC 9457) with a stable
//! `type` URI per case.
//!
//! Cases the gateway shares with the server-side layer (missing or invalid key, key
//! reused, in progress, too large, unauthenticated) reuse `idem-http`'s
//! [`ProblemKind`], so clients see one set of type URIs whichever layer answered. The
//! cases only a proxy has (the upstream is down, timed out, its result is unknown; a slow
//! client) are added here under the same [`PROBLEM_TYPE_BASE`]. This module builds
//! responses; it does not decide when a case applies.

use std::time::Duration;

use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};
pub use idem_http::problem::{ProblemKind, PROBLEM_JSON, PROBLEM_TYPE_BASE};
use serde::Serialize;

use crate::body::{full, Body};

/// Every problem the gateway answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProblemType {
    /// A case shared with the idempotency layer (same type URI and status).
    Layer(ProblemKind),
    /// 502: the upstream could not be reached; the request was not sent.
    UpstreamUnavailable,
    /// 504: a pass-through request's upstream did not answer in time.
    UpstreamTimeout,
    /// 504: a keyed request was sent, its outcome is unknown and the upstream's key state
    /// could not be read. The request was not re-sent; retry with the same key.
    UpstreamResultUnknown,
    /// 502: the upstream's response on a keyed route exceeded the gateway's buffer.
    UpstreamResponseTooLarge,
    /// 408: the client did not send its body in time.
    RequestTimeout,
    /// 404: an unknown path under the gateway's admin prefix.
    NotFound,
    /// 400: the request's `Connection` names a header the gateway must forward (the
    /// key, a credential): dropping it as hop-by-hop would change what is executed.
    ConnectionNamesEndToEnd,
}

impl ProblemType {
    pub const GATEWAY: [ProblemType; 7] = [
        ProblemType::UpstreamUnavailable,
        ProblemType::UpstreamTimeout,
        ProblemType::UpstreamResultUnknown,
        ProblemType::UpstreamResponseTooLarge,
        ProblemType::RequestTimeout,
        ProblemType::NotFound,
        ProblemType::ConnectionNamesEndToEnd,
    ];

    pub fn slug(self) -> &'static str {
        match self {
            ProblemType::Layer(k) => k.slug(),
            ProblemType::UpstreamUnavailable => "upstream-unavailable",
            ProblemType::UpstreamTimeout => "upstream-timeout",
            ProblemType::UpstreamResultUnknown => "upstream-result-unknown",
            ProblemType::UpstreamResponseTooLarge => "upstream-response-too-large",
            ProblemType::RequestTimeout => "request-timeout",
            ProblemType::NotFound => "not-found",
            ProblemType::ConnectionNamesEndToEnd => "connection-names-end-to-end-header",
        }
    }

    pub fn type_uri(self) -> String {
        match self {
            ProblemType::Layer(k) => k.type_uri(),
            other => format!("{PROBLEM_TYPE_BASE}{}", other.slug()),
        }
    }

    pub fn status(self) -> StatusCode {
        match self {
            ProblemType::Layer(k) => k.status(),
            ProblemType::UpstreamUnavailable | ProblemType::UpstreamResponseTooLarge => {
                StatusCode::BAD_GATEWAY
            }
            ProblemType::UpstreamTimeout | ProblemType::UpstreamResultUnknown => {
                StatusCode::GATEWAY_TIMEOUT
            }
            ProblemType::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ProblemType::NotFound => StatusCode::NOT_FOUND,
            ProblemType::ConnectionNamesEndToEnd => StatusCode::BAD_REQUEST,
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            ProblemType::Layer(k) => k.title(),
            ProblemType::UpstreamUnavailable => "The upstream service is unreachable",
            ProblemType::UpstreamTimeout => "The upstream service did not answer in time",
            ProblemType::UpstreamResultUnknown => {
                "The outcome is unknown; retry with the same Idempotency-Key"
            }
            ProblemType::UpstreamResponseTooLarge => "The upstream response is too large",
            ProblemType::RequestTimeout => "The request body was not received in time",
            ProblemType::NotFound => "Not found",
            ProblemType::ConnectionNamesEndToEnd => "Connection names an end-to-end header",
        }
    }
}

impl From<ProblemKind> for ProblemType {
    fn from(kind: ProblemKind) -> Self {
        ProblemType::Layer(kind)
    }
}

/// One problem response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub kind: ProblemType,
    /// A stable text for the client: never an address, an OS error or a store's message.
    pub detail: String,
    /// Sent as `Retry-After` (whole seconds, rounded up, at least 1).
    pub retry_after: Option<Duration>,
    /// What actually went wrong, for the log line beside the request id; never sent.
    pub cause: Option<String>,
}

#[derive(Serialize)]
struct Wire<'a> {
    #[serde(rename = "type")]
    type_uri: String,
    title: &'a str,
    status: u16,
    detail: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    request_id: Option<&'a str>,
}

impl Problem {
    pub fn new(kind: impl Into<ProblemType>, detail: impl Into<String>) -> Self {
        Self {
            kind: kind.into(),
            detail: detail.into(),
            retry_after: None,
            cause: None,
        }
    }

    /// Keeps the internal cause for the log (see [`Problem::cause`]).
    pub fn cause(mut self, cause: impl Into<String>) -> Self {
        self.cause = Some(cause.into());
        self
    }

    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    pub fn body(&self) -> Vec<u8> {
        self.body_for(None)
    }

    fn body_for(&self, request_id: Option<&str>) -> Vec<u8> {
        serde_json::to_vec(&Wire {
            type_uri: self.kind.type_uri(),
            title: self.kind.title(),
            status: self.kind.status().as_u16(),
            detail: &self.detail,
            request_id,
        })
        .unwrap_or_default()
    }

    pub fn to_response(&self) -> Response<Body> {
        self.to_response_for(None)
    }

    /// The response, naming the request id the log line carries.
    pub fn to_response_for(&self, request_id: Option<&str>) -> Response<Body> {
        let mut response = Response::new(full(self.body_for(request_id)));
        *response.status_mut() = self.kind.status();
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(after) = self.retry_after {
            let secs = (after.as_secs() + u64::from(after.subsec_nanos() > 0)).max(1);
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.kind == ProblemType::Layer(ProblemKind::Unauthenticated) {
            headers.insert(
                http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("ApiKey"),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_types_are_distinct_from_the_layer_ones() {
        let mut seen = std::collections::HashSet::new();
        for k in ProblemKind::ALL {
            assert!(seen.insert(ProblemType::Layer(k).type_uri()));
        }
        for k in ProblemType::GATEWAY {
            assert!(seen.insert(k.type_uri()), "{k:?}");
            assert!(k.type_uri().starts_with(PROBLEM_TYPE_BASE));
        }
        assert_eq!(
            ProblemType::UpstreamResultUnknown.type_uri(),
            "https://idem.dev/problems/upstream-result-unknown"
        );
    }

    #[test]
    fn wire_form() {
        let p = Problem::new(ProblemKind::RequestInProgress, "wait")
            .retry_after(Duration::from_millis(1200));
        let r = p.to_response();
        assert_eq!(r.status(), 409);
        assert_eq!(r.headers()[CONTENT_TYPE], PROBLEM_JSON);
        assert_eq!(r.headers()[RETRY_AFTER], "2");
        let v: serde_json::Value = serde_json::from_slice(&p.body()).unwrap();
        assert_eq!(v["type"], ProblemKind::RequestInProgress.type_uri());
        assert_eq!(v["status"], 409);
        assert_eq!(v["detail"], "wait");
    }
}
