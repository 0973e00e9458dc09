//! The two-layer guard as a user runs it: `idem serve` and `idem gateway` as real
//! processes on loopback, driven by a real HTTP client, with whole-process faults
//! (SIGSTOP, SIGTERM).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const ALICE: &str = "alice-secret-0001";
const BOB: &str = "bob-secret-00002";

mod common;
use common::{free_port, serve_sqlite, spawn, spawn_to, wait_ready, Proc};

/// `idem serve` on SQLite with tenants `a` (Alice's key) and `b` (Bob's).
async fn serve(dir: &Path) -> (Proc, String) {
    serve_sqlite(&dir.join("orders.db"), &[("a", ALICE), ("b", BOB)]).await
}

/// `idem gateway` in front of `upstream`, with `extra` merged into its JSON config.
async fn gateway(dir: &Path, upstream: &str, extra: Value) -> (Proc, String) {
    gateway_logged(dir, upstream, extra, None).await
}

/// [`gateway`], its log written to `log` when given.
async fn gateway_logged(
    dir: &Path,
    upstream: &str,
    extra: Value,
    log: Option<&Path>,
) -> (Proc, String) {
    let (path, port) = gateway_file(dir, upstream, extra);
    gateway_from(&path, port, log).await
}

/// A gateway configuration file for `upstream` on a free port.
fn gateway_file(dir: &Path, upstream: &str, extra: Value) -> (std::path::PathBuf, u16) {
    let port = free_port();
    let mut cfg = json!({
        "listen": format!("127.0.0.1:{port}"),
        "upstream": upstream,
        "routes": [{"methods": ["POST"], "path": "/v1/*", "key": "required"}],
    });
    for (k, v) in extra.as_object().unwrap() {
        cfg[k] = v.clone();
    }
    let path = dir.join(format!("gateway-{port}.json"));
    std::fs::write(&path, cfg.to_string()).unwrap();
    (path, port)
}

/// `idem gateway --config path`, listening on `port`.
async fn gateway_from(path: &Path, port: u16, log: Option<&Path>) -> (Proc, String) {
    let args = ["gateway", "--config", path.to_str().unwrap()];
    let proc = match log {
        Some(log) => spawn_to("idem gateway", &args, std::fs::File::create(log).unwrap()),
        None => spawn("idem gateway", &args),
    };
    let url = format!("http://127.0.0.1:{port}");
    wait_ready(&format!("{url}/_idem/health")).await;
    (proc, url)
}

fn order(
    c: &reqwest::Client,
    base: &str,
    token: Option<&str>,
    key: &str,
) -> reqwest::RequestBuilder {
    let mut r = c
        .post(format!("{base}/v1/orders"))
        .header("idempotency-key", key)
        .json(&json!({"user_id": "U-7318", "show_id": "S-204", "quantity": 1}));
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    r
}

