//! The HTTP API: routes, authentication, request parsing, problem responses, and the
//! one place a business transaction meets its idempotency record.
//!
//! The tenant API sits behind `idem-http`'s [`IdempotencyLayer`]: POSTs need an
//! `Idempotency-Key`; concurrent duplicates wait for the first and replay it. Handlers
//! write their business rows in an open transaction, finish the claim in that same
//! transaction ([`TransactionalClaim`] + `finish_in_tx`), and commit once — so the order
//! and the record that makes it idempotent exist together or not at all.
//!
//! Tenants come only from authentication (bearer API keys); another tenant's order is
//! 404. Admin routes (freezes, shows) and `/metrics` need the admin token and are
//! outside the layer.
//!
//! Every request carries a request id of our own (never the client's, which could
//! repeat another request's): answered in `x-request-id`, added as `request_id` to the
//! problem+json of server failures and 408s, and on the span of the request's logs,
//! beside the client's own `x-request-id` (when plain) as `client_request_id`. Internal
//! errors are logged with it and answered with a stable message, never the error's
//! text. Request bodies are read in full, within the body read timeout, before a
//! handler or the layer sees them (408 otherwise).
//!
//! This module owns the wire; it must not decide business rules (that is
//! [`crate::service`]).
//!
//! # Map
//! - `router`: the routes and the middleware around them; `middleware`: request ids
//!   and reading bodies in time.
//! - `state`: `AppState`; `auth`: the tenant (`Caller`) and the admin token; `extract`: JSON bodies, path and query errors; `error`: problem+json.
//! - `answer`: a success and its commit with the key's record; `doc`: the tag, problem
//!   body and refusal sets the handlers' OpenAPI attributes share.
//! - Handlers: `orders` (tenant orders), `keys` (the gateway's key state query),
//!   `admin` (freezes, shows), `public` (health, readiness, the OpenAPI document),
//!   `metrics` (scrapes and the state gauges).
//!
//! Modules here import each other (never this one); this one only declares them and
//! hands out what the rest of the crate uses.
//!
//! [`IdempotencyLayer`]: idem_http::IdempotencyLayer
//! [`TransactionalClaim`]: idem_http::TransactionalClaim

// The handlers' modules are open to the crate: `crate::openapi` names their handlers.
pub(crate) mod admin;
mod answer;
mod auth;
pub(crate) mod doc;
mod error;
mod extract;
pub(crate) mod keys;
pub(crate) mod metrics;
mod middleware;
pub(crate) mod orders;
pub(crate) mod public;
mod router;
mod state;

pub use error::PROBLEM_TYPE_BASE;
/// `x-request-id`: always answered with our own id; the client's is logged beside it.
pub use idem_http::headers::REQUEST_ID;
pub use router::LEGACY_ROUTE;

pub(crate) use metrics::refresh_state_gauges;
pub(crate) use router::{metrics_router, router};
pub(crate) use state::AppState;
