//! What a send of an intent gets back: the final response, and the problem+json body a
//! response may carry.
//!
//! Owns reading a response (its body as JSON, text or a problem, its expiry). It must
//! not decide whether a response ends the intent: that is [`crate::intent`]'s.

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, CONTENT_TYPE};
use http::StatusCode;
use idem_core::IdempotencyKey;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::IDEMPOTENCY_EXPIRES;

/// An RFC 9457 problem body, as the idem layer (and many others) send them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Problem {
    /// Stable case identifier, e.g. `https://idem.dev/problems/idempotency-key-reused`.
    #[serde(rename = "type", default)]
    pub type_uri: String,
    #[serde(default)]
    pub title: Option<String>,
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default)]
    pub detail: Option<String>,
}

/// The final response to an intent.
#[derive(Debug, Clone)]
pub struct IdempotentResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The server answered with the stored result of an earlier attempt
    /// (`Idempotent-Replayed: true`).
    pub replayed: bool,
    pub key: IdempotencyKey,
    /// Attempts made by this `send`, the final one included.
    pub attempts: u32,
    pub elapsed: Duration,
}

impl IdempotentResponse {
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// When the server stops replaying this key's result (`Idempotency-Expires`).
    pub fn expires(&self) -> Option<&str> {
        self.headers.get(IDEMPOTENCY_EXPIRES)?.to_str().ok()
    }

    /// The body as a problem, when it is one.
    pub fn problem(&self) -> Option<Problem> {
        let is_problem = self
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("application/problem+json"));
        if is_problem {
            serde_json::from_slice(&self.body).ok()
        } else {
            None
        }
    }
}
