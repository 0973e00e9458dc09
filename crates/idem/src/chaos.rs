//! `idem chaos`: the command line of `idem-chaos` (a campaign of faults against the real
//! topology, checked by reading the ledgers). Exit status: 0 when every invariant held,
//! 1 on any anomaly, 3 when the keyless control found no duplicate (the checker or the
//! control is broken).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use idem_chaos::{ChaosError, ChaosOptions, FaultKind, Report};
use idem_core::StoreError;

use crate::cli::{print_json, CliResult};

#[derive(Debug, clap::Args)]
pub struct ChaosArgs {
    /// How long faults are injected and new intents started (settling comes after).
    #[arg(long, value_parser = crate::cli::parse_duration, default_value = "60s")]
    duration: Duration,
    /// Seeds the workload and the fault schedule; printed on every run.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// `idem serve` processes, all on one database.
    #[arg(long, default_value_t = 2)]
    services: usize,
    /// `idem gateway` processes sharing one Redis window.
    #[arg(long, default_value_t = 2)]
    gateways: usize,
    /// Virtual users driving the workload.
    #[arg(long, default_value_t = 12)]
    users: usize,
    /// Redis for the gateways' window (the campaign uses a key prefix of its own).
    #[arg(long, env = "IDEM_CHAOS_REDIS_URL")]
    redis_url: Option<String>,
    /// Relay the outbox through NATS JetStream (a stream of the campaign's own).
    #[arg(long, env = "IDEM_CHAOS_NATS_URL")]
    nats_url: Option<String>,
    /// Fault kinds, comma-separated: kill, stop, gateway, db-conn, redis, bus, net (or all).
    #[arg(long, default_value = "all")]
    faults: String,
    /// `legacy`: send the creates through the keyless route; the checker must find
    /// duplicate orders there.
    #[arg(long, value_parser = ["legacy"])]
    control: Option<String>,
    /// Print the report as JSON (a failure as an `error` object).
    #[arg(long)]
    json: bool,
    /// Also write a self-contained HTML report to FILE.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Write every intent and the answers its sends got to FILE (JSON lines).
    #[arg(long, value_name = "FILE")]
    workload_log: Option<PathBuf>,
    /// Keep the campaign's database when an anomaly is found (its name is printed).
    #[arg(long)]
    keep_database: bool,
}

fn err(e: ChaosError) -> StoreError {
    match e {
        ChaosError::Usage(m) => StoreError::InvalidInput(m),
        other => StoreError::Unavailable(other.to_string()),
    }
}

pub async fn run(database_url: Option<String>, args: ChaosArgs) -> CliResult {
    let database_url = database_url.ok_or_else(|| {
        StoreError::InvalidInput(
            "idem chaos needs --database-url postgres://… or mysql://… (it creates a database of its own there)"
                .into(),
        )
    })?;
    let redis_url = args.redis_url.clone().ok_or_else(|| {
        StoreError::InvalidInput(
            "idem chaos needs --redis-url redis://… for the gateways' window".into(),
        )
    })?;
    let faults = FaultKind::parse_list(&args.faults).map_err(err)?;
    let bin = std::env::current_exe()
        .map_err(|e| StoreError::Backend(format!("cannot find the idem binary: {e}")))?;
    // The seed first: a run that breaks anything is reproducible from its output.
    eprintln!(
        "idem chaos: seed {}, {} s, {} service(s), {} gateway(s), faults {}",
        args.seed,
        args.duration.as_secs(),
        args.services,
        args.gateways,
        faults
            .iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(",")
    );
    let options = ChaosOptions {
        bin,
        duration: args.duration,
        seed: args.seed,
        services: args.services,
        gateways: args.gateways,
        users: args.users,
        servers: idem_chaos::topology::Servers {
            database_url,
            redis_url,
            nats_url: args.nats_url.clone(),
        },
        faults,
        control_legacy: args.control.is_some(),
        progress: !args.json,
        workload_log: args.workload_log.clone(),
        keep_database: args.keep_database,
    };
    // Installed before anything starts, so a Ctrl-C at any point cleans up.
    let interrupt = crate::signal::shutdown()?;
    let (report, logs) = match idem_chaos::run(options, interrupt).await {
        Ok(done) => done,
        Err(ChaosError::Interrupted) => {
            eprintln!("idem chaos: {}", ChaosError::Interrupted);
            return Ok(ExitCode::from(130));
        }
        Err(e) => return Err(err(e).into()),
    };
    if let Some(path) = &args.html {
        std::fs::write(path, idem_chaos::html::render(&report)).map_err(|e| {
            StoreError::InvalidInput(format!("cannot write {}: {e}", path.display()))
        })?;
    }
    if args.json {
        print_json(&report);
    } else {
        print_human(&report);
    }
    if logs.exists() {
        eprintln!("process logs kept in {}", logs.display());
    }
    Ok(exit_code(&report))
}

fn exit_code(report: &Report) -> ExitCode {
    let duplicates = report
        .anomalies_by_invariant
        .get("I2")
        .copied()
        .unwrap_or(0);
    match (&report.control, report.passed) {
        (None, true) => ExitCode::SUCCESS,
        (Some(_), _) if duplicates == 0 => {
            eprintln!("the control found no duplicate order: the checker or the control is broken");
            ExitCode::from(3)
        }
        _ => ExitCode::FAILURE,
    }
}

fn print_human(r: &Report) {
    println!(
        "idem chaos seed {}{}: {}",
        r.seed,
        r.control
            .as_deref()
            .map(|c| format!(" (control: {c})"))
            .unwrap_or_default(),
        if r.passed { "PASSED" } else { "FAILED" }
    );
    println!(
        "  {} intents, {} acknowledged ({:.1} %), {} answered ({:.1} %), {} attempts; active {:.1} s, settle {:.1} s",
        r.intents,
        r.acknowledged,
        r.acknowledged_ratio * 100.0,
        r.answered,
        r.answered_ratio * 100.0,
        r.attempts,
        r.duration_ms as f64 / 1e3,
        r.settle_ms as f64 / 1e3
    );
    let kinds: Vec<String> = r
        .faults_by_kind
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    println!("  faults: {}", kinds.join(", "));
    for f in &r.faults {
        println!(
            "    {:>7.2} s  {:<8} {:<22} {}",
            f.at_ms as f64 / 1e3,
            f.kind,
            f.target,
            f.detail
        );
    }
    if !r.availability_by_fault.is_empty() {
        println!("  availability (completed answers/s inside each kind's windows vs outside all):");
        for line in r.availability_lines() {
            println!("    {line}");
        }
    }
    println!("  invariants:");
    for i in &r.invariants {
        println!(
            "    {} {:<4} {:>6} checked  {}",
            i.id,
            if i.passed { "ok" } else { "FAIL" },
            i.checked,
            i.title
        );
    }
    for a in r.anomalies.iter().take(50) {
        println!(
            "  anomaly {}: {} [intent {} key {} rows {}] faults nearby: {}",
            a.invariant,
            a.detail,
            a.intent.as_deref().unwrap_or("-"),
            a.key.as_deref().unwrap_or("-"),
            a.rows.join(","),
            if a.faults.is_empty() {
                "none".to_string()
            } else {
                a.faults.join("; ")
            }
        );
    }
    if r.anomalies.len() > 50 {
        println!(
            "  … {} more anomalies (--json lists all)",
            r.anomalies.len() - 50
        );
    }
}
