//! The layer's decision counters, sampled every few seconds for the overview's rates.
//! Owns the samples only; the counters are the host's layer's.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use idem_http::metrics::Decision;
use idem_http::IdempotencyMetrics;

use crate::Console;

/// Samples kept: ten minutes at one per 5 s.
const SAMPLES: usize = 121;
const SAMPLE_EVERY: Duration = Duration::from_secs(5);

pub(crate) struct Rates {
    metrics: IdempotencyMetrics,
    samples: Mutex<VecDeque<Sample>>,
}

#[derive(Clone)]
pub(crate) struct Sample {
    pub(crate) at: Instant,
    pub(crate) counts: Vec<u64>,
}

impl Rates {
    pub(crate) fn new(metrics: IdempotencyMetrics) -> Self {
        Self {
            metrics,
            samples: Mutex::new(VecDeque::new()),
        }
    }

    pub(crate) fn read(&self) -> Sample {
        Sample {
            at: Instant::now(),
            counts: Decision::ALL
                .iter()
                .map(|d| self.metrics.requests(*d))
                .collect(),
        }
    }

    fn sample(&self) {
        let s = self.read();
        let mut q = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        q.push_back(s);
        while q.len() > SAMPLES {
            q.pop_front();
        }
    }

    /// The samples so far, oldest first.
    pub(crate) fn history(&self) -> Vec<Sample> {
        self.samples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}

/// Samples the rates until dropped (aborted); returns at once without counters.
pub async fn sample_rates(console: Console) {
    let Some(rates) = console.inner.rates.as_ref() else {
        return;
    };
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        rates.sample();
    }
}

impl Console {
    pub(crate) fn rates(&self) -> Option<&Rates> {
        self.inner.rates.as_ref()
    }
}
