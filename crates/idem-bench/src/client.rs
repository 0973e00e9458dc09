//! The bench's load generator and servers: keep-alive HTTP/1.1 connections sending back to
//! back, what they measured, and servers run on a single-threaded runtime of their own.
//! It only measures; what a target answers is the caller's to judge.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use idem_gateway::GatewayError;
use serde::{Deserialize, Serialize};

/// Why the bench could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The gateway refused its configuration or could not start.
    #[error(transparent)]
    Gateway(#[from] GatewayError),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// A bench step (the upstream, a server thread) failed.
    #[error("bench: {0}")]
    Setup(String),
}

/// One target's figures in one scenario (all rounds merged).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetResult {
    pub target: String,
    pub requests: u64,
    pub errors: u64,
    pub rps: f64,
    pub p50_us: u64,
    pub p99_us: u64,
}

/// A server running on a runtime (and thread) of its own, stopped when dropped.
pub(crate) struct Background {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The thread's kernel id (for its CPU clock), where `/proc` says it.
    pub(crate) tid: Option<u32>,
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs `start` on a new single-threaded runtime on a thread of its own; keeps what it
/// returns as the guard alive until the [`Background`] is dropped.
pub(crate) async fn background<T, G, F, Fut>(
    name: &str,
    start: F,
) -> Result<(T, Background), BenchError>
where
    T: Send + 'static,
    G: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Result<(T, G), BenchError>>,
{
    let (ready_tx, ready_rx) = oneshot::channel();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            // One event loop on one thread: the same shape as nginx's single worker.
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(BenchError::Io(e)));
                    return;
                }
            };
            let tid = crate::saturation::CpuClock::current_thread_id();
            rt.block_on(async move {
                match start().await {
                    Ok((value, guard)) => {
                        let _ = ready_tx.send(Ok((value, tid)));
                        let _ = stop_rx.await;
                        drop(guard);
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            });
        })?;
    let mut bg = Background {
        stop: Some(stop_tx),
        thread: Some(thread),
        tid: None,
    };
    let (value, tid) = ready_rx
        .await
        .map_err(|_| BenchError::Setup(format!("{name} did not start")))??;
    bg.tid = tid;
    Ok((value, bg))
}

#[derive(Default)]
pub(crate) struct Load {
    pub(crate) ok: u64,
    pub(crate) errors: u64,
    pub(crate) elapsed: Duration,
    pub(crate) latencies_us: Vec<u64>,
}

impl Load {
    pub(crate) fn merge(&mut self, other: Load) {
        self.ok += other.ok;
        self.errors += other.errors;
        self.elapsed += other.elapsed;
        self.latencies_us.extend(other.latencies_us);
    }

    pub(crate) fn result(&mut self, target: &str) -> TargetResult {
        self.latencies_us.sort_unstable();
        TargetResult {
            target: target.to_string(),
            requests: self.ok,
            errors: self.errors,
            rps: (self.ok as f64 / self.elapsed.as_secs_f64().max(1e-9)).round(),
            p50_us: percentile(&self.latencies_us, 0.50),
            p99_us: percentile(&self.latencies_us, 0.99),
        }
    }
}

pub(crate) fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub(crate) type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

pub(crate) async fn connect(addr: SocketAddr) -> Option<Sender> {
    let stream = TcpStream::connect(addr).await.ok()?;
    let _ = stream.set_nodelay(true);
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Some(send)
}

/// One request on a connection: status and body, or `None` when the connection failed.
pub(crate) async fn send_one(send: &mut Sender, req: Request<Full<Bytes>>) -> Option<(u16, Bytes)> {
    send.ready().await.ok()?;
    let resp = send.send_request(req).await.ok()?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.ok()?.to_bytes();
    Some((status, body))
}

/// `concurrency` connections sending back to back until `phase` has passed; `request`
/// makes connection `c`'s request number `seq` (from 1).
pub(crate) async fn drive<F>(
    addr: SocketAddr,
    concurrency: usize,
    phase: Duration,
    request: F,
) -> Load
where
    F: Fn(usize, u64) -> Request<Full<Bytes>> + Send + Sync + 'static,
{
    let request = Arc::new(request);
    let start = Instant::now();
    let deadline = start + phase;
    let mut tasks = Vec::with_capacity(concurrency);
    for c in 0..concurrency {
        let request = request.clone();
        tasks.push(tokio::spawn(async move {
            let mut load = Load::default();
            let mut conn: Option<Sender> = None;
            let mut seq = 0u64;
            while Instant::now() < deadline {
                let send = match &mut conn {
                    Some(s) => s,
                    None => match connect(addr).await {
                        Some(s) => conn.insert(s),
                        None => {
                            load.errors += 1;
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    },
                };
                seq += 1;
                let req = request(c, seq);
                let t = Instant::now();
                match send_one(send, req).await {
                    Some((status, _)) if (200..300).contains(&status) => {
                        load.ok += 1;
                        load.latencies_us.push(t.elapsed().as_micros() as u64);
                    }
                    Some(_) => load.errors += 1,
                    None => {
                        load.errors += 1;
                        conn = None;
                    }
                }
            }
            load
        }));
    }
    let mut total = Load::default();
    for t in tasks {
        if let Ok(l) = t.await {
            total.ok += l.ok;
            total.errors += l.errors;
            total.latencies_us.extend(l.latencies_us);
        }
    }
    total.elapsed = start.elapsed();
    total
}
