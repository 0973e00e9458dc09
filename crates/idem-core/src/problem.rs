//! Error answers of idem's HTTP contract: `application/problem+json` (RFC 9457) with one
//! stable `type` URI per case, for the server-side layer, the gateway and the services
//! built on them alike.
//!
//! Owns the list of cases, their status codes, titles and wire form. It must not decide
//! when a case applies: the layer and the gateway do.

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use http::StatusCode;
use serde::Serialize;

/// Common prefix of every problem `type` idem emits.
pub const PROBLEM_TYPE_BASE: &str = "https://idem.dev/problems/";
/// The media type of every error idem emits.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Every error the layer or the gateway can answer with. `type_uri()` is stable: clients
/// branch on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProblemKind {
    /// 400: the route requires `Idempotency-Key` and the request has none.
    MissingKey,
    /// 400: the key is not 1 to 255 visible ASCII characters, or is repeated/malformed.
    InvalidKey,
    /// 400: the request body could not be read.
    UnreadableBody,
    /// 400: the JSON body names one member twice in an object; services differ on which
    /// one counts, so no fingerprint could stand for what is executed.
    DuplicateJsonMember,
    /// 401: authentication did not accept the request.
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
    /// 503: the idempotency store is unreachable (or full); the request was not executed.
    StoreUnavailable,
    /// 504: the handler did not finish within the execution timeout; the key is open for
    /// a retry.
    ExecutionTimeout,
    /// 410: the key's record passed every retention window and was archived; the request
    /// is not executed again. Look the original result up by its reference.
    KeyExpired,
    /// 502 (gateway): the upstream could not be reached; the request was not sent.
    UpstreamUnavailable,
    /// 504 (gateway): a pass-through request's upstream did not answer in time.
    UpstreamTimeout,
    /// 504 (gateway): a keyed request was sent, its outcome is unknown and the upstream's
    /// key state could not be read. The request was not re-sent; retry with the same key.
    UpstreamResultUnknown,
    /// 502 (gateway): the upstream's response on a keyed route exceeded the buffer.
    UpstreamResponseTooLarge,
    /// 408: the client did not send its body in time.
    RequestTimeout,
    /// 404: an unknown path under the gateway's admin prefix.
    NotFound,
    /// 400 (gateway): the request's `Connection` names a header that must be forwarded
    /// (the key, a credential): dropping it as hop-by-hop would change what is executed.
    ConnectionNamesEndToEnd,
    /// 429 (gateway): this caller's share of the window, or its keys in progress, is
    /// used up; other callers are still served. Retry after `Retry-After`.
    CallerQuotaExceeded,
}

impl ProblemKind {
    /// Every case: the layer's, then the gateway's.
    pub const ALL: [ProblemKind; ProblemKind::LAYER.len() + ProblemKind::GATEWAY.len()] = {
        let mut all =
            [ProblemKind::MissingKey; ProblemKind::LAYER.len() + ProblemKind::GATEWAY.len()];
        let mut i = 0;
        while i < Self::LAYER.len() {
            all[i] = Self::LAYER[i];
            i += 1;
        }
        let mut j = 0;
        while j < Self::GATEWAY.len() {
            all[Self::LAYER.len() + j] = Self::GATEWAY[j];
            j += 1;
        }
        all
    };

    /// The cases the server-side layer answers with.
    pub const LAYER: [ProblemKind; 14] = [
        ProblemKind::MissingKey,
        ProblemKind::InvalidKey,
        ProblemKind::UnreadableBody,
        ProblemKind::DuplicateJsonMember,
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

    /// The cases only a proxy answers with.
    pub const GATEWAY: [ProblemKind; 8] = [
        ProblemKind::UpstreamUnavailable,
        ProblemKind::UpstreamTimeout,
        ProblemKind::UpstreamResultUnknown,
        ProblemKind::UpstreamResponseTooLarge,
        ProblemKind::RequestTimeout,
        ProblemKind::NotFound,
        ProblemKind::ConnectionNamesEndToEnd,
        ProblemKind::CallerQuotaExceeded,
    ];

    /// The last segment of the `type` URI.
    pub fn slug(self) -> &'static str {
        match self {
            ProblemKind::MissingKey => "missing-idempotency-key",
            ProblemKind::InvalidKey => "invalid-idempotency-key",
            ProblemKind::UnreadableBody => "unreadable-request-body",
            ProblemKind::DuplicateJsonMember => "duplicate-json-member",
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
            ProblemKind::UpstreamUnavailable => "upstream-unavailable",
            ProblemKind::UpstreamTimeout => "upstream-timeout",
            ProblemKind::UpstreamResultUnknown => "upstream-result-unknown",
            ProblemKind::UpstreamResponseTooLarge => "upstream-response-too-large",
            ProblemKind::RequestTimeout => "request-timeout",
            ProblemKind::NotFound => "not-found",
            ProblemKind::ConnectionNamesEndToEnd => "connection-names-end-to-end-header",
            ProblemKind::CallerQuotaExceeded => "caller-quota-exceeded",
        }
    }

    pub fn type_uri(self) -> String {
        format!("{PROBLEM_TYPE_BASE}{}", self.slug())
    }

