//! `idem reconcile` on the 20:14 incident and on look-alike orders, on SQLite,
//! PostgreSQL and MySQL: one cluster, the earliest paid order kept, 7 cancels, 1 refund, 7 holds
//! released, the ledger check passing, a second apply doing nothing, the chain's
//! consumers acking the stopped messages as duplicates — and separate intents left alone.

#[macro_use]
mod common;

use std::time::Duration;

use common::{Env, T1};
use idem_bench::demo::{demo_incident, DemoOptions};
use idem_orders::ledgers::OrderFilter;
use idem_orders::reconcile::{self, ActionKind, ActionState, ReconcileOptions, ReconcileReport};
use idem_orders::service::consumers;
use idem_orders::{
    Database, FreezeRequest, FreezeScope, FreezeWhat, Handled, Orders, OrdersOptions,
};
use serde_json::json;

on_every_store!(lookalikes_are_left_alone, incident_is_reconciled_once);

fn orders_of(db: &Database) -> Orders {
    Orders::new(
        db.clone(),
        OrdersOptions::default(),
        Default::default(),
        Default::default(),
    )
}

fn legacy(apply: bool) -> ReconcileOptions {
    ReconcileOptions {
        tenant: Some("legacy".into()),
        apply,
        ..ReconcileOptions::default()
    }
}

fn count(r: &ReconcileReport, kind: ActionKind) -> usize {
    r.actions.iter().filter(|a| a.kind == kind).count()
}

async fn incident_is_reconciled_once(env: Env) {
    demo_incident(DemoOptions {
        database_url: Some(env.url.clone()),
        pg_schema: env.pg_schema.clone(),
        client_session: Some("sess-2014".into()),
        time_scale: 1.0,
        ..DemoOptions::default()
    })
    .await
    .expect("demo runs");
    let db = env.database().await;
    let orders = orders_of(&db);
    let filter = OrderFilter {
        client_session: Some("sess-2014".into()),
        ..OrderFilter::default()
    };
    let before = orders.list("legacy", &filter).await.unwrap();
    assert_eq!(before.len(), 8);
    let earliest_paid = before
        .iter()
        .find(|o| o.status.is_paid())
        .expect("a paid order")
        .order_id
        .clone();

    // Dry run: the plan, nothing changed.
    let plan = reconcile::reconcile(&db, &legacy(false)).await.unwrap();
    assert_eq!(plan.mode, "dry-run");
    assert_eq!(plan.clusters.len(), 1, "{}", plan.render_text());
    let cluster = &plan.clusters[0];
    assert_eq!(cluster.orders.len(), 8);
    assert_eq!(cluster.keeper.as_deref(), Some(earliest_paid.as_str()));
    assert!(cluster
        .keeper_reason
        .contains("paid and holds an inventory voucher"));
    assert_eq!(count(&plan, ActionKind::Cancel), 7);
    assert_eq!(count(&plan, ActionKind::Refund), 1);
    assert_eq!(count(&plan, ActionKind::Release), 7);
    assert_eq!(cluster.refund_cents, 136_000);
    assert_eq!(cluster.released_tickets, 14);
    assert!(plan.actions.iter().all(|a| a.state == ActionState::Pending));
    assert!(plan.actions.iter().all(|a| a.order_id != earliest_paid));
    let refund = plan
        .actions
        .iter()
        .find(|a| a.kind == ActionKind::Refund)
        .unwrap();
    assert_eq!(
        refund.provider_key.as_deref(),
        Some(format!("refund:{}", refund.order_id).as_str())
    );
    assert_eq!(plan.applied, 0);
    assert!(plan.passed);
    let json = serde_json::to_value(&plan).unwrap();
    assert_eq!(json["clusters"].as_array().unwrap().len(), 1);
    assert_eq!(json["actions"][0]["kind"], "stop-message");
    assert!(json["actions"][0]["order_id"].is_string());
    assert_eq!(json["applied"], 0);
    // The idem tenant has one order per intent: nothing to do.
    let idem = reconcile::reconcile(
        &db,
        &ReconcileOptions {
            tenant: Some("idem".into()),
            ..ReconcileOptions::default()
        },
    )
    .await
    .unwrap();
    assert!(idem.clusters.is_empty());

    // Not frozen: refused, nothing changed, the freeze command given.
    let refused = reconcile::reconcile(&db, &legacy(true)).await.unwrap();
    assert!(refused.refused.is_some());
    assert_eq!(refused.applied, 0);
    assert_eq!(refused.freeze_gaps.len(), 1);
    assert!(refused.freeze_gaps[0]
        .command
        .starts_with("idem freeze --scope user:U-7318 --tenant legacy --what all"));
    assert_eq!(orders.counts("legacy").await.unwrap().refunds, 0);

    let mut freeze = FreezeRequest::new(FreezeScope::User("U-7318".into()), FreezeWhat::ALL);
    freeze.tenant = Some("legacy".into());
    idem_orders::freeze::apply_freeze(&db, &freeze)
        .await
        .unwrap();

    let applied = reconcile::reconcile(&db, &legacy(true)).await.unwrap();
    assert!(applied.refused.is_none());
    assert!(applied.passed, "{}", applied.render_text());
    assert_eq!(
        applied.applied,
        // 8 stops (7 order.created + 1 order.paid), 1 refund (its cancel comes with it),
        // 6 cancels, 7 releases.
        8 + 1 + 6 + 7,
        "{}",
        applied.render_text()
    );
    assert!(applied
        .actions
        .iter()
        .all(|a| matches!(a.state, ActionState::Applied | ActionState::Done)));
    let after = orders.list("legacy", &filter).await.unwrap();
    assert_eq!(after.len(), 8, "no order row deleted");
    for o in &after {
        if o.order_id == earliest_paid {
            assert!(o.status.is_paid());
        } else {
            assert_eq!(o.status.as_str(), "cancelled", "{}", o.order_id);
        }
    }
    let counts = orders.counts("legacy").await.unwrap();
    assert_eq!(
        (
            counts.charges,
            counts.refunds,
            counts.holds_held,
            counts.holds_released
        ),
        (2, 1, 1, 7)
    );
    let show = orders.show("legacy", "S-204").await.unwrap().unwrap();
    assert_eq!(
        show.available,
        show.capacity - 2,
        "only the keeper's 2 tickets held"
    );

    // The stopped messages: once the chain is unfrozen its consumers ack them as
    // duplicates instead of acting (no ticket for the refunded order, no second release).
    idem_orders::freeze::apply_unfreeze(&db, &freeze)
        .await
        .unwrap();
    let refunded = &refund.order_id;
    let messages = orders.messages("legacy", refunded).await.unwrap();
    let paid_msg = messages.iter().find(|m| m.topic == "order.paid").unwrap();
    assert_eq!(
        orders
            .handle(consumers::TICKET_ISSUER, paid_msg)
            .await
            .unwrap(),
        Handled::Duplicate
    );
    let cancelled_msg = messages
        .iter()
        .find(|m| m.topic == "order.cancelled")
        .unwrap();
    assert_eq!(
        orders
            .handle(consumers::INVENTORY_RELEASER, cancelled_msg)
            .await
            .unwrap(),
        Handled::Duplicate
    );
    let view = orders.view("legacy", refunded).await.unwrap();
    assert!(view.ticket.is_none());

    // A second apply changes nothing.
    let again = reconcile::reconcile(&db, &legacy(true)).await.unwrap();
    assert_eq!(again.applied, 0, "{}", again.render_text());
    assert_eq!(again.clusters.len(), 1, "the cluster is still reported");
    assert_eq!(
        again.clusters[0].keeper.as_deref(),
        Some(earliest_paid.as_str())
    );
    assert!(again.actions.iter().all(|a| a.state == ActionState::Done));
    assert!(again.passed);
    assert_eq!(orders.counts("legacy").await.unwrap(), counts);
    let html = again.render_html();
    assert!(html.starts_with("<!DOCTYPE html>") && html.contains(&earliest_paid));
    assert!(!html.contains("<script"), "self-contained, no scripts");
}

