//! The layer against a real server on 127.0.0.1:0, a real HTTP client and a real SQLite
//! store in a temporary directory.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use idem_core::RecordState;
use idem_http::metrics::{Conflict, Decision, ExecutionOutcome, FinishedBy};
use idem_http::{
    IdempotencyConfig, InProgressMode, KeyRule, ProblemKind, RouteRule, StoreUnavailableMode,
};
use serde_json::json;

const ORDERS: &str = "/v1/orders";

fn wait_mode(max_wait: Duration) -> IdempotencyConfig {
    IdempotencyConfig::default().in_progress(InProgressMode::Wait { max_wait })
}

async fn concurrent_duplicates(n: usize) {
    let dir = tempfile::tempdir().unwrap();
    let server = start(sqlite(dir.path()).await, wait_mode(Duration::from_secs(10))).await;
    server.handler.set_delay(Duration::from_millis(200));
    let client = reqwest::Client::new();
    let body = json!({"user_id": "U-7318", "show_id": "S-204"});
    let url = server.url(ORDERS);
    let replies = futures::future::join_all((0..n).map(|_| {
        let r = order(&client, &url, ALICE, "confirm-1", &body);
        send(r)
    }))
    .await;

    assert_eq!(
        server.handler.calls(),
        1,
        "the handler ran once for {n} duplicates"
    );
    assert!(replies.iter().all(|r| r.status == 201), "all 201");
    let first = &replies[0].body;
    assert!(
        replies.iter().all(|r| r.body == *first),
        "same body everywhere"
    );
    let replayed = replies.iter().filter(|r| r.replayed()).count();
    assert_eq!(replayed, n - 1, "all but one say replayed");
    let location = replies[0].header("location").unwrap().to_owned();
    assert!(replies
        .iter()
        .all(|r| r.header("location") == Some(&location)));
    // Chosen headers only are replayed.
    assert!(replies
        .iter()
        .filter(|r| r.replayed())
        .all(|r| r.header("x-not-replayed").is_none()));
    let expires = replies[0].header("idempotency-expires").unwrap().to_owned();
    assert!(expires.ends_with(" GMT"), "{expires}");
    assert!(replies
        .iter()
        .all(|r| r.header("idempotency-expires") == Some(&expires)));
    assert_eq!(server.metrics.requests(Decision::Executed), 1);
    assert_eq!(server.metrics.requests(Decision::Replayed), n as u64 - 1);
    assert_eq!(server.metrics.conflicts(Conflict::Replayed), n as u64 - 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_concurrent_duplicates_execute_once() {
    concurrent_duplicates(8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_duplicates_execute_once() {
    concurrent_duplicates(64).await;
}

#[tokio::test]
async fn concurrent_duplicates_in_409_mode_get_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(sqlite(dir.path()).await, IdempotencyConfig::default()).await;
    server.handler.set_delay(Duration::from_millis(300));
    let client = reqwest::Client::new();
    let body = json!({"q": 1});
    let url = server.url(ORDERS);
    let replies = futures::future::join_all(
        (0..8).map(|_| send(order(&client, &url, ALICE, "k-409", &body))),
    )
    .await;
    assert_eq!(server.handler.calls(), 1);
    let ok: Vec<_> = replies.iter().filter(|r| r.status == 201).collect();
    let conflicts: Vec<_> = replies.iter().filter(|r| r.status == 409).collect();
    assert_eq!((ok.len(), conflicts.len()), (1, 7));
    for c in conflicts {
        assert_eq!(c.problem_type(), ProblemKind::RequestInProgress.type_uri());
        assert_eq!(c.header("retry-after"), Some("1"));
    }
    assert_eq!(server.metrics.conflicts(Conflict::InProgress), 7);
    // After it finished, the same key replays the one result.
    let again = send(order(&client, &url, ALICE, "k-409", &body)).await;
    assert_eq!((again.status, again.replayed()), (201, true));
    assert_eq!(again.body, ok[0].body);
}

#[tokio::test]
async fn same_key_different_payload_is_422_and_key_order_does_not_matter() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(sqlite(dir.path()).await, IdempotencyConfig::default()).await;
    let client = reqwest::Client::new();
    let url = server.url(ORDERS);
    let first = send(order(&client, &url, ALICE, "k1", &json!({"a": 1, "b": 2}))).await;
    assert_eq!(first.status, 201);
    // The same JSON with its members in another order is the same request.
    let reordered = client
        .post(&url)
        .bearer_auth(ALICE)
        .header("idempotency-key", "k1")
        .header("content-type", "application/json")
        .body("{ \"b\": 2,\n \"a\": 1 }");
    let reordered = send(reordered).await;
    assert_eq!((reordered.status, reordered.replayed()), (201, true));
    let other = send(order(&client, &url, ALICE, "k1", &json!({"a": 1, "b": 3}))).await;
    assert_eq!(other.status, 422);
    assert_eq!(other.problem_type(), ProblemKind::KeyReused.type_uri());
    // Another principal of the same tenant cannot reuse (or read) alice's key.
    let bob = send(order(&client, &url, BOB, "k1", &json!({"a": 1, "b": 2}))).await;
    assert_eq!(bob.status, 422);
    // Another route is another request.
    let search = send(order(
        &client,
        &server.url("/v1/likes"),
        ALICE,
        "k1",
        &json!({"a": 1, "b": 2}),
    ))
    .await;
    assert_eq!(search.status, 422);
    assert_eq!(server.handler.calls(), 1);
    assert_eq!(server.metrics.requests(Decision::Mismatch), 3);
}

#[tokio::test]
async fn missing_and_invalid_keys_are_400_and_reads_pass_through() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(sqlite(dir.path()).await, IdempotencyConfig::default()).await;
    let client = reqwest::Client::new();
    let url = server.url(ORDERS);
    let missing = send(client.post(&url).bearer_auth(ALICE).json(&json!({}))).await;
    assert_eq!(missing.status, 400);
    assert_eq!(missing.problem_type(), ProblemKind::MissingKey.type_uri());
    for bad in [
        "has space".to_owned(),
        "k".repeat(256),
        "\"unterminated".to_owned(),
    ] {
        let r = send(order(&client, &url, ALICE, &bad, &json!({}))).await;
        assert_eq!(r.status, 400, "{bad}");
        assert_eq!(r.problem_type(), ProblemKind::InvalidKey.type_uri());
    }
    let repeated = client
        .post(&url)
        .bearer_auth(ALICE)
        .header("idempotency-key", "a")
        .header("idempotency-key", "b")
        .json(&json!({}));
    assert_eq!(send(repeated).await.status, 400);
    assert_eq!(server.handler.calls(), 0);
    // A GET needs no key and no authentication from the layer.
    let read = send(client.get(server.url("/v1/orders/1"))).await;
    assert_eq!((read.status, &read.body[..]), (200, &b"an order"[..]));
    assert_eq!(server.metrics.requests(Decision::MissingKey), 1);
    assert_eq!(server.metrics.requests(Decision::InvalidKey), 4);
}

#[tokio::test]
async fn structured_field_and_token_forms_name_the_same_key() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(sqlite(dir.path()).await, IdempotencyConfig::default()).await;
    let client = reqwest::Client::new();
    let url = server.url(ORDERS);
    let body = json!({"x": 1});
    let plain = send(order(&client, &url, ALICE, "sf-key-1", &body)).await;
    let quoted = send(order(&client, &url, ALICE, "\"sf-key-1\"", &body)).await;
    assert_eq!(
        (plain.status, quoted.status, quoted.replayed()),
        (201, 201, true)
    );
    assert_eq!(plain.body, quoted.body);
    assert_eq!(server.handler.calls(), 1);
}

