//! No instance stalls the fleet: two `idem serve` processes on one database behind one
//! `idem gateway` fronting both, as real processes on loopback. One service is
//! SIGSTOPped (a long GC pause, as the gateway sees it); keyed orders keep completing
//! through the other, the stopped one is ejected, and after SIGCONT it takes requests
//! again.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;
use common::{free_port, serve_sqlite, spawn, wait_ready};

const TOKEN: &str = "fleet-secret-0001";
/// The user every order of the test is for, so they can be listed together.
const USER: &str = "U-fleet";

/// One order under `key`; its status and order id (if any).
/// Users the orders are spread over: the listing answers at most 1,000 orders a call, and
/// a fast run makes more than that.
const USERS: usize = 8;

/// The user a key's order is for (the same on every retry of the key).
fn user_of(key: &str) -> String {
    let spread = key.bytes().map(usize::from).sum::<usize>() % USERS;
    format!("{USER}-{spread}")
}

async fn order(c: &reqwest::Client, gw: &str, key: &str) -> (u16, Option<String>) {
    let r = c
        .post(format!("{gw}/v1/orders"))
        .bearer_auth(TOKEN)
        .header("idempotency-key", key)
        .json(&json!({"user_id": user_of(key), "show_id": "S-204", "quantity": 1}))
        .send()
        .await;
    match r {
        Ok(r) => {
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap_or_default();
            (status, body["order_id"].as_str().map(str::to_string))
        }
        Err(_) => (0, None),
    }
}

