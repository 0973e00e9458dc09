//! Mapping sqlx errors to the backend-neutral [`StoreError`].
//!
//! Callers branch on the kind: `Unavailable` means "the store could not answer, retry
//! later with the same key" (fail closed), `Backend` means "the store answered with an
//! error that a retry will not fix by itself".

use idem_core::StoreError;

/// SQLSTATE codes that mean the connection (not the statement) failed, so a retry on a
/// fresh connection is the right reaction.
fn sqlstate_is_unavailable(code: &str) -> bool {
    // Class 08: connection exception.
    code.starts_with("08")
        // 57P01 admin_shutdown (pg_terminate_backend, smart/fast shutdown),
        // 57P02 crash_shutdown, 57P03 cannot_connect_now (starting up / recovery),
        // 57P05 idle_session_timeout.
        || matches!(code, "57P01" | "57P02" | "57P03" | "57P05")
        // 53300 too_many_connections: the server is reachable but refuses new sessions.
        || code == "53300"
}

/// Whether a sqlx error means the store was unreachable (retryable) rather than wrong.
pub fn is_unavailable(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|c| sqlstate_is_unavailable(&c)),
        _ => false,
    }
}

/// Converts a sqlx error; `what` names the operation for the message.
pub fn map_err(what: &str, err: sqlx::Error) -> StoreError {
    // Which TLS step failed, and what to do about it (a CA file, the host name).
    let tls = idem_net::tls::describe_failure(&err).or_else(|| match &err {
        sqlx::Error::Tls(e) => Some(format!("TLS: {e}")),
        _ => None,
    });
    if let Some(why) = tls {
        tracing::warn!(operation = what, error = %why, "postgres TLS failed");
        return StoreError::Unavailable(format!("postgres {what}: {why}"));
    }
    if is_unavailable(&err) {
        tracing::warn!(operation = what, error = %err, "postgres unavailable");
        StoreError::Unavailable(format!("postgres {what}: {err}"))
    } else {
        let code = match &err {
            sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
            _ => None,
        };
        tracing::error!(operation = what, error = %err, sqlstate = ?code, "postgres error");
        match code {
            Some(code) => StoreError::Backend(format!("postgres {what} [{code}]: {err}")),
            None => StoreError::Backend(format!("postgres {what}: {err}")),
        }
    }
}

/// Whether `map_err` made this error of SQLSTATE 55P03 (`lock_not_available`: a
/// `lock_timeout` ran out).
pub(crate) fn is_lock_timeout(err: &StoreError) -> bool {
    matches!(err, StoreError::Backend(message) if message.contains(" [55P03]: "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_sqlstates() {
        for code in [
            "08000", "08006", "08P01", "57P01", "57P02", "57P03", "53300",
        ] {
            assert!(sqlstate_is_unavailable(code), "{code}");
        }
        for code in ["23505", "42P10", "40001", "42P01", "57014"] {
            assert!(!sqlstate_is_unavailable(code), "{code}");
        }
    }

    #[test]
    fn classifies_errors() {
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(map_err("claim", io).is_unavailable());
        assert!(map_err("claim", sqlx::Error::PoolTimedOut).is_unavailable());
        assert!(map_err("claim", sqlx::Error::PoolClosed).is_unavailable());
        let other = map_err("claim", sqlx::Error::RowNotFound);
        assert_eq!(other.kind(), idem_core::ErrorKind::Backend);
    }
}
