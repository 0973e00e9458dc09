//! `idem sweep`: the retention sweeper from the command line (`idem bench sweep` is
//! `bench::sweep`'s).
//!
//! The policy comes from the environment (`idem_sweep::config`) and is validated before
//! anything runs. SQLite and PostgreSQL are swept; Redis records expire by TTL (the
//! retention window) and have nothing to sweep (see `idem_redis::retention`).

use std::process::ExitCode;
use std::sync::Arc;

use idem_core::{IdempotencyStore, LeaseStore, Millis, RetentionStore, StoreError, Tier};
use idem_sql::{OpenOptions, Store};
use idem_sweep::{SweepOptions, SweepReport, Sweeper};

use crate::cli::{print_json, rfc3339, CliResult};
use crate::open::{backend_of, Backend};

#[derive(clap::Args)]
pub struct SweepArgs {
    /// Count what would move; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Sweep as of this time (RFC 3339) instead of the store's clock. The stale
    /// PROCESSING scan never uses a time ahead of the store's clock.
    #[arg(long)]
    now: Option<String>,
    /// Print the summary (counts per transition) as JSON.
    #[arg(long)]
    json: bool,
    /// Share of wall time spent working, in [0.01, 1]: after each batch the sweep rests
    /// so claims on the same database keep their latency.
    #[arg(long, default_value_t = idem_sweep::DEFAULT_DUTY, value_parser = parse_duty)]
    duty: f64,
}

/// `--duty`: a share of wall time in [MIN_DUTY, 1].
pub fn parse_duty(text: &str) -> Result<f64, String> {
    let v: f64 = text
        .parse()
        .map_err(|e| format!("{text:?} is not a number: {e}"))?;
    if v.is_finite() && (idem_sweep::MIN_DUTY..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "{text} is outside [{}, 1]; 1 means no rest between batches",
            idem_sweep::MIN_DUTY
        ))
    }
}

type Stores = (
    Arc<dyn IdempotencyStore>,
    Arc<dyn RetentionStore>,
    Arc<dyn LeaseStore>,
);

pub fn redis_has_nothing_to_sweep() -> StoreError {
    StoreError::InvalidInput(
        "Redis records expire by TTL when their retention window ends; there are no tiers \
         or archive to sweep there (see idem_redis::retention)"
            .into(),
    )
}

/// Opens the store behind `url` as claim, retention and lease store.
pub async fn open(url: &str) -> Result<Stores, StoreError> {
    open_with(url, &OpenOptions::default()).await
}

async fn open_with(url: &str, options: &OpenOptions) -> Result<Stores, StoreError> {
    // Refused before connecting: the explanation, not a connection error.
    if backend_of(url)? == Backend::Redis {
        return Err(redis_has_nothing_to_sweep());
    }
    roles(&Store::open(url, options).await?)
}

fn roles(store: &Store) -> Result<Stores, StoreError> {
    let retention = store.retention().ok_or_else(redis_has_nothing_to_sweep)?;
    Ok((store.records(), retention, store.leases()))
}

/// Parses `--now` (RFC 3339) to epoch milliseconds.
pub fn parse_now(text: &str) -> Result<Millis, StoreError> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp_millis())
        .map_err(|e| StoreError::InvalidInput(format!("--now {text:?}: {e} (use RFC 3339)")))
}

/// `idem sweep`.
pub async fn run(url: &str, args: SweepArgs) -> CliResult {
    let (policy, _sources) = idem_sweep::config::from_env().map_err(StoreError::InvalidInput)?;
    let now = args.now.as_deref().map(parse_now).transpose()?;
    let (_, retention, leases) = open(url).await?;
    let sweeper = Sweeper::new(retention, policy)
        .with_lease(leases, idem_lease::LeaseMetrics::default())
        .with_duty(args.duty);
    let report = sweeper
        .run(&SweepOptions {
            dry_run: args.dry_run,
            now,
            progress: !args.json,
        })
        .await?;
    if args.json {
        print_json(&report);
    } else {
        print_human(&report);
    }
    Ok(match report.lease {
        idem_sweep::LeaseOutcome::Busy { .. } | idem_sweep::LeaseOutcome::Lost { .. } => {
            ExitCode::FAILURE
        }
        _ => ExitCode::SUCCESS,
    })
}

pub fn print_human(r: &SweepReport) {
    let verb = if r.dry_run { "would move" } else { "moved" };
    println!(
        "sweep of {} as of {}{}",
        r.backend,
        rfc3339(r.now),
        if r.dry_run { " (dry run)" } else { "" }
    );
    match &r.lease {
        idem_sweep::LeaseOutcome::Busy { holder } => {
            println!("  another sweeper ({holder}) holds the lease; nothing done");
            return;
        }
        idem_sweep::LeaseOutcome::Lost { token } => {
            println!("  lease (token {token}) lost mid-run; stopped after the batch in flight")
        }
        _ => {}
    }
    let mut order: Vec<String> = Tier::ONLINE
        .iter()
        .map(|t| idem_sweep::transition(*t))
        .collect();
    order.push("processing->failed_retryable".into());
    for transition in order {
        let n = r.transitions.get(&transition).copied().unwrap_or(0);
        println!("  {transition:<30} {verb} {n}");
    }
    for (tier, n) in &r.skipped_pending_compensation {
        println!("  kept in {tier} (compensation pending): {n}");
    }
    if r.lost_races > 0 {
        println!("  lost to a concurrent writer: {}", r.lost_races);
    }
    if r.archive_rows_expired > 0 || !r.archive_partitions_dropped.is_empty() {
        println!(
            "  archive rows expired: {} (partitions dropped: {})",
            r.archive_rows_expired,
            r.archive_partitions_dropped.join(", ")
        );
    }
    if r.lease_events_trimmed > 0 {
        println!(
            "  lease events past their window deleted: {}",
            r.lease_events_trimmed
        );
    }
    println!(
        "  {} batches in {} ms; {} to the archive",
        r.batches,
        r.elapsed_ms,
        r.moved(Tier::Dispute)
    );
}
