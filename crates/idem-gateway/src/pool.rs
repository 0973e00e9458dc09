//! Keep-alive HTTP/1.1 connections to the one upstream.
//!
//! The gateway talks to a single origin, so a pool is two stacks of idle connections:
//! hyper's senders for streamed exchanges (the pass-through, state queries) and plain
//! connections for the keyed exchange's buffered client ([`crate::h1`]). Checkout pops
//! the most recently used live one (or connects), check-in happens when the response
//! body has been read to its end (a streamed body checks its connection in itself, see
//! [`PooledBody`]). A hyper connection's driver is a task spawned once per connection,
//! not per request. A request that a closing connection hands back unsent is retried on
//! another connection; one that may have been sent is never retried here.
//!
//! A connection idle for the pool's idle timeout is dropped instead of used (at checkout,
//! or at a check-in that finds it at the bottom of the stack): an upstream closes idle connections on a timer of its own, and a request sent
//! on one it is closing at that moment is lost in flight (on a keyed route, an uncertain
//! result). Staying under the upstream's timer keeps clear of that race.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::Authority;
use http::{Request, Response};
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use rustls_pki_types::ServerName;

use crate::body::{Body, BoxError};
use crate::error::GatewayError;
use crate::h1::{Conn, Stream};

/// How a send failed.
#[derive(Debug)]
pub enum SendError {
    /// No connection could be made: the request never left the gateway.
    NotSent(String),
    /// The request may have been (partly) sent.
    Failed(hyper::Error),
}

pub struct Pool {
    /// `host:port` to connect to (the scheme's port when the authority has none).
    addr: String,
    /// TLS to the upstream, verified for the authority's host.
    tls: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
    connect_timeout: Duration,
    /// Idle connections with the time each was checked in, most recent last.
    idle: Mutex<Vec<(SendRequest<Body>, Instant)>>,
    /// Idle connections of the keyed exchange's client.
    conns: Mutex<Vec<(Conn, Instant)>>,
    max_idle: usize,
    idle_timeout: Duration,
}

/// The most recently checked-in entry not idle for `timeout`, or `None`. Entries below
/// an expired one are older, so they are dropped with it (after the lock is released).
fn pop_fresh<T>(
    mut stack: std::sync::MutexGuard<'_, Vec<(T, Instant)>>,
    timeout: Duration,
) -> Option<T> {
    let (item, at) = stack.pop()?;
    if at.elapsed() < timeout {
        Some(item)
    } else {
        let expired = std::mem::take(&mut *stack);
        drop(stack);
        drop(expired);
        None
    }
}

/// Pushes `item` stamped now, once the entries idle for `timeout` are taken off the
/// bottom (the oldest): under light traffic the top stays fresh, and the ones below would
/// otherwise hold their sockets, closed by the upstream, until traffic reached them.
fn push_fresh<T>(
    mut stack: std::sync::MutexGuard<'_, Vec<(T, Instant)>>,
    item: T,
    timeout: Duration,
    max_idle: usize,
) {
    let now = Instant::now();
    let is_expired = |at: &Instant| now.duration_since(*at) >= timeout;
    // Most check-ins find the oldest entry fresh: one comparison, nothing taken off.
    let expired: Vec<_> = if stack.first().is_some_and(|(_, at)| is_expired(at)) {
        let n = stack.partition_point(|(_, at)| is_expired(at));
        stack.drain(..n).collect()
    } else {
        Vec::new()
    };
    if stack.len() < max_idle {
        stack.push((item, now));
    }
    drop(stack);
    drop(expired);
}

