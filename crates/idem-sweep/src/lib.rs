//! idem-sweep: the sweeper. Storage cost goes down through tiers and digests — never by
//! forgetting evidence that is still valid (docs/DESIGN.md: retention tiers).
//!
//! One [`Sweeper::run`]:
//! 1. takes the lease `idem.sweeper` (when a [`LeaseStore`] is given) and keeps it alive;
//!    a second sweeper finds it held and does nothing;
//! 2. **stale scan**: PROCESSING records whose lease ended are turned FAILED_RETRYABLE
//!    (compare-and-set; an event per record in the store, a metric, a tracing warning) —
//!    never deleted. The old owner's late finish then fails as superseded;
//! 3. **tiers**, in order retry → replay → dispute → archive: terminal records past their
//!    window move down, in batches; a batch's moves to one destination tier are one
//!    transaction of compare-and-sets (a batch spans up to three). A
//!    record past several windows (a backlog, a sweeper that was off) goes straight to
//!    the deepest tier it is due for in one write, and the report counts every
//!    transition it passed. A record whose result has a pending compensation (the
//!    application's [`CompensationCheck`]) is skipped;
//! 4. **pacing**: after each batch the sweep rests in proportion to the batch's work
//!    ([`Sweeper::with_duty`]), so claims sharing the database keep their latency;
//! 5. **archive expiry** when the policy has an archive window;
//! 6. **lease evidence**: with a lease store ([`Sweeper::with_lease`]) and a
//!    `lease_event_window` in the policy, lease events older than the window are
//!    deleted in batches ([`LeaseStore::trim_events`]), judged by the store clock.
//!
//! Safety: every write is a compare-and-set on the record's version (and tier), so two
//! sweepers without the lease, or a rerun after a crash in the middle of a batch, reach
//! the same final state; the lease only saves the duplicated work.
//!
//! Time: the sweep's `now` is the store's clock unless given (`idem sweep --now`); it is
//! passed explicitly to every scan. The stale scan never uses a time ahead of the store
//! clock: a lease is judged by the store, not by an operator's flag.
//!
//! It must not delete an online record except by archiving it, never touches business
//! rows, and deletes lease evidence only past the policy's window (never leases,
//! token counters or fences).

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::retention::{
    dropped_digest, dropped_response, dropped_result, result_digest, ArchivedRecord,
    CompensationCheck, Demotion, DueRecord, NoCompensation, RetentionPolicy, RetentionStore,
    StaleRecord, Tier,
};
use idem_core::{LeaseName, LeaseStore, Millis, OwnerId, StoreError};
use idem_lease::{Acquired, LeaseGuard, LeaseMetrics};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

pub mod config;
pub mod metrics;

pub use metrics::SweepMetrics;

/// The lease every sweeper of one store takes.
pub const LEASE_NAME: &str = "idem.sweeper";
/// How long the lease lasts between renewals (renewed every third).
pub const LEASE_TTL: Duration = Duration::from_secs(30);
/// Default records scanned per batch.
pub const DEFAULT_BATCH: usize = 500;
/// Default share of wall time a sweep spends working (see [`Sweeper::with_duty`]).
pub const DEFAULT_DUTY: f64 = 0.5;
/// The smallest duty: a sweep rests at most 99 times as long as it works.
pub const MIN_DUTY: f64 = 0.01;
/// Stale recoveries listed in a report (all are counted and stored as events).
const REPORTED_EVENTS: usize = 100;

/// What one run should do.
#[derive(Debug, Clone, Default)]
pub struct SweepOptions {
    /// Count what would move, write nothing. A record due for several tiers counts in
    /// each transition it would pass.
    pub dry_run: bool,
    /// The sweep's notion of now (epoch ms); `None`: the store's clock.
    pub now: Option<Millis>,
    /// Show a progress bar (only drawn when stderr is a terminal).
    pub progress: bool,
}

/// How the run ended with respect to the lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum LeaseOutcome {
    /// No lease store given: compare-and-sets alone keep concurrent sweeps safe.
    NotUsed,
    Held {
        token: i64,
    },
    /// Another sweeper holds it: this run did nothing.
    Busy {
        holder: String,
    },
    /// The lease was lost mid-run: the run stopped after the batch in flight.
    Lost {
        token: i64,
    },
}

/// A stale PROCESSING record turned FAILED_RETRYABLE.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StaleEvent {
    pub tenant: String,
    pub key: String,
    pub owner: Option<String>,
    pub lease_expires_at: Millis,
}

