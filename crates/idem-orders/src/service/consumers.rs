//! The consumers of the automatic chain — payment confirmation, ticket issuing,
//! inventory release — and their names (also the durable consumer names on NATS).
//!
//! Each consumer acts at most once per business key (`pay:{order}`, `ticket:{order}`,
//! `release:{order}`), records the key it processed in the same transaction as its
//! work, and defers what a freeze covers. The inventory release is written under the
//! show's lease `inventory:{tenant}:{show}` and through its fence. It must not mint
//! keys and never deletes a row.

use idem_core::LeaseName;
use idem_lease::{Acquired, LeaseGuard};
use serde::Serialize;

use super::keys::{pay_key, release_key, ticket_key};
use super::Orders;
use crate::db::Conn;
use crate::error::{Error, OrderError};
use crate::freeze::{self, Freeze, FreezeWhat};
use crate::ledgers::{self, now_ms, topics, Actor, Message, MoveError};
use crate::machine::{OrderEvent, OrderStatus};

pub use super::consumer_names::{INVENTORY_RELEASER, PAYMENT_CONFIRMER, TICKET_ISSUER};

/// Which consumer reads which topic.
pub const SUBSCRIPTIONS: [(&str, &str); 3] = [
    (PAYMENT_CONFIRMER, topics::PAYMENT_REQUESTED),
    (TICKET_ISSUER, topics::ORDER_PAID),
    (INVENTORY_RELEASER, topics::ORDER_CANCELLED),
];

/// The consumers of `topic`.
pub fn of_topic(topic: &str) -> impl Iterator<Item = &'static str> + '_ {
    SUBSCRIPTIONS
        .iter()
        .filter(move |(_, t)| *t == topic)
        .map(|(c, _)| *c)
}

/// How a consumer dealt with a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Handled {
    /// Processed now; `outcome` says what happened (`issued`, `skipped: cancelled`, …).
    Done { outcome: String },
    /// The business key was already processed: nothing was done again.
    Duplicate,
    /// A freeze covers the work; it stays queued.
    Deferred { what: FreezeWhat, freeze_id: String },
}

impl Orders {
    /// Runs `consumer` on `message`. Safe to call any number of times for one message,
    /// concurrently too: each consumer acts at most once per business key.
    pub async fn handle(&self, consumer: &str, message: &Message) -> Result<Handled, Error> {
        let handled = match consumer {
            PAYMENT_CONFIRMER => self.confirm_requested_payment(message).await,
            TICKET_ISSUER => self.issue_ticket(message).await,
            INVENTORY_RELEASER => self.release_inventory(message).await,
            other => Err(Error::InvalidInput(format!("unknown consumer {other}"))),
        };
        let static_name = SUBSCRIPTIONS
            .iter()
            .map(|(c, _)| *c)
            .find(|c| *c == consumer)
            .unwrap_or("unknown");
        let result = match &handled {
            Ok(Handled::Done { .. }) => "done",
            Ok(Handled::Duplicate) => "duplicate",
            Ok(Handled::Deferred { what, .. }) => {
                self.inner.metrics.deferred(*what);
                "deferred"
            }
            Err(_) => "failed",
        };
        self.inner.metrics.delivery(static_name, result);
        if handled.is_ok() {
            self.signal_outbox();
        }
        handled
    }

    async fn confirm_requested_payment(&self, msg: &Message) -> Result<Handled, Error> {
        let consumer = PAYMENT_CONFIRMER;
        let key = pay_key(&msg.order_id);
        {
            let mut conn = self.inner.db.acquire().await?;
            let mut c = conn.conn();
            if let Some(f) = frozen_msg(&mut c, msg, FreezeWhat::PaymentConfirm).await? {
                return Ok(deferred(f));
            }
            if ledgers::processed(&mut c, consumer, &msg.tenant_id, &key).await? {
                return Ok(Handled::Duplicate);
            }
        }
        let guard = match self.lock_order(&msg.tenant_id, &msg.order_id).await {
            Ok(g) => g,
            Err(OrderError::Internal(e)) => return Err(e),
            Err(e) => return Err(Error::Unavailable(e.to_string())),
        };
        let result = self.confirm_requested_locked(msg, &key).await;
        self.release(guard).await;
        result
    }

