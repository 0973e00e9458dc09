//! Faults injected on purpose (drills, tests, the incident demo) and the per-process
//! state that fires each one at most as often as asked.
//!
//! Owns the fault switches. It must not read them from the environment and must not
//! decide business outcomes; the code at each fault point asks it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A hook run at a fault point.
pub type FaultHook = Arc<dyn Fn() + Send + Sync>;

/// Faults injected on purpose, for drills, tests and the incident demo. All off by
/// default; nothing reads them from the environment.
#[derive(Clone, Default)]
pub struct Faults {
    /// Runs right after an idempotent create committed (order and record), before its
    /// response is written. The `kill -9` drill kills the process here.
    pub after_create_commit: Option<FaultHook>,
    /// The first create this process serves is slow: it writes after `commit_after` and
    /// answers `respond_after` later (the incident's response lost after its commit).
    pub slow_first_create: Option<SlowCreate>,
    /// The ticket issuer fails this many times right after issuing, before the ack (a
    /// consumer crash between its commit and its ack).
    pub ticket_issuer_crashes_after_issue: u32,
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faults")
            .field("after_create_commit", &self.after_create_commit.is_some())
            .field("slow_first_create", &self.slow_first_create)
            .field(
                "ticket_issuer_crashes_after_issue",
                &self.ticket_issuer_crashes_after_issue,
            )
            .finish()
    }
}

/// See [`Faults::slow_first_create`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlowCreate {
    pub commit_after: Duration,
    pub respond_after: Duration,
}

#[derive(Default)]
pub(crate) struct FaultState {
    pub(crate) after_create_commit: Option<FaultHook>,
    slow_first_create: Mutex<Option<SlowCreate>>,
    ticket_crashes: AtomicU32,
}

impl FaultState {
    pub(super) fn new(f: &Faults) -> Self {
        Self {
            after_create_commit: f.after_create_commit.clone(),
            slow_first_create: Mutex::new(f.slow_first_create),
            ticket_crashes: AtomicU32::new(f.ticket_issuer_crashes_after_issue),
        }
    }

    /// The slow-create fault, once.
    pub(crate) fn take_slow_create(&self) -> Option<SlowCreate> {
        self.slow_first_create
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    pub(super) fn take_ticket_crash(&self) -> bool {
        self.ticket_crashes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}
