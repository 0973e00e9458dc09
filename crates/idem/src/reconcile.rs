//! `idem reconcile` and `idem bench reconcile`: argument handling, the progress bar and
//! the output formats. The reconciliation itself is `idem_orders::reconcile`.
//!
//! Exit codes: 0 when every ledger check passed, 1 when a check failed (or an action
//! failed or is blocked), 3 when `--apply` was refused because the chain is not frozen.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use idem_bench::reconcile::BenchOptions;
use idem_core::StoreError;
use idem_orders::reconcile::{self, ActionHook, Progress, ProgressHook, ReconcileOptions};

/// Test-only: abort the process (no cleanup, like `kill -9`) after this many applied
/// actions, to prove a rerun completes exactly the rest.
pub const ABORT_AFTER_ENV: &str = "IDEM_RECONCILE_ABORT_AFTER";

pub struct ReconcileArgs {
    pub tenant: Option<String>,
    pub user: Option<String>,
    pub show: Option<String>,
    pub since: Option<String>,
    pub until: Option<String>,
    pub window: Duration,
    pub apply: bool,
    pub force: bool,
    pub json: bool,
    pub html: Option<PathBuf>,
}

fn invalid(msg: impl Into<String>) -> StoreError {
    StoreError::InvalidInput(msg.into())
}

fn orders_err(e: idem_orders::Error) -> StoreError {
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

pub async fn run(url: &str, args: ReconcileArgs) -> Result<ExitCode, StoreError> {
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
        crate::print_json(&report);
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
    Ok(if report.passed && !troubled {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

pub async fn bench(
    url: &str,
    orders: u64,
    duplicate_every: u64,
    json: bool,
) -> Result<ExitCode, StoreError> {
    let report = idem_bench::reconcile::bench(
        url,
        &BenchOptions {
            orders,
            duplicate_every,
            ..BenchOptions::default()
        },
    )
    .await
    .map_err(orders_err)?;
    if json {
        crate::print_json(&report);
    } else {
        print!("{}", report.render_text());
    }
    Ok(ExitCode::SUCCESS)
}