#[tokio::test]
async fn oversized_body_is_413_and_nothing_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(dir.path()).await;
    let server = start(
        store.clone(),
        IdempotencyConfig::default().max_request_body(1024),
    )
    .await;
    let client = reqwest::Client::new();
    let url = server.url(ORDERS);
    let big = json!({"blob": "x".repeat(2000)});
    let r = send(order(&client, &url, ALICE, "big-1", &big)).await;
    assert_eq!(r.status, 413);
    assert_eq!(r.problem_type(), ProblemKind::RequestTooLarge.type_uri());
    // Without a Content-Length the limit is enforced while reading.
    let chunks = futures::stream::iter((0..8).map(|_| {
        Ok::<_, std::io::Error>(http_body::Frame::data(bytes::Bytes::from(vec![b'a'; 200])))
    }));
    let streamed = client
        .post(&url)
        .bearer_auth(ALICE)
        .header("idempotency-key", "big-2")
        .body(reqwest::Body::wrap(http_body_util::StreamBody::new(chunks)));
    let streamed = send(streamed).await;
    assert_eq!(streamed.status, 413);
    use idem_core::IdempotencyStore;
    assert_eq!(store.get(&scope("t1", "big-1")).await.unwrap(), None);
    assert_eq!(store.get(&scope("t1", "big-2")).await.unwrap(), None);
    assert_eq!(server.handler.calls(), 0);
    // The same key with a body within the limit then executes normally.
    let ok = send(order(&client, &url, ALICE, "big-1", &json!({"blob": "x"}))).await;
    assert_eq!(ok.status, 201);
}

