//! The accept loop both servers (`idem serve`, `idem gateway`) run: HTTP/1 connections
//! with the caller's builder (its request-head timeout), watched for a graceful
//! shutdown. Owns accepting and nothing after: how a server drains (and what it cuts
//! off past its grace) stays with the server.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Serves connections from `listener` until `stop` resolves, each with the service
/// `service_for(peer)` makes; then drops the listener and returns the watch over the
/// connections still open.
pub async fn accept_until<F, S, B>(
    listener: TcpListener,
    http: &http1::Builder,
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
    loop {
        tokio::select! {
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
                let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service_for(peer)));
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                });
            }
            _ = &mut stop => break,
        }
    }
    graceful
}
