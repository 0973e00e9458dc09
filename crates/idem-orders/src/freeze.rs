//! Freeze switches: stop parts of the automatic chain for a scope while people look.
//!
//! A freeze names a scope (`user:U`, `show:S` or `all`, optionally one tenant) and what
//! it stops: `payment-confirm` (confirming charges), `ticketing` (issuing tickets),
//! `inventory-release` (returning held stock). Work that meets a freeze is not dropped:
//! it stays queued (a `payment.requested` message, a pending delivery) and runs once the
//! freeze ends. Freezes live in the database, so `idem freeze` on the database URL and
//! the admin API are the same switch, and every instance sees it.
//!
//! Owns the `freezes` table and the question "is this work frozen?". Unfreezing keeps
//! the row (with `unfrozen_at`): the history of freezes is evidence too. It must not
//! run or drop the work itself.

use std::fmt;
use std::str::FromStr;

use idem_sql::Backend;
use serde::{Deserialize, Serialize};

use crate::db::{sql, Conn, Database, DatabaseOptions, Row};
use crate::error::Error;
use crate::ledgers::{new_id, now_ms, wake_deliveries};
use crate::text::{check_text, rfc3339};

/// Who or what a freeze covers.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum FreezeScope {
    User(String),
    Show(String),
    All,
}

impl FreezeScope {
    /// `user`, `show` or `all`: what a metric may say about a scope (never its value).
    pub fn kind(&self) -> &'static str {
        match self {
            FreezeScope::User(_) => "user",
            FreezeScope::Show(_) => "show",
            FreezeScope::All => "all",
        }
    }

    fn value(&self) -> &str {
        match self {
            FreezeScope::User(v) | FreezeScope::Show(v) => v,
            FreezeScope::All => "",
        }
    }

    fn from_parts(kind: &str, value: String) -> Result<Self, Error> {
        match kind {
            "user" => Ok(FreezeScope::User(value)),
            "show" => Ok(FreezeScope::Show(value)),
            "all" => Ok(FreezeScope::All),
            other => Err(Error::Backend(format!("freeze scope kind {other:?}"))),
        }
    }
}

impl fmt::Display for FreezeScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FreezeScope::All => f.write_str("all"),
            other => write!(f, "{}:{}", other.kind(), other.value()),
        }
    }
}

impl FromStr for FreezeScope {
    type Err = Error;
    /// `user:U`, `show:S` or `all`.
    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = || {
            Error::InvalidInput(format!(
                "freeze scope {s:?}: expected user:USER_ID, show:SHOW_ID or all"
            ))
        };
        if s == "all" {
            return Ok(FreezeScope::All);
        }
        let (kind, value) = s.split_once(':').ok_or_else(bad)?;
        if value.is_empty() || value.len() > 128 || value.chars().any(char::is_control) {
            return Err(bad());
        }
        match kind {
            "user" => Ok(FreezeScope::User(value.to_owned())),
            "show" => Ok(FreezeScope::Show(value.to_owned())),
            _ => Err(bad()),
        }
    }
}

impl TryFrom<String> for FreezeScope {
    type Error = Error;
    fn try_from(s: String) -> Result<Self, Error> {
        s.parse()
    }
}

impl From<FreezeScope> for String {
    fn from(s: FreezeScope) -> String {
        s.to_string()
    }
}

/// A part of the automatic chain a freeze can stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FreezeWhat {
    PaymentConfirm,
    Ticketing,
    InventoryRelease,
}

impl FreezeWhat {
    pub const ALL: [FreezeWhat; 3] = [
        FreezeWhat::PaymentConfirm,
        FreezeWhat::Ticketing,
        FreezeWhat::InventoryRelease,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FreezeWhat::PaymentConfirm => "payment-confirm",
            FreezeWhat::Ticketing => "ticketing",
            FreezeWhat::InventoryRelease => "inventory-release",
        }
    }

    /// A comma-separated list (`payment-confirm,ticketing`); `all` means every part.
    /// Duplicates are dropped; the result is sorted.
    pub fn parse_list(s: &str) -> Result<Vec<FreezeWhat>, Error> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part == "all" {
                out.extend(FreezeWhat::ALL);
            } else {
                out.push(part.parse()?);
            }
        }
        if out.is_empty() {
            return Err(Error::InvalidInput(
                "freeze needs at least one of payment-confirm, ticketing, inventory-release".into(),
            ));
        }
        out.sort();
        out.dedup();
        Ok(out)
    }
}

impl fmt::Display for FreezeWhat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FreezeWhat {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        FreezeWhat::ALL
            .into_iter()
            .find(|w| w.as_str() == s)
            .ok_or_else(|| {
                Error::InvalidInput(format!(
                    "{s:?} is not one of payment-confirm, ticketing, inventory-release"
                ))
            })
    }
}