#[tokio::test]
async fn no_authentication_is_401_and_headers_never_pick_the_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(dir.path()).await;
    let server = start(store.clone(), IdempotencyConfig::default()).await;
    let client = reqwest::Client::new();
    let url = server.url(ORDERS);
    let anonymous = client
        .post(&url)
        .header("idempotency-key", "k")
        .header("x-tenant", "t2")
        .json(&json!({}));
    let r = send(anonymous).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.problem_type(), ProblemKind::Unauthenticated.type_uri());
    assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    let wrong = send(order(&client, &url, "nope", "k", &json!({}))).await;
    assert_eq!(wrong.status, 401);
    assert_eq!(server.handler.calls(), 0);
    // A tenant header does not move alice out of t1.
    let spoof = order(&client, &url, ALICE, "k", &json!({})).header("x-tenant", "t2");
    let spoof = send(spoof).await;
    assert_eq!(spoof.json()["tenant"], "t1");
    use idem_core::IdempotencyStore;
    assert!(store.get(&scope("t1", "k")).await.unwrap().is_some());
    assert!(store.get(&scope("t2", "k")).await.unwrap().is_none());
}

#[tokio::test]
async fn two_tenants_with_the_same_key_get_independent_results() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(sqlite(dir.path()).await, IdempotencyConfig::default()).await;
    let client = reqwest::Client::new();
    let url = server.url(ORDERS);
    let body = json!({"user_id": "U-1", "show_id": "S-1"});
    let t1 = send(order(&client, &url, ALICE, "shared-key", &body)).await;
    let t2 = send(order(&client, &url, CAROL, "shared-key", &body)).await;
    assert_eq!((t1.status, t2.status), (201, 201));
    assert!(
        !t1.replayed() && !t2.replayed(),
        "each tenant executes once"
    );
    assert_ne!(t1.json()["order_id"], t2.json()["order_id"]);
    assert_eq!(
        (t1.json()["tenant"].clone(), t2.json()["tenant"].clone()),
        (json!("t1"), json!("t2"))
    );
    // Each replays its own result, never the other's.
    let t1_again = send(order(&client, &url, ALICE, "shared-key", &body)).await;
    let t2_again = send(order(&client, &url, CAROL, "shared-key", &body)).await;
    assert_eq!((t1_again.replayed(), t2_again.replayed()), (true, true));
    assert_eq!(t1_again.body, t1.body);
    assert_eq!(t2_again.body, t2.body);
    assert_eq!(server.handler.calls(), 2);
}

#[tokio::test]
async fn store_down_is_503_without_calling_the_handler() {
    let dir = tempfile::tempdir().unwrap();
    let store = SwitchableStore::new(sqlite(dir.path()).await);
    let config = IdempotencyConfig::default()
        .route(RouteRule::new("/v1/likes").on_store_unavailable(StoreUnavailableMode::FailOpen));
    let server = start(store.clone(), config).await;
    let client = reqwest::Client::new();
    store.down.store(true, Ordering::SeqCst);
    let r = send(order(
        &client,
        &server.url(ORDERS),
        ALICE,
        "k-down",
        &json!({}),
    ))
    .await;
    assert_eq!(r.status, 503);
    assert_eq!(r.problem_type(), ProblemKind::StoreUnavailable.type_uri());
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(server.handler.calls(), 0, "fail closed: not executed");
    assert_eq!(server.metrics.requests(Decision::Unavailable), 1);
    // A route configured for availability runs unprotected instead.
    let open = send(order(
        &client,
        &server.url("/v1/likes"),
        ALICE,
        "k-like",
        &json!({}),
    ))
    .await;
    assert_eq!(open.status, 201);
    assert_eq!(server.handler.calls(), 1);
    assert_eq!(server.metrics.requests(Decision::Bypassed), 1);
    // Back up: the same key executes now.
    store.down.store(false, Ordering::SeqCst);
    let r = send(order(
        &client,
        &server.url(ORDERS),
        ALICE,
        "k-down",
        &json!({}),
    ))
    .await;
    assert_eq!((r.status, r.replayed()), (201, false));
}

#[tokio::test]
async fn store_pool_closed_is_503() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(dir.path()).await;
    let server = start(store.clone(), IdempotencyConfig::default()).await;
    store.pool().close().await;
    let client = reqwest::Client::new();
    let r = send(order(&client, &server.url(ORDERS), ALICE, "k", &json!({}))).await;
    assert_eq!(r.status, 503);
    assert_eq!(server.handler.calls(), 0);
}

