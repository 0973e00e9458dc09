//! Freeze switches on real stores: frozen work waits, nothing is lost, and on unfreeze
//! all of it is done exactly once. The freeze is visible in `/metrics` and in order
//! views. Freezes are applied through the admin API and directly on the database (the
//! CLI's path) while the server runs.

#[macro_use]
mod common;

use std::time::Duration;

use common::{Backend, Env, TestServer, T1};
use idem_orders::{freeze, FreezeRequest, FreezeScope, FreezeWhat};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(20);

on_every_store!(
    freeze_queue_unfreeze_all_done_once,
    freeze_on_the_database_reaches_the_server
);

fn statuses(view: &Value) -> Vec<String> {
    view["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["to"].as_str().unwrap().to_owned())
        .collect()
}

async fn pay(s: &TestServer, id: &str, key: &str) -> common::Reply {
    s.post(&format!("/v1/orders/{id}/pay"), T1, Some(key), &json!({}))
        .await
}

async fn freeze_queue_unfreeze_all_done_once(env: Env) {
    let s = env.start().await;
    let all = json!({"scope": "user:U-f", "what": ["payment-confirm", "ticketing", "inventory-release"],
                     "reason": "20:14 duplicates", "actor": "oncall"});
    let frozen = s.admin("/v1/admin/freezes", &all).await;
    assert_eq!(frozen.status, 201, "{}", frozen.body);
    assert_eq!(frozen.body["changed"].as_array().unwrap().len(), 3);
    let again = s.admin("/v1/admin/freezes", &all).await;
    assert_eq!(
        (
            again.status,
            again.body["changed"].as_array().unwrap().len()
        ),
        (200, 0),
        "idempotent"
    );

    // Queue work for the frozen user.
    let a = s.create(T1, "f-a", "U-f", "S-204", 1).await.order_id();
    let b = s.create(T1, "f-b", "U-f", "S-204", 2).await.order_id();
    let c = s.create(T1, "f-c", "U-f", "S-204", 1).await.order_id();
    let pa = pay(&s, &a, "f-pay-a1").await;
    assert_eq!(pa.status, 202, "{}", pa.body);
    assert_eq!(pa.body["payment"], "queued");
    assert_eq!(pa.body["frozen"][0]["what"], "payment-confirm");
    assert_eq!(
        pay(&s, &a, "f-pay-a2").await.status,
        202,
        "a second pay click queues nothing new"
    );
    assert!(pay(&s, &a, "f-pay-a1").await.replayed);
    assert_eq!(pay(&s, &b, "f-pay-b").await.status, 202);
    let cancelled = s
        .post(
            &format!("/v1/orders/{c}/cancel"),
            T1,
            Some("f-cancel-c"),
            &json!({}),
        )
        .await;
    assert_eq!(
        cancelled.body["status"], "cancelled",
        "cancelling is not frozen; the release is"
    );

    // Someone outside the freeze is served as usual.
    let d = s.create(T1, "f-d", "U-free", "S-204", 1).await.order_id();
    assert_eq!(pay(&s, &d, "f-pay-d").await.status, 200);
    s.wait_order(T1, &d, WAIT, "ticketed", |v| v["status"] == "ticketed")
        .await;

    // Several freeze rechecks later, nothing moved for U-f.
    tokio::time::sleep(Duration::from_millis(800)).await;
    for id in [&a, &b] {
        let v = s.order(T1, id).await;
        assert_eq!(v["status"], "pending_payment", "{v:#}");
        assert!(v["payments"].as_array().unwrap().is_empty());
        assert_eq!(
            v["frozen"].as_array().unwrap().len(),
            3,
            "the order view shows the freezes"
        );
    }
    assert_eq!(s.order(T1, &c).await["hold"]["status"], "held");
    let counts = s.server.orders().counts("t1").await.unwrap();
    assert_eq!(
        (counts.charges, counts.tickets, counts.holds_released),
        (1, 1, 0)
    );
    let m = s.metrics().await;
    for what in ["payment-confirm", "ticketing", "inventory-release"] {
        let series = format!("idem_orders_freeze_active{{scope_kind=\"user\",what=\"{what}\"}} 1");
        assert!(m.contains(&series), "metrics lack {series}:\n{m}");
    }
    assert!(
        m.contains("idem_orders_frozen_deferrals_total{what=\"inventory-release\"}"),
        "{m}"
    );
    let messages = s.server.orders().messages("t1", &a).await.unwrap();
    assert_eq!(
        messages
            .iter()
            .filter(|m| m.topic == "payment.requested")
            .count(),
        1
    );

    // Unfreeze: payment confirmation and ticketing through the admin API, the
    // inventory release directly on the database (the CLI's path).
    let unfrozen = s
        .admin(
            "/v1/admin/unfreeze",
            &json!({"scope": "user:U-f", "what": "payment-confirm,ticketing"}),
        )
        .await;
    assert_eq!(unfrozen.status, 200, "{}", unfrozen.body);
    assert_eq!(unfrozen.body["changed"].as_array().unwrap().len(), 2);
    let request = FreezeRequest::new(
        FreezeScope::User("U-f".into()),
        [FreezeWhat::InventoryRelease],
    );
    let change = unfreeze_on_db(&env, &request).await;
    assert_eq!(change.changed.len(), 1);
    assert!(change.active.is_empty());

    for id in [&a, &b] {
        let v = s
            .wait_order(T1, id, WAIT, "ticketed", |v| v["status"] == "ticketed")
            .await;
        assert_eq!(
            v["payments"].as_array().unwrap().len(),
            1,
            "one charge: {v:#}"
        );
        assert!(v["ticket"].is_object());
        assert_eq!(statuses(&v), ["pending_payment", "paid", "ticketed"]);
        assert!(v["frozen"].as_array().unwrap().is_empty());
    }
    s.wait_order(T1, &c, WAIT, "released", |v| {
        v["hold"]["status"] == "released"
    })
    .await;
    let counts = s.server.orders().counts("t1").await.unwrap();
    assert_eq!(
        (
            counts.charges,
            counts.refunds,
            counts.tickets,
            counts.holds_released
        ),
        (3, 0, 3, 1)
    );
    let calls = s
        .server
        .orders()
        .provider()
        .lookup("t1", &format!("pay:{a}"))
        .await
        .unwrap()
        .unwrap()
        .calls;
    assert_eq!(calls, 1, "the queued payment ran once");
    // The unfreeze went to the database directly (as the CLI does): the gauges show it
    // at their next background refresh.
    let cleared = |m: &str| {
        ["payment-confirm", "ticketing", "inventory-release"]
            .iter()
            .all(|what| {
                m.contains(&format!(
                    "idem_orders_freeze_active{{scope_kind=\"user\",what=\"{what}\"}} 0"
                ))
            })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let m = loop {
        let m = s.metrics().await;
        if cleared(&m) || std::time::Instant::now() > deadline {
            break m;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!m.contains("U-f"), "no user id in the metrics:\n{m}");
    assert!(cleared(&m), "no active freeze left:\n{m}");
    let history = s.get_admin("/v1/admin/freezes").await;
    assert_eq!(history["active"].as_array().unwrap().len(), 0);
    assert_eq!(
        history["history"].as_array().unwrap().len(),
        3,
        "freezes are kept"
    );
    assert!(history["history"]
        .as_array()
        .unwrap()
        .iter()
        .all(|f| f["unfrozen_at"].is_string()));
    s.shutdown().await;
}

/// `idem freeze` on the database URL while a server runs on it.
async fn freeze_on_the_database_reaches_the_server(env: Env) {
    let s = env.start().await;
    let request = FreezeRequest {
        reason: Some("cli".into()),
        ..FreezeRequest::new(FreezeScope::Show("S-101".into()), [FreezeWhat::Ticketing])
    };
    let change = freeze_on_db(&env, &request).await;
    assert_eq!(change.changed.len(), 1);
    let id = s.create(T1, "cli-1", "U-cli", "S-101", 1).await.order_id();
    assert_eq!(
        pay(&s, &id, "cli-pay").await.status,
        200,
        "payment is not frozen"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    let v = s.order(T1, &id).await;
    assert_eq!(v["status"], "paid", "ticketing is frozen: {v:#}");
    assert_eq!(v["frozen"][0]["scope"], "show:S-101");
    assert!(s
        .metrics()
        .await
        .contains("idem_orders_freeze_active{scope_kind=\"show\",what=\"ticketing\"} 1"));
    unfreeze_on_db(&env, &request).await;
    let v = s
        .wait_order(T1, &id, WAIT, "ticketed", |v| v["status"] == "ticketed")
        .await;
    assert!(v["ticket"].is_object());
    s.shutdown().await;
}

async fn freeze_on_db(env: &Env, request: &FreezeRequest) -> idem_orders::FreezeChange {
    match env.backend {
        // The CLI's path: a URL that names the whole database.
        Backend::Sqlite | Backend::Mysql => {
            freeze::freeze(&env.url, request).await.expect("freeze")
        }
        Backend::Postgres => freeze::apply_freeze(&env.database().await, request)
            .await
            .expect("freeze"),
    }
}

async fn unfreeze_on_db(env: &Env, request: &FreezeRequest) -> idem_orders::FreezeChange {
    match env.backend {
        Backend::Sqlite => freeze::unfreeze(&env.url, request).await.expect("unfreeze"),
        Backend::Postgres | Backend::Mysql => {
            freeze::apply_unfreeze(&env.database().await, request)
                .await
                .expect("unfreeze")
        }
    }
}
