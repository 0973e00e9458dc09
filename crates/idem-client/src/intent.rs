//! The client and one intent: the key fixed before the first send, the same bytes on
//! every attempt, and the attempt loop.
//!
//! Owns building and sending attempts and judging their responses. It must never mint a
//! second key for an intent: retries (automatic or a later manual `send`) reuse it.

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use http::{Method, StatusCode};
use idem_core::IdempotencyKey;
use serde::Serialize;
use tokio::time::Instant;

use crate::error::{AttemptFailure, ClientError, GiveUpReason};
use crate::response::IdempotentResponse;
use crate::retry::{retry_after, RetryPolicy, REJECTED};
use crate::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};

/// How the key is written into `Idempotency-Key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyForm {
    /// `Idempotency-Key: k-1`, what most servers expect. A key that starts with `"` is
    /// still sent as a structured-field string: idem's servers read the two forms as one
    /// key, and the token form of such a key would read as another.
    #[default]
    Token,
    /// `Idempotency-Key: "k-1"`, the IETF draft's structured-field string.
    StructuredString,
}

/// Sends intents with a fixed key and retries. Cheap to clone.
#[derive(Debug, Clone)]
pub struct IdempotentClient {
    http: reqwest::Client,
    policy: RetryPolicy,
    key_form: KeyForm,
}

impl IdempotentClient {
    pub fn new(http: reqwest::Client) -> Self {
        Self {
            http,
            policy: RetryPolicy::default(),
            key_form: KeyForm::default(),
        }
    }

    pub fn with_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    pub fn with_key_form(mut self, form: KeyForm) -> Self {
        self.key_form = form;
        self
    }

    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// A new intent; its key (a UUIDv7) is fixed now, before anything is sent.
    pub fn intent(&self, method: Method, url: impl Into<String>) -> Intent {
        Intent {
            client: self.clone(),
            policy: self.policy.clone(),
            method,
            url: url.into(),
            key: new_key(),
            headers: HeaderMap::new(),
            body: None,
            invalid: None,
        }
    }

    pub fn post(&self, url: impl Into<String>) -> Intent {
        self.intent(Method::POST, url)
    }

    pub fn put(&self, url: impl Into<String>) -> Intent {
        self.intent(Method::PUT, url)
    }

    pub fn patch(&self, url: impl Into<String>) -> Intent {
        self.intent(Method::PATCH, url)
    }
}

fn new_key() -> IdempotencyKey {
    IdempotencyKey::new(uuid::Uuid::now_v7().to_string()).expect("a UUID is a valid key")
}

/// One business intent: method, URL, headers, body bytes and the key, all fixed.
/// `send` may be called again later (a manual retry): it sends the same key.
#[derive(Debug, Clone)]
pub struct Intent {
    client: IdempotentClient,
    policy: RetryPolicy,
    method: Method,
    url: String,
    key: IdempotencyKey,
    headers: HeaderMap,
    body: Option<Bytes>,
    /// A builder step that failed; reported by `send`.
    invalid: Option<String>,
}

impl Intent {
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// Uses a key the caller already has (a business key, or one persisted across a
    /// restart) instead of the generated UUIDv7.
    pub fn with_key(mut self, key: IdempotencyKey) -> Self {
        self.key = key;
        self
    }

    /// Uses a business key such as `pay:{order_id}`.
    pub fn business_key(self, key: impl Into<String>) -> Result<Self, ClientError> {
        let key =
            IdempotencyKey::new(key).map_err(|e| ClientError::InvalidRequest(e.to_string()))?;
        Ok(self.with_key(key))
    }

