//! `idem bench sweep`: sweeping N expired records, and what it costs the claims running
//! beside it — measured in the same run.
//!
//! 1. Seeds `records` SUCCEEDED records completed 100 days ago (bulk insert), so every
//!    one walks retry → replay → dispute → archive in the sweep.
//! 2. `concurrency` workers claim and complete fresh keys while one sweep runs, held
//!    and released in alternating slices (`Sweeper::with_gate`): claim latencies are
//!    recorded apart for slices with and without the sweep, so both see the same table,
//!    checkpoint and cache state (a baseline taken before the sweep would flatter it
//!    or damn it by whatever the database does over minutes). The first moments of
//!    each slice, while a batch may still be in flight, are left out. Reported: records
//!    per second of sweeping, claim p99 with / without the sweep (target ≤ 1.5×).
//! 3. Bytes per record in each tier: retry measured on the seeded records before the
//!    sweep, archive after it, replay and dispute on a sample stepped through the tiers
//!    with the sweep's `now`.
//!
//! It drives [`Sweeper`] through its public builder only and writes only under tenants
//! of its own (`bench-sweep-…`, `bench-claims-…`, `bench-sample-…`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_core::retention::millis;
use idem_core::{
    Claim, ClaimRequest, Fingerprint, IdempotencyKey, IdempotencyStore, OwnerId, Principal,
    RetentionPolicy, Scope, StoreError, StoredResult, TenantId, Tier, TierUsage,
};
use serde::Serialize;

use crate::saturation::{Meter, Saturation};
use idem_sql::SqlStore;
use idem_sweep::{SweepOptions, SweepReport, Sweeper};

const DAY_MS: i64 = 86_400_000;

#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub records: u64,
    pub concurrency: usize,
    /// Length of each slice with and each without the sweep.
    pub slice: Duration,
    pub batch: usize,
    pub pause: Duration,
    /// The sweeper's share of wall time ([`Sweeper::with_duty`]).
    pub duty: f64,
    pub body_bytes: usize,
    /// Records stepped through the tiers to measure replay and dispute sizes.
    pub sample: u64,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            records: 1_000_000,
            concurrency: 16,
            slice: Duration::from_secs(2),
            batch: idem_sweep::DEFAULT_BATCH,
            pause: Duration::ZERO,
            duty: idem_sweep::DEFAULT_DUTY,
            body_bytes: 256,
            sample: 2_000,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Latency {
    pub count: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
    pub per_sec: f64,
}