/// Longest freeze reason, in bytes (the console's 500 characters fit).
pub const MAX_REASON: usize = 2048;
/// Longest actor, in bytes (`console:` and the console's 64-character names fit).
pub const MAX_ACTOR: usize = 512;

/// A freeze (or an unfreeze) to apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreezeRequest {
    /// `None`: every tenant.
    #[serde(default)]
    pub tenant: Option<String>,
    pub scope: FreezeScope,
    pub what: Vec<FreezeWhat>,
    #[serde(default)]
    pub reason: Option<String>,
    /// Who is acting (an operator name); recorded as evidence.
    #[serde(default)]
    pub actor: Option<String>,
}

impl FreezeRequest {
    pub fn new(scope: FreezeScope, what: impl IntoIterator<Item = FreezeWhat>) -> Self {
        Self {
            tenant: None,
            scope,
            what: what.into_iter().collect(),
            reason: None,
            actor: None,
        }
    }

    /// The free text (`reason`, `actor`) reaches the log and the console: no control
    /// characters, and bounded. Empty is the same as absent.
    pub(crate) fn check_text(&self) -> Result<(), crate::OrderError> {
        let some = |v: &Option<String>| v.clone().filter(|v| !v.is_empty());
        if let Some(reason) = some(&self.reason) {
            check_text("reason", &reason, MAX_REASON)?;
        }
        if let Some(actor) = some(&self.actor) {
            check_text("actor", &actor, MAX_ACTOR)?;
        }
        Ok(())
    }

    fn check(&self) -> Result<(), Error> {
        self.check_text()
            .map_err(|e| Error::InvalidInput(e.to_string()))?;
        if self.what.is_empty() {
            return Err(Error::InvalidInput(
                "freeze needs at least one `what`".into(),
            ));
        }
        if let Some(t) = &self.tenant {
            idem_core::TenantId::new(t.clone()).map_err(|e| Error::InvalidInput(e.to_string()))?;
        }
        Ok(())
    }

    fn tenant_column(&self) -> String {
        self.tenant.clone().unwrap_or_default()
    }
}

/// One freeze row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Freeze {
    pub freeze_id: String,
    /// `None`: every tenant.
    pub tenant: Option<String>,
    pub scope: FreezeScope,
    pub what: FreezeWhat,
    pub reason: Option<String>,
    pub frozen_by: String,
    pub frozen_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unfrozen_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unfrozen_by: Option<String>,
}

impl Freeze {
    pub fn is_active(&self) -> bool {
        self.unfrozen_at.is_none()
    }
}

/// What a freeze or unfreeze did, and what is frozen afterwards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreezeChange {
    /// Rows created (freeze) or ended (unfreeze) by this call; an already-active freeze
    /// is not created twice.
    pub changed: Vec<Freeze>,
    /// Every active freeze after the call.
    pub active: Vec<Freeze>,
}

fn freeze_from(row: &Row) -> Result<Freeze, Error> {
    let tenant = row.text("tenant_id")?;
    Ok(Freeze {
        freeze_id: row.text("freeze_id")?,
        tenant: (!tenant.is_empty()).then_some(tenant),
        scope: FreezeScope::from_parts(&row.text("scope_kind")?, row.text("scope_value")?)?,
        what: row.text("what")?.parse()?,
        reason: row.opt_text("reason")?,
        frozen_by: row.text("frozen_by")?,
        frozen_at: rfc3339(row.int("frozen_at")?),
        unfrozen_at: row.opt_int("unfrozen_at")?.map(rfc3339),
        unfrozen_by: row.opt_text("unfrozen_by")?,
    })
}

