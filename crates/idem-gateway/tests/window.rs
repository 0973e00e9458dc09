//! The gateway's window as its pipeline calls it: what the window forwards (a quiet
//! finish among the rest) reaches the store behind it, in memory and in a Redis
//! connected on first use.

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use idem_conformance::Harness;
use idem_core::{ClockShift, IdempotencyStore};
use idem_gateway::window::{result_limit, Window};
use idem_gateway::{GatewayConfig, GatewayMetrics};

/// The window a gateway with a config opens. Its clock is the store's own, never
/// shifted: only scenarios that keep to real time run here.
struct WindowHarness {
    window: Arc<Window>,
    clock: ClockShift,
    max_result_bytes: usize,
}

#[async_trait]
impl Harness for WindowHarness {
    async fn open(&self) -> Arc<dyn IdempotencyStore> {
        self.window.clone()
    }

    fn clock(&self) -> &ClockShift {
        &self.clock
    }

    fn max_result_bytes(&self) -> usize {
        self.max_result_bytes
    }
}

fn harness(config: &GatewayConfig) -> WindowHarness {
    let metrics = Arc::new(GatewayMetrics::new());
    WindowHarness {
        window: Arc::new(Window::from_config(config, "window-test", metrics).expect("window")),
        clock: ClockShift::new(),
        max_result_bytes: result_limit(config),
    }
}

/// No upstream is called: the window alone is under test.
const NO_UPSTREAM: &str = "http://127.0.0.1:9";

#[tokio::test]
async fn the_memory_window_forwards_a_quiet_finish() {
    let h = harness(&common::config(NO_UPSTREAM));
    idem_conformance::quiet_finish_writes_what_finish_writes(&h).await;
    idem_conformance::abandoned_claim_frees_the_key(&h).await;
}

#[tokio::test]
async fn the_redis_window_forwards_a_quiet_finish() {
    let Some(redis) = common::RedisPrefix::new().await else {
        return;
    };
    let mut config = common::config(NO_UPSTREAM);
    redis.apply(&mut config);
    let h = harness(&config);
    idem_conformance::quiet_finish_writes_what_finish_writes(&h).await;
    idem_conformance::abandoned_claim_frees_the_key(&h).await;
}