#[tokio::test]
async fn wait_mode_replays_when_the_first_finishes_and_409_mode_does_not_wait() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(dir.path()).await;
    let config = IdempotencyConfig::default()
        .route(RouteRule::new(ORDERS).in_progress(InProgressMode::Wait {
            max_wait: Duration::from_secs(5),
        }))
        .route(
            RouteRule::new("/v1/likes").in_progress(InProgressMode::Wait {
                max_wait: Duration::from_millis(150),
            }),
        );
    let server = start(store, config).await;
    server.handler.set_delay(Duration::from_millis(600));
    let client = reqwest::Client::new();
    let body = json!({"w": 1});

    // Wait mode: the duplicate is answered right after the first finishes — woken, not
    // polling (the lease is 60 s, so only the wake-up can explain a prompt answer).
    for (path, key) in [
        (ORDERS, "wait-1"),
        ("/v1/search", "reject-1"),
        ("/v1/likes", "short-1"),
    ] {
        let url = server.url(path);
        let first = tokio::spawn(send(order(&client, &url, ALICE, key, &body)));
        tokio::time::sleep(Duration::from_millis(150)).await;
        let t0 = Instant::now();
        let dup = send(order(&client, &url, ALICE, key, &body)).await;
        let waited = t0.elapsed();
        let first = first.await.unwrap();
        match path {
            ORDERS => {
                assert_eq!((dup.status, dup.replayed()), (201, true));
                assert_eq!(dup.body, first.body);
                assert!(waited >= Duration::from_millis(300), "waited {waited:?}");
                assert!(
                    waited < Duration::from_millis(1500),
                    "woken promptly: {waited:?}"
                );
            }
            "/v1/search" => {
                assert_eq!(dup.status, 409);
                assert!(
                    waited < Duration::from_millis(300),
                    "409 at once: {waited:?}"
                );
            }
            _ => {
                assert_eq!(dup.status, 409, "gave up after max_wait");
                assert_eq!(
                    dup.problem_type(),
                    ProblemKind::RequestInProgress.type_uri()
                );
                assert!(waited >= Duration::from_millis(150), "{waited:?}");
                assert!(waited < Duration::from_millis(450), "{waited:?}");
            }
        }
    }
    assert_eq!(server.handler.calls(), 3);
}

#[tokio::test]
async fn waiter_takes_over_when_the_owner_elsewhere_dies() {
    // The owner is "another process": a claim made directly in the store that nobody
    // finishes. The waiter must re-check at the lease deadline, take over and execute.
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(dir.path()).await;
    let server = start(store.clone(), wait_mode(Duration::from_secs(5))).await;
    let client = reqwest::Client::new();
    let body = json!({"z": 1});
    // First request executes normally, to learn the fingerprint it records...
    let first = send(order(&client, &server.url(ORDERS), ALICE, "probe", &body)).await;
    assert_eq!(first.status, 201);
    use idem_core::{Claim, ClaimRequest, IdempotencyStore, OwnerId};
    let probe = store.get(&scope("t1", "probe")).await.unwrap().unwrap();
    // ...then a foreign owner claims "orphan" with the same fingerprint and a short lease.
    let claim = store
        .claim(&ClaimRequest {
            scope: scope("t1", "orphan"),
            principal: probe.principal.clone(),
            fingerprint: probe.fingerprint,
            owner: OwnerId::new("other-process").unwrap(),
            lease: Duration::from_millis(400),
        })
        .await
        .unwrap();
    assert!(matches!(claim, Claim::Proceed(_)));
    let t0 = Instant::now();
    let r = send(order(&client, &server.url(ORDERS), ALICE, "orphan", &body)).await;
    assert_eq!(
        (r.status, r.replayed()),
        (201, false),
        "taken over and executed"
    );
    assert!(
        t0.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t0.elapsed()
    );
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    let record = store.get(&scope("t1", "orphan")).await.unwrap().unwrap();
    assert_eq!((record.state, record.attempts), (RecordState::Succeeded, 2));
}

