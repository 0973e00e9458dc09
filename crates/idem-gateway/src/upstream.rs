//! Talking to the upstream: pass-through streaming, buffered keyed exchanges that say
//! whether their outcome is known, and the key state query.
//!
//! Owns the HTTP client (one pooled hyper client per gateway), URL building and the
//! classification of failures: a request that never reached the upstream
//! ([`Exchange::NotSent`]) is safe to report as such; one that timed out or broke after
//! it was sent ([`Exchange::Uncertain`]) may have taken effect. It never decides what to
//! do about an uncertain result; the keyed flow does.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT, CONTENT_LENGTH, HOST};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use serde_json::Value;

use crate::body::{empty, full, read_limited, Body};
use crate::error::GatewayError;
use crate::h1::{Failed, Head};
use crate::hop::{is_hop_by_hop, strip_hop_by_hop};
use crate::pool::{Pool, PooledBody, SendError};

/// The upstream's base URL, split for fast URI building.
#[derive(Debug, Clone)]
pub struct UpstreamBase {
    authority: Authority,
    /// `https://`: connections are TLS, verified for the authority's host.
    https: bool,
    /// Path prefix without a trailing slash (`""` or `/api`).
    prefix: String,
}

impl UpstreamBase {
    pub fn parse(url: &str) -> Result<Self, GatewayError> {
        let bad = |why: &str| Err(GatewayError::Config(format!("upstream {url:?}: {why}")));
        let uri: Uri = match url.parse() {
            Ok(u) => u,
            Err(e) => return bad(&e.to_string()),
        };
        let https = match uri.scheme() {
            Some(s) if *s == Scheme::HTTP => false,
            Some(s) if *s == Scheme::HTTPS => true,
            _ => return bad("an upstream URL starts with http:// or https://"),
        };
        let Some(authority) = uri.authority().cloned() else {
            return bad("no host");
        };
        if uri.query().is_some() {
            return bad("no query string allowed");
        }
        let prefix = uri.path().trim_end_matches('/').to_string();
        Ok(Self {
            authority,
            https,
            prefix,
        })
    }

    /// The upstream request target (origin form) for a request's path and query.
    pub fn uri(&self, path_and_query: &str) -> Uri {
        let pq = if self.prefix.is_empty() {
            PathAndQuery::try_from(path_and_query)
        } else {
            PathAndQuery::try_from(format!("{}{}", self.prefix, path_and_query))
        }
        .unwrap_or_else(|_| PathAndQuery::from_static("/"));
        Uri::from(pq)
    }

    /// The upstream request target for a client's request URI; reuses it when it is
    /// already in origin form and there is no prefix (the common case, no copy).
    pub fn target(&self, uri: &Uri) -> Uri {
        if self.prefix.is_empty() && uri.scheme().is_none() && uri.authority().is_none() {
            return uri.clone();
        }
        self.uri(uri.path_and_query().map_or("/", |p| p.as_str()))
    }

    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    pub fn is_https(&self) -> bool {
        self.https
    }
}

/// A complete upstream response, headers already free of hop-by-hop fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Captured {
    /// Rebuilds a response from a stored one (a record's or a state query's result).
    pub fn from_stored(r: &idem_core::StoredResult) -> Option<Self> {
        let status = StatusCode::from_u16(r.status).ok()?;
        let mut headers = HeaderMap::new();
        for (n, v) in &r.headers {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(n.as_bytes()),
                HeaderValue::from_str(v),
            ) {
                if !is_hop_by_hop(&n) && n != CONTENT_LENGTH {
                    headers.append(n, v);
                }
            }
        }
        Some(Self {
            status,
            headers,
            body: Bytes::copy_from_slice(&r.body),
        })
    }

    /// The form kept in the window, without the headers that belong to one caller.
    pub fn to_stored(&self, per_caller: &[HeaderName]) -> idem_core::StoredResult {
        idem_core::StoredResult {
            status: self.status.as_u16(),
            headers: self
                .headers
                .iter()
                .filter(|(n, _)| **n != CONTENT_LENGTH && !per_caller.contains(n))
                .filter_map(|(n, v)| Some((n.as_str().to_string(), v.to_str().ok()?.to_string())))
                .collect(),
            body: self.body.to_vec(),
            result_ref: None,
        }
    }

    pub fn to_response(&self) -> Response<Body> {
        Self {
            status: self.status,
            headers: self.headers.clone(),
            body: self.body.clone(),
        }
        .into_response()
    }

    pub fn into_response(self) -> Response<Body> {
        let mut r = Response::new(full(self.body));
        *r.status_mut() = self.status;
        *r.headers_mut() = self.headers;
        r
    }
}

