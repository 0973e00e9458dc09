//! idem-stub: a stand-in business service, for the gateway's tests and benchmark.
//!
//! It mimics the authoritative layer the gateway sits in front of: keyed writes are
//! executed once per `(tenant, key)` (tenant from the gateway's tenant header), replayed
//! afterwards, answered 422 for a different payload; its
//! `GET /v1/idempotency-keys/{key}` answers the gateway's state query. A duplicate that
//! arrives while the first executes waits for it (up to 10 s) and replays. It counts every
//! call and every execution so tests can assert "one upstream call" and "executed once".
//!
//! | route | behaviour |
//! |---|---|
//! | `GET /ping` | `pong` |
//! | `* /echo…` | JSON of the method, path, headers and body size it received |
//! | `GET /stream?chunks=N&delay_ms=D` | N chunks, D ms apart |
//! | `POST /upload` | reads the body frame by frame (counted as they arrive), answers the size |
//! | `GET /slow?ms=D` | answers after D ms |
//! | `GET /v1/idempotency-keys/{key}` | the key's state: `{"state": "ABSENT"}` (404), `PROCESSING`, or `SUCCEEDED` with the stored response |
//! | `POST /v1/guarded` | 401 unless `Authorization: Bearer good`, then a business write |
//! | any other `POST`/`PUT`/`PATCH` | a business write: keyed by `Idempotency-Key` when present |
//!
//! It speaks plain HTTP/1.1 through hyper and depends on no idem crate, so the gateway is
//! tested against a service that shares none of its code. It is test tooling: it keeps
//! everything in memory, never persists, and must not grow into a real service.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, Notify};
use tokio_rustls::TlsAcceptor;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = http_body_util::combinators::BoxBody<Bytes, BoxError>;

