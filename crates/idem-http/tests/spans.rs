//! Every keyed request has a span naming its tenant, key, the layer's decision and the
//! store's latency: what an operator filters logs and traces by.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use common::*;
use idem_http::IdempotencyConfig;
use serde_json::{json, Value};
use tracing_subscriber::fmt::format::FmtSpan;

/// Log lines written by the subscriber, for the test to read.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The closed `idempotency` spans logged so far.
fn closed_spans(lines: &Lines) -> Vec<Value> {
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["fields"]["message"] == "close" && v["span"]["name"] == "idempotency")
        .map(|v| v["span"].clone())
        .collect()
}

#[tokio::test]
async fn a_keyed_request_has_a_span_with_tenant_key_decision_and_store_latency() {
    let lines = Lines::default();
    let writer = lines.clone();
    tracing_subscriber::fmt()
        .json()
        .with_span_events(FmtSpan::CLOSE)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .init();
    let dir = tempfile::tempdir().unwrap();
    let server = start(sqlite(dir.path()).await, IdempotencyConfig::default()).await;
    let client = reqwest::Client::new();
    let body = json!({"sku": "a"});
    for _ in 0..2 {
        let r = send(order(
            &client,
            &server.url("/v1/orders"),
            ALICE,
            "span-k1",
            &body,
        ))
        .await;
        assert_eq!(r.status, 201);
    }
    let mut spans = Vec::new();
    eventually("two closed spans", async || {
        spans = closed_spans(&lines);
        spans.len() >= 2
    })
    .await;
    let decisions: Vec<&str> = spans
        .iter()
        .filter_map(|s| s["decision"].as_str())
        .collect();
    assert_eq!(decisions, ["executed", "replayed"], "{spans:#?}");
    for span in &spans {
        assert_eq!(span["tenant"], "t1", "{span}");
        assert_eq!(span["key"], "span-k1", "{span}");
        assert!(
            span["store_ms"].as_f64().is_some_and(|ms| ms >= 0.0),
            "{span}"
        );
    }
}
