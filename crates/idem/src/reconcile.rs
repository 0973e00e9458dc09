//! `idem reconcile`: argument handling, the progress bar and the output formats (`idem
//! bench reconcile` is `bench`'s). The reconciliation itself is `idem_orders::reconcile`.
//!
//! Exit codes: 0 when every ledger check passed, 1 when a check failed (or an action
//! failed or is blocked), 3 when `--apply` was refused because the chain is not frozen.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use idem_core::StoreError;
use idem_orders::reconcile::{self, ActionHook, Progress, ProgressHook, ReconcileOptions};

use crate::cli::{parse_duration, passed, print_json, CliResult};

/// Test-only: abort the process (no cleanup, like `kill -9`) after this many applied
/// actions, to prove a rerun completes exactly the rest.
pub const ABORT_AFTER_ENV: &str = "IDEM_RECONCILE_ABORT_AFTER";

#[derive(clap::Args)]
pub struct ReconcileArgs {
    /// The tenant, as the service authenticated it.
    #[arg(long)]
    tenant: Option<String>,
    /// Only this user's orders.
    #[arg(long)]
    user: Option<String>,
    /// Only this show's orders.
    #[arg(long)]
    show: Option<String>,
    /// Orders created at or after this time (RFC 3339).
    #[arg(long)]
    since: Option<String>,
    /// Orders created before this time (RFC 3339).
    #[arg(long)]
    until: Option<String>,
    /// Orders of one session this close to the intent's first order are one intent.
    #[arg(long, value_parser = parse_duration, default_value = "2m")]
    window: Duration,
    /// Execute the plan (every action is idempotent; rerunning changes nothing).
    #[arg(long)]
    apply: bool,
    /// Apply even though the automatic chain is not frozen for the scope.
    #[arg(long)]
    force: bool,
    /// Print the result as JSON (a failure as an `error` object).
    #[arg(long, conflicts_with = "html")]
    json: bool,
    /// Write a self-contained HTML report to FILE.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
}

fn invalid(msg: impl Into<String>) -> StoreError {
    StoreError::InvalidInput(msg.into())
}

/// The order ledgers' errors by kind (shared with `idem bench reconcile`).
pub fn orders_err(e: idem_orders::Error) -> StoreError {
    match e {
        idem_orders::Error::InvalidInput(s) => StoreError::InvalidInput(s),
        e if e.is_unavailable() => StoreError::Unavailable(e.to_string()),
        e => StoreError::Backend(e.to_string()),
    }
}

/// RFC 3339 (`2025-06-01T20:14:00Z`) to ms since the epoch.
fn parse_time(flag: &str, s: &str) -> Result<i64, StoreError> {
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|t| t.timestamp_millis())
        .map_err(|e| invalid(format!("{flag} {s:?}: expected RFC 3339 ({e})")))
}

/// A bar on stderr, only when stderr is a terminal.
fn progress_bar() -> Option<ProgressHook> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "scanning orders {bar:40} {pos}/{len} ({per_sec}, eta {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    Some(Arc::new(move |p: Progress| {
        if let Some(total) = p.total {
            bar.set_length(total);
        }
        bar.set_position(p.scanned);
        if p.total.is_some_and(|t| p.scanned >= t) {
            bar.finish_and_clear();
        }
    }))
}

fn abort_hook() -> Result<Option<ActionHook>, StoreError> {
    let Ok(v) = std::env::var(ABORT_AFTER_ENV) else {
        return Ok(None);
    };
    let n: usize = v
        .parse()
        .map_err(|_| invalid(format!("{ABORT_AFTER_ENV}={v:?}: expected a number")))?;
    Ok(Some(Arc::new(move |applied: usize| {
        if applied >= n {
            eprintln!("{ABORT_AFTER_ENV}: aborting after {applied} applied action(s)");
            std::process::abort();
        }
    })))
}

pub async fn run(url: &str, args: ReconcileArgs) -> CliResult {
    let options = ReconcileOptions {
        tenant: args.tenant,
        user: args.user,
        show: args.show,
        since_ms: args
            .since
            .as_deref()
            .map(|s| parse_time("--since", s))
            .transpose()?,
        until_ms: args
            .until
            .as_deref()
            .map(|s| parse_time("--until", s))
            .transpose()?,
        window: args.window,
        apply: args.apply,
        force: args.force,
        actor: std::env::var("USER").unwrap_or_else(|_| "operator".into()),
        progress: progress_bar(),
        after_action: abort_hook()?,
    };
    let report = reconcile::reconcile_url(url, None, &options)
        .await
        .map_err(orders_err)?;
    if args.json {
        print_json(&report);
    } else {
        print!("{}", report.render_text());
    }
    if let Some(path) = &args.html {
        std::fs::write(path, report.render_html())
            .map_err(|e| invalid(format!("writing {}: {e}", path.display())))?;
        if !args.json {
            println!("report written to {}", path.display());
        }
    }
    if report.refused.is_some() {
        for gap in &report.freeze_gaps {
            eprintln!("freeze first: {}", gap.command);
        }
        return Ok(ExitCode::from(3));
    }
    let troubled = report.totals.failed > 0 || (args.apply && report.totals.blocked > 0);
    Ok(passed(report.passed && !troubled))
}
