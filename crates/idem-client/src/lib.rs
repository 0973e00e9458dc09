//! idem-client: the requester side of idem.
//!
//! An [`Intent`] is one business decision about to be sent. Its idempotency key is fixed
//! when the intent is created — before the first send — as a UUIDv7, or a business key
//! the caller supplies (`pay:{order_id}`). Every attempt of the intent, automatic or
//! manual, carries that same key and the same body bytes, so the server can make all of
//! them end in one result.
//!
//! [`Intent::send`] retries timeouts, connection errors and the statuses in
//! [`RetryPolicy::retry_statuses`] (409, 429, 502, 503, 504 by default) with exponential
//! backoff and full jitter, waiting at least what `Retry-After` asks; a replay, and a 409
//! whose problem type names what conflicted (sold out) rather than "in progress", are
//! the key's answer and are returned at once. It stops after
//! [`RetryPolicy::max_attempts`] or [`RetryPolicy::time_budget`] and says why. 400, 401,
//! 413 and 422 are returned at once as [`ClientError::Rejected`]. The final response
//! tells whether it was a replay ([`IdempotentResponse::replayed`]).
//!
//! ```
//! use idem_client::{IdempotentClient, RetryPolicy};
//! # use std::sync::{Arc, Mutex};
//! # use axum::{http::{HeaderMap, StatusCode}, routing::post, Router};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # // A stand-in server: the first attempt gets a 503, the second a 201.
//! # let keys = Arc::new(Mutex::new(Vec::<String>::new()));
//! # let seen = keys.clone();
//! # let app = Router::new().route("/v1/orders", post(move |headers: HeaderMap| async move {
//! #     let mut seen = seen.lock().unwrap();
//! #     seen.push(headers["idempotency-key"].to_str().unwrap().to_owned());
//! #     if seen.len() == 1 { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::CREATED }
//! # }));
//! # let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! # let base = format!("http://{}", listener.local_addr()?);
//! # tokio::spawn(async move { axum::serve(listener, app).await });
//! let client = IdempotentClient::new(reqwest::Client::new())
//!     .with_policy(RetryPolicy::default().max_attempts(3));
//! let intent = client
//!     .post(format!("{base}/v1/orders"))
//!     .business_key("confirm:U-7318:S-204:session-42")?
//!     .bearer_auth("secret-token")
//!     .json(&serde_json::json!({"user_id": "U-7318", "show_id": "S-204"}))?;
//! let response = intent.send().await?;
//! println!("{} replayed={} after {} attempts", response.status, response.replayed, response.attempts);
//! # assert_eq!((response.status.as_u16(), response.attempts), (201, 2));
//! # assert_eq!(*keys.lock().unwrap(), ["confirm:U-7318:S-204:session-42"; 2]);
//! # Ok(()) }
//! ```
//!
//! This crate never talks to a store and never invents a new key for a retry.

mod error;
mod intent;
mod response;
mod retry;

pub use error::{AttemptFailure, ClientError, GiveUpReason};
pub use intent::{IdempotentClient, Intent, KeyForm};
pub use response::{IdempotentResponse, Problem};
pub use retry::RetryPolicy;

/// Request header carrying the key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Response header marking a replay.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
/// Response header telling when the key's stored result expires (HTTP-date).
pub const IDEMPOTENCY_EXPIRES: &str = "idempotency-expires";
