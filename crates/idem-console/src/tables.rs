//! The console's own tables — sessions and the audit — and their migrations
//! (`migrations/`, a MySQL form in `migrations/mysql/`, run by `idem_sql::migrate`), on
//! any SQL store through `idem_sql`'s [`Conn`](idem_sql::Conn).
//!
//! Owns `console_sessions`, `console_audit` and `console_schema_migrations`. Tables an
//! older host created with the same columns are taken as they are (`IF NOT EXISTS`).
//! It must not read or write any other table.

use idem_sql::migrate::{self, Migration, Schema};
use idem_sql::{sql, SqlStore};

use crate::error::ConsoleError;

const SHARED: &[Migration] = &[Migration::new(
    1,
    "sessions and audit",
    include_str!("../migrations/0001_sessions_and_audit.sql"),
)];

const MYSQL: &[Migration] = &[Migration::new(
    1,
    "sessions and audit",
    include_str!("../migrations/mysql/0001_sessions_and_audit.sql"),
)];

const _: () = assert!(migrate::ascending(SHARED) && migrate::same_versions(SHARED, MYSQL));

pub(crate) fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Applies the console's pending migrations; concurrent migrators take turns.
pub async fn migrate(db: &SqlStore) -> Result<(), ConsoleError> {
    let schema = Schema {
        versions: idem_sql::versions_table!("console_schema_migrations"),
        lock: "idem-console",
        shared: SHARED,
        mysql: MYSQL,
    };
    migrate::run(db, &schema).await?;
    Ok(())
}

/// A live session's operator and CSRF token.
pub(crate) struct SessionRow {
    pub(crate) operator: String,
    pub(crate) csrf: String,
}

pub(crate) async fn find_session(
    db: &SqlStore,
    session_hash: &str,
    token_digest: &str,
) -> Result<Option<SessionRow>, ConsoleError> {
    let mut conn = db.acquire().await?;
    let row = conn
        .conn()
        .optional(
            sql(
                "SELECT operator, csrf FROM console_sessions WHERE session_hash = $1 \
                 AND ended_at IS NULL AND expires_at > $2 AND token_digest = $3",
            )
            .bind(session_hash)
            .bind(now_ms())
            .bind(token_digest),
        )
        .await?;
    match row {
        None => Ok(None),
        Some(r) => Ok(Some(SessionRow {
            operator: r.text("operator")?,
            csrf: r.text("csrf")?,
        })),
    }
}

pub(crate) struct NewSession<'a> {
    pub(crate) session_hash: &'a str,
    pub(crate) operator: &'a str,
    pub(crate) csrf: &'a str,
    pub(crate) ttl_ms: i64,
    pub(crate) token_digest: &'a str,
}

pub(crate) async fn open_session(db: &SqlStore, s: NewSession<'_>) -> Result<(), ConsoleError> {
    let now = now_ms();
    let mut conn = db.acquire().await?;
    let mut c = conn.conn();
    // Sessions that ended a day ago are no evidence anyone needs.
    c.execute(sql("DELETE FROM console_sessions WHERE expires_at < $1").bind(now - 86_400_000))
        .await?;
    c.execute(
        sql(
            "INSERT INTO console_sessions (session_hash, operator, csrf, created_at, \
               expires_at, token_digest) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(s.session_hash)
        .bind(s.operator)
        .bind(s.csrf)
        .bind(now)
        .bind(now + s.ttl_ms)
        .bind(s.token_digest),
    )
    .await?;
    Ok(())
}

pub(crate) async fn end_session(db: &SqlStore, session_hash: &str) -> Result<(), ConsoleError> {
    let mut conn = db.acquire().await?;
    conn.conn()
        .execute(
            sql("UPDATE console_sessions SET ended_at = $1 WHERE session_hash = $2")
                .bind(now_ms())
                .bind(session_hash),
        )
        .await?;
    Ok(())
}

/// One audit row: who, what, on what, why, how it went.
pub struct AuditRow {
    pub at: i64,
    pub operator: String,
    pub action: String,
    pub target: String,
    pub reason: Option<String>,
    pub outcome: String,
}

pub(crate) async fn write_audit(db: &SqlStore, row: &AuditRow) -> Result<(), ConsoleError> {
    let mut conn = db.acquire().await?;
    conn.conn()
        .execute(
            sql(
                "INSERT INTO console_audit (audit_id, at, operator, action, target, reason, \
                   outcome) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(format!("aud_{}", uuid::Uuid::now_v7().simple()))
            .bind(row.at)
            .bind(row.operator.as_str())
            .bind(row.action.as_str())
            .bind(row.target.as_str())
            .bind(row.reason.clone())
            .bind(row.outcome.as_str()),
        )
        .await?;
    Ok(())
}

/// The newest `limit` audit rows, newest first.
pub(crate) async fn recent_audit(db: &SqlStore, limit: i64) -> Result<Vec<AuditRow>, ConsoleError> {
    let mut conn = db.acquire().await?;
    let rows = conn
        .conn()
        .all(
            sql(
                "SELECT at, operator, action, target, reason, outcome FROM console_audit \
                 ORDER BY at DESC, audit_id DESC LIMIT $1",
            )
            .bind(limit),
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok(AuditRow {
                at: r.int("at")?,
                operator: r.text("operator")?,
                action: r.text("action")?,
                target: r.text("target")?,
                reason: r.opt_text("reason")?,
                outcome: r.text("outcome")?,
            })
        })
        .collect()
}
