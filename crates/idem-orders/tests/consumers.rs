//! Idempotent consumers on real stores: `order.paid` delivered three times, and a ticket
//! issuer that crashes after issuing and before its ack, still make exactly one ticket.
//! Inventory release is fenced: a holder whose lease was taken over cannot write.

#[macro_use]
mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Env, T1};
use idem_core::{LeaseName, OwnerId};
use idem_orders::service::consumers::{INVENTORY_RELEASER, TICKET_ISSUER};
use idem_orders::{Faults, Handled};
use serde_json::json;

on_every_store!(
    redelivery_and_crash_after_issue_make_one_ticket,
    concurrent_deliveries_make_one_ticket,
    stale_inventory_holder_is_fenced,
);

async fn redelivery_and_crash_after_issue_make_one_ticket(env: Env) {
    let s = env
        .start_with(|c| {
            c.options.run_chain = false;
            c.options.orders.faults = Faults {
                ticket_issuer_crashes_after_issue: 1,
                ..Faults::default()
            };
        })
        .await;
    let orders = s.server.orders().clone();
    let chain = s.server.chain().clone();
    let id = s.create(T1, "rd-1", "U", "S-204", 1).await.order_id();
    assert_eq!(
        s.post(
            &format!("/v1/orders/{id}/pay"),
            T1,
            Some("rd-pay"),
            &json!({})
        )
        .await
        .status,
        200
    );
    assert_eq!(
        chain.relay_once().await.unwrap(),
        2,
        "order.created and order.paid published"
    );

    // First delivery: the issuer commits the ticket, then "crashes" before its ack.
    assert_eq!(chain.deliver_once(TICKET_ISSUER).await.unwrap(), 1);
    let counts = orders.counts("t1").await.unwrap();
    assert_eq!(counts.tickets, 1, "issued before the crash");
    // The delivery was not acked: it comes again after the retry delay.
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert_eq!(
        chain.deliver_once(TICKET_ISSUER).await.unwrap(),
        1,
        "redelivered"
    );
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert_eq!(
        chain.deliver_once(TICKET_ISSUER).await.unwrap(),
        0,
        "acked now"
    );

    // The same message three more times, straight into the consumer.
    let paid = orders
        .messages("t1", &id)
        .await
        .unwrap()
        .into_iter()
        .find(|m| m.topic == "order.paid")
        .expect("order.paid");
    for _ in 0..3 {
        assert_eq!(
            orders.handle(TICKET_ISSUER, &paid).await.unwrap(),
            Handled::Duplicate
        );
    }
    let view = s.order(T1, &id).await;
    assert_eq!(view["status"], "ticketed");
    assert_eq!(
        orders.counts("t1").await.unwrap().tickets,
        1,
        "exactly one ticket"
    );
    let issued: Vec<_> = orders
        .messages("t1", &id)
        .await
        .unwrap()
        .into_iter()
        .filter(|m| m.topic == "ticket.issued")
        .collect();
    assert_eq!(issued.len(), 1);
    s.shutdown().await;
}

async fn concurrent_deliveries_make_one_ticket(env: Env) {
    let s = env.start_with(|c| c.options.run_chain = false).await;
    let orders = s.server.orders().clone();
    let id = s.create(T1, "cd-1", "U", "S-204", 1).await.order_id();
    s.post(
        &format!("/v1/orders/{id}/pay"),
        T1,
        Some("cd-pay"),
        &json!({}),
    )
    .await;
    let paid = orders
        .messages("t1", &id)
        .await
        .unwrap()
        .into_iter()
        .find(|m| m.topic == "order.paid")
        .unwrap();
    let paid = Arc::new(paid);
    let runs = futures::future::join_all((0..6).map(|_| {
        let orders = orders.clone();
        let paid = paid.clone();
        async move { orders.handle(TICKET_ISSUER, &paid).await }
    }))
    .await;
    let done = runs
        .iter()
        .filter(|r| matches!(r, Ok(Handled::Done { outcome }) if outcome == "issued"))
        .count();
    assert_eq!(done, 1, "{runs:?}");
    assert_eq!(orders.counts("t1").await.unwrap().tickets, 1);
    s.shutdown().await;
}

/// The inventory releaser writes through the fence with its lease's token: a holder
/// whose lease expired and was granted to someone else cannot write afterwards.
async fn stale_inventory_holder_is_fenced(env: Env) {
    let s = env
        .start_with(|c| {
            c.options.run_chain = false;
            c.options.orders.lease_timings.ttl = Duration::from_millis(300);
            c.options.orders.lease_timings.wait = Duration::from_secs(5);
        })
        .await;
    let orders = s.server.orders().clone();
    let chain = s.server.chain().clone();
    let leases = orders.database().lease_store();
    let name = LeaseName::new("inventory:t1:S-101").unwrap();

    // A stale holder: it got the show's lease, then stalled past its ttl.
    let stale = leases
        .try_acquire(
            &name,
            &OwnerId::new("stale-holder").unwrap(),
            Duration::from_millis(300),
        )
        .await
        .unwrap()
        .granted()
        .expect("granted");
    tokio::time::sleep(Duration::from_millis(350)).await;

    // Meanwhile an order is cancelled and the releaser (a newer grant) releases its hold.
    let id = s.create(T1, "fence-1", "U", "S-101", 1).await.order_id();
    s.post(
        &format!("/v1/orders/{id}/cancel"),
        T1,
        Some("fence-c"),
        &json!({}),
    )
    .await;
    chain.relay_once().await.unwrap();
    assert_eq!(chain.deliver_once(INVENTORY_RELEASER).await.unwrap(), 1);
    let view = s.order(T1, &id).await;
    assert_eq!(view["hold"]["status"], "released");
    let token = view["hold"]["release_token"].as_i64().unwrap();
    assert!(
        token > stale.token.get(),
        "the releaser wrote with a newer token"
    );

    // The stale holder wakes up and tries to write to the same resource: fenced.
    let err = orders
        .database()
        .fenced_probe("inventory:t1:S-101", &stale)
        .await
        .expect_err("a stale token is fenced");
    assert!(err.is_fenced(), "{err}");
    let events = leases.events(&name, 100).await.unwrap();
    assert!(events
        .iter()
        .any(|e| e.kind == idem_core::LeaseEventKind::FencedWriteRejected));
    s.shutdown().await;
}
