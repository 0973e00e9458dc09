//! The request fingerprint as a user meets it: `idem serve` on SQLite, alone and behind
//! `idem gateway`, as real processes on loopback. Two 64-bit integers a double cannot
//! tell apart are two requests under one key, and a JSON body naming a member twice is
//! refused before anything is recorded.

use std::path::Path;

use serde_json::{json, Value};

const ALICE: &str = "alice-secret-0001";
const PROBLEMS: &str = "https://idem.dev/problems/";

mod common;
use common::{free_port, serve_sqlite, spawn, wait_ready, Proc};

/// `idem serve` on SQLite in `dir`, with tenant `a` (Alice's key).
async fn serve(dir: &Path) -> (Proc, String) {
    serve_sqlite(&dir.join("orders.db"), &[("a", ALICE)]).await
}

/// `idem gateway` in front of `upstream`, requiring a key on every POST under `/v1/`.
async fn gateway(dir: &Path, upstream: &str) -> (Proc, String) {
    let port = free_port();
    let cfg = json!({
        "listen": format!("127.0.0.1:{port}"),
        "upstream": upstream,
        "routes": [{"methods": ["POST"], "path": "/v1/*", "key": "required"}],
    });
    let path = dir.join(format!("gateway-{port}.json"));
    std::fs::write(&path, cfg.to_string()).unwrap();
    let proc = spawn(
        "idem gateway",
        &["gateway", "--config", path.to_str().unwrap()],
    );
    let url = format!("http://127.0.0.1:{port}");
    wait_ready(&format!("{url}/_idem/health")).await;
    (proc, url)
}

struct Reply {
    status: u16,
    replayed: bool,
    body: Value,
}

impl Reply {
    fn problem_type(&self) -> &str {
        self.body["type"].as_str().unwrap_or("")
    }
}

/// POST /v1/orders with `body` sent exactly as written.
async fn order(c: &reqwest::Client, base: &str, key: &str, body: &str) -> Reply {
    let r = c
        .post(format!("{base}/v1/orders"))
        .bearer_auth(ALICE)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let replayed = r
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    let bytes = r.bytes().await.unwrap();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Reply {
        status,
        replayed,
        body,
    }
}

fn with_quantity(quantity: &str) -> String {
    format!(r#"{{"user_id":"U-7318","show_id":"S-204","quantity":{quantity}}}"#)
}

/// The checks both set-ups pass, through `base`.
async fn exact_numbers_and_duplicate_members(base: &str) {
    let c = reqwest::Client::new();
    let run = uuid::Uuid::now_v7().simple().to_string();

    // 2^53 + 1 and 2^53 are one 64-bit float. The service refuses such a quantity
    // (a 4xx of its own); what matters is that the second is not its replay.
    let key = format!("exact-{run}");
    let first = order(&c, base, &key, &with_quantity("9007199254740993")).await;
    assert!(
        (400..500).contains(&first.status) && !first.replayed,
        "{} {}",
        first.status,
        first.body
    );
    assert_ne!(
        first.problem_type(),
        format!("{PROBLEMS}idempotency-key-reused")
    );
    let second = order(&c, base, &key, &with_quantity("9007199254740992")).await;
    assert_eq!(second.status, 422, "{}", second.body);
    assert_eq!(
        second.problem_type(),
        format!("{PROBLEMS}idempotency-key-reused"),
        "{}",
        second.body
    );
    assert!(!second.replayed);
    // The first text again, spaced differently: the stored answer.
    let spaced = r#"{ "quantity" : 9007199254740993, "show_id":"S-204", "user_id":"U-7318" }"#;
    let again = order(&c, base, &key, spaced).await;
    assert_eq!((again.status, again.replayed), (first.status, true));
    assert_eq!(again.body, first.body);

    // A member named twice: refused, and the key stays free.
    let key = format!("dup-{run}");
    let body = r#"{"user_id":"U-7318","show_id":"S-204","quantity":1,"quantity":5}"#;
    let dup = order(&c, base, &key, body).await;
    assert_eq!(dup.status, 400, "{}", dup.body);
    assert_eq!(
        dup.problem_type(),
        format!("{PROBLEMS}duplicate-json-member"),
        "{}",
        dup.body
    );
    assert!(
        dup.body["detail"].as_str().unwrap().contains("/quantity"),
        "{}",
        dup.body
    );
    let nested = r#"{"user_id":"U-7318","show_id":"S-204","quantity":1,"meta":{"a":1,"a":2}}"#;
    let dup = order(&c, base, &format!("{key}-nested"), nested).await;
    assert_eq!(
        (dup.status, dup.problem_type()),
        (400, format!("{PROBLEMS}duplicate-json-member").as_str()),
        "{}",
        dup.body
    );
    let ok = order(&c, base, &key, &with_quantity("1")).await;
    assert_eq!((ok.status, ok.replayed), (201, false), "{}", ok.body);
}

#[tokio::test]
async fn serve_keeps_numbers_exact_and_refuses_duplicate_members() {
    let dir = tempfile::tempdir().unwrap();
    let (_serve, serve_url) = serve(dir.path()).await;
    exact_numbers_and_duplicate_members(&serve_url).await;
}

#[tokio::test]
async fn the_gateway_keeps_numbers_exact_and_refuses_duplicate_members() {
    let dir = tempfile::tempdir().unwrap();
    let (_serve, serve_url) = serve(dir.path()).await;
    let (_gw, gw) = gateway(dir.path(), &serve_url).await;
    exact_numbers_and_duplicate_members(&gw).await;
    // The gateway answered the duplicates itself: they never reached the service.
    let metrics = reqwest::get(format!("{gw}/_idem/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let refused = metrics
        .lines()
        .find(|l| {
            l.starts_with("idem_gateway_problems_total") && l.contains("\"duplicate-json-member\"")
        })
        .unwrap_or_else(|| panic!("no duplicate-json-member count:\n{metrics}"));
    assert!(refused.ends_with(" 2"), "{refused}");
}