fn full(bytes: impl Into<Bytes>) -> Body {
    http_body_util::Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

#[derive(Debug, Clone)]
enum BizState {
    Processing,
    Done { status: u16, body: Bytes },
}

enum Seen {
    Fresh,
    Mismatch,
    Processing,
    Done(u16, Bytes),
}

#[derive(Debug, Clone)]
struct BizRecord {
    payload: Bytes,
    state: BizState,
}

/// Counters and knobs of a running stub; shared with the test that started it.
#[derive(Debug)]
pub struct StubState {
    tenant_header: String,
    records: Mutex<HashMap<(String, String), BizRecord>>,
    calls: Mutex<HashMap<String, u64>>,
    executions: Mutex<HashMap<String, u64>>,
    total_calls: AtomicU64,
    total_executions: AtomicU64,
    state_queries: AtomicU64,
    upload_frames: AtomicU64,
    upload_notify: Notify,
    committed: Notify,
    /// Time a keyed execution takes before it commits.
    pub exec_delay_ms: AtomicU64,
    /// Delay after the commit, before the response (a slow or lost response).
    pub respond_delay_ms: AtomicU64,
    /// How many more executions get `respond_delay_ms` (then it stops applying).
    pub respond_delay_count: AtomicU64,
    /// Delay before a keyed call even looks at its record (a request stuck on the way).
    pub stall_ms: AtomicU64,
    /// How many more keyed calls stall.
    pub stall_count: AtomicU64,
}

impl StubState {
    /// Requests received for `key` (keyed writes only).
    pub fn calls(&self, key: &str) -> u64 {
        lock(&self.calls).get(key).copied().unwrap_or(0)
    }

    /// Times the business action ran for `key`.
    pub fn executions(&self, key: &str) -> u64 {
        lock(&self.executions).get(key).copied().unwrap_or(0)
    }

    pub fn total_calls(&self) -> u64 {
        self.total_calls.load(Ordering::SeqCst)
    }

    pub fn total_executions(&self) -> u64 {
        self.total_executions.load(Ordering::SeqCst)
    }

    pub fn state_queries(&self) -> u64 {
        self.state_queries.load(Ordering::SeqCst)
    }

    /// Body frames `POST /upload` has received so far.
    pub fn upload_frames(&self) -> u64 {
        self.upload_frames.load(Ordering::SeqCst)
    }

    /// Waits until `/upload` has received at least `n` frames.
    pub async fn wait_upload_frames(&self, n: u64) {
        loop {
            let notified = self.upload_notify.notified();
            if self.upload_frames() >= n {
                return;
            }
            notified.await;
        }
    }

    /// Makes the next `count` executions commit, then wait `delay` before responding.
    pub fn delay_responses(&self, delay: Duration, count: u64) {
        self.respond_delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
        self.respond_delay_count.store(count, Ordering::SeqCst);
    }

    /// Makes the next `count` keyed calls wait `delay` before they look at their record:
    /// to the gateway they time out with nothing recorded yet.
    pub fn stall_calls(&self, delay: Duration, count: u64) {
        self.stall_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
        self.stall_count.store(count, Ordering::SeqCst);
    }

    /// Every execution takes `delay` before it commits.
    pub fn delay_executions(&self, delay: Duration) {
        self.exec_delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Forgets every business record and per-key count, as a stub just started would
    /// hold none (the totals stay). A benchmark calls it between measured phases: each
    /// key adds to three maps, and a stub that has seen a few hundred thousand keys
    /// spends about twice the CPU per write, which would fall on whichever target runs
    /// last. The old maps are dropped on the caller's thread.
    pub fn forget(&self) {
        let records = std::mem::take(&mut *lock(&self.records));
        let calls = std::mem::take(&mut *lock(&self.calls));
        let executions = std::mem::take(&mut *lock(&self.executions));
        drop((records, calls, executions));
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A running stub.
pub struct Stub {
    pub addr: SocketAddr,
    https: bool,
    pub state: Arc<StubState>,
    stop: Option<oneshot::Sender<()>>,
}

impl Stub {
    /// Starts on `127.0.0.1:0`, trusting `tenant_header` for the tenant.
    pub async fn start(tenant_header: &str) -> std::io::Result<Stub> {
        Self::start_on("127.0.0.1:0".parse().expect("address"), tenant_header).await
    }

    pub async fn start_on(addr: SocketAddr, tenant_header: &str) -> std::io::Result<Stub> {
        Self::start_with(addr, tenant_header, None).await
    }

    /// Serves HTTPS on `127.0.0.1:0` with `tls`.
    pub async fn start_tls(tenant_header: &str, tls: TlsAcceptor) -> std::io::Result<Stub> {
        let addr = "127.0.0.1:0".parse().expect("address");
        Self::start_with(addr, tenant_header, Some(tls)).await
    }

    async fn start_with(
        addr: SocketAddr,
        tenant_header: &str,
        tls: Option<TlsAcceptor>,
    ) -> std::io::Result<Stub> {
        let https = tls.is_some();
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(StubState {
            tenant_header: tenant_header.to_ascii_lowercase(),
            records: Mutex::default(),
            calls: Mutex::default(),
            executions: Mutex::default(),
            total_calls: AtomicU64::new(0),
            total_executions: AtomicU64::new(0),
            state_queries: AtomicU64::new(0),
            upload_frames: AtomicU64::new(0),
            upload_notify: Notify::new(),
            committed: Notify::new(),
            exec_delay_ms: AtomicU64::new(0),
            respond_delay_ms: AtomicU64::new(0),
            respond_delay_count: AtomicU64::new(0),
            stall_ms: AtomicU64::new(0),
            stall_count: AtomicU64::new(0),
        });
        let (tx, mut rx) = oneshot::channel::<()>();
        let st = state.clone();
        tokio::spawn(async move {
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new()).keep_alive(true);
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        let _ = stream.set_nodelay(true);
                        let st = st.clone();
                        let service = service_fn(move |req| serve(st.clone(), req));
                        let http = http.clone();
                        let tls = tls.clone();
                        tokio::spawn(async move {
                            match tls {
                                None => {
                                    let _ = http.serve_connection(TokioIo::new(stream), service).await;
                                }
                                Some(tls) => {
                                    if let Ok(stream) = tls.accept(stream).await {
                                        let _ = http.serve_connection(TokioIo::new(stream), service).await;
                                    }
                                }
                            }
                        });
                    }
                    _ = &mut rx => break,
                }
            }
        });
        Ok(Stub {
            addr,
            https,
            state,
            stop: Some(tx),
        })
    }

    /// `http://ADDR`, or `https://localhost:PORT` when serving TLS (test certificates
    /// name `localhost`).
    pub fn url(&self) -> String {
        if self.https {
            format!("https://localhost:{}", self.addr.port())
        } else {
            format!("http://{}", self.addr)
        }
    }
}

