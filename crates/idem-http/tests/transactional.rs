//! Transactional mode: the handler writes its business row and finishes the claim in one
//! SQLite transaction; the layer must recognise it and not finish again.

mod common;

use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Router};
use common::*;
use idem_core::{IdempotencyStore, RecordState};
use idem_http::metrics::{ExecutionOutcome, FinishedBy};
use idem_http::{
    IdempotencyConfig, IdempotencyLayer, IdempotencyMetrics, Identity, TransactionalClaim,
};
use idem_sqlite::SqliteStore;
use serde_json::json;

/// `x-mode`: `mark` (finish in the transaction and tell the claim), `silent` (finish in
/// the transaction, tell nobody), `rollback` (finish in the transaction, then roll back
/// and fail).
async fn create_order(
    State(store): State<SqliteStore>,
    Extension(claim): Extension<TransactionalClaim>,
    Extension(identity): Extension<Identity>,
    request_headers: HeaderMap,
) -> Response {
    let mode = request_headers
        .get("x-mode")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("mark")
        .to_owned();
    let order_id = uuid::Uuid::now_v7().to_string();
    let body = serde_json::to_vec(&json!({"order_id": order_id})).unwrap();
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    let mut tx = store.begin().await.unwrap();
    sqlx::query("INSERT INTO orders (id, tenant) VALUES (?, ?)")
        .bind(&order_id)
        .bind(identity.tenant.as_str())
        .execute(&mut *tx)
        .await
        .unwrap();
    let finish = claim.finish_for(StatusCode::CREATED, &headers, &body);
    let record = store
        .finish_in_tx(&mut tx, claim.token(), finish)
        .await
        .unwrap();
    if mode == "rollback" {
        drop(tx);
        return (StatusCode::SERVICE_UNAVAILABLE, "payment provider down").into_response();
    }
    tx.commit().await.unwrap();
    if mode == "mark" {
        claim.finished_in_transaction(record);
    }
    (StatusCode::CREATED, headers, body).into_response()
}

struct Setup {
    _dir: tempfile::TempDir,
    store: SqliteStore,
    /// The layer's view of the store, counting the finishes the layer makes.
    layer_store: SwitchableStore,
    url: String,
    metrics: IdempotencyMetrics,
    _task: tokio::task::JoinHandle<()>,
}

async fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(dir.path()).await;
    sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY, tenant TEXT NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let metrics = IdempotencyMetrics::new();
    let layer_store = SwitchableStore::new(store.clone());
    let app = Router::new()
        .route("/v1/orders", post(create_order))
        .with_state(store.clone())
        .layer(
            IdempotencyLayer::new(layer_store.clone(), auth())
                .with_config(IdempotencyConfig::default())
                .with_metrics(metrics.clone()),
        );
    let (base, task) = serve_router(app).await;
    Setup {
        _dir: dir,
        store,
        layer_store,
        url: format!("{base}/v1/orders"),
        metrics,
        _task: task,
    }
}

