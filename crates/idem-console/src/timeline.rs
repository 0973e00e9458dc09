//! The arrival timeline as the console reads it: a key's arrivals counted by decision
//! and the first ones one by one. A host implements [`ArrivalTimeline`] over wherever it
//! records arrivals; the console only reads through it and must not know that storage.

use async_trait::async_trait;
use idem_sql::{arrivals, ArrivalLog, SqlStore};

use crate::error::ConsoleError;

pub use idem_sql::arrivals::{ArrivalRow, ArrivedKey, KeyArrivals};

/// Where the console reads arrivals from.
#[async_trait]
pub trait ArrivalTimeline: Send + Sync + 'static {
    /// The timeline of `(tenant, key)`, if it had an arrival.
    async fn key_arrivals(
        &self,
        tenant: &str,
        key: &str,
    ) -> Result<Option<KeyArrivals>, ConsoleError>;

    /// Keys of `tenant` named exactly `key` that arrived (refused before a record, or
    /// whose record is gone), up to `limit`.
    async fn arrived_keys(
        &self,
        tenant: &str,
        key: &str,
        limit: usize,
    ) -> Result<Vec<ArrivedKey>, ConsoleError>;

    /// Arrivals not recorded because the recorder's buffer was full.
    fn dropped(&self) -> u64 {
        0
    }
}

/// The timeline a SQL store keeps (`idem_sql::ArrivalLog` writes it into the store's own
/// tables): what `idem console` and `idem serve` read.
pub struct StoreTimeline {
    store: SqlStore,
    log: Option<ArrivalLog>,
}

impl StoreTimeline {
    /// Reads `store`'s timeline; `log`, when this process records into it, reports drops.
    pub fn new(store: SqlStore, log: Option<ArrivalLog>) -> Self {
        Self { store, log }
    }
}

#[async_trait]
impl ArrivalTimeline for StoreTimeline {
    async fn key_arrivals(
        &self,
        tenant: &str,
        key: &str,
    ) -> Result<Option<KeyArrivals>, ConsoleError> {
        Ok(arrivals::key_arrivals(&self.store, tenant, key).await?)
    }

    async fn arrived_keys(
        &self,
        tenant: &str,
        key: &str,
        limit: usize,
    ) -> Result<Vec<ArrivedKey>, ConsoleError> {
        Ok(arrivals::arrived_keys(&self.store, tenant, key, limit).await?)
    }

    fn dropped(&self) -> u64 {
        self.log.as_ref().map_or(0, ArrivalLog::dropped)
    }
}
