//! The business: creating, paying and cancelling orders, and the three consumers of the
//! automatic chain (payment confirmation, ticket issuing, inventory release).
//!
//! Owns the policy: limits, stock, which state-machine event a request means, the
//! business-derived keys (`pay:{order}`, `refund:{order}`, `ticket:{order}`,
//! `release:{order}`) every retry and every consumer reuses, freezes, and which lease
//! guards what:
//! - `order:{tenant}:{order}` serializes pay and cancel of one order, so a cancel never
//!   lands between a charge and its confirmation;
//! - `inventory:{tenant}:{show}` guards the release of stock, written through the fence
//!   with the lease's token, so a holder that lost its lease cannot write late.
//!
//! Request handlers get their business rows as an open transaction (`Unit`) so the
//! caller can finish the idempotency record in it and commit once. This module must not
//! know HTTP, must not mint keys for retries, and never deletes a row.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::{LeaseName, LeaseStore, OwnerId};
use idem_lease::{Acquired, LeaseGuard, LeaseMetrics};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use crate::db::{Conn, Database, Tx};
use crate::error::{Error, OrderError};
use crate::freeze::{self, Freeze, FreezeWhat};
use crate::ledgers::{self, now_ms, topics, Actor, Message, MoveError, Order};
use crate::machine::{IllegalTransition, OrderEvent, OrderStatus};
use crate::metrics::OrdersMetrics;
use crate::provider::PaymentSimulator;
use crate::views::{MessageView, OrderView, PaymentView, TicketView, TransitionView};

/// Consumer names (also the durable consumer names on NATS).
pub mod consumers {
    /// Confirms payments that were queued while `payment-confirm` was frozen.
    pub const PAYMENT_CONFIRMER: &str = "payment-confirmer";
    /// Issues exactly one ticket per paid order.
    pub const TICKET_ISSUER: &str = "ticket-issuer";
    /// Releases a cancelled order's hold back to stock, under lease and fence.
    pub const INVENTORY_RELEASER: &str = "inventory-releaser";

    /// Which consumer reads which topic.
    pub const SUBSCRIPTIONS: [(&str, &str); 3] = [
        (PAYMENT_CONFIRMER, super::topics::PAYMENT_REQUESTED),
        (TICKET_ISSUER, super::topics::ORDER_PAID),
        (INVENTORY_RELEASER, super::topics::ORDER_CANCELLED),
    ];

    /// The consumers of `topic`.
    pub fn of_topic(topic: &str) -> impl Iterator<Item = &'static str> + '_ {
        SUBSCRIPTIONS
            .iter()
            .filter(move |(_, t)| *t == topic)
            .map(|(c, _)| *c)
    }
}

/// The business key a retry or consumer reuses for charging an order.
pub fn pay_key(order_id: &str) -> String {
    format!("pay:{order_id}")
}

/// The business key for refunding an order.
pub fn refund_key(order_id: &str) -> String {
    format!("refund:{order_id}")
}

fn ticket_key(order_id: &str) -> String {
    format!("ticket:{order_id}")
}

fn release_key(order_id: &str) -> String {
    format!("release:{order_id}")
}

/// The business key `consumer` processes a message of `order_id` under, if it is one of
/// the chain's consumers. An operator tool that stops a duplicate's messages marks this
/// key processed, so the consumer acks the message as a duplicate instead of acting.
pub(crate) fn consumer_key(consumer: &str, order_id: &str) -> Option<String> {
    match consumer {
        consumers::PAYMENT_CONFIRMER => Some(pay_key(order_id)),
        consumers::TICKET_ISSUER => Some(ticket_key(order_id)),
        consumers::INVENTORY_RELEASER => Some(release_key(order_id)),
        _ => None,
    }
}

/// The body of `POST /v1/orders`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewOrder {
    pub user_id: String,
    pub show_id: String,
    pub quantity: i64,
    #[serde(default)]
    pub client_session: Option<String>,
}

/// A hook run at a fault point.
pub type FaultHook = Arc<dyn Fn() + Send + Sync>;