impl Pool {
    pub fn new(
        authority: Authority,
        tls: Option<Arc<rustls::ClientConfig>>,
        connect_timeout: Duration,
        idle_timeout: Duration,
        max_idle: usize,
    ) -> Result<Self, GatewayError> {
        let port = authority
            .port_u16()
            .unwrap_or(if tls.is_some() { 443 } else { 80 });
        // An IPv6 literal keeps its brackets in the authority; the server name drops them.
        let host = authority.host();
        let addr = format!("{host}:{port}");
        let tls = match tls {
            None => None,
            Some(config) => {
                let name = ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']'))
                    .map_err(|e| GatewayError::Config(format!("upstream TLS name {host:?}: {e}")))?
                    .to_owned();
                Some((tokio_rustls::TlsConnector::from(config), name))
            }
        };
        Ok(Self {
            addr,
            tls,
            connect_timeout,
            idle: Mutex::new(Vec::new()),
            conns: Mutex::new(Vec::new()),
            max_idle,
            idle_timeout,
        })
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<(SendRequest<Body>, Instant)>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn checkout_idle(&self) -> Option<SendRequest<Body>> {
        while let Some(s) = pop_fresh(self.idle(), self.idle_timeout) {
            if !s.is_closed() {
                return Some(s);
            }
        }
        None
    }

    /// Returns a connection whose last response was read to its end.
    pub fn checkin(&self, sender: SendRequest<Body>) {
        if sender.is_closed() {
            return;
        }
        push_fresh(self.idle(), sender, self.idle_timeout, self.max_idle);
    }

    fn conns(&self) -> std::sync::MutexGuard<'_, Vec<(Conn, Instant)>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An idle connection for a buffered exchange, the most recently used open one.
    pub fn checkout_conn(&self) -> Option<Conn> {
        loop {
            let mut conn = pop_fresh(self.conns(), self.idle_timeout)?;
            if conn.is_idle_open() {
                return Some(conn);
            }
        }
    }

    /// Returns a connection whose last exchange ended cleanly.
    pub fn checkin_conn(&self, conn: Conn) {
        push_fresh(self.conns(), conn, self.idle_timeout, self.max_idle);
    }

    /// A new connection for a buffered exchange.
    pub async fn connect_conn(&self) -> Result<Conn, String> {
        self.connect_stream().await.map(Conn::new)
    }

    async fn connect(&self) -> Result<SendRequest<Body>, String> {
        let stream = self.connect_stream().await?;
        self.handshake(&self.addr, stream).await
    }

    /// A TCP connection, with TLS for an `https://` upstream.
    async fn connect_stream(&self) -> Result<Stream, String> {
        let addr = self.addr.as_str();
        let stream = tokio::time::timeout(self.connect_timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| {
                format!(
                    "connecting to {addr} timed out after {} ms",
                    self.connect_timeout.as_millis()
                )
            })?
            .map_err(|e| format!("connecting to {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        match &self.tls {
            None => Ok(Stream::Tcp(stream)),
            Some((connector, name)) => {
                // The TLS handshake shares the connect bound.
                let stream = tokio::time::timeout(
                    self.connect_timeout,
                    connector.connect(name.clone(), stream),
                )
                .await
                .map_err(|_| format!("TLS handshake with {addr} timed out"))?
                .map_err(|e| {
                    let why = idem_net::tls::describe_failure(&e).unwrap_or_else(|| e.to_string());
                    format!("connecting to {addr}: {why}")
                })?;
                Ok(Stream::Tls(Box::new(stream)))
            }
        }
    }

    async fn handshake(&self, addr: &str, stream: Stream) -> Result<SendRequest<Body>, String> {
        // Small messages: one flattened write beats a vectored one.
        let (sender, conn) = hyper::client::conn::http1::Builder::new()
            .writev(false)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake with {addr}: {e}"))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        Ok(sender)
    }

    /// Sends `req` (origin-form URI, Host set) on a pooled or new connection. The sender
    /// comes back with the response: check it in after the body is read.
    pub async fn send(
        &self,
        mut req: Request<Body>,
    ) -> Result<(Response<Incoming>, SendRequest<Body>), SendError> {
        // Pooled connections may have been closed by the upstream in the meantime: a
        // request they hand back unsent goes to the next one; the last try is a fresh
        // connection.
        for attempt in 0..4 {
            let pooled = if attempt < 3 {
                self.checkout_idle()
            } else {
                None
            };
            let mut sender = match pooled {
                Some(s) => s,
                // Boxed: connecting (TCP, TLS, handshake) is a large state machine that
                // every request's future would otherwise carry, and copy on each move,
                // for the rare request that needs a new connection.
                None => Box::pin(self.connect()).await.map_err(SendError::NotSent)?,
            };
            if sender.ready().await.is_err() {
                continue;
            }
            match sender.try_send_request(req).await {
                Ok(resp) => return Ok((resp, sender)),
                Err(mut e) => match e.take_message() {
                    Some(unsent) => req = unsent,
                    None => return Err(SendError::Failed(e.into_error())),
                },
            }
        }
        Err(SendError::NotSent(
            "no upstream connection accepted the request".into(),
        ))
    }
}

pin_project_lite::pin_project! {
    /// A streamed upstream response body that checks its connection back in when it
    /// reaches its end. Dropped early, the connection is dropped (it cannot be reused).
    pub struct PooledBody {
        #[pin]
        inner: Incoming,
        sender: Option<SendRequest<Body>>,
        pool: Arc<Pool>,
    }
}

impl PooledBody {
    pub fn new(inner: Incoming, sender: SendRequest<Body>, pool: Arc<Pool>) -> Self {
        let mut body = Self {
            inner,
            sender: Some(sender),
            pool,
        };
        if body.inner.is_end_stream() {
            if let Some(s) = body.sender.take() {
                body.pool.checkin(s);
            }
        }
        body
    }
}

impl HttpBody for PooledBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        let res = this.inner.as_mut().poll_frame(cx);
        let ended = match &res {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => this.inner.is_end_stream(),
            _ => false,
        };
        if ended {
            if let Some(s) = this.sender.take() {
                this.pool.checkin(s);
            }
        }
        match res {
            Poll::Ready(Some(Err(e))) => {
                // A broken body leaves the connection unusable.
                this.sender.take();
                Poll::Ready(Some(Err(Box::new(e))))
            }
            Poll::Ready(Some(Ok(f))) => Poll::Ready(Some(Ok(f))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
