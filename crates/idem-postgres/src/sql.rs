//! The statements, built once per store with the (optionally schema-qualified) table name.
//!
//! Qualifying the table lets the transactional form run on a caller's connection whose
//! `search_path` does not include the store's schema.

use std::sync::Arc;

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

/// Store time: database clock in epoch milliseconds plus the test shift.
/// `clock_timestamp()`, not `now()`: inside a long transaction `now()` stays at the
/// transaction start and would make leases look younger than they are.
const CLOCK: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// The record columns in the order `row::record` reads them, prefixed by `alias.`.
fn cols(alias: &str) -> String {
    [
        "tenant_id",
        "key",
        "principal",
        "fingerprint",
        "state",
        "version",
        "owner",
        "lease_expires_at",
        "result_status",
        "result_headers::text AS result_headers",
        "result_body",
        "result_ref",
        "attempts",
        "created_at",
        "updated_at",
        "completed_at",
    ]
    .iter()
    .map(|c| format!("{alias}.{c}"))
    .collect::<Vec<_>>()
    .join(", ")
}

/// Built once per store; each use clones an `Arc`, not the text.
fn shared(sql: String) -> SqlStr {
    AssertSqlSafe(Arc::<str>::from(sql)).into_sql_str()
}

pub(crate) struct Statements {
    /// Plain fresh-key insert. `tenant_id`, `key`, `principal`, `fingerprint`, `owner`,
    /// lease ms, shift ms. Returns `version, lease_expires_at, attempts` or nothing.
    pub claim_fresh: SqlStr,
    /// Read-or-insert in one statement. Same parameters as `claim_fresh`; returns the
    /// columns of [`CLAIM_COLS`] (a fresh row, the existing record, or nothing).
    pub claim: SqlStr,
    /// The existing record for a claim's decision. `tenant_id`, `key`, shift ms; returns
    /// the existing-record columns of [`CLAIM_COLS`].
    pub claim_read: SqlStr,
    /// Takeover compare-and-set. The `claim_fresh` parameters, then the version read.
    /// Returns `version, lease_expires_at, attempts` or nothing (lost the race).
    pub take_over: SqlStr,
    /// `tenant_id`, `key`, version, owner, shift, state, status, headers, body, ref,
    /// terminal. Returns the columns `finish` does not know: [`FINISH_COLS`].
    pub finish: SqlStr,
    /// `tenant_id`, `key`, version, owner, shift, lease ms.
    pub extend: SqlStr,
    /// A final record inserted whole, unless the key has one. `tenant_id`, `key`,
    /// `principal`, `fingerprint`, state, owner, status, headers, body, ref, shift ms.
    /// Returns `created_at` or nothing.
    pub insert_final: SqlStr,
    /// `tenant_id`, `key`.
    pub get: SqlStr,
    /// Table name as a string literal parameter for `to_regclass`.
    pub guard: SqlStr,
    pub table: String,
}

/// Columns of a claim answer, in order (`crate::row::claim_row` reads them by index):
/// `fresh`, `version`, `lease_expires_at`, `attempts`, then for an existing record
/// `now_ms`, `principal`, `fingerprint`, `state`, `owner`, `result_status`,
/// `result_headers`, `result_body`, `result_ref`, `created_at`, `updated_at`,
/// `completed_at` (all NULL on a fresh row, which needs none of them).
pub(crate) const CLAIM_COLS: usize = 16;

/// Existing-record part of a claim answer (after `fresh`): the record read as `r`,
/// and the store clock as `c.now_ms`.
const EXISTING_COLS: &str = "r.version, r.lease_expires_at, r.attempts, c.now_ms, \
    r.principal, r.fingerprint, r.state, r.owner, r.result_status, \
    r.result_headers::text AS result_headers, r.result_body, r.result_ref, r.created_at, \
    r.updated_at, r.completed_at";

/// Columns `finish` returns, in order: `principal`, `fingerprint`, `attempts`,
/// `created_at`, `updated_at`, `completed_at`, `version`.
pub(crate) const FINISH_COLS: usize = 7;

