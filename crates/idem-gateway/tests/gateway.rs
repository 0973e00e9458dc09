//! One gateway instance (in-memory window) in front of the stand-in business service:
//! keys, coalescing, replay, identity headers, streaming, the state query after an
//! uncertain result, and bad input.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use futures::future::join_all;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test]
async fn key_is_required_and_passed_unchanged() {
    let up = stub().await;
    let gw = idem_gateway::start(config(&up.url())).await.unwrap();
    let c = client();

    // No key on a keyed route: 400, nothing reaches the upstream.
    let r = c
        .post(format!("{}/v1/orders", gw.url()))
        .header("x-api-key", T1_KEY)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(
        problem(r).await,
        (400, problem_type("missing-idempotency-key"))
    );
    assert_eq!(up.state.total_calls(), 0);

    // The key reaches the upstream exactly as sent, with the gateway's tenant header.
    let r = c
        .post(format!("{}/v1/echo", gw.url()))
        .header("x-api-key", T1_KEY)
        .header("idempotency-key", "\"quoted-key-1\"")
        .header("x-idem-tenant", "spoofed")
        .body("{}")
        .send()
        .await
        .unwrap();
    // /v1/echo is a keyed route too (POST /v1/*); the stub echoes what it got.
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["headers"]["idempotency-key"], "\"quoted-key-1\"");
    assert_eq!(v["headers"]["x-idem-tenant"], "tenant-1");
    assert_eq!(v["headers"]["x-idem-principal"], "tenant-1");
    assert!(
        v["headers"].get("x-api-key").is_none(),
        "API key must not leak upstream"
    );
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn a_more_specific_route_listed_after_a_general_one_wins() {
    let up = stub().await;
    let mut cfg = config(&up.url());
    // The general rule first: taken in list order it would shadow the one after it.
    cfg.routes = vec![
        idem_gateway::RouteConfig {
            methods: vec!["POST".into()],
            path: "/v1/*".into(),
            key: idem_gateway::KeyRule::Ignored,
        },
        idem_gateway::RouteConfig {
            methods: vec!["POST".into()],
            path: "/v1/orders".into(),
            key: idem_gateway::KeyRule::Required,
        },
    ];
    let gw = idem_gateway::start(cfg).await.unwrap();
    let c = client();
    let post = |path: &str| {
        c.post(format!("{}{path}", gw.url()))
            .header("x-api-key", T1_KEY)
            .body("{}")
            .send()
    };
    // The specific rule decides for its path: no key, 400, nothing forwarded.
    let r = post("/v1/orders").await.unwrap();
    assert_eq!(
        problem(r).await,
        (400, problem_type("missing-idempotency-key"))
    );
    assert_eq!(up.state.total_calls(), 0);
    // The general rule still covers the rest: passed through without a key.
    let r = post("/v1/carts").await.unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    assert_eq!(up.state.total_calls(), 1);
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn the_upstream_sees_the_callers_trace_as_a_child_span() {
    let up = stub().await;
    let gw = idem_gateway::start(config(&up.url())).await.unwrap();
    let c = client();
    let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let seen = |key: &'static str, traceparent: Option<&'static str>| {
        let mut r = c
            .post(format!("{}/v1/echo", gw.url()))
            .header("x-api-key", T1_KEY)
            .header("idempotency-key", key)
            .body("{}");
        if let Some(t) = traceparent {
            r = r.header("traceparent", t);
        }
        async move {
            let v: serde_json::Value = r.send().await.unwrap().json().await.unwrap();
            v["headers"]["traceparent"].as_str().unwrap().to_string()
        }
    };
    let child = seen("trace-1", Some(caller)).await;
    let t = idem_core::wire::TraceParent::parse(&child).expect("a valid traceparent");
    assert_eq!(
        t.trace_id_hex(),
        "4bf92f3577b34da6a3ce929d0e0e4736",
        "{child}"
    );
    assert_ne!(child, caller, "the gateway's hop is a span of its own");
    assert_eq!(t.flags, 1, "the caller's sampling decision is kept");
    // No trace (or a malformed one): the gateway starts one.
    for given in [None, Some("00-not-a-trace-01")] {
        let fresh = seen(
            if given.is_none() {
                "trace-2"
            } else {
                "trace-3"
            },
            given,
        )
        .await;
        let t = idem_core::wire::TraceParent::parse(&fresh).expect("a valid traceparent");
        assert_ne!(t.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
    }
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn a_keyed_request_is_readied_for_the_upstream_when_sent_and_its_replay_stays_here() {
    let up = stub().await;
    let gw = idem_gateway::start(config(&up.url())).await.unwrap();
    let c = client();
    let send = || {
        c.post(format!("{}/v1/echo", gw.url()))
            .header("x-api-key", T1_KEY)
            .header("idempotency-key", "outbound-1")
            .header("x-idem-tenant", "forged")
            .header("x-forwarded-for", "203.0.113.9")
            .body("{}")
            .send()
    };
    let first = send().await.unwrap();
    assert!(first.status().is_success(), "{}", first.status());
    let id = first.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_string();
    let v: serde_json::Value = first.json().await.unwrap();
    let seen = &v["headers"];
    assert_eq!(seen["x-request-id"], id.as_str(), "the arrival's own id");
    assert_eq!(
        seen["x-idem-tenant"], "tenant-1",
        "the tenant of the API key"
    );
    assert_eq!(
        seen["x-forwarded-for"], "127.0.0.1",
        "an untrusted peer's chain"
    );
    assert!(seen["traceparent"].is_string(), "{seen}");
    let calls = up.state.total_calls();
    let again = send().await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_ne!(again.headers()["x-request-id"].to_str().unwrap(), id);
    let replayed: serde_json::Value = again.json().await.unwrap();
    assert_eq!(replayed, v, "the first answer, as the upstream gave it");
    assert_eq!(
        up.state.total_calls(),
        calls,
        "the replay never went upstream"
    );
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn duplicate_replays_the_first_response() {
    let up = stub().await;
    let gw = idem_gateway::start(config(&up.url())).await.unwrap();
    let c = client();
    let key = fresh("order");
    let first = order(&c, &gw.url(), &key, r#"{"show":"S-204","seats":2}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 201);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first_body = first.text().await.unwrap();

    // Same intent, different JSON key order and whitespace: the same fingerprint.
    let again = order(&c, &gw.url(), &key, r#"{ "seats": 2, "show": "S-204" }"#)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.text().await.unwrap(), first_body);
    assert_eq!(up.state.calls(&key), 1);
    assert_eq!(gw.metrics().window_hits(), 1);

    // Different payload under the same key: 422, upstream untouched.
    let other = order(&c, &gw.url(), &key, r#"{"show":"S-204","seats":3}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(
        problem(other).await,
        (422, problem_type("idempotency-key-reused"))
    );
    assert_eq!(up.state.calls(&key), 1);

    // The same key string in another tenant is another intent.
    let t2 = c
        .post(format!("{}/v1/orders", gw.url()))
        .header("x-api-key", T2_KEY)
        .header("idempotency-key", &key)
        .body(r#"{"show":"S-204","seats":3}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(t2.status(), 201);
    assert_ne!(t2.text().await.unwrap(), first_body);
    gw.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_share_one_upstream_call() {
    let up = stub().await;
    up.state.delay_executions(Duration::from_millis(300));
    let gw = idem_gateway::start(config(&up.url())).await.unwrap();
    let c = client();
    let key = fresh("burst");
    let base = gw.url();
    let results = join_all((0..100).map(|_| {
        let req = order(&c, &base, &key, r#"{"show":"S-204"}"#);
        async move {
            let r = req.send().await.unwrap();
            let replayed = r.headers().contains_key("idempotent-replayed");
            (r.status().as_u16(), replayed, r.text().await.unwrap())
        }
    }))
    .await;
    assert_eq!(up.state.calls(&key), 1, "one upstream call");
    assert_eq!(up.state.executions(&key), 1);
    let bodies: std::collections::HashSet<&str> = results.iter().map(|r| r.2.as_str()).collect();
    assert_eq!(bodies.len(), 1, "every client got the same body");
    assert!(results.iter().all(|r| r.0 == 201));
    assert_eq!(
        results.iter().filter(|r| !r.1).count(),
        1,
        "only the first is not a replay"
    );
    assert_eq!(
        gw.metrics().coalesced_waiters() + gw.metrics().window_hits(),
        99
    );

    // While one is in flight, a different payload under its key is refused at once:
    // the 422 arrives while the first is still executing.
    up.state.delay_executions(Duration::from_millis(1500));
    let key2 = fresh("burst");
    let slow = tokio::spawn(order(&c, &base, &key2, r#"{"a":1}"#).send());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let other = order(&c, &base, &key2, r#"{"a":2}"#).send().await.unwrap();
    assert_eq!(problem(other).await.0, 422);
    assert!(
        !slow.is_finished(),
        "422 must not wait for the first request"
    );
    assert_eq!(slow.await.unwrap().unwrap().status(), 201);
    assert_eq!(up.state.calls(&key2), 1);
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn bad_input_gets_clear_errors() {
    let up = stub().await;
    let mut cfg = config(&up.url());
    cfg.max_body_bytes = 1024;
    let gw = idem_gateway::start(cfg).await.unwrap();
    let c = client();
    let base = gw.url();

    // Malformed keys.
    for bad in ["has space", &"k".repeat(256), "\"unterminated"] {
        let r = c
            .post(format!("{base}/v1/orders"))
            .header("x-api-key", T1_KEY)
            .header("idempotency-key", bad)
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(
            problem(r).await,
            (400, problem_type("invalid-idempotency-key")),
            "{bad}"
        );
    }
    let r = c
        .post(format!("{base}/v1/orders"))
        .header("x-api-key", T1_KEY)
        .header("idempotency-key", "a")
        .header("idempotency-key", "b")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(problem(r).await.0, 400);

    // Unknown API key: refused everywhere; no API key on a keyed route: refused.
    let r = order(&c, &base, "k", "{}")
        .header("x-api-key", "nope")
        .send()
        .await
        .unwrap();
    assert_eq!(
        problem(r).await.0,
        401,
        "two x-api-key values are not one credential"
    );
    let r = c
        .post(format!("{base}/v1/orders"))
        .header("x-api-key", "nope")
        .header("idempotency-key", "k")
        .send()
        .await
        .unwrap();
    assert_eq!(problem(r).await, (401, problem_type("unauthenticated")));
    let r = c
        .get(format!("{base}/ping"))
        .header("x-api-key", "nope")
        .send()
        .await
        .unwrap();
    assert_eq!(problem(r).await.0, 401);
    let r = c
        .post(format!("{base}/v1/orders"))
        .header("idempotency-key", "k")
        .send()
        .await
        .unwrap();
    assert_eq!(problem(r).await.0, 401);

    // Oversized body: declared, and streamed without a length.
    let r = order(&c, &base, &fresh("big"), &"x".repeat(2048))
        .send()
        .await
        .unwrap();
    assert_eq!(problem(r).await, (413, problem_type("request-too-large")));
    let (status, body) = raw_chunked_post(gw.addr, &"y".repeat(4096)).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(
        up.state.total_calls(),
        0,
        "nothing bad reached the upstream"
    );

    // The gateway is still up.
    let ok = order(&c, &base, &fresh("after"), "{}")
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 201);
    gw.stop().await.unwrap();
}

/// POSTs a chunked body over a raw connection; returns the status and the response text.
async fn raw_chunked_post(addr: std::net::SocketAddr, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /v1/orders HTTP/1.1\r\nhost: x\r\nx-api-key: {T1_KEY}\r\nidempotency-key: {}\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        fresh("chunked"),
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

#[tokio::test]
async fn slow_clients_are_cut_off_and_others_still_served() {
    let up = stub().await;
    let mut cfg = config(&up.url());
    cfg.header_read_timeout_ms = 300;
    cfg.body_read_timeout_ms = 300;
    let gw = idem_gateway::start(cfg).await.unwrap();
    let c = client();

    // A client that never finishes its request head: the connection is closed.
    let mut slow_head = TcpStream::connect(gw.addr).await.unwrap();
    slow_head
        .write_all(b"POST /v1/orders HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    // A client that sends its head and part of its body, then stalls.
    let mut slow_body = TcpStream::connect(gw.addr).await.unwrap();
    slow_body
        .write_all(
            format!(
                "POST /v1/orders HTTP/1.1\r\nhost: x\r\nx-api-key: {T1_KEY}\r\nidempotency-key: slow-1\r\ncontent-length: 100\r\n\r\n0123456789"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    // Meanwhile others are served.
    let ok = c.get(format!("{}/ping", gw.url())).send().await.unwrap();
    assert_eq!(ok.text().await.unwrap(), "pong");

    let t = Instant::now();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), slow_head.read_to_end(&mut buf))
        .await
        .expect("slow head connection closed by the gateway")
        .ok();
    assert!(t.elapsed() < Duration::from_secs(3));

    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), slow_body.read(&mut buf))
        .await
        .expect("slow body answered")
        .unwrap();
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("request-timeout"), "{text}");
    assert_eq!(up.state.calls("slow-1"), 0);

    // A stalled streamed body on a pass-through route fails too.
    let mut slow_pass = TcpStream::connect(gw.addr).await.unwrap();
    slow_pass
        .write_all(b"POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n0123456789")
        .await
        .unwrap();
    let n = tokio::time::timeout(Duration::from_secs(5), slow_pass.read(&mut buf))
        .await
        .expect("slow pass-through body answered")
        .unwrap();
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");

    let ok = order(&c, &gw.url(), &fresh("after"), "{}")
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 201);
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn pass_through_streams_both_ways_and_strips_hop_by_hop() {
    let up = stub().await;
    let gw = idem_gateway::start(config(&up.url())).await.unwrap();
    let c = client();

    // Response streaming: the first chunk arrives long before the last is produced.
    let t = Instant::now();
    let mut r = c
        .get(format!("{}/stream?chunks=3&delay_ms=400", gw.url()))
        .send()
        .await
        .unwrap();
    let first = r.chunk().await.unwrap().unwrap();
    assert_eq!(&first[..], b"chunk-0;");
    assert!(
        t.elapsed() < Duration::from_millis(400),
        "{:?}",
        t.elapsed()
    );
    let mut rest = Vec::new();
    while let Some(ch) = r.chunk().await.unwrap() {
        rest.extend_from_slice(&ch);
    }
    assert_eq!(rest, b"chunk-1;chunk-2;");

    // Request streaming: the upstream sees the first chunk before the client sends the
    // second.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<http_body::Frame<Bytes>, std::io::Error>>(1);
    let body = http_body_util::StreamBody::new(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|f| (f, rx))
    }));
    let stream = TcpStream::connect(gw.addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::post("/upload")
        .header("host", "x")
        .body(body)
        .unwrap();
    let pending = tokio::spawn(async move { send.send_request(req).await });
    tx.send(Ok(http_body::Frame::data(Bytes::from_static(b"first"))))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), up.state.wait_upload_frames(1))
        .await
        .expect("the first chunk reached the upstream before the body ended");
    tx.send(Ok(http_body::Frame::data(Bytes::from_static(b"second"))))
        .await
        .unwrap();
    drop(tx);
    let resp = pending.await.unwrap().unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["received"], 11);

    // Hop-by-hop fields and spoofed identity headers do not reach the upstream.
    let r = c
        .get(format!("{}/echo", gw.url()))
        .header("connection", "x-hop")
        .header("x-hop", "1")
        .header("keep-alive", "timeout=5")
        .header("x-idem-tenant", "spoofed")
        .header("x-idem-gateway-token", "forged")
        .header("x-end-to-end", "kept")
        .send()
        .await
        .unwrap();
    let v: serde_json::Value = r.json().await.unwrap();
    let h = &v["headers"];
    assert!(h.get("x-hop").is_none());
    assert!(h.get("keep-alive").is_none());
    assert!(h.get("x-idem-tenant").is_none(), "anonymous: no tenant");
    assert!(h.get("x-idem-gateway-token").is_none());
    assert_eq!(h["x-end-to-end"], "kept");
    assert_eq!(h["x-forwarded-for"], "127.0.0.1");

    // Authenticated pass-through carries the tenant; optional-key routes without a key
    // are pass-through.
    let r = c
        .put(format!("{}/opt/echo", gw.url()))
        .header("x-api-key", T2_KEY)
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    // PUT /opt/echo is a write in the stub; no key → executed as a key-less write.
    assert_eq!(up.state.total_executions(), 1);
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn upstream_commits_then_times_out_client_gets_result_via_state_query() {
    let up = stub().await;
    let mut cfg = config(&up.url());
    cfg.upstream_timeout_ms = 300;
    let gw = idem_gateway::start(cfg).await.unwrap();
    let c = client();
    let key = fresh("lost-response");
    // The upstream commits at once, then holds the response for 2 s.
    up.state.delay_responses(Duration::from_secs(2), 1);
    let t = Instant::now();
    let r = order(&c, &gw.url(), &key, r#"{"show":"S-204"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t.elapsed()
    );
    let body: serde_json::Value = r.json().await.unwrap();
    assert!(body["order_id"].as_str().unwrap().starts_with("o-"));
    assert_eq!(body["key"], key.as_str());
    assert_eq!(up.state.executions(&key), 1);
    // The state query said the key has a result; the same-key re-send got the
    // upstream's own replay of it (never the state endpoint's copy).
    assert_eq!(up.state.calls(&key), 2, "one confirming re-send, same key");
    assert_eq!(up.state.state_queries(), 1);
    assert_eq!(gw.metrics().uncertain_results(), 1);
    assert_eq!(gw.metrics().state_queries("succeeded"), 1);
    assert_eq!(gw.metrics().uncertain_resends(), 1);

    // The result is in the window now: a retry is a replay of the same order.
    let again = order(&c, &gw.url(), &key, r#"{"show":"S-204"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let again: serde_json::Value = again.json().await.unwrap();
    assert_eq!(again["order_id"], body["order_id"]);
    assert_eq!(up.state.calls(&key), 2);
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn uncertain_result_while_processing_waits_for_the_upstream_record() {
    let up = stub().await;
    let mut cfg = config(&up.url());
    cfg.upstream_timeout_ms = 300;
    let gw = idem_gateway::start(cfg).await.unwrap();
    let c = client();
    let key = fresh("still-processing");
    // The first execution commits 1.5 s after it started; the gateway gave up on the
    // exchange at 300 ms and asks the key's state until the upstream has a result.
    up.state.delay_executions(Duration::from_millis(1500));
    let r = order(&c, &gw.url(), &key, "{}").send().await.unwrap();
    assert_eq!(r.status(), 201);
    assert_eq!(r.headers()["idempotent-replayed"], "true");
    assert!(gw.metrics().state_queries("processing") >= 1);
    assert_eq!(gw.metrics().state_queries("succeeded"), 1);
    assert_eq!(up.state.executions(&key), 1);
    assert_eq!(
        up.state.calls(&key),
        2,
        "one same-key re-send, once the upstream finished"
    );
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn uncertain_result_still_processing_past_the_wait_is_409_then_resolves() {
    let up = stub().await;
    let mut cfg = config(&up.url());
    cfg.upstream_timeout_ms = 300;
    cfg.max_wait_ms = 500;
    let gw = idem_gateway::start(cfg).await.unwrap();
    let c = client();
    let key = fresh("still-processing-409");
    up.state.delay_executions(Duration::from_millis(1500));
    let r = order(&c, &gw.url(), &key, "{}").send().await.unwrap();
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(problem(r).await, (409, problem_type("request-in-progress")));
    assert!(gw.metrics().state_queries("processing") >= 1);
    up.state.delay_executions(Duration::ZERO);
    tokio::time::sleep(Duration::from_millis(2000)).await;
    // The retry (same key) reaches the upstream, which replays its committed result.
    let r = order(&c, &gw.url(), &key, "{}").send().await.unwrap();
    assert_eq!(r.status(), 201);
    assert_eq!(up.state.executions(&key), 1);
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn uncertain_and_absent_is_resent_with_the_same_key_bounded() {
    let up = stub().await;
    let mut cfg = config(&up.url());
    cfg.upstream_timeout_ms = 300;
    cfg.state_query.max_retries = 1;
    let gw = idem_gateway::start(cfg).await.unwrap();
    let c = client();

    // The first call is stuck before the business layer records anything: the state
    // query says absent, the gateway re-sends once with the same key.
    let key = fresh("stuck");
    up.state.stall_calls(Duration::from_millis(1000), 1);
    let r = order(&c, &gw.url(), &key, "{}").send().await.unwrap();
    assert_eq!(r.status(), 201);
    assert_eq!(up.state.calls(&key), 2);
    assert_eq!(gw.metrics().uncertain_resends(), 1);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // The stuck first call arrived late and was answered from the business record.
    assert_eq!(up.state.executions(&key), 1);

    // Stuck every time: bounded, then 504 (retry with the same key).
    let key = fresh("stuck-forever");
    up.state.stall_calls(Duration::from_millis(1000), 2);
    let r = order(&c, &gw.url(), &key, "{}").send().await.unwrap();
    assert_eq!(
        problem(r).await,
        (504, problem_type("upstream-result-unknown"))
    );
    assert_eq!(up.state.calls(&key), 2, "one re-send at most");
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn state_endpoint_missing_means_no_resend() {
    // An upstream without a state endpoint (404 without a state) must not license a
    // re-send: the answer is 504, and the request went out once.
    let up = stub().await;
    let mut cfg = config(&up.url());
    cfg.upstream_timeout_ms = 300;
    cfg.state_query.path = "/nowhere/{key}".into();
    let gw = idem_gateway::start(cfg).await.unwrap();
    let key = fresh("no-endpoint");
    up.state.stall_calls(Duration::from_millis(800), 1);
    let r = order(&client(), &gw.url(), &key, "{}")
        .send()
        .await
        .unwrap();
    assert_eq!(
        problem(r).await,
        (504, problem_type("upstream-result-unknown"))
    );
    assert_eq!(up.state.calls(&key), 1);
    assert_eq!(gw.metrics().state_queries("error"), 1);
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn upstream_down_is_502_and_metrics_are_exposed() {
    // A port nothing listens on.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let gw = idem_gateway::start(config(&addr_url(dead))).await.unwrap();
    let c = client();
    let r = c.get(format!("{}/ping", gw.url())).send().await.unwrap();
    assert_eq!(
        problem(r).await,
        (502, problem_type("upstream-unavailable"))
    );
    let r = order(&c, &gw.url(), &fresh("down"), "{}")
        .send()
        .await
        .unwrap();
    assert_eq!(
        problem(r).await,
        (502, problem_type("upstream-unavailable"))
    );

    let m = c
        .get(format!("{}/_idem/metrics", gw.url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for name in [
        "idem_gateway_requests_total",
        "idem_gateway_upstream_calls_total",
        "idem_gateway_problems_total",
        "idem_gateway_degraded",
    ] {
        assert!(m.contains(name), "{name} missing from\n{m}");
    }
    let h: serde_json::Value = c
        .get(format!("{}/_idem/health", gw.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(h["status"], "ok");
    assert_eq!(h["window"], "memory");
    // The upstream being down does not make the gateway unready: it answers 502 itself.
    let ready = c
        .get(format!("{}/_idem/readyz", gw.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    let ready: serde_json::Value = ready.json().await.unwrap();
    assert_eq!(
        (ready["status"].as_str(), ready["draining"].as_bool()),
        (Some("ready"), Some(false))
    );
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn without_api_keys_each_caller_is_its_own_partition() {
    let up = stub().await;
    let mut cfg = config(&up.url());
    cfg.auth.api_keys.clear();
    cfg.auth.require_on_passthrough = true;
    let gw = idem_gateway::start(cfg).await.unwrap();
    let c = client();
    let key = fresh("single");
    let mut principals = Vec::new();
    for _ in 0..2 {
        let r = c
            .post(format!("{}/v1/echo", gw.url()))
            .header("idempotency-key", &key)
            .header("authorization", "Bearer tok-zzz")
            .body("{}")
            .send()
            .await
            .unwrap();
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["headers"]["authorization"], "Bearer tok-zzz", "forwarded");
        let principal = v["headers"]["x-idem-principal"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(v["headers"]["x-idem-tenant"], principal.as_str());
        principals.push(principal);
    }
    assert_eq!(principals[0], principals[1]);
    assert!(principals[0].starts_with("caller-") && !principals[0].contains("zzz"));
    // No credential at all on a keyed route: refused, nothing recorded.
    let r = c
        .post(format!("{}/v1/echo", gw.url()))
        .header("idempotency-key", fresh("anon"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(problem(r).await.0, 401);
    // Pass-through demands a real API key here, and there is none to give.
    let r = c.get(format!("{}/ping", gw.url())).send().await.unwrap();
    assert_eq!(problem(r).await.0, 401);
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn config_file_and_run_with_shutdown() {
    let up = stub().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.json");
    std::fs::write(
        &path,
        format!(
            r#"{{"listen": "127.0.0.1:0", "upstream": "{}",
                "routes": [{{"methods": ["POST"], "path": "/v1/*", "key": "required"}}],
                "auth": {{"api_keys": {{"{T1_KEY}": "tenant-1"}}}}}}"#,
            up.url()
        ),
    )
    .unwrap();
    let cfg = idem_gateway::GatewayConfig::from_file(&path).unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (addr, handle) = idem_gateway::bind(cfg, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    let r = order(&client(), &addr_url(addr), &fresh("file"), "{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(15), handle)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(TcpStream::connect(addr).await.is_err(), "stopped listening");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_hanging_up_mid_flight_neither_cancels_it_nor_strands_its_followers() {
    let up = stub().await;
    up.state.delay_executions(Duration::from_millis(600));
    let gw = idem_gateway::start(config(&up.url())).await.unwrap();
    let base = gw.url();
    let key = fresh("leader-gone");
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(150))
        .build()
        .unwrap();
    let leader = order(&impatient, &base, &key, r#"{"show":"S-1"}"#);
    // A follower joins while the leader's flight is at the upstream.
    let c = client();
    let follower = {
        let req = order(&c, &base, &key, r#"{"show":"S-1"}"#);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            req.send().await.unwrap()
        })
    };
    assert!(leader.send().await.is_err(), "the leader hung up");
    let answered = follower.await.unwrap();
    assert_eq!(answered.status(), 201);
    assert_eq!(up.state.calls(&key), 1, "one upstream call");
    assert_eq!(up.state.executions(&key), 1);
    // And the key's record was finished: a retry is a replay, with no second call.
    let retry = order(&c, &base, &key, r#"{"show":"S-1"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(retry.status(), 201);
    assert!(retry.headers().contains_key("idempotent-replayed"));
    assert_eq!(up.state.calls(&key), 1);
    gw.stop().await.unwrap();
}
