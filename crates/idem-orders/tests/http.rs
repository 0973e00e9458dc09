//! The HTTP contract of the order service on real stores (SQLite, PostgreSQL, MySQL): one
//! intent → one order, replays, bad input, tenants, concurrent pays → one charge,
//! cancel with refund and fenced release, the gateway's state query, and the public
//! endpoints.

#[macro_use]
mod common;

use std::time::Duration;

use common::{Env, Reply, ADMIN, T1, T2};
use futures::future::join_all;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(20);

on_every_store!(
    eight_concurrent_creates_make_one_order,
    replay_returns_the_first_body,
    bad_input_is_problem_json_and_rejections_replay,
    another_tenants_order_is_not_found,
    concurrent_pays_make_one_charge,
    a_key_reused_on_another_order_is_refused,
    cancel_paid_order_refunds_and_releases_under_fence,
    paid_order_gets_one_ticket_through_the_chain,
    key_state_query_is_tenant_scoped,
    public_endpoints,
    a_claim_left_past_its_lease_shows_in_a_gauge,
    a_create_writes_its_record_once_and_final,
    a_charge_that_lands_on_a_cancelled_order_is_refunded,
);

/// A pay that lost the order's lease can charge after a cancel ran (its process was
/// stopped in between). Whatever charge the provider holds for a cancelled order is
/// recorded and refunded: by that pay, or by any later pay of the order.
async fn a_charge_that_lands_on_a_cancelled_order_is_refunded(env: Env) {
    let s = env.start().await;
    let id = s.create(T1, "stray-1", "U-s", "S-204", 1).await.order_id();
    let cancelled = s
        .post(
            &format!("/v1/orders/{id}/cancel"),
            T1,
            Some("stray-c"),
            &json!({}),
        )
        .await;
    assert_eq!(cancelled.body["status"], "cancelled", "{}", cancelled.body);
    // The stopped pay's charge reaches the provider after the cancel.
    let order = s.order(T1, &id).await;
    let amount = order["amount_cents"].as_i64().unwrap();
    s.server
        .orders()
        .provider()
        .charge("t1", &idem_orders::service::pay_key(&id), &id, amount)
        .await
        .unwrap();
    let pay = s
        .post(
            &format!("/v1/orders/{id}/pay"),
            T1,
            Some("stray-p"),
            &json!({}),
        )
        .await;
    assert_eq!(pay.status, 409, "{}", pay.body);
    let view = s.order(T1, &id).await;
    assert_eq!(view["status"], "cancelled");
    let mut kinds: Vec<&str> = view["payments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["kind"].as_str().unwrap())
        .collect();
    kinds.sort_unstable();
    assert_eq!(kinds, ["charge", "refund"], "{view:#}");
    // Asking again changes nothing: one charge, one refund.
    let again = s
        .post(
            &format!("/v1/orders/{id}/pay"),
            T1,
            Some("stray-p2"),
            &json!({}),
        )
        .await;
    assert_eq!(again.status, 409);
    let counts = s.server.orders().counts("t1").await.unwrap();
    assert_eq!((counts.charges, counts.refunds), (1, 1));
    s.shutdown().await;
}

/// The one-commit create: the record is inserted whole with the order (version 1, no
/// lease, never PROCESSING), and a retry replays it.
async fn a_create_writes_its_record_once_and_final(env: Env) {
    let s = env.start().await;
    let key = format!("final-{}", uuid::Uuid::now_v7());
    let first = s.create(T1, &key, "U-1", "S-204", 1).await;
    assert_eq!((first.status, first.replayed), (201, false));
    let scope = idem_core::Scope::new(
        idem_core::TenantId::new("t1").unwrap(),
        idem_core::IdempotencyKey::new(&key).unwrap(),
    );
    let store = s.server.orders().database().idempotency_store();
    let record = store.get(&scope).await.unwrap().expect("the record");
    assert_eq!(record.state, idem_core::RecordState::Succeeded);
    assert_eq!((record.version, record.attempts), (1, 1), "written once");
    assert_eq!(record.lease_expires_at, None);
    assert_eq!(record.result.as_ref().map(|r| r.status), Some(201));
    let again = s.create(T1, &key, "U-1", "S-204", 1).await;
    assert_eq!((again.status, again.replayed), (201, true));
    assert_eq!(again.bytes, first.bytes);
    let counts = s.server.orders().counts("t1").await.unwrap();
    assert_eq!(counts.orders, 1);
}

/// The seed's check: 8 concurrent creates with one key → 1 INSERT and 8 answers with
/// the same order id (7 of them replays).
async fn eight_concurrent_creates_make_one_order(env: Env) {
    let s = env.start().await;
    let key = format!("confirm-{}", uuid::Uuid::now_v7());
    let replies: Vec<Reply> =
        join_all((0..8).map(|_| s.create(T1, &key, "U-7318", "S-204", 2))).await;
    let ids: Vec<String> = replies.iter().map(Reply::order_id).collect();
    assert!(replies.iter().all(|r| r.status == 201), "{replies:#?}");
    assert!(
        ids.iter().all(|id| *id == ids[0]),
        "8 identical order ids: {ids:?}"
    );
    assert_eq!(
        replies.iter().filter(|r| r.replayed).count(),
        7,
        "7 replays"
    );
    let first = replies.iter().find(|r| !r.replayed).unwrap();
    assert!(
        replies.iter().all(|r| r.bytes == first.bytes),
        "byte-identical bodies"
    );

    let counts = s.server.orders().counts("t1").await.unwrap();
    assert_eq!(counts.orders, 1, "one order row");
    assert_eq!(counts.holds_held, 1, "one hold");
    assert_eq!(counts.messages, 1, "one order.created");
    let list = s.get("/v1/orders?user_id=U-7318&show_id=S-204", T1).await;
    assert_eq!(list.body["orders"].as_array().unwrap().len(), 1);
    let show = s
        .server
        .orders()
        .show("t1", "S-204")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(show.capacity - show.available, 2, "stock taken once");
    s.shutdown().await;
}

async fn replay_returns_the_first_body(env: Env) {
    let s = env.start().await;
    let body =
        json!({"user_id": "U-1", "show_id": "S-101", "quantity": 1, "client_session": "sess-1"});
    let first = s.post("/v1/orders", T1, Some("k-replay"), &body).await;
    assert_eq!(first.status, 201, "{}", first.body);
    assert!(!first.replayed);
    assert_eq!(first.body["status"], "pending_payment");
    assert_eq!(first.body["idempotency_key"], "k-replay");
    assert_eq!(first.body["client_session"], "sess-1");
    assert_eq!(first.body["hold"]["status"], "held");
    // Same key, same JSON with the keys in another order: the same intent.
    let again = s
        .post_raw(
            "/v1/orders",
            T1,
            Some("k-replay"),
            br#"{"quantity":1,"client_session":"sess-1","show_id":"S-101","user_id":"U-1"}"#
                .to_vec(),
        )
        .await;
    assert_eq!(again.status, 201);
    assert!(again.replayed);
    assert_eq!(again.bytes, first.bytes);
    // Same key, different request: 422 from the layer, nothing written.
    let other = s
        .post(
            "/v1/orders",
            T1,
            Some("k-replay"),
            &json!({"user_id": "U-1", "show_id": "S-101", "quantity": 2}),
        )
        .await;
    assert_eq!(other.status, 422);
    assert!(other.content_type.starts_with("application/problem+json"));
    // Missing key: 400.
    let missing = s.post("/v1/orders", T1, None, &body).await;
    assert_eq!(missing.status, 400);
    assert_eq!(s.server.orders().counts("t1").await.unwrap().orders, 1);
    s.shutdown().await;
}

async fn bad_input_is_problem_json_and_rejections_replay(env: Env) {
    let s = env.start().await;
    // A show with 3 tickets, for the sold-out case.
    let put = s
        .http
        .put(format!("{}/v1/admin/shows/t1/S-tiny", s.base))
        .bearer_auth(ADMIN)
        .json(&json!({"capacity": 3, "per_order_limit": 3, "price_cents": 100}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 201);
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "unknown show",
            br#"{"user_id":"U","show_id":"S-nope","quantity":1}"#.to_vec(),
            422,
            "unknown-show",
        ),
        (
            "zero",
            br#"{"user_id":"U","show_id":"S-204","quantity":0}"#.to_vec(),
            422,
            "invalid-quantity",
        ),
        (
            "negative",
            br#"{"user_id":"U","show_id":"S-204","quantity":-3}"#.to_vec(),
            422,
            "invalid-quantity",
        ),
        (
            "above limit",
            br#"{"user_id":"U","show_id":"S-204","quantity":7}"#.to_vec(),
            422,
            "quantity-above-limit",
        ),
        (
            "malformed",
            br#"{"user_id":"U","show_id":"#.to_vec(),
            400,
            "malformed-json",
        ),
        (
            "wrong type",
            br#"{"user_id":"U","show_id":"S-204","quantity":"two"}"#.to_vec(),
            422,
            "invalid-body",
        ),
        (
            "missing field",
            br#"{"user_id":"U","quantity":1}"#.to_vec(),
            422,
            "invalid-body",
        ),
        (
            "empty user",
            br#"{"user_id":"","show_id":"S-204","quantity":1}"#.to_vec(),
            422,
            "invalid-field",
        ),
    ];
    for (name, body, status, slug) in cases {
        let key = format!("bad-{}", name.replace(' ', "-"));
        let r = s.post_raw("/v1/orders", T1, Some(&key), body.clone()).await;
        assert_eq!(r.status, status, "{name}: {}", r.body);
        assert!(
            r.content_type.starts_with("application/problem+json"),
            "{name}"
        );
        assert_eq!(
            r.problem_type(),
            format!("https://idem.dev/problems/orders/{slug}"),
            "{name}"
        );
        // A business refusal is final under its key: the same request replays it.
        let again = s.post_raw("/v1/orders", T1, Some(&key), body).await;
        assert_eq!(again.status, status, "{name} replay");
        assert!(again.replayed, "{name} replays");
        assert_eq!(again.bytes, r.bytes, "{name} replays the same body");
    }
    let first = s.create(T1, "tiny-1", "U", "S-tiny", 3).await;
    assert_eq!(first.status, 201);
    let sold_out = s.create(T1, "tiny-2", "U", "S-tiny", 1).await;
    assert_eq!(sold_out.status, 409);
    assert_eq!(
        sold_out.problem_type(),
        "https://idem.dev/problems/orders/sold-out"
    );
    let again = s.create(T1, "tiny-2", "U", "S-tiny", 1).await;
    assert!(
        again.replayed && again.status == 409,
        "sold out replays under its key"
    );
    assert_eq!(
        s.server.orders().counts("t1").await.unwrap().orders,
        1,
        "no order for any refusal"
    );
    // Unauthenticated.
    let anon = common::read(
        s.http
            .post(format!("{}/v1/orders", s.base))
            .header("Idempotency-Key", "anon")
            .json(&json!({"user_id": "U", "show_id": "S-204", "quantity": 1}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(anon.status, 401);
    let anon_get = common::read(
        s.http
            .get(format!("{}/v1/orders", s.base))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(anon_get.status, 401);
    s.shutdown().await;
}

async fn another_tenants_order_is_not_found(env: Env) {
    let s = env.start().await;
    let id = s.create(T1, "tenant-k", "U", "S-204", 1).await.order_id();
    for (path, post) in [
        (format!("/v1/orders/{id}"), false),
        (format!("/v1/orders/{id}/pay"), true),
        (format!("/v1/orders/{id}/cancel"), true),
    ] {
        let r = if post {
            s.post(&path, T2, Some(&format!("t2-{path}")), &json!({}))
                .await
        } else {
            s.get(&path, T2).await
        };
        assert_eq!(r.status, 404, "{path}: {}", r.body);
        assert_eq!(
            r.problem_type(),
            "https://idem.dev/problems/orders/order-not-found"
        );
    }
    // The same key string in another tenant is another intent.
    let t2 = s.create(T2, "tenant-k", "U", "S-204", 1).await;
    assert_eq!(t2.status, 201);
    assert!(!t2.replayed);
    assert_ne!(t2.order_id(), id);
    let t2_list = s.get("/v1/orders", T2).await;
    assert_eq!(t2_list.body["orders"].as_array().unwrap().len(), 1);
    assert_eq!(s.get(&format!("/v1/orders/{id}"), T1).await.status, 200);
    s.shutdown().await;
}

/// 8 concurrent pays with one key and 4 with keys of their own: one charge at the
/// provider, one payment row, one order.paid.
async fn concurrent_pays_make_one_charge(env: Env) {
    let s = env
        .start_with(|c| {
            c.options.run_chain = false;
            // A slow provider widens the race window.
            c.options.orders.provider_latency = Duration::from_millis(100);
        })
        .await;
    let id = s.create(T1, "pay-me", "U", "S-204", 2).await.order_id();
    let path = format!("/v1/orders/{id}/pay");
    let empty = json!({});
    let same_key = (0..8).map(|_| s.post(&path, T1, Some("pay-click"), &empty));
    let mut pays: Vec<Reply> = join_all(same_key).await;
    pays.extend(
        join_all((0..4).map(|i| {
            let key = format!("pay-other-{i}");
            let path = path.clone();
            let s = &s;
            async move { s.post(&path, T1, Some(&key), &json!({})).await }
        }))
        .await,
    );
    for p in &pays {
        assert_eq!(p.status, 200, "{}", p.body);
        assert_eq!(p.body["status"], "paid");
    }
    let view = s.order(T1, &id).await;
    let payments = view["payments"].as_array().unwrap();
    assert_eq!(payments.len(), 1, "one charge: {view:#}");
    assert_eq!(payments[0]["kind"], "charge");
    assert_eq!(payments[0]["provider_key"], format!("pay:{id}"));
    assert_eq!(payments[0]["amount_cents"], 136_000);
    let counts = s.server.orders().counts("t1").await.unwrap();
    assert_eq!(counts.charges, 1);
    let paid_msgs = s.server.orders().messages("t1", &id).await.unwrap();
    assert_eq!(
        paid_msgs.iter().filter(|m| m.topic == "order.paid").count(),
        1
    );
    // The provider answered the same charge to every key's first execution.
    let receipt = s
        .server
        .orders()
        .provider()
        .lookup("t1", &format!("pay:{id}"))
        .await
        .unwrap()
        .unwrap();
    assert!(
        receipt.calls >= 1 && receipt.calls <= 5,
        "one call per key at most: {}",
        receipt.calls
    );
    s.shutdown().await;
}

/// A key binds the order in the path: reused on another order's pay or cancel it is a
/// 422, and that order is left as it was (not answered with the first order's result).
async fn a_key_reused_on_another_order_is_refused(env: Env) {
    let s = env.start_with(|c| c.options.run_chain = false).await;
    let unpaid = |v: &Value| {
        v["status"] == "pending_payment" && v["payments"].as_array().is_some_and(|p| p.is_empty())
    };
    for action in ["pay", "cancel"] {
        let o1 = s
            .create(T1, &format!("{action}-o1"), "U-b", "S-204", 1)
            .await
            .order_id();
        let o2 = s
            .create(T1, &format!("{action}-o2"), "U-b", "S-204", 1)
            .await
            .order_id();
        let key = format!("{action}-k");
        let first = s
            .post(
                &format!("/v1/orders/{o1}/{action}"),
                T1,
                Some(&key),
                &json!({}),
            )
            .await;
        assert_eq!(first.status, 200, "{action} O1: {}", first.body);
        assert_eq!(first.body["order_id"], o1.as_str());
        let reused = s
            .post(
                &format!("/v1/orders/{o2}/{action}"),
                T1,
                Some(&key),
                &json!({}),
            )
            .await;
        assert_eq!(
            reused.status, 422,
            "{action} O2 with O1's key: {}",
            reused.body
        );
        assert!(!reused.replayed, "{action}: not O1's answer");
        assert!(reused.content_type.starts_with("application/problem+json"));
        let o2_view = s.order(T1, &o2).await;
        assert!(unpaid(&o2_view), "{action}: O2 untouched: {o2_view:#}");
        // The key still replays on its own order.
        let again = s
            .post(
                &format!("/v1/orders/{o1}/{action}"),
                T1,
                Some(&key),
                &json!({}),
            )
            .await;
        assert!(
            again.replayed && again.status == 200,
            "{action}: {}",
            again.body
        );
    }
    let counts = s.server.orders().counts("t1").await.unwrap();
    assert_eq!(counts.charges, 1, "only O1 of the pay pair was charged");
    s.shutdown().await;
}

async fn cancel_paid_order_refunds_and_releases_under_fence(env: Env) {
    let s = env.start().await;
    let before = s
        .server
        .orders()
        .show("t1", "S-101")
        .await
        .unwrap()
        .unwrap();
    let id = s.create(T1, "c-1", "U-c", "S-101", 2).await.order_id();
    let paid = s
        .post(
            &format!("/v1/orders/{id}/pay"),
            T1,
            Some("c-pay"),
            &json!({}),
        )
        .await;
    assert_eq!(paid.status, 200, "{}", paid.body);
    // Cancel before the ticket issuer gets to it would race; freeze ticketing first so the
    // paid order stays paid, then cancel.
    let f = s
        .admin(
            "/v1/admin/freezes",
            &json!({"scope": "user:U-c", "what": "ticketing"}),
        )
        .await;
    assert_eq!(f.status, 201, "{}", f.body);
    let id2 = s.create(T1, "c-2", "U-c", "S-101", 1).await.order_id();
    let paid2 = s
        .post(
            &format!("/v1/orders/{id2}/pay"),
            T1,
            Some("c-pay-2"),
            &json!({}),
        )
        .await;
    assert_eq!(paid2.status, 200);
    let cancelled = s
        .post(
            &format!("/v1/orders/{id2}/cancel"),
            T1,
            Some("c-cancel-2"),
            &json!({}),
        )
        .await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.body);
    assert_eq!(cancelled.body["status"], "cancelled");
    let view = s
        .wait_order(T1, &id2, WAIT, "hold released", |v| {
            v["hold"]["status"] == "released"
        })
        .await;
    let kinds: Vec<&str> = view["payments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["charge", "refund"]);
    assert_eq!(view["payments"][1]["provider_key"], format!("refund:{id2}"));
    let statuses: Vec<&str> = view["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["to"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        [
            "pending_payment",
            "paid",
            "refund_pending",
            "refunded",
            "cancelled"
        ]
    );
    assert!(
        view["hold"]["release_token"].as_i64().unwrap() >= 1,
        "released with a fencing token"
    );
    assert!(view["refunded_at"].is_string() && view["cancelled_at"].is_string());
    // Cancelling again (new key) changes nothing; a replay under the old key too.
    let again = s
        .post(
            &format!("/v1/orders/{id2}/cancel"),
            T1,
            Some("c-cancel-3"),
            &json!({}),
        )
        .await;
    assert_eq!(
        (again.status, again.body["status"].as_str()),
        (200, Some("cancelled"))
    );
    let replay = s
        .post(
            &format!("/v1/orders/{id2}/cancel"),
            T1,
            Some("c-cancel-2"),
            &json!({}),
        )
        .await;
    assert!(replay.replayed);
    // Paying a cancelled order is an illegal transition.
    let pay = s
        .post(
            &format!("/v1/orders/{id2}/pay"),
            T1,
            Some("c-pay-late"),
            &json!({}),
        )
        .await;
    assert_eq!(pay.status, 409);
    assert_eq!(
        pay.problem_type(),
        "https://idem.dev/problems/orders/illegal-transition"
    );
    assert_eq!(pay.body["from"], "cancelled");
    // Unpaid cancel: straight to cancelled, hold back to stock.
    let id3 = s.create(T1, "c-3", "U-other", "S-101", 1).await.order_id();
    let c3 = s
        .post(
            &format!("/v1/orders/{id3}/cancel"),
            T1,
            Some("c-cancel-x"),
            &json!({}),
        )
        .await;
    assert_eq!(c3.body["status"], "cancelled");
    s.wait_order(T1, &id3, WAIT, "hold released", |v| {
        v["hold"]["status"] == "released"
    })
    .await;
    let after = s
        .server
        .orders()
        .show("t1", "S-101")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        before.available - after.available,
        2,
        "only the first (paid) order holds stock"
    );
    let counts = s.server.orders().counts("t1").await.unwrap();
    assert_eq!((counts.charges, counts.refunds), (2, 1));
    assert_eq!(
        s.server
            .orders()
            .messages("t1", &id2)
            .await
            .unwrap()
            .iter()
            .filter(|m| m.topic == "inventory.released")
            .count(),
        1
    );
    let _ = id;
    s.shutdown().await;
}

async fn paid_order_gets_one_ticket_through_the_chain(env: Env) {
    let s = env.start().await;
    let id = s.create(T1, "t-1", "U-t", "S-204", 1).await.order_id();
    let pay = s
        .post(
            &format!("/v1/orders/{id}/pay"),
            T1,
            Some("t-pay"),
            &json!({}),
        )
        .await;
    assert_eq!(pay.status, 200);
    let view = s
        .wait_order(T1, &id, WAIT, "ticketed", |v| v["status"] == "ticketed")
        .await;
    assert!(view["ticket"]["ticket_id"].is_string());
    let topics: Vec<&str> = view["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["topic"].as_str().unwrap())
        .collect();
    assert_eq!(topics, ["order.created", "order.paid", "ticket.issued"]);
    // Cancelling a ticketed order is illegal.
    let c = s
        .post(
            &format!("/v1/orders/{id}/cancel"),
            T1,
            Some("t-cancel"),
            &json!({}),
        )
        .await;
    assert_eq!(c.status, 409);
    assert_eq!(s.server.orders().counts("t1").await.unwrap().tickets, 1);
    s.shutdown().await;
}

async fn key_state_query_is_tenant_scoped(env: Env) {
    let s = env.start().await;
    let id = s.create(T1, "state/k:1", "U", "S-204", 1).await.order_id();
    let r = s.get("/v1/idempotency-keys/state%2Fk:1", T1).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["state"], "SUCCEEDED");
    assert_eq!(r.body["order_id"], id);
    assert_eq!(r.body["result"]["status"], 201);
    assert_eq!(r.body["result"]["result_ref"], format!("/v1/orders/{id}"));
    // The stored response, in the shape the gateway's state query reads.
    assert_eq!(r.body["response"]["status"], 201);
    let stored: serde_json::Value =
        serde_json::from_str(r.body["response"]["body"].as_str().unwrap()).unwrap();
    assert_eq!(stored["order_id"], id);
    let absent = s.get("/v1/idempotency-keys/state%2Fk:1", T2).await;
    assert_eq!(absent.body["state"], "ABSENT");
    assert_eq!(
        s.get("/v1/idempotency-keys/state%2Fk:1", T2).await.status,
        404,
        "tenant-scoped"
    );
    assert_eq!(
        s.get("/v1/idempotency-keys/never-used", T1).await.status,
        404
    );
    // A refused request is terminal too.
    s.create(T1, "state-refused", "U", "S-nope", 1).await;
    let refused = s.get("/v1/idempotency-keys/state-refused", T1).await;
    assert_eq!(refused.body["state"], "FAILED_TERMINAL");
    assert_eq!(refused.body["result"]["status"], 422);
    s.shutdown().await;
}

/// A claim whose holder died shows in `idem_orders_processing_past_lease` (read with the
/// store's clock by the background refresh) until someone recovers it.
async fn a_claim_left_past_its_lease_shows_in_a_gauge(env: Env) {
    use idem_core::{
        ClaimRequest, Fingerprint, IdempotencyKey, OwnerId, Principal, Scope, TenantId,
    };
    let s = env
        .start_with(|c| c.options.metrics_refresh = Duration::from_millis(100))
        .await;
    let store = s.server.orders().database().idempotency_store();
    let claim = ClaimRequest {
        scope: Scope::new(
            TenantId::new("t1").unwrap(),
            IdempotencyKey::new(format!("orphan-{}", uuid::Uuid::now_v7())).unwrap(),
        ),
        principal: Principal::new("api-key:t1").unwrap(),
        fingerprint: Fingerprint::of_bytes(b"orphan"),
        owner: OwnerId::new("a-process-that-died").unwrap(),
        lease: Duration::from_millis(200),
    };
    store.claim(&claim).await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let text = s.metrics().await;
        if text.contains("idem_orders_processing_past_lease 1") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the gauge never counted the orphan:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.shutdown().await;
}

async fn public_endpoints(env: Env) {
    let s = env.start().await;
    // Liveness asks nothing; readiness checks the database and its schema versions.
    let live = s
        .http
        .get(format!("{}/livez", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(live.status(), 200);
    let ready = s
        .http
        .get(format!("{}/readyz", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    let ready: Value = ready.json().await.unwrap();
    assert_eq!(ready["status"], "ready", "{ready}");
    assert!(
        ready["schema"]["store_needed"].as_i64().unwrap() >= 1,
        "{ready}"
    );
    // A ledger schema older than this build needs: not ready, and why.
    let store = s.server.orders().database().store().clone();
    let shift = |by: i64| {
        let store = store.clone();
        async move {
            let mut c = store.acquire().await.unwrap();
            c.conn()
                .execute(
                    idem_sql::sql("UPDATE orders_schema_migrations SET version = version + $1")
                        .bind(by),
                )
                .await
                .unwrap();
        }
    };
    shift(-1000).await;
    let stale = s
        .http
        .get(format!("{}/readyz", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(stale.status(), 503);
    let stale: Value = stale.json().await.unwrap();
    assert!(
        stale["reason"].as_str().unwrap().contains("idem migrate"),
        "{stale}"
    );
    shift(1000).await;
    let health: Value = s
        .http
        .get(format!("{}/healthz", s.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["status"], "ok");
    let spec: Value = s
        .http
        .get(format!("{}/openapi.json", s.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(spec["openapi"], "3.1.0");
    let create = &spec["paths"]["/v1/orders"]["post"];
    assert!(
        create["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["$ref"] == "#/components/parameters/IdempotencyKey"),
        "the layer's parameter is merged in"
    );
    // The admin API is not behind the layer: no key parameter, no layer problems.
    let freeze = &spec["paths"]["/v1/admin/freezes"]["post"];
    assert!(freeze.is_object());
    assert!(freeze["parameters"].is_null(), "{freeze:#}");
    // Every operation that needs credentials documents their refusal.
    for (route, item) in spec["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let public = op["security"] == json!([{}]);
            assert!(
                public || op["responses"]["401"].is_object(),
                "{method} {route} does not document 401"
            );
        }
    }
    s.create(T1, "m-1", "U", "S-204", 1).await;
    s.create(T1, "m-1", "U", "S-204", 1).await;
    let text = s.metrics().await;
    for series in [
        "idem_http_requests_total{decision=\"replayed\"} 1",
        "idem_orders_created_total{route=\"idem\"} 1",
        "idem_orders_outbox_unpublished",
        "idem_lease_fenced_rejections_total",
    ] {
        assert!(text.contains(series), "metrics lack {series}:\n{text}");
    }
    let unknown = s.get("/v1/nothing-here", T1).await;
    assert_eq!(unknown.status, 404);
    let no_admin = s
        .post(
            "/v1/admin/freezes",
            T1,
            None,
            &json!({"scope": "all", "what": "ticketing"}),
        )
        .await;
    assert_eq!(no_admin.status, 401, "a tenant key is not the admin token");
    s.shutdown().await;
}

/// Without API keys the server makes a development key and admin token and listens on
/// loopback only, whatever it was asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn development_credentials_and_loopback() {
    let env = common::env(common::Backend::Sqlite).await.unwrap();
    let s = env
        .start_with(|c| {
            c.api_keys.clear();
            c.admin_token = None;
            c.listen = "0.0.0.0:0".parse().unwrap();
        })
        .await;
    assert!(s.server.addr().ip().is_loopback(), "{}", s.server.addr());
    let dev = s
        .server
        .dev_credentials()
        .cloned()
        .expect("dev credentials");
    assert_eq!(dev.tenant, "dev");
    let created = s.create(&dev.api_key, "dev-1", "U", "S-204", 1).await;
    assert_eq!(created.status, 201, "{}", created.body);
    let freeze = s
        .post(
            "/v1/admin/freezes",
            &dev.admin_token,
            None,
            &json!({"scope": "all", "what": "all"}),
        )
        .await;
    assert_eq!(freeze.status, 201, "{}", freeze.body);
    assert_eq!(freeze.body["active"].as_array().unwrap().len(), 3);
    s.shutdown().await;
}
