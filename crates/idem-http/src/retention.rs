//! Answers for keys the retention sweeper has moved on (see `idem_core::retention`).
//!
//! - **Reconstructed replay.** Past the short retry window the sweeper drops the stored
//!   response and keeps its status and result reference (the order). A duplicate then
//!   gets a response the application rebuilds from that reference
//!   ([`ReconstructResponse`]): same status, same order id, with
//!   `Idempotent-Replayed: true` and `Idempotent-Reconstructed: true`. Without a
//!   reconstructor it gets a `result-not-stored` problem naming the reference — never a
//!   second execution.
//! - **Expired key.** After the dispute window the record is archived, out of the online
//!   index, so a claim of that key proceeds as fresh. With an
//!   [`ArchiveLookup`](idem_core::retention::ArchiveLookup)
//!   configured the layer checks the archive on every *fresh* claim (one indexed read,
//!   only for keys never seen online) and, on a hit, does not run the handler: it ends
//!   the claim FAILED_TERMINAL with a stored `410 idempotency-key-expired` problem, so
//!   later duplicates replay the same 410. We chose this over re-executing because a
//!   second execution is exactly the incident idem exists to prevent; the client is told
//!   where the original result is (its reference) instead.
//!
//! This module owns the application's seam for rebuilding a response; the layer's
//! answers themselves are built elsewhere in this crate. Neither decides whether a claim proceeds: the
//! store does; they only answer for records the store returned.

use async_trait::async_trait;
use bytes::Bytes;
use http::header::HeaderMap;
use idem_core::{Record, TenantId};

/// A response rebuilt from a result reference. The status is the stored one.
#[derive(Debug, Clone, Default)]
pub struct Reconstructed {
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Rebuilds the response of a finished request from its result reference (for example,
/// reads the order and renders it as the create endpoint did).
#[async_trait]
pub trait ReconstructResponse: Send + Sync + 'static {
    /// `Ok(None)`: the reference is unknown to the application.
    async fn reconstruct(
        &self,
        tenant: &TenantId,
        result_ref: &str,
        record: &Record,
    ) -> Result<Option<Reconstructed>, Box<dyn std::error::Error + Send + Sync>>;
}