impl Latency {
    fn of(mut samples: Vec<Duration>, over: Duration) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort();
        let at = |q: f64| {
            let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
            u64::try_from(samples[i].as_micros()).unwrap_or(u64::MAX)
        };
        Self {
            count: samples.len() as u64,
            p50_us: at(0.50),
            p99_us: at(0.99),
            max_us: at(1.0),
            per_sec: samples.len() as f64 / over.as_secs_f64().max(1e-9),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub backend: String,
    pub records: u64,
    pub batch: usize,
    pub duty: f64,
    pub seed_ms: u64,
    pub sweep_ms: u64,
    /// Seeded records fully walked to the archive per second of sweep.
    pub records_per_sec: f64,
    /// Tier transitions per second (three per record, counted even when a record moves
    /// to the archive in one write).
    pub transitions_per_sec: f64,
    pub claims_without_sweep: Latency,
    pub claims_during_sweep: Latency,
    /// claim p99 during the sweep / without it; `None` when either side has no claims
    /// (a sweep that ends within the settling part of its first slice: seed more).
    pub p99_ratio: Option<f64>,
    pub target_ratio: f64,
    pub bytes_per_record: Vec<TierUsage>,
    pub sweep: SweepReport,
    /// What the sweep (with the claims beside it) was limited by.
    pub saturation: Saturation,
}

/// Runs the benchmark on `sql`: claims and retention on the same database, seeded
/// through the store's own fixture.
pub async fn bench(sql: &SqlStore, options: BenchOptions) -> Result<BenchReport, StoreError> {
    let store = sql.records();
    let retention = sql.retention();
    let run = uuid::Uuid::now_v7().simple().to_string();
    let tenant = TenantId::new(format!("bench-sweep-{run}")).expect("tenant");
    let now = retention.now().await?;

    let seeded = Instant::now();
    sql.seed_terminal(
        &tenant,
        "k-",
        options.records,
        now - 100 * DAY_MS,
        options.body_bytes,
    )
    .await?;
    let seed_ms = elapsed_ms(seeded);
    let before = retention.usage().await?;

    let claims_tenant = TenantId::new(format!("bench-claims-{run}")).expect("tenant");
    let (open_tx, gate) = tokio::sync::watch::channel(false);
    let sweeper = Sweeper::new(retention.clone(), RetentionPolicy::default())
        .with_batch(options.batch)
        .with_pause(options.pause)
        .with_duty(options.duty)
        .with_gate(gate);
    let done = Arc::new(AtomicBool::new(false));
    // Slices: even without the sweep, odd with it; the sweep's working time is the sum
    // of the odd slices up to the moment it ends.
    let clock = Arc::new(SliceClock::new());
    let meter = Meter::start();
    let sweep = {
        let done = done.clone();
        let sweeper = sweeper.clone();
        let clock = clock.clone();
        tokio::spawn(async move {
            let report = sweeper.run(&SweepOptions::default()).await;
            let spent = (clock.time_in(1), clock.time_in(0));
            done.store(true, Ordering::SeqCst);
            (report, spent)
        })
    };
    let toggler = {
        let clock = clock.clone();
        let done = done.clone();
        let slice = options.slice;
        tokio::spawn(async move {
            let mut n = 0u64;
            while !done.load(Ordering::SeqCst) {
                tokio::time::sleep(slice).await;
                n += 1;
                clock.enter(n);
                let _ = open_tx.send(n % 2 == 1);
            }
            let _ = open_tx.send(true);
        })
    };
    let stop = done.clone();
    let samples = claim_load(
        &store,
        &claims_tenant,
        "b",
        options.concurrency,
        clock.clone(),
        move || stop.load(Ordering::SeqCst),
    )
    .await;
    let (report, (sweep_took, quiet_took)) = sweep
        .await
        .map_err(|e| StoreError::Backend(format!("sweep task: {e}")))?;
    let _ = toggler.await;
    let saturation = meter.stop(crate::http::store_limit(retention.backend()));
    let report = report?;
    let samples = samples?;
    let (with, without): (Vec<_>, Vec<_>) = samples.into_iter().partition(|s| s.slice % 2 == 1);
    let settle = options.slice / 4;
    let keep = |v: Vec<Sample>| -> Vec<Duration> {
        v.into_iter()
            .filter(|s| s.into_slice >= settle)
            .map(|s| s.took)
            .collect()
    };
    let during = Latency::of(keep(with), sweep_took);
    let baseline = Latency::of(keep(without), quiet_took);
    let after = retention.usage().await?;

    // Replay and dispute sizes: a sample stepped through the tiers by `now`.
    let sample_tenant = TenantId::new(format!("bench-sample-{run}")).expect("tenant");
    let base = retention.now().await?;
    sql.seed_terminal(
        &sample_tenant,
        "s-",
        options.sample,
        base,
        options.body_bytes,
    )
    .await?;
    let policy = RetentionPolicy::default();
    // Not measured: no rest between batches, no gate.
    let sweeper = Sweeper::new(retention.clone(), RetentionPolicy::default())
        .with_batch(options.batch)
        .with_duty(1.0);
    let step = |days: i64| SweepOptions {
        now: Some(base + days * DAY_MS + 1),
        ..SweepOptions::default()
    };
    sweeper
        .run(&step(millis(policy.retry_window) / DAY_MS + 1))
        .await?;
    let replay = retention.usage().await?;
    sweeper
        .run(&step(millis(policy.replay_window) / DAY_MS + 1))
        .await?;
    let dispute = retention.usage().await?;

    let pick = |usage: &[TierUsage], tier: Tier| {
        usage
            .iter()
            .find(|u| u.tier == tier)
            .cloned()
            .unwrap_or(TierUsage {
                tier,
                records: 0,
                bytes_per_record: 0.0,
            })
    };
    let bytes_per_record = vec![
        pick(&before, Tier::Retry),
        pick(&replay, Tier::Replay),
        pick(&dispute, Tier::Dispute),
        pick(&after, Tier::Archive),
    ];
    let secs = sweep_took.as_secs_f64().max(1e-9);
    let p99_ratio = (during.count > 0 && baseline.p99_us > 0)
        .then(|| during.p99_us as f64 / baseline.p99_us as f64);
    Ok(BenchReport {
        backend: retention.backend().to_string(),
        records: options.records,
        batch: options.batch,
        duty: options.duty,
        seed_ms,
        sweep_ms: u64::try_from(sweep_took.as_millis()).unwrap_or(u64::MAX),
        records_per_sec: report.moved(Tier::Dispute) as f64 / secs,
        transitions_per_sec: (report.moved(Tier::Retry)
            + report.moved(Tier::Replay)
            + report.moved(Tier::Dispute)) as f64
            / secs,
        claims_without_sweep: baseline,
        claims_during_sweep: during,
        p99_ratio,
        target_ratio: 1.5,
        bytes_per_record,
        sweep: report,
        saturation,
    })
}

/// One claim's latency and the slice it ran in.
struct Sample {
    slice: u64,
    /// How far into its slice the claim started.
    into_slice: Duration,
    took: Duration,
}

/// The current slice, and the time spent in even (no sweep) and odd (sweep) slices.
struct SliceClock {
    state: Mutex<(u64, Instant, [Duration; 2])>,
}

impl SliceClock {
    fn new() -> Self {
        Self {
            state: Mutex::new((0, Instant::now(), [Duration::ZERO; 2])),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, Instant, [Duration; 2])> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn enter(&self, slice: u64) {
        let mut s = self.lock();
        let spent = s.1.elapsed();
        let parity = (s.0 % 2) as usize;
        s.2[parity] += spent;
        s.0 = slice;
        s.1 = Instant::now();
    }

    fn now(&self) -> (u64, Duration) {
        let s = self.lock();
        (s.0, s.1.elapsed())
    }

    /// Time spent in slices of this parity (0: without the sweep, 1: with it).
    fn time_in(&self, parity: u64) -> Duration {
        let s = self.lock();
        let mut t = s.2[(parity % 2) as usize];
        if s.0 % 2 == parity % 2 {
            t += s.1.elapsed();
        }
        t
    }
}

/// `concurrency` workers claiming and completing fresh keys until `stop` says so.
/// Returns each claim's latency with its slice; a claim that straddled two slices is
/// left out.
async fn claim_load(
    store: &Arc<dyn IdempotencyStore>,
    tenant: &TenantId,
    phase: &str,
    concurrency: usize,
    clock: Arc<SliceClock>,
    stop: impl Fn() -> bool + Send + Sync + Clone + 'static,
) -> Result<Vec<Sample>, StoreError> {
    let mut workers = Vec::new();
    for w in 0..concurrency.max(1) {
        let store = store.clone();
        let tenant = tenant.clone();
        let stop = stop.clone();
        let clock = clock.clone();
        let phase = phase.to_string();
        workers.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut n = 0u64;
            while !stop() {
                n += 1;
                let req = ClaimRequest {
                    scope: Scope::new(
                        tenant.clone(),
                        IdempotencyKey::new(format!("{phase}-{w}-{n}")).expect("key"),
                    ),
                    principal: Principal::new("bench").expect("principal"),
                    fingerprint: Fingerprint::of_bytes(b"bench"),
                    owner: OwnerId::new(format!("w{w}")).expect("owner"),
                    lease: Duration::from_secs(30),
                };
                let (slice, into_slice) = clock.now();
                let t = Instant::now();
                let claim = store.claim(&req).await?;
                let took = t.elapsed();
                if clock.now().0 == slice {
                    samples.push(Sample {
                        slice,
                        into_slice,
                        took,
                    });
                }
                if let Claim::Proceed(token) = claim {
                    store
                        .complete(
                            &token,
                            StoredResult {
                                status: 201,
                                headers: Vec::new(),
                                body: b"{}".to_vec(),
                                result_ref: Some(format!("order-{phase}-{w}-{n}")),
                            },
                        )
                        .await?;
                }
            }
            Ok::<_, StoreError>(samples)
        }));
    }
    let mut all = Vec::new();
    for w in workers {
        all.extend(
            w.await
                .map_err(|e| StoreError::Backend(format!("claim worker: {e}")))??,
        );
    }
    Ok(all)
}

