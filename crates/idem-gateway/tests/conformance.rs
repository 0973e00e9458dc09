//! The shared store scenarios, run against the gateway's in-memory window store.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_conformance::Harness;
use idem_core::{ClockShift, IdempotencyStore, StoreLimits};
use idem_gateway::memory::{MemoryOptions, MemoryStore};

const LIMIT: usize = 64 * 1024;

/// One store per scenario; "reopening" hands out another handle on the same records, as
/// a process that keeps running would.
struct MemoryHarness {
    store: MemoryStore,
    clock: ClockShift,
}

#[async_trait]
impl Harness for MemoryHarness {
    async fn open(&self) -> Arc<dyn IdempotencyStore> {
        Arc::new(self.store.clone())
    }

    fn clock(&self) -> &ClockShift {
        &self.clock
    }

    fn max_result_bytes(&self) -> usize {
        LIMIT
    }
}

async fn harness() -> Option<MemoryHarness> {
    let clock = ClockShift::new();
    Some(MemoryHarness {
        store: MemoryStore::new(MemoryOptions {
            window: Duration::from_secs(600),
            limits: StoreLimits::with_max_result_bytes(LIMIT),
            clock: clock.clone(),
            ..MemoryOptions::default()
        }),
        clock,
    })
}

idem_conformance::store_tests!(harness());