impl Drop for Stub {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

fn json_response(status: StatusCode, v: serde_json::Value) -> Response<Body> {
    let mut r = Response::new(full(v.to_string()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn query_u64(req: &Request<Incoming>, name: &str) -> Option<u64> {
    req.uri().query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| v.parse().ok()).flatten()
    })
}

async fn serve(st: Arc<StubState>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let r = match (method.clone(), path.as_str()) {
        (Method::GET, "/ping") => Response::new(full("pong")),
        (_, p) if p.starts_with("/echo") || p.starts_with("/v1/echo") => echo(req).await,
        (Method::GET, "/stream") => stream(&req),
        (Method::POST, "/upload") => upload(&st, req).await,
        (Method::GET, "/slow") => {
            let ms = query_u64(&req, "ms").unwrap_or(1000);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Response::new(full("slow"))
        }
        (Method::GET, p) if p.starts_with("/v1/idempotency-keys/") => key_state(&st, &req, p),
        (Method::POST, "/v1/guarded")
            if req.headers().get(http::header::AUTHORIZATION)
                != Some(&HeaderValue::from_static("Bearer good")) =>
        {
            st.total_calls.fetch_add(1, Ordering::SeqCst);
            json_response(StatusCode::UNAUTHORIZED, json!({"error": "who are you"}))
        }
        (Method::POST | Method::PUT | Method::PATCH, _) => write(st, req).await,
        _ => json_response(StatusCode::NOT_FOUND, json!({"error": "not found"})),
    };
    Ok(r)
}

async fn echo(req: Request<Incoming>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let headers: serde_json::Map<String, serde_json::Value> = parts
        .headers
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_string(),
                json!(String::from_utf8_lossy(v.as_bytes())),
            )
        })
        .collect();
    json_response(
        StatusCode::OK,
        json!({
            "method": parts.method.as_str(),
            "path": parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/"),
            "headers": headers,
            "body_len": body.len(),
        }),
    )
}

fn stream(req: &Request<Incoming>) -> Response<Body> {
    let chunks = query_u64(req, "chunks").unwrap_or(3);
    let delay = Duration::from_millis(query_u64(req, "delay_ms").unwrap_or(100));
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(1);
    tokio::spawn(async move {
        for i in 0..chunks {
            if i > 0 {
                tokio::time::sleep(delay).await;
            }
            if tx
                .send(Ok(Frame::data(Bytes::from(format!("chunk-{i};")))))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    let body = http_body_util::StreamBody::new(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|f| (f, rx))
    }));
    Response::new(body.boxed())
}

async fn upload(st: &StubState, req: Request<Incoming>) -> Response<Body> {
    let mut body = req.into_body();
    let mut size = 0usize;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return json_response(StatusCode::BAD_REQUEST, json!({"error": "body broke"}));
        };
        if let Ok(data) = frame.into_data() {
            size += data.len();
            st.upload_frames.fetch_add(1, Ordering::SeqCst);
            st.upload_notify.notify_waiters();
        }
    }
    json_response(StatusCode::OK, json!({"received": size}))
}

/// The caller's partition: the gateway's tenant, and its principal when it sends one
/// (callers of one tenant keep their keys apart).
fn tenant(st: &StubState, req: &Request<Incoming>) -> String {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let tenant = header(st.tenant_header.as_str()).unwrap_or_else(|| "-".into());
    match header("x-idem-principal") {
        Some(p) if p != tenant => format!("{tenant}/{p}"),
        _ => tenant,
    }
}

fn key_state(st: &StubState, req: &Request<Incoming>, path: &str) -> Response<Body> {
    st.state_queries.fetch_add(1, Ordering::SeqCst);
    let key = percent_decode(path.trim_start_matches("/v1/idempotency-keys/"));
    let rec = lock(&st.records)
        .get(&(tenant(st, req), key.clone()))
        .cloned();
    match rec.map(|r| r.state) {
        None => json_response(
            StatusCode::NOT_FOUND,
            json!({"key": key, "state": "ABSENT"}),
        ),
        Some(BizState::Processing) => json_response(
            StatusCode::OK,
            json!({"key": key, "state": "PROCESSING", "retry_after_ms": 500}),
        ),
        Some(BizState::Done { status, body }) => json_response(
            StatusCode::OK,
            json!({
                "key": key,
                "state": "SUCCEEDED",
                "response": {
                    "status": status,
                    "headers": [["content-type", "application/json"]],
                    "body": String::from_utf8_lossy(&body),
                }
            }),
        ),
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
            if let Some(b) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A business write: executed once per (tenant, key). Runs in a task of its own, like
/// a transaction that completes whether or not the caller is still connected.
async fn write(st: Arc<StubState>, req: Request<Incoming>) -> Response<Body> {
    let key = req
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let tenant = tenant(&st, &req);
    let path = req.uri().path().to_string();
    let payload = req
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let task = tokio::spawn(async move { execute(&st, key, tenant, path, payload).await });
    task.await.unwrap_or_else(|_| {
        json_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"error": "panicked"}),
        )
    })
}

