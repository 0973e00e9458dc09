//! `idem demo incident`: 6 clicks and 2 gateway retries, the first response lost after
//! its commit. Legacy: 8 orders, 2 paid. idem: 1 order, 7 replays of its id. With a
//! database URL the rows stay for reconciliation (tenants `legacy` and `idem`).

#[macro_use]
mod common;

use common::Env;
use idem_bench::demo::{demo_incident, DemoOptions, DemoReport};
use idem_orders::ledgers::OrderFilter;
use idem_orders::{Database, DatabaseOptions, Orders, OrdersOptions};

on_both_stores!(incident_kept_in_the_database);

fn check(report: &DemoReport) {
    let (l, i) = (&report.legacy, &report.idem);
    assert_eq!((l.requests, i.requests), (8, 8));
    assert_eq!((l.responses_lost, i.responses_lost), (1, 1), "{report:#?}");

    assert_eq!(l.orders, 8, "legacy: one order per arrival");
    assert_eq!(l.paid_orders, 2);
    assert_eq!(l.payments, 2);
    assert_eq!(l.holds, 8);
    assert_eq!(l.held_tickets, 16);
    assert_eq!(l.distinct_order_ids, 7, "the client saw 7 different ids");
    assert_eq!(l.replays, 0);
    assert_eq!(l.messages_by_topic["order.created"], 8);
    assert_eq!(l.messages_by_topic["order.paid"], 2);
    assert_eq!(
        l.messages_unpublished, l.messages,
        "duplicates still queued"
    );

    assert_eq!(i.orders, 1, "idem: one order");
    assert_eq!(i.replays, 7, "seven replays");
    assert_eq!(i.order_ids.len(), 7);
    assert!(
        i.order_ids.iter().all(|id| *id == i.order_ids[0]),
        "{:?}",
        i.order_ids
    );
    assert_eq!(i.distinct_order_ids, 1);
    assert_eq!(i.paid_orders, 1);
    assert_eq!(i.payments, 1);
    assert_eq!(i.holds, 1);
    assert_eq!(i.messages_by_topic["order.created"], 1);
    assert!(i.idempotency_key.is_some());
    assert!(i.arrivals[0].outcome.starts_with("lost"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn incident_on_a_temporary_store() {
    let report = demo_incident(DemoOptions::default())
        .await
        .expect("demo runs");
    check(&report);
    assert_eq!(report.database, "temporary");
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["legacy"]["orders"], 8);
    assert_eq!(json["idem"]["orders"], 1);
    assert_eq!(json["idem"]["replays"], 7);
    assert_eq!(json["idem"]["order_ids"].as_array().unwrap().len(), 7);
    let text = report.render_text();
    assert!(
        text.contains("legacy (no key)") && text.contains("idem (Idempotency-Key)"),
        "{text}"
    );
    assert!(text.contains("order.created"), "{text}");
}

async fn incident_kept_in_the_database(env: Env) {
    let options = DemoOptions {
        database_url: Some(env.url.clone()),
        pg_schema: env.pg_schema.clone(),
        client_session: Some("sess-2014".into()),
        ..DemoOptions::default()
    };
    let report = demo_incident(options).await.expect("demo runs");
    check(&report);
    // The rows stay for the reconciliation tooling.
    let db = Database::open(
        &env.url,
        DatabaseOptions {
            pg_schema: env.pg_schema.clone(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let orders = Orders::new(
        db,
        OrdersOptions::default(),
        Default::default(),
        Default::default(),
    );
    let filter = OrderFilter {
        user_id: Some("U-7318".into()),
        show_id: Some("S-204".into()),
        client_session: Some("sess-2014".into()),
        limit: None,
    };
    let legacy = orders.list("legacy", &filter).await.unwrap();
    assert_eq!(legacy.len(), 8);
    assert_eq!(legacy.iter().filter(|o| o.status.is_paid()).count(), 2);
    let first = legacy.first().unwrap().created_at.clone();
    let last = legacy.last().unwrap().created_at.clone();
    let span = chrono::DateTime::parse_from_rfc3339(&last).unwrap()
        - chrono::DateTime::parse_from_rfc3339(&first).unwrap();
    assert!(
        span < chrono::Duration::minutes(2),
        "within the 2-minute window: {span}"
    );
    assert!(legacy.iter().all(|o| o.idempotency_key.is_none()));
    let idem = orders.list("idem", &filter).await.unwrap();
    assert_eq!(idem.len(), 1);
    assert_eq!(idem[0].order_id, report.idem.order_ids[0]);
}
