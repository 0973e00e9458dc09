//! The record statements, in the dialect MySQL 8 and MariaDB 10.11 both accept.
//!
//! Owns the text of every record statement and the order of its `?` parameters (MySQL
//! placeholders are positional and each occurrence is bound once, so a value used twice
//! is bound twice; the comments list them). It must not run anything.
//!
//! Neither server returns rows from `INSERT`/`UPDATE` in both dialects (MariaDB has
//! `INSERT … RETURNING`, MySQL 8 has none), so a statement that must hand back one
//! computed value (a lease deadline, a completion time) sets that column to
//! `LAST_INSERT_ID(expr)`: the server reports `expr` in the statement's OK packet
//! (`last_insert_id`), in the same round trip, on both servers.

/// Store time in epoch milliseconds, with the test shift as its one `?`. `NOW(3)` is the
/// statement's start (constant within a statement, unlike PostgreSQL's `now()` it is not
/// the transaction's); the session's `time_zone` is `+00:00`, so `UNIX_TIMESTAMP` has no
/// daylight-saving gap to fall into.
pub(crate) const CLOCK: &str = "(CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) + ?)";

/// The record columns `row::record_row` reads by name.
pub(crate) const RECORD_COLS: &str = "tenant_id, `key`, principal, fingerprint, state, \
     version, owner, lease_expires_at, result_status, result_headers, result_body, \
     result_ref, attempts, created_at, updated_at, completed_at";

/// `shift`, `tenant_id`, `key`. The record and the store clock (`now_ms`).
pub(crate) fn claim_read() -> String {
    format!("SELECT {RECORD_COLS}, {CLOCK} AS now_ms FROM idem_records WHERE tenant_id = ? AND `key` = ?")
}

/// A fresh PROCESSING record. `tenant_id`, `key`, `principal`, `fingerprint`, `owner`,
/// `shift`, lease ms, `shift`, `shift`. Fails with ER_DUP_ENTRY when the key has a
/// record (after waiting for an uncommitted one); `last_insert_id` is the lease deadline.
pub(crate) fn claim_fresh() -> String {
    format!(
        "INSERT INTO idem_records (tenant_id, `key`, principal, fingerprint, state, version, \
           owner, lease_expires_at, attempts, created_at, updated_at) \
         VALUES (?, ?, ?, ?, 'PROCESSING', 1, ?, LAST_INSERT_ID({CLOCK} + ?), 1, {CLOCK}, {CLOCK})"
    )
}

/// Takeover compare-and-set on the version read. `owner`, `shift`, lease ms, `shift`,
/// `tenant_id`, `key`, version read, `principal`, `fingerprint`, `shift`. One row changed, with the
/// deadline as `last_insert_id`, or none (another caller moved the record first).
///
/// Under READ COMMITTED an `UPDATE` that meets a row locked by another transaction waits
/// and then evaluates its `WHERE` against the newest committed version, so of many
/// takers exactly one matches. The state, lease and request checks repeat `decide`, so a
/// row changed in a way the version did not capture is never taken. No assignment reads a
/// column assigned before it: MySQL assigns left to right, MariaDB may assign all at once
/// (`SIMULTANEOUS_ASSIGNMENT`), and `NOW(3)` is the same within the statement anyway.
pub(crate) fn take_over() -> String {
    format!(
        "UPDATE idem_records SET state = 'PROCESSING', version = version + 1, owner = ?, \
           lease_expires_at = LAST_INSERT_ID({CLOCK} + ?), attempts = attempts + 1, \
           updated_at = {CLOCK} \
         WHERE tenant_id = ? AND `key` = ? AND version = ? AND principal = ? \
           AND fingerprint = ? \
           AND (state = 'FAILED_RETRYABLE' \
                OR (state = 'PROCESSING' \
                    AND (lease_expires_at IS NULL OR lease_expires_at <= {CLOCK})))"
    )
}

/// Compare-and-set on (version, owner, PROCESSING). `state`, `shift`, terminal (0/1),
/// `shift`, `status`, `headers`, `body`, `ref`, `tenant_id`, `key`, version, `owner`. The
/// completion time (updated_at) is `last_insert_id`.
pub(crate) fn finish() -> String {
    format!(
        "UPDATE idem_records SET state = ?, version = version + 1, \
           updated_at = LAST_INSERT_ID({CLOCK}), lease_expires_at = NULL, \
           completed_at = CASE WHEN ? THEN {CLOCK} END, result_status = ?, \
           result_headers = ?, result_body = ?, result_ref = ? \
         WHERE tenant_id = ? AND `key` = ? AND version = ? AND owner = ? \
           AND state = 'PROCESSING'"
    )
}

/// What a finish cannot rebuild from its token: `tenant_id`, `key`.
pub(crate) const FINISHED_READ: &str =
    "SELECT principal, fingerprint, created_at FROM idem_records WHERE tenant_id = ? AND `key` = ?";

/// Heartbeat: the finish's compare-and-set without a version bump. `shift`, lease ms,
/// `shift`, `tenant_id`, `key`, version, `owner`. The new deadline is `last_insert_id`; the
/// connection reports matched rows (CLIENT_FOUND_ROWS), so a heartbeat that changes
/// nothing within one millisecond still counts.
pub(crate) fn extend() -> String {
    format!(
        "UPDATE idem_records SET lease_expires_at = LAST_INSERT_ID({CLOCK} + ?), \
           updated_at = {CLOCK} \
         WHERE tenant_id = ? AND `key` = ? AND version = ? AND owner = ? \
           AND state = 'PROCESSING'"
    )
}

/// The one-commit create's record, whole and final. `tenant_id`, `key`, `principal`,
/// `fingerprint`, state, `owner`, `shift` (three times), status, headers, body, ref. ER_DUP_ENTRY when
/// the key has a record; `last_insert_id` is the creation time.
pub(crate) fn insert_final() -> String {
    format!(
        "INSERT INTO idem_records (tenant_id, `key`, principal, fingerprint, state, version, \
           owner, lease_expires_at, attempts, created_at, updated_at, completed_at, \
           result_status, result_headers, result_body, result_ref) \
         VALUES (?, ?, ?, ?, ?, 1, ?, NULL, 1, LAST_INSERT_ID({CLOCK}), {CLOCK}, \
           {CLOCK}, ?, ?, ?, ?)"
    )
}

/// `tenant_id`, `key`.
pub(crate) fn get() -> String {
    format!("SELECT {RECORD_COLS} FROM idem_records WHERE tenant_id = ? AND `key` = ?")
}

/// Whether a unique index of `idem_records` (in the connection's database) covers exactly
/// `(tenant_id, key)`, whole columns (a prefix index would not guard whole keys).
pub(crate) const GUARD: &str = "SELECT COUNT(*) FROM (
        SELECT index_name FROM information_schema.STATISTICS
        WHERE table_schema = DATABASE() AND table_name = 'idem_records' AND non_unique = 0
        GROUP BY index_name
        HAVING COUNT(*) = 2
           AND SUM(column_name IN ('tenant_id', 'key') AND sub_part IS NULL) = 2
    ) guards";

#[cfg(test)]
mod tests {
    use super::*;

    fn params(s: &str) -> usize {
        s.matches('?').count()
    }

    #[test]
    fn parameter_counts_match_the_binds() {
        assert_eq!(params(&claim_read()), 3);
        assert_eq!(params(&claim_fresh()), 9);
        assert_eq!(params(&take_over()), 10);
        assert_eq!(params(&finish()), 12);
        assert_eq!(params(&extend()), 7);
        assert_eq!(params(&insert_final()), 13);
        assert_eq!(params(&get()), 2);
    }
}
