//! The accept loop both servers (`idem serve`, `idem gateway`) run: HTTP/1 connections
//! with the caller's builder (its request-head timeout), over TLS when the server has a
//! certificate, watched for a graceful shutdown. Owns accepting and nothing after: how a
//! server drains (and what it cuts off past its grace) stays with the server.
//!
//! While it accepts, the loop also keeps one timer ahead of every request's own
//! ([`TIMER_ANCHOR`]): tokio's time driver wakes itself through its event fd (a `write`
//! system call) whenever a timer is registered sooner than the wake-up it planned when it
//! last parked, and with no timer pending it planned none, so each request's first
//! timers (its head-read timeout, its upstream timeout, its lease heartbeat) used to pay
//! that call even on the thread that was already awake.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The period of the timer the accept loop keeps pending: shorter than the shortest
/// per-request timer either server sets by default (the gateway's upstream connect
/// timeout, 2 s), so the time driver's planned wake-up always comes before a new
/// request's timers and registering them never wakes it. A shorter configured timer is
/// only that wake-up again, never a missed one.
pub const TIMER_ANCHOR: Duration = Duration::from_secs(1);

/// TLS on a listener: the acceptor and how long a client may take over its handshake
/// (a peer that connects and sends nothing must not hold a task forever).
#[derive(Clone)]
pub struct ListenerTls {
    pub acceptor: TlsAcceptor,
    pub handshake_timeout: Duration,
}

/// Serves connections from `listener` until `stop` resolves, each with the service
/// `service_for(peer)` makes; then drops the listener and returns the watch over the
/// connections still open. With `tls`, each connection's handshake runs in its own task,
/// so a slow client never holds up the accept loop.
pub async fn accept_until<F, S, B>(
    listener: TcpListener,
    http: &http1::Builder,
    tls: Option<ListenerTls>,
    mut service_for: F,
    stop: impl Future<Output = ()>,
) -> GracefulShutdown
where
    F: FnMut(SocketAddr) -> S,
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let graceful = GracefulShutdown::new();
    tokio::pin!(stop);
    let mut anchor = tokio::time::interval(TIMER_ANCHOR);
    anchor.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = anchor.tick() => {}
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like: keep serving the open ones.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let service = service_for(peer);
                match &tls {
                    None => {
                        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
                        tokio::spawn(async move {
                            if let Err(e) = conn.await {
                                tracing::debug!(%peer, error = %e, "connection ended with an error");
                            }
                        });
                    }
                    Some(tls) => {
                        let tls = tls.clone();
                        let http = http.clone();
                        let watcher = graceful.watcher();
                        tokio::spawn(async move {
                            let stream = match tokio::time::timeout(
                                tls.handshake_timeout,
                                tls.acceptor.accept(stream),
                            )
                            .await
                            {
                                Ok(Ok(stream)) => stream,
                                Ok(Err(e)) => {
                                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                                    return;
                                }
                                Err(_) => {
                                    tracing::debug!(%peer, "TLS handshake timed out");
                                    return;
                                }
                            };
                            let conn = watcher.watch(http.serve_connection(TokioIo::new(stream), service));
                            if let Err(e) = conn.await {
                                tracing::debug!(%peer, error = %e, "connection ended with an error");
                            }
                        });
                    }
                }
            }
            _ = &mut stop => break,
        }
    }
    graceful
}
