//! How caller-chosen text and times are written down: the check that free text
//! (names, reasons, actors) is bounded and free of control characters, and epoch
//! milliseconds as RFC 3339. Leaf helpers: this module imports nothing of the crate but
//! its error.

use chrono::{DateTime, SecondsFormat};

use crate::error::OrderError;

/// Epoch milliseconds as RFC 3339 UTC with milliseconds.
pub fn rfc3339(ms: i64) -> String {
    DateTime::from_timestamp_millis(ms)
        .map(|d| d.to_rfc3339_opts(SecondsFormat::Millis, true))
        .unwrap_or_default()
}

/// Text a caller chooses that reaches the log, the database and the console: 1 to `max`
/// bytes without control characters (a newline in a log line would start a forged one).
pub(crate) fn check_text(field: &'static str, value: &str, max: usize) -> Result<(), OrderError> {
    if value.is_empty() || value.len() > max || value.chars().any(char::is_control) {
        return Err(OrderError::InvalidField {
            field,
            reason: format!("must be 1 to {max} characters without control characters"),
        });
    }
    Ok(())
}
