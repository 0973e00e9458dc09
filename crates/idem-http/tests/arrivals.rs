//! Every keyed arrival reaches the application's sink with the layer's decision: the
//! first executes, duplicates replay (or wait and replay), another body under the key
//! is a mismatch, a refusal is a refusal; requests without a key are not arrivals.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use idem_core::{Arrival, ArrivalDecision, ArrivalSink};
use idem_http::{IdempotencyConfig, IdempotencyLayer, InProgressMode};
use serde_json::json;

#[derive(Default)]
struct Collect(Mutex<Vec<Arrival>>);

impl ArrivalSink for Collect {
    fn record(&self, arrival: Arrival) {
        self.0.lock().unwrap().push(arrival);
    }
}

impl Collect {
    fn of(&self, key: &str) -> Vec<Arrival> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|a| a.scope.key.as_str() == key)
            .cloned()
            .collect()
    }

    fn count(&self, key: &str, decision: ArrivalDecision) -> usize {
        self.of(key)
            .iter()
            .filter(|a| a.decision == decision)
            .count()
    }
}

async fn start_with_sink(
    config: IdempotencyConfig,
) -> (String, Arc<Handler>, Arc<Collect>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(dir.path()).await;
    let sink = Arc::new(Collect::default());
    let handler = Arc::new(Handler::default());
    let layer = IdempotencyLayer::new(store, auth())
        .with_config(config)
        .with_arrivals(sink.clone());
    let (base, _task) = serve_router(app(handler.clone()).layer(layer)).await;
    (base, handler, sink, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_are_one_execution_and_replays() {
    let config = IdempotencyConfig::default().in_progress(InProgressMode::Wait {
        max_wait: Duration::from_secs(10),
    });
    let (base, handler, sink, _dir) = start_with_sink(config).await;
    handler.set_delay(Duration::from_millis(200));
    let client = reqwest::Client::new();
    let url = format!("{base}/v1/orders");
    for round in 0..5 {
        let key = format!("arr-{round}");
        let replies = futures::future::join_all(
            (0..8).map(|_| send(order(&client, &url, ALICE, &key, &json!({"sku": "a"})))),
        )
        .await;
        assert!(replies.iter().all(|r| r.status == 201), "round {round}");
        // Recorded after the answer: give the last ones a moment.
        eventually("eight arrivals", async || sink.of(&key).len() == 8).await;
        assert_eq!(
            sink.count(&key, ArrivalDecision::Executed),
            1,
            "round {round}"
        );
        assert_eq!(
            sink.count(&key, ArrivalDecision::Replayed),
            7,
            "round {round}"
        );
        let arrivals = sink.of(&key);
        assert!(arrivals
            .iter()
            .all(|a| a.status == 201 && a.scope.tenant.as_str() == "t1"));
        assert!(arrivals
            .iter()
            .all(|a| a.principal.as_str() == "alice" && a.at > 0));
    }
    assert_eq!(handler.calls(), 5);
}

#[tokio::test]
async fn mismatches_refusals_and_keyless_requests() {
    let (base, _handler, sink, _dir) =
        start_with_sink(IdempotencyConfig::default().max_request_body(64)).await;
    let client = reqwest::Client::new();
    let url = format!("{base}/v1/orders");
    let first = send(order(&client, &url, ALICE, "arr-m", &json!({"sku": "a"}))).await;
    assert_eq!(first.status, 201);
    let other = send(order(&client, &url, ALICE, "arr-m", &json!({"sku": "b"}))).await;
    assert_eq!(other.status, 422);
    let big = send(order(
        &client,
        &url,
        ALICE,
        "arr-big",
        &json!({"sku": "x".repeat(200)}),
    ))
    .await;
    assert_eq!(big.status, 413);
    // No key, a bad key, no credential: no scope to tell, nothing recorded.
    let keyless = send(client.post(&url).bearer_auth(ALICE).json(&json!({}))).await;
    assert_eq!(keyless.status, 400);
    let anonymous = send(
        client
            .post(&url)
            .header("idempotency-key", "arr-anon")
            .json(&json!({})),
    )
    .await;
    assert_eq!(anonymous.status, 401);
    eventually("three arrivals", async || sink.0.lock().unwrap().len() == 3).await;
    assert_eq!(sink.count("arr-m", ArrivalDecision::Executed), 1);
    assert_eq!(sink.count("arr-m", ArrivalDecision::Mismatch), 1);
    let refused = sink.of("arr-big");
    assert_eq!(refused.len(), 1);
    assert_eq!(
        (refused[0].decision, refused[0].status),
        (ArrivalDecision::Refused, 413)
    );
    assert!(sink.of("arr-anon").is_empty());
}
