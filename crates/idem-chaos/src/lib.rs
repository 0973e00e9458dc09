//! idem-chaos: exactly-once checked under faults on the real topology.
//!
//! A campaign starts `idem serve` processes on one fresh database (PostgreSQL or
//! MySQL/MariaDB, see [`db`]) and
//! `idem gateway` processes sharing one Redis window, all children of the `idem` binary;
//! drives a seeded workload of virtual users through the gateways with the requester
//! client; injects faults on a seeded schedule; lets the system settle; then checks the
//! ledgers and the workload log against invariants I1–I8 (see `docs/CHAOS.md`).
//!
//! The checker reads the database with its own SQL and the client-side log only: it
//! shares no code with what it checks. Nothing here writes business rows.

pub mod check;
pub mod db;
pub mod faults;
pub mod html;
pub mod proxy;
pub mod report;
pub mod topology;
pub mod workload;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use faults::FaultKind;
pub use report::{Anomaly, Availability, Bucket, FaultEvent, InvariantResult, Report};

#[derive(Debug, thiserror::Error)]
pub enum ChaosError {
    /// The command line asks for something impossible.
    #[error("{0}")]
    Usage(String),
    /// The topology could not be started (a server missing, a child failing to start).
    #[error("setting up the campaign: {0}")]
    Setup(String),
    /// The ledgers could not be read.
    #[error("checking: {0}")]
    Check(String),
    /// SIGINT or SIGTERM: the campaign stopped and removed what it had started.
    #[error("interrupted; everything the campaign started was removed")]
    Interrupted,
}

#[derive(Debug, Clone)]
pub struct ChaosOptions {
    /// The `idem` binary the children run.
    pub bin: PathBuf,
    pub duration: Duration,
    pub seed: u64,
    pub services: usize,
    pub gateways: usize,
    pub users: usize,
    pub servers: topology::Servers,
    pub faults: Vec<FaultKind>,
    /// Creates through the keyless legacy route: the checker must find duplicates.
    pub control_legacy: bool,
    /// Draw a progress bar on stderr (only shown on a terminal).
    pub progress: bool,
    /// Write every intent and every answer its sends got here, one JSON object per line.
    pub workload_log: Option<PathBuf>,
    /// Keep the campaign's database when an anomaly was found, for investigation.
    pub keep_database: bool,
}

/// How long intents still in flight may keep retrying once the faults stop, and how
/// long the chain gets to drain after that.
const SETTLE_INTENTS: Duration = Duration::from_secs(30);
const SETTLE_CHAIN: Duration = Duration::from_secs(30);