async fn orders_of(c: &reqwest::Client, serve: &str, token: &str) -> Vec<Value> {
    let v: Value = c
        .get(format!("{serve}/v1/orders?user_id=U-7318"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["orders"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn behind_the_gateway_each_caller_gets_only_its_own_result() {
    let dir = tempfile::tempdir().unwrap();
    let (_serve, serve_url) = serve(dir.path()).await;
    let (_gw, gw) = gateway(dir.path(), &serve_url, json!({})).await;
    let c = reqwest::Client::new();
    let key = format!("confirm-U-7318-S-204-{}", uuid::Uuid::now_v7().simple());

    let a = order(&c, &gw, Some(ALICE), &key).send().await.unwrap();
    assert_eq!(a.status(), 201);
    let a: Value = a.json().await.unwrap();
    let a_again = order(&c, &gw, Some(ALICE), &key).send().await.unwrap();
    assert_eq!(a_again.headers()["idempotent-replayed"], "true");
    let a_again: Value = a_again.json().await.unwrap();
    assert_eq!(a_again["order_id"], a["order_id"]);

    // Bob with the same key: his own order in his own tenant, not Alice's answer.
    let b = order(&c, &gw, Some(BOB), &key).send().await.unwrap();
    assert_eq!(b.status(), 201);
    assert!(!b.headers().contains_key("idempotent-replayed"));
    let b: Value = b.json().await.unwrap();
    assert_ne!(b["order_id"], a["order_id"]);

    // No credential: refused by the gateway, nothing stored under the key.
    let anon = order(&c, &gw, None, &key).send().await.unwrap();
    assert_eq!(anon.status(), 401);
    // A wrong credential: the upstream's 401 is passed on, never kept.
    for _ in 0..2 {
        let wrong = order(&c, &gw, Some("not-a-real-key-1"), &key)
            .send()
            .await
            .unwrap();
        assert_eq!(wrong.status(), 401);
        assert!(!wrong.headers().contains_key("idempotent-replayed"));
    }
    // A Connection header that would strip the credential, and keys a folding proxy
    // would make: refused at the edge, never forwarded.
    let r = order(&c, &gw, Some(ALICE), &format!("{key}-conn"))
        .header("connection", "authorization")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    for bad in ["a,b", "abc;x=1"] {
        let r = order(&c, &gw, Some(ALICE), bad).send().await.unwrap();
        assert_eq!(r.status(), 400, "{bad}");
    }
    assert_eq!(orders_of(&c, &serve_url, ALICE).await.len(), 1);
    assert_eq!(orders_of(&c, &serve_url, BOB).await.len(), 1);
}

#[tokio::test]
async fn a_full_window_refuses_new_keys_instead_of_forwarding_them() {
    let dir = tempfile::tempdir().unwrap();
    let (_serve, serve_url) = serve(dir.path()).await;
    let (_gw, gw) = gateway(
        dir.path(),
        &serve_url,
        json!({
            "memory_window_bytes": 2048,
            "window_partition_bytes": 2048,
            "max_stored_bytes": 2048,
            "window_ms": 30000,
        }),
    )
    .await;
    let c = reqwest::Client::new();
    let mut full = false;
    for i in 0..100 {
        let r = order(
            &c,
            &gw,
            Some(ALICE),
            &format!("fill-{i}-{}", uuid::Uuid::now_v7().simple()),
        )
        .send()
        .await
        .unwrap();
        if r.status() == 503 {
            // Room comes back when the first record expires, within the window.
            let after: u64 = r.headers()["retry-after"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!((1..=30).contains(&after), "Retry-After {after}");
            full = true;
            break;
        }
        assert_eq!(r.status(), 201);
    }
    assert!(full, "the budget bit");
    let before = orders_of(&c, &serve_url, ALICE).await.len();
    let key = format!("while-full-{}", uuid::Uuid::now_v7().simple());
    for _ in 0..3 {
        let r = order(&c, &gw, Some(ALICE), &key).send().await.unwrap();
        assert_eq!(r.status(), 503);
    }
    assert_eq!(
        orders_of(&c, &serve_url, ALICE).await.len(),
        before,
        "nothing forwarded"
    );
    let health: Value = c
        .get(format!("{gw}/_idem/health"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["status"], "degraded");
}

#[tokio::test]
async fn a_paused_service_resolves_through_the_state_query_with_one_order() {
    let dir = tempfile::tempdir().unwrap();
    let (serve, serve_url) = serve(dir.path()).await;
    let (_gw, gw) = gateway(
        dir.path(),
        &serve_url,
        json!({"upstream_timeout_ms": 800, "state_query": {"timeout_ms": 5000}}),
    )
    .await;
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let key = format!("paused-{}", uuid::Uuid::now_v7().simple());

    serve.signal("STOP");
    let resume = std::thread::spawn({
        let pid = serve.pid();
        move || {
            std::thread::sleep(Duration::from_secs(2));
            Command::new("kill")
                .args(["-CONT", &pid.to_string()])
                .status()
                .unwrap();
        }
    });
    let t = Instant::now();
    let r = order(&c, &gw, Some(ALICE), &key).send().await.unwrap();
    resume.join().unwrap();
    assert_eq!(r.status(), 201, "{:?}", r.text().await);
    assert!(t.elapsed() >= Duration::from_secs(2));
    let body: Value = r.json().await.unwrap();
    let orders = orders_of(&c, &serve_url, ALICE).await;
    assert_eq!(orders.len(), 1, "{orders:?}");
    assert_eq!(orders[0]["order_id"], body["order_id"]);
}

fn redis_url() -> String {
    std::env::var("IDEM_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

async fn redis_or_skip() -> Option<redis::aio::MultiplexedConnection> {
    let reach = async {
        let client = redis::Client::open(redis_url())?;
        client.get_multiplexed_async_connection().await
    };
    match tokio::time::timeout(Duration::from_secs(3), reach).await {
        Ok(Ok(c)) => Some(c),
        other => {
            let why = match other {
                Ok(Err(e)) => e.to_string(),
                _ => "timed out".into(),
            };
            assert!(
                std::env::var("IDEM_REQUIRE_SERVICES").as_deref() != Ok("1"),
                "Redis required: {why}"
            );
            println!("SKIPPED: Redis unreachable ({why})");
            None
        }
    }
}

#[tokio::test]
async fn sigterm_drains_the_gateway_and_frees_a_cut_off_key() {
    let Some(mut redis) = redis_or_skip().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (serve, serve_url) = serve(dir.path()).await;
    let prefix = format!("idem-edge-{}", uuid::Uuid::now_v7().simple());
    let extra = json!({
        "redis_url": redis_url(),
        "redis_prefix": prefix,
        "lease_ms": 30000,
        "shutdown_grace_ms": 500,
        "upstream_timeout_ms": 20000,
        "auth": {"principal_secret": "edge-test-principal-secret"},
    });
    let (mut gw_proc, gw) = gateway(dir.path(), &serve_url, extra.clone()).await;
    let c = reqwest::Client::new();

    // A request that finishes within the grace completes.
    let quick = format!("quick-{}", uuid::Uuid::now_v7().simple());
    assert_eq!(
        order(&c, &gw, Some(ALICE), &quick)
            .send()
            .await
            .unwrap()
            .status(),
        201
    );

    // A request the paused service holds past the grace.
    serve.signal("STOP");
    let key = format!("cut-off-{}", uuid::Uuid::now_v7().simple());
    let pending = tokio::spawn(order(&c, &gw, Some(ALICE), &key).send());
    // And one whose caller hangs up first: its execution goes on in the gateway.
    let abandoned = format!("abandoned-{}", uuid::Uuid::now_v7().simple());
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    assert!(order(&impatient, &gw, Some(ALICE), &abandoned)
        .send()
        .await
        .is_err());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let h: Value = c
            .get(format!("{gw}/_idem/health"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if h["in_flight"] == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "both executions in flight: {h}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let t = Instant::now();
    gw_proc.signal("TERM");
    let status = tokio::task::spawn_blocking(move || {
        let s = gw_proc.wait_exit(Duration::from_secs(10));
        (s, gw_proc)
    })
    .await
    .unwrap();
    assert!(status.0.success(), "{:?}", status.0);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // The cut-off caller got an answer (retry with the same key), not a dropped connection.
    let answer = pending.await.unwrap().unwrap();
    assert_eq!(answer.status(), 504);
    serve.signal("CONT");

    // The window record ended retryable at once, not 30 s later when its lease ends: a
    // second gateway on the same window takes the key now.
    let (_gw2, gw2) = gateway(dir.path(), &serve_url, extra).await;
    let t = Instant::now();
    let r = order(&c, &gw2, Some(ALICE), &key).send().await.unwrap();
    assert_eq!(r.status(), 201, "{:?}", r.text().await);
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let t = Instant::now();
    let r = order(&c, &gw2, Some(ALICE), &abandoned)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert_eq!(orders_of(&c, &serve_url, ALICE).await.len(), 3);

    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(&mut redis)
        .await
        .unwrap();
    if !keys.is_empty() {
        let _: i64 = redis::cmd("DEL")
            .arg(&keys)
            .query_async(&mut redis)
            .await
            .unwrap();
    }
}

/// The stand-in upstream (in this process; the gateway under test is the process).
async fn stub() -> idem_stub::Stub {
    idem_stub::Stub::start("x-idem-tenant").await.unwrap()
}

fn fresh(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::now_v7().simple())
}

fn keyed(c: &reqwest::Client, base: &str, path: &str, key: &str) -> reqwest::RequestBuilder {
    c.post(format!("{base}{path}"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(r#"{"show":"S-204"}"#)
}

async fn problem_type(r: reqwest::Response) -> (u16, String) {
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap();
    let t = body["type"].as_str().unwrap_or_default();
    (status, t.rsplit('/').next().unwrap().to_string())
}

fn retry_after(r: &reqwest::Response) -> u64 {
    r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// Waits until `log` holds `needle`, up to 5 s.
async fn log_holds(log: &Path, needle: &str) -> bool {
    for _ in 0..100 {
        if std::fs::read_to_string(log)
            .unwrap_or_default()
            .contains(needle)
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn blank_credentials_name_no_caller_and_each_credential_header_tells_callers_apart() {
    let dir = tempfile::tempdir().unwrap();
    let up = stub().await;
    let (_gw, gw) = gateway(
        dir.path(),
        &up.url(),
        json!({"auth": {"upstream_credential_headers": ["x-session"]}}),
    )
    .await;
    let c = reqwest::Client::new();

    // Two callers with an empty Authorization and different API keys: two callers.
    let key = fresh("blank-auth");
    for who in ["alice-api-key", "bob-api-key"] {
        let r = keyed(&c, &gw, "/v1/orders", &key)
            .header("authorization", "")
            .header("x-api-key", who)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "{who}");
        assert!(!r.headers().contains_key("idempotent-replayed"), "{who}");
    }
    assert_eq!(up.state.executions(&key), 2);

    // Two callers sharing a consent cookie, differing in the header the upstream
    // authenticates by: two callers.
    let key = fresh("shared-cookie");
    for session in ["s-1", "s-2"] {
        let r = keyed(&c, &gw, "/v1/orders", &key)
            .header("cookie", "consent=yes")
            .header("x-session", session)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "{session}");
        assert!(!r.headers().contains_key("idempotent-replayed"));
    }
    assert_eq!(up.state.executions(&key), 2);

    // Nothing but blank credentials: no caller, nothing forwarded or recorded.
    let calls = up.state.total_calls();
    for (name, value) in [
        ("authorization", ""),
        ("authorization", "   "),
        ("authorization", "Bearer"),
        ("cookie", " "),
        ("x-api-key", ""),
    ] {
        let r = keyed(&c, &gw, "/v1/orders", &fresh("blank"))
            .header(name, value)
            .send()
            .await
            .unwrap();
        assert_eq!(
            problem_type(r).await,
            (401, "unauthenticated".into()),
            "{name}: {value:?}"
        );
    }
    assert_eq!(up.state.total_calls(), calls);
}

#[tokio::test]
async fn start_up_warns_about_an_identity_without_the_upstreams_credential_or_a_shared_secret_file()
{
    let dir = tempfile::tempdir().unwrap();
    let up = stub().await;
    let log = dir.path().join("narrow.log");
    let (_gw, _) = gateway_logged(
        dir.path(),
        &up.url(),
        json!({"auth": {
            "credential_headers": ["cookie:sid"],
            "upstream_credential_headers": ["x-session"],
        }}),
        Some(&log),
    )
    .await;
    assert!(
        log_holds(&log, "leaves out x-session").await,
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );

    // A configuration holding API keys, readable by others: warned; once private: not.
    use std::os::unix::fs::PermissionsExt;
    let keys = json!({"auth": {"api_keys": {"gw-key-0123456789abcdef": "t1"}}});
    for (mode, warned) in [(0o644, true), (0o600, false)] {
        let (path, port) = gateway_file(dir.path(), &up.url(), keys.clone());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        let log = dir.path().join(format!("mode-{mode:o}.log"));
        let (_gw, _) = gateway_from(&path, port, Some(&log)).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(
            text.contains("readable by other users"),
            warned,
            "mode {mode:o}: {text}"
        );
        assert!(!text.contains("gw-key-0123456789abcdef"), "never the key");
    }
}

#[tokio::test]
async fn callers_who_cannot_authenticate_leave_nothing_in_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let up = stub().await;
    let (_gw, gw) = gateway(
        dir.path(),
        &up.url(),
        json!({
            "memory_window_bytes": 300_000,
            "window_partition_bytes": 300_000,
            "max_stored_bytes": 65_536,
        }),
    )
    .await;
    let c = reqwest::Client::new();
    // Each garbage credential is a caller of its own; the upstream refuses every one.
    let long = "k".repeat(200);
    for i in 0..400 {
        let r = keyed(&c, &gw, "/v1/guarded", &format!("{long}-{i}"))
            .header("authorization", format!("Bearer garbage-{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "request {i}");
    }
    let health: Value = c
        .get(format!("{gw}/_idem/health"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["window_full"], false, "{health}");
    // A caller who can authenticate is served, on a key a garbage caller used too.
    let r = keyed(&c, &gw, "/v1/guarded", &format!("{long}-0"))
        .header("authorization", "Bearer good")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
}

#[tokio::test]
async fn one_caller_cannot_fill_the_window_or_hold_every_execution() {
    let dir = tempfile::tempdir().unwrap();
    let up = stub().await;
    let (_gw, gw) = gateway(
        dir.path(),
        &up.url(),
        json!({
            "memory_window_bytes": 200_000,
            "max_stored_bytes": 65_536,
            "window_partition_bytes": 4_000,
            "window_ms": 4_000,
            "max_in_progress_per_caller": 2,
        }),
    )
    .await;
    let c = reqwest::Client::new();
    let mut kept = Vec::new();
    let refused = loop {
        let key = fresh("greedy");
        let r = keyed(&c, &gw, "/v1/orders", &key)
            .header("authorization", "Bearer greedy")
            .send()
            .await
            .unwrap();
        if r.status() != 201 {
            break r;
        }
        kept.push(key);
        assert!(kept.len() < 100, "the caller's share never ran out");
    };
    let after = retry_after(&refused);
    assert!((1..=4).contains(&after), "Retry-After {after}");
    assert_eq!(
        problem_type(refused).await,
        (429, "caller-quota-exceeded".into())
    );
    // Everyone else is still served, and the greedy caller's keys still replay.
    let r = keyed(&c, &gw, "/v1/orders", &fresh("polite"))
        .header("authorization", "Bearer polite")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let r = keyed(&c, &gw, "/v1/orders", &kept[0])
        .header("authorization", "Bearer greedy")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["idempotent-replayed"], "true");
    // When Retry-After said, there is room again.
    tokio::time::sleep(Duration::from_millis(after * 1000 + 300)).await;
    let r = keyed(&c, &gw, "/v1/orders", &fresh("greedy-later"))
        .header("authorization", "Bearer greedy")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);

    // Keys in progress: two per caller; a third waits its turn, other callers do not.
    up.state.delay_executions(Duration::from_millis(1500));
    let send = |who: &'static str| {
        let c = c.clone();
        let gw = gw.clone();
        tokio::spawn(async move {
            keyed(&c, &gw, "/v1/orders", &fresh("slow"))
                .header("authorization", format!("Bearer {who}"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        })
    };
    let hogs: Vec<_> = (0..3).map(|_| send("hog")).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let other = send("other");
    let mut statuses = Vec::new();
    for h in hogs {
        statuses.push(h.await.unwrap());
    }
    statuses.sort();
    assert_eq!(statuses, [201, 201, 429]);
    assert_eq!(other.await.unwrap(), 201);
}

/// Resident memory of a process, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

/// One slow client: a 1 MiB keyed body in 32 KiB pieces, with or without a
/// `Content-Length`; the status it got (0: none before the connection closed).
async fn trickle(addr: String, i: usize, chunked: bool) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const SIZE: usize = 1024 * 1024;
    const PIECE: usize = 32 * 1024;
    let Ok(stream) = tokio::net::TcpStream::connect(&addr).await else {
        return 0;
    };
    let (mut rd, mut wr) = stream.into_split();
    let framing = if chunked {
        "transfer-encoding: chunked".to_string()
    } else {
        format!("content-length: {SIZE}")
    };
    let head = format!(
        "POST /v1/guarded HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer garbage-{i}\r\n\
         idempotency-key: slow-body-{i}\r\ncontent-type: application/octet-stream\r\n{framing}\r\n\r\n"
    );
    let writer = async move {
        wr.write_all(head.as_bytes()).await?;
        let piece = vec![b'x'; PIECE];
        for _ in 0..SIZE / PIECE {
            if chunked {
                wr.write_all(format!("{PIECE:x}\r\n").as_bytes()).await?;
                wr.write_all(&piece).await?;
                wr.write_all(b"\r\n").await?;
            } else {
                wr.write_all(&piece).await?;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        if chunked {
            wr.write_all(b"0\r\n\r\n").await?;
        }
        Ok::<_, std::io::Error>(wr)
    };
    let writing = tokio::spawn(writer);
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        match tokio::time::timeout(Duration::from_secs(30), rd.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => answer.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    writing.abort();
    let text = String::from_utf8_lossy(&answer);
    text.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_keyed_bodies_are_bounded_and_their_memory_returns() {
    const MIB: u64 = 1024 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let up = stub().await;
    let (gw_proc, gw) = gateway(
        dir.path(),
        &up.url(),
        json!({"max_buffered_body_bytes": 16 * MIB, "body_read_timeout_ms": 30_000}),
    )
    .await;
    let pid = gw_proc.pid();
    let c = reqwest::Client::new();
    let r = keyed(&c, &gw, "/v1/orders", &fresh("warm"))
        .header("authorization", "Bearer warm")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let baseline = rss(pid);

    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(baseline));
    let sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let (peak, sampling) = (peak.clone(), sampling.clone());
        tokio::spawn(async move {
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                peak.fetch_max(rss(pid), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let addr = gw.trim_start_matches("http://").to_string();
    let clients: Vec<_> = (0..200)
        .map(|i| tokio::spawn(trickle(addr.clone(), i, i % 2 == 1)))
        .collect();
    let mut by_status = std::collections::BTreeMap::<u16, usize>::new();
    for c in clients {
        *by_status.entry(c.await.unwrap()).or_default() += 1;
    }
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    sampler.await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss(pid);
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "gateway RSS: {:.1} MiB before, {:.1} MiB at the peak of 200 slow 1 MiB bodies \
         (budget 16 MiB), {:.1} MiB 2 s after; answers {by_status:?}",
        baseline as f64 / MIB as f64,
        peak as f64 / MIB as f64,
        after as f64 / MIB as f64,
    );
    assert!(
        by_status.get(&503).copied().unwrap_or(0) > 0,
        "the budget refused some: {by_status:?}"
    );
    assert!(
        by_status.get(&401).copied().unwrap_or(0) >= 8,
        "bodies within the budget went through: {by_status:?}"
    );
    assert!(
        peak < baseline + 64 * MIB,
        "peak {peak} vs baseline {baseline}"
    );
    assert!(
        after < baseline + 24 * MIB,
        "after {after} vs baseline {baseline}"
    );
    // Still serving.
    let r = keyed(&c, &gw, "/v1/orders", &fresh("after"))
        .header("authorization", "Bearer warm")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
}

#[tokio::test]
async fn the_gateway_mints_its_own_request_id_and_keeps_the_clients_apart() {
    let dir = tempfile::tempdir().unwrap();
    let up = stub().await;
    let (_gw, gw) = gateway(dir.path(), &up.url(), json!({})).await;
    let c = reqwest::Client::new();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let r = c
            .get(format!("{gw}/echo"))
            .header("x-request-id", "client-chosen-1")
            .send()
            .await
            .unwrap();
        let ours = r.headers()["x-request-id"].to_str().unwrap().to_string();
        let echo: Value = r.json().await.unwrap();
        assert_ne!(ours, "client-chosen-1");
        let upstream_saw = echo["headers"]["x-request-id"].clone();
        assert_eq!(upstream_saw, json!(ours), "{echo}");
        seen.push(ours);
    }
    assert_ne!(
        seen[0], seen[1],
        "a repeated client id never makes one request id"
    );
}
