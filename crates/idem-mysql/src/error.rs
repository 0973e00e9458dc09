//! Mapping sqlx errors to the backend-neutral [`StoreError`], and the InnoDB error codes
//! the store reacts to.
//!
//! Owns the classification only: which errors mean "the server could not answer" (retry
//! later, fail closed), which mean "a lock conflict InnoDB resolved by refusing this
//! statement" (safe to run again when nothing else was in the transaction). It must not
//! retry anything itself.

use idem_core::StoreError;

/// ER_DUP_ENTRY: a unique key (here always a primary key) already holds the value.
pub(crate) const DUP_ENTRY: u16 = 1062;
/// ER_LOCK_WAIT_TIMEOUT: `innodb_lock_wait_timeout` ran out; only the statement is
/// rolled back (with the default `innodb_rollback_on_timeout = OFF`).
pub(crate) const LOCK_WAIT_TIMEOUT: u16 = 1205;
/// ER_LOCK_DEADLOCK: InnoDB chose this transaction as a deadlock victim and rolled all of
/// it back.
pub(crate) const LOCK_DEADLOCK: u16 = 1213;

/// The server's error number of a database error (`None` for other errors).
pub fn error_number(err: &sqlx::Error) -> Option<u16> {
    match err {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .map(|e| e.number()),
        _ => None,
    }
}

/// Server error numbers that mean the session (not the statement) failed.
fn number_is_unavailable(n: u16) -> bool {
    // 1040 too many connections, 1053 server shutdown in progress, 1927 connection
    // killed (MariaDB), 4031 idle session disconnected (MySQL 8), 3169 session killed
    // (MySQL 8), 1317 query interrupted (a KILL).
    matches!(n, 1040 | 1053 | 1317 | 1927 | 3169 | 4031)
}

/// Whether a sqlx error means the store was unreachable (retryable) rather than wrong.
pub fn is_unavailable(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        other => error_number(other).is_some_and(number_is_unavailable),
    }
}

/// Whether InnoDB refused a statement over a lock (deadlock victim or lock wait
/// timeout): nothing of it was written.
pub fn is_lock_conflict(err: &sqlx::Error) -> bool {
    matches!(error_number(err), Some(LOCK_DEADLOCK | LOCK_WAIT_TIMEOUT))
}

/// Converts a sqlx error; `what` names the operation for the message.
pub fn map_err(what: &str, err: sqlx::Error) -> StoreError {
    // Which TLS step failed, and what to do about it (a CA file, the host name).
    let tls = idem_net::tls::describe_failure(&err).or_else(|| match &err {
        sqlx::Error::Tls(e) => Some(format!("TLS: {e}")),
        _ => None,
    });
    if let Some(why) = tls {
        tracing::warn!(operation = what, error = %why, "mysql TLS failed");
        return StoreError::Unavailable(format!("mysql {what}: {why}"));
    }
    if is_unavailable(&err) {
        tracing::warn!(operation = what, error = %err, "mysql unavailable");
        return StoreError::Unavailable(format!("mysql {what}: {err}"));
    }
    match error_number(&err) {
        Some(n) => {
            tracing::error!(operation = what, error = %err, errno = n, "mysql error");
            StoreError::Backend(format!("mysql {what} [{n}]: {err}"))
        }
        None => {
            tracing::error!(operation = what, error = %err, "mysql error");
            StoreError::Backend(format!("mysql {what}: {err}"))
        }
    }
}

/// Whether `map_err` made this error of a lock conflict (1205 or 1213).
pub(crate) fn is_mapped_lock_conflict(err: &StoreError) -> bool {
    matches!(err, StoreError::Backend(m)
        if m.contains(&format!(" [{LOCK_WAIT_TIMEOUT}]: ")) || m.contains(&format!(" [{LOCK_DEADLOCK}]: ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_error_numbers() {
        for n in [1040, 1053, 1927, 4031] {
            assert!(number_is_unavailable(n), "{n}");
        }
        for n in [DUP_ENTRY, LOCK_WAIT_TIMEOUT, LOCK_DEADLOCK, 1146, 1064] {
            assert!(!number_is_unavailable(n), "{n}");
        }
    }

    #[test]
    fn classifies_errors() {
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(map_err("claim", io).is_unavailable());
        assert!(map_err("claim", sqlx::Error::PoolTimedOut).is_unavailable());
        let other = map_err("claim", sqlx::Error::RowNotFound);
        assert_eq!(other.kind(), idem_core::ErrorKind::Backend);
        assert!(!is_mapped_lock_conflict(&other));
        assert!(is_mapped_lock_conflict(&StoreError::Backend(
            "mysql claim [1213]: deadlock".into()
        )));
    }
}