/// How a buffered (keyed) exchange ended.
#[derive(Debug)]
pub enum Exchange {
    /// The upstream answered in full.
    Complete(Captured),
    /// The request never reached the upstream (connection refused, DNS, connect timeout).
    NotSent(String),
    /// The upstream answered with more than the gateway buffers. It did execute.
    TooLarge,
    /// Timed out, or the connection broke after the request was sent: it may have taken
    /// effect.
    Uncertain(String),
}

/// How a pass-through exchange failed.
#[derive(Debug)]
pub enum PassError {
    NotSent(String),
    Timeout,
    /// The client's streamed body stalled (see [`crate::body::IdleTimeout`]).
    ClientStalled,
    Failed(String),
}

/// What the upstream says about a key (its business record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyState {
    /// The intent ended (succeeded, or failed for good); this is its stored response.
    Done(Captured),
    /// Still executing.
    Processing { retry_after: Option<Duration> },
    /// Never arrived, or failed in a way that allows a retry under the same key.
    Absent,
}

/// The gateway's HTTP client to its upstream.
#[derive(Clone)]
pub struct Upstream {
    base: UpstreamBase,
    pool: Arc<Pool>,
    host: HeaderValue,
    timeout: Duration,
    max_response_bytes: usize,
}

impl Upstream {
    /// `tls` is the client configuration for an `https://` base (ignored for `http://`).
    pub fn new(
        base: UpstreamBase,
        tls: Option<Arc<rustls::ClientConfig>>,
        connect_timeout: Duration,
        idle_timeout: Duration,
        timeout: Duration,
        max_response_bytes: usize,
    ) -> Result<Self, GatewayError> {
        let host = HeaderValue::from_str(base.authority.as_str())
            .expect("an authority is a valid header value");
        let tls = match (base.https, tls) {
            (false, _) => None,
            (true, Some(config)) => Some(config),
            (true, None) => Some(
                idem_net::tls::client_config(None, true)
                    .map_err(|e| GatewayError::Config(format!("upstream TLS: {e}")))?,
            ),
        };
        let pool = Pool::new(
            base.authority.clone(),
            tls,
            connect_timeout,
            idle_timeout,
            1024,
        )?;
        Ok(Self {
            pool: Arc::new(pool),
            base,
            host,
            timeout,
            max_response_bytes,
        })
    }

    pub fn base(&self) -> &UpstreamBase {
        &self.base
    }

    /// The `Host` this upstream gets.
    pub fn host(&self) -> &HeaderValue {
        &self.host
    }

    /// Sends `req` (origin-form target, Host set by the caller) within the timeout.
    async fn send(
        &self,
        req: Request<Body>,
    ) -> Result<
        Result<
            (
                Response<hyper::body::Incoming>,
                hyper::client::conn::http1::SendRequest<Body>,
            ),
            SendError,
        >,
        tokio::time::error::Elapsed,
    > {
        tokio::time::timeout(self.timeout, self.pool.send(req)).await
    }

    /// Streams a request through: the body is not buffered; the response head must
    /// arrive within the timeout, the response body then streams back.
    pub async fn pass(&self, mut req: Request<Body>) -> Result<Response<Body>, PassError> {
        req.headers_mut().insert(HOST, self.host.clone());
        match self.send(req).await {
            Err(_) => Err(PassError::Timeout),
            Ok(Err(SendError::NotSent(e))) => Err(PassError::NotSent(e)),
            Ok(Err(SendError::Failed(e))) if caused_by_idle_body(&e) => {
                Err(PassError::ClientStalled)
            }
            Ok(Err(SendError::Failed(e))) => Err(PassError::Failed(error_chain(&e))),
            Ok(Ok((resp, sender))) => {
                let (mut parts, incoming) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                let body = PooledBody::new(incoming, sender, self.pool.clone());
                Ok(Response::from_parts(parts, body.boxed_unsync()))
            }
        }
    }

