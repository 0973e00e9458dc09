//! Turning a response into a stored result, and a stored result back into a response.
//!
//! Owns which response headers are kept, the body capture limit and the replay markers
//! (`Idempotent-Replayed`, `Idempotency-Expires`, `Idempotent-Body-Omitted`). It must not
//! talk to the store: callers hand it records and get responses.

use std::time::Duration;

use http::header::{HeaderMap, HeaderName, HeaderValue, LOCATION};
use http::{Response, StatusCode};
use idem_core::{Millis, Outcome, OutcomePolicy, Record, RecordState, StoredResult};

use crate::body::{full, Body};
use crate::headers::{
    http_date, IDEMPOTENCY_EXPIRES, IDEMPOTENT_BODY_OMITTED, IDEMPOTENT_REPLAYED,
};

/// What the layer keeps of a response, and how it classifies it.
#[derive(Debug, Clone)]
pub(crate) struct Capture {
    pub replay_headers: Vec<HeaderName>,
    pub max_stored_body: usize,
    pub policy: OutcomePolicy,
    pub retention: Duration,
}

impl Capture {
    /// The state a response with this status ends its record in.
    pub fn classify(&self, status: StatusCode) -> RecordState {
        self.policy.classify(Outcome::Status(status.as_u16()))
    }

    /// The stored form of a response. `body` is `None` when it exceeded the capture
    /// limit: the replay then carries status and headers only.
    pub fn stored_result(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
        body: Option<&[u8]>,
    ) -> StoredResult {
        let mut kept: Vec<(String, String)> = Vec::new();
        for name in &self.replay_headers {
            for value in headers.get_all(name) {
                if let Ok(v) = value.to_str() {
                    kept.push((name.as_str().to_owned(), v.to_owned()));
                }
            }
        }
        if body.is_none() {
            kept.push((
                IDEMPOTENT_BODY_OMITTED.as_str().to_owned(),
                "true".to_owned(),
            ));
        }
        StoredResult {
            status: status.as_u16(),
            headers: kept,
            body: body.map(<[u8]>::to_vec).unwrap_or_default(),
            // The business result's address, when the handler gave one.
            result_ref: headers
                .get(LOCATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
        }
    }

    /// `Idempotency-Expires` for a record completed at `completed_at`.
    pub fn expires_header(&self, completed_at: Millis) -> HeaderValue {
        let retention = i64::try_from(self.retention.as_millis()).unwrap_or(i64::MAX);
        let date = http_date(completed_at.saturating_add(retention));
        HeaderValue::from_str(&date).unwrap_or_else(|_| HeaderValue::from_static("0"))
    }

    /// The response a terminal record replays, or `None` when it has no stored result.
    pub fn replay(&self, record: &Record) -> Option<Response<Body>> {
        let result = record.result.as_ref()?;
        let mut response = Response::new(full(result.body.clone()));
        *response.status_mut() =
            StatusCode::from_u16(result.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let headers = response.headers_mut();
        for (name, value) in &result.headers {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                headers.append(n, v);
            }
        }
        headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        if let Some(completed_at) = record.completed_at {
            headers.insert(IDEMPOTENCY_EXPIRES, self.expires_header(completed_at));
        }
        Some(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{CONTENT_TYPE, SET_COOKIE};

    fn capture() -> Capture {
        Capture {
            replay_headers: vec![CONTENT_TYPE, LOCATION],
            max_stored_body: 16,
            policy: OutcomePolicy::default(),
            retention: Duration::from_secs(86_400),
        }
    }

    #[test]
    fn keeps_chosen_headers_only() {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        h.insert(LOCATION, HeaderValue::from_static("/orders/1"));
        h.insert(SET_COOKIE, HeaderValue::from_static("session=secret"));
        let r = capture().stored_result(StatusCode::CREATED, &h, Some(b"{}"));
        assert_eq!(r.status, 201);
        assert_eq!(
            r.headers,
            vec![
                ("content-type".to_owned(), "application/json".to_owned()),
                ("location".to_owned(), "/orders/1".to_owned())
            ]
        );
        assert_eq!(r.result_ref.as_deref(), Some("/orders/1"));
        let omitted = capture().stored_result(StatusCode::OK, &HeaderMap::new(), None);
        assert_eq!(omitted.headers[0].0, "idempotent-body-omitted");
        assert!(omitted.body.is_empty());
    }

    #[test]
    fn expiry_is_completion_plus_retention() {
        assert_eq!(capture().expires_header(0), "Fri, 02 Jan 1970 00:00:00 GMT");
    }
}