async fn execute(
    st: &StubState,
    key: Option<String>,
    tenant: String,
    path: String,
    payload: Bytes,
) -> Response<Body> {
    st.total_calls.fetch_add(1, Ordering::SeqCst);
    let Some(key) = key else {
        // No key: every call is a new intent (the incident's failure mode).
        st.total_executions.fetch_add(1, Ordering::SeqCst);
        return created(&tenant, None, &path, &payload);
    };
    *lock(&st.calls).entry(key.clone()).or_default() += 1;
    let stalled = st
        .stall_count
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if stalled {
        tokio::time::sleep(Duration::from_millis(st.stall_ms.load(Ordering::SeqCst))).await;
    }
    let scope = (tenant.clone(), key.clone());
    // A duplicate that arrives while the first executes waits for it (bounded), then
    // replays: the business layer's own coalescing.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let committed = st.committed.notified();
        tokio::pin!(committed);
        committed.as_mut().enable();
        let seen = {
            let mut records = lock(&st.records);
            match records.get(&scope) {
                Some(r) if r.payload != payload => Seen::Mismatch,
                Some(BizRecord {
                    state: BizState::Processing,
                    ..
                }) => Seen::Processing,
                Some(BizRecord {
                    state: BizState::Done { status, body },
                    ..
                }) => Seen::Done(*status, body.clone()),
                None => {
                    records.insert(
                        scope.clone(),
                        BizRecord {
                            payload: payload.clone(),
                            state: BizState::Processing,
                        },
                    );
                    Seen::Fresh
                }
            }
        };
        match seen {
            Seen::Fresh => break,
            Seen::Mismatch => {
                return json_response(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    json!({"error": "key reused with a different payload"}),
                )
            }
            Seen::Done(status, body) => {
                let mut r = Response::new(full(body));
                *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
                r.headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                r.headers_mut()
                    .insert("idempotent-replayed", HeaderValue::from_static("true"));
                return r;
            }
            Seen::Processing => {
                if tokio::time::timeout_at(deadline, committed).await.is_err() {
                    return json_response(StatusCode::CONFLICT, json!({"error": "in progress"}));
                }
            }
        }
    }
    st.total_executions.fetch_add(1, Ordering::SeqCst);
    *lock(&st.executions).entry(key.clone()).or_default() += 1;
    let exec = st.exec_delay_ms.load(Ordering::SeqCst);
    if exec > 0 {
        tokio::time::sleep(Duration::from_millis(exec)).await;
    }
    let body = response_body_of(&tenant, Some(&key), &path, &payload);
    if let Some(r) = lock(&st.records).get_mut(&scope) {
        r.state = BizState::Done {
            status: 201,
            body: body.clone(),
        };
    }
    st.committed.notify_waiters();
    // Committed; now maybe lose time before answering (the incident's 430 ms write
    // whose response never arrived).
    let delayed = st
        .respond_delay_count
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if delayed {
        let ms = st.respond_delay_ms.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let mut r = Response::new(full(body));
    *r.status_mut() = StatusCode::CREATED;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    // A session cookie for the caller whose request executed: it must never reach
    // another caller through a replay.
    if let Ok(v) = HeaderValue::from_str(&format!(
        "stub-session={}; HttpOnly",
        uuid::Uuid::new_v4().simple()
    )) {
        r.headers_mut().insert(http::header::SET_COOKIE, v);
    }
    r
}

fn response_body_of(tenant: &str, key: Option<&str>, path: &str, payload: &[u8]) -> Bytes {
    Bytes::from(
        json!({
            "order_id": format!("o-{}", uuid::Uuid::now_v7().simple()),
            "tenant": tenant,
            "key": key,
            "path": path,
            "payload_bytes": payload.len(),
        })
        .to_string(),
    )
}

fn created(tenant: &str, key: Option<&str>, path: &str, payload: &[u8]) -> Response<Body> {
    let mut r = Response::new(full(response_body_of(tenant, key, path, payload)));
    *r.status_mut() = StatusCode::CREATED;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn post(stub: &Stub, key: &str, body: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(stub.addr).await.unwrap();
        let req = format!(
            "POST /v1/orders HTTP/1.1\r\nhost: stub\r\nconnection: close\r\nx-idem-tenant: t\r\nidempotency-key: {key}\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn a_forgotten_key_executes_again_and_the_totals_stay() {
        let stub = Stub::start("x-idem-tenant").await.unwrap();
        assert!(post(&stub, "k1", "{}").await.starts_with("HTTP/1.1 201"));
        let again = post(&stub, "k1", "{}").await;
        assert!(again.contains("idempotent-replayed: true"), "{again}");
        assert_eq!(
            (stub.state.calls("k1"), stub.state.executions("k1")),
            (2, 1)
        );

        stub.state.forget();
        assert_eq!(
            (stub.state.calls("k1"), stub.state.executions("k1")),
            (0, 0)
        );
        // A different payload is no mismatch now: the record it would differ from is gone.
        let fresh = post(&stub, "k1", "{\"n\":1}").await;
        assert!(fresh.starts_with("HTTP/1.1 201"), "{fresh}");
        assert!(!fresh.contains("idempotent-replayed"), "{fresh}");
        assert_eq!(
            (stub.state.calls("k1"), stub.state.executions("k1")),
            (1, 1)
        );
        assert_eq!(
            (stub.state.total_calls(), stub.state.total_executions()),
            (3, 2)
        );
    }
}
