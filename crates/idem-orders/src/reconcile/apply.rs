//! One run: survey (scan, facts, plan), the freeze guard, executing pending actions
//! through the service's own code paths, a fresh survey, and the ledger checks.

use std::collections::BTreeMap;
use std::time::Instant;

use idem_lease::LeaseMetrics;

use crate::db::Database;
use crate::error::{Error, OrderError};
use crate::freeze::{self, FreezeWhat};
use crate::ledgers::{self, new_id, now_ms, topics, Message};
use crate::machine::OrderStatus;
use crate::metrics::OrdersMetrics;
use crate::service::{consumer_key, consumers, Handled, Orders, OrdersOptions};
use crate::views::rfc3339;

use super::gather::{self, Survey};
use super::scan::{duplicate_key, stop_key, Facts};
use super::{
    check, plan, Action, ActionKind, ActionState, Cluster, FreezeGap, ReconcileOptions,
    ReconcileReport, Scope, Totals, RECONCILER,
};

/// The freeze command for a scope, as an operator types it.
fn freeze_command(database: &str, tenant: &str, user: &str) -> String {
    let mut cmd = format!(
        "idem freeze --scope user:{user} --tenant {tenant} --what all --reason \"reconcile duplicates\""
    );
    if database != "-" {
        cmd.push_str(&format!(" --database-url '{database}'"));
    }
    cmd
}

/// Clusters with work left whose automatic chain is not frozen for all three parts.
async fn freeze_gaps(
    db: &Database,
    clusters: &[Cluster],
    database: &str,
) -> Result<Vec<FreezeGap>, Error> {
    let mut gaps: Vec<FreezeGap> = Vec::new();
    let mut conn = db.acquire().await?;
    for cl in clusters.iter().filter(|c| c.pending > 0) {
        if gaps
            .iter()
            .any(|g| (&g.tenant, &g.user_id, &g.show_id) == (&cl.tenant, &cl.user_id, &cl.show_id))
        {
            continue;
        }
        let active =
            freeze::freezes_for(&mut conn.conn(), &cl.tenant, &cl.user_id, &cl.show_id).await?;
        let missing: Vec<FreezeWhat> = FreezeWhat::ALL
            .into_iter()
            .filter(|w| !active.iter().any(|f| f.what == *w))
            .collect();
        if !missing.is_empty() {
            gaps.push(FreezeGap {
                tenant: cl.tenant.clone(),
                user_id: cl.user_id.clone(),
                show_id: cl.show_id.clone(),
                missing,
                command: freeze_command(database, &cl.tenant, &cl.user_id),
            });
        }
    }
    Ok(gaps)
}

type ActionId = (String, ActionKind, Option<String>);

fn action_id(a: &Action) -> ActionId {
    (a.order_id.clone(), a.kind, a.message_id.clone())
}

/// What executing one action did.
enum Outcome {
    /// The effect is in the ledgers now and was not before.
    Changed,
    /// The effect was already there (an earlier run, or a consumer got there first).
    Unchanged,
    /// The business said no; the run goes on with the other actions.
    Refused(String),
}

struct Executor<'a> {
    db: &'a Database,
    orders: Orders,
    run_id: &'a str,
    actor: &'a str,
}

