//! The gateway's trust boundary, each case on a real listener with a real client:
//! results replayed only to their caller, per-caller headers never replayed, identity
//! answers never stored, a full window failing closed, `Connection` unable to strip the
//! key or the credential, `X-Forwarded-For` believed only from configured proxies, and
//! internal error text kept out of problem details.

mod common;

use common::*;

/// A gateway without API keys: callers are told apart by their own credentials.
fn open_config(upstream: &str) -> idem_gateway::GatewayConfig {
    let mut c = config(upstream);
    c.auth.api_keys.clear();
    c
}

fn post(c: &reqwest::Client, base: &str, path: &str, key: &str) -> reqwest::RequestBuilder {
    c.post(format!("{base}{path}"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(r#"{"show":"S-204"}"#)
}

#[tokio::test]
async fn a_stored_result_is_replayed_only_to_its_caller() {
    let up = stub().await;
    let gw = idem_gateway::start(open_config(&up.url())).await.unwrap();
    let c = client();
    let key = fresh("cross-caller");

    let a = post(&c, &gw.url(), "/v1/orders", &key)
        .header("authorization", "Bearer alice")
        .send()
        .await
        .unwrap();
    assert_eq!(a.status(), 201);
    assert!(
        a.headers().contains_key("set-cookie"),
        "the caller gets its cookie"
    );
    let a_body: serde_json::Value = a.json().await.unwrap();

    // Alice again: her stored result, without her cookie.
    let again = post(&c, &gw.url(), "/v1/orders", &key)
        .header("authorization", "Bearer alice")
        .send()
        .await
        .unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert!(
        !again.headers().contains_key("set-cookie"),
        "never replayed"
    );
    let again: serde_json::Value = again.json().await.unwrap();
    assert_eq!(again["order_id"], a_body["order_id"]);

    // Bob, same key: his own intent, never Alice's answer or cookie.
    let b = post(&c, &gw.url(), "/v1/orders", &key)
        .header("authorization", "Bearer bob")
        .send()
        .await
        .unwrap();
    assert_eq!(b.status(), 201);
    assert!(!b.headers().contains_key("idempotent-replayed"));
    let b_cookie = b.headers()["set-cookie"].clone();
    let b_body: serde_json::Value = b.json().await.unwrap();
    assert_ne!(b_body["order_id"], a_body["order_id"]);
    assert_ne!(b_cookie.to_str().unwrap(), "");

    // A cookie-only caller is yet another caller.
    let cookie = post(&c, &gw.url(), "/v1/orders", &key)
        .header("cookie", "sid=carol")
        .send()
        .await
        .unwrap();
    assert_eq!(cookie.status(), 201);
    let cookie: serde_json::Value = cookie.json().await.unwrap();
    assert_ne!(cookie["order_id"], a_body["order_id"]);

    // No credential at all: refused before anything is recorded or forwarded.
    let calls = up.state.total_calls();
    let anon = post(&c, &gw.url(), "/v1/orders", &key)
        .send()
        .await
        .unwrap();
    assert_eq!(problem(anon).await, (401, problem_type("unauthenticated")));
    assert_eq!(up.state.total_calls(), calls);
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn anonymous_access_is_a_configured_choice() {
    let up = stub().await;
    let mut cfg = open_config(&up.url());
    cfg.auth.anonymous_tenant = Some(idem_core::TenantId::new("public").unwrap());
    let gw = idem_gateway::start(cfg).await.unwrap();
    let c = client();
    let key = fresh("anon-allowed");
    let first = post(&c, &gw.url(), "/v1/orders", &key)
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 201);
    // A credentialed caller does not share the anonymous caller's record.
    let other = post(&c, &gw.url(), "/v1/orders", &key)
        .header("authorization", "Bearer alice")
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 201);
    assert!(!other.headers().contains_key("idempotent-replayed"));
    assert_eq!(up.state.executions(&key), 2);
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn identity_answers_are_never_stored() {
    let up = stub().await;
    let gw = idem_gateway::start(open_config(&up.url())).await.unwrap();
    let c = client();
    let key = fresh("who-are-you");
    for _ in 0..2 {
        let r = post(&c, &gw.url(), "/v1/guarded", &key)
            .header("authorization", "Bearer wrong")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401);
        assert!(!r.headers().contains_key("idempotent-replayed"));
    }
    assert_eq!(up.state.total_calls(), 2, "each 401 came from the upstream");

    // With API keys too: a 401 of the upstream leaves the key free for the caller.
    let mut cfg = config(&up.url());
    cfg.auth.strip_api_key = false;
    let gw2 = idem_gateway::start(cfg).await.unwrap();
    let key = fresh("who-are-you-keyed");
    let r = post(&c, &gw2.url(), "/v1/guarded", &key)
        .header("x-api-key", T1_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = post(&c, &gw2.url(), "/v1/guarded", &key)
        .header("x-api-key", T1_KEY)
        .header("authorization", "Bearer good")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "the key was still free");
    assert_eq!(up.state.executions(&key), 1);
    gw.stop().await.unwrap();
    gw2.stop().await.unwrap();
}

#[tokio::test]
async fn a_full_memory_window_fails_closed() {
    let up = stub().await;
    let mut cfg = config(&up.url());
    cfg.max_stored_bytes = 1024;
    cfg.memory_window_bytes = 1024;
    // One caller fills it: its share is the whole window here.
    cfg.window_partition_bytes = Some(1024);
    let gw = idem_gateway::start(cfg).await.unwrap();
    let c = client();
    // Fill the budget with fresh keys until the window refuses one.
    let mut refused = None;
    for i in 0..200 {
        let r = order(&c, &gw.url(), &fresh(&format!("fill-{i}")), "{}")
            .send()
            .await
            .unwrap();
        if r.status() == 503 {
            refused = Some(r);
            break;
        }
        assert_eq!(r.status(), 201);
    }
    let refused = refused.expect("the budget bit");
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(
        problem(refused).await,
        (503, problem_type("idempotency-store-unavailable"))
    );
    // One key sent three times while full: refused each time, never forwarded.
    let key = fresh("while-full");
    let calls = up.state.total_calls();
    for _ in 0..3 {
        let r = order(&c, &gw.url(), &key, "{}").send().await.unwrap();
        assert_eq!(r.status(), 503);
    }
    assert_eq!(up.state.total_calls(), calls, "nothing forwarded");
    assert_eq!(up.state.calls(&key), 0);
    assert!(gw.metrics().window_full_refusals() >= 4);
    let health: serde_json::Value = c
        .get(format!("{}/_idem/health", gw.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["status"], "degraded");
    assert_eq!(health["window_full"], true);
    // Not ready while new keys are refused; still alive.
    let ready = c
        .get(format!("{}/_idem/readyz", gw.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    let ready: serde_json::Value = ready.json().await.unwrap();
    assert!(
        ready["reason"].as_str().unwrap().contains("window full"),
        "{ready}"
    );
    let live = c
        .get(format!("{}/_idem/livez", gw.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(live.status(), 200);
    let metrics = c
        .get(format!("{}/_idem/metrics", gw.url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("idem_gateway_window_full 1"), "{metrics}");
    // The alert rules read these series under the names exported here.
    let rules = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/alerts/idem-alerts.yml"
    ))
    .unwrap();
    assert!(rules.contains("alert: IdemGatewayWindowFull"));
    let referenced: Vec<&str> = rules
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("idem_gateway_"))
        .collect();
    assert!(referenced.len() >= 3, "{referenced:?}");
    for series in referenced {
        assert!(
            metrics.contains(&format!("{series} ")) || metrics.contains(&format!("{series}{{")),
            "{series} is not exported:\n{metrics}"
        );
    }
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn connection_cannot_strip_the_key_or_the_credential() {
    let up = stub().await;
    let gw = idem_gateway::start(open_config(&up.url())).await.unwrap();
    let c = client();
    for named in ["Idempotency-Key", "authorization", "keep-alive, Cookie"] {
        let r = post(&c, &gw.url(), "/v1/orders", &fresh("conn"))
            .header("authorization", "Bearer alice")
            .header("cookie", "sid=1")
            .header("connection", named)
            .send()
            .await
            .unwrap();
        assert_eq!(
            problem(r).await,
            (400, problem_type("connection-names-end-to-end-header")),
            "{named}"
        );
    }
    // Pass-through routes too.
    let r = c
        .post(format!("{}/v1/search", gw.url()))
        .header("authorization", "Bearer alice")
        .header("connection", "authorization")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(up.state.total_calls(), 0);
    // Naming a real hop-by-hop field is fine.
    let r = post(&c, &gw.url(), "/v1/orders", &fresh("conn-ok"))
        .header("authorization", "Bearer alice")
        .header("connection", "keep-alive")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    gw.stop().await.unwrap();
}

async fn echoed(gw: &str, xff: &str) -> serde_json::Value {
    let v: serde_json::Value = client()
        .get(format!("{gw}/echo"))
        .header("x-forwarded-for", xff)
        .header("x-forwarded-proto", "https")
        .header("x-forwarded-host", "evil.example")
        .header("x-real-ip", "203.0.113.7")
        .header("x-forwarded-port", "443")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["headers"].clone()
}

#[tokio::test]
async fn forwarded_for_is_believed_only_from_configured_proxies() {
    let up = stub().await;
    let gw = idem_gateway::start(config(&up.url())).await.unwrap();
    let h = echoed(&gw.url(), "203.0.113.7").await;
    assert_eq!(
        h["x-forwarded-for"], "127.0.0.1",
        "the spoofed entry is gone"
    );
    assert!(h.get("x-forwarded-proto").is_none());
    assert!(h.get("x-real-ip").is_none());
    assert!(h.get("x-forwarded-port").is_none());
    assert_ne!(h["x-forwarded-host"], "evil.example");
    gw.stop().await.unwrap();

    let mut cfg = config(&up.url());
    cfg.trusted_proxies = vec!["127.0.0.0/8".into()];
    let gw = idem_gateway::start(cfg).await.unwrap();
    let h = echoed(&gw.url(), "203.0.113.7").await;
    assert_eq!(h["x-forwarded-for"], "203.0.113.7, 127.0.0.1");
    assert_eq!(h["x-forwarded-proto"], "https");
    assert_eq!(h["x-forwarded-host"], "evil.example");
    // A proxy that adds a line of its own instead of extending the first: both count.
    let v: serde_json::Value = client()
        .get(format!("{}/echo", gw.url()))
        .header("x-forwarded-for", "203.0.113.7")
        .header("x-forwarded-for", "198.51.100.1")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        v["headers"]["x-forwarded-for"],
        "203.0.113.7, 198.51.100.1, 127.0.0.1"
    );
    // Fields the client's Connection names are gone before the gateway reads them.
    let trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let echo = client()
        .get(format!("{}/echo", gw.url()))
        .header(
            "connection",
            "x-forwarded-for, x-forwarded-host, traceparent",
        )
        .header("x-forwarded-for", "203.0.113.7")
        .header("x-forwarded-host", "evil.example")
        .header("traceparent", trace);
    let v: serde_json::Value = echo.send().await.unwrap().json().await.unwrap();
    let h = &v["headers"];
    assert_eq!(h["x-forwarded-for"], "127.0.0.1");
    assert_ne!(h["x-forwarded-host"], "evil.example");
    assert!(h["x-forwarded-host"].is_string(), "{h}");
    let sent = h["traceparent"].as_str().unwrap();
    assert!(!sent.contains("0af7651916cd43dd8448eb211c80319c"), "{sent}");
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn problem_details_carry_a_request_id_not_internals() {
    // An upstream port with nothing listening: connection refused.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let gw = idem_gateway::start(config(&format!("http://{dead}")))
        .await
        .unwrap();
    let c = client();
    for r in [
        order(&c, &gw.url(), &fresh("dead"), "{}")
            .send()
            .await
            .unwrap(),
        c.get(format!("{}/ping", gw.url())).send().await.unwrap(),
    ] {
        assert_eq!(r.status(), 502);
        let id = r.headers()["x-request-id"].to_str().unwrap().to_string();
        let text = r.text().await.unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["request_id"], id.as_str());
        for leak in [
            dead.to_string().as_str(),
            &dead.port().to_string(),
            "os error",
            "refused",
        ] {
            assert!(!text.contains(leak), "{leak} in {text}");
        }
    }
    // A client's own request id is logged beside the gateway's, never used as it.
    let r = c
        .get(format!("{}/ping", gw.url()))
        .header("x-request-id", "client-req-42")
        .send()
        .await
        .unwrap();
    let id = r.headers()["x-request-id"].to_str().unwrap().to_string();
    assert_ne!(id, "client-req-42");
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["request_id"], id.as_str());
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn a_state_query_never_hands_out_another_requests_result() {
    let up = stub().await;
    let mut cfg = config(&up.url());
    cfg.window_ms = 200;
    cfg.upstream_timeout_ms = 300;
    let gw = idem_gateway::start(cfg).await.unwrap();
    let c = client();
    let key = fresh("reused-after-window");
    let first = c
        .post(format!("{}/v1/orders/O1/pay", gw.url()))
        .header("x-api-key", T1_KEY)
        .header("idempotency-key", &key)
        .body(r#"{"amount":1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 201);
    // The gateway's window forgets the key; the upstream's record stays.
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    // The same key on another resource, whose exchange times out: the state query
    // finds O1's record. Its stored 201 must not become O2's answer.
    up.state
        .stall_calls(std::time::Duration::from_millis(1000), 1);
    let second = c
        .post(format!("{}/v1/orders/O2/pay", gw.url()))
        .header("x-api-key", T1_KEY)
        .header("idempotency-key", &key)
        .body(r#"{"amount":2}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(
        second.status(),
        422,
        "the upstream's own verdict on the re-send"
    );
    assert!(!second.headers().contains_key("idempotent-replayed"));
    assert_eq!(gw.metrics().state_queries("succeeded"), 1);
    assert_eq!(up.state.executions(&key), 1);
    gw.stop().await.unwrap();
}
