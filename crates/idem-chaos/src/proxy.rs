//! TCP fault proxy: one hop of the campaign topology (gateway→service, service→PostgreSQL,
//! gateway→Redis) routed through a loopback listener so network faults can be injected on
//! demand.
//!
//! A [`FaultProxy`] owns its listener, one task per accepted connection, and the current
//! [`Mode`] those tasks obey; dropping it stops them all. It carries opaque bytes: it never
//! parses, rewrites, reorders or buffers beyond one chunk of what it forwards. The single
//! exception is [`Mode::DropResponse`], which acts on the *arrival* of the first
//! server→client bytes (never on their content). It does not decide when faults happen —
//! the campaign schedule calls [`FaultProxy::set`] — and it never panics on I/O errors: a
//! broken connection is logged at debug level and closed.

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{sleep_until, Instant};
use tracing::debug;

/// Bytes read per forwarding step, per direction.
const CHUNK: usize = 16 * 1024;

/// What the proxy does to the traffic it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward both ways.
    Pass,
    /// Every chunk forwarded in either direction waits this long first (open connections too).
    Delay(Duration),
    /// Open connections are reset (RST: SO_LINGER 0 then close) when the mode is set; new
    /// connections are accepted and reset at once while it lasts.
    Reset,
    /// Nothing is forwarded: new connections are accepted and held silent (bytes read are
    /// dropped); open connections stop forwarding. When the mode ends, connections that
    /// were blackholed are closed (reset).
    Blackhole,
    /// Client→server bytes are forwarded; the first server→client bytes are dropped and the
    /// client side is reset at that moment (the request reached the server, its response
    /// never reaches the client). Applies to open and new connections.
    DropResponse,
}

/// Connections accepted so far, and how many the proxy reset or dropped on purpose.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyStats {
    pub accepted: u64,
    pub faulted: u64,
}

/// A loopback TCP listener forwarding to one target, with injectable faults.
pub struct FaultProxy {
    shared: Arc<Shared>,
    addr: SocketAddr,
    control: watch::Sender<Control>,
    accept: JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on 127.0.0.1 with an OS-picked port, forwarding to `target`.
    pub async fn start(name: &str, target: SocketAddr) -> io::Result<FaultProxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let (control, rx) = watch::channel(Control {
            mode: Mode::Pass,
            resets: 0,
            blackholes: 0,
        });
        let shared = Arc::new(Shared {
            name: name.to_owned(),
            target,
            accepted: AtomicU64::new(0),
            faulted: AtomicU64::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, rx, Arc::clone(&shared)));
        debug!(proxy = %name, %addr, %target, "fault proxy listening");
        Ok(FaultProxy {
            shared,
            addr,
            control,
            accept,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn name(&self) -> &str {
        &self.shared.name
    }

    pub fn mode(&self) -> Mode {
        self.control.borrow().mode
    }

    /// Takes effect for open and new connections.
    pub fn set(&self, mode: Mode) {
        self.control.send_modify(|c| {
            if mode == Mode::Reset {
                c.resets += 1;
            }
            if mode == Mode::Blackhole && c.mode != Mode::Blackhole {
                c.blackholes += 1;
            }
            c.mode = mode;
        });
        debug!(proxy = %self.shared.name, ?mode, "mode set");
    }

    /// Resets every open connection now (mode unchanged).
    pub fn reset_all(&self) {
        self.control.send_modify(|c| c.resets += 1);
        debug!(proxy = %self.shared.name, "reset all open connections");
    }

    /// Connections accepted so far, and how many the proxy reset or dropped on purpose.
    pub fn stats(&self) -> ProxyStats {
        ProxyStats {
            accepted: self.shared.accepted.load(Ordering::Relaxed),
            faulted: self.shared.faulted.load(Ordering::Relaxed),
        }
    }
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("name", &self.shared.name)
            .field("addr", &self.addr)
            .field("target", &self.shared.target)
            .field("mode", &self.mode())
            .field("stats", &self.stats())
            .finish()
    }
}

impl Drop for FaultProxy {
    /// Stops the listener and closes every connection: the connection tasks live in the
    /// accept task's `JoinSet`, which aborts them when the accept task is aborted.
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// State shared by the handle and its tasks.
struct Shared {
    name: String,
    target: SocketAddr,
    accepted: AtomicU64,
    faulted: AtomicU64,
}

/// What the handle publishes to connection tasks.
#[derive(Debug, Clone, Copy)]
struct Control {
    mode: Mode,
    /// Bumped by `set(Reset)` and `reset_all`. A watch coalesces values, so a counter (not
    /// the mode alone) guarantees a quick Reset→Pass still resets what was open.
    resets: u64,
    /// Bumped on entering Blackhole, for the same reason: every connection open during a
    /// blackhole is reset when it ends, however briefly it lasted.
    blackholes: u64,
}

/// How one connection task reads `Control`: what it has seen so far.
#[derive(Clone)]
struct Watch {
    rx: watch::Receiver<Control>,
    resets: u64,
    blackholes: u64,
    blackholed: bool,
}

enum Verdict {
    /// Reset the connection now.
    Fault,
    /// Carry on in this mode.
    Go(Mode),
}

impl Watch {
    fn new(mut rx: watch::Receiver<Control>) -> Watch {
        let c = *rx.borrow_and_update();
        Watch {
            rx,
            resets: c.resets,
            blackholes: c.blackholes,
            blackholed: false,
        }
    }

