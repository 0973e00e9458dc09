//! The conformance suite on the embedded store: a temporary file per scenario.

use std::sync::Arc;

use async_trait::async_trait;
use idem_conformance::Harness;
use idem_core::{ClockShift, IdempotencyStore, StoreLimits};
use idem_sqlite::{SqliteOptions, SqliteStore};

struct SqliteHarness {
    dir: tempfile::TempDir,
    clock: ClockShift,
}

const LIMIT: usize = 64 * 1024;

#[async_trait]
impl Harness for SqliteHarness {
    async fn open(&self) -> Arc<dyn IdempotencyStore> {
        let mut opts = SqliteOptions::new(self.dir.path().join("idem.db"));
        opts.clock = self.clock.clone();
        opts.limits = StoreLimits::with_max_result_bytes(LIMIT);
        Arc::new(SqliteStore::open(opts).await.expect("open sqlite"))
    }

    fn clock(&self) -> &ClockShift {
        &self.clock
    }

    fn max_result_bytes(&self) -> usize {
        LIMIT
    }
}

async fn harness() -> Option<SqliteHarness> {
    Some(SqliteHarness {
        dir: tempfile::tempdir().expect("tempdir"),
        clock: ClockShift::new(),
    })
}

idem_conformance::store_tests!(harness());
