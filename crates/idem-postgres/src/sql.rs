//! The statements, built once per store with the (optionally schema-qualified) table name.
//!
//! Qualifying the table lets the transactional form run on a caller's connection whose
//! `search_path` does not include the store's schema.

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

pub(crate) struct Statements {
    /// `tenant_id`, `key`, `principal`, `fingerprint`, `owner`, lease ms, shift ms.
    pub claim_fresh: String,
    /// Same parameters as `claim_fresh`.
    pub claim_decide: String,
    /// `tenant_id`, `key`, version, owner, shift, state, status, headers, body, ref,
    /// terminal.
    pub finish: String,
    /// `tenant_id`, `key`, version, owner, shift, lease ms.
    pub extend: String,
    /// `tenant_id`, `key`.
    pub get: String,
    /// Table name as a string literal parameter for `to_regclass`.
    pub guard: String,
    pub table: String,
}

impl Statements {
    pub fn new(schema: Option<&str>) -> Self {
        let t = match schema {
            Some(s) => format!("\"{s}\".idem_records"),
            None => "idem_records".to_string(),
        };
        let insert_cols = "tenant_id, key, principal, fingerprint, state, version, owner, \
                           lease_expires_at, attempts, created_at, updated_at";

        // Fast path (BRIEF §10): one plain statement for a fresh key. DO NOTHING takes no
        // row lock and writes nothing when the key exists; the caller then decides with
        // `claim_decide`. If the conflicting row is still uncommitted this waits for it,
        // so an empty answer means the row is committed and visible to the next statement.
        let claim_fresh = format!(
            "INSERT INTO {t} ({insert_cols})
             SELECT $1, $2, $3, $4, 'PROCESSING', 1, $5, c.now_ms + $6, 1, c.now_ms, c.now_ms
             FROM (SELECT {CLOCK} + $7 AS now_ms) c
             ON CONFLICT (tenant_id, key) DO NOTHING
             RETURNING version, lease_expires_at, attempts"
        );

        // One statement that decides every case atomically:
        //   ins: absent key -> insert PROCESSING (fresh);
        //   cur: the existing record as of the statement snapshot;
        //   tk:  takeover of FAILED_RETRYABLE / expired PROCESSING (the previous attempt's
        //        result stays as evidence until this attempt finishes), a compare-and-set on
        //        the version read in `cur`. Under READ COMMITTED a concurrent update makes
        //        PostgreSQL re-check `r.version = cur.version` against the newest row
        //        version, so of many takers exactly one matches; the others update nothing.
        //   final SELECT: 'fresh' | 'takeover' | 'existing' (Rust applies `decide` to it:
        //        replay, in progress or mismatch; a takeable 'existing' means a lost CAS).
        // Mismatch (fingerprint or principal differ) never matches `tk`: nothing changes.
        // BRIEF §11 pitfall: when `ins` conflicts with a row committed *during* this
        // statement, `cur` (older snapshot) does not see it and no row comes back; the
        // caller re-runs the statement, which then sees the row.
        let claim_decide = format!(
            "WITH clock AS MATERIALIZED (SELECT {CLOCK} + $7 AS now_ms),
             ins AS (
                 INSERT INTO {t} ({insert_cols})
                 SELECT $1, $2, $3, $4, 'PROCESSING', 1, $5, clock.now_ms + $6, 1,
                        clock.now_ms, clock.now_ms
                 FROM clock
                 ON CONFLICT (tenant_id, key) DO NOTHING
                 RETURNING *
             ),
             cur AS MATERIALIZED (
                 SELECT r.*, clock.now_ms FROM {t} r CROSS JOIN clock
                 WHERE r.tenant_id = $1 AND r.key = $2
             ),
             tk AS (
                 UPDATE {t} r
                 SET state = 'PROCESSING', version = r.version + 1, owner = $5,
                     lease_expires_at = cur.now_ms + $6, attempts = r.attempts + 1,
                     updated_at = cur.now_ms
                 FROM cur
                 WHERE r.tenant_id = $1 AND r.key = $2 AND r.version = cur.version
                   AND cur.principal = $3 AND cur.fingerprint = $4
                   AND (cur.state = 'FAILED_RETRYABLE'
                        OR (cur.state = 'PROCESSING'
                            AND (cur.lease_expires_at IS NULL
                                 OR cur.lease_expires_at <= cur.now_ms)))
                 RETURNING r.*, cur.state AS prev_state, cur.owner AS prev_owner,
                           cur.now_ms AS now_ms
             )
             SELECT 'fresh' AS outcome, NULL::text AS prev_state, NULL::text AS prev_owner,
                    clock.now_ms, {ins_cols}
             FROM ins CROSS JOIN clock
             UNION ALL
             SELECT 'takeover', tk.prev_state, tk.prev_owner, tk.now_ms, {tk_cols}
             FROM tk
             UNION ALL
             SELECT 'existing', NULL, NULL, cur.now_ms, {cur_cols}
             FROM cur WHERE NOT EXISTS (SELECT 1 FROM tk)",
            ins_cols = cols("ins"),
            tk_cols = cols("tk"),
            cur_cols = cols("cur"),
        );

        // Compare-and-set on (version, owner, PROCESSING). The owner stays for evidence;
        // the lease ends (a finished record holds none); completed_at is set for terminal
        // outcomes only (retention counts from it). When nothing matched, the current record
        // comes back too, so the caller can tell "already finished by this very token"
        // (a retry after a lost response) from "superseded".
        let finish = format!(
            "WITH upd AS (
                 UPDATE {t} r
                 SET state = $6, version = r.version + 1, updated_at = c.now_ms,
                     lease_expires_at = NULL,
                     completed_at = CASE WHEN $11 THEN c.now_ms END, result_status = $7,
                     result_headers = $8::jsonb, result_body = $9, result_ref = $10
                 FROM (SELECT {CLOCK} + $5 AS now_ms) c
                 WHERE r.tenant_id = $1 AND r.key = $2 AND r.version = $3
                   AND r.owner = $4 AND r.state = 'PROCESSING'
                 RETURNING r.*
             )
             SELECT true AS applied, {upd_cols} FROM upd
             UNION ALL
             SELECT false, {cur_cols} FROM {t} r
             WHERE r.tenant_id = $1 AND r.key = $2 AND NOT EXISTS (SELECT 1 FROM upd)",
            upd_cols = cols("upd"),
            cur_cols = cols("r"),
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
            claim_fresh,
            claim_decide,
            finish,
            extend,
            get,
            guard,
            table: t,
        }
    }
}