#[tokio::test]
async fn handler_panic_leaves_the_key_retryable_and_never_runs_concurrently() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(dir.path()).await;
    let server = start(store.clone(), IdempotencyConfig::default()).await;
    server.handler.panics.store(1, Ordering::SeqCst);
    server.handler.set_delay(Duration::from_millis(50));
    let client = reqwest::Client::new();
    let url = server.url(ORDERS);
    let body = json!({"pay": 1});
    let first = send(order(&client, &url, ALICE, "pay:1", &body)).await;
    assert_eq!(first.status, 500);
    assert_eq!(
        first.problem_type(),
        ProblemKind::ExecutionFailed.type_uri()
    );
    use idem_core::IdempotencyStore;
    let record = store.get(&scope("t1", "pay:1")).await.unwrap().unwrap();
    assert_eq!(
        record.state,
        RecordState::FailedRetryable,
        "not stuck in PROCESSING"
    );
    let retry = send(order(&client, &url, ALICE, "pay:1", &body)).await;
    assert_eq!((retry.status, retry.replayed()), (201, false));
    let again = send(order(&client, &url, ALICE, "pay:1", &body)).await;
    assert_eq!((again.status, again.replayed()), (201, true));
    assert_eq!(again.body, retry.body);
    assert_eq!(server.handler.calls(), 2, "ran twice in total");
    assert_eq!(
        server.handler.max_in_flight.load(Ordering::SeqCst),
        1,
        "never concurrently"
    );
    assert_eq!(
        server
            .metrics
            .executions(ExecutionOutcome::Panicked, FinishedBy::Pipeline),
        1
    );
    let record = store.get(&scope("t1", "pay:1")).await.unwrap().unwrap();
    assert_eq!((record.state, record.attempts), (RecordState::Succeeded, 2));
}

#[tokio::test]
async fn execution_timeout_is_504_and_leaves_the_key_retryable() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(dir.path()).await;
    let server = start(
        store.clone(),
        IdempotencyConfig::default().execution_timeout(Duration::from_millis(200)),
    )
    .await;
    server.handler.set_delay(Duration::from_secs(2));
    let client = reqwest::Client::new();
    let url = server.url(ORDERS);
    let body = json!({"slow": true});
    let t0 = Instant::now();
    let r = send(order(&client, &url, ALICE, "slow-1", &body)).await;
    assert_eq!(r.status, 504);
    assert_eq!(r.problem_type(), ProblemKind::ExecutionTimeout.type_uri());
    assert!(t0.elapsed() < Duration::from_secs(1));
    use idem_core::IdempotencyStore;
    let record = store.get(&scope("t1", "slow-1")).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::FailedRetryable);
    assert_eq!(
        server.handler.completed.load(Ordering::SeqCst),
        0,
        "cancelled"
    );
    server.handler.set_delay(Duration::ZERO);
    let retry = send(order(&client, &url, ALICE, "slow-1", &body)).await;
    assert_eq!((retry.status, retry.replayed()), (201, false));
    assert_eq!(
        server
            .metrics
            .executions(ExecutionOutcome::TimedOut, FinishedBy::Pipeline),
        1
    );
}

#[tokio::test]
async fn client_disconnect_does_not_stop_the_record_reaching_its_final_state() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(dir.path()).await;
    let server = start(store.clone(), IdempotencyConfig::default()).await;
    server.handler.set_delay(Duration::from_millis(400));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let body = json!({"bye": 1});
    let gone = order(&client, &server.url(ORDERS), ALICE, "gone-1", &body)
        .send()
        .await;
    assert!(gone.unwrap_err().is_timeout(), "the client hung up");
    use idem_core::IdempotencyStore;
    eventually("the record is SUCCEEDED", async || {
        store
            .get(&scope("t1", "gone-1"))
            .await
            .unwrap()
            .is_some_and(|r| r.state == RecordState::Succeeded)
    })
    .await;
    assert_eq!(server.handler.completed.load(Ordering::SeqCst), 1);
    let patient = reqwest::Client::new();
    let r = send(order(&patient, &server.url(ORDERS), ALICE, "gone-1", &body)).await;
    assert_eq!((r.status, r.replayed()), (201, true));
    assert_eq!(server.handler.calls(), 1);
}

#[tokio::test]
async fn long_handlers_renew_their_lease() {
    // Lease 300 ms, handler 900 ms: without renewal a duplicate at 600 ms would take the
    // key over and run the handler a second time.
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        sqlite(dir.path()).await,
        IdempotencyConfig::default().lease(Duration::from_millis(300)),
    )
    .await;
    server.handler.set_delay(Duration::from_millis(900));
    let client = reqwest::Client::new();
    let url = server.url(ORDERS);
    let body = json!({"long": 1});
    let first = tokio::spawn(send(order(&client, &url, ALICE, "long-1", &body)));
    tokio::time::sleep(Duration::from_millis(600)).await;
    let dup = send(order(&client, &url, ALICE, "long-1", &body)).await;
    assert_eq!(dup.status, 409, "still owned by the first request");
    assert_eq!(first.await.unwrap().status, 201);
    assert_eq!(server.handler.calls(), 1);
}