    fn verdict(&mut self) -> Verdict {
        let c = *self.rx.borrow_and_update();
        if c.mode == Mode::Reset || c.resets != self.resets {
            return Verdict::Fault;
        }
        if c.mode == Mode::Blackhole || c.blackholes != self.blackholes {
            self.blackholes = c.blackholes;
            self.blackholed = true;
        }
        match c.mode {
            Mode::Blackhole => Verdict::Go(Mode::Blackhole),
            _ if self.blackholed => Verdict::Fault,
            mode => Verdict::Go(mode),
        }
    }

    /// Waits for the next control change; false once the handle is gone.
    async fn changed(&mut self) -> bool {
        self.rx.changed().await.is_ok()
    }
}

/// How one direction (or a whole connection) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// EOF forwarded as a half-close.
    Closed,
    /// An I/O error: close without counting a fault.
    Error,
    /// The proxy decided to reset the connection.
    Fault,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    /// Client→server.
    Up,
    /// Server→client.
    Down,
}

async fn accept_loop(listener: TcpListener, rx: watch::Receiver<Control>, shared: Arc<Shared>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, peer)) => {
                    shared.accepted.fetch_add(1, Ordering::Relaxed);
                    // Snapshot control at accept, so a reset issued before the task first
                    // runs still applies to this connection.
                    let w = Watch::new(rx.clone());
                    conns.spawn(serve(client, peer, w, Arc::clone(&shared)));
                }
                Err(e) => {
                    debug!(proxy = %shared.name, error = %e, "accept failed");
                    // EMFILE and friends: back off rather than spin.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            // Reap finished connections so the set stays as small as what is open.
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn serve(mut client: TcpStream, peer: SocketAddr, mut w: Watch, shared: Arc<Shared>) {
    let name = shared.name.as_str();
    // The proxy must not add Nagle latency on top of the faults it injects.
    let _ = client.set_nodelay(true);
    let end = match w.verdict() {
        Verdict::Fault => End::Fault,
        // Held silent without touching the target: a sink is never written because a
        // blackholed connection only ever gets Blackhole or Fault verdicts.
        Verdict::Go(Mode::Blackhole) => {
            pump(Dir::Up, &mut client, tokio::io::sink(), w, name).await
        }
        Verdict::Go(_) => {
            let mut server = match TcpStream::connect(shared.target).await {
                Ok(server) => server,
                Err(e) => {
                    debug!(proxy = %name, %peer, target = %shared.target, error = %e, "connect to target failed");
                    return;
                }
            };
            let _ = server.set_nodelay(true);
            let end = forward(&mut client, &mut server, &w, name).await;
            if end == End::Fault {
                reset(&server, name);
            }
            end
        }
    };
    if end == End::Fault {
        reset(&client, name);
        shared.faulted.fetch_add(1, Ordering::Relaxed);
        debug!(proxy = %name, %peer, "connection reset on purpose");
    }
}

/// Runs both directions until both closed, or one errs or faults.
async fn forward(client: &mut TcpStream, server: &mut TcpStream, w: &Watch, name: &str) -> End {
    let (client_r, client_w) = client.split();
    let (server_r, server_w) = server.split();
    let up = pump(Dir::Up, client_r, server_w, w.clone(), name);
    let down = pump(Dir::Down, server_r, client_w, w.clone(), name);
    tokio::pin!(up, down);
    let (mut up_done, mut down_done) = (false, false);
    loop {
        let end = tokio::select! {
            end = &mut up, if !up_done => { up_done = true; end }
            end = &mut down, if !down_done => { down_done = true; end }
        };
        if end != End::Closed || (up_done && down_done) {
            return end;
        }
    }
}

/// Copies one direction, obeying the mode between (and during) reads and writes.
async fn pump<R, W>(dir: Dir, mut from: R, mut to: W, mut w: Watch, name: &str) -> End
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; CHUNK];
    loop {
        if let Verdict::Fault = w.verdict() {
            return End::Fault;
        }
        let read = tokio::select! {
            biased;
            alive = w.changed() => {
                if !alive {
                    return End::Closed;
                }
                continue;
            }
            read = from.read(&mut buf) => read,
        };
        let read_at = Instant::now();
        match read {
            Ok(0) => match w.verdict() {
                Verdict::Fault => return End::Fault,
                // Not even the FIN gets through a blackhole: wait for its end, then reset.
                Verdict::Go(Mode::Blackhole) => return park(&mut w).await,
                Verdict::Go(_) => {
                    if let Err(e) = to.shutdown().await {
                        debug!(proxy = %name, ?dir, error = %e, "half-close failed");
                        return End::Error;
                    }
                    return End::Closed;
                }
            },
            Ok(n) => {
                if let Err(end) = deliver(dir, &buf[..n], &mut to, &mut w, read_at, name).await {
                    return end;
                }
            }
            Err(e) => {
                debug!(proxy = %name, ?dir, error = %e, "read failed");
                return End::Error;
            }
        }
    }
}

