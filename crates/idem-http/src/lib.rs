//! idem-http: one line in an axum app, and every POST becomes safe to retry.
//!
//! [`IdempotencyLayer`] is a tower layer. For each request on a route that needs a key it
//! authenticates the caller (the application's [`Authenticate`]), reads
//! `Idempotency-Key`, buffers and fingerprints the body, and claims the key in an
//! [`IdempotencyStore`](idem_core::IdempotencyStore):
//!
//! | the key is | the request gets |
//! |---|---|
//! | new (or its last attempt failed retryably) | the handler runs once; its response is stored |
//! | finished | the stored status, headers and body, plus `Idempotent-Replayed: true` |
//! | being processed | 409 + `Retry-After`, or (configured) a bounded wait and then the replay |
//! | used for a different request | 422 |
//! | unknown because the store is down | 503, handler not called (or fail open, per route) |
//!
//! Terminal responses carry `Idempotency-Expires` (an HTTP-date: completion time plus
//! the configured retention). Errors are `application/problem+json` with a stable `type`
//! per case ([`ProblemKind`]).
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//!
//! use axum::{body::{to_bytes, Body}, http::Request, routing::post, Router};
//! use idem_http::{BearerTokens, Identity, IdempotencyLayer, Principal, TenantId};
//! use idem_sqlite::SqliteStore;
//! use tower::ServiceExt;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! let store = SqliteStore::open_path(dir.path().join("idem.db")).await?;
//! let auth = BearerTokens::new().with(
//!     "secret-token",
//!     Identity::new(TenantId::new("t1")?, Principal::new("alice")?),
//! );
//! let runs = Arc::new(AtomicUsize::new(0));
//! let counter = runs.clone();
//! let create = move || async move {
//!     let n = counter.fetch_add(1, Ordering::SeqCst);
//!     format!("order #{n}")
//! };
//! let app = Router::new()
//!     .route("/v1/orders", post(create))
//!     .layer(IdempotencyLayer::new(store, auth));
//!
//! // One intent sent twice: same key, same body.
//! let request = || {
//!     Request::post("/v1/orders")
//!         .header("authorization", "Bearer secret-token")
//!         .header("idempotency-key", "order-42")
//!         .header("content-type", "application/json")
//!         .body(Body::from(r#"{"item":"book"}"#))
//! };
//! let first = app.clone().oneshot(request()?).await?;
//! let second = app.oneshot(request()?).await?;
//!
//! assert_eq!(second.headers()["idempotent-replayed"], "true");
//! let limit = 1 << 20;
//! let first = to_bytes(first.into_body(), limit).await?;
//! assert_eq!(to_bytes(second.into_body(), limit).await?, first);
//! assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
//! # Ok(()) }
//! ```
//!
//! The fingerprint covers the concrete path the client sent (`/v1/orders/42`, a nested
//! router's prefix included), never the route template, so a key cannot be reused for
//! another resource. A JSON body counts by its canonical form (member order, whitespace
//! and string escapes do not matter; numbers keep their exact text), and one that names
//! a member twice is refused with 400 `duplicate-json-member` (see
//! [`idem_core::fingerprint`]). Route rules ([`config::RouteRule`]) are patterns
//! (`/v1/orders/{id}`) matched against that concrete path; the most specific matching
//! rule wins, whatever the order they are listed in ([`routes`]). Both `Router::layer` and
//! `Router::route_layer` work: `route_layer` leaves unmatched paths alone (plain 404);
//! `layer` also guards the fallback.
//!
//! Response headers: `Idempotent-Replayed: true` on replays; `Idempotency-Expires`
//! (HTTP-date) on terminal results; `Idempotent-Body-Omitted: true` on replays of bodies
//! larger than the capture limit; `Retry-After` on 409 and 503.
//!
//! Past the short retry window (see `idem_core::retention`), replays are rebuilt from the
//! result reference by the application's [`ReconstructResponse`]
//! ([`IdempotencyLayer::with_reconstruction`], marked `Idempotent-Reconstructed: true`),
//! and keys whose records were archived answer `410 idempotency-key-expired` instead of
//! executing again ([`IdempotencyLayer::with_archive`]); see [`retention`].
//!
//! Modules: [`config`] (what applies where), [`routes`] (which rule decides), [`auth`], [`problem`], [`headers`],
//! [`metrics`], [`openapi`], [`transactional`] (the handler finishes the claim in its own
//! transaction). The requester side is the `idem-client` crate; the benchmark is in
//! `idem-bench`.

mod answer;
mod arrivals;
pub mod auth;
pub mod body;
pub mod config;
pub mod decision;
mod execute;
pub mod headers;
mod keyed;
mod layer;
pub mod metrics;
pub mod openapi;
pub mod pipeline;
pub mod problem;
mod replay;
pub mod retention;
pub mod routes;
mod shared;
pub mod transactional;

pub use auth::{Authenticate, BearerTokens, Identity, TokenConflict, Unauthenticated};
pub use config::{
    ClaimMode, IdempotencyConfig, InProgressMode, KeyRule, ResolvedRules, RouteRule,
    StoreUnavailableMode,
};
pub use decision::Decision;
pub use headers::{
    IDEMPOTENCY_EXPIRES, IDEMPOTENCY_KEY, IDEMPOTENT_BODY_OMITTED, IDEMPOTENT_RECONSTRUCTED,
    IDEMPOTENT_REPLAYED,
};
pub use layer::{IdempotencyLayer, IdempotencyService, ResponseFuture};
pub use metrics::IdempotencyMetrics;
pub use problem::{Problem, ProblemKind, ProblemResponse, PROBLEM_JSON, PROBLEM_TYPE_BASE};
pub use retention::{ReconstructResponse, Reconstructed};
pub use transactional::TransactionalClaim;

// The vocabulary a layer's first example needs, so a service can start with this crate
// alone: who a caller is, and the store the layer takes.
pub use idem_core::{IdempotencyStore, Principal, TenantId};
