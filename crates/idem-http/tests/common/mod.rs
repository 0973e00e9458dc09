//! Test harness: a real axum server on 127.0.0.1:0 with the layer over a real SQLite
//! store in a temporary directory, and a handler that counts what it does.
#![allow(dead_code)]

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Extension, Router};
use bytes::Bytes;
use idem_core::{
    Claim, ClaimRequest, ClaimToken, Finish, IdempotencyKey, IdempotencyStore, Millis, Principal,
    Record, Scope, StoreError, TenantId,
};
use idem_http::{BearerTokens, IdempotencyConfig, IdempotencyLayer, IdempotencyMetrics, Identity};
use idem_sqlite::SqliteStore;

pub const ALICE: &str = "alice-token"; // tenant t1
pub const BOB: &str = "bob-token"; // tenant t1
pub const CAROL: &str = "carol-token"; // tenant t2

pub fn identity(tenant: &str, principal: &str) -> Identity {
    Identity::new(
        TenantId::new(tenant).unwrap(),
        Principal::new(principal).unwrap(),
    )
}

pub fn auth() -> BearerTokens {
    BearerTokens::new()
        .with(ALICE, identity("t1", "alice"))
        .with(BOB, identity("t1", "bob"))
        .with(CAROL, identity("t2", "carol"))
}

pub fn scope(tenant: &str, key: &str) -> Scope {
    Scope::new(
        TenantId::new(tenant).unwrap(),
        IdempotencyKey::new(key).unwrap(),
    )
}

/// What the order handler did.
#[derive(Default)]
pub struct Handler {
    pub calls: AtomicUsize,
    pub in_flight: AtomicUsize,
    pub max_in_flight: AtomicUsize,
    pub completed: AtomicUsize,
    /// Each call sleeps this long before answering.
    pub delay_ms: AtomicU64,
    /// The next this-many calls panic (after the delay).
    pub panics: AtomicUsize,
    /// Respond with a body of this many bytes instead of JSON (0 = JSON).
    pub big_body: AtomicUsize,
}

impl Handler {
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
    pub fn set_delay(&self, d: Duration) {
        self.delay_ms.store(d.as_millis() as u64, Ordering::SeqCst);
    }
}

struct InFlight<'a>(&'a Handler);
impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// POST /v1/orders: a fresh order id per execution, so a second execution shows.
async fn create_order(
    State(h): State<Arc<Handler>>,
    identity: Option<Extension<Identity>>,
    headers: HeaderMap,
    body: Bytes,
) -> axum::response::Response {
    let n = h.calls.fetch_add(1, Ordering::SeqCst) + 1;
    let now = h.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    h.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let _guard = InFlight(&h);
    let delay = h.delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    if h.panics
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |p| p.checked_sub(1))
        .is_ok()
    {
        panic!("handler panics on purpose (call {n})");
    }
    h.completed.fetch_add(1, Ordering::SeqCst);
    let big = h.big_body.load(Ordering::SeqCst);
    if big > 0 {
        return (StatusCode::OK, vec![b'x'; big]).into_response();
    }
    let order_id = uuid::Uuid::now_v7().to_string();
    let order = serde_json::json!({
        "order_id": order_id,
        "execution": n,
        "tenant": identity.map(|Extension(i)| i.tenant.to_string()),
        "tenant_header": headers.get("x-tenant").and_then(|v| v.to_str().ok()),
        "request": serde_json::from_slice::<serde_json::Value>(&body).ok(),
    });
    (
        StatusCode::CREATED,
        [
            ("location", format!("/v1/orders/{order_id}")),
            ("x-not-replayed", "1".to_owned()),
        ],
        axum::Json(order),
    )
        .into_response()
}

pub fn app(handler: Arc<Handler>) -> Router {
    Router::new()
        .route("/v1/orders", post(create_order))
        .route("/v1/search", post(create_order))
        .route("/v1/likes", post(create_order))
        .route("/v1/orders/{id}", get(|| async { "an order" }))
        .with_state(handler)
}

pub struct Server {
    pub base: String,
    pub handler: Arc<Handler>,
    pub metrics: IdempotencyMetrics,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn serve_router(router: Router) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    (base, task)
}

/// The order app behind the layer.
pub async fn start(store: impl IdempotencyStore, config: IdempotencyConfig) -> Server {
    let handler = Arc::new(Handler::default());
    let metrics = IdempotencyMetrics::new();
    let layer = IdempotencyLayer::new(store, auth())
        .with_config(config)
        .with_metrics(metrics.clone());
    let (base, task) = serve_router(app(handler.clone()).layer(layer)).await;
    Server {
        base,
        handler,
        metrics,
        task,
    }
}

pub async fn sqlite(dir: &Path) -> SqliteStore {
    SqliteStore::open_path(dir.join("idem.db")).await.unwrap()
}

/// A POST with a key and bearer token.
pub fn order(
    client: &reqwest::Client,
    url: &str,
    token: &str,
    key: &str,
    body: &serde_json::Value,
) -> reqwest::RequestBuilder {
    client
        .post(url)
        .bearer_auth(token)
        .header("idempotency-key", key)
        .json(body)
}

pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub async fn from(r: reqwest::Response) -> Self {
        Self {
            status: r.status().as_u16(),
            headers: r.headers().clone(),
            body: r.bytes().await.unwrap(),
        }
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }
    /// The problem `type`, asserting the media type.
    pub fn problem_type(&self) -> String {
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "status {} body {:?}",
            self.status,
            String::from_utf8_lossy(&self.body)
        );
        self.json()["type"].as_str().unwrap().to_owned()
    }
}

pub async fn send(r: reqwest::RequestBuilder) -> Reply {
    Reply::from(r.send().await.unwrap()).await
}

/// A store whose outage can be switched on: every call then fails as unreachable. It
/// also counts the finishes it is asked for.
#[derive(Clone)]
pub struct SwitchableStore {
    pub inner: SqliteStore,
    pub down: Arc<AtomicBool>,
    pub finishes: Arc<AtomicUsize>,
    /// Claims made through this store (not those a handler makes in its transaction).
    pub claims: Arc<AtomicUsize>,
}

impl SwitchableStore {
    pub fn new(inner: SqliteStore) -> Self {
        Self {
            inner,
            down: Arc::default(),
            finishes: Arc::default(),
            claims: Arc::default(),
        }
    }
    fn check(&self) -> Result<(), StoreError> {
        if self.down.load(Ordering::SeqCst) {
            Err(StoreError::Unavailable("switched off by the test".into()))
        } else {
            Ok(())
        }
    }
}

#[async_trait]
impl IdempotencyStore for SwitchableStore {
    fn backend(&self) -> &'static str {
        "switchable-sqlite"
    }
    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        self.check()?;
        self.claims.fetch_add(1, Ordering::SeqCst);
        self.inner.claim(req).await
    }
    async fn finish(&self, token: &ClaimToken, finish: Finish) -> Result<Record, StoreError> {
        self.finishes.fetch_add(1, Ordering::SeqCst);
        self.check()?;
        self.inner.finish(token, finish).await
    }
    async fn extend_lease(
        &self,
        token: &ClaimToken,
        lease: Duration,
    ) -> Result<Millis, StoreError> {
        self.check()?;
        self.inner.extend_lease(token, lease).await
    }
    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        self.check()?;
        self.inner.get(scope).await
    }
    async fn unique_guard(&self) -> Result<bool, StoreError> {
        self.check()?;
        self.inner.unique_guard().await
    }
}

/// Waits (bounded) until `f` holds.
pub async fn eventually(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for: {what}");
}