    pub fn header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.append(name, value);
        self
    }

    pub fn bearer_auth(mut self, token: impl std::fmt::Display) -> Self {
        match HeaderValue::from_str(&format!("Bearer {token}")) {
            Ok(mut value) => {
                value.set_sensitive(true);
                self.headers.insert(AUTHORIZATION, value);
            }
            Err(_) => self.invalid = Some("the bearer token is not a valid header value".into()),
        }
        self
    }

    /// Serialises the body once, so every attempt sends the same bytes.
    pub fn json<T: Serialize + ?Sized>(mut self, value: &T) -> Result<Self, ClientError> {
        let bytes =
            serde_json::to_vec(value).map_err(|e| ClientError::InvalidRequest(e.to_string()))?;
        self.headers
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        self.body = Some(bytes.into());
        Ok(self)
    }

    pub fn body(mut self, content_type: HeaderValue, bytes: impl Into<Bytes>) -> Self {
        self.headers.insert(CONTENT_TYPE, content_type);
        self.body = Some(bytes.into());
        self
    }

    /// Overrides the client's retry policy for this intent.
    pub fn policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    fn key_header(&self) -> HeaderValue {
        // Servers read a value that starts with `"` as a structured-field string, so a
        // key that starts with one goes quoted, or it would name another key (or none).
        let quote =
            self.client.key_form == KeyForm::StructuredString || self.key.as_str().starts_with('"');
        let text = if quote {
            let escaped = self.key.as_str().replace('\\', "\\\\").replace('"', "\\\"");
            format!("\"{escaped}\"")
        } else {
            self.key.as_str().to_owned()
        };
        HeaderValue::from_str(&text).expect("keys are visible ASCII")
    }

    async fn attempt(&self) -> Result<(StatusCode, HeaderMap, Bytes), reqwest::Error> {
        let mut request = self
            .client
            .http
            .request(self.method.clone(), &self.url)
            .headers(self.headers.clone())
            .header(IDEMPOTENCY_KEY, self.key_header());
        if let Some(body) = &self.body {
            request = request.body(body.clone());
        }
        let response = request.send().await?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await?;
        Ok((status, headers, body))
    }

    /// Sends the intent until it has a final answer, retrying with the same key.
    pub async fn send(&self) -> Result<IdempotentResponse, ClientError> {
        if let Some(invalid) = &self.invalid {
            return Err(ClientError::InvalidRequest(invalid.clone()));
        }
        let policy = &self.policy;
        let started = Instant::now();
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let remaining = policy.time_budget.saturating_sub(started.elapsed());
            let timeout = policy
                .attempt_timeout
                .min(remaining)
                .max(Duration::from_millis(1));
            let failure = match tokio::time::timeout(timeout, self.attempt()).await {
                Err(_) => AttemptFailure::TimedOut { after: timeout },
                Ok(Err(e)) if e.is_builder() => {
                    return Err(ClientError::InvalidRequest(error_chain(&e)));
                }
                Ok(Err(e)) => AttemptFailure::Connection(error_chain(&e)),
                Ok(Ok((status, headers, body))) => {
                    let response = IdempotentResponse {
                        replayed: headers
                            .get(IDEMPOTENT_REPLAYED)
                            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true")),
                        status,
                        headers,
                        body,
                        key: self.key.clone(),
                        attempts,
                        elapsed: started.elapsed(),
                    };
                    let code = status.as_u16();
                    if REJECTED.contains(&code) {
                        return Err(ClientError::Rejected {
                            problem: response.problem(),
                            response: Box::new(response),
                        });
                    }
                    if !policy.retry_statuses.contains(&code) || is_final(&response) {
                        return Ok(response);
                    }
                    AttemptFailure::Status {
                        status: code,
                        retry_after: retry_after(&response.headers),
                        problem: response.problem(),
                    }
                }
            };
            let give_up = |reason| ClientError::GaveUp {
                key: self.key.clone(),
                attempts,
                elapsed: started.elapsed(),
                reason,
                last: Box::new(failure.clone()),
            };
            if attempts >= policy.max_attempts {
                return Err(give_up(GiveUpReason::AttemptsExhausted {
                    max_attempts: policy.max_attempts,
                }));
            }
            let delay = policy.delay(attempts, failure.retry_after());
            let remaining = policy.time_budget.saturating_sub(started.elapsed());
            if delay >= remaining {
                return Err(give_up(match failure.retry_after() {
                    Some(retry_after) if retry_after >= remaining => {
                        GiveUpReason::RetryAfterBeyondBudget {
                            retry_after,
                            remaining,
                        }
                    }
                    _ => GiveUpReason::TimeBudgetExhausted {
                        budget: policy.time_budget,
                    },
                }));
            }
            tracing::debug!(key = %self.key, attempts, %failure, delay_ms = delay.as_millis() as u64,
                "attempt failed; retrying with the same key");
            tokio::time::sleep(delay).await;
        }
    }
}

/// A retryable status that is nevertheless the key's answer: a replay of a stored result
/// (every later attempt gets it again), or a 409 that says what conflicted (sold out, an
/// illegal transition) rather than "a request with this key is in progress".
fn is_final(response: &IdempotentResponse) -> bool {
    let problem = response.problem();
    let in_progress = problem
        .as_ref()
        .is_some_and(|p| p.type_uri == idem_core::ProblemKind::RequestInProgress.type_uri());
    // "In progress" is never an answer, whatever else the response says.
    if in_progress {
        return false;
    }
    response.replayed || (response.status == reqwest::StatusCode::CONFLICT && problem.is_some())
}

/// reqwest's Display shows only the outermost error; the cause is what tells a reset
/// from a refusal.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_fixed_at_creation_and_kept() {
        let client = IdempotentClient::new(reqwest::Client::new());
        let a = client.post("http://127.0.0.1:1/x");
        let b = client.post("http://127.0.0.1:1/x");
        assert_ne!(a.key(), b.key(), "one key per intent");
        assert_eq!(a.key().as_str().len(), 36);
        assert_eq!(
            uuid::Uuid::parse_str(a.key().as_str())
                .unwrap()
                .get_version_num(),
            7
        );
        let again = a.clone().bearer_auth("t");
        assert_eq!(again.key(), a.key(), "building on an intent keeps its key");
        let business = a.business_key("pay:order-7318").unwrap();
        assert_eq!(business.key().as_str(), "pay:order-7318");
        assert!(client.post("x").business_key("has space").is_err());
    }

    #[test]
    fn structured_form_escapes() {
        let client =
            IdempotentClient::new(reqwest::Client::new()).with_key_form(KeyForm::StructuredString);
        let i = client.post("http://x").business_key("a\"b\\c").unwrap();
        assert_eq!(i.key_header(), "\"a\\\"b\\\\c\"");
    }

    #[test]
    fn both_forms_read_back_as_the_key_the_client_holds() {
        for form in [KeyForm::Token, KeyForm::StructuredString] {
            let client = IdempotentClient::new(reqwest::Client::new()).with_key_form(form);
            for key in [
                "k",
                "pay:order-7318",
                "a\"b\\c",
                "\"k\"",
                "\"",
                "\"abc",
                "\\",
            ] {
                let intent = client.post("http://x").business_key(key).unwrap();
                let mut headers = HeaderMap::new();
                headers.insert(crate::IDEMPOTENCY_KEY, intent.key_header());
                let read = idem_core::read_key(&headers)
                    .unwrap_or_else(|e| panic!("{form:?} {key:?}: {e}"));
                assert_eq!(read.as_str(), key, "{form:?}");
            }
        }
        // Plain keys keep the token form most servers expect.
        let token = IdempotentClient::new(reqwest::Client::new());
        assert_eq!(
            token
                .post("http://x")
                .business_key("k")
                .unwrap()
                .key_header(),
            "k"
        );
    }
}