#[tokio::test]
async fn responses_larger_than_the_capture_limit_reach_the_first_caller_in_full() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        sqlite(dir.path()).await,
        IdempotencyConfig::default().max_stored_body(1000),
    )
    .await;
    server.handler.big_body.store(300_000, Ordering::SeqCst);
    let client = reqwest::Client::new();
    let url = server.url(ORDERS);
    let first = send(order(&client, &url, ALICE, "big-resp", &json!({}))).await;
    assert_eq!((first.status, first.body.len()), (200, 300_000));
    let replay = send(order(&client, &url, ALICE, "big-resp", &json!({}))).await;
    assert_eq!((replay.status, replay.replayed()), (200, true));
    assert_eq!(replay.header("idempotent-body-omitted"), Some("true"));
    assert!(replay.body.is_empty());
    assert_eq!(server.handler.calls(), 1);
}

#[tokio::test]
async fn optional_and_ignored_routes() {
    let dir = tempfile::tempdir().unwrap();
    let config = IdempotencyConfig::default()
        .route(RouteRule::new("/v1/search").key(KeyRule::Ignored))
        .route(RouteRule::new("/v1/likes").key(KeyRule::Optional));
    let server = start(sqlite(dir.path()).await, config).await;
    let client = reqwest::Client::new();
    let body = json!({});
    // Ignored: no key, no auth needed, and a key changes nothing.
    for _ in 0..2 {
        let r = send(
            client
                .post(server.url("/v1/search"))
                .header("idempotency-key", "s")
                .json(&body),
        )
        .await;
        assert_eq!((r.status, r.replayed()), (201, false));
    }
    // Optional: without a key, plain; with one, idempotent.
    let plain = send(client.post(server.url("/v1/likes")).json(&body)).await;
    assert_eq!(plain.status, 201);
    let keyed = order(&client, &server.url("/v1/likes"), ALICE, "like-1", &body);
    assert_eq!(send(keyed).await.status, 201);
    let keyed = order(&client, &server.url("/v1/likes"), ALICE, "like-1", &body);
    assert!(send(keyed).await.replayed());
    assert_eq!(server.handler.calls(), 4);
}

#[tokio::test]
async fn a_more_specific_rule_listed_after_a_general_one_wins() {
    let dir = tempfile::tempdir().unwrap();
    let config = IdempotencyConfig::default()
        .route(RouteRule::new("/v1/*").key(KeyRule::Ignored))
        .route(RouteRule::new("/v1/orders").key(KeyRule::Required));
    let server = start(sqlite(dir.path()).await, config).await;
    let client = reqwest::Client::new();
    let body = json!({});
    // The general rule covers what the specific one does not.
    let search = send(client.post(server.url("/v1/search")).json(&body)).await;
    assert_eq!(search.status, 201);
    // The specific rule, although listed second, decides for its path.
    let orders = send(
        client
            .post(server.url("/v1/orders"))
            .bearer_auth(ALICE)
            .json(&body),
    )
    .await;
    assert_eq!(orders.status, 400, "{}", orders.problem_type());
    assert_eq!(server.handler.calls(), 1);
}

