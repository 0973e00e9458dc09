//! The sweeper's retention scenarios (`crates/idem-sweep/tests/common`), unchanged, on
//! MySQL / MariaDB: one fresh database per scenario, dropped at the end.

#[path = "../../idem-sweep/tests/common/mod.rs"]
mod common;
#[path = "common/mod.rs"]
mod my;

use std::sync::Arc;

async fn mysql() -> Option<common::Env> {
    let h = my::harness().await?;
    let clock = h.clock.clone();
    let store = Arc::new(h.store().await);
    let seeder = store.clone();
    Some(common::Env {
        store: store.clone(),
        retention: store.clone(),
        leases: store,
        seed: Arc::new(move |t, prefix, n, at, bytes| {
            let s = seeder.clone();
            Box::pin(async move { s.seed_terminal(&t, prefix, n, at, bytes).await })
        }),
        clock,
        _guard: Box::new(h),
    })
}

retention_tests!(mysql().await);
