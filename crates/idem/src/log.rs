//! Where the CLI's log lines go and what they look like: stderr, filtered by `IDEM_LOG`
//! (else `RUST_LOG`, else warnings), as text or one JSON object per line, with colour
//! only when stderr is a terminal (a log file holds no escape codes).
//!
//! Owns the subscriber set-up only; it must not decide what is logged.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// The filter when neither variable is set.
const DEFAULT_FILTER: &str = "warn,sqlx=error";

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (time, level, target, fields, span).
    Json,
}

/// The filter from `IDEM_LOG`, else `RUST_LOG`, else the default. A variable that is set
/// but does not parse is an error naming it, not a silent fallback.
fn filter() -> Result<EnvFilter, String> {
    for var in ["IDEM_LOG", "RUST_LOG"] {
        match std::env::var(var) {
            Ok(text) if !text.trim().is_empty() => {
                return EnvFilter::try_new(&text)
                    .map_err(|e| format!("{var}={text:?} is not a log filter: {e}"));
            }
            _ => {}
        }
    }
    Ok(EnvFilter::new(DEFAULT_FILTER))
}

/// Installs the subscriber for the process.
pub fn init(format: LogFormat) -> Result<(), String> {
    let filter = filter()?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().with_ansi(false).init(),
    }
    Ok(())
}