/// What a run did. `transitions` counts per transition (`retry->replay`, …,
/// `processing->failed_retryable`): in a dry run, what would have moved.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SweepReport {
    pub backend: String,
    pub now: Millis,
    pub dry_run: bool,
    pub lease: LeaseOutcome,
    pub transitions: BTreeMap<String, u64>,
    /// Records left in their tier because compensation is pending, per source tier.
    pub skipped_pending_compensation: BTreeMap<String, u64>,
    /// Demotions that lost a compare-and-set (a concurrent sweeper or claim moved the
    /// record first): nothing was changed by them.
    pub lost_races: u64,
    pub archive_rows_expired: u64,
    pub archive_partitions_dropped: Vec<String>,
    /// Lease events older than the policy's `lease_event_window`, deleted (a dry run
    /// neither deletes nor counts them).
    pub lease_events_trimmed: u64,
    pub batches: u64,
    pub elapsed_ms: u64,
    /// The first stale recoveries (all are in the store's event table).
    pub stale_events: Vec<StaleEvent>,
}

impl SweepReport {
    fn new(backend: &str, now: Millis, dry_run: bool) -> Self {
        let mut transitions = BTreeMap::new();
        for t in Tier::ONLINE {
            transitions.insert(transition(t), 0);
        }
        transitions.insert(STALE.to_string(), 0);
        Self {
            backend: backend.to_string(),
            now,
            dry_run,
            lease: LeaseOutcome::NotUsed,
            transitions,
            skipped_pending_compensation: BTreeMap::new(),
            lost_races: 0,
            archive_rows_expired: 0,
            archive_partitions_dropped: Vec::new(),
            lease_events_trimmed: 0,
            batches: 0,
            elapsed_ms: 0,
            stale_events: Vec::new(),
        }
    }

    /// Records moved (or, dry, due) out of `tier`.
    pub fn moved(&self, from: Tier) -> u64 {
        self.transitions
            .get(&transition(from))
            .copied()
            .unwrap_or(0)
    }

    pub fn stale_recovered(&self) -> u64 {
        self.transitions.get(STALE).copied().unwrap_or(0)
    }

    /// Every transition summed.
    pub fn total(&self) -> u64 {
        self.transitions.values().sum()
    }
}

const STALE: &str = "processing->failed_retryable";

/// The report key of a transition out of `from`.
pub fn transition(from: Tier) -> String {
    format!("{}->{}", from, from.next().map_or("-", |t| t.as_str()))
}

/// The sweeper of one store.
#[derive(Clone)]
pub struct Sweeper {
    store: Arc<dyn RetentionStore>,
    policy: RetentionPolicy,
    compensation: Arc<dyn CompensationCheck>,
    lease: Option<Arc<dyn LeaseStore>>,
    lease_metrics: LeaseMetrics,
    metrics: SweepMetrics,
    batch: usize,
    pause: Duration,
    duty: f64,
    gate: Option<tokio::sync::watch::Receiver<bool>>,
    owner: OwnerId,
    lease_ttl: Duration,
}

impl std::fmt::Debug for Sweeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sweeper")
            .field("backend", &self.store.backend())
            .field("policy", &self.policy)
            .field("batch", &self.batch)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

impl Sweeper {
    /// A sweeper with no compensation check, no lease, default batches. The policy is
    /// taken as given: validate it at start-up ([`RetentionPolicy::validate`]).
    pub fn new(store: Arc<dyn RetentionStore>, policy: RetentionPolicy) -> Self {
        Self {
            store,
            policy,
            compensation: Arc::new(NoCompensation),
            lease: None,
            lease_metrics: LeaseMetrics::default(),
            metrics: SweepMetrics::default(),
            batch: DEFAULT_BATCH,
            pause: Duration::ZERO,
            duty: DEFAULT_DUTY,
            gate: None,
            owner: OwnerId::new(format!("sweeper-{}", uuid::Uuid::now_v7().simple()))
                .expect("visible ASCII"),
            lease_ttl: LEASE_TTL,
        }
    }

    pub fn with_compensation(mut self, check: Arc<dyn CompensationCheck>) -> Self {
        self.compensation = check;
        self
    }

    /// Guards runs with the lease [`LEASE_NAME`] in `leases`.
    pub fn with_lease(mut self, leases: Arc<dyn LeaseStore>, metrics: LeaseMetrics) -> Self {
        self.lease = Some(leases);
        self.lease_metrics = metrics;
        self
    }