/// A series of the gateway's metrics (`name{labels}`), 0 when absent.
async fn metric(c: &reqwest::Client, gw: &str, series: &str) -> u64 {
    let text = c
        .get(format!("{gw}/_idem/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter_map(|l| l.rsplit_once(' '))
        .find(|(s, _)| *s == series)
        .and_then(|(_, v)| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// One keyed order's answer, and when it came (since the stop).
#[derive(Debug, Clone)]
struct Answer {
    key: String,
    status: u16,
    order_id: Option<String>,
    at: Duration,
}

async fn health(c: &reqwest::Client, gw: &str) -> Value {
    c.get(format!("{gw}/_idem/health"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_stopped_service_is_routed_around_and_each_key_makes_one_order() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("orders.db");
    // One after the other: the second finds the schema migrated.
    let (paused, paused_url) = serve_sqlite(&db, &[("a", TOKEN)]).await;
    let (_live, live_url) = serve_sqlite(&db, &[("a", TOKEN)]).await;

    let port = free_port();
    let config = dir.path().join("gateway.json");
    std::fs::write(
        &config,
        json!({
            "listen": format!("127.0.0.1:{port}"),
            "routes": [{"methods": ["POST"], "path": "/v1/*", "key": "required"}],
            "upstream_timeout_ms": 1_000,
            "upstream_health": {"consecutive_failures": 3, "eject_ms": 2_000},
            "state_query": {"timeout_ms": 2_000},
        })
        .to_string(),
    )
    .unwrap();
    // Both upstreams from the command line: the flag is repeatable.
    let _gw = spawn(
        "idem gateway",
        &[
            "gateway",
            "--config",
            config.to_str().unwrap(),
            "--upstream",
            &paused_url,
            "--upstream",
            &live_url,
        ],
    );
    let gw = format!("http://127.0.0.1:{port}");
    wait_ready(&format!("{gw}/_idem/health")).await;
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let to_paused = format!("idem_gateway_upstream_requests_total{{upstream=\"{paused_url}\"}}");
    let paused_ejections =
        format!("idem_gateway_upstream_ejections_total{{upstream=\"{paused_url}\"}}");
    assert_eq!(health(&c, &gw).await["upstreams_healthy"], 2);

    // Stopped while idle (no transaction of its own open), so the database stays free
    // for the other service; then 4 callers send fresh keys for as long as the pause.
    paused.signal("STOP");
    let pause = Duration::from_millis(4_500);
    let answers: Arc<Mutex<Vec<Answer>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let callers: Vec<_> = (0..4)
        .map(|w| {
            let (c, gw, answers, stop) = (c.clone(), gw.clone(), answers.clone(), stop.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("fleet-{w}-{n}-{}", uuid::Uuid::now_v7().simple());
                    n += 1;
                    let (status, order_id) = order(&c, &gw, &key).await;
                    let at = t0.elapsed();
                    answers.lock().unwrap().push(Answer {
                        key,
                        status,
                        order_id,
                        at,
                    });
                }
            })
        })
        .collect();
    tokio::time::sleep(pause).await;
    stop.store(true, Ordering::Relaxed);
    let ejections = metric(&c, &gw, &paused_ejections).await;
    let sent_to_paused = metric(&c, &gw, &to_paused).await;
    paused.signal("CONT");
    for caller in callers {
        caller.await.unwrap();
    }
    let answers = answers.lock().unwrap().clone();
    let in_pause: Vec<_> = answers.iter().filter(|a| a.at <= pause).collect();
    let created = in_pause.iter().filter(|a| a.status == 201).count();
    println!(
        "during the {} ms pause: {created} of {} keyed orders answered 201 ({:.1}/s); \
         {sent_to_paused} request(s) went to the stopped service, ejected {ejections} time(s)",
        pause.as_millis(),
        in_pause.len(),
        created as f64 / pause.as_secs_f64(),
    );
    assert!(
        created >= 20 && created * 10 >= in_pause.len() * 9,
        "{created} of {} answered 201: {in_pause:?}",
        in_pause.len()
    );
    // Answers kept coming through the whole pause, not only after an ejection.
    for second in 0..4 {
        let slice = Duration::from_secs(second)..Duration::from_secs(second + 1);
        assert!(
            in_pause
                .iter()
                .any(|a| a.status == 201 && slice.contains(&a.at)),
            "no order completed in second {second} of the pause"
        );
    }
    assert!(ejections >= 1, "the stopped service was never ejected");
    assert!(
        sent_to_paused * 4 <= answers.len() as u64,
        "{sent_to_paused} of {} requests went to the stopped service",
        answers.len()
    );

    // Back: once its ejection ends it takes requests again.
    wait_ready(&format!("{paused_url}/healthz")).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while health(&c, &gw).await["upstreams_healthy"] != 2 {
        assert!(Instant::now() < deadline, "{}", health(&c, &gw).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = metric(&c, &gw, &to_paused).await;
    let mut keys = answers;
    for n in 0..8 {
        let key = format!("fleet-after-{n}-{}", uuid::Uuid::now_v7().simple());
        let (status, order_id) = order(&c, &gw, &key).await;
        assert_eq!(status, 201);
        keys.push(Answer {
            key,
            status,
            order_id,
            at: t0.elapsed(),
        });
    }
    assert!(
        metric(&c, &gw, &to_paused).await > before,
        "the resumed service got no request"
    );

    // Every key exactly one order: retry the few without an answer (same key), then
    // count the orders by key in the shared database.
    for a in keys.iter_mut().filter(|a| a.status != 201) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while a.status != 201 {
            assert!(Instant::now() < deadline, "{}: still {}", a.key, a.status);
            (a.status, a.order_id) = order(&c, &gw, &a.key).await;
            if a.status != 201 {
                // A client's backoff before its next attempt.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for user in 0..USERS {
        let listed: Value = c
            .get(format!(
                "{live_url}/v1/orders?user_id={USER}-{user}&limit=1000"
            ))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let orders = listed["orders"].as_array().unwrap();
        assert!(
            orders.len() < 1000,
            "user {user}: a full page, orders may be missing"
        );
        for o in orders {
            by_key
                .entry(o["idempotency_key"].as_str().unwrap().to_string())
                .or_default()
                .push(o["order_id"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(by_key.len(), keys.len(), "one order per key, no other");
    for a in &keys {
        assert_eq!(
            by_key.get(&a.key),
            Some(&vec![a.order_id.clone().unwrap()]),
            "{}: the order its answer named, once",
            a.key
        );
    }
}