impl Executor<'_> {
    async fn mark_duplicate(&self, f: &Facts, keeper: &str, reason: &str) -> Result<(), Error> {
        let o = &f.order;
        let mut tx = self.db.begin().await?;
        ledgers::mark_processed(
            &mut tx.conn(),
            RECONCILER,
            &o.tenant_id,
            &duplicate_key(&o.order_id),
            &o.order_id,
            "",
            &format!(
                "duplicate of {keeper}: {reason} (run {}, by {})",
                self.run_id, self.actor
            ),
            now_ms(),
        )
        .await?;
        tx.commit().await
    }

    async fn execute(&self, a: &Action, f: &Facts, keeper: &str) -> Result<Outcome, Error> {
        let o = &f.order;
        match a.kind {
            ActionKind::StopMessage => {
                let (Some(message_id), Some(topic)) = (&a.message_id, &a.topic) else {
                    return Ok(Outcome::Refused("no message to stop".into()));
                };
                let now = now_ms();
                let mut tx = self.db.begin().await?;
                let mut c = tx.conn();
                let written = ledgers::mark_processed(
                    &mut c,
                    RECONCILER,
                    &o.tenant_id,
                    &stop_key(message_id),
                    &o.order_id,
                    message_id,
                    &format!(
                        "stopped: {topic} of a duplicate of {keeper} (run {})",
                        self.run_id
                    ),
                    now,
                )
                .await?;
                // The consumers' own processed keys: a redelivery is acked as a duplicate.
                for consumer in consumers::of_topic(topic) {
                    if let Some(key) = consumer_key(consumer, &o.order_id) {
                        ledgers::mark_processed(
                            &mut c,
                            consumer,
                            &o.tenant_id,
                            &key,
                            &o.order_id,
                            message_id,
                            &format!("stopped by reconcile: duplicate of {keeper}"),
                            now,
                        )
                        .await?;
                    }
                }
                tx.commit().await?;
                Ok(if written {
                    Outcome::Changed
                } else {
                    Outcome::Unchanged
                })
            }
            ActionKind::Refund | ActionKind::Cancel => {
                let current = {
                    let mut conn = self.db.acquire().await?;
                    let mut c = conn.conn();
                    let order = ledgers::order(&mut c, &o.tenant_id, &o.order_id).await?;
                    let refunded = ledgers::payments_of(&mut c, &o.tenant_id, &o.order_id)
                        .await?
                        .iter()
                        .any(|p| p.kind == "refund");
                    (order, refunded)
                };
                let already = match (a.kind, &current) {
                    (_, (None, _)) => {
                        return Ok(Outcome::Refused("the order row is missing".into()))
                    }
                    (ActionKind::Refund, (_, refunded)) => *refunded,
                    (_, (Some(order), _)) => order.status == OrderStatus::Cancelled,
                };
                if already {
                    return Ok(Outcome::Unchanged);
                }
                // The service's cancel: the state machine (compare-and-set per step, each
                // committed before the next provider call), the refund under
                // refund:{order}, and order.cancelled in the outbox.
                match self.orders.cancel(&o.tenant_id, &o.order_id).await {
                    Ok(unit) => {
                        let committed = unit.tx.commit().await;
                        if let Some(guard) = unit.lease {
                            self.orders.release(guard).await;
                        }
                        committed?;
                        Ok(Outcome::Changed)
                    }
                    Err(OrderError::Internal(e)) => Err(e),
                    Err(refused) => Ok(Outcome::Refused(refused.to_string())),
                }
            }
            ActionKind::Release => {
                let (hold, order, messages) = {
                    let mut conn = self.db.acquire().await?;
                    let mut c = conn.conn();
                    (
                        ledgers::hold_of(&mut c, &o.tenant_id, &o.order_id).await?,
                        ledgers::order(&mut c, &o.tenant_id, &o.order_id).await?,
                        ledgers::messages_of(&mut c, &o.tenant_id, &o.order_id).await?,
                    )
                };
                match (&hold, &order) {
                    (None, _) => return Ok(Outcome::Unchanged),
                    (Some(h), _) if h.status != "held" => return Ok(Outcome::Unchanged),
                    (_, Some(order)) if order.status != OrderStatus::Cancelled => {
                        return Ok(Outcome::Refused(format!(
                            "the order is {}, not cancelled: its hold stays",
                            order.status
                        )))
                    }
                    (_, None) => return Ok(Outcome::Refused("the order row is missing".into())),
                    _ => {}
                }
                // The releaser's own message when there is one, so its evidence names it.
                let message = messages
                    .into_iter()
                    .find(|m| m.topic == topics::ORDER_CANCELLED)
                    .unwrap_or_else(|| Message {
                        message_id: format!("reconcile:{}", self.run_id),
                        tenant_id: o.tenant_id.clone(),
                        topic: topics::ORDER_CANCELLED.into(),
                        order_id: o.order_id.clone(),
                        user_id: o.user_id.clone(),
                        show_id: o.show_id.clone(),
                        payload: serde_json::Value::Null,
                        created_at: now_ms(),
                        published_at: None,
                    });
                match self.orders.release_inventory_by_operator(&message).await? {
                    Handled::Done { outcome } if outcome == "released" => Ok(Outcome::Changed),
                    Handled::Done { outcome } if outcome == "already released" => {
                        Ok(Outcome::Unchanged)
                    }
                    Handled::Done { outcome } => Ok(Outcome::Refused(outcome)),
                    Handled::Duplicate => Ok(Outcome::Refused(format!(
                        "the inventory releaser already processed release:{} but the hold is held",
                        o.order_id
                    ))),
                    Handled::Deferred { what, freeze_id } => Ok(Outcome::Refused(format!(
                        "deferred by freeze {freeze_id} ({what})"
                    ))),
                }
            }
        }
    }
}