    pub fn with_metrics(mut self, metrics: SweepMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Records scanned per batch (one transaction per destination tier), at least 1.
    pub fn with_batch(mut self, batch: usize) -> Self {
        self.batch = batch.max(1);
        self
    }

    /// Before each batch, waits while `gate` reads `false` (an operator's hold during a
    /// peak, or a benchmark measuring claims with and without the sweep in turn). A
    /// closed channel counts as open.
    pub fn with_gate(mut self, gate: tokio::sync::watch::Receiver<bool>) -> Self {
        self.gate = Some(gate);
        self
    }

    /// A pause between batches, so claims are never queued behind a long sweep.
    pub fn with_pause(mut self, pause: Duration) -> Self {
        self.pause = pause;
        self
    }

    /// The fraction of wall time the sweep may spend working, in [`MIN_DUTY`, 1]: after
    /// a batch that took `d` it rests `d × (1 − duty) / duty`, so claims sharing the
    /// database are never queued behind a long run of batches. Other values are clamped
    /// (the CLI refuses them).
    pub fn with_duty(mut self, duty: f64) -> Self {
        self.duty = if duty.is_finite() {
            duty.clamp(MIN_DUTY, 1.0)
        } else {
            1.0
        };
        self
    }

    pub fn with_owner(mut self, owner: OwnerId) -> Self {
        self.owner = owner;
        self
    }

    /// How long a run's lease lasts before another sweeper may take over (renewed while
    /// the run works). Default [`LEASE_TTL`].
    pub fn with_lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    pub fn policy(&self) -> &RetentionPolicy {
        &self.policy
    }

    pub fn metrics(&self) -> &SweepMetrics {
        &self.metrics
    }

    /// One sweep. See the crate docs for the order of work.
    pub async fn run(&self, options: &SweepOptions) -> Result<SweepReport, StoreError> {
        let started = Instant::now();
        let store_now = self.store.now().await?;
        let now = options.now.unwrap_or(store_now);
        let mut report = SweepReport::new(self.store.backend(), now, options.dry_run);

        let guard = match &self.lease {
            None => None,
            Some(leases) => {
                let name = LeaseName::new(LEASE_NAME).expect("valid lease name");
                match LeaseGuard::acquire(
                    leases.clone(),
                    &name,
                    &self.owner,
                    self.lease_ttl,
                    Duration::ZERO,
                    self.lease_metrics.clone(),
                )
                .await
                .map_err(|e| StoreError::Unavailable(format!("sweeper lease: {e}")))?
                {
                    Acquired::Guard(g) => {
                        report.lease = LeaseOutcome::Held {
                            token: g.lease().token.get(),
                        };
                        Some(g)
                    }
                    Acquired::Busy { holder, .. } => {
                        report.lease = LeaseOutcome::Busy {
                            holder: holder.owner.to_string(),
                        };
                        report.elapsed_ms = elapsed_ms(started);
                        return Ok(report);
                    }
                }
            }
        };

        let progress = Progress::new(options.progress);
        let outcome = self
            .sweep(
                &mut report,
                now,
                store_now,
                options.dry_run,
                guard.as_ref(),
                &progress,
            )
            .await;
        progress.finish(&report);
        if let Some(g) = guard {
            if let Err(e) = g.release().await {
                tracing::warn!(error = %e, "could not release the sweeper lease");
            }
        }
        report.elapsed_ms = elapsed_ms(started);
        outcome.map(|()| report)
    }

    async fn sweep(
        &self,
        report: &mut SweepReport,
        now: Millis,
        store_now: Millis,
        dry_run: bool,
        guard: Option<&LeaseGuard>,
        progress: &Progress,
    ) -> Result<(), StoreError> {
        let lease_ok = |report: &mut SweepReport| -> bool {
            match guard {
                Some(g) if !g.is_valid() => {
                    tracing::warn!("sweeper lease lost; stopping after the batch in flight");
                    report.lease = LeaseOutcome::Lost {
                        token: g.lease().token.get(),
                    };
                    false
                }
                _ => true,
            }
        };

        // Stale PROCESSING: judged by the store clock, never a later `--now`.
        let lease_before = now
            .min(store_now)
            .saturating_sub(idem_core::retention::millis(self.policy.stale_grace));
        progress.phase("stale");
        loop {
            self.wait_gate().await;
            if !lease_ok(report) {
                return Ok(());
            }
            let worked = Instant::now();
            let stale = self.store.scan_stale(lease_before, self.batch).await?;
            if stale.is_empty() {
                break;
            }
            let full = stale.len() == self.batch;
            let recovered = if dry_run {
                stale
            } else {
                self.store.recover_stale(&stale, lease_before, now).await?
            };
            for s in &recovered {
                self.record_stale(report, s, dry_run);
            }
            *report.transitions.entry(STALE.to_string()).or_default() += recovered.len() as u64;
            report.batches += 1;
            progress.add(recovered.len() as u64);
            // A dry run changes nothing, so the next scan would return the same rows.
            if dry_run || !full {
                break;
            }
            self.between_batches(worked.elapsed()).await;
        }

        for tier in Tier::ONLINE {
            let cutoff = self
                .policy
                .cutoff(tier, now)
                .expect("online tiers have windows");
            progress.phase(tier.as_str());
            let mut cursor = None;
            loop {
                self.wait_gate().await;
                if !lease_ok(report) {
                    return Ok(());
                }
                let worked = Instant::now();
                let due = self
                    .store
                    .scan_due(tier, cutoff, cursor.as_ref(), self.batch)
                    .await?;
                let Some(last) = due.last() else { break };
                cursor = Some(last.cursor());
                let full = due.len() == self.batch;
                // Grouped by destination: a record past several windows moves once.
                let mut groups: BTreeMap<Tier, Vec<Demotion>> = BTreeMap::new();
                for d in &due {
                    if self.pending(d).await? {
                        *report
                            .skipped_pending_compensation
                            .entry(tier.as_str().to_string())
                            .or_default() += 1;
                        self.metrics.skipped_pending(tier);
                        continue;
                    }
                    let to = self.destination(tier, d.record.completed_at, now);
                    groups.entry(to).or_default().push(demotion(d, to));
                }
                let mut applied = 0;
                for (to, batch) in &groups {
                    let n = if dry_run {
                        batch.len() as u64
                    } else {
                        self.store.demote(tier, *to, batch, now).await?
                    };
                    report.lost_races += batch.len() as u64 - n.min(batch.len() as u64);
                    let mut t = tier;
                    while t < *to {
                        *report.transitions.entry(transition(t)).or_default() += n;
                        if !dry_run {
                            self.metrics.transitions(t, n);
                        }
                        t = t.next().expect("only the archive has no next tier");
                    }
                    applied += n;
                }
                report.batches += 1;
                progress.add(applied);
                if !full {
                    break;
                }
                self.between_batches(worked.elapsed()).await;
            }
        }

        if let Some(window) = self.policy.archive_window {
            progress.phase("archive expiry");
            if !lease_ok(report) {
                return Ok(());
            }
            if !dry_run {
                let before = now.saturating_sub(idem_core::retention::millis(window));
                let expired = self.store.expire_archive(before).await?;
                report.archive_rows_expired = expired.rows;
                report.archive_partitions_dropped = expired.partitions_dropped;
                self.metrics.archive_expired(expired.rows);
            }
        }

        // The lease evidence, judged by the store clock (never a later `--now`): events
        // are deleted, not moved, so a simulated future must not reach them.
        let trim = self.policy.lease_event_window.zip(self.lease.as_ref());
        if let (Some((window, leases)), false) = (trim, dry_run) {
            progress.phase("lease events");
            let before = now
                .min(store_now)
                .saturating_sub(idem_core::retention::millis(window));
            loop {
                self.wait_gate().await;
                if !lease_ok(report) {
                    return Ok(());
                }
                let worked = Instant::now();
                let n = leases
                    .trim_events(before, self.batch)
                    .await
                    .map_err(lease_store_error)?;
                report.lease_events_trimmed += n;
                report.batches += 1;
                progress.add(n);
                if n < self.batch as u64 {
                    break;
                }
                self.between_batches(worked.elapsed()).await;
            }
        }
        Ok(())
    }

    fn record_stale(&self, report: &mut SweepReport, s: &StaleRecord, dry_run: bool) {
        if !dry_run {
            tracing::warn!(
                scope = %s.scope,
                owner = ?s.owner.as_ref().map(|o| o.as_str()),
                lease_expires_at = s.lease_expires_at,
                "stale PROCESSING record turned FAILED_RETRYABLE"
            );
            self.metrics.stale_recovered();
        }
        if report.stale_events.len() < REPORTED_EVENTS {
            report.stale_events.push(StaleEvent {
                tenant: s.scope.tenant.to_string(),
                key: s.scope.key.to_string(),
                owner: s.owner.as_ref().map(ToString::to_string),
                lease_expires_at: s.lease_expires_at,
            });
        }
    }

    async fn pending(&self, d: &DueRecord) -> Result<bool, StoreError> {
        match d
            .record
            .result
            .as_ref()
            .and_then(|r| r.result_ref.as_deref())
        {
            Some(r) => self.compensation.pending(&d.record.tenant, r).await,
            None => Ok(false),
        }
    }

    /// The deepest tier a record completed at `completed_at` belongs in by `now`,
    /// starting one below `from` (the scan already found it past `from`'s window).
    fn destination(&self, from: Tier, completed_at: Option<Millis>, now: Millis) -> Tier {
        let mut to = from.next().expect("online tiers have a next tier");
        let Some(completed) = completed_at else {
            return to;
        };
        while let (Some(next), Some(cutoff)) = (to.next(), self.policy.cutoff(to, now)) {
            if completed >= cutoff {
                break;
            }
            to = next;
        }
        to
    }

    /// Rest after a batch that took `worked`: the fixed pause plus the duty-cycle rest.
    async fn between_batches(&self, worked: Duration) {
        let rest = self
            .pause
            .saturating_add(worked.mul_f64((1.0 - self.duty) / self.duty));
        if rest.is_zero() {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(rest).await;
        }
    }

    /// Waits while the gate is held (before every batch).
    async fn wait_gate(&self) {
        if let Some(gate) = &self.gate {
            let mut gate = gate.clone();
            // Err: the sender is gone, nobody can close the gate any more.
            let _ = gate.wait_for(|open| *open).await;
        }
    }

    /// Runs a sweep every `every` until the returned handle is dropped or aborted: the
    /// background task of `idem serve`. Errors are logged and retried next round; the
    /// lease keeps several instances from sweeping at once.
    pub fn spawn(self, every: Duration) -> BackgroundSweep {
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match self.run(&SweepOptions::default()).await {
                    Ok(r) => tracing::info!(
                        moved = r.total(),
                        lease = ?r.lease,
                        elapsed_ms = r.elapsed_ms,
                        "sweep finished"
                    ),
                    Err(e) => tracing::warn!(error = %e, "sweep failed; retrying next round"),
                }
            }
        });
        BackgroundSweep { task }
    }
}