    async fn confirm_requested_locked(&self, msg: &Message, key: &str) -> Result<Handled, Error> {
        let consumer = PAYMENT_CONFIRMER;
        let order = match self.load(&msg.tenant_id, &msg.order_id).await {
            Ok(order) => order,
            Err(OrderError::OrderNotFound { .. }) => {
                return self
                    .skip(consumer, msg, key, "skipped: no such order")
                    .await
            }
            Err(OrderError::Internal(e)) => return Err(e),
            Err(e) => return Err(Error::Backend(e.to_string())),
        };
        if order.status != OrderStatus::PendingPayment {
            let outcome = format!("skipped: {}", order.status);
            return self.skip(consumer, msg, key, &outcome).await;
        }
        match self.confirm_payment(order, consumer).await {
            Ok((mut tx, _)) => {
                let written = ledgers::mark_processed(
                    &mut tx.conn(),
                    consumer,
                    &msg.tenant_id,
                    key,
                    &msg.order_id,
                    &msg.message_id,
                    "confirmed",
                    now_ms(),
                )
                .await?;
                tx.commit().await?;
                Ok(if written {
                    Handled::Done {
                        outcome: "confirmed".into(),
                    }
                } else {
                    Handled::Duplicate
                })
            }
            Err(OrderError::Internal(e)) => Err(e),
            Err(refused) => {
                let outcome = format!("refused: {refused}");
                self.skip(consumer, msg, key, &outcome).await
            }
        }
    }

    /// Records that `consumer` looked at `key` and did nothing (with why).
    async fn skip(
        &self,
        consumer: &str,
        msg: &Message,
        key: &str,
        outcome: &str,
    ) -> Result<Handled, Error> {
        let mut tx = self.inner.db.begin().await?;
        let written = ledgers::mark_processed(
            &mut tx.conn(),
            consumer,
            &msg.tenant_id,
            key,
            &msg.order_id,
            &msg.message_id,
            outcome,
            now_ms(),
        )
        .await?;
        tx.commit().await?;
        Ok(if written {
            Handled::Done {
                outcome: outcome.to_owned(),
            }
        } else {
            Handled::Duplicate
        })
    }

    /// `order.paid` → exactly one ticket: the processed key, the ticket (UNIQUE per
    /// order), the paid → ticketed move and `ticket.issued` commit together.
    async fn issue_ticket(&self, msg: &Message) -> Result<Handled, Error> {
        let consumer = TICKET_ISSUER;
        let key = ticket_key(&msg.order_id);
        let now = now_ms();
        let mut tx = self.inner.db.begin().await?;
        let mut c = tx.conn();
        if let Some(f) = frozen_msg(&mut c, msg, FreezeWhat::Ticketing).await? {
            return Ok(deferred(f));
        }
        let order = ledgers::order(&mut c, &msg.tenant_id, &msg.order_id).await?;
        let outcome = match &order {
            None => "skipped: no such order".to_owned(),
            Some(o) if o.status == OrderStatus::Paid => "issued".to_owned(),
            Some(o) => format!("skipped: {}", o.status),
        };
        if !ledgers::mark_processed(
            &mut c,
            consumer,
            &msg.tenant_id,
            &key,
            &msg.order_id,
            &msg.message_id,
            &outcome,
            now,
        )
        .await?
        {
            return Ok(Handled::Duplicate);
        }
        let issued = match order {
            Some(order) if order.status == OrderStatus::Paid => {
                if !ledgers::insert_ticket(&mut c, &order, &msg.message_id, now).await? {
                    return Err(Error::Backend(format!(
                        "order {} already has a ticket but was not processed",
                        order.order_id
                    )));
                }
                let moved = match ledgers::move_order(
                    &mut c,
                    &order,
                    OrderEvent::TicketIssued,
                    &Actor::new(consumer).detail(format!("message {}", msg.message_id)),
                    now,
                )
                .await
                {
                    Ok(moved) => moved,
                    // Moved since we read it (cancelled): roll back, the redelivery decides again.
                    Err(MoveError::Raced) => {
                        return Err(Error::Unavailable("order moved while issuing".into()))
                    }
                    Err(MoveError::Illegal(e)) => return Err(Error::Backend(e.to_string())),
                    Err(MoveError::Db(e)) => return Err(e),
                };
                ledgers::emit(&mut c, &moved, topics::TICKET_ISSUED, now).await?;
                true
            }
            _ => false,
        };
        tx.commit().await?;
        if issued {
            self.inner.metrics.ticket_issued();
            if self.inner.faults.take_ticket_crash() {
                return Err(Error::InjectedFault(
                    "ticket issuer crashed after issuing, before its ack",
                ));
            }
        }
        Ok(Handled::Done { outcome })
    }

    /// `order.cancelled` → the hold goes back to stock once, under the show's lease and
    /// through its fence.
    async fn release_inventory(&self, msg: &Message) -> Result<Handled, Error> {
        self.release_inventory_as(msg, true).await
    }

