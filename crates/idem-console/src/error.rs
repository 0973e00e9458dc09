//! Why a console page could not be built: unavailable (the database did not answer,
//! retry) or a failure whose cause is logged. Owns that split only; the page wording is
//! `access::failed`'s.

use std::fmt;

use idem_core::{LeaseError, StoreError};

/// A page's failure, as the console words it.
#[derive(Debug)]
pub struct ConsoleError {
    unavailable: bool,
    message: String,
}

impl ConsoleError {
    /// The database (or another store) did not answer; the operator may retry.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            unavailable: true,
            message: message.into(),
        }
    }

    /// Any other failure; the log keeps `message`.
    pub fn backend(message: impl Into<String>) -> Self {
        Self {
            unavailable: false,
            message: message.into(),
        }
    }

    pub fn is_unavailable(&self) -> bool {
        self.unavailable
    }
}

impl fmt::Display for ConsoleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConsoleError {}

impl From<StoreError> for ConsoleError {
    fn from(e: StoreError) -> Self {
        Self {
            unavailable: e.is_unavailable(),
            message: e.to_string(),
        }
    }
}

impl From<LeaseError> for ConsoleError {
    fn from(e: LeaseError) -> Self {
        Self {
            unavailable: e.is_unavailable(),
            message: e.to_string(),
        }
    }
}

impl From<sqlx::Error> for ConsoleError {
    fn from(e: sqlx::Error) -> Self {
        // Pool or connection trouble, SQLite busy, PostgreSQL connection classes: retry.
        let unavailable = match &e {
            sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => true,
            sqlx::Error::Database(db) => db.code().is_some_and(|c| {
                c.parse::<i32>().is_ok_and(|n| matches!(n & 0xff, 5 | 6))
                    || c.starts_with("08")
                    || c.starts_with("57P")
            }),
            _ => false,
        };
        Self {
            unavailable,
            message: e.to_string(),
        }
    }
}