    /// Sends a buffered request and buffers the response, all within the timeout, on
    /// the buffered client's own connections ([`crate::h1`]): no connection task, no
    /// copy of the headers.
    pub async fn exchange(
        &self,
        method: &Method,
        path_and_query: &str,
        headers: &HeaderMap,
        set: &[(HeaderName, HeaderValue)],
        body: Bytes,
    ) -> Exchange {
        let head = Head {
            method,
            prefix: &self.base.prefix,
            path_and_query,
            host: &self.host,
        };
        // One timer covers the head and the body.
        let run = async {
            let mut conn = match self.pool.checkout_conn() {
                Some(conn) => conn,
                // Boxed: connecting is a large state machine that only a request without
                // an idle connection needs.
                None => match Box::pin(self.pool.connect_conn()).await {
                    Ok(conn) => conn,
                    Err(e) => return Exchange::NotSent(e),
                },
            };
            match conn
                .exchange(&head, headers, set, &body, self.max_response_bytes)
                .await
            {
                Ok((captured, reusable)) => {
                    if reusable {
                        self.pool.checkin_conn(conn);
                    }
                    Exchange::Complete(captured)
                }
                Err(Failed::TooLarge) => Exchange::TooLarge,
                Err(Failed::Broken(why)) => Exchange::Uncertain(why),
            }
        };
        match tokio::time::timeout(self.timeout, run).await {
            Ok(x) => x,
            Err(_) => Exchange::Uncertain(format!(
                "no complete response within {} ms",
                self.timeout.as_millis()
            )),
        }
    }

    /// Asks the upstream for a key's state: `method path` with `{key}` replaced by the
    /// percent-encoded key, carrying the same identity headers as the request.
    ///
    /// Boxed: the rare state query must not grow the future of every keyed request that
    /// could make one.
    pub fn query_state<'a>(
        &'a self,
        method: &'a Method,
        path_template: &'a str,
        key: &'a str,
        identity_headers: &'a HeaderMap,
        timeout: Duration,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<KeyState, StateError>> + Send + 'a>,
    > {
        Box::pin(async move {
            let path = path_template.replace("{key}", &percent_encode(key));
            let mut req = Request::new(empty());
            *req.method_mut() = method.clone();
            *req.uri_mut() = self.base.uri(&path);
            *req.headers_mut() = identity_headers.clone();
            req.headers_mut()
                .insert(ACCEPT, HeaderValue::from_static("application/json"));
            req.headers_mut().insert(HOST, self.host.clone());
            let run = async {
                let (resp, sender) = self.pool.send(req).await.map_err(|e| match e {
                    SendError::NotSent(e) => e,
                    SendError::Failed(e) => error_chain(&e),
                })?;
                let status = resp.status();
                let body = read_limited(resp.into_body(), self.max_response_bytes, Duration::MAX)
                    .await
                    .map_err(|e| format!("state response body: {e:?}"))?;
                self.pool.checkin(sender);
                Ok::<_, String>((status, body))
            };
            let (status, body) = tokio::time::timeout(timeout, run)
                .await
                .map_err(|_| format!("no state answer within {} ms", timeout.as_millis()))
                .and_then(|r| r)
                .map_err(StateError::NoAnswer)?;
            // A 404 counts only with a state in its body: a 404 from a service without the
            // endpoint must not pass for "absent" (that would license a re-send).
            if !status.is_success() && status != StatusCode::NOT_FOUND {
                return Err(StateError::Answered(format!(
                    "state query answered {status}"
                )));
            }
            parse_key_state(&body)
                .map_err(|e| StateError::Answered(format!("state query answered {status}: {e}")))
        })
    }
}

/// Why a key state query has no state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateError {
    /// The upstream did not answer (connect failure, timeout, broken connection).
    NoAnswer(String),
    /// It answered, but not with a state.
    Answered(String),
}

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateError::NoAnswer(why) | StateError::Answered(why) => f.write_str(why),
        }
    }
}

/// A URL for logs and metric labels: any `user:password@` dropped.
pub fn without_userinfo(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let end = rest.find('/').unwrap_or(rest.len());
            match rest[..end].rfind('@') {
                Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
                None => url.to_string(),
            }
        }
        None => url.to_string(),
    }
}

