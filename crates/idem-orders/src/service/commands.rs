//! The request-side commands: seeding shows, creating, paying and cancelling
//! (refunding) orders.
//!
//! Owns the policy of each request (limits, stock, which state-machine event it means,
//! freezes) and hands its business rows back as an open transaction (`Unit`) so the
//! caller finishes the idempotency record in it and commits once. It must not know
//! HTTP, must not mint keys for retries, and never deletes a row.

use idem_core::{Claim, ClaimRequest, ClaimToken};
use idem_lease::LeaseGuard;
use serde::{Deserialize, Serialize};

use super::keys::{pay_key, refund_key};
use super::Orders;
use crate::db::{Conn, Tx};
use crate::error::{Error, OrderError};
use crate::freeze::{self, Freeze, FreezeWhat};
use crate::ledgers::{self, now_ms, topics, Actor, MoveError, Order};
use crate::machine::{IllegalTransition, OrderEvent, OrderStatus};
use crate::text::check_text;
use crate::views::OrderView;

/// The body of `POST /v1/orders`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NewOrder {
    pub user_id: String,
    pub show_id: String,
    pub quantity: i64,
    #[serde(default)]
    pub client_session: Option<String>,
}

/// Business rows written in an open transaction, with the value to answer and the lease
/// to release after the commit.
pub(crate) struct Unit<T> {
    pub(crate) tx: Tx,
    pub(crate) value: T,
    pub(crate) lease: Option<LeaseGuard>,
}

/// What a create wrote, or the idempotency answer that stopped it.
pub(crate) enum Created {
    /// The rows, open in their transaction, and the token of the claim made in it.
    Written(Box<Unit<OrderView>>, Option<ClaimToken>),
    /// The claim in the transaction did not proceed (replay, in progress, mismatch):
    /// nothing was written.
    Answered(Claim),
    /// An order under the key committed while this one waited on it (a duplicate's
    /// first try, without a claim): nothing was written; the key's record answers.
    KeyTaken,
}

/// The answer to a pay request.
pub(crate) enum PayAnswer {
    /// Charged and confirmed now.
    Paid(Order),
    /// It already was paid (by an earlier request or a consumer).
    AlreadyPaid(Order),
    /// `payment-confirm` is frozen for the order: the payment waits in the outbox.
    Queued(Order, Box<Freeze>),
}

impl Orders {
    /// Creates the shows a tenant is missing; existing shows are left as they are.
    pub async fn seed(
        &self,
        tenant: &str,
        shows: &[ledgers::ShowSeed],
    ) -> Result<Vec<ledgers::Show>, Error> {
        for seed in shows {
            seed.check()?;
        }
        let now = now_ms();
        let mut tx = self.inner.db.begin().await?;
        let mut out = Vec::new();
        for seed in shows {
            out.push(ledgers::seed_show(&mut tx.conn(), tenant, seed, now).await?);
        }
        tx.commit().await?;
        Ok(out)
    }

