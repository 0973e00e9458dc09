//! The HTTP layer across the tiers: full replay, reconstructed replay (same order id,
//! marked), and after archiving a `410 idempotency-key-expired` instead of a second
//! execution.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Request, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use http::header::{CONTENT_TYPE, LOCATION};
use http_body_util::BodyExt;
use idem_core::{Principal, Record, TenantId, Tier};
use idem_http::{
    BearerTokens, IdempotencyLayer, Identity, ProblemKind, ReconstructResponse, Reconstructed,
};
use tower::ServiceExt;

use common::DAY;

/// The application: an order table, and a counter of executions.
#[derive(Default)]
struct Orders {
    executed: AtomicUsize,
    rows: Mutex<HashMap<String, String>>,
}

impl Orders {
    fn render(id: &str) -> String {
        format!("{{\"order_id\":\"{id}\",\"status\":\"PENDING_PAYMENT\"}}")
    }
}

async fn create(State(orders): State<Arc<Orders>>) -> impl IntoResponse {
    let n = orders.executed.fetch_add(1, Ordering::SeqCst) + 1;
    let id = format!("O-{n}");
    orders
        .rows
        .lock()
        .unwrap()
        .insert(id.clone(), Orders::render(&id));
    let mut h = HeaderMap::new();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(
        LOCATION,
        HeaderValue::from_str(&format!("/orders/{id}")).unwrap(),
    );
    (StatusCode::CREATED, h, Orders::render(&id))
}

struct Rebuild(Arc<Orders>);

#[async_trait]
impl ReconstructResponse for Rebuild {
    async fn reconstruct(
        &self,
        _tenant: &TenantId,
        result_ref: &str,
        _record: &Record,
    ) -> Result<Option<Reconstructed>, Box<dyn std::error::Error + Send + Sync>> {
        let id = result_ref.trim_start_matches("/orders/");
        Ok(self.0.rows.lock().unwrap().get(id).map(|body| {
            let mut headers = HeaderMap::new();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            headers.insert(LOCATION, HeaderValue::from_str(result_ref).unwrap());
            Reconstructed {
                headers,
                body: body.clone().into(),
            }
        }))
    }
}

async fn post_order(app: &Router, key: &str) -> (StatusCode, HeaderMap, String) {
    let req = Request::post("/orders")
        .header("authorization", "Bearer tok")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::from("{\"show\":\"S-204\",\"seats\":2}"))
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = res.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicates_get_the_right_answer_in_every_tier() {
    let env = common::sqlite().await;
    let orders = Arc::new(Orders::default());
    let auth = BearerTokens::new().with(
        "tok",
        Identity::new(
            TenantId::new("t1").unwrap(),
            Principal::new("u-7318").unwrap(),
        ),
    );
    let layer = IdempotencyLayer::from_arcs(env.store.clone(), Arc::new(auth))
        .with_reconstruction(Rebuild(orders.clone()))
        .with_archive(env.retention.clone() as Arc<dyn idem_core::ArchiveLookup>);
    let app = Router::new()
        .route("/orders", post(create))
        .with_state(orders.clone())
        .layer(layer);

    let (status, headers, first) = post_order(&app, "confirm-1").await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(headers.get("idempotent-replayed").is_none());

    // Short retry window: the stored response.
    let (status, headers, body) = post_order(&app, "confirm-1").await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::CREATED, first.as_str())
    );
    assert_eq!(headers["idempotent-replayed"], "true");
    assert!(headers.get("idempotent-reconstructed").is_none());

    // Async replay window: rebuilt from the order, same order id, marked.
    env.clock.advance(2 * DAY);
    assert_eq!(common::sweep(&env).await.moved(Tier::Retry), 1);
    let (status, headers, body) = post_order(&app, "confirm-1").await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::CREATED, first.as_str())
    );
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(headers["idempotent-reconstructed"], "true");
    assert_eq!(headers[LOCATION], "/orders/O-1");

    // Dispute window: still rebuilt.
    env.clock.advance(8 * DAY);
    assert_eq!(common::sweep(&env).await.moved(Tier::Replay), 1);
    let (status, headers, body) = post_order(&app, "confirm-1").await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::CREATED, first.as_str())
    );
    assert_eq!(headers["idempotent-reconstructed"], "true");

    // Archived: a clear "key expired", never a second execution — also on repeats.
    env.clock.advance(90 * DAY);
    assert_eq!(common::sweep(&env).await.moved(Tier::Dispute), 1);
    for _ in 0..2 {
        let (status, headers, body) = post_order(&app, "confirm-1").await;
        assert_eq!(status, StatusCode::GONE, "{body}");
        assert_eq!(headers[CONTENT_TYPE], "application/problem+json");
        let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(problem["type"], ProblemKind::KeyExpired.type_uri());
        assert!(problem["detail"].as_str().unwrap().contains("/orders/O-1"));
    }
    assert_eq!(
        orders.executed.load(Ordering::SeqCst),
        1,
        "exactly one execution"
    );

    // A new key is a new intent.
    let (status, _, body) = post_order(&app, "confirm-2").await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(body.contains("O-2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropped_response_without_reconstructor_is_not_executed_again() {
    let env = common::sqlite().await;
    let orders = Arc::new(Orders::default());
    let auth = BearerTokens::new().with(
        "tok",
        Identity::new(TenantId::new("t1").unwrap(), Principal::new("u-1").unwrap()),
    );
    let app = Router::new()
        .route("/orders", post(create))
        .with_state(orders.clone())
        .layer(IdempotencyLayer::from_arcs(
            env.store.clone(),
            Arc::new(auth),
        ));
    assert_eq!(post_order(&app, "k").await.0, StatusCode::CREATED);
    env.clock.advance(2 * DAY);
    common::sweep(&env).await;
    let (status, _, body) = post_order(&app, "k").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        body.contains("result-not-stored") && body.contains("/orders/O-1"),
        "{body}"
    );
    assert_eq!(orders.executed.load(Ordering::SeqCst), 1);
}