fn elapsed_ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Human-readable summary.
pub fn print_human(r: &BenchReport) {
    println!(
        "sweep bench on {}: {} expired records (seeded in {} ms)",
        r.backend, r.records, r.seed_ms
    );
    println!(
        "  sweep          {} ms, {:.0} records/s to the archive, {:.0} transitions/s \
         (batches of {}, duty {:.2})",
        r.sweep_ms, r.records_per_sec, r.transitions_per_sec, r.batch, r.duty
    );
    let l = |name: &str, x: &Latency| {
        println!(
            "  {name:<14} {} claims, {:.0}/s, p50 {} µs, p99 {} µs, max {} µs",
            x.count, x.per_sec, x.p50_us, x.p99_us, x.max_us
        )
    };
    l("claims alone", &r.claims_without_sweep);
    l("claims + sweep", &r.claims_during_sweep);
    println!("  saturated      {}", r.saturation.saturated);
    match r.p99_ratio {
        Some(ratio) => println!(
            "  claim p99 ratio {ratio:.2}× (target ≤ {:.1}×)",
            r.target_ratio
        ),
        None => println!(
            "  claim p99 ratio not measured: the sweep ended before claims were sampled \
             beside it (seed more records)"
        ),
    }
    for u in &r.bytes_per_record {
        println!(
            "  tier {:<8} {:>8.1} bytes/record ({} records measured)",
            u.tier.as_str(),
            u.bytes_per_record,
            u.records
        );
    }
}