    /// The inventory releaser's work on `msg` (an `order.cancelled`) for an operator's
    /// compensation run (`idem reconcile`): the same show lease, fence and processed key
    /// (`release:{order}`), but not held back by an `inventory-release` freeze — the
    /// operator froze the chain to do exactly this by hand.
    pub(crate) async fn release_inventory_by_operator(
        &self,
        msg: &Message,
    ) -> Result<Handled, Error> {
        self.release_inventory_as(msg, false).await
    }

    async fn release_inventory_as(
        &self,
        msg: &Message,
        honour_freeze: bool,
    ) -> Result<Handled, Error> {
        let consumer = INVENTORY_RELEASER;
        let key = release_key(&msg.order_id);
        {
            let mut conn = self.inner.db.acquire().await?;
            let mut c = conn.conn();
            // An operator's release ignores the freeze: it is why they release by hand.
            if honour_freeze {
                if let Some(f) = frozen_msg(&mut c, msg, FreezeWhat::InventoryRelease).await? {
                    return Ok(deferred(f));
                }
            }
            if ledgers::processed(&mut c, consumer, &msg.tenant_id, &key).await? {
                return Ok(Handled::Duplicate);
            }
        }
        let resource = format!("inventory:{}:{}", msg.tenant_id, msg.show_id);
        let name =
            LeaseName::new(resource.clone()).map_err(|e| Error::InvalidInput(e.to_string()))?;
        let t = self.inner.lease_timings;
        let guard = match LeaseGuard::acquire(
            self.inner.leases.clone(),
            &name,
            &self.owner(),
            t.ttl,
            t.wait,
            self.inner.lease_metrics.clone(),
        )
        .await?
        {
            Acquired::Guard(g) => g,
            Acquired::Busy { holder, .. } => {
                return Err(Error::Unavailable(format!(
                    "lease {name} is held by {} (token {})",
                    holder.owner, holder.token
                )))
            }
        };
        let db = self.inner.db.clone();
        let msg_owned = msg.clone();
        let result = guard
            .fenced(|lease| async move {
                let token = lease.token.get();
                let owner = lease.owner.to_string();
                db.fenced_write(&resource, &lease, move |mut c| {
                    Box::pin(async move {
                        release_in_fence(&mut c, &msg_owned, &key, token, &owner, honour_freeze)
                            .await
                    })
                })
                .await
                .map_err(idem_core::LeaseError::from)
            })
            .await
            .map_err(Error::from);
        if let Err(e) = guard.release().await {
            tracing::warn!(error = %e, lease = %name, "inventory lease release failed");
        }
        result
    }
}

/// The hold release inside the fenced transaction.
async fn release_in_fence(
    c: &mut Conn<'_>,
    msg: &Message,
    key: &str,
    token: i64,
    owner: &str,
    honour_freeze: bool,
) -> Result<Handled, Error> {
    let consumer = INVENTORY_RELEASER;
    // Checked again under the lock: the freeze may have come while we waited.
    if honour_freeze {
        if let Some(f) = frozen_msg(c, msg, FreezeWhat::InventoryRelease).await? {
            return Ok(deferred(f));
        }
    }
    if ledgers::processed(c, consumer, &msg.tenant_id, key).await? {
        return Ok(Handled::Duplicate);
    }
    let now = now_ms();
    let order = ledgers::order(c, &msg.tenant_id, &msg.order_id).await?;
    let outcome = match &order {
        Some(o) if o.status == OrderStatus::Cancelled => {
            if ledgers::release_hold(c, &msg.tenant_id, &msg.order_id, token, owner, now).await? {
                ledgers::emit(c, o, topics::INVENTORY_RELEASED, now).await?;
                "released".to_owned()
            } else {
                "already released".to_owned()
            }
        }
        Some(o) => format!("skipped: {}", o.status),
        None => "skipped: no such order".to_owned(),
    };
    ledgers::mark_processed(
        c,
        consumer,
        &msg.tenant_id,
        key,
        &msg.order_id,
        &msg.message_id,
        &outcome,
        now,
    )
    .await?;
    Ok(Handled::Done { outcome })
}

async fn frozen_msg(
    c: &mut Conn<'_>,
    msg: &Message,
    what: FreezeWhat,
) -> Result<Option<Freeze>, Error> {
    freeze::frozen_for(c, &msg.tenant_id, &msg.user_id, &msg.show_id, what).await
}

fn deferred(f: Freeze) -> Handled {
    Handled::Deferred {
        what: f.what,
        freeze_id: f.freeze_id,
    }
}