/// Freezes `what` for the scope. Idempotent: an active freeze of the same scope and
/// part is kept as it is.
pub async fn apply_freeze(db: &Database, request: &FreezeRequest) -> Result<FreezeChange, Error> {
    request.check()?;
    let now = now_ms();
    let actor = request.actor.clone().unwrap_or_else(|| "operator".into());
    let mut tx = db.begin().await?;
    let mut c = tx.conn();
    let mut changed = Vec::new();
    for what in &request.what {
        let id = new_id("frz");
        let insert = c.pick(
            "INSERT INTO freezes (freeze_id, tenant_id, scope_kind, scope_value, what, \
               reason, frozen_by, frozen_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT DO NOTHING",
            "INSERT INTO freezes (freeze_id, tenant_id, scope_kind, scope_value, what, \
               reason, frozen_by, frozen_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        );
        let written = c
            .insert_new(
                sql(insert)
                    .bind(&id)
                    .bind(request.tenant_column())
                    .bind(request.scope.kind())
                    .bind(request.scope.value())
                    .bind(what.as_str())
                    .bind(request.reason.clone())
                    .bind(&actor)
                    .bind(now),
            )
            .await?;
        if written == 1 {
            let row = c
                .one(
                    sql(
                        "SELECT freeze_id, tenant_id, scope_kind, scope_value, what, reason, \
                           frozen_by, frozen_at, unfrozen_at, unfrozen_by FROM freezes \
                         WHERE freeze_id = $1",
                    )
                    .bind(&id),
                )
                .await?;
            changed.push(freeze_from(&row)?);
        }
    }
    let active = active_on(&mut c).await?;
    tx.commit().await?;
    // Free text is logged quoted (Debug): it cannot pass for a log line of its own.
    for f in &changed {
        tracing::warn!(
            scope = ?f.scope.to_string(),
            what = %f.what,
            tenant = ?f.tenant,
            by = ?f.frozen_by,
            reason = f.reason.as_deref().map(tracing::field::debug),
            "frozen"
        );
    }
    Ok(FreezeChange { changed, active })
}

/// Ends the active freezes of exactly this scope (and tenant) for `what`. Frozen work
/// becomes due at once.
pub async fn apply_unfreeze(db: &Database, request: &FreezeRequest) -> Result<FreezeChange, Error> {
    request.check()?;
    let now = now_ms();
    let actor = request.actor.clone().unwrap_or_else(|| "operator".into());
    let mut tx = db.begin().await?;
    let mut c = tx.conn();
    let mut changed = Vec::new();
    for what in &request.what {
        let rows = if c.backend() == Backend::Mysql {
            unfreeze_mysql(&mut c, request, *what, now, &actor).await?
        } else {
            c.all(
                sql("UPDATE freezes SET unfrozen_at = $5, unfrozen_by = $6 \
                     WHERE unfrozen_at IS NULL AND tenant_id = $1 AND scope_kind = $2 \
                       AND scope_value = $3 AND what = $4 \
                     RETURNING freeze_id, tenant_id, scope_kind, scope_value, what, reason, \
                       frozen_by, frozen_at, unfrozen_at, unfrozen_by")
                .bind(request.tenant_column())
                .bind(request.scope.kind())
                .bind(request.scope.value())
                .bind(what.as_str())
                .bind(now)
                .bind(&actor),
            )
            .await?
        };
        for row in &rows {
            changed.push(freeze_from(row)?);
        }
    }
    if !changed.is_empty() {
        // Deferred deliveries wait for their next check; make them due now.
        wake_deliveries(&mut c, now).await?;
    }
    let active = active_on(&mut c).await?;
    tx.commit().await?;
    for f in &changed {
        tracing::warn!(
            scope = ?f.scope.to_string(),
            what = %f.what,
            tenant = ?f.tenant,
            by = ?actor,
            "unfrozen"
        );
    }
    Ok(FreezeChange { changed, active })
}

/// MySQL has no UPDATE … RETURNING: the active freezes of the scope are locked and read
/// first, then ended by id.
async fn unfreeze_mysql(
    c: &mut Conn<'_>,
    request: &FreezeRequest,
    what: FreezeWhat,
    now: i64,
    actor: &str,
) -> Result<Vec<Row>, Error> {
    let ids = c
        .all(
            sql("SELECT freeze_id FROM freezes \
                 WHERE unfrozen_at IS NULL AND tenant_id = $1 AND scope_kind = $2 \
                   AND scope_value = $3 AND what = $4 FOR UPDATE")
            .bind(request.tenant_column())
            .bind(request.scope.kind())
            .bind(request.scope.value())
            .bind(what.as_str()),
        )
        .await?;
    let mut rows = Vec::with_capacity(ids.len());
    for id in ids {
        let id = id.text("freeze_id")?;
        c.execute(
            sql("UPDATE freezes SET unfrozen_at = $2, unfrozen_by = $3 \
                 WHERE freeze_id = $1 AND unfrozen_at IS NULL")
            .bind(&id)
            .bind(now)
            .bind(actor),
        )
        .await?;
        rows.push(
            c.one(
                sql(
                    "SELECT freeze_id, tenant_id, scope_kind, scope_value, what, reason, \
                       frozen_by, frozen_at, unfrozen_at, unfrozen_by FROM freezes \
                     WHERE freeze_id = $1",
                )
                .bind(&id),
            )
            .await?,
        );
    }
    Ok(rows)
}

/// Every active freeze.
pub async fn active_freezes(db: &Database) -> Result<Vec<Freeze>, Error> {
    let mut conn = db.acquire().await?;
    active_on(&mut conn.conn()).await
}

/// Every freeze ever applied, oldest first.
pub async fn freeze_history(db: &Database) -> Result<Vec<Freeze>, Error> {
    let mut conn = db.acquire().await?;
    let rows = conn
        .conn()
        .all(sql(
            "SELECT freeze_id, tenant_id, scope_kind, scope_value, what, reason, frozen_by, \
               frozen_at, unfrozen_at, unfrozen_by FROM freezes ORDER BY frozen_at, freeze_id",
        ))
        .await?;
    rows.iter().map(freeze_from).collect()
}

async fn active_on(c: &mut Conn<'_>) -> Result<Vec<Freeze>, Error> {
    const Q: &str = "SELECT freeze_id, tenant_id, scope_kind, scope_value, what, reason, \
         frozen_by, frozen_at, unfrozen_at, unfrozen_by FROM freezes WHERE unfrozen_at IS NULL \
         ORDER BY frozen_at, freeze_id";
    c.all(sql(Q)).await?.iter().map(freeze_from).collect()
}

/// The active freeze (if any) that stops `what` for an order of `user` on `show`.
pub(crate) async fn frozen_for(
    c: &mut Conn<'_>,
    tenant: &str,
    user: &str,
    show: &str,
    what: FreezeWhat,
) -> Result<Option<Freeze>, Error> {
    c.optional(
        sql(
            "SELECT freeze_id, tenant_id, scope_kind, scope_value, what, reason, frozen_by, \
               frozen_at, unfrozen_at, unfrozen_by FROM freezes \
             WHERE unfrozen_at IS NULL AND what = $1 AND (tenant_id = '' OR tenant_id = $2) \
               AND (scope_kind = 'all' OR (scope_kind = 'user' AND scope_value = $3) \
                    OR (scope_kind = 'show' AND scope_value = $4)) \
             ORDER BY frozen_at, freeze_id LIMIT 1",
        )
        .bind(what.as_str())
        .bind(tenant)
        .bind(user)
        .bind(show),
    )
    .await?
    .as_ref()
    .map(freeze_from)
    .transpose()
}

/// Every active freeze that applies to an order of `user` on `show`.
pub(crate) async fn freezes_for(
    c: &mut Conn<'_>,
    tenant: &str,
    user: &str,
    show: &str,
) -> Result<Vec<Freeze>, Error> {
    c.all(
        sql(
            "SELECT freeze_id, tenant_id, scope_kind, scope_value, what, reason, frozen_by, \
               frozen_at, unfrozen_at, unfrozen_by FROM freezes \
             WHERE unfrozen_at IS NULL AND (tenant_id = '' OR tenant_id = $1) \
               AND (scope_kind = 'all' OR (scope_kind = 'user' AND scope_value = $2) \
                    OR (scope_kind = 'show' AND scope_value = $3)) \
             ORDER BY frozen_at, freeze_id",
        )
        .bind(tenant)
        .bind(user)
        .bind(show),
    )
    .await?
    .iter()
    .map(freeze_from)
    .collect()
}

/// `idem freeze` on a database URL, without a running server: the server sees the
/// switch on its next check.
pub async fn freeze(database_url: &str, request: &FreezeRequest) -> Result<FreezeChange, Error> {
    let db = Database::open(database_url, DatabaseOptions::default()).await?;
    apply_freeze(&db, request).await
}

/// `idem unfreeze` on a database URL. Frozen work becomes due at once; a running
/// server picks it up within its recheck interval.
pub async fn unfreeze(database_url: &str, request: &FreezeRequest) -> Result<FreezeChange, Error> {
    let db = Database::open(database_url, DatabaseOptions::default()).await?;
    apply_unfreeze(&db, request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(s: &str) -> Option<FreezeScope> {
        s.parse().ok()
    }

    #[test]
    fn scopes() {
        assert_eq!(
            scope("user:U-7318"),
            Some(FreezeScope::User("U-7318".into()))
        );
        assert_eq!(scope("show:S-204"), Some(FreezeScope::Show("S-204".into())));
        assert_eq!(scope("all"), Some(FreezeScope::All));
        assert_eq!(scope("user:"), None);
        assert_eq!(scope("tenant:x"), None);
        assert_eq!(scope("U-7318"), None);
        assert_eq!(FreezeScope::User("a:b".into()).to_string(), "user:a:b");
        assert_eq!(scope("user:a:b"), Some(FreezeScope::User("a:b".into())));
        let json = serde_json::to_string(&FreezeScope::Show("S".into())).unwrap();
        assert_eq!(json, "\"show:S\"");
    }

    #[test]
    fn what_lists() {
        use FreezeWhat::*;
        assert_eq!(
            FreezeWhat::parse_list("ticketing,payment-confirm,ticketing").unwrap(),
            vec![PaymentConfirm, Ticketing]
        );
        assert_eq!(
            FreezeWhat::parse_list("all").unwrap(),
            FreezeWhat::ALL.to_vec()
        );
        assert!(FreezeWhat::parse_list("").is_err());
        assert!(FreezeWhat::parse_list("refunds").is_err());
        assert_eq!(
            serde_json::to_string(&InventoryRelease).unwrap(),
            "\"inventory-release\""
        );
    }
}