/// The background sweep task; dropping it stops the task.
#[derive(Debug)]
pub struct BackgroundSweep {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for BackgroundSweep {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The compare-and-set that moves `d` down to tier `to`.
pub fn demotion(d: &DueRecord, to: Tier) -> Demotion {
    let rec = &d.record;
    let (result, archive) = match to {
        Tier::Archive => (None, Some(ArchivedRecord::of(rec))),
        // Drop the response (if still there); keep status, reference and a digest of
        // what was dropped, and mark the tier.
        Tier::Retry | Tier::Replay | Tier::Dispute => (
            rec.result.as_ref().map(|r| {
                let digest = dropped_digest(r).unwrap_or_else(|| result_digest(r));
                dropped_result(r, digest, to)
            }),
            None,
        ),
    };
    debug_assert!(result
        .as_ref()
        .is_none_or(|r| dropped_response(r).is_some()));
    Demotion {
        scope: idem_core::Scope::new(rec.tenant.clone(), rec.key.clone()),
        version: rec.version,
        result,
        archive,
    }
}

/// A lease store's failure as the sweep's error (same retryable / not retryable split).
fn lease_store_error(e: idem_core::LeaseError) -> StoreError {
    match e {
        idem_core::LeaseError::Unavailable(m) => {
            StoreError::Unavailable(format!("lease events: {m}"))
        }
        other => StoreError::Backend(format!("lease events: {other}")),
    }
}

fn elapsed_ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// A spinner with counts on a terminal; nothing otherwise.
struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    fn new(wanted: bool) -> Self {
        let bar = (wanted && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::new_spinner();
            bar.set_style(
                ProgressStyle::with_template(
                    "{spinner} sweep [{elapsed}] {msg}: {pos} moved ({per_sec})",
                )
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Self { bar }
    }

    fn phase(&self, name: &str) {
        if let Some(b) = &self.bar {
            b.set_message(name.to_string());
        }
    }

    fn add(&self, n: u64) {
        if let Some(b) = &self.bar {
            b.inc(n);
        }
    }

    fn finish(&self, report: &SweepReport) {
        if let Some(b) = &self.bar {
            b.finish_with_message(format!("done ({} transitions)", report.total()));
        }
    }
}
