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
//! ```no_run
//! use axum::{routing::post, Router};
//! use idem_core::{Principal, TenantId};
//! use idem_http::{BearerTokens, Identity, IdempotencyLayer};
//! use idem_sqlite::SqliteStore;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = SqliteStore::open_path("./idem-data/idem.db").await?;
//! let auth = BearerTokens::new().with(
//!     "secret-token",
//!     Identity::new(TenantId::new("t1")?, Principal::new("alice")?),
//! );
//! let app = Router::new()
//!     .route("/v1/orders", post(|| async { "created" }))
//!     .layer(IdempotencyLayer::new(store, auth));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```
//!
//! Both `Router::layer` and `Router::route_layer` run the layer after routing, so the
//! fingerprint uses the matched route template (`/v1/orders/{id}`). `route_layer` leaves
//! unmatched paths alone (plain 404); `layer` also guards the fallback.
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
//! Modules: [`config`] (what applies where), [`auth`], [`problem`], [`headers`],
//! [`metrics`], [`openapi`], [`transactional`] (the handler finishes the claim in its own
//! transaction), [`mod@bench`]. The requester side is the `idem-client` crate.

pub mod auth;
pub mod bench;
mod claim;
mod completion;
pub mod config;
mod execute;
pub mod headers;
mod layer;
pub mod metrics;
pub mod openapi;
pub mod problem;
mod replay;
pub mod retention;
pub mod serve;
pub mod transactional;

pub use auth::{Authenticate, BearerTokens, Identity, TokenConflict, Unauthenticated};
pub use config::{
    IdempotencyConfig, InProgressMode, KeyRequirement, ResolvedRules, RouteRule,
    StoreUnavailableMode,
};
pub use headers::{
    IDEMPOTENCY_EXPIRES, IDEMPOTENCY_KEY, IDEMPOTENT_BODY_OMITTED, IDEMPOTENT_RECONSTRUCTED,
    IDEMPOTENT_REPLAYED,
};
pub use layer::{IdempotencyLayer, IdempotencyService, ResponseFuture};
pub use metrics::IdempotencyMetrics;
pub use problem::{Problem, ProblemKind, PROBLEM_JSON, PROBLEM_TYPE_BASE};
pub use retention::{ReconstructResponse, Reconstructed};
pub use transactional::TransactionalClaim;