    /// Validates and writes a new order: the order, its hold, its stock and its
    /// `order.created` message, in one open transaction. With `claim` the idempotency
    /// key is claimed first in that transaction, so the order and its record commit
    /// once, together.
    pub(crate) async fn create(
        &self,
        tenant: &str,
        req: &NewOrder,
        key: Option<&str>,
        route: &'static str,
        claim: Option<&ClaimRequest>,
    ) -> Result<Created, OrderError> {
        check_name("user_id", &req.user_id)?;
        check_name("show_id", &req.show_id)?;
        if let Some(s) = &req.client_session {
            check_name("client_session", s)?;
        }
        if req.quantity < 1 {
            return Err(OrderError::QuantityTooSmall {
                quantity: req.quantity,
            });
        }
        let now = now_ms();
        let mut tx = self.inner.db.begin().await?;
        let token = match claim {
            Some(claim) => match self.inner.db.claim_in_tx(&mut tx, claim).await? {
                Claim::Proceed(token) => Some(token),
                other => return Ok(Created::Answered(other)),
            },
            None => None,
        };
        let mut c = tx.conn();
        let show = ledgers::show(&mut c, tenant, &req.show_id)
            .await?
            .ok_or_else(|| OrderError::UnknownShow {
                show_id: req.show_id.clone(),
            })?;
        if req.quantity > show.per_order_limit {
            return Err(OrderError::QuantityAboveLimit {
                show_id: show.show_id,
                quantity: req.quantity,
                limit: show.per_order_limit,
            });
        }
        // Committed stock says sold out without locking anything.
        if show.available < req.quantity {
            return Err(OrderError::SoldOut {
                show_id: show.show_id,
                quantity: req.quantity,
                available: show.available,
            });
        }
        let order = Order {
            order_id: ledgers::new_id("ord"),
            tenant_id: tenant.to_owned(),
            user_id: req.user_id.clone(),
            show_id: show.show_id.clone(),
            quantity: req.quantity,
            amount_cents: show.price_cents.saturating_mul(req.quantity),
            client_session: req.client_session.clone(),
            idempotency_key: key.map(str::to_owned),
            status: OrderStatus::PendingPayment,
            version: 1,
            created_at: now,
            updated_at: now,
            paid_at: None,
            ticketed_at: None,
            refunded_at: None,
            cancelled_at: None,
        };
        let actor = match key {
            Some(k) => Actor::new(route).detail(format!("idempotency key {k}")),
            None => Actor::new(route).detail("no idempotency key"),
        };
        if !ledgers::insert_order(&mut c, &order, &actor).await? {
            return Ok(Created::KeyTaken);
        }
        let hold = ledgers::insert_hold(
            &mut c,
            tenant,
            &order.order_id,
            &show.show_id,
            req.quantity,
            now,
        )
        .await?;
        ledgers::emit(&mut c, &order, topics::ORDER_CREATED, now).await?;
        // The stock last: its row stays locked until the commit, so it is held for
        // the record's write and the commit only, never for the inserts above.
        let start = uuid::Uuid::now_v7().as_u64_pair().1;
        match ledgers::take_stock(&mut c, tenant, &show.show_id, req.quantity, now, start).await? {
            ledgers::Take::Taken => {}
            ledgers::Take::SoldOut { available } => {
                return Err(OrderError::SoldOut {
                    show_id: show.show_id,
                    quantity: req.quantity,
                    available,
                })
            }
            ledgers::Take::Busy => {
                return Err(OrderError::StockBusy {
                    show_id: show.show_id,
                })
            }
        }
        self.inner.metrics.created(route);
        let unit = Unit {
            tx,
            value: OrderView::summary(&order, Some(&hold)),
            lease: None,
        };
        Ok(Created::Written(Box::new(unit), token))
    }

    /// Pays an order: charges the provider under `pay:{order}` and confirms it, or
    /// queues it while `payment-confirm` is frozen. Paying a paid order changes nothing.
    pub(crate) async fn pay(
        &self,
        tenant: &str,
        order_id: &str,
    ) -> Result<Unit<PayAnswer>, OrderError> {
        let order = self.load(tenant, order_id).await?;
        if order.status.is_paid() {
            return self.unchanged(PayAnswer::AlreadyPaid(order)).await;
        }
        let guard = self.lock_order(tenant, order_id).await?;
        match self.pay_locked(tenant, order_id).await {
            Ok((tx, value)) => Ok(Unit {
                tx,
                value,
                lease: Some(guard),
            }),
            Err(e) => {
                self.release(guard).await;
                Err(e)
            }
        }
    }

    async fn pay_locked(
        &self,
        tenant: &str,
        order_id: &str,
    ) -> Result<(Tx, PayAnswer), OrderError> {
        let order = self.load(tenant, order_id).await?;
        match order.status {
            s if s.is_paid() => {
                let tx = self.inner.db.begin().await?;
                return Ok((tx, PayAnswer::AlreadyPaid(order)));
            }
            OrderStatus::PendingPayment => {}
            from => {
                if from == OrderStatus::Cancelled {
                    // A charge a lost lease let through, whose refund failed then.
                    self.refund_stray_charge(&order).await?;
                }
                return Err(IllegalTransition {
                    from,
                    event: OrderEvent::PaymentConfirmed,
                }
                .into());
            }
        }
        if let Some(freeze) = self.frozen(&order, FreezeWhat::PaymentConfirm).await? {
            let mut tx = self.inner.db.begin().await?;
            ledgers::emit(&mut tx.conn(), &order, topics::PAYMENT_REQUESTED, now_ms()).await?;
            self.inner.metrics.deferred(FreezeWhat::PaymentConfirm);
            return Ok((tx, PayAnswer::Queued(order, Box::new(freeze))));
        }
        let (tx, order) = self.confirm_payment(order, "api").await?;
        Ok((tx, PayAnswer::Paid(order)))
    }