async fn orders(store: &SqliteStore) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM orders")
        .fetch_one(store.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn handler_finishes_in_its_transaction_and_the_layer_does_not_finish_again() {
    let setup = setup().await;
    let Setup {
        store,
        layer_store,
        url,
        metrics,
        ..
    } = &setup;
    let client = reqwest::Client::new();
    // Told: the layer does not even try. Not told: its finish loses the compare-and-set,
    // and it recognises the handler's own finish instead of reporting an error.
    for (key, mode, layer_finishes) in [("tx-mark", "mark", 0), ("tx-silent", "silent", 1)] {
        layer_store.finishes.store(0, Ordering::SeqCst);
        let first =
            send(order(&client, url, ALICE, key, &json!({"a": 1})).header("x-mode", mode)).await;
        assert_eq!((first.status, first.replayed()), (201, false), "{mode}");
        assert!(first.header("idempotency-expires").is_some(), "{mode}");
        let replay =
            send(order(&client, url, ALICE, key, &json!({"a": 1})).header("x-mode", mode)).await;
        assert_eq!((replay.status, replay.replayed()), (201, true), "{mode}");
        assert_eq!(replay.body, first.body, "{mode}");
        let record = store.get(&scope("t1", key)).await.unwrap().unwrap();
        // Claim wrote version 1, the handler's finish version 2; nothing after.
        assert_eq!(
            (record.state, record.version),
            (RecordState::Succeeded, 2),
            "{mode}"
        );
        assert_eq!(
            layer_store.finishes.load(Ordering::SeqCst),
            layer_finishes,
            "{mode}"
        );
    }
    assert_eq!(orders(store).await, 2, "one business row per intent");
    assert_eq!(
        metrics.executions(ExecutionOutcome::Succeeded, FinishedBy::Handler),
        2
    );
    assert_eq!(
        metrics.executions(ExecutionOutcome::Succeeded, FinishedBy::Pipeline),
        0
    );
    assert_eq!(metrics.finish_errors(), 0);
}

#[tokio::test]
async fn a_rolled_back_transaction_leaves_the_key_retryable() {
    let setup = setup().await;
    let Setup {
        store,
        url,
        metrics,
        ..
    } = &setup;
    let client = reqwest::Client::new();
    let failed =
        send(order(&client, url, ALICE, "tx-rb", &json!({})).header("x-mode", "rollback")).await;
    assert_eq!(failed.status, 503);
    assert_eq!(
        orders(store).await,
        0,
        "the business row rolled back with the finish"
    );
    let record = store.get(&scope("t1", "tx-rb")).await.unwrap().unwrap();
    assert_eq!(
        record.state,
        RecordState::FailedRetryable,
        "the layer finished it"
    );
    assert_eq!(
        metrics.executions(ExecutionOutcome::FailedRetryable, FinishedBy::Pipeline),
        1
    );
    let retry = send(order(&client, url, ALICE, "tx-rb", &json!({}))).await;
    assert_eq!((retry.status, retry.replayed()), (201, false));
    assert_eq!(orders(store).await, 1);
}

// ---------------------------------------------------------------------------------------
// In-transaction routes: the handler claims inside its business transaction.

/// `x-mode`: `claim` (claim in the transaction, write, finish, commit), `refuse` (answer
/// 422 before writing anything), `ignore` (write and answer 201 without claiming).
async fn create_in_tx(
    State(store): State<SqliteStore>,
    Extension(claim): Extension<TransactionalClaim>,
    Extension(identity): Extension<Identity>,
    request_headers: HeaderMap,
) -> Response {
    let mode = request_headers
        .get("x-mode")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("claim")
        .to_owned();
    if mode == "refuse" {
        return (StatusCode::UNPROCESSABLE_ENTITY, "no such show").into_response();
    }
    let order_id = uuid::Uuid::now_v7().to_string();
    let body = serde_json::to_vec(&json!({"order_id": order_id})).unwrap();
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    let mut tx = store.begin().await.unwrap();
    if mode == "claim" {
        let req = claim
            .deferred_request()
            .expect("an in-transaction route")
            .clone();
        match store.claim_in_tx(&mut tx, &req).await.unwrap() {
            idem_core::Claim::Proceed(token) => claim.claimed(token),
            other => {
                claim.answered(other);
                return StatusCode::CONFLICT.into_response();
            }
        }
    }
    sqlx::query("INSERT INTO orders (id, tenant) VALUES (?, ?)")
        .bind(&order_id)
        .bind(identity.tenant.as_str())
        .execute(&mut *tx)
        .await
        .unwrap();
    if mode == "claim" {
        let finish = claim.finish_for(StatusCode::CREATED, &headers, &body);
        let record = store
            .finish_in_tx(&mut tx, claim.token(), finish)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        claim.finished_in_transaction(record);
    } else {
        tx.commit().await.unwrap();
    }
    (StatusCode::CREATED, headers, body).into_response()
}

async fn setup_in_tx() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(dir.path()).await;
    sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY, tenant TEXT NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let metrics = IdempotencyMetrics::new();
    let layer_store = SwitchableStore::new(store.clone());
    let config = IdempotencyConfig::default()
        .route(idem_http::RouteRule::new("/v1/orders").claim(idem_http::ClaimMode::InTransaction));
    let app = Router::new()
        .route("/v1/orders", post(create_in_tx))
        .with_state(store.clone())
        .layer(
            IdempotencyLayer::new(layer_store.clone(), auth())
                .with_config(config)
                .with_metrics(metrics.clone()),
        );
    let (base, task) = serve_router(app).await;
    Setup {
        _dir: dir,
        store,
        layer_store,
        url: format!("{base}/v1/orders"),
        metrics,
        _task: task,
    }
}

