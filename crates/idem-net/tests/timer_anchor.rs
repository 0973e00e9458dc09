//! The accept loop's pending timer: a request that registers a timer on the serving
//! thread does not make the time driver wake itself through its event fd.
//!
//! Counted on Linux by the serving thread's write system calls (`syscw` in
//! `/proc/self/task/TID/io`): the event fd's wake-up is a `write`, while the server's
//! own socket sends (`sendto`, vectored writes off) are not counted there.
#![cfg(target_os = "linux")]

use std::convert::Infallible;
use std::future::Future;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;

const REQUESTS: u64 = 300;

/// Answers each request after registering a timer far in the future and dropping it,
/// as a request's upstream timeout or lease heartbeat does.
async fn answer(_req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let mut sleep = pin!(tokio::time::sleep(Duration::from_secs(5)));
    std::future::poll_fn(|cx| {
        assert!(sleep.as_mut().poll(cx).is_pending());
        Poll::Ready(())
    })
    .await;
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

fn write_calls(tid: &str) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/self/task/{tid}/io")).expect("thread io");
    io.lines()
        .find_map(|l| l.strip_prefix("syscw: "))
        .expect("syscw line")
        .trim()
        .parse()
        .expect("a count")
}

/// One kept-alive request and its whole answer.
fn exchange(conn: &mut TcpStream) {
    conn.write_all(b"GET / HTTP/1.1\r\nhost: test\r\n\r\n")
        .expect("send");
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.ends_with(b"\r\n\r\nok") {
        let n = conn.read(&mut buf).expect("read");
        assert!(n > 0, "the server closed the connection");
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got.starts_with(b"HTTP/1.1 200"), "{got:?}");
}

#[test]
fn registering_request_timers_does_not_wake_the_driver_through_its_event_fd() {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<(SocketAddr, String)>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let tid = std::fs::read_link("/proc/thread-self")
                .expect("thread-self")
                .file_name()
                .expect("tid")
                .to_string_lossy()
                .into_owned();
            ready_tx
                .send((listener.local_addr().expect("addr"), tid))
                .expect("ready");
            let mut http = http1::Builder::new();
            http.keep_alive(true).writev(false);
            let stop = async move {
                let _ = stop_rx.await;
            };
            let graceful =
                idem_net::serve::accept_until(listener, &http, None, |_| service_fn(answer), stop)
                    .await;
            graceful.shutdown().await;
        });
    });
    let (addr, tid) = ready_rx.recv().expect("server ready");
    let mut conn = TcpStream::connect(addr).expect("connect");
    conn.set_nodelay(true).expect("nodelay");
    // The first exchange lets the loop start and park with its own timer pending.
    exchange(&mut conn);
    std::thread::sleep(Duration::from_millis(20));
    let before = write_calls(&tid);
    for _ in 0..REQUESTS {
        exchange(&mut conn);
    }
    let writes = write_calls(&tid) - before;
    drop(conn);
    let _ = stop_tx.send(());
    server.join().expect("server thread");
    // The pending timer itself may fire (once a second) and re-arm with one wake-up;
    // without it each request's timer was one write.
    assert!(
        writes < REQUESTS / 10,
        "{writes} write calls on the serving thread for {REQUESTS} requests"
    );
}