/// Parses a state endpoint's JSON. Accepted shapes (field names case-insensitive in
/// values, not in names):
///
/// ```json
/// {"state": "SUCCEEDED", "response": {"status": 201, "headers": [["content-type", "application/json"]], "body": "{\"order_id\":\"o-1\"}"}}
/// {"state": "PROCESSING", "retry_after_ms": 500}
/// {"state": "ABSENT"}
/// ```
///
/// `response` may also be called `result` (an idem-core `Record` serialised as JSON
/// fits), `headers` may be an object, and the body may be `body` (text, or an array of
/// bytes as idem-core's `StoredResult` serialises it) or `body_json` (any JSON value).
/// `FAILED_TERMINAL` counts as done; `FAILED_RETRYABLE` and `NOT_FOUND` as absent.
pub fn parse_key_state(body: &[u8]) -> Result<KeyState, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("state JSON: {e}"))?;
    let state = v
        .get("state")
        .and_then(Value::as_str)
        .ok_or("state JSON has no \"state\"")?
        .to_ascii_uppercase();
    match state.as_str() {
        "SUCCEEDED" | "FAILED_TERMINAL" | "COMPLETED" | "DONE" => {
            let r = v
                .get("response")
                .or_else(|| v.get("result"))
                .filter(|r| !r.is_null())
                .ok_or("a finished key's state has no response")?;
            parse_response(r).map(KeyState::Done)
        }
        "PROCESSING" | "IN_PROGRESS" => Ok(KeyState::Processing {
            retry_after: v
                .get("retry_after_ms")
                .and_then(Value::as_u64)
                .map(Duration::from_millis),
        }),
        "ABSENT" | "NOT_FOUND" | "FAILED_RETRYABLE" => Ok(KeyState::Absent),
        other => Err(format!("unknown key state {other:?}")),
    }
}

