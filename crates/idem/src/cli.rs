//! What every command shares: the error a command fails with and how it is shown (exit
//! code 2, a line on stderr, an `error` object under `--json`), JSON output, the argument
//! parsers of durations, and times as RFC 3339.
//!
//! Owns these conventions only; it must not know any command (no `crate::` imports).

use std::fmt;
use std::process::ExitCode;
use std::time::Duration;

use idem_core::{ErrorKind, Millis, StoreError};

/// Why a command failed: the line the user reads and the kind a `--json` error names.
/// Built from a `StoreError`, it keeps that error's kind and its message word for word.
#[derive(Debug)]
pub struct CliError {
    kind: ErrorKind,
    message: String,
}

impl CliError {
    /// Bad arguments or settings, worded as a store's refusal of invalid input is.
    pub fn invalid(msg: impl Into<String>) -> Self {
        StoreError::InvalidInput(msg.into()).into()
    }

    /// A failure that is nobody's input, worded as a store's backend error is.
    pub fn backend(msg: impl Into<String>) -> Self {
        StoreError::Backend(msg.into()).into()
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

impl From<StoreError> for CliError {
    fn from(e: StoreError) -> Self {
        Self {
            kind: e.kind(),
            message: e.to_string(),
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CliError {}

/// An order service error as the store error of the same kind (its store errors as they
/// are), for the commands that drive `idem-orders`.
pub fn orders_error(e: idem_orders::Error) -> StoreError {
    match e {
        idem_orders::Error::InvalidInput(m) => StoreError::InvalidInput(m),
        idem_orders::Error::Unavailable(m) => StoreError::Unavailable(m),
        idem_orders::Error::Store(s) => s,
        other => StoreError::Backend(other.to_string()),
    }
}

/// The outcome of one command: its exit code, or why it failed.
pub type CliResult = Result<ExitCode, CliError>;

/// A failure as a line on stderr, and under `--json` also as an `error` object on stdout
/// (a script reading stdout gets an object either way); exit code 2.
pub fn fail(kind: ErrorKind, msg: impl fmt::Display, json: bool) -> ExitCode {
    if json {
        print_json(&serde_json::json!({
            "error": { "kind": kind_name(kind), "message": msg.to_string() }
        }));
    }
    eprintln!("error: {msg}");
    ExitCode::from(2)
}

fn kind_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InvalidInput => "invalid_input",
        ErrorKind::Conflict => "conflict",
        ErrorKind::NotFound => "not_found",
        ErrorKind::Unavailable => "unavailable",
        _ => "backend",
    }
}

pub fn print_json<T: serde::Serialize>(v: &T) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).expect("serialisable report")
    );
}

/// `ok` as the exit code of a command whose check passed or failed.
pub fn passed(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Epoch milliseconds as RFC 3339 with milliseconds, in UTC.
pub fn rfc3339(ms: Millis) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| ms.to_string())
}

/// Parses `500ms`, `3s`, `2m`, `1h` (a bare number is seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    parse_any_duration(s)
}

/// A duration that must not be zero (leases, timeouts that would expire at once).
pub fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    match parse_any_duration(s)? {
        d if d.is_zero() => Err(format!("{s:?}: must be more than zero")),
        d => Ok(d),
    }
}

fn parse_any_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: expected e.g. 500ms, 3s, 2m"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("invalid duration unit in {s:?}: use ms, s, m or h")),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| format!("invalid duration {s:?}"))
}

/// Seconds given as a float (`--duration 4.5`), which must be positive.
pub fn positive_secs(secs: f64, msg: &str) -> Result<Duration, CliError> {
    if secs.is_finite() && secs > 0.0 {
        Ok(Duration::from_secs_f64(secs))
    } else {
        Err(CliError::invalid(msg))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let check = |s: &str, ms: Option<u64>| {
            assert_eq!(
                parse_duration(s).ok().map(|d| d.as_millis() as u64),
                ms,
                "{s}"
            )
        };
        check("3s", Some(3000));
        check("500ms", Some(500));
        check("2m", Some(120_000));
        check("1.5s", Some(1500));
        check("4", Some(4000));
        check("3x", None);
        check("", None);
        check("-1s", None);
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
    }

    #[test]
    fn an_error_keeps_the_kind_and_words_of_the_store_error() {
        let e = CliError::from(StoreError::Unavailable("db down".into()));
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert_eq!(e.to_string(), "store unavailable: db down");
        assert_eq!(CliError::invalid("--x").to_string(), "invalid input: --x");
    }
}