/// Executes every pending action; returns the ids it changed and the ones that failed.
async fn execute(
    db: &Database,
    o: &ReconcileOptions,
    run_id: &str,
    survey: &Survey,
) -> Result<(Vec<ActionId>, BTreeMap<ActionId, String>), Error> {
    let ex = Executor {
        db,
        orders: Orders::new(
            db.clone(),
            OrdersOptions::default(),
            OrdersMetrics::default(),
            LeaseMetrics::default(),
        ),
        run_id,
        actor: &o.actor,
    };
    let mut changed = Vec::new();
    let mut failed = BTreeMap::new();
    for (ci, cluster) in survey.clusters.iter().enumerate() {
        let facts = &survey.facts[ci];
        let keeper = cluster
            .keeper
            .clone()
            .or_else(|| {
                facts
                    .iter()
                    .find_map(|f| f.order.mark.as_deref().and_then(plan::marked_keeper))
                    .map(str::to_owned)
            })
            .unwrap_or_else(|| "?".into());
        for f in facts {
            let mine: Vec<&Action> = survey
                .actions
                .iter()
                .filter(|a| a.cluster == ci && a.order_id == f.order.order_id)
                .collect();
            if !mine.iter().any(|a| a.state == ActionState::Pending) {
                continue;
            }
            if f.order.mark.is_none() {
                // Before anything else: this order is a duplicate, and stays one for
                // every later run.
                ex.mark_duplicate(f, &keeper, &cluster.keeper_reason)
                    .await?;
            }
            for a in mine.into_iter().filter(|a| a.state == ActionState::Pending) {
                match ex.execute(a, f, &keeper).await? {
                    Outcome::Changed => {
                        changed.push(action_id(a));
                        tracing::info!(order = %a.order_id, kind = a.kind.as_str(), "reconcile applied");
                        if let Some(hook) = &o.after_action {
                            hook(changed.len());
                        }
                    }
                    Outcome::Unchanged => {}
                    Outcome::Refused(why) => {
                        tracing::warn!(order = %a.order_id, kind = a.kind.as_str(), %why, "reconcile action failed");
                        failed.insert(action_id(a), why);
                    }
                }
            }
        }
    }
    Ok((changed, failed))
}

fn totals(survey: &Survey) -> Totals {
    let count = |s: ActionState| survey.actions.iter().filter(|a| a.state == s).count();
    Totals {
        orders_scanned: survey.orders,
        intents: survey.intents,
        clusters: survey.clusters.len(),
        keepers: survey
            .clusters
            .iter()
            .filter(|c| c.keeper.is_some())
            .count(),
        cancels: survey.clusters.iter().map(|c| c.cancels).sum(),
        refunds: survey.clusters.iter().map(|c| c.refunds).sum(),
        refund_cents: survey.clusters.iter().map(|c| c.refund_cents).sum(),
        released_holds: survey.clusters.iter().map(|c| c.released_holds).sum(),
        released_tickets: survey.clusters.iter().map(|c| c.released_tickets).sum(),
        messages_stopped: survey.clusters.iter().map(|c| c.messages_stopped).sum(),
        pending: count(ActionState::Pending),
        blocked: count(ActionState::Blocked),
        failed: count(ActionState::Failed),
    }
}

pub(crate) async fn run(
    db: &Database,
    o: &ReconcileOptions,
    database: String,
) -> Result<ReconcileReport, Error> {
    let started = Instant::now();
    let started_at = rfc3339(now_ms());
    let run_id = new_id("rec");
    let mut survey = gather::survey(db, o).await?;
    let orders_before = survey.orders;
    let gaps = freeze_gaps(db, &survey.clusters, &database).await?;
    let mut refused = None;
    let mut applied = 0;
    let forced = o.apply && o.force && !gaps.is_empty();
    if o.apply && !gaps.is_empty() && !o.force {
        refused = Some(format!(
            "the automatic chain is not frozen for {} scope(s) with work left; nothing was \
             applied. Freeze it first (the commands are listed), or pass --force",
            gaps.len()
        ));
    } else if o.apply
        && survey
            .actions
            .iter()
            .any(|a| a.state == ActionState::Pending)
    {
        let (changed, failed) = execute(db, o, &run_id, &survey).await?;
        applied = changed.len();
        survey = gather::survey(db, o).await?;
        for a in &mut survey.actions {
            let id = action_id(a);
            if let Some(why) = failed.get(&id) {
                a.state = ActionState::Failed;
                a.error = Some(why.clone());
            } else if changed.contains(&id) && a.state == ActionState::Done {
                a.state = ActionState::Applied;
            }
        }
    }
    let checks = check::run(db, o, &survey, orders_before).await?;
    let passed = checks.iter().all(|c| c.passed);
    let totals = totals(&survey);
    // Gaps as they stand now (a finished cluster needs no freeze any more).
    let freeze_gaps = if refused.is_some() {
        gaps
    } else {
        freeze_gaps(db, &survey.clusters, &database).await?
    };
    Ok(ReconcileReport {
        mode: if o.apply { "apply" } else { "dry-run" }.into(),
        run_id,
        database,
        scope: Scope {
            tenant: o.tenant.clone(),
            user: o.user.clone(),
            show: o.show.clone(),
            since: o.since_ms.map(rfc3339),
            until: o.until_ms.map(rfc3339),
            window_ms: u64::try_from(o.window.as_millis()).unwrap_or(u64::MAX),
        },
        started_at,
        elapsed_ms: started.elapsed().as_millis() as u64,
        clusters: survey.clusters,
        actions: survey.actions,
        applied,
        totals,
        freeze_gaps,
        refused,
        forced,
        checks,
        passed,
    })
}