async fn lookalikes_are_left_alone(env: Env) {
    let server = env.start_with(|c| c.options.legacy_route = true).await;
    let legacy = |session: &str| json!({"user_id": "U-1", "show_id": "S-204", "quantity": 1, "client_session": session});
    let mut ids = Vec::new();
    for session in ["sess-a", "sess-a", "sess-b"] {
        let r = server
            .post("/v1/legacy/orders", T1, None, &legacy(session))
            .await;
        assert_eq!(r.status, 201, "{}", r.body);
        ids.push(r.order_id());
    }
    // Outside the window of sess-a's first order.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let r = server
        .post("/v1/legacy/orders", T1, None, &legacy("sess-a"))
        .await;
    ids.push(r.order_id());
    // Two intents the client keyed itself, same user, show and session.
    for key in ["k-1", "k-2"] {
        let r = server
            .post(
                "/v1/orders",
                T1,
                Some(key),
                &json!({"user_id": "U-1", "show_id": "S-204", "quantity": 1, "client_session": "sess-k"}),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.body);
        ids.push(r.order_id());
    }
    // Another user with the same session name.
    let r = server
        .post(
            "/v1/legacy/orders",
            T1,
            None,
            &json!({"user_id": "U-2", "show_id": "S-204", "quantity": 1, "client_session": "sess-a"}),
        )
        .await;
    ids.push(r.order_id());
    server.shutdown().await;

    let db = env.database().await;
    let options = ReconcileOptions {
        tenant: Some("t1".into()),
        window: Duration::from_millis(500),
        apply: true,
        force: true,
        ..ReconcileOptions::default()
    };
    let report = reconcile::reconcile(&db, &options).await.unwrap();
    assert_eq!(report.clusters.len(), 1, "{}", report.render_text());
    assert!(report.forced, "applied with --force while not frozen");
    let cluster = &report.clusters[0];
    let members: Vec<&str> = cluster.orders.iter().map(|o| o.order_id.as_str()).collect();
    assert_eq!(members, vec![ids[0].as_str(), ids[1].as_str()]);
    assert_eq!(cluster.keeper.as_deref(), Some(ids[0].as_str()));
    assert!(
        cluster.keeper_reason.contains("voucher"),
        "{}",
        cluster.keeper_reason
    );
    assert!(report.passed, "{}", report.render_text());
    let orders = orders_of(&db);
    for (i, id) in ids.iter().enumerate() {
        let view = orders.view("t1", id).await.unwrap();
        let expected = if i == 1 {
            "cancelled"
        } else {
            "pending_payment"
        };
        assert_eq!(view.status.as_str(), expected, "order {i} {id}");
    }
    // Rerun: nothing more.
    let again = reconcile::reconcile(&db, &options).await.unwrap();
    assert_eq!(again.applied, 0);
}