impl Statements {
    pub fn new(schema: Option<&str>) -> Self {
        let t = match schema {
            Some(s) => format!("\"{s}\".idem_records"),
            None => "idem_records".to_string(),
        };
        let insert_cols = "tenant_id, key, principal, fingerprint, state, version, owner, \
                           lease_expires_at, attempts, created_at, updated_at";

        // One plain statement for a fresh key (docs/DESIGN.md: commit costs). DO NOTHING takes no row lock
        // and writes nothing when the key exists. If the conflicting row is still
        // uncommitted this waits for it, so an empty answer means the row is committed
        // and visible to the next statement (`claim_read`).
        let claim_fresh = format!(
            "INSERT INTO {t} ({insert_cols})
             SELECT $1, $2, $3, $4, 'PROCESSING', 1, $5, c.now_ms + $6, 1, c.now_ms, c.now_ms
             FROM (SELECT {CLOCK} + $7 AS now_ms) c
             ON CONFLICT (tenant_id, key) DO NOTHING
             RETURNING version, lease_expires_at, attempts"
        );

        // The default claim: one round trip whatever the key's state. `cur` reads the
        // existing record with the store clock; only when there is none does `ins`
        // insert a fresh PROCESSING record. Rust applies `decide` to an existing record
        // (replay, in progress, mismatch; a takeover is a separate compare-and-set,
        // `take_over`). Reading first keeps the common existing-key answers cheap: the
        // insert (and the table's CHECK constraints, which PostgreSQL evaluates before
        // looking for a conflict) never runs for a key that is already there.
        // Pitfall (docs/DESIGN.md: pitfalls): when the key is absent from this statement's snapshot but a
        // concurrent transaction inserts it and commits while `ins` waits on the unique
        // index, `ins` conflicts and `cur` (the older snapshot) has nothing: no row comes
        // back. The caller re-runs the statement, whose new snapshot sees the record.
        let claim = format!(
            "WITH cur AS MATERIALIZED (
                 SELECT {EXISTING_COLS}
                 FROM {t} r CROSS JOIN (SELECT {CLOCK} + $7 AS now_ms) c
                 WHERE r.tenant_id = $1 AND r.key = $2
             ),
             ins AS (
                 INSERT INTO {t} ({insert_cols})
                 SELECT $1, $2, $3, $4, 'PROCESSING', 1, $5, c.now_ms + $6, 1, c.now_ms,
                        c.now_ms
                 FROM (SELECT {CLOCK} + $7 AS now_ms) c
                 WHERE NOT EXISTS (SELECT 1 FROM cur)
                 ON CONFLICT (tenant_id, key) DO NOTHING
                 RETURNING version, lease_expires_at, attempts
             )
             SELECT true, ins.version, ins.lease_expires_at, ins.attempts, NULL::bigint,
                    NULL::text, NULL::bytea, NULL::text, NULL::text, NULL::integer,
                    NULL::text, NULL::bytea, NULL::text, NULL::bigint, NULL::bigint,
                    NULL::bigint
             FROM ins
             UNION ALL
             SELECT false, cur.* FROM cur",
        );

        // The read after `claim_fresh` found the key taken (a new statement, so a new
        // snapshot that sees the committed conflicting row).
        let claim_read = format!(
            "SELECT false, {EXISTING_COLS}
             FROM {t} r CROSS JOIN (SELECT {CLOCK} + $3 AS now_ms) c
             WHERE r.tenant_id = $1 AND r.key = $2",
        );

        // Takeover of FAILED_RETRYABLE / expired PROCESSING: a compare-and-set on the
        // version the claim read (the previous attempt's result stays as evidence until
        // this attempt finishes). Under READ COMMITTED a concurrent update makes
        // PostgreSQL re-check the WHERE clause against the newest row version, so of many
        // takers exactly one matches; the others update nothing and re-read. The state,
        // lease and request checks repeat `decide` in SQL, so a row that changed in any
        // way the version did not capture is never taken.
        let take_over = format!(
            "UPDATE {t} r
             SET state = 'PROCESSING', version = r.version + 1, owner = $5,
                 lease_expires_at = c.now_ms + $6, attempts = r.attempts + 1,
                 updated_at = c.now_ms
             FROM (SELECT {CLOCK} + $7 AS now_ms) c
             WHERE r.tenant_id = $1 AND r.key = $2 AND r.version = $8
               AND r.principal = $3 AND r.fingerprint = $4
               AND (r.state = 'FAILED_RETRYABLE'
                    OR (r.state = 'PROCESSING'
                        AND (r.lease_expires_at IS NULL OR r.lease_expires_at <= c.now_ms)))
             RETURNING r.version, r.lease_expires_at, r.attempts"
        );