/// Writes one chunk (or drops it), re-deciding whenever the mode changes meanwhile.
async fn deliver<W>(
    dir: Dir,
    chunk: &[u8],
    to: &mut W,
    w: &mut Watch,
    read_at: Instant,
    name: &str,
) -> Result<(), End>
where
    W: AsyncWrite + Unpin,
{
    enum Step {
        Recheck,
        Wrote(io::Result<usize>),
    }
    let mut off = 0;
    while off < chunk.len() {
        let due = match w.verdict() {
            Verdict::Fault => return Err(End::Fault),
            Verdict::Go(Mode::Blackhole) => return Ok(()),
            Verdict::Go(Mode::DropResponse) if dir == Dir::Down => return Err(End::Fault),
            Verdict::Go(Mode::Delay(d)) => read_at + d,
            Verdict::Go(_) => read_at,
        };
        let waiting = due > Instant::now();
        // Single `write` calls (not `write_all`) so a mode change can cut in without
        // losing track of what was already written.
        let step = tokio::select! {
            biased;
            alive = w.changed() => {
                if !alive {
                    return Err(End::Closed);
                }
                Step::Recheck
            }
            () = sleep_until(due), if waiting => Step::Recheck,
            wrote = to.write(&chunk[off..]), if !waiting => Step::Wrote(wrote),
        };
        match step {
            Step::Recheck => {}
            Step::Wrote(Ok(0)) => {
                debug!(proxy = %name, ?dir, "write returned zero");
                return Err(End::Error);
            }
            Step::Wrote(Ok(n)) => off += n,
            Step::Wrote(Err(e)) => {
                debug!(proxy = %name, ?dir, error = %e, "write failed");
                return Err(End::Error);
            }
        }
    }
    Ok(())
}

/// Waits, doing nothing, until the control says to reset.
async fn park(w: &mut Watch) -> End {
    loop {
        if let Verdict::Fault = w.verdict() {
            return End::Fault;
        }
        if !w.changed().await {
            return End::Closed;
        }
    }
}