/// Faults injected on purpose, for drills, tests and the incident demo. All off by
/// default; nothing reads them from the environment.
#[derive(Clone, Default)]
pub struct Faults {
    /// Runs right after an idempotent create committed (order and record), before its
    /// response is written. The `kill -9` drill kills the process here.
    pub after_create_commit: Option<FaultHook>,
    /// The first create this process serves is slow: it writes after `commit_after` and
    /// answers `respond_after` later (the incident's response lost after its commit).
    pub slow_first_create: Option<SlowCreate>,
    /// The ticket issuer fails this many times right after issuing, before the ack (a
    /// consumer crash between its commit and its ack).
    pub ticket_issuer_crashes_after_issue: u32,
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faults")
            .field("after_create_commit", &self.after_create_commit.is_some())
            .field("slow_first_create", &self.slow_first_create)
            .field(
                "ticket_issuer_crashes_after_issue",
                &self.ticket_issuer_crashes_after_issue,
            )
            .finish()
    }
}

/// See [`Faults::slow_first_create`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlowCreate {
    pub commit_after: Duration,
    pub respond_after: Duration,
}

#[derive(Default)]
pub(crate) struct FaultState {
    pub(crate) after_create_commit: Option<FaultHook>,
    slow_first_create: Mutex<Option<SlowCreate>>,
    ticket_crashes: AtomicU32,
}

impl FaultState {
    fn new(f: &Faults) -> Self {
        Self {
            after_create_commit: f.after_create_commit.clone(),
            slow_first_create: Mutex::new(f.slow_first_create),
            ticket_crashes: AtomicU32::new(f.ticket_issuer_crashes_after_issue),
        }
    }

