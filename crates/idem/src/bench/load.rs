//! What the benches measure and how: a load driven from N tasks for a while (operations,
//! wall time, latencies) and a phase comparing idem's load with its baseline's. Knows no
//! store and no baseline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::StoreError;
use serde::Serialize;
use tokio::task::JoinHandle;

#[derive(Debug, Serialize)]
pub struct Phase {
    pub phase: &'static str,
    pub idem_ops_per_s: f64,
    pub baseline_ops_per_s: f64,
    pub ratio: f64,
    pub idem_p50_us: u64,
    pub idem_p99_us: u64,
    pub baseline_p50_us: u64,
    pub baseline_p99_us: u64,
    pub baseline: &'static str,
}

#[derive(Default)]
pub struct Load {
    ops: u64,
    elapsed: Duration,
    latencies_us: Vec<u64>,
}

impl Load {
    pub fn merge(&mut self, other: Load) {
        self.ops += other.ops;
        self.elapsed += other.elapsed;
        self.latencies_us.extend(other.latencies_us);
    }

    pub fn rate(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn percentile(&mut self, p: f64) -> u64 {
        if self.latencies_us.is_empty() {
            return 0;
        }
        self.latencies_us.sort_unstable();
        let idx = ((self.latencies_us.len() as f64 - 1.0) * p).round() as usize;
        self.latencies_us[idx]
    }
}

/// Runs `op(task, seq)` from `concurrency` tasks until `duration` passes.
pub async fn drive<F, Fut>(
    concurrency: usize,
    duration: Duration,
    op: F,
) -> Result<Load, StoreError>
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), StoreError>> + Send,
{
    let op = Arc::new(op);
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = Vec::new();
    for task in 0..concurrency {
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut seq = 0u64;
            while Instant::now() < deadline {
                let t0 = Instant::now();
                op(task, seq).await?;
                lat.push(t0.elapsed().as_micros() as u64);
                seq += 1;
            }
            Ok::<_, StoreError>(lat)
        }));
    }
    collect(tasks, started).await
}

/// The load of `tasks`, each giving its latencies (us), all started at `started`.
pub async fn collect(
    tasks: Vec<JoinHandle<Result<Vec<u64>, StoreError>>>,
    started: Instant,
) -> Result<Load, StoreError> {
    let mut load = Load::default();
    for t in tasks {
        let lat = t
            .await
            .map_err(|e| StoreError::Backend(format!("bench task: {e}")))??;
        load.ops += lat.len() as u64;
        load.latencies_us.extend(lat);
    }
    load.elapsed = started.elapsed();
    Ok(load)
}

pub fn phase(name: &'static str, baseline: &'static str, mut idem: Load, mut base: Load) -> Phase {
    let (i, b) = (idem.rate(), base.rate());
    Phase {
        phase: name,
        idem_ops_per_s: i.round(),
        baseline_ops_per_s: b.round(),
        ratio: if b > 0.0 {
            (i / b * 100.0).round() / 100.0
        } else {
            0.0
        },
        idem_p50_us: idem.percentile(0.50),
        idem_p99_us: idem.percentile(0.99),
        baseline_p50_us: base.percentile(0.50),
        baseline_p99_us: base.percentile(0.99),
        baseline,
    }
}