/// An app whose route has a path parameter, so its template (`/things/{id}/pay`) and its
/// concrete paths differ; it counts how often the handler ran.
struct Things {
    base: String,
    calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Things {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start_things(store: impl idem_core::IdempotencyStore) -> Things {
    use axum::extract::{Path, State};
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;
    let calls = Arc::new(AtomicUsize::new(0));
    let pay = |State(calls): State<Arc<AtomicUsize>>, Path(id): Path<String>| async move {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        axum::Json(json!({"paid": id, "execution": n}))
    };
    let router = axum::Router::new()
        .route("/things/{id}/pay", axum::routing::post(pay))
        .with_state(calls.clone())
        .layer(idem_http::IdempotencyLayer::new(store, auth()));
    let (base, task) = serve_router(router).await;
    Things { base, calls, task }
}

#[tokio::test]
async fn a_key_is_bound_to_the_concrete_path_not_the_route_template() {
    let dir = tempfile::tempdir().unwrap();
    let things = start_things(sqlite(dir.path()).await).await;
    let client = reqwest::Client::new();
    let pay = |path: &str| {
        order(
            &client,
            &format!("{}{path}", things.base),
            ALICE,
            "pay-k",
            &json!({}),
        )
    };
    let a = send(pay("/things/A/pay")).await;
    assert_eq!((a.status, a.replayed()), (200, false));
    assert_eq!(a.json()["paid"], "A");
    // Same key, same route template, another resource: refused, B is not "paid" by A's
    // stored answer.
    let b = send(pay("/things/B/pay")).await;
    assert_eq!(b.status, 422, "{:?}", b.body);
    assert_eq!(b.problem_type(), ProblemKind::KeyReused.type_uri());
    // The same resource, even with an escaped unreserved character, replays.
    for path in ["/things/A/pay", "/things/%41/pay"] {
        let again = send(pay(path)).await;
        assert_eq!((again.status, again.replayed()), (200, true), "{path}");
        assert_eq!(again.body, a.body, "{path}");
    }
    assert_eq!(
        things.calls.load(Ordering::SeqCst),
        1,
        "the handler ran once"
    );
}

#[tokio::test]
async fn the_query_is_part_of_the_fingerprint_in_canonical_order() {
    let dir = tempfile::tempdir().unwrap();
    let things = start_things(sqlite(dir.path()).await).await;
    let client = reqwest::Client::new();
    let pay = |query: &str| {
        let url = format!("{}/things/A/pay?{query}", things.base);
        order(&client, &url, ALICE, "query-k", &json!({}))
    };
    let first = send(pay("b=2&a=1")).await;
    assert_eq!((first.status, first.replayed()), (200, false));
    let reordered = send(pay("a=1&b=2")).await;
    assert_eq!((reordered.status, reordered.replayed()), (200, true));
    assert_eq!(reordered.body, first.body);
    let other = send(pay("a=2")).await;
    assert_eq!(other.status, 422);
    assert_eq!(other.problem_type(), ProblemKind::KeyReused.type_uri());
    assert_eq!(
        things.calls.load(Ordering::SeqCst),
        1,
        "the handler ran once"
    );
}

#[tokio::test]
async fn folded_lists_parameters_and_repeated_key_headers_are_400() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(sqlite(dir.path()).await, IdempotencyConfig::default()).await;
    let client = reqwest::Client::new();
    let url = server.url(ORDERS);
    // What a proxy makes of two header lines, and structured-field parameters.
    for bad in ["a,b", "a, b", "abc;x=1", "\"abc\";x=1", "\"a,b\""] {
        let r = send(order(&client, &url, ALICE, bad, &json!({}))).await;
        assert_eq!(r.status, 400, "{bad}");
        assert_eq!(
            r.problem_type(),
            ProblemKind::InvalidKey.type_uri(),
            "{bad}"
        );
    }
    let two_lines = client
        .post(&url)
        .bearer_auth(ALICE)
        .header("idempotency-key", "abc")
        .header("idempotency-key", "abc")
        .json(&json!({}));
    let r = send(two_lines).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.problem_type(), ProblemKind::InvalidKey.type_uri());
    assert_eq!(server.handler.calls(), 0);
    // The draft's sf-string form still names the plain key.
    let quoted = send(order(&client, &url, ALICE, "\"abc\"", &json!({}))).await;
    let plain = send(order(&client, &url, ALICE, "abc", &json!({}))).await;
    assert_eq!(
        (quoted.status, plain.status, plain.replayed()),
        (201, 201, true)
    );
    assert_eq!(server.handler.calls(), 1);
    assert_eq!(server.metrics.requests(Decision::InvalidKey), 6);
}

/// A POST with a key and a raw JSON body, sent as written.
fn raw_order(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    body: &str,
) -> reqwest::RequestBuilder {
    client
        .post(url)
        .bearer_auth(ALICE)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(body.to_owned())
}

#[tokio::test]
async fn integers_past_two_to_the_53_are_different_requests() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(sqlite(dir.path()).await, IdempotencyConfig::default()).await;
    let client = reqwest::Client::new();
    let url = server.url(ORDERS);
    let first = send(raw_order(
        &client,
        &url,
        "id-64",
        r#"{"amount":9007199254740993}"#,
    ))
    .await;
    assert_eq!((first.status, first.replayed()), (201, false));
    // One less: the same 64-bit float, another request. Refused, not replayed.
    let other = send(raw_order(
        &client,
        &url,
        "id-64",
        r#"{"amount":9007199254740992}"#,
    ))
    .await;
    assert_eq!(other.status, 422, "{:?}", other.body);
    assert_eq!(other.problem_type(), ProblemKind::KeyReused.type_uri());
    // The same number with other whitespace and member order is the same request.
    let again = send(raw_order(
        &client,
        &url,
        "id-64",
        "{ \"amount\" : 9007199254740993 }",
    ))
    .await;
    assert_eq!((again.status, again.replayed()), (201, true));
    assert_eq!(again.body, first.body);
    assert_eq!(server.handler.calls(), 1);
    assert_eq!(server.metrics.requests(Decision::Mismatch), 1);
}

