//! Read-only inspection of a store's records, for operators (the console).
//!
//! Owns the questions an operator asks of the records as a whole: how many are in each
//! state, which are PROCESSING past their lease, which keys start with a prefix, which
//! records name a result reference. Every answer is bounded by a page limit. It must not
//! change a record, and it says nothing about how a store answers (no SQL here).

use async_trait::async_trait;

use crate::{Millis, RecordState, StoreError, TenantId};

/// The most rows one inspection answer holds, whatever the caller asked.
pub const INSPECT_PAGE_MAX: usize = 500;

/// One record as a list shows it (not its stored response).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordSummary {
    /// As stored: display data, so a row written by an older build still shows.
    pub tenant: String,
    pub key: String,
    pub state: RecordState,
    pub attempts: i64,
    pub lease_expires_at: Option<Millis>,
    pub created_at: Millis,
    pub updated_at: Millis,
    pub result_ref: Option<String>,
}

/// PROCESSING records whose lease ran out: how many, and the longest overdue first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PastLease {
    pub count: i64,
    pub first: Vec<RecordSummary>,
}

/// What an operator may read of a store's records as a whole. Stores that cannot answer
/// (Redis keeps no index to scan) answer [`not_supported`].
#[async_trait]
pub trait Inspect: Send + Sync + 'static {
    /// The store's clock (leases are judged by it, never by the caller's).
    async fn now(&self) -> Result<Millis, StoreError>;

    /// Records per state, every state listed (zero included), in [`RecordState`] order.
    async fn counts_by_state(&self) -> Result<Vec<(RecordState, i64)>, StoreError>;

    /// PROCESSING records whose lease ended before `now`: their number and up to
    /// `limit` of them, the lease that ended first first.
    async fn processing_past_lease(
        &self,
        now: Millis,
        limit: usize,
    ) -> Result<PastLease, StoreError>;

    /// Records of `tenant` whose key starts with `prefix` (case-sensitive), up to
    /// `limit`, by key.
    async fn by_key_prefix(
        &self,
        tenant: &TenantId,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<RecordSummary>, StoreError>;

    /// Records of `tenant` whose stored result names `result_ref`, up to `limit`,
    /// oldest first.
    async fn by_result_ref(
        &self,
        tenant: &TenantId,
        result_ref: &str,
        limit: usize,
    ) -> Result<Vec<RecordSummary>, StoreError>;
}

/// The inspection of a store that keeps no index to scan (Redis): every question is
/// answered with [`not_supported`].
#[derive(Debug, Clone)]
pub struct NotSupported {
    backend: &'static str,
}

impl NotSupported {
    pub fn new(backend: &'static str) -> Self {
        Self { backend }
    }
}

#[async_trait]
impl Inspect for NotSupported {
    async fn now(&self) -> Result<Millis, StoreError> {
        Err(not_supported(self.backend))
    }

    async fn counts_by_state(&self) -> Result<Vec<(RecordState, i64)>, StoreError> {
        Err(not_supported(self.backend))
    }

    async fn processing_past_lease(
        &self,
        _now: Millis,
        _limit: usize,
    ) -> Result<PastLease, StoreError> {
        Err(not_supported(self.backend))
    }

    async fn by_key_prefix(
        &self,
        _tenant: &TenantId,
        _prefix: &str,
        _limit: usize,
    ) -> Result<Vec<RecordSummary>, StoreError> {
        Err(not_supported(self.backend))
    }

    async fn by_result_ref(
        &self,
        _tenant: &TenantId,
        _result_ref: &str,
        _limit: usize,
    ) -> Result<Vec<RecordSummary>, StoreError> {
        Err(not_supported(self.backend))
    }
}

/// The error of a store that cannot answer an inspection.
pub fn not_supported(backend: &str) -> StoreError {
    StoreError::InvalidInput(format!(
        "inspecting records is not supported by this store ({backend})"
    ))
}

/// `limit` within 1..=[`INSPECT_PAGE_MAX`].
pub fn page_limit(limit: usize) -> usize {
    limit.clamp(1, INSPECT_PAGE_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_bounded() {
        assert_eq!(page_limit(0), 1);
        assert_eq!(page_limit(20), 20);
        assert_eq!(page_limit(1_000_000), INSPECT_PAGE_MAX);
        assert!(not_supported("redis").to_string().contains("not supported"));
    }
}