    /// Charges `pay:{order}` (the provider answers the same charge however often it is
    /// asked) and, in an open transaction, records it and moves the order to paid.
    pub(super) async fn confirm_payment(
        &self,
        order: Order,
        actor: &str,
    ) -> Result<(Tx, Order), OrderError> {
        let key = pay_key(&order.order_id);
        let receipt = self
            .inner
            .provider
            .charge(&order.tenant_id, &key, &order.order_id, order.amount_cents)
            .await?;
        let now = now_ms();
        let mut tx = self.inner.db.begin().await?;
        let mut c = tx.conn();
        self.record_payment(
            &mut c,
            &order.tenant_id,
            &order.order_id,
            "charge",
            &key,
            &receipt,
            now,
        )
        .await?;
        let current = self
            .load_in(&mut c, &order.tenant_id, &order.order_id)
            .await?;
        let confirmed = match current.status {
            OrderStatus::PendingPayment => {
                let actor = Actor::new(actor).detail(format!("{key} → {}", receipt.provider_ref));
                let moved =
                    advance(&mut c, &current, OrderEvent::PaymentConfirmed, &actor, now).await?;
                ledgers::emit(&mut c, &moved, topics::ORDER_PAID, now).await?;
                moved
            }
            s if s.is_paid() => current,
            from => {
                // Charged for an order that moved on meanwhile: this pay lost the
                // order's lease (a stopped process) and a cancel ran in between. The
                // charge is committed first (the provider's own writes must not wait
                // on this transaction), then refunded; a retried pay repairs a refund
                // that failed here.
                tx.commit().await?;
                tracing::error!(order = %order.order_id, %from, "charge for an order that is no longer payable; refunding it");
                if from == OrderStatus::Cancelled {
                    self.refund_stray_charge(&current).await?;
                }
                return Err(IllegalTransition {
                    from,
                    event: OrderEvent::PaymentConfirmed,
                }
                .into());
            }
        };
        Ok((tx, confirmed))
    }

    /// Records a provider operation in the payments ledger (once per provider key) and
    /// counts it when it is new.
    #[allow(clippy::too_many_arguments)]
    async fn record_payment(
        &self,
        c: &mut crate::db::Conn<'_>,
        tenant: &str,
        order_id: &str,
        kind: &'static str,
        key: &str,
        receipt: &crate::provider::Receipt,
        now: i64,
    ) -> Result<(), OrderError> {
        if ledgers::record_payment(
            c,
            tenant,
            order_id,
            kind,
            key,
            &receipt.provider_ref,
            receipt.amount_cents,
            now,
        )
        .await?
        {
            self.inner.metrics.payment(kind);
        }
        Ok(())
    }

