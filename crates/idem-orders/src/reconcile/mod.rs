//! `idem reconcile`: four-ledger reconciliation, and compensation through the order state
//! machine — step 2 of the incident playbook (docs/DESIGN.md: the incident). The night already happened; this
//! repairs it without deleting a row.
//!
//! # What it does
//! 1. **Scan** (`scan`): reads the orders ledger in `(tenant, user, show, created_at)`
//!    order, streaming, and groups orders into intents by user, show, client session and
//!    a time window anchored at the intent's first order. Orders created under an
//!    idempotency key are intents of their own (the requester said so); legacy rows
//!    without a key are what this tool is for. A group with more than one live order
//!    (`pending_payment`, `paid`, `ticketed`) — or with orders an earlier run already
//!    marked as duplicates — is a **duplicate cluster**. For clusters only it reads the
//!    other ledgers: payments (and the provider's books), inventory holds, messages.
//! 2. **Plan** (`plan`): keeps the earliest order that is paid and holds an inventory
//!    voucher (else the earliest holding a voucher, else the earliest) and plans, for
//!    every other order: `stop-message` for its own messages still able to trigger
//!    work, `refund` when it was charged, `cancel`, and `release` of its hold.
//! 3. **Apply** (`apply`, only with `apply`): refuses unless the automatic chain is
//!    frozen for every cluster's scope (or `force`), then runs each pending action
//!    through the service's own code paths: the cancel/refund walk of
//!    [`crate::service::Orders`] (state machine, compare-and-set, provider under
//!    `refund:{order}`), the inventory releaser's lease-and-fence release, and the
//!    consumers' processed keys for stopping messages.
//! 4. **Check** (`check`): every cancelled order's hold released, every refund matches
//!    a charge, the messages of cancelled duplicates stopped, no order row deleted.
//!
//! # Idempotence
//! Every action first looks at the ledgers and does nothing when its effect is already
//! there; every effect is keyed by the business (`refund:{order}` at the provider,
//! `release:{order}` for the releaser, `stop:{message}` and `duplicate:{order}` for the
//! reconciler). A second `apply` applies nothing; a run killed half-way and started again
//! completes exactly the rest. An order is marked `duplicate:{order}` (in
//! `consumer_processed`, consumer `reconciler`) before its first action, so a cluster
//! stays a cluster, with the same keeper, however far an earlier run got.
//!
//! # Must not
//! Delete or rewrite rows around the machine; write `orders.status` itself; mint keys
//! that are not derived from the plan; read the environment (the CLI does that).

mod apply;
mod check;
mod gather;
mod plan;
mod render;
mod scan;

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::db::{redact, Database, DatabaseOptions};
use crate::error::Error;
use crate::freeze::FreezeWhat;

/// The consumer name the reconciler writes its evidence under (`consumer_processed`).
pub const RECONCILER: &str = "reconciler";

/// Progress of the scan: orders read so far, and the total when it was counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub scanned: u64,
    pub total: Option<u64>,
}

/// A callback for scan progress.
pub type ProgressHook = Arc<dyn Fn(Progress) + Send + Sync>;
/// Called after every action this run applied, with how many it applied so far.
pub type ActionHook = Arc<dyn Fn(usize) + Send + Sync>;

/// What to reconcile and how.
#[derive(Clone)]
pub struct ReconcileOptions {
    pub tenant: Option<String>,
    pub user: Option<String>,
    pub show: Option<String>,
    /// Orders created at or after this time (ms since the epoch).
    pub since_ms: Option<i64>,
    /// Orders created before this time (ms since the epoch).
    pub until_ms: Option<i64>,
    /// Orders of one session closer than this to the intent's first order are one intent.
    pub window: Duration,
    /// Execute the plan (default: dry run).
    pub apply: bool,
    /// Apply even though the automatic chain is not frozen for a cluster's scope.
    pub force: bool,
    /// Who is acting, for the evidence rows.
    pub actor: String,
    /// Count the scope first and report progress while scanning.
    pub progress: Option<ProgressHook>,
    /// After each applied action (drills and tests kill the process here).
    pub after_action: Option<ActionHook>,
}

impl Default for ReconcileOptions {
    fn default() -> Self {
        Self {
            tenant: None,
            user: None,
            show: None,
            since_ms: None,
            until_ms: None,
            window: Duration::from_secs(120),
            apply: false,
            force: false,
            actor: "operator".into(),
            progress: None,
            after_action: None,
        }
    }
}

impl std::fmt::Debug for ReconcileOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReconcileOptions")
            .field("tenant", &self.tenant)
            .field("user", &self.user)
            .field("show", &self.show)
            .field("since_ms", &self.since_ms)
            .field("until_ms", &self.until_ms)
            .field("window", &self.window)
            .field("apply", &self.apply)
            .field("force", &self.force)
            .finish_non_exhaustive()
    }
}

/// The scope as reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scope {
    pub tenant: Option<String>,
    pub user: Option<String>,
    pub show: Option<String>,
    pub since: Option<String>,
    pub until: Option<String>,
    pub window_ms: u64,
}

/// One order of a cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterOrder {
    pub order_id: String,
    /// `keeper` or `duplicate`.
    pub role: String,
    pub status: String,
    pub created_at: String,
    pub quantity: i64,
    pub amount_cents: i64,
    /// Charged at the provider (confirmed or not) and not refunded.
    pub paid: bool,
    /// `held`, `released`, or absent.
    pub hold: Option<String>,
    pub charged_cents: i64,
    pub refunded_cents: i64,
    pub messages: usize,
}