/// One commit per create: the layer neither claims nor finishes; eight concurrent
/// duplicates make one order and seven replays of its body; a different body under the
/// key is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_in_transaction_route_claims_and_finishes_in_the_handlers_commit() {
    let setup = setup_in_tx().await;
    let Setup {
        store,
        layer_store,
        url,
        ..
    } = &setup;
    let client = reqwest::Client::new();
    for round in 0..5 {
        let key = format!("one-commit-{round}");
        let replies = futures::future::join_all(
            (0..8).map(|_| send(order(&client, url, ALICE, &key, &json!({"a": 1})))),
        )
        .await;
        let statuses: Vec<u16> = replies.iter().map(|r| r.status).collect();
        assert!(statuses.iter().all(|&s| s == 201), "{statuses:?}");
        assert_eq!(replies.iter().filter(|r| r.replayed()).count(), 7);
        assert!(replies.iter().all(|r| r.body == replies[0].body));
        let record = store.get(&scope("t1", &key)).await.unwrap().unwrap();
        assert_eq!(record.state, RecordState::Succeeded);
        let mismatch = send(order(&client, url, ALICE, &key, &json!({"a": 2}))).await;
        assert_eq!(mismatch.status, 422);
    }
    assert_eq!(orders(store).await, 5, "one order per key");
    assert_eq!(
        layer_store.claims.load(Ordering::SeqCst),
        0,
        "the layer never claimed"
    );
    assert_eq!(layer_store.finishes.load(Ordering::SeqCst), 0);
}

/// A handler that refuses before writing, or that (against the contract) writes without
/// claiming: the layer claims after it and records its answer, so a retry replays it.
#[tokio::test]
async fn without_a_claim_in_the_transaction_the_layer_records_the_answer() {
    let setup = setup_in_tx().await;
    let Setup {
        store,
        layer_store,
        url,
        ..
    } = &setup;
    let client = reqwest::Client::new();
    let refused =
        || order(&client, url, ALICE, "refused", &json!({"a": 1})).header("x-mode", "refuse");
    let first = send(refused()).await;
    assert_eq!((first.status, first.replayed()), (422, false));
    let again = send(order(&client, url, ALICE, "refused", &json!({"a": 1}))).await;
    assert_eq!(
        (again.status, again.replayed()),
        (422, true),
        "the refusal is the key's answer"
    );
    let record = store.get(&scope("t1", "refused")).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::FailedTerminal);

    let ignored =
        send(order(&client, url, ALICE, "ignored", &json!({"a": 1})).header("x-mode", "ignore"))
            .await;
    assert_eq!((ignored.status, ignored.replayed()), (201, false));
    // The retry's claim in its transaction finds the recorded answer.
    let replay = send(order(&client, url, ALICE, "ignored", &json!({"a": 1}))).await;
    assert_eq!((replay.status, replay.replayed()), (201, true));
    assert_eq!(replay.body, ignored.body);
    assert_eq!(orders(store).await, 1);
    assert_eq!(
        layer_store.claims.load(Ordering::SeqCst),
        2,
        "one claim after each handler"
    );
}
