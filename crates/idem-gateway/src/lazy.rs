//! A connection made on first use and retried at most once a second while it fails, so
//! the gateway starts (and keeps serving, degraded) while Redis is unreachable.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

const RETRY_EVERY: Duration = Duration::from_secs(1);

pub struct Lazy<T> {
    slot: Mutex<Slot<T>>,
    /// One connect attempt at a time.
    gate: tokio::sync::Mutex<()>,
}

struct Slot<T> {
    value: Option<T>,
    retry_at: Option<Instant>,
    last_error: String,
}

impl<T: Clone> Lazy<T> {
    pub fn new() -> Self {
        Self {
            slot: Mutex::new(Slot {
                value: None,
                retry_at: None,
                last_error: String::new(),
            }),
            gate: tokio::sync::Mutex::new(()),
        }
    }

    /// The value when it is connected, without trying to connect.
    pub fn peek(&self) -> Option<T> {
        self.slot
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .value
            .clone()
    }

    fn cached(&self) -> Result<Option<T>, String> {
        let slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = &slot.value {
            return Ok(Some(v.clone()));
        }
        match slot.retry_at {
            Some(at) if Instant::now() < at => Err(slot.last_error.clone()),
            _ => Ok(None),
        }
    }

    /// The value, connecting first if needed. While a recent attempt failed, answers that
    /// attempt's error without trying again.
    pub async fn get<F, Fut>(&self, connect: F) -> Result<T, String>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, String>>,
    {
        if let Some(v) = self.cached()? {
            return Ok(v);
        }
        let _gate = self.gate.lock().await;
        if let Some(v) = self.cached()? {
            return Ok(v);
        }
        let res = connect().await;
        let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        match res {
            Ok(v) => {
                slot.value = Some(v.clone());
                slot.retry_at = None;
                Ok(v)
            }
            Err(e) => {
                slot.retry_at = Some(Instant::now() + RETRY_EVERY);
                slot.last_error = e.clone();
                Err(e)
            }
        }
    }
}
