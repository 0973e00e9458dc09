//! Reads: shows, orders with every ledger, order lists, an order's messages and the
//! ledgers' row counts, and the order loads the commands and consumers start from.
//!
//! Owns nothing that writes. It must not open a write transaction or change a row.

use super::Orders;
use crate::db::Conn;
use crate::error::{Error, OrderError};
use crate::freeze;
use crate::ledgers::{self, Message, Order};
use crate::views::{MessageView, OrderView, PaymentView, TicketView, TransitionView};

impl Orders {
    pub async fn show(&self, tenant: &str, show_id: &str) -> Result<Option<ledgers::Show>, Error> {
        let mut conn = self.inner.db.acquire().await?;
        ledgers::show(&mut conn.conn(), tenant, show_id).await
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

    pub(super) async fn load(&self, tenant: &str, order_id: &str) -> Result<Order, OrderError> {
        let mut conn = self.inner.db.acquire().await?;
        self.load_in(&mut conn.conn(), tenant, order_id).await
    }

    pub(super) async fn load_in(
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
}