/// A duplicate cluster: one intent that became several orders.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cluster {
    /// `tenant/user/show/session/first-order-ms`: stable across runs.
    pub id: String,
    pub tenant: String,
    pub user_id: String,
    pub show_id: String,
    pub client_session: Option<String>,
    pub first_at: String,
    pub last_at: String,
    pub span_ms: i64,
    pub keeper: Option<String>,
    /// Why the keeper was kept.
    pub keeper_reason: String,
    pub orders: Vec<ClusterOrder>,
    /// What the plan gives back (pending and done together).
    pub refund_cents: i64,
    pub refunds: usize,
    pub released_holds: usize,
    pub released_tickets: i64,
    pub messages_stopped: usize,
    pub cancels: usize,
    /// Actions of this cluster still to do.
    pub pending: usize,
}

/// `cancel`, `refund`, `release` or `stop-message`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ActionKind {
    StopMessage,
    Refund,
    Cancel,
    Release,
}

impl ActionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::StopMessage => "stop-message",
            ActionKind::Refund => "refund",
            ActionKind::Cancel => "cancel",
            ActionKind::Release => "release",
        }
    }
}

/// Where an action stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionState {
    /// To do (a dry run, or an apply that was refused).
    Pending,
    /// Its effect was already in the ledgers when this run looked.
    Done,
    /// This run did it.
    Applied,
    /// The state machine has no way to do it (a ticketed duplicate); needs a person.
    Blocked,
    /// This run tried and failed; `error` says why.
    Failed,
}

/// One step of the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Action {
    /// Index into `clusters`.
    pub cluster: usize,
    pub order_id: String,
    pub kind: ActionKind,
    pub state: ActionState,
    /// What it does, for people.
    pub detail: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount_cents: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantity: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A cluster scope whose automatic chain is not (fully) frozen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreezeGap {
    pub tenant: String,
    pub user_id: String,
    pub show_id: String,
    pub missing: Vec<FreezeWhat>,
    /// The command that freezes it.
    pub command: String,
}

/// One ledger check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    pub name: String,
    pub passed: bool,
    pub detail: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<String>,
}

/// Totals over every cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    pub orders_scanned: u64,
    pub intents: u64,
    pub clusters: usize,
    pub keepers: usize,
    pub cancels: usize,
    pub refunds: usize,
    pub refund_cents: i64,
    pub released_holds: usize,
    pub released_tickets: i64,
    pub messages_stopped: usize,
    pub pending: usize,
    pub blocked: usize,
    pub failed: usize,
}

/// What a run found, planned, did and checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcileReport {
    /// `dry-run` or `apply`.
    pub mode: String,
    pub run_id: String,
    pub database: String,
    pub scope: Scope,
    pub started_at: String,
    pub elapsed_ms: u64,
    pub clusters: Vec<Cluster>,
    pub actions: Vec<Action>,
    /// Actions this run executed (0 on a dry run, a refused apply, or a rerun with
    /// nothing left to do).
    pub applied: usize,
    pub totals: Totals,
    /// Scopes of clusters with work left whose chain is not frozen.
    pub freeze_gaps: Vec<FreezeGap>,
    /// Why an apply did nothing (the chain is not frozen), with what to run.
    pub refused: Option<String>,
    pub forced: bool,
    pub checks: Vec<Check>,
    /// Every check passed.
    pub passed: bool,
}

impl ReconcileReport {
    /// The plan and the checks as terminal tables.
    pub fn render_text(&self) -> String {
        render::text(self)
    }

    /// A self-contained HTML page (inline CSS, no scripts) to attach to the incident.
    pub fn render_html(&self) -> String {
        render::html(self)
    }
}

/// Reconciles `db` (see the module docs).
pub async fn reconcile(
    db: &Database,
    options: &ReconcileOptions,
) -> Result<ReconcileReport, Error> {
    apply::run(db, options, "-".into()).await
}

/// What [`survey`] found: the scan and the plan, before any freeze guard or check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Survey {
    /// Orders read in scope.
    pub orders: u64,
    /// The intents they form.
    pub intents: u64,
    /// Duplicate clusters, with their keepers.
    pub clusters: Vec<Cluster>,
    /// The plan: every action of every cluster, with its state.
    pub actions: Vec<Action>,
}

/// Scans `db` and plans, writing nothing: the first step of every run (a preview of
/// what [`reconcile`] would report, without its freeze guard and ledger checks).
/// `options.apply` and `options.force` are ignored.
pub async fn survey(db: &Database, options: &ReconcileOptions) -> Result<Survey, Error> {
    let s = gather::survey(db, options).await?;
    Ok(Survey {
        orders: s.orders,
        intents: s.intents,
        clusters: s.clusters,
        actions: s.actions,
    })
}

/// `idem reconcile` on a database URL.
pub async fn reconcile_url(
    url: &str,
    pg_schema: Option<String>,
    options: &ReconcileOptions,
) -> Result<ReconcileReport, Error> {
    let db = Database::open(
        url,
        DatabaseOptions {
            pg_schema,
            ..Default::default()
        },
    )
    .await?;
    apply::run(&db, options, redact(url)).await
}
