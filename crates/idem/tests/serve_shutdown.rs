//! `idem serve` on SIGTERM: the request in flight finishes within the grace, what is cut
//! off past it is retryable at once.
//!
//! The `idem` binary in its own process on a fresh SQLite file, spoken to by a real HTTP
//! client (and by raw TCP where a client misbehaves). Each test has its own directory and
//! ports (the server binds 127.0.0.1:0 and says where); a process still running at the
//! end is killed.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;

use common::serve::*;

// ---------------------------------------------------------------------------------------
// Item 8: SIGTERM drains within the grace; what it cuts off is retryable at once

/// Holds the order's lease from outside, so a pay request for it waits in its handler
/// (a real wait: the handler queues behind the lease like behind another request).
fn hold_order_lease(url: &str, order_id: &str) -> i64 {
    let out = idem(
        url,
        &[
            "lock",
            "acquire",
            &format!("order:t:{order_id}"),
            "--owner",
            "test-holder",
            "--ttl",
            "60s",
            "--json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["token"].as_i64().unwrap()
}

fn release_order_lease(url: &str, order_id: &str, token: i64) {
    let out = idem(
        url,
        &[
            "lock",
            "release",
            &format!("order:t:{order_id}"),
            "--owner",
            "test-holder",
            "--token",
            &token.to_string(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn sigterm_lets_the_request_in_flight_finish_then_exits_0() {
    let db = db();
    let key = format!("t={KEY}");
    // The default grace, 10 s.
    let mut s = Serve::start(&db, &["--api-key", &key], &[]);
    let rt = runtime();
    let http = client();
    let order = rt.block_on(create_order(&http, &s, "drain-create"));
    let token = hold_order_lease(&db.url, &order);
    let pay = rt.spawn({
        let (http, url) = (http.clone(), s.url(&format!("/v1/orders/{order}/pay")));
        async move { post(&http, url, KEY, Some("drain-pay"), &json!({})).await }
    });
    wait_for_state(&db.url, "drain-pay", "PROCESSING", Duration::from_secs(10));

    s.sigterm();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        s.running(),
        "exited with a request in flight:\n{}",
        s.stderr()
    );
    assert!(
        TcpStream::connect(&s.addr).is_err(),
        "still accepting after SIGTERM"
    );
    release_order_lease(&db.url, &order, token);
    let paid = rt.block_on(pay).unwrap();
    assert_eq!(
        paid.status, 200,
        "the request in flight finished: {}",
        paid.text
    );
    let status = s.exit_within(Duration::from_secs(5));
    assert_eq!(status.code(), Some(0), "{}", s.stderr());
    assert_eq!(
        key_state(&db.url, "drain-pay").as_deref(),
        Some("SUCCEEDED")
    );
}

#[test]
fn sigterm_cuts_off_an_execution_past_the_grace_and_its_key_is_retryable_at_once() {
    let db = db();
    let key = format!("t={KEY}");
    let mut s = Serve::start(&db, &["--api-key", &key, "--shutdown-grace", "1s"], &[]);
    let rt = runtime();
    let http = client();
    let order = rt.block_on(create_order(&http, &s, "cut-create"));
    let token = hold_order_lease(&db.url, &order);
    let pay = rt.spawn({
        let (http, url) = (http.clone(), s.url(&format!("/v1/orders/{order}/pay")));
        async move {
            http.post(url)
                .bearer_auth(KEY)
                .header("Idempotency-Key", "cut-pay")
                .json(&json!({}))
                .send()
                .await
        }
    });
    wait_for_state(&db.url, "cut-pay", "PROCESSING", Duration::from_secs(10));

    let sent = Instant::now();
    s.sigterm();
    let status = s.exit_within(Duration::from_secs(8));
    let took = sent.elapsed();
    assert_eq!(status.code(), Some(0), "{}", s.stderr());
    assert!(
        took >= Duration::from_millis(900),
        "exited after {took:?}, before the grace"
    );
    // The handler would have waited 10 s for the lease; the grace is 1 s.
    assert!(took < Duration::from_secs(7), "exited after {took:?}");
    // The caller still connected gets an answer, not a dropped connection.
    let answer = rt
        .block_on(pay)
        .unwrap()
        .expect("an answer before the exit");
    let status = answer.status().as_u16();
    let text = rt.block_on(answer.text()).unwrap();
    assert_eq!(status, 500, "{text}");
    assert!(text.contains("execution-failed"), "{text}");
    assert_eq!(
        key_state(&db.url, "cut-pay").as_deref(),
        Some("FAILED_RETRYABLE"),
        "the key is open at once, not PROCESSING until its 60 s lease ends"
    );

    // A restarted server takes the retry at once (no 60 s lease to wait out).
    release_order_lease(&db.url, &order, token);
    let s = Serve::start(&db, &["--api-key", &key], &[]);
    let retried = Instant::now();
    let paid = rt.block_on(post(
        &http,
        s.url(&format!("/v1/orders/{order}/pay")),
        KEY,
        Some("cut-pay"),
        &json!({}),
    ));
    assert_eq!(paid.status, 200, "{}", paid.text);
    assert!(retried.elapsed() < Duration::from_secs(5));
}

#[test]
fn sigterm_still_cuts_off_an_execution_whose_caller_hung_up() {
    let db = db();
    let key = format!("t={KEY}");
    let mut s = Serve::start(&db, &["--api-key", &key, "--shutdown-grace", "1s"], &[]);
    let rt = runtime();
    let http = client();
    let order = rt.block_on(create_order(&http, &s, "gone-create"));
    let token = hold_order_lease(&db.url, &order);
    // The caller gives up after 300 ms; the handler goes on waiting for the lease in a
    // task of its own, with no connection left for the drain to wait on.
    let gone = rt.block_on(async {
        reqwest::Client::builder()
            .timeout(Duration::from_millis(300))
            .build()
            .unwrap()
            .post(s.url(&format!("/v1/orders/{order}/pay")))
            .bearer_auth(KEY)
            .header("Idempotency-Key", "gone-pay")
            .json(&json!({}))
            .send()
            .await
    });
    assert!(gone.is_err(), "the caller hung up");
    wait_for_state(&db.url, "gone-pay", "PROCESSING", Duration::from_secs(10));

    let sent = Instant::now();
    s.sigterm();
    let status = s.exit_within(Duration::from_secs(8));
    assert_eq!(status.code(), Some(0), "{}", s.stderr());
    assert!(
        sent.elapsed() >= Duration::from_millis(900),
        "exited after {:?} without waiting for the execution",
        sent.elapsed()
    );
    assert_eq!(
        key_state(&db.url, "gone-pay").as_deref(),
        Some("FAILED_RETRYABLE"),
        "not left PROCESSING for its lease"
    );
    release_order_lease(&db.url, &order, token);
}
