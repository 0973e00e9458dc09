//! idem-bench: the benchmarks behind `idem bench http|gateway|sweep|reconcile`, and the
//! incident demo driver behind `idem demo incident`.
//!
//! They live here, not in the libraries they measure, so that an application using
//! `idem-http` or `idem-gateway` pulls in no load generator, HTTP client, temporary store
//! or stand-in service. Each module drives its library through the public API only.
//!
//! - [`http`]: the HTTP layer against the same axum app without it, and the store alone.
//! - [`gateway`]: the gateway against the upstream directly and nginx, plus a duplicate
//!   storm that must cost one upstream call (upstream: `idem-stub`).
//! - [`sweep`]: sweeping expired records, and what it costs claims beside it.
//! - [`orders`]: the order service's create with a key (one and two commits) against
//!   the same create without one.
//! - [`powertools`]: single-caller replays against AWS Lambda Powertools' idempotency
//!   utility on the same Redis (the peer: `peers/powertools/`).
//! - [`reconcile`]: the reconcile dry run's scan against a raw ordered SELECT.
//! - [`callgrind`]: instructions per keyed request of the gateway and of the layer,
//!   counted by valgrind's callgrind.
//! - [`demo`]: the 20:14 incident replayed with and without idem.
//!
//! Must not: install system packages (a missing nginx is reported and its figures left
//! out), or change a library's configuration beyond what a measurement needs. Figures
//! are ratios measured in one run; absolute numbers depend on the host.

pub mod callgrind;
pub mod cleanup;
mod client;
pub mod demo;
pub mod gateway;
pub mod http;
mod nginx;
pub mod orders;
pub mod powertools;
pub mod reconcile;
pub mod saturation;
pub mod sweep;
