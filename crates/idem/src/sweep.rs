//! `idem sweep` and `idem bench sweep`: the retention sweeper from the command line.
//!
//! The policy comes from the environment (`idem_sweep::config`) and is validated before
//! anything runs. SQLite and PostgreSQL are swept; Redis records expire by TTL (the
//! retention window) and have nothing to sweep (see `idem_redis::retention`).

use std::process::ExitCode;
use std::sync::Arc;

use idem_core::{IdempotencyStore, LeaseStore, Millis, RetentionStore, StoreError, Tier};
use idem_sql::{OpenOptions, Store};
use idem_sweep::{SweepOptions, SweepReport, Sweeper};

use crate::open::{backend_of, bench_url, Backend};

type Stores = (
    Arc<dyn IdempotencyStore>,
    Arc<dyn RetentionStore>,
    Arc<dyn LeaseStore>,
);

fn redis_has_nothing_to_sweep() -> StoreError {
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
pub async fn run(
    url: &str,
    dry_run: bool,
    now: Option<String>,
    json: bool,
    duty: f64,
) -> Result<ExitCode, StoreError> {
    let (policy, _sources) = idem_sweep::config::from_env().map_err(StoreError::InvalidInput)?;
    let now = now.as_deref().map(parse_now).transpose()?;
    let (_, retention, leases) = open(url).await?;
    let sweeper = Sweeper::new(retention, policy)
        .with_lease(leases, idem_lease::LeaseMetrics::default())
        .with_duty(duty);
    let report = sweeper
        .run(&SweepOptions {
            dry_run,
            now,
            progress: !json,
        })
        .await?;
    if json {
        crate::print_json(&report);
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
        crate::keys::rfc3339(r.now),
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

/// `idem bench sweep`.
pub async fn bench(
    url: &str,
    records: u64,
    concurrency: usize,
    batch: usize,
    duty: f64,
    json: bool,
) -> Result<ExitCode, StoreError> {
    if backend_of(url)? == Backend::Redis {
        return Err(redis_has_nothing_to_sweep());
    }
    let (url, _tmp) = bench_url(url, "sweep.db")?;
    // PostgreSQL: a schema of its own, dropped when the bench ends.
    let options = OpenOptions {
        pg_schema: Some(format!(
            "idem_bench_sweep_{}",
            uuid::Uuid::now_v7().simple()
        )),
        pg_max_connections: Some((concurrency + 4) as u32),
        ..OpenOptions::default()
    };
    let opened = Store::open(&url, &options).await?;
    let sql = opened.sql().ok_or_else(redis_has_nothing_to_sweep)?.clone();
    let report = run_bench(&sql, records, concurrency, batch, duty).await;
    let dropped = match opened.sql().and_then(idem_sql::SqlStore::postgres) {
        Some(pg) => {
            crate::bench::drop_bench_schema(pg.pool(), pg.schema().unwrap_or_default()).await
        }
        None => Ok(()),
    };
    let report = report?;
    dropped?;
    print_bench(&report, json);
    Ok(ExitCode::SUCCESS)
}

async fn run_bench(
    sql: &idem_sql::SqlStore,
    records: u64,
    concurrency: usize,
    batch: usize,
    duty: f64,
) -> Result<idem_bench::sweep::BenchReport, StoreError> {
    idem_bench::sweep::bench(
        sql,
        idem_bench::sweep::BenchOptions {
            records,
            concurrency,
            batch,
            duty,
            ..idem_bench::sweep::BenchOptions::default()
        },
    )
    .await
}

fn print_bench(report: &idem_bench::sweep::BenchReport, json: bool) {
    if json {
        crate::print_json(report);
    } else {
        idem_bench::sweep::print_human(report);
    }
}