fn parse_response(r: &Value) -> Result<Captured, String> {
    let status = r
        .get("status")
        .and_then(Value::as_u64)
        .and_then(|s| u16::try_from(s).ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .ok_or("stored response has no valid status")?;
    let mut headers = HeaderMap::new();
    let mut add = |n: &str, v: &str| {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(n.as_bytes()),
            HeaderValue::from_str(v),
        ) {
            if !is_hop_by_hop(&n) && n != CONTENT_LENGTH {
                headers.append(n, v);
            }
        }
    };
    match r.get("headers") {
        Some(Value::Array(pairs)) => {
            for p in pairs {
                if let (Some(n), Some(v)) = (
                    p.get(0).and_then(Value::as_str),
                    p.get(1).and_then(Value::as_str),
                ) {
                    add(n, v);
                }
            }
        }
        Some(Value::Object(map)) => {
            for (n, v) in map {
                if let Some(v) = v.as_str() {
                    add(n, v);
                }
            }
        }
        _ => {}
    }
    let body = match (r.get("body"), r.get("body_json")) {
        (Some(Value::String(s)), _) => Bytes::from(s.clone().into_bytes()),
        (Some(Value::Array(bytes)), _) => bytes
            .iter()
            .map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
            .collect::<Option<Vec<u8>>>()
            .map(Bytes::from)
            .ok_or("stored body array is not bytes")?,
        (_, Some(json)) => Bytes::from(serde_json::to_vec(json).unwrap_or_default()),
        _ => Bytes::new(),
    };
    Ok(Captured {
        status,
        headers,
        body,
    })
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn caused_by_idle_body(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.is::<crate::body::BodyIdle>() {
            return true;
        }
        cur = err.source();
    }
    false
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every keyed request's task carries these futures and tokio copies a task's
    /// future as it spawns and polls it: the rare paths (a new connection, a state
    /// query) are boxed so they do not make every request's copy large.
    #[tokio::test]
    async fn the_common_exchange_does_not_carry_the_rare_paths() {
        let base = UpstreamBase::parse("http://127.0.0.1:9").unwrap();
        let one_s = Duration::from_secs(1);
        let up = Upstream::new(base, None, one_s, one_s, one_s, 1024).unwrap();
        let h = HeaderMap::new();
        let exchange = up.exchange(&Method::POST, "/v1", &h, &[], Bytes::new());
        let state = up.query_state(&Method::GET, "/k/{key}", "k", &h, one_s);
        let send = up.pool.send(Request::new(empty()));
        // Unboxed, connecting alone took 2.5 KB and the exchange 4.2 KB.
        assert!(
            std::mem::size_of_val(&send) < 1536,
            "{}",
            std::mem::size_of_val(&send)
        );
        assert!(
            std::mem::size_of_val(&exchange) < 3072,
            "{}",
            std::mem::size_of_val(&exchange)
        );
        assert!(
            std::mem::size_of_val(&state) < 256,
            "{}",
            std::mem::size_of_val(&state)
        );
    }

    /// Keyed exchanges reuse a kept connection: the server here accepts one.
    #[tokio::test]
    async fn keyed_exchanges_share_a_kept_connection() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            for i in 0..3 {
                let mut got = Vec::new();
                while !got.ends_with(b"\r\n\r\nab") {
                    let mut b = [0u8; 512];
                    let n = s.read(&mut b).await.unwrap();
                    assert!(n > 0, "the client closed before request {i}");
                    got.extend_from_slice(&b[..n]);
                }
                let answer = format!("HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\n{i}");
                s.write_all(answer.as_bytes()).await.unwrap();
            }
        });
        let base = UpstreamBase::parse(&format!("http://{addr}")).unwrap();
        let one_s = Duration::from_secs(1);
        let up = Upstream::new(base, None, one_s, one_s, one_s, 1024).unwrap();
        for i in 0..3 {
            let got = up
                .exchange(
                    &Method::POST,
                    "/v1",
                    &HeaderMap::new(),
                    &[],
                    Bytes::from_static(b"ab"),
                )
                .await;
            match got {
                Exchange::Complete(c) => assert_eq!(c.body, i.to_string()),
                other => panic!("exchange {i}: {other:?}"),
            }
        }
        server.await.unwrap();
    }

    /// A keep-alive upstream that counts the connections it accepts and answers every
    /// request on each (a POST's body is two bytes, a GET has none).
    async fn counting_upstream() -> (UpstreamBase, Counts, tokio::task::JoinHandle<()>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let counts = Counts::default();
        let count = counts.clone();
        let server = tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                count.accepted.fetch_add(1, Ordering::SeqCst);
                let closed = count.closed.clone();
                tokio::spawn(async move {
                    // Counts the connection closed by the client when its task ends.
                    struct Closed(Arc<AtomicUsize>);
                    impl Drop for Closed {
                        fn drop(&mut self) {
                            self.0.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    let _closed = Closed(closed);
                    let mut got = Vec::new();
                    let mut b = [0u8; 512];
                    loop {
                        let head = got.windows(4).position(|w| w == b"\r\n\r\n");
                        let body = if got.starts_with(b"POST") { 2 } else { 0 };
                        match head.map(|end| end + 4 + body) {
                            Some(whole) if got.len() >= whole => {
                                got.drain(..whole);
                                let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                                if s.write_all(answer).await.is_err() {
                                    return;
                                }
                            }
                            _ => match s.read(&mut b).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => got.extend_from_slice(&b[..n]),
                            },
                        }
                    }
                });
            }
        });
        let base = UpstreamBase::parse(&format!("http://{addr}")).unwrap();
        (base, counts, server)
    }

    #[derive(Clone, Default)]
    struct Counts {
        accepted: Arc<std::sync::atomic::AtomicUsize>,
        closed: Arc<std::sync::atomic::AtomicUsize>,
    }

    async fn keyed_ok(up: &Upstream) {
        let h = HeaderMap::new();
        let sent = Bytes::from_static(b"ab");
        match up.exchange(&Method::POST, "/v1", &h, &[], sent).await {
            Exchange::Complete(c) => assert_eq!(&c.body[..], b"ok"),
            other => panic!("keyed exchange: {other:?}"),
        }
    }

    /// A kept connection is used again within the idle timeout and not past it, on the
    /// buffered client and on the streaming one alike.
    #[tokio::test]
    async fn a_connection_idle_past_the_idle_timeout_is_not_used_again() {
        use std::sync::atomic::Ordering;
        let (base, counts, server) = counting_upstream().await;
        let accepted = &counts.accepted;
        let one_s = Duration::from_secs(1);
        let idle = Duration::from_millis(1000);
        let up = Upstream::new(base, None, one_s, idle, one_s, 1024).unwrap();
        let send = |keyed: bool| {
            let up = &up;
            async move {
                if keyed {
                    keyed_ok(up).await;
                } else {
                    let resp = up.pass(Request::new(empty())).await.expect("pass");
                    let body = resp.into_body().collect().await.unwrap().to_bytes();
                    assert_eq!(&body[..], b"ok");
                }
            }
        };
        for (keyed, before) in [(true, 0), (false, 2)] {
            send(keyed).await;
            send(keyed).await;
            assert_eq!(accepted.load(Ordering::SeqCst), before + 1, "reused");
            tokio::time::sleep(idle + Duration::from_millis(300)).await;
            send(keyed).await;
            assert_eq!(accepted.load(Ordering::SeqCst), before + 2, "a new one");
        }
        server.abort();
    }

    /// Under light traffic only the newest kept connection is used; an older one idle
    /// past the timeout is closed at the next check-in, not left to the upstream.
    #[tokio::test]
    async fn an_expired_connection_under_a_used_one_is_closed_at_check_in() {
        use std::sync::atomic::Ordering;
        let (base, counts, server) = counting_upstream().await;
        let one_s = Duration::from_secs(1);
        let up = Upstream::new(base, None, one_s, one_s, one_s, 1024).unwrap();
        // Two kept connections.
        tokio::join!(keyed_ok(&up), keyed_ok(&up));
        assert_eq!(counts.accepted.load(Ordering::SeqCst), 2);
        // The newest is used twice, 0.7 s apart: at the second check-in the other one
        // has been idle 1.4 s. (A stall that lets the newest expire closes both.)
        for _ in 0..2 {
            tokio::time::sleep(Duration::from_millis(700)).await;
            keyed_ok(&up).await;
        }
        let waited = std::time::Instant::now();
        while counts.closed.load(Ordering::SeqCst) == 0 && waited.elapsed() < one_s * 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            counts.closed.load(Ordering::SeqCst) >= 1,
            "the expired connection is still open"
        );
        server.abort();
    }

    #[test]
    fn base_urls() {
        let b = UpstreamBase::parse("http://127.0.0.1:9000").unwrap();
        assert_eq!(b.uri("/v1/orders?x=1").to_string(), "/v1/orders?x=1");
        let uri: Uri = "/a?b".parse().unwrap();
        assert_eq!(b.target(&uri), uri);
        let b = UpstreamBase::parse("http://svc:80/api/").unwrap();
        assert_eq!(b.uri("/v1").to_string(), "/api/v1");
        assert_eq!(b.target(&uri).to_string(), "/api/a?b");
        assert!(UpstreamBase::parse("https://x").unwrap().is_https());
        assert!(UpstreamBase::parse("ftp://x").is_err());
        assert!(UpstreamBase::parse("nope").is_err());
    }

    #[test]
    fn key_states() {
        let done = parse_key_state(
            br#"{"state":"succeeded","response":{"status":201,"headers":[["content-type","application/json"],["connection","close"]],"body":"{\"id\":1}"}}"#,
        )
        .unwrap();
        let KeyState::Done(c) = done else { panic!() };
        assert_eq!(c.status, 201);
        assert_eq!(c.headers.len(), 1);
        assert_eq!(&c.body[..], br#"{"id":1}"#);

        // An idem-core Record serialised as JSON.
        let rec = parse_key_state(
            br#"{"state":"FAILED_TERMINAL","result":{"status":422,"headers":{"content-type":"text/plain"},"body":[110,111],"result_ref":null}}"#,
        )
        .unwrap();
        let KeyState::Done(c) = rec else { panic!() };
        assert_eq!((c.status.as_u16(), &c.body[..]), (422, &b"no"[..]));

        assert_eq!(
            parse_key_state(br#"{"state":"PROCESSING","retry_after_ms":1500}"#).unwrap(),
            KeyState::Processing {
                retry_after: Some(Duration::from_millis(1500))
            }
        );
        assert_eq!(
            parse_key_state(br#"{"state":"absent"}"#).unwrap(),
            KeyState::Absent
        );
        assert_eq!(
            parse_key_state(br#"{"state":"FAILED_RETRYABLE"}"#).unwrap(),
            KeyState::Absent
        );
        for bad in [
            &b"nope"[..],
            br#"{}"#,
            br#"{"state":"SUCCEEDED"}"#,
            br#"{"state":"weird"}"#,
        ] {
            assert!(parse_key_state(bad).is_err());
        }
    }

    #[test]
    fn encoding() {
        assert_eq!(percent_encode("a-b_c.d~"), "a-b_c.d~");
        assert_eq!(percent_encode("k/1 ?#%"), "k%2F1%20%3F%23%25");
    }
}