    pub fn status(self) -> StatusCode {
        match self {
            ProblemKind::MissingKey
            | ProblemKind::InvalidKey
            | ProblemKind::UnreadableBody
            | ProblemKind::DuplicateJsonMember
            | ProblemKind::ConnectionNamesEndToEnd => StatusCode::BAD_REQUEST,
            ProblemKind::Unauthenticated => StatusCode::UNAUTHORIZED,
            ProblemKind::RequestInProgress => StatusCode::CONFLICT,
            ProblemKind::RequestTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ProblemKind::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            ProblemKind::ExecutionFailed
            | ProblemKind::ResultNotStored
            | ProblemKind::StoreError => StatusCode::INTERNAL_SERVER_ERROR,
            ProblemKind::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            ProblemKind::ExecutionTimeout
            | ProblemKind::UpstreamTimeout
            | ProblemKind::UpstreamResultUnknown => StatusCode::GATEWAY_TIMEOUT,
            ProblemKind::KeyExpired => StatusCode::GONE,
            ProblemKind::UpstreamUnavailable | ProblemKind::UpstreamResponseTooLarge => {
                StatusCode::BAD_GATEWAY
            }
            ProblemKind::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ProblemKind::NotFound => StatusCode::NOT_FOUND,
            ProblemKind::CallerQuotaExceeded => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            ProblemKind::MissingKey => "Idempotency-Key header required",
            ProblemKind::InvalidKey => "Idempotency-Key header is invalid",
            ProblemKind::UnreadableBody => "Request body could not be read",
            ProblemKind::DuplicateJsonMember => "JSON body names a member twice",
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
            ProblemKind::UpstreamUnavailable => "The upstream service is unreachable",
            ProblemKind::UpstreamTimeout => "The upstream service did not answer in time",
            ProblemKind::UpstreamResultUnknown => {
                "The outcome is unknown; retry with the same Idempotency-Key"
            }
            ProblemKind::UpstreamResponseTooLarge => "The upstream response is too large",
            ProblemKind::RequestTimeout => "The request body was not received in time",
            ProblemKind::NotFound => "Not found",
            ProblemKind::ConnectionNamesEndToEnd => "Connection names an end-to-end header",
            ProblemKind::CallerQuotaExceeded => "This caller's share of the gateway is used up",
        }
    }
}

/// One problem answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub kind: ProblemKind,
    /// A stable text for the client: never an address, an OS error or a store's message.
    pub detail: String,
    /// Sent as `Retry-After` (whole seconds, rounded up, at least 1).
    pub retry_after: Option<Duration>,
    /// Sent as `WWW-Authenticate` on 401.
    pub challenge: Option<HeaderValue>,
    /// What actually went wrong, for the log line beside the request id; never sent.
    pub cause: Option<String>,
}

impl Problem {
    pub fn new(kind: ProblemKind, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
            retry_after: None,
            challenge: None,
            cause: None,
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

    /// Keeps the internal cause for the log (see [`Problem::cause`]).
    pub fn cause(mut self, cause: impl Into<String>) -> Self {
        self.cause = Some(cause.into());
        self
    }

    /// The JSON body, as sent.
    pub fn body(&self) -> Vec<u8> {
        self.body_for(None)
    }

    /// The JSON body naming the request id the log line carries.
    pub fn body_for(&self, request_id: Option<&str>) -> Vec<u8> {
        Document {
            type_uri: &self.kind.type_uri(),
            title: self.kind.title(),
            status: self.kind.status(),
            detail: &self.detail,
            request_id,
        }
        .to_json(None)
    }

    /// The whole answer; the caller wraps the bytes in its body type.
    pub fn to_http(&self, request_id: Option<&str>) -> http::Response<Bytes> {
        let mut response = http::Response::new(Bytes::from(self.body_for(request_id)));
        *response.status_mut() = self.kind.status();
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(after) = self.retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(after)));
        }
        if let Some(challenge) = &self.challenge {
            headers.insert(WWW_AUTHENTICATE, challenge.clone());
        }
        response
    }
}

/// A problem+json document of any type, for services that define their own cases on top
/// of idem's (their own `type` base, extra members).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Document<'a> {
    #[serde(rename = "type")]
    pub type_uri: &'a str,
    pub title: &'a str,
    #[serde(serialize_with = "status_code")]
    pub status: StatusCode,
    pub detail: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<&'a str>,
}

fn status_code<S: serde::Serializer>(status: &StatusCode, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u16(status.as_u16())
}

impl Document<'_> {
    /// The JSON text; `extra` members are added where they do not replace a standard one.
    pub fn to_json(&self, extra: Option<&serde_json::Map<String, serde_json::Value>>) -> Vec<u8> {
        let Some(extra) = extra else {
            return serde_json::to_vec(self).unwrap_or_default();
        };
        let mut value = serde_json::to_value(self).unwrap_or_default();
        if let Some(obj) = value.as_object_mut() {
            for (k, v) in extra {
                obj.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        serde_json::to_vec(&value).unwrap_or_default()
    }
}

/// Whole seconds for `Retry-After`, rounded up, at least 1.
pub fn retry_after_secs(after: Duration) -> u64 {
    let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
    secs.max(1)
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
        assert_eq!(
            ProblemKind::DuplicateJsonMember.type_uri(),
            "https://idem.dev/problems/duplicate-json-member"
        );
        assert_eq!(ProblemKind::DuplicateJsonMember.status(), 400);
        assert_eq!(
            ProblemKind::LAYER.len() + ProblemKind::GATEWAY.len(),
            ProblemKind::ALL.len()
        );
        for kind in ProblemKind::GATEWAY {
            assert!(!ProblemKind::LAYER.contains(&kind), "{kind:?}");
        }
    }

    #[test]
    fn wire_form() {
        let p = Problem::new(ProblemKind::RequestInProgress, "k")
            .retry_after(Duration::from_millis(1500));
        let r = p.to_http(Some("req-1"));
        let v: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(v["type"], ProblemKind::RequestInProgress.type_uri());
        assert_eq!(v["status"], 409);
        assert_eq!(v["detail"], "k");
        assert_eq!(v["request_id"], "req-1");
        assert_eq!(r.status(), 409);
        assert_eq!(r.headers()[CONTENT_TYPE], PROBLEM_JSON);
        assert_eq!(r.headers()[RETRY_AFTER], "2");
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }
}