    /// The slow-create fault, once.
    pub(crate) fn take_slow_create(&self) -> Option<SlowCreate> {
        self.slow_first_create
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    fn take_ticket_crash(&self) -> bool {
        self.ticket_crashes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// Lease timings of the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTimings {
    /// TTL of the per-order and per-show leases (renewed every ttl/3 while held).
    pub ttl: Duration,
    /// How long a request waits for a lease another request holds.
    pub wait: Duration,
}

impl Default for LeaseTimings {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(30),
            wait: Duration::from_secs(10),
        }
    }
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

/// Business rows written in an open transaction, with the value to answer and the lease
/// to release after the commit.
pub(crate) struct Unit<T> {
    pub(crate) tx: Tx,
    pub(crate) value: T,
    pub(crate) lease: Option<LeaseGuard>,
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

/// The business core. Cheap to clone.
#[derive(Clone)]
pub struct Orders {
    inner: Arc<Inner>,
}

struct Inner {
    db: Database,
    provider: PaymentSimulator,
    leases: Arc<dyn LeaseStore>,
    lease_metrics: LeaseMetrics,
    lease_timings: LeaseTimings,
    metrics: OrdersMetrics,
    faults: FaultState,
    /// Signalled after every commit that wrote to the outbox.
    outbox_written: Notify,
    owner_prefix: String,
    next_owner: AtomicU64,
}

/// How to build [`Orders`].
#[derive(Debug, Clone, Default)]
pub struct OrdersOptions {
    pub lease_timings: LeaseTimings,
    pub faults: Faults,
    /// Simulated provider latency per call.
    pub provider_latency: Duration,
}

impl Orders {
    pub fn new(
        db: Database,
        options: OrdersOptions,
        metrics: OrdersMetrics,
        lease_metrics: LeaseMetrics,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                provider: PaymentSimulator::new(db.clone(), options.provider_latency),
                leases: db.lease_store(),
                db,
                lease_metrics,
                lease_timings: options.lease_timings,
                metrics,
                faults: FaultState::new(&options.faults),
                outbox_written: Notify::new(),
                owner_prefix: format!("orders-{}", uuid::Uuid::now_v7().simple()),
                next_owner: AtomicU64::new(1),
            }),
        }
    }

    pub fn database(&self) -> &Database {
        &self.inner.db
    }

    pub fn provider(&self) -> &PaymentSimulator {
        &self.inner.provider
    }

    pub(crate) fn metrics(&self) -> &OrdersMetrics {
        &self.inner.metrics
    }

    pub(crate) fn faults(&self) -> &FaultState {
        &self.inner.faults
    }

    pub(crate) fn outbox_written(&self) -> &Notify {
        &self.inner.outbox_written
    }

    /// Wakes the relay: the outbox has something new.
    pub(crate) fn signal_outbox(&self) {
        self.inner.outbox_written.notify_one();
    }

    fn owner(&self) -> OwnerId {
        let n = self.inner.next_owner.fetch_add(1, Ordering::Relaxed);
        OwnerId::new(format!("{}#{n}", self.inner.owner_prefix)).expect("visible ASCII")
    }

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

    pub async fn show(&self, tenant: &str, show_id: &str) -> Result<Option<ledgers::Show>, Error> {
        let mut conn = self.inner.db.acquire().await?;
        ledgers::show(&mut conn.conn(), tenant, show_id).await
    }

    // -----------------------------------------------------------------------------------
    // Requests

    /// Validates and writes a new order: the order, its hold, its stock and its
    /// `order.created` message, in one open transaction.
    pub(crate) async fn create(
        &self,
        tenant: &str,
        req: &NewOrder,
        key: Option<&str>,
        route: &'static str,
    ) -> Result<Unit<OrderView>, OrderError> {
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
        if !ledgers::take_stock(&mut c, tenant, &show.show_id, req.quantity, now).await? {
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
        ledgers::insert_order(&mut c, &order, &actor).await?;
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
        self.inner.metrics.created(route);
        Ok(Unit {
            tx,
            value: OrderView::summary(&order, Some(&hold)),
            lease: None,
        })
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
                return Err(IllegalTransition {
                    from,
                    event: OrderEvent::PaymentConfirmed,
                }
                .into())
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
    async fn confirm_payment(&self, order: Order, actor: &str) -> Result<(Tx, Order), OrderError> {
        let key = pay_key(&order.order_id);
        let receipt = self
            .inner
            .provider
            .charge(&order.tenant_id, &key, &order.order_id, order.amount_cents)
            .await?;
        let now = now_ms();
        let mut tx = self.inner.db.begin().await?;
        let mut c = tx.conn();
        if ledgers::record_payment(
            &mut c,
            &order.tenant_id,
            &order.order_id,
            "charge",
            &key,
            &receipt.provider_ref,
            receipt.amount_cents,
            now,
        )
        .await?
        {
            self.inner.metrics.payment("charge");
        }
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
                // Charged for an order that moved on meanwhile (only possible after a
                // lost lease): keep the evidence of the charge for reconciliation.
                tx.commit().await?;
                tracing::error!(order = %order.order_id, %from, "charge for an order that is no longer payable");
                return Err(IllegalTransition {
                    from,
                    event: OrderEvent::PaymentConfirmed,
                }
                .into());
            }
        };
        Ok((tx, confirmed))
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
                    if ledgers::record_payment(
                        &mut c,
                        tenant,
                        order_id,
                        "refund",
                        &key,
                        &receipt.provider_ref,
                        receipt.amount_cents,
                        now,
                    )
                    .await?
                    {
                        self.inner.metrics.payment("refund");
                    }
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

    /// An order with every ledger, the freezes that apply to it, and its history.
    pub async fn view(&self, tenant: &str, order_id: &str) -> Result<OrderView, OrderError> {
        let mut conn = self.inner.db.acquire().await?;
        let mut c = conn.conn();
        let order = self.load_in(&mut c, tenant, order_id).await?;
        let hold = ledgers::hold_of(&mut c, tenant, order_id).await?;
        let payments = ledgers::payments_of(&mut c, tenant, order_id).await?;
        let ticket = ledgers::ticket_of(&mut c, tenant, order_id).await?;
        let messages = ledgers::messages_of(&mut c, tenant, order_id).await?;
        let transitions = ledgers::transitions(&mut c, tenant, order_id).await?;
        let frozen = freeze::freezes_for(&mut c, tenant, &order.user_id, &order.show_id).await?;
        let mut view = OrderView::summary(&order, hold.as_ref());
        view.payments = Some(payments.iter().map(PaymentView::from).collect());
        view.ticket = ticket.as_ref().map(TicketView::from);
        view.messages = Some(messages.iter().map(MessageView::from).collect());
        view.frozen = Some(frozen);
        view.transitions = Some(transitions.iter().map(TransitionView::from).collect());
        Ok(view)
    }

    pub async fn list(
        &self,
        tenant: &str,
        filter: &ledgers::OrderFilter,
    ) -> Result<Vec<OrderView>, Error> {
        let mut conn = self.inner.db.acquire().await?;
        let mut c = conn.conn();
        let orders = ledgers::list_orders(&mut c, tenant, filter).await?;
        let mut out = Vec::with_capacity(orders.len());
        for order in &orders {
            let hold = ledgers::hold_of(&mut c, tenant, &order.order_id).await?;
            out.push(OrderView::summary(order, hold.as_ref()));
        }
        Ok(out)
    }

    /// The outbox messages of an order, oldest first.
    pub async fn messages(&self, tenant: &str, order_id: &str) -> Result<Vec<Message>, Error> {
        let mut conn = self.inner.db.acquire().await?;
        ledgers::messages_of(&mut conn.conn(), tenant, order_id).await
    }

    /// Row counts of a tenant's ledgers (for operators, tests and the demo).
    pub async fn counts(&self, tenant: &str) -> Result<ledgers::LedgerCounts, Error> {
        let mut conn = self.inner.db.acquire().await?;
        ledgers::counts(&mut conn.conn(), tenant).await
    }

    // -----------------------------------------------------------------------------------
    // Consumers

    /// Runs `consumer` on `message`. Safe to call any number of times for one message,
    /// concurrently too: each consumer acts at most once per business key.
    pub async fn handle(&self, consumer: &str, message: &Message) -> Result<Handled, Error> {
        let handled = match consumer {
            consumers::PAYMENT_CONFIRMER => self.confirm_requested_payment(message).await,
            consumers::TICKET_ISSUER => self.issue_ticket(message).await,
            consumers::INVENTORY_RELEASER => self.release_inventory(message).await,
            other => Err(Error::InvalidInput(format!("unknown consumer {other}"))),
        };
        let static_name = consumers::SUBSCRIPTIONS
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
        let consumer = consumers::PAYMENT_CONFIRMER;
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
        let consumer = consumers::PAYMENT_CONFIRMER;
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
        let consumer = consumers::TICKET_ISSUER;
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
        let consumer = consumers::INVENTORY_RELEASER;
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

    // -----------------------------------------------------------------------------------
    // Helpers

    async fn load(&self, tenant: &str, order_id: &str) -> Result<Order, OrderError> {
        let mut conn = self.inner.db.acquire().await?;
        self.load_in(&mut conn.conn(), tenant, order_id).await
    }

    async fn load_in(
        &self,
        c: &mut Conn<'_>,
        tenant: &str,
        order_id: &str,
    ) -> Result<Order, OrderError> {
        ledgers::order(c, tenant, order_id)
            .await?
            .ok_or_else(|| OrderError::OrderNotFound {
                order_id: order_id.to_owned(),
            })
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

    /// Takes the per-order lease that serializes pay and cancel.
    async fn lock_order(&self, tenant: &str, order_id: &str) -> Result<LeaseGuard, OrderError> {
        let name = LeaseName::new(format!("order:{tenant}:{order_id}")).map_err(|_| {
            OrderError::OrderNotFound {
                order_id: order_id.to_owned(),
            }
        })?;
        let t = self.inner.lease_timings;
        match LeaseGuard::acquire(
            self.inner.leases.clone(),
            &name,
            &self.owner(),
            t.ttl,
            t.wait,
            self.inner.lease_metrics.clone(),
        )
        .await?
        {
            Acquired::Guard(g) => Ok(g),
            Acquired::Busy { .. } => Err(OrderError::Busy {
                order_id: order_id.to_owned(),
            }),
        }
    }

    pub(crate) async fn release(&self, guard: LeaseGuard) {
        let name = guard.lease().name;
        if let Err(e) = guard.release().await {
            tracing::warn!(error = %e, lease = %name, "lease release failed; it will expire");
        }
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
    let consumer = consumers::INVENTORY_RELEASER;
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
    if value.is_empty() || value.len() > 128 || value.chars().any(char::is_control) {
        return Err(OrderError::InvalidField {
            field,
            reason: "must be 1 to 128 characters without control characters".into(),
        });
    }
    Ok(())
}