#[tokio::test]
async fn a_json_body_naming_a_member_twice_is_400_and_nothing_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(dir.path()).await;
    let server = start(store.clone(), IdempotencyConfig::default()).await;
    let client = reqwest::Client::new();
    let url = server.url(ORDERS);
    for (key, body, pointer) in [
        ("dup-1", r#"{"q":1,"q":5}"#, "/q"),
        (
            "dup-2",
            r#"{"items":[{"sku":"a","qty":1,"qty":9}]}"#,
            "/items/0/qty",
        ),
        ("dup-3", r#"{"q":1,"\u0071":5}"#, "/q"),
    ] {
        let r = send(raw_order(&client, &url, key, body)).await;
        assert_eq!(r.status, 400, "{body}");
        assert_eq!(
            r.problem_type(),
            ProblemKind::DuplicateJsonMember.type_uri(),
            "{body}"
        );
        let detail = r.json()["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains(pointer), "{detail}");
        use idem_core::IdempotencyStore;
        assert_eq!(store.get(&scope("t1", key)).await.unwrap(), None);
    }
    assert_eq!(server.handler.calls(), 0);
    assert_eq!(server.metrics.requests(Decision::DuplicateMember), 3);
    // The key is free: the body with its member once executes.
    let ok = send(raw_order(&client, &url, "dup-1", r#"{"q":5}"#)).await;
    assert_eq!((ok.status, ok.replayed()), (201, false));
    // Invalid JSON under a JSON media type is hashed as bytes and reaches the handler.
    let broken = send(raw_order(&client, &url, "dup-4", r#"{"q":1,"q":5"#)).await;
    assert_eq!(broken.status, 201);
    // So does any body declared as something else.
    let text = client
        .post(&url)
        .bearer_auth(ALICE)
        .header("idempotency-key", "dup-5")
        .header("content-type", "text/plain")
        .body(r#"{"q":1,"q":5}"#);
    assert_eq!(send(text).await.status, 201);
    assert_eq!(server.handler.calls(), 3);
}

#[tokio::test]
async fn a_quoted_key_and_its_token_form_are_one_record() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(dir.path()).await;
    let server = start(store.clone(), IdempotencyConfig::default()).await;
    let client = reqwest::Client::new();
    let url = server.url(ORDERS);
    let body = json!({"q": 1});
    let quoted = send(order(&client, &url, ALICE, "\"k\"", &body)).await;
    assert_eq!((quoted.status, quoted.replayed()), (201, false));
    let token = send(order(&client, &url, ALICE, "k", &body)).await;
    assert_eq!((token.status, token.replayed()), (201, true));
    assert_eq!(token.body, quoted.body);
    assert_eq!(server.handler.calls(), 1);
    use idem_core::IdempotencyStore;
    let record = store.get(&scope("t1", "k")).await.unwrap().expect("record");
    assert_eq!(record.state, RecordState::Succeeded);
    // The quotes are the header's, not the key's.
    assert_eq!(store.get(&scope("t1", "\"k\"")).await.unwrap(), None);
}

#[tokio::test]
async fn a_response_future_dropped_unpolled_or_mid_claim_still_finishes_its_record() {
    use idem_core::IdempotencyStore;
    use tower::{Layer, Service};
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(dir.path()).await;
    let handler = std::sync::Arc::new(Handler::default());
    let layer = idem_http::IdempotencyLayer::new(store.clone(), auth());
    let mut svc = layer.layer(app(handler.clone()));
    let request = |key: &str| {
        http::Request::post(ORDERS)
            .header("authorization", format!("Bearer {ALICE}"))
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(axum::body::Body::from(r#"{"n":1}"#))
            .unwrap()
    };
    // Never polled: the work is detached whole.
    drop(svc.call(request("dropped-unpolled")));
    // Polled once (the work has started: authenticated, reading, claiming), then dropped.
    handler.set_delay(Duration::from_millis(200));
    let mut started = Box::pin(svc.call(request("dropped-mid-way")));
    assert!(futures::poll!(started.as_mut()).is_pending());
    drop(started);
    for key in ["dropped-unpolled", "dropped-mid-way"] {
        eventually(&format!("{key} reaches SUCCEEDED"), async || {
            store
                .get(&scope("t1", key))
                .await
                .unwrap()
                .is_some_and(|r| r.state == RecordState::Succeeded)
        })
        .await;
    }
    assert_eq!(handler.calls(), 2);
}