/// With SO_LINGER 0 the close that follows (when the stream drops) sends RST, not FIN.
fn reset(stream: &TcpStream, name: &str) {
    if let Err(e) = stream.set_zero_linger() {
        debug!(proxy = %name, error = %e, "SO_LINGER 0 failed; closing normally");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant as StdInstant;
    use tokio::sync::mpsc;
    use tokio::time::timeout;

    const WAIT: Duration = Duration::from_secs(5);
    const SILENCE: Duration = Duration::from_millis(300);

    /// An echo server that records every chunk it receives.
    async fn echo_server() -> (SocketAddr, mpsc::UnboundedReceiver<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    loop {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                let _ = tx.send(buf[..n].to_vec());
                                if s.write_all(&buf[..n]).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        (addr, rx)
    }

    #[derive(Debug, PartialEq, Eq)]
    enum Seen {
        Data(Vec<u8>),
        Eof,
        Reset,
        Silent,
        Error(io::ErrorKind),
    }

    async fn next_read(s: &mut TcpStream, within: Duration) -> Seen {
        let mut buf = [0u8; 1024];
        match timeout(within, s.read(&mut buf)).await {
            Err(_) => Seen::Silent,
            Ok(Ok(0)) => Seen::Eof,
            Ok(Ok(n)) => Seen::Data(buf[..n].to_vec()),
            Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionReset => Seen::Reset,
            Ok(Err(e)) => Seen::Error(e.kind()),
        }
    }

    async fn round_trip(s: &mut TcpStream, msg: &[u8]) {
        s.write_all(msg).await.unwrap();
        let mut back = vec![0u8; msg.len()];
        timeout(WAIT, s.read_exact(&mut back))
            .await
            .expect("echo within 5 s")
            .expect("echo read");
        assert_eq!(back, msg);
    }

    /// Collects what the echo server received until `len` bytes arrived.
    async fn received(got: &mut mpsc::UnboundedReceiver<Vec<u8>>, len: usize) -> Vec<u8> {
        let mut all = Vec::new();
        while all.len() < len {
            let chunk = timeout(WAIT, got.recv())
                .await
                .expect("server received within 5 s")
                .expect("server alive");
            all.extend_from_slice(&chunk);
        }
        all
    }

    async fn eventually(what: &str, cond: impl Fn() -> bool) {
        let deadline = StdInstant::now() + WAIT;
        while !cond() {
            assert!(StdInstant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn connect(p: &FaultProxy) -> TcpStream {
        TcpStream::connect(p.addr()).await.unwrap()
    }

    #[tokio::test]
    async fn pass_round_trips_bytes_and_half_close() {
        let (target, mut got) = echo_server().await;
        let p = FaultProxy::start("pass", target).await.unwrap();
        assert_eq!(p.name(), "pass");
        assert_eq!(p.mode(), Mode::Pass);
        assert!(p.addr().ip().is_loopback());

        let mut a = connect(&p).await;
        round_trip(&mut a, b"hello").await;
        assert_eq!(received(&mut got, 5).await, b"hello");

        // Several chunks each way, then a half-close that must reach the server.
        let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let (mut r, mut wr) = a.into_split();
        let sent = payload.clone();
        let writer = tokio::spawn(async move {
            wr.write_all(&sent).await.unwrap();
            wr.shutdown().await.unwrap();
            wr
        });
        let mut back = Vec::new();
        timeout(WAIT, r.read_to_end(&mut back))
            .await
            .expect("echo and EOF within 5 s")
            .unwrap();
        assert_eq!(back.len(), payload.len());
        assert!(back == payload, "payload corrupted in transit");
        drop(writer.await.unwrap());

        eventually("stats", || {
            p.stats()
                == ProxyStats {
                    accepted: 1,
                    faulted: 0,
                }
        })
        .await;
    }

    #[tokio::test]
    async fn delay_holds_every_chunk_in_both_directions() {
        let (target, _got) = echo_server().await;
        let p = FaultProxy::start("delay", target).await.unwrap();
        let mut open = connect(&p).await;
        round_trip(&mut open, b"warm").await;

        let delay = Duration::from_millis(200);
        p.set(Mode::Delay(delay));
        assert_eq!(p.mode(), Mode::Delay(delay));

        // Open connection: request and echo each wait, so at least twice the delay.
        let t = StdInstant::now();
        round_trip(&mut open, b"slow").await;
        assert!(
            t.elapsed() >= 2 * delay,
            "open connection round trip took {:?}",
            t.elapsed()
        );

        // New connection: same.
        let mut fresh = connect(&p).await;
        let t = StdInstant::now();
        round_trip(&mut fresh, b"slow too").await;
        assert!(
            t.elapsed() >= 2 * delay,
            "new connection round trip took {:?}",
            t.elapsed()
        );

        p.set(Mode::Pass);
        round_trip(&mut open, b"fast again").await;
        assert_eq!(p.stats().faulted, 0);
    }

    #[tokio::test]
    async fn reset_kills_open_and_new_connections_until_pass() {
        let (target, _got) = echo_server().await;
        let p = FaultProxy::start("reset", target).await.unwrap();
        let mut open = connect(&p).await;
        round_trip(&mut open, b"before").await;

        p.set(Mode::Reset);
        assert_eq!(next_read(&mut open, WAIT).await, Seen::Reset);

        let mut fresh = connect(&p).await;
        assert_eq!(next_read(&mut fresh, WAIT).await, Seen::Reset);
        eventually("two faults", || {
            p.stats()
                == ProxyStats {
                    accepted: 2,
                    faulted: 2,
                }
        })
        .await;

        p.set(Mode::Pass);
        let mut after = connect(&p).await;
        round_trip(&mut after, b"after").await;
        assert_eq!(
            p.stats(),
            ProxyStats {
                accepted: 3,
                faulted: 2
            }
        );
    }

    #[tokio::test]
    async fn blackhole_forwards_nothing_then_resets_what_it_held() {
        let (target, mut got) = echo_server().await;
        let p = FaultProxy::start("blackhole", target).await.unwrap();
        let mut open = connect(&p).await;
        round_trip(&mut open, b"before").await;
        assert_eq!(received(&mut got, 6).await, b"before");

        p.set(Mode::Blackhole);
        open.write_all(b"lost").await.unwrap();
        assert_eq!(next_read(&mut open, SILENCE).await, Seen::Silent);

        let mut held = connect(&p).await;
        held.write_all(b"lost too").await.unwrap();
        assert_eq!(next_read(&mut held, SILENCE).await, Seen::Silent);
        assert!(
            got.try_recv().is_err(),
            "server received bytes through a blackhole"
        );
        eventually("held connection accepted", || p.stats().accepted == 2).await;
        assert_eq!(p.stats().faulted, 0);

        p.set(Mode::Pass);
        assert_eq!(next_read(&mut open, WAIT).await, Seen::Reset);
        assert_eq!(next_read(&mut held, WAIT).await, Seen::Reset);
        eventually("two faults", || p.stats().faulted == 2).await;

        let mut after = connect(&p).await;
        round_trip(&mut after, b"after").await;
        assert_eq!(received(&mut got, 5).await, b"after");
    }

    #[tokio::test]
    async fn drop_response_delivers_request_but_not_response() {
        let (target, mut got) = echo_server().await;
        let p = FaultProxy::start("drop-response", target).await.unwrap();
        let mut open = connect(&p).await;
        round_trip(&mut open, b"before").await;
        assert_eq!(received(&mut got, 6).await, b"before");

        p.set(Mode::DropResponse);
        open.write_all(b"req-1").await.unwrap();
        assert_eq!(received(&mut got, 5).await, b"req-1");
        assert_eq!(next_read(&mut open, WAIT).await, Seen::Reset);

        let mut fresh = connect(&p).await;
        fresh.write_all(b"req-2").await.unwrap();
        assert_eq!(received(&mut got, 5).await, b"req-2");
        assert_eq!(next_read(&mut fresh, WAIT).await, Seen::Reset);
        eventually("two faults", || {
            p.stats()
                == ProxyStats {
                    accepted: 2,
                    faulted: 2,
                }
        })
        .await;

        p.set(Mode::Pass);
        let mut after = connect(&p).await;
        round_trip(&mut after, b"after").await;
    }

    #[tokio::test]
    async fn reset_all_resets_open_connections_only() {
        let (target, _got) = echo_server().await;
        let p = FaultProxy::start("reset-all", target).await.unwrap();
        let mut a = connect(&p).await;
        let mut b = connect(&p).await;
        round_trip(&mut a, b"a").await;
        round_trip(&mut b, b"b").await;

        p.reset_all();
        assert_eq!(p.mode(), Mode::Pass);
        assert_eq!(next_read(&mut a, WAIT).await, Seen::Reset);
        assert_eq!(next_read(&mut b, WAIT).await, Seen::Reset);

        let mut c = connect(&p).await;
        round_trip(&mut c, b"c").await;
        eventually("stats", || {
            p.stats()
                == ProxyStats {
                    accepted: 3,
                    faulted: 2,
                }
        })
        .await;
    }

    #[tokio::test]
    async fn unreachable_target_closes_client_without_fault() {
        let gone = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = gone.local_addr().unwrap();
        drop(gone);
        let p = FaultProxy::start("unreachable", target).await.unwrap();
        let mut c = connect(&p).await;
        assert_eq!(next_read(&mut c, WAIT).await, Seen::Eof);
        assert_eq!(
            p.stats(),
            ProxyStats {
                accepted: 1,
                faulted: 0
            }
        );
    }

    #[tokio::test]
    async fn drop_closes_connections_and_listener() {
        let (target, _got) = echo_server().await;
        let p = FaultProxy::start("dropped", target).await.unwrap();
        let addr = p.addr();
        let mut open = connect(&p).await;
        round_trip(&mut open, b"alive").await;

        drop(p);
        let seen = next_read(&mut open, WAIT).await;
        assert!(
            matches!(seen, Seen::Eof | Seen::Reset),
            "open connection after drop: {seen:?}"
        );

        let deadline = StdInstant::now() + WAIT;
        while TcpStream::connect(addr).await.is_ok() {
            assert!(
                StdInstant::now() < deadline,
                "listener still accepting after drop"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
