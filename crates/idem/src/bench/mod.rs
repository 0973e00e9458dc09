//! `idem bench …`: benchmarks that measure idem and a baseline in the same run and print
//! ratios. `store` and `lock` are measured here, against the raw drivers of `baseline`;
//! `sweep` drives the retention sweeper; the others run `idem-bench`. A bench writes only
//! under a schema or key prefix of its own, removed afterwards; it must not touch
//! another's records.

use std::process::ExitCode;
use std::time::Duration;

use idem_core::TenantId;

use crate::cli::{positive_secs, print_json, CliError, CliResult};

mod baseline;
mod load;
mod lock;
mod store;
mod sweep;

// `idem bench …`; a plain comment, so clap takes the about from the variant.
#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(clap::Subcommand)]
enum BenchCommand {
    /// Instructions per request (keyed, or passed through) of the gateway or of an app
    /// behind the HTTP layer, counted by valgrind's callgrind (the server runs under valgrind, the client and
    /// upstream outside it; an idle run's start-up and shutdown are subtracted).
    Callgrind {
        /// What serves the requests.
        #[arg(long, value_parser = ["gateway", "layer"], default_value = "gateway")]
        target: String,
        /// `fresh` keys, `replay`s of keys executed before counting, or key-less `pass`
        /// requests (the gateway's pass-through).
        #[arg(long, value_parser = ["fresh", "replay", "pass"], default_value = "fresh")]
        workload: String,
        /// Requests counted.
        #[arg(long, default_value_t = 2_000)]
        requests: usize,
        /// Keep-alive connections they are spread over.
        #[arg(long, default_value_t = 4)]
        connections: usize,
        /// The gateway's window or the layer's store in this Redis (default: memory).
        #[arg(long)]
        redis_url: Option<String>,
        /// Keep callgrind's files in this directory (for callgrind_annotate).
        #[arg(long)]
        out_dir: Option<std::path::PathBuf>,
        /// Functions to list by inclusive cost.
        #[arg(long, default_value_t = 25)]
        top: usize,
        /// Also simulate the caches and report first-level and last-level misses per
        /// request (slower).
        #[arg(long)]
        cache_sim: bool,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
    /// Single-caller replays through idem's Redis store against AWS Lambda Powertools'
    /// idempotency utility (Python, its Redis persistence layer; a virtualenv of pinned
    /// versions made on first use) on the same Redis, alternating.
    Powertools {
        /// The Redis both sides use (a key prefix of their own, removed afterwards).
        #[arg(long, default_value = "redis://127.0.0.1:6379")]
        redis_url: String,
        /// Seconds per turn.
        #[arg(long, default_value_t = 3.0)]
        phase: f64,
        /// Turns per side.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
    /// The server `bench callgrind` runs under valgrind; stops when stdin ends.
    #[command(hide = true)]
    CallgrindServe {
        /// What runs under valgrind: gateway or layer.
        #[arg(long)]
        target: String,
        /// The upstream the gateway forwards to.
        #[arg(long)]
        upstream: std::net::SocketAddr,
        /// The Redis the layer's store uses.
        #[arg(long)]
        redis_url: Option<String>,
        /// The key prefix of this run (removed afterwards).
        #[arg(long)]
        prefix: String,
    },
    /// Requests per second through the gateway against the upstream directly and nginx
    /// proxy_pass, plus a duplicate storm that must cost one upstream call.
    Gateway {
        /// Share the window through this Redis during the keyed scenarios.
        #[arg(long)]
        redis_url: Option<String>,
        /// Scenarios: pass (key-less), keyed (fresh keys), hot (replays of hot keys).
        #[arg(long, value_delimiter = ',', default_values_t = ["pass".to_string(), "keyed".to_string(), "hot".to_string()])]
        scenarios: Vec<String>,
        /// Rounds of (direct, nginx, gateway) per scenario, each starting one target
        /// further on (three put every target in every place once).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Milliseconds per target per round.
        #[arg(long, default_value_t = 2_000)]
        phase_ms: u64,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
    /// Lease acquire+release cycles against the raw driver's classic lock.
    Lock {
        /// Concurrent tasks driving the load.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// Seconds per side.
        #[arg(long, default_value_t = 4.0)]
        duration: f64,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
    /// Requests per second through an axum app with the layer against the same app
    /// without it (fresh keys, replay hits) and the store's own claim+complete rate, on
    /// the store `--database-url` names (a schema or key prefix of its own, removed
    /// afterwards) or a temporary SQLite file.
    Http {
        /// Concurrent tasks driving the load.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// Seconds per phase.
        #[arg(long, default_value_t = 1.5)]
        phase: f64,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
    /// POST /v1/orders through the order service's handler with fresh keys (claim in the
    /// order's transaction, and claim ahead) against the same create without a key, in
    /// one run, on the database `--database-url` names (a schema of its own, on MySQL a
    /// database of its own, removed afterwards) or a temporary SQLite file
    Orders {
        /// Concurrent clients, each ordering from a show of its own.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// Seconds per side (spread over alternating slices).
        #[arg(long, default_value_t = 6.0)]
        duration: f64,
        /// Also run every client on this many shows (1: the flash sale) and report
        /// `hot_vs_spread` against each client on a show of its own.
        #[arg(long)]
        shows: Option<usize>,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
    /// Sweep N expired records: records/s, claim p99 with vs without the sweep, bytes
    /// per record in each tier.
    Sweep {
        /// Expired records to seed and sweep.
        #[arg(long, default_value_t = 1_000_000)]
        records: u64,
        /// Concurrent tasks driving the load.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// Records per sweep batch.
        #[arg(long, default_value_t = 500)]
        batch: usize,
        /// The sweeper's share of wall time, as for `idem sweep --duty`.
        #[arg(long, default_value_t = idem_sweep::DEFAULT_DUTY, value_parser = crate::sweep::parse_duty)]
        duty: f64,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
    /// claim+complete and replay throughput against the raw driver doing the naive thing.
    Store {
        /// Concurrent tasks driving the load.
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
        /// Seconds per phase.
        #[arg(long, default_value_t = 4.0)]
        duration: f64,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
        /// Skip the PostgreSQL growth measurement (claim p50 with 1 thousand and with
        /// 1 million stored keys; the bulk load takes a while).
        #[arg(long)]
        no_growth: bool,
    },
    /// Reconcile dry run over N bulk-loaded orders (temporary SQLite file or a fresh
    /// PostgreSQL schema): orders/s against a raw ordered SELECT of the same rows.
    Reconcile {
        /// Orders to bulk-load.
        #[arg(long, default_value_t = 1_000_000)]
        orders: u64,
        /// One intent in this many is a duplicate pair.
        #[arg(long, default_value_t = 500)]
        duplicate_every: u64,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
}

/// `url` is the store to use; `explicit_url` is set only when the operator named one
/// (`http` and `orders` use a temporary SQLite file otherwise).
pub async fn run(url: &str, explicit_url: Option<String>, args: BenchArgs) -> CliResult {
    match args.command {
        BenchCommand::Callgrind {
            target,
            workload,
            requests,
            connections,
            redis_url,
            out_dir,
            top,
            cache_sim,
            json,
        } => {
            use idem_bench::callgrind::{CallgrindOptions, Target, Workload};
            let exe = std::env::current_exe()
                .map_err(|e| CliError::backend(format!("this binary's path: {e}")))?;
            let report = idem_bench::callgrind::measure(CallgrindOptions {
                target: Target::parse(&target).expect("clap checked it"),
                workload: Workload::parse(&workload).expect("clap checked it"),
                requests,
                connections,
                redis_url,
                exe,
                out_dir,
                top,
                cache_sim,
            })
            .await
            .map_err(backend)?;
            show(&report, json, |r| print!("{}", r.to_text()))
        }
        BenchCommand::Powertools {
            redis_url,
            phase,
            rounds,
            json,
        } => {
            let phase = load_shape(phase, rounds, "--phase and --rounds")?;
            let report = idem_bench::powertools::bench(idem_bench::powertools::PowertoolsOptions {
                redis_url,
                phase,
                rounds,
                script: None,
            })
            .await
            .map_err(backend)?;
            show(&report, json, |r| print!("{}", r.to_text()))
        }
        BenchCommand::CallgrindServe {
            target,
            upstream,
            redis_url,
            prefix,
        } => {
            let target = idem_bench::callgrind::Target::parse(&target)
                .ok_or_else(|| CliError::invalid("--target is gateway or layer"))?;
            idem_bench::callgrind::serve(target, upstream, redis_url, prefix)
                .await
                .map_err(backend)?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Store {
            concurrency,
            duration,
            json,
            no_growth,
        } => bench_store(url, concurrency, duration, json, no_growth).await,
        BenchCommand::Lock {
            concurrency,
            duration,
            json,
        } => {
            let duration =
                positive_secs(duration, "--duration must be a positive number of seconds")?;
            let report = lock::run(url, concurrency, duration).await?;
            show(&report, json, lock::print_human)
        }
        BenchCommand::Http {
            concurrency,
            phase,
            json,
        } => {
            let phase = load_shape(phase, concurrency, "--phase and --concurrency")?;
            let report = idem_bench::http::bench(idem_bench::http::BenchOptions {
                phase,
                concurrency,
                database_url: explicit_url,
                ..Default::default()
            })
            .await
            .map_err(backend)?;
            show(&report, json, |r| {
                println!("{}", serde_json::to_string_pretty(r).expect("report"))
            })
        }
        BenchCommand::Orders {
            concurrency,
            duration,
            shows,
            json,
        } => {
            let duration = load_shape(duration, concurrency, "--duration and --concurrency")?;
            let report = idem_bench::orders::bench(idem_bench::orders::OrdersBenchOptions {
                database_url: explicit_url,
                concurrency,
                duration,
                shows,
            })
            .await
            .map_err(backend)?;
            show(&report, json, idem_bench::orders::print_human)
        }
        BenchCommand::Gateway {
            redis_url,
            scenarios,
            rounds,
            phase_ms,
            json,
        } => {
            let report = idem_bench::gateway::bench(idem_bench::gateway::BenchOptions {
                redis_url,
                scenarios,
                rounds,
                phase_ms,
                ..Default::default()
            })
            .await
            .map_err(backend)?;
            show(&report, json, |r| println!("{}", r.to_text()))
        }
        BenchCommand::Sweep {
            records,
            concurrency,
            batch,
            duty,
            json,
        } => sweep::run(url, records, concurrency, batch, duty, json).await,
        BenchCommand::Reconcile {
            orders,
            duplicate_every,
            json,
        } => {
            let options = idem_bench::reconcile::BenchOptions {
                orders,
                duplicate_every,
                ..Default::default()
            };
            let report = idem_bench::reconcile::bench(url, &options)
                .await
                .map_err(crate::reconcile::orders_err)?;
            show(&report, json, |r| print!("{}", r.render_text()))
        }
    }
}

/// `secs` as a duration, when it and `concurrency` are both positive; else "`flags` must
/// be positive".
fn load_shape(secs: f64, concurrency: usize, flags: &str) -> Result<Duration, CliError> {
    let msg = format!("{flags} must be positive");
    if concurrency == 0 {
        return Err(CliError::invalid(msg));
    }
    positive_secs(secs, &msg)
}

fn backend(e: impl std::fmt::Display) -> CliError {
    CliError::backend(e.to_string())
}

/// A finished bench's report, as JSON or as `human` prints it.
fn show<R: serde::Serialize>(report: &R, json: bool, human: impl FnOnce(&R)) -> CliResult {
    if json {
        print_json(report);
    } else {
        human(report);
    }
    Ok(ExitCode::SUCCESS)
}

async fn bench_store(
    url: &str,
    concurrency: usize,
    duration: f64,
    json: bool,
    no_growth: bool,
) -> CliResult {
    let duration = positive_secs(duration, "--duration must be a positive number of seconds")?;
    let targets = store::open_bench(url).await?;
    let baseline = targets.baseline.clone();
    let growth = targets.growth.as_ref().filter(|_| !no_growth);
    let tenant = TenantId::new(format!("bench-{}", uuid::Uuid::now_v7().simple())).expect("tenant");
    let report = store::run(
        targets.store.clone(),
        baseline.clone(),
        growth,
        &tenant,
        concurrency,
        duration,
    )
    .await;
    let cleaned = baseline.cleanup().await;
    let mut report = report?;
    cleaned?;
    report.server = targets.server.clone();
    show(&report, json, store::print_human)
}
