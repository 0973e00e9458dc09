//! Errors: [`Error`] for infrastructure (databases, transports, configuration) and
//! [`OrderError`] for what the business says no to.
//!
//! Callers branch on variants and on [`Error::is_unavailable`], never on message text.
//! Mapping errors to HTTP statuses is [`crate::api`]'s job, not this module's.

use idem_core::{ErrorKind, LeaseError, StoreError};

use crate::machine::IllegalTransition;

/// Something below the business failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The database (or broker) could not be reached or timed out. Callers fail closed.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The database answered with an error.
    #[error("database error: {0}")]
    Backend(String),
    /// The idempotency store refused (see [`StoreError`]); `Superseded` means the claim
    /// moved on and the caller's transaction was rolled back.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A lease operation failed; `Fenced` means a newer holder's token was accepted.
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// Bad configuration or arguments (a URL, an API key, a scope).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// Publishing or consuming messages failed.
    #[error("transport error: {0}")]
    Transport(String),
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// A fault injected on purpose (drills and tests).
    #[error("injected fault: {0}")]
    InjectedFault(&'static str),
}

impl Error {
    pub fn is_unavailable(&self) -> bool {
        match self {
            Error::Unavailable(_) => true,
            Error::Store(e) => e.is_unavailable(),
            Error::Lease(e) => e.is_unavailable(),
            _ => false,
        }
    }

    /// The write was refused by a fence: a newer lease holder got there first.
    pub fn is_fenced(&self) -> bool {
        matches!(self, Error::Lease(e) if e.is_fenced())
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Store(e) => e.kind(),
            Error::Lease(e) => e.kind(),
            Error::InvalidInput(_) => ErrorKind::InvalidInput,
            e if e.is_unavailable() => ErrorKind::Unavailable,
            _ => ErrorKind::Backend,
        }
    }
}

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        match &e {
            sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => {
                Error::Unavailable(e.to_string())
            }
            sqlx::Error::Database(db) => {
                let sqlite_busy = idem_sqlite::is_busy(&e);
                // PostgreSQL class 08 (connection), 57P01..03 (shutdown), 40001/40P01.
                let pg_transient = db.code().is_some_and(|c| {
                    c.starts_with("08") || c.starts_with("57P") || c == "40001" || c == "40P01"
                });
                if sqlite_busy || pg_transient {
                    Error::Unavailable(e.to_string())
                } else {
                    Error::Backend(e.to_string())
                }
            }
            _ => Error::Backend(e.to_string()),
        }
    }
}

impl From<Error> for LeaseError {
    fn from(e: Error) -> Self {
        match e {
            Error::Lease(l) => l,
            e if e.is_unavailable() => LeaseError::Unavailable(e.to_string()),
            Error::InvalidInput(s) => LeaseError::InvalidInput(s),
            e => LeaseError::Backend(e.to_string()),
        }
    }
}

/// Why the business refused a request. Every variant is a final answer for the request
/// that got it (replayed under the same key), except [`OrderError::Busy`] and
/// [`OrderError::Internal`] when it is unavailable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OrderError {
    #[error("show {show_id} does not exist")]
    UnknownShow { show_id: String },
    #[error("quantity must be at least 1, got {quantity}")]
    QuantityTooSmall { quantity: i64 },
    #[error("at most {limit} tickets per order for show {show_id}, got {quantity}")]
    QuantityAboveLimit {
        show_id: String,
        quantity: i64,
        limit: i64,
    },
    #[error("show {show_id} has {available} tickets left, {quantity} requested")]
    SoldOut {
        show_id: String,
        quantity: i64,
        available: i64,
    },
    /// Absent, or another tenant's: the two are indistinguishable on purpose.
    #[error("order {order_id} not found")]
    OrderNotFound { order_id: String },
    #[error("{field}: {reason}")]
    InvalidField { field: &'static str, reason: String },
    #[error(transparent)]
    IllegalTransition(#[from] IllegalTransition),
    /// The stock the order needs is all in rows other transactions hold right now.
    #[error("show {show_id}'s remaining tickets are being taken by other orders; retry with the same key")]
    StockBusy { show_id: String },
    /// Another request holds the order's lease for longer than we wait.
    #[error("order {order_id} is busy with another request; retry with the same key")]
    Busy { order_id: String },
    #[error(transparent)]
    Internal(#[from] Error),
}

impl From<sqlx::Error> for OrderError {
    fn from(e: sqlx::Error) -> Self {
        OrderError::Internal(e.into())
    }
}

impl From<StoreError> for OrderError {
    fn from(e: StoreError) -> Self {
        OrderError::Internal(e.into())
    }
}

impl From<LeaseError> for OrderError {
    fn from(e: LeaseError) -> Self {
        OrderError::Internal(e.into())
    }
}
