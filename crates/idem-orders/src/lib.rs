//! idem-orders: the ticketing reference service — the flash-sale platform of the 20:14
//! incident, built so that one purchase intent takes effect once.
//!
//! # What it is
//! - **Four ledgers** in one database (embedded SQLite by default, PostgreSQL by URL),
//!   beside the idempotency records: orders (with their state machine, [`machine`]),
//!   payments (through an idempotent provider simulator, [`provider`]), inventory (stock
//!   per show, one hold per order) and messages (a transactional outbox and, per
//!   consumer, the business keys it processed). Rows are never deleted.
//! - **An HTTP API** behind `idem-http`'s idempotency layer ([`api`]): creating an order
//!   inserts the order, takes the hold, writes `order.created` and finishes the key's
//!   record in one transaction; a replay returns the same body with
//!   `Idempotent-Replayed: true`.
//! - **The automatic chain** ([`chain`]): an outbox relay (in process, or NATS JetStream
//!   with `Nats-Msg-Id`) and idempotent consumers — payment confirmation, ticket issuing
//!   (exactly one ticket per order), inventory release under a lease and a fencing token.
//!   Consumers reuse the business key (`ticket:{order}`), never mint one.
//! - **Freeze switches** ([`freeze`]) for a user, a show or everything: frozen work waits
//!   and resumes on unfreeze.
//! - **`idem demo incident`** replays the incident with and without idem against this
//!   service over HTTP; its driver is `idem_bench::demo`, outside the library.
//!
//! # Entry points for the CLI
//! - `idem serve` → [`serve`]`(`[`ServeConfig`]`, shutdown)`; [`bind`] for tests.
//! - `idem freeze` / `idem unfreeze` → [`freeze::freeze`] / [`freeze::unfreeze`] on a
//!   database URL (the admin API does the same through `POST /v1/admin/freezes`).
//!
//! # Invariants
//! - A business write and the idempotency record it answers commit together or not at
//!   all; the layer claims first, the handler finishes in its own transaction.
//! - Every status change goes through [`machine::transition`] and a compare-and-set.
//! - Nothing deletes a business row: duplicates are cancelled and refunded, holds are
//!   released, freezes are ended — each as an update that keeps the history.
//! - Tenants come from authentication only; another tenant's order is 404.

pub mod api;
pub mod chain;
pub mod compensation;
pub mod console;
pub mod db;
mod error;
pub mod forwarded;
pub mod freeze;
pub mod ledgers;
pub mod machine;
pub mod metrics;
pub mod openapi;
pub mod provider;
pub mod reconcile;
pub mod server;
pub mod service;
mod text;
pub mod views;

pub use chain::{Chain, ChainHandle, ChainOptions, NatsOptions, TransportConfig};
pub use db::{Database, DatabaseOptions, DEFAULT_URL};
pub use error::{Error, OrderError};
pub use forwarded::{IpNet, TrustedProxies};
pub use freeze::{Freeze, FreezeChange, FreezeRequest, FreezeScope, FreezeWhat};
/// Where a route claims its idempotency key (see [`ServiceOptions::create_claim`]).
pub use idem_http::ClaimMode;
pub use machine::{IllegalTransition, OrderEvent, OrderStatus};
pub use server::{
    bind, serve, ApiKey, App, DevCredentials, HttpTimeouts, ServeConfig, Server, ServiceOptions,
};
pub use service::{Faults, Handled, LeaseTimings, NewOrder, Orders, OrdersOptions, SlowCreate};
pub use views::OrderView;