/// Runs one campaign and removes everything it started, whatever the outcome; when
/// `interrupt` resolves first (the caller's SIGINT/SIGTERM), the campaign stops and
/// [`ChaosError::Interrupted`] says so.
pub async fn run(
    options: ChaosOptions,
    interrupt: impl std::future::Future<Output = ()>,
) -> Result<(Report, PathBuf), ChaosError> {
    if options.services == 0 || options.gateways == 0 || options.users == 0 {
        return Err(ChaosError::Usage(
            "--services, --gateways and --users must be at least 1".into(),
        ));
    }
    if options.duration < Duration::from_secs(5) {
        return Err(ChaosError::Usage("--duration must be at least 5s".into()));
    }
    let mut topo = topology::Topology::create(options.bin.clone(), &options.servers).await?;
    let dir = topo.dir.clone();
    let result = tokio::select! {
        r = async {
            topo.start_processes(options.services, options.gateways, options.control_legacy)
                .await?;
            campaign(&mut topo, &options).await
        } => r,
        _ = interrupt => Err(ChaosError::Interrupted),
    };
    let keep = options.keep_database && matches!(&result, Ok(r) if !r.passed);
    if keep {
        eprintln!(
            "idem chaos: database {} kept for investigation",
            topo.db_name
        );
    }
    topo.teardown(keep).await;
    // Logs stay for a failed campaign (and a control that found nothing).
    let expected = |r: &Report| match r.control {
        None => r.passed,
        Some(_) => r.anomalies_by_invariant.get("I2").copied().unwrap_or(0) > 0,
    };
    if matches!(&result, Ok(r) if expected(r)) {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result.map(|r| (r, dir))
}

async fn campaign(topo: &mut topology::Topology, o: &ChaosOptions) -> Result<Report, ChaosError> {
    topo.create_shows(&workload::SHOWS, workload::STOCK).await?;
    let started = Instant::now();
    let plan = faults::schedule(o.seed, o.duration, &o.faults);
    let log = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Arc::new(Mutex::new(Duration::MAX));
    let workload = workload::Workload {
        gateways: topo.gateway_urls(),
        api_key: topo.api_key.clone(),
        seed: o.seed,
        users: o.users,
        legacy: o.control_legacy,
        started,
        stop: stop.clone(),
        deadline: deadline.clone(),
        log: log.clone(),
    };
    let load = tokio::spawn(async move { workload.run().await });
    let progress = progress_bar(o, log.clone(), started);

    let mut injector = faults::Injector {
        topo: &mut *topo,
        started,
        events: Vec::new(),
    };
    let injected = injector.run(&plan, o.duration).await;
    let events = std::mem::take(&mut injector.events);
    if let Some(rest) = o.duration.checked_sub(started.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    let active = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    *deadline.lock().expect("deadline lock") = active + SETTLE_INTENTS;
    if let Some(p) = &progress {
        p.set_message("settling");
    }
    // Faults end before anything is judged: every process running, every link passing.
    let healed = topo.heal().await;
    let _ = load.await;
    injected?;
    healed?;
    let intents_done = started.elapsed() - active;
    settle_chain(&topo.db_url).await;
    let settle = started.elapsed() - active;
    if let Some(p) = progress {
        p.finish_and_clear();
    }

    let mut ledgers = check::Ledgers::read(&topo.db_url, &topo.tenant).await?;
    ledgers.observed.extend(topo.scrape_metrics().await);
    let log = log.lock().expect("log lock").clone();
    if let Some(path) = &o.workload_log {
        write_log(path, &log)?;
    }
    let (invariants, anomalies) = check::check(&log, &ledgers, &events, o.control_legacy);
    let mut report = report(
        o, topo, &log, ledgers, events, invariants, anomalies, active, settle,
    );
    report
        .observed
        .insert("settle_intents_ms".into(), intents_done.as_millis() as u64);
    Ok(report)
}

#[allow(clippy::too_many_arguments)]
fn report(
    o: &ChaosOptions,
    topo: &topology::Topology,
    log: &[workload::IntentLog],
    ledgers: check::Ledgers,
    faults: Vec<FaultEvent>,
    invariants: Vec<InvariantResult>,
    anomalies: Vec<Anomaly>,
    active: Duration,
    settle: Duration,
) -> Report {
    let intents = log.len() as u64;
    let acknowledged = log.iter().filter(|i| i.acknowledged).count() as u64;
    let answered = log.iter().filter(|i| check::answered(i)).count() as u64;
    let ratio = |n: u64| {
        if intents == 0 {
            0.0
        } else {
            n as f64 / intents as f64
        }
    };
    let mut faults_by_kind = BTreeMap::new();
    for k in &o.faults {
        faults_by_kind.insert(k.as_str().to_string(), 0);
    }
    for f in &faults {
        *faults_by_kind.entry(f.kind.clone()).or_insert(0) += 1;
    }
    let mut anomalies_by_invariant = BTreeMap::new();
    for a in &anomalies {
        *anomalies_by_invariant
            .entry(a.invariant.clone())
            .or_insert(0) += 1;
    }
    let mut buckets: BTreeMap<u64, Bucket> = BTreeMap::new();
    let mut attempts = 0u64;
    let mut observed = ledgers.observed;
    for i in log {
        for s in &i.sends {
            attempts += u64::from(s.attempts.max(1));
            let b = buckets.entry(s.end_ms / 1000).or_default();
            b.second = s.end_ms / 1000;
            let failed_tries = u64::from(s.attempts.max(1)) - u64::from(s.ok());
            b.retried += failed_tries;
            if s.ok() {
                b.ok += 1;
                b.replayed += u64::from(s.replayed);
            }
        }
        *observed.entry("double_clicks".into()).or_default() += u64::from(i.double_click);
        *observed.entry("refused_intents".into()).or_default() += u64::from(i.refused.is_some());
    }
    observed.insert(
        "replayed_answers".into(),
        log.iter()
            .flat_map(|i| &i.sends)
            .filter(|s| s.ok() && s.replayed)
            .count() as u64,
    );
    let restarts: u32 = topo
        .services
        .iter()
        .chain(topo.gateways.iter())
        .map(|n| n.restarts)
        .sum();
    observed.insert("process_restarts".into(), u64::from(restarts));
    // A child exiting on its own under faults is a defect to look into (logs are kept).
    let crashes: u32 = topo
        .services
        .iter()
        .chain(topo.gateways.iter())
        .map(|n| n.crashes)
        .sum();
    observed.insert("unexpected_exits".into(), u64::from(crashes));
    let faulted: u64 = topo
        .to_service
        .iter()
        .chain(topo.to_database.iter())
        .chain(std::iter::once(&topo.to_redis))
        .map(|p| p.stats().faulted)
        .sum();
    observed.insert("connections_faulted".into(), faulted);
    let completed = log
        .iter()
        .flat_map(|i| &i.sends)
        .filter(|s| s.completed())
        .map(|s| s.end_ms)
        .collect();
    let availability_by_fault = report::availability_by_fault(
        faults_by_kind.keys().map(String::as_str),
        &faults,
        completed,
        active.as_millis() as u64,
    );
    let passed = anomalies.is_empty();
    Report {
        seed: o.seed,
        control: o.control_legacy.then(|| "legacy".to_string()),
        services: o.services,
        gateways: o.gateways,
        nats: o.servers.nats_url.is_some(),
        duration_ms: active.as_millis() as u64,
        settle_ms: settle.as_millis() as u64,
        intents,
        acknowledged,
        acknowledged_ratio: ratio(acknowledged),
        answered,
        answered_ratio: ratio(answered),
        attempts,
        faults_by_kind,
        faults,
        availability_by_fault,
        invariants,
        anomalies_by_invariant,
        anomalies,
        arrivals: buckets.into_values().collect(),
        observed,
        passed,
    }
}

fn write_log(path: &std::path::Path, log: &[workload::IntentLog]) -> Result<(), ChaosError> {
    let mut text = String::new();
    for i in log {
        text.push_str(&serde_json::to_string(i).map_err(|e| ChaosError::Check(e.to_string()))?);
        text.push('\n');
    }
    std::fs::write(path, text)
        .map_err(|e| ChaosError::Usage(format!("cannot write {}: {e}", path.display())))
}

/// Waits until the automatic chain has finished what the workload started: every
/// outbox message published, every paid order ticketed, every cancelled order's hold
/// released, no claim left PROCESSING past its lease. Gives up after [`SETTLE_CHAIN`]
/// (what is left then is for the checker to report).
async fn settle_chain(db_url: &str) {
    let deadline = Instant::now() + SETTLE_CHAIN;
    let Ok(mut c) = db::Db::connect(db_url).await else {
        return;
    };
    while Instant::now() < deadline {
        let rest = c
            .count(
                "SELECT (SELECT count(*) FROM outbox_messages WHERE published_at IS NULL) \
                 + (SELECT count(*) FROM idem_records WHERE state = 'PROCESSING')",
                &[],
            )
            .await;
        let chain = faults::chain_work(&mut c).await;
        if matches!((rest, chain), (Ok(0), Ok(0))) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    c.close().await;
}

fn progress_bar(
    o: &ChaosOptions,
    log: Arc<Mutex<Vec<workload::IntentLog>>>,
    started: Instant,
) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if !o.progress || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(o.duration.as_secs());
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} [{bar:30}] {pos}/{len} s {msg}")
            .expect("static template")
            .progress_chars("=> "),
    );
    let b = bar.clone();
    tokio::spawn(async move {
        while !b.is_finished() {
            let (n, ok) = {
                let l = log.lock().expect("log lock");
                (l.len(), l.iter().filter(|i| i.acknowledged).count())
            };
            b.set_position(started.elapsed().as_secs());
            if b.message() != "settling" {
                b.set_message(format!("{n} intents, {ok} acknowledged"));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    Some(bar)
}