        // Compare-and-set on (version, owner, PROCESSING). The owner stays for evidence;
        // the lease ends (a finished record holds none); completed_at is set for terminal
        // outcomes only (retention counts from it). Only the columns the caller cannot
        // rebuild come back (not the result it just sent). When nothing matched the
        // caller reads the record to tell a retry of this very finish from a stale one.
        let finish = format!(
            "UPDATE {t} r
             SET state = $6, version = r.version + 1, updated_at = c.now_ms,
                 lease_expires_at = NULL,
                 completed_at = CASE WHEN $11 THEN c.now_ms END, result_status = $7,
                 result_headers = $8::jsonb, result_body = $9, result_ref = $10
             FROM (SELECT {CLOCK} + $5 AS now_ms) c
             WHERE r.tenant_id = $1 AND r.key = $2 AND r.version = $3
               AND r.owner = $4 AND r.state = 'PROCESSING'
             RETURNING r.principal, r.fingerprint, r.attempts, r.created_at, r.updated_at,
                       r.completed_at, r.version"
        );

        // Heartbeat: same CAS, no version bump (the token stays valid).
        let extend = format!(
            "UPDATE {t} r
             SET lease_expires_at = c.now_ms + $6, updated_at = c.now_ms
             FROM (SELECT {CLOCK} + $5 AS now_ms) c
             WHERE r.tenant_id = $1 AND r.key = $2 AND r.version = $3
               AND r.owner = $4 AND r.state = 'PROCESSING'
             RETURNING r.lease_expires_at"
        );

        // The one-commit create: the record is written once, final, in the business
        // transaction; a duplicate's uncommitted row makes this wait, then do nothing.
        let insert_final = format!(
            "INSERT INTO {t} (tenant_id, key, principal, fingerprint, state, version, owner,
                              lease_expires_at, attempts, created_at, updated_at, completed_at,
                              result_status, result_headers, result_body, result_ref)
             SELECT $1, $2, $3, $4, $5, 1, $6, NULL, 1, c.now_ms, c.now_ms, c.now_ms,
                    $7, $8::jsonb, $9, $10
             FROM (SELECT {CLOCK} + $11 AS now_ms) c
             ON CONFLICT (tenant_id, key) DO NOTHING
             RETURNING created_at"
        );

        let get = format!(
            "SELECT {} FROM {t} r WHERE r.tenant_id = $1 AND r.key = $2",
            cols("r")
        );

        // Reads the live catalog: a valid, immediate, non-partial unique index whose key
        // columns are exactly {tenant_id, key}. `to_regclass` resolves the table the same
        // way the store's statements do (qualified, or through search_path).
        let guard = "SELECT EXISTS (
                 SELECT 1
                 FROM pg_index i
                 JOIN pg_class t ON t.oid = i.indrelid
                 JOIN pg_namespace n ON n.oid = t.relnamespace
                 WHERE i.indrelid = to_regclass($1)
                   AND i.indisunique AND i.indisvalid AND i.indisready AND i.indimmediate
                   AND i.indpred IS NULL AND i.indexprs IS NULL
                   AND i.indnkeyatts = 2
                   AND (SELECT array_agg(a.attname::text ORDER BY a.attname)
                        FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
                        JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum
                        WHERE k.ord <= i.indnkeyatts)
                       = ARRAY['key', 'tenant_id']
             )"
        .to_string();

        Statements {
            claim_fresh: shared(claim_fresh),
            claim: shared(claim),
            claim_read: shared(claim_read),
            take_over: shared(take_over),
            finish: shared(finish),
            extend: shared(extend),
            insert_final: shared(insert_final),
            get: shared(get),
            guard: shared(guard),
            table: t,
        }
    }
}
