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
//! backoff and full jitter, waiting at least what `Retry-After` asks. It stops after
//! [`RetryPolicy::max_attempts`] or [`RetryPolicy::time_budget`] and says why. 400, 401,
//! 413 and 422 are returned at once as [`ClientError::Rejected`]. The final response
//! tells whether it was a replay ([`IdempotentResponse::replayed`]).
//!
//! ```no_run
//! use idem_client::{IdempotentClient, RetryPolicy};
//!
//! # async fn run() -> Result<(), idem_client::ClientError> {
//! let client = IdempotentClient::new(reqwest::Client::new());
//! let intent = client
//!     .post("http://127.0.0.1:8080/v1/orders")
//!     .business_key("confirm:U-7318:S-204:session-42")?
//!     .bearer_auth("secret-token")
//!     .json(&serde_json::json!({"user_id": "U-7318", "show_id": "S-204"}))?;
//! let response = intent.send().await?;
//! println!("{} replayed={} after {} attempts", response.status, response.replayed, response.attempts);
//! # Ok(()) }
//! ```
//!
//! This crate never talks to a store and never invents a new key for a retry.

mod error;
mod intent;
mod retry;

pub use error::{AttemptFailure, ClientError, GiveUpReason, Problem};
pub use intent::{IdempotentClient, IdempotentResponse, Intent, KeyForm};
pub use retry::RetryPolicy;

/// Request header carrying the key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Response header marking a replay.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
/// Response header telling when the key's stored result expires (HTTP-date).
pub const IDEMPOTENCY_EXPIRES: &str = "idempotency-expires";