    /// Refunds the charge of a cancelled order, if the provider has one, under the
    /// order's refund key (the provider answers the same refund however often it is
    /// asked, and the ledger records it once): a cancelled order never keeps a charge.
    async fn refund_stray_charge(&self, order: &Order) -> Result<(), OrderError> {
        let pay = pay_key(&order.order_id);
        let Some(charged) = self.inner.provider.lookup(&order.tenant_id, &pay).await? else {
            return Ok(());
        };
        let key = refund_key(&order.order_id);
        let receipt = self
            .inner
            .provider
            .refund(&order.tenant_id, &key, &order.order_id, order.amount_cents)
            .await?;
        let now = now_ms();
        let mut tx = self.inner.db.begin().await?;
        // The charge too, when no pay recorded it (a pay that died after the provider).
        self.record_payment(
            &mut tx.conn(),
            &order.tenant_id,
            &order.order_id,
            "charge",
            &pay,
            &charged,
            now,
        )
        .await?;
        self.record_payment(
            &mut tx.conn(),
            &order.tenant_id,
            &order.order_id,
            "refund",
            &key,
            &receipt,
            now,
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Cancels an order: unpaid → cancelled; paid → refund_pending → (refund under
    /// `refund:{order}`) → refunded → cancelled. Cancelling a cancelled order changes
    /// nothing; a ticketed order cannot be cancelled.
    pub(crate) async fn cancel(
        &self,
        tenant: &str,
        order_id: &str,
    ) -> Result<Unit<Order>, OrderError> {
        let order = self.load(tenant, order_id).await?;
        match order.status {
            OrderStatus::Cancelled => return self.unchanged(order).await,
            OrderStatus::Ticketed => {
                return Err(IllegalTransition {
                    from: OrderStatus::Ticketed,
                    event: OrderEvent::Cancel,
                }
                .into())
            }
            _ => {}
        }
        let guard = self.lock_order(tenant, order_id).await?;
        match self.cancel_locked(tenant, order_id).await {
            Ok((tx, value)) => Ok(Unit {
                tx,
                value,
                lease: Some(guard),
            }),
            Err(e) => {
                self.release(guard).await;
                Err(e)
            }
        }
    }

    async fn cancel_locked(&self, tenant: &str, order_id: &str) -> Result<(Tx, Order), OrderError> {
        let db = &self.inner.db;
        let mut order = self.load(tenant, order_id).await?;
        // Each step commits before the next one calls the provider, so a crash anywhere
        // leaves an order that the next cancel (same key or not) carries on from.
        loop {
            let now = now_ms();
            match order.status {
                OrderStatus::Cancelled => return Ok((db.begin().await?, order)),
                OrderStatus::Ticketed => {
                    return Err(IllegalTransition {
                        from: OrderStatus::Ticketed,
                        event: OrderEvent::Cancel,
                    }
                    .into())
                }
                OrderStatus::PendingPayment => {
                    let key = pay_key(order_id);
                    if let Some(receipt) = self.inner.provider.lookup(tenant, &key).await? {
                        // A charge the order never saw (a pay that died between the
                        // provider and its commit): confirm it, then refund it.
                        let mut tx = db.begin().await?;
                        let mut c = tx.conn();
                        ledgers::record_payment(
                            &mut c,
                            tenant,
                            order_id,
                            "charge",
                            &key,
                            &receipt.provider_ref,
                            receipt.amount_cents,
                            now,
                        )
                        .await?;
                        let actor = Actor::new("cancel")
                            .detail("charge found at the provider while cancelling");
                        order = advance(&mut c, &order, OrderEvent::PaymentConfirmed, &actor, now)
                            .await?;
                        tx.commit().await?;
                        continue;
                    }
                    let mut tx = db.begin().await?;
                    let mut c = tx.conn();
                    order = advance(
                        &mut c,
                        &order,
                        OrderEvent::Cancel,
                        &Actor::new("cancel"),
                        now,
                    )
                    .await?;
                    ledgers::emit(&mut c, &order, topics::ORDER_CANCELLED, now).await?;
                    return Ok((tx, order));
                }
                OrderStatus::Paid => {
                    let mut tx = db.begin().await?;
                    order = advance(
                        &mut tx.conn(),
                        &order,
                        OrderEvent::RefundRequested,
                        &Actor::new("cancel"),
                        now,
                    )
                    .await?;
                    tx.commit().await?;
                }
                OrderStatus::RefundPending => {
                    let key = refund_key(order_id);
                    let receipt = self
                        .inner
                        .provider
                        .refund(tenant, &key, order_id, order.amount_cents)
                        .await?;
                    let now = now_ms();
                    let mut tx = db.begin().await?;
                    let mut c = tx.conn();
                    self.record_payment(&mut c, tenant, order_id, "refund", &key, &receipt, now)
                        .await?;
                    let actor =
                        Actor::new("cancel").detail(format!("{key} → {}", receipt.provider_ref));
                    order =
                        advance(&mut c, &order, OrderEvent::RefundConfirmed, &actor, now).await?;
                    ledgers::emit(&mut c, &order, topics::ORDER_REFUNDED, now).await?;
                    order = advance(
                        &mut c,
                        &order,
                        OrderEvent::Close,
                        &Actor::new("cancel"),
                        now,
                    )
                    .await?;
                    ledgers::emit(&mut c, &order, topics::ORDER_CANCELLED, now).await?;
                    return Ok((tx, order));
                }
                OrderStatus::Refunded => {
                    let mut tx = db.begin().await?;
                    let mut c = tx.conn();
                    order = advance(
                        &mut c,
                        &order,
                        OrderEvent::Close,
                        &Actor::new("cancel"),
                        now,
                    )
                    .await?;
                    ledgers::emit(&mut c, &order, topics::ORDER_CANCELLED, now).await?;
                    return Ok((tx, order));
                }
            }
        }
    }

    async fn frozen(&self, order: &Order, what: FreezeWhat) -> Result<Option<Freeze>, Error> {
        let mut conn = self.inner.db.acquire().await?;
        freeze::frozen_for(
            &mut conn.conn(),
            &order.tenant_id,
            &order.user_id,
            &order.show_id,
            what,
        )
        .await
    }

    /// A read-only answer in a (trivial) transaction, so every answer commits the same way.
    async fn unchanged<T>(&self, value: T) -> Result<Unit<T>, OrderError> {
        Ok(Unit {
            tx: self.inner.db.begin().await?,
            value,
            lease: None,
        })
    }
}

/// Moves an order, turning a lost compare-and-set into the transition it would have been.
async fn advance(
    c: &mut Conn<'_>,
    order: &Order,
    event: OrderEvent,
    actor: &Actor<'_>,
    now: i64,
) -> Result<Order, OrderError> {
    match ledgers::move_order(c, order, event, actor, now).await {
        Ok(moved) => Ok(moved),
        Err(MoveError::Illegal(e)) => Err(e.into()),
        Err(MoveError::Db(e)) => Err(e.into()),
        Err(MoveError::Raced) => {
            let current = ledgers::order(c, &order.tenant_id, &order.order_id)
                .await?
                .ok_or_else(|| OrderError::OrderNotFound {
                    order_id: order.order_id.clone(),
                })?;
            Err(IllegalTransition {
                from: current.status,
                event,
            }
            .into())
        }
    }
}

/// Names (user, show, session) are 1 to 128 characters without control characters.
fn check_name(field: &'static str, value: &str) -> Result<(), OrderError> {
    check_text(field, value, 128)
}
