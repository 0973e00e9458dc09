//! The `idem` command line: one binary for operators and developers.
//!
//! It parses arguments, opens the configured store and calls into the library crates;
//! the rules themselves live in idem-core and the stores, never here. This file holds the
//! command tree, the global flags, logging and the dispatch; each command's flags and
//! work are its module's.

use std::process::ExitCode;

use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};
use idem_core::ErrorKind;

/// Every command, and the servers it runs, allocate through jemalloc: a keyed request
/// makes about a hundred small allocations, each several times cheaper than glibc's.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Freed pages go back to the system within about a second, from idle threads too (a
/// burst of buffered bodies must not leave the gateway's memory high).
#[allow(non_upper_case_globals)]
#[export_name = "_rjem_malloc_conf"]
pub static malloc_conf: &[u8] = b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

mod bench;
mod chaos;
mod cli;
mod completions;
mod console;
mod demo;
mod drill;
mod freeze;
mod gateway;
mod keys;
mod lock;
mod log;
mod migrate;
mod open;
mod reconcile;
mod serve;
mod settings;
mod signal;
mod sweep;

#[derive(Parser)]
#[command(
    name = "idem",
    version,
    about = "Make one business intent take effect once."
)]
struct Cli {
    /// Store to use: sqlite://PATH (default ./idem-data/idem.db).
    #[arg(long, global = true, env = "IDEM_DATABASE_URL")]
    database_url: Option<String>,
    /// Log lines on stderr as text or as one JSON object per line (filter: IDEM_LOG,
    /// else RUST_LOG).
    #[arg(
        long,
        global = true,
        env = "IDEM_LOG_FORMAT",
        value_enum,
        default_value_t
    )]
    log_format: log::LogFormat,
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Retention: move terminal records past their window one tier down (retry →
    /// replay → dispute → archive), recover stale PROCESSING records, expire the archive.
    /// Windows from IDEM_RETENTION_* / IDEM_REPLAY_* (see idem_sweep::config).
    Sweep(sweep::SweepArgs),
    /// Fire N concurrent duplicates of one fresh intent and check exactly one executes.
    Drill(drill::DrillArgs),
    /// Inspect idempotency records.
    Keys(keys::KeysArgs),
    /// Reverse proxy in front of any HTTP service: requires keys, coalesces duplicates,
    /// keeps a short window, never mints a key.
    Gateway(gateway::GatewayArgs),
    /// Run the ticketing order service (SQLite by default, or PostgreSQL).
    Serve(serve::ServeArgs),
    /// Serve the operator console of any SQL store on its own (records, leases, audit),
    /// without the order service. Needs the admin token (IDEM_ADMIN_TOKEN or
    /// --admin-token-file).
    Console(console::ConsoleArgs),
    /// Freeze the automatic chain for a scope (user:U, show:S or all).
    Freeze(freeze::FreezeArgs),
    /// Lift a freeze; queued work resumes.
    Unfreeze(freeze::UnfreezeArgs),
    /// Demonstrations.
    Demo(demo::DemoArgs),
    /// Reconcile duplicate orders across the four ledgers (orders, payments, inventory
    /// holds, messages): keep one order per intent, cancel and refund the others through
    /// the state machine, release their holds, stop their messages. Dry run by default.
    /// Exit 1 when a ledger check fails, 3 when --apply is refused (chain not frozen).
    Reconcile(reconcile::ReconcileArgs),
    /// Apply the store's schema migrations (also done on open).
    Migrate,
    /// Print a shell completion script (bash, zsh, fish, powershell, elvish) to stdout.
    Completions(completions::CompletionsArgs),
    /// Leases with fencing tokens: acquire, renew, release, show, force-release.
    Lock(lock::LockArgs),
    /// Benchmarks that print ratios against a baseline measured in the same run.
    Bench(bench::BenchArgs),
    /// Exactly-once under faults: start N servers and M gateways on PostgreSQL, Redis
    /// (and NATS), drive a seeded workload, inject kills, stops, connection and network
    /// faults, then check the ledgers. Exit 1 on any anomaly.
    Chaos(chaos::ChaosArgs),
}

/// Whether the command that runs has `--json` set.
fn wants_json(matches: &ArgMatches) -> bool {
    let mut m = matches;
    while let Some((_, sub)) = m.subcommand() {
        m = sub;
    }
    matches!(m.try_get_one::<bool>("json"), Ok(Some(true)))
}

#[tokio::main]
async fn main() -> ExitCode {
    let cmd = settings::with_env(Cli::command());
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let matches = match settings::parse(&cmd, args) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let json = wants_json(&matches);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Err(e) = log::init(cli.log_format) {
        return cli::fail(ErrorKind::InvalidInput, e, json);
    }
    let url = cli.database_url.clone().unwrap_or_else(open::default_url);
    match run(cli.command, &url, cli.database_url).await {
        Ok(code) => code,
        Err(e) => cli::fail(e.kind(), e, json),
    }
}

/// `url` is the store to use; `explicit_url` is set only when the operator named one
/// (the demo, chaos and some benches use a store of their own otherwise).
async fn run(command: Command, url: &str, explicit_url: Option<String>) -> cli::CliResult {
    match command {
        Command::Sweep(args) => sweep::run(url, args).await,
        Command::Drill(args) => drill::run(url, args).await,
        Command::Keys(args) => keys::run(url, args).await,
        Command::Gateway(args) => gateway::run(args).await,
        Command::Serve(args) => serve::run(url, args).await,
        Command::Console(args) => console::run(url, args).await,
        Command::Freeze(args) => freeze::freeze(url, args).await,
        Command::Unfreeze(args) => freeze::unfreeze(url, args).await,
        Command::Demo(args) => demo::run(explicit_url, args).await,
        Command::Reconcile(args) => reconcile::run(url, args).await,
        Command::Migrate => migrate::run(url).await,
        Command::Completions(args) => Ok(completions::run(args, Cli::command())),
        Command::Lock(args) => lock::run(url, args).await,
        Command::Bench(args) => bench::run(url, explicit_url, args).await,
        Command::Chaos(args) => chaos::run(explicit_url, args).await,
    }
}

#[cfg(test)]
mod cli_tests {
    use super::*;

    fn missing_help(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
        let path = format!("{path} {}", cmd.get_name());
        if cmd.get_about().is_none() && cmd.get_long_about().is_none() {
            out.push(format!("{path} (the command)"));
        }
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            if arg.get_help().is_none() && arg.get_long_help().is_none() {
                out.push(format!("{path} --{id}"));
            }
        }
        for sub in cmd.get_subcommands() {
            if sub.get_name() != "help" {
                missing_help(sub, &path, out);
            }
        }
    }

    #[test]
    fn every_command_and_argument_has_help_text() {
        Cli::command().debug_assert();
        let mut missing = Vec::new();
        missing_help(&Cli::command(), "", &mut missing);
        assert!(missing.is_empty(), "no help text:\n{}", missing.join("\n"));
    }
}
