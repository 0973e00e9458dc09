//! idem-store-kit: what idem's stores share below the vocabulary.
//!
//! Owns pure code that every store needs and no application should bind to: stored
//! values turned into records, leases and archive rows ([`row`]), the order of the steps
//! of a fenced write and of lease changes under a name's lock, the replay hint
//! ([`recent`]), the copy of finished records that answers replays from memory
//! ([`finished`]) and the order of a schema migration's steps ([`migrate`], whose backends
//! do the I/O). It must not do I/O nor know a SQL dialect, and it is no part of the
//! vocabulary: `idem-core` keeps the words applications use, this crate keeps how stores
//! implement them, so it may change in ways a store author notices and a user does not.

pub mod finished;
pub mod migrate;
pub mod recent;
pub mod row;

pub use finished::{FinishedLimits, FinishedRecords, Kept};
pub use recent::RecentKeys;
