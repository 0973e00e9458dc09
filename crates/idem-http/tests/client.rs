//! The requester client against the layer: lost responses, timeouts, rejections and
//! outages, each with exactly one execution.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use idem_client::{ClientError, IdempotentClient, RetryPolicy};
use idem_core::IdempotencyStore;
use idem_http::{IdempotencyConfig, ProblemKind};
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

/// A TCP proxy that, on its first `drop_first` connections, forwards the request and
/// closes both sides as soon as the response starts to arrive: the server has committed,
/// the client never hears about it.
async fn dropping_proxy(upstream: SocketAddr, drop_first: usize) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let dropped = Arc::new(AtomicUsize::new(0));
    let counter = dropped.clone();
    tokio::spawn(async move {
        let mut n = 0;
        while let Ok((mut downstream, _)) = listener.accept().await {
            let mut up = TcpStream::connect(upstream).await.unwrap();
            let drop_this = n < drop_first;
            n += 1;
            let counter = counter.clone();
            tokio::spawn(async move {
                if drop_this {
                    let (mut down_read, _down_write) = downstream.split();
                    let (mut up_read, mut up_write) = up.split();
                    let mut first_byte = [0u8; 1];
                    tokio::select! {
                        _ = tokio::io::copy(&mut down_read, &mut up_write) => {}
                        _ = up_read.read(&mut first_byte) => {
                            counter.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    // Both sockets close here, response unsent.
                } else {
                    let _ = tokio::io::copy_bidirectional(&mut downstream, &mut up).await;
                }
            });
        }
    });
    (base, dropped)
}

fn upstream(server: &Server) -> SocketAddr {
    server.base.trim_start_matches("http://").parse().unwrap()
}

fn client(policy: RetryPolicy) -> IdempotentClient {
    IdempotentClient::new(reqwest::Client::new()).with_policy(policy)
}

#[tokio::test]
async fn lost_response_after_commit_is_recovered_by_the_retry() {
    // The seed's 430 ms case: the first request wrote its order at 430 ms, only the
    // response was lost.
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(dir.path()).await;
    let server = start(store.clone(), IdempotencyConfig::default()).await;
    server.handler.set_delay(Duration::from_millis(430));
    let (proxy, dropped) = dropping_proxy(upstream(&server), 1).await;

    let intent = client(RetryPolicy::default())
        .post(format!("{proxy}/v1/orders"))
        .bearer_auth(ALICE)
        .json(&json!({"user_id": "U-7318", "show_id": "S-204"}))
        .unwrap();
    let key = intent.key().clone();
    let response = intent.send().await.unwrap();

    assert_eq!(
        dropped.load(Ordering::SeqCst),
        1,
        "the first response was lost"
    );
    assert_eq!(response.status, 201);
    assert_eq!(response.attempts, 2);
    assert!(response.replayed, "the retry got the stored result");
    assert_eq!(response.key, key);
    assert_eq!(server.handler.calls(), 1, "exactly one execution");
    let record = store
        .get(&scope("t1", key.as_str()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        record.result.unwrap().body,
        response.body.to_vec(),
        "the original result"
    );
    assert!(response.expires().is_some());
}

#[tokio::test]
async fn attempt_timeout_then_409_then_replay_with_the_same_key() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(sqlite(dir.path()).await, IdempotencyConfig::default()).await;
    server.handler.set_delay(Duration::from_millis(430));
    let policy = RetryPolicy::default()
        .attempt_timeout(Duration::from_millis(150))
        .backoff(Duration::from_millis(20), Duration::from_millis(40));
    let t0 = Instant::now();
    let response = client(policy)
        .post(server.url("/v1/orders"))
        .business_key("pay:order-7318")
        .unwrap()
        .bearer_auth(ALICE)
        .json(&json!({"amount": 100}))
        .unwrap()
        .send()
        .await
        .unwrap();
    // 1: timed out at 150 ms; 2: 409 (Retry-After: 1) while the first still runs;
    // 3: after the Retry-After second, the replay.
    assert_eq!((response.status.as_u16(), response.replayed), (201, true));
    assert_eq!(response.attempts, 3);
    assert!(
        t0.elapsed() >= Duration::from_secs(1),
        "Retry-After honoured: {:?}",
        t0.elapsed()
    );
    assert_eq!(response.key.as_str(), "pay:order-7318");
    assert_eq!(server.handler.calls(), 1);
}

#[tokio::test]
async fn client_errors_are_returned_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(sqlite(dir.path()).await, IdempotencyConfig::default()).await;
    let c = client(RetryPolicy::default());
    let url = server.url("/v1/orders");
    let first = c
        .post(&url)
        .business_key("reused")
        .unwrap()
        .bearer_auth(ALICE)
        .json(&json!({"a": 1}))
        .unwrap();
    assert!(!first.send().await.unwrap().replayed);
    let t0 = Instant::now();
    let changed = c
        .post(&url)
        .business_key("reused")
        .unwrap()
        .bearer_auth(ALICE)
        .json(&json!({"a": 2}))
        .unwrap();
    match changed.send().await {
        Err(e @ ClientError::Rejected { .. }) => {
            assert_eq!(e.status(), Some(422));
            assert_eq!(
                e.problem_type(),
                Some(ProblemKind::KeyReused.type_uri().as_str())
            );
            let ClientError::Rejected { response, .. } = e else {
                unreachable!()
            };
            assert_eq!(response.attempts, 1);
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    let anonymous = c
        .post(&url)
        .json(&json!({}))
        .unwrap()
        .send()
        .await
        .unwrap_err();
    assert_eq!(anonymous.status(), Some(401));
    assert!(
        t0.elapsed() < Duration::from_millis(500),
        "no backoff on rejections"
    );
    assert_eq!(server.handler.calls(), 1);
}

#[tokio::test]
async fn store_outage_is_retried_with_the_same_key_until_it_executes_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = SwitchableStore::new(sqlite(dir.path()).await);
    let server = start(store.clone(), IdempotencyConfig::default()).await;
    store.down.store(true, Ordering::SeqCst);
    let down = store.down.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        down.store(false, Ordering::SeqCst);
    });
    let response = client(RetryPolicy::default())
        .post(server.url("/v1/orders"))
        .bearer_auth(ALICE)
        .json(&json!({}))
        .unwrap()
        .send()
        .await
        .unwrap();
    assert_eq!((response.status.as_u16(), response.replayed), (201, false));
    assert_eq!(response.attempts, 2, "503 then success after Retry-After");
    assert_eq!(server.handler.calls(), 1);
}

#[test]
fn client_and_server_agree_on_the_wire_names() {
    assert_eq!(
        idem_client::IDEMPOTENCY_KEY,
        idem_http::IDEMPOTENCY_KEY.as_str()
    );
    assert_eq!(
        idem_client::IDEMPOTENT_REPLAYED,
        idem_http::IDEMPOTENT_REPLAYED.as_str()
    );
    assert_eq!(
        idem_client::IDEMPOTENCY_EXPIRES,
        idem_http::IDEMPOTENCY_EXPIRES.as_str()
    );
}
