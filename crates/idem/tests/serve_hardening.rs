//! `idem serve` as an operator runs it, hardened: the `idem` binary in its own process on
//! a fresh SQLite file, spoken to by a real HTTP client and by raw TCP where a client
//! misbehaves. Each test has its own directory and ports (the server binds 127.0.0.1:0
//! and says where); a process still running at the end is killed.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_idem");
/// Tenant `t`'s API key.
const KEY: &str = "t-secret-key-0001";
const ADMIN: &str = "admin-token-0123456789";

struct Db {
    _dir: tempfile::TempDir,
    path: PathBuf,
    url: String,
}

fn db() -> Db {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.db");
    Db {
        url: format!("sqlite://{}", path.display()),
        path,
        _dir: dir,
    }
}

/// `idem --database-url URL ARGS…`, under umask 022 (what a login shell usually has, so
/// file modes are the server's doing), without the caller's idem environment.
fn command(url: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("umask 022 && exec \"$0\" \"$@\"")
        .arg(BIN)
        .arg("--database-url")
        .arg(url)
        .args(args)
        .env_remove("IDEM_DATABASE_URL")
        .env_remove("IDEM_ADMIN_TOKEN")
        .env_remove("IDEM_API_KEYS")
        .env_remove("IDEM_LOG")
        .envs(env.iter().copied())
        .stdin(Stdio::null());
    cmd
}

/// A one-shot CLI command (`keys show`, `lock acquire`, …) on the same database.
fn idem(url: &str, args: &[&str]) -> Output {
    command(url, args, &[]).output().expect("run idem")
}

fn key_state(url: &str, key: &str) -> Option<String> {
    let out = idem(url, &["keys", "show", key, "--tenant", "t", "--json"]);
    if !out.status.success() {
        return None;
    }
    let v: Value = serde_json::from_slice(&out.stdout).expect("keys show --json");
    v["state"].as_str().map(str::to_owned)
}

fn wait_for_state(url: &str, key: &str, state: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let now = key_state(url, key);
        if now.as_deref() == Some(state) {
            return;
        }
        assert!(Instant::now() < deadline, "{key} is {now:?}, never {state}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A running `idem serve`.
struct Serve {
    child: Child,
    addr: String,
    metrics_addr: Option<String>,
    stderr: Arc<Mutex<String>>,
}

impl Serve {
    /// `idem serve --listen 127.0.0.1:0 ARGS…`, ready once it printed where it listens.
    fn start(db: &Db, args: &[&str], env: &[(&str, &str)]) -> Serve {
        let mut all = vec!["serve", "--listen", "127.0.0.1:0", "--sweep-every", "0s"];
        all.extend_from_slice(args);
        let mut child = command(&db.url, &all, env)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn idem serve");
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut err = child.stderr.take().unwrap();
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let (tx, rx) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut serve = Serve {
            child,
            addr: String::new(),
            metrics_addr: None,
            stderr,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match rx.recv_timeout(left) {
                Ok(line) => line,
                Err(_) => panic!("idem serve did not start:\n{}", serve.stderr()),
            };
            if let Some(url) = line.strip_prefix("idem orders listening on http://") {
                serve.addr = url.trim().to_owned();
            } else if let Some(m) = line.trim().strip_prefix("metrics: http://") {
                serve.metrics_addr = Some(m.trim_end_matches("/metrics").to_owned());
            } else if line.trim().starts_with("database:") {
                // Printed after the addresses: everything is known.
                break;
            }
        }
        serve
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    fn sigterm(&self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -TERM failed");
    }

    fn exit_within(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "still running after {within:?}:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a command that must refuse to start; a server that starts anyway is killed.
fn refused(mut cmd: Command) -> (ExitStatus, String) {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the server started instead of refusing");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (status, stderr)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

struct Reply {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
    text: String,
}

async fn reply(r: reqwest::Response) -> Reply {
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().await.unwrap();
    Reply {
        status,
        headers,
        body: serde_json::from_str(&text).unwrap_or(Value::Null),
        text,
    }
}

async fn post(
    http: &reqwest::Client,
    url: String,
    token: &str,
    key: Option<&str>,
    body: &Value,
) -> Reply {
    let mut req = http.post(url).bearer_auth(token).json(body);
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    reply(req.send().await.expect("request")).await
}

async fn get(http: &reqwest::Client, url: String, token: Option<&str>) -> Reply {
    let mut req = http.get(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    reply(req.send().await.expect("request")).await
}

async fn create_order(http: &reqwest::Client, s: &Serve, key: &str) -> String {
    let r = post(
        http,
        s.url("/v1/orders"),
        KEY,
        Some(key),
        &json!({"user_id": "U-1", "show_id": "S-204", "quantity": 1}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    r.body["order_id"].as_str().unwrap().to_owned()
}

/// Sends `request` on a fresh connection and reads until the server closes it (or
/// `read_for` passes). Returns what arrived, when it ended, and whether it was closed.
fn raw(addr: &str, request: &[u8], read_for: Duration) -> (String, Duration, bool) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.write_all(request).unwrap();
    stream.set_read_timeout(Some(read_for)).unwrap();
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match stream.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => break false,
        }
        if start.elapsed() > read_for {
            break false;
        }
    };
    (
        String::from_utf8_lossy(&got).into_owned(),
        start.elapsed(),
        closed,
    )
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

// ---------------------------------------------------------------------------------------
// Item 7: request head and body read timeouts

const HALF_HEAD: &[u8] = b"POST /v1/orders HTTP/1.1\r\nHost: idem\r\nAuthoriz";

#[test]
fn a_half_sent_request_head_is_closed_after_the_header_read_timeout() {
    let db = db();
    let key = format!("t={KEY}");
    let s = Serve::start(
        &db,
        &["--api-key", &key, "--header-read-timeout", "1s"],
        &[],
    );
    let (_, took, closed) = raw(&s.addr, HALF_HEAD, Duration::from_secs(8));
    assert!(closed, "a half-sent head was held open for {took:?}");
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(5),
        "closed after {took:?}, not about 1 s"
    );
    let rt = runtime();
    let ok = rt.block_on(get(&client(), s.url("/healthz"), None));
    assert_eq!(ok.status, 200, "the server still serves others");
}

#[test]
fn the_default_header_read_timeout_is_10_seconds() {
    let db = db();
    let key = format!("t={KEY}");
    let s = Serve::start(&db, &["--api-key", &key], &[]);
    let (_, took, closed) = raw(&s.addr, HALF_HEAD, Duration::from_secs(25));
    assert!(closed, "a half-sent head was held open for {took:?}");
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(16),
        "closed after {took:?}, not about 10 s"
    );
}

#[test]
fn a_stalled_body_gets_408_problem_json_and_its_connection_closed() {
    let db = db();
    let key = format!("t={KEY}");
    let s = Serve::start(
        &db,
        &[
            "--api-key",
            &key,
            "--admin-token",
            ADMIN,
            "--body-read-timeout",
            "1s",
        ],
        &[],
    );
    let keyed = format!(
        "POST /v1/orders HTTP/1.1\r\nHost: idem\r\nAuthorization: Bearer {KEY}\r\n\
         Idempotency-Key: stall-1\r\nContent-Type: application/json\r\n\
         Content-Length: 100\r\n\r\n{{\"user_id\":"
    );
    let admin = format!(
        "POST /v1/admin/freezes HTTP/1.1\r\nHost: idem\r\nAuthorization: Bearer {ADMIN}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"scope\":"
    );
    for request in [keyed, admin] {
        let (answer, took, closed) = raw(&s.addr, request.as_bytes(), Duration::from_secs(8));
        assert!(
            answer.starts_with("HTTP/1.1 408"),
            "after {took:?}: {answer:?}"
        );
        let lower = answer.to_ascii_lowercase();
        assert!(
            lower.contains("content-type: application/problem+json"),
            "{answer}"
        );
        assert!(answer.contains("/request-timeout\""), "{answer}");
        assert!(answer.contains("\"request_id\""), "{answer}");
        assert!(closed, "the connection stayed open after the 408");
        assert!(took < Duration::from_secs(5), "{took:?}");
    }
    assert_eq!(key_state(&db.url, "stall-1"), None, "nothing was recorded");

    // Without a credential nothing is buffered: refused at once, not after the timeout.
    for (path, status) in [("/v1/orders", "401"), ("/v1/admin/freezes", "401")] {
        let anonymous = format!(
            "POST {path} HTTP/1.1\r\nHost: idem\r\nContent-Type: application/json\r\n\
             Content-Length: 100\r\n\r\n{{\"x\":"
        );
        let (answer, took, _) = raw(&s.addr, anonymous.as_bytes(), Duration::from_secs(8));
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{path} after {took:?}: {answer:?}"
        );
        assert!(took < Duration::from_millis(900), "{path}: {took:?}");
    }
}

// ---------------------------------------------------------------------------------------
// Item 8: SIGTERM drains within the grace; what it cuts off is retryable at once

/// Holds the order's lease from outside, so a pay request for it waits in its handler
/// (a real wait: the handler queues behind the lease like behind another request).
fn hold_order_lease(url: &str, order_id: &str) -> i64 {
    let out = idem(
        url,
        &[
            "lock",
            "acquire",
            &format!("order:t:{order_id}"),
            "--owner",
            "test-holder",
            "--ttl",
            "60s",
            "--json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["token"].as_i64().unwrap()
}

fn release_order_lease(url: &str, order_id: &str, token: i64) {
    let out = idem(
        url,
        &[
            "lock",
            "release",
            &format!("order:t:{order_id}"),
            "--owner",
            "test-holder",
            "--token",
            &token.to_string(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn sigterm_lets_the_request_in_flight_finish_then_exits_0() {
    let db = db();
    let key = format!("t={KEY}");
    // The default grace, 10 s.
    let mut s = Serve::start(&db, &["--api-key", &key], &[]);
    let rt = runtime();
    let http = client();
    let order = rt.block_on(create_order(&http, &s, "drain-create"));
    let token = hold_order_lease(&db.url, &order);
    let pay = rt.spawn({
        let (http, url) = (http.clone(), s.url(&format!("/v1/orders/{order}/pay")));
        async move { post(&http, url, KEY, Some("drain-pay"), &json!({})).await }
    });
    wait_for_state(&db.url, "drain-pay", "PROCESSING", Duration::from_secs(10));

    s.sigterm();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        s.running(),
        "exited with a request in flight:\n{}",
        s.stderr()
    );
    assert!(
        TcpStream::connect(&s.addr).is_err(),
        "still accepting after SIGTERM"
    );
    release_order_lease(&db.url, &order, token);
    let paid = rt.block_on(pay).unwrap();
    assert_eq!(
        paid.status, 200,
        "the request in flight finished: {}",
        paid.text
    );
    let status = s.exit_within(Duration::from_secs(5));
    assert_eq!(status.code(), Some(0), "{}", s.stderr());
    assert_eq!(
        key_state(&db.url, "drain-pay").as_deref(),
        Some("SUCCEEDED")
    );
}

#[test]
fn sigterm_cuts_off_an_execution_past_the_grace_and_its_key_is_retryable_at_once() {
    let db = db();
    let key = format!("t={KEY}");
    let mut s = Serve::start(&db, &["--api-key", &key, "--shutdown-grace", "1s"], &[]);
    let rt = runtime();
    let http = client();
    let order = rt.block_on(create_order(&http, &s, "cut-create"));
    let token = hold_order_lease(&db.url, &order);
    let pay = rt.spawn({
        let (http, url) = (http.clone(), s.url(&format!("/v1/orders/{order}/pay")));
        async move {
            http.post(url)
                .bearer_auth(KEY)
                .header("Idempotency-Key", "cut-pay")
                .json(&json!({}))
                .send()
                .await
        }
    });
    wait_for_state(&db.url, "cut-pay", "PROCESSING", Duration::from_secs(10));

    let sent = Instant::now();
    s.sigterm();
    let status = s.exit_within(Duration::from_secs(8));
    let took = sent.elapsed();
    assert_eq!(status.code(), Some(0), "{}", s.stderr());
    assert!(
        took >= Duration::from_millis(900),
        "exited after {took:?}, before the grace"
    );
    // The handler would have waited 10 s for the lease; the grace is 1 s.
    assert!(took < Duration::from_secs(7), "exited after {took:?}");
    // The caller still connected gets an answer, not a dropped connection.
    let answer = rt
        .block_on(pay)
        .unwrap()
        .expect("an answer before the exit");
    let status = answer.status().as_u16();
    let text = rt.block_on(answer.text()).unwrap();
    assert_eq!(status, 500, "{text}");
    assert!(text.contains("execution-failed"), "{text}");
    assert_eq!(
        key_state(&db.url, "cut-pay").as_deref(),
        Some("FAILED_RETRYABLE"),
        "the key is open at once, not PROCESSING until its 60 s lease ends"
    );

    // A restarted server takes the retry at once (no 60 s lease to wait out).
    release_order_lease(&db.url, &order, token);
    let s = Serve::start(&db, &["--api-key", &key], &[]);
    let retried = Instant::now();
    let paid = rt.block_on(post(
        &http,
        s.url(&format!("/v1/orders/{order}/pay")),
        KEY,
        Some("cut-pay"),
        &json!({}),
    ));
    assert_eq!(paid.status, 200, "{}", paid.text);
    assert!(retried.elapsed() < Duration::from_secs(5));
}

#[test]
fn sigterm_still_cuts_off_an_execution_whose_caller_hung_up() {
    let db = db();
    let key = format!("t={KEY}");
    let mut s = Serve::start(&db, &["--api-key", &key, "--shutdown-grace", "1s"], &[]);
    let rt = runtime();
    let http = client();
    let order = rt.block_on(create_order(&http, &s, "gone-create"));
    let token = hold_order_lease(&db.url, &order);
    // The caller gives up after 300 ms; the handler goes on waiting for the lease in a
    // task of its own, with no connection left for the drain to wait on.
    let gone = rt.block_on(async {
        reqwest::Client::builder()
            .timeout(Duration::from_millis(300))
            .build()
            .unwrap()
            .post(s.url(&format!("/v1/orders/{order}/pay")))
            .bearer_auth(KEY)
            .header("Idempotency-Key", "gone-pay")
            .json(&json!({}))
            .send()
            .await
    });
    assert!(gone.is_err(), "the caller hung up");
    wait_for_state(&db.url, "gone-pay", "PROCESSING", Duration::from_secs(10));

    let sent = Instant::now();
    s.sigterm();
    let status = s.exit_within(Duration::from_secs(8));
    assert_eq!(status.code(), Some(0), "{}", s.stderr());
    assert!(
        sent.elapsed() >= Duration::from_millis(900),
        "exited after {:?} without waiting for the execution",
        sent.elapsed()
    );
    assert_eq!(
        key_state(&db.url, "gone-pay").as_deref(),
        Some("FAILED_RETRYABLE"),
        "not left PROCESSING for its lease"
    );
    release_order_lease(&db.url, &order, token);
}

// ---------------------------------------------------------------------------------------
// Item 9: metrics behind the admin token, bounded labels, no database per scrape

#[test]
fn metrics_need_the_admin_token_and_carry_no_user_data() {
    let db = db();
    let key = format!("t={KEY}");
    let s = Serve::start(&db, &["--api-key", &key, "--admin-token", ADMIN], &[]);
    let rt = runtime();
    let http = client();
    rt.block_on(async {
        let frozen = post(
            &http,
            s.url("/v1/admin/freezes"),
            ADMIN,
            None,
            &json!({"scope": "user:alice@example.com", "what": "ticketing", "tenant": "t"}),
        )
        .await;
        assert_eq!(frozen.status, 201, "{}", frozen.text);

        let open = get(&http, s.url("/metrics"), None).await;
        assert_eq!(open.status, 401, "{}", open.text);
        let tenant = get(&http, s.url("/metrics"), Some(KEY)).await;
        assert_eq!(tenant.status, 401, "a tenant key is not the admin token");
        let admin = get(&http, s.url("/metrics"), Some(ADMIN)).await;
        assert_eq!(admin.status, 200, "{}", admin.text);
        let text = &admin.text;
        assert!(
            text.contains("idem_orders_freeze_active{scope_kind=\"user\",what=\"ticketing\"} 1"),
            "{text}"
        );
        assert!(!text.contains("alice"), "a user id in the metrics:\n{text}");
        assert!(!text.contains("tenant=\""), "{text}");
        // The alert rules read the service's series under the names exported here.
        let rules = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/alerts/idem-alerts.yml"
        ))
        .unwrap();
        let referenced: Vec<&str> = rules
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("idem_orders_") || w.starts_with("idem_http_"))
            .collect();
        assert!(referenced.len() >= 3, "{referenced:?}");
        for series in referenced {
            // A labelled counter has no sample before its first increment; its family
            // is declared all the same.
            let family = series.strip_suffix("_total").unwrap_or(series);
            assert!(
                text.contains(&format!("{series} "))
                    || text.contains(&format!("{series}{{"))
                    || text.contains(&format!("# TYPE {family} counter")),
                "{series} is not exported:\n{text}"
            );
        }
        assert!(
            text.contains("idem_orders_processing_past_lease 0"),
            "{text}"
        );
    });
}

#[test]
fn metrics_listen_serves_metrics_only_without_credentials() {
    let db = db();
    let key = format!("t={KEY}");
    let s = Serve::start(
        &db,
        &["--api-key", &key, "--metrics-listen", "127.0.0.1:0"],
        &[],
    );
    let internal = s.metrics_addr.clone().expect("metrics address printed");
    let rt = runtime();
    let http = client();
    rt.block_on(async {
        let scraped = get(&http, format!("http://{internal}/metrics"), None).await;
        assert_eq!(scraped.status, 200, "{}", scraped.text);
        assert!(
            scraped.text.contains("idem_orders_freeze_active"),
            "{}",
            scraped.text
        );
        let other = get(&http, format!("http://{internal}/v1/orders"), Some(KEY)).await;
        assert_eq!(other.status, 404, "the metrics address serves metrics only");
        // Without an admin token the main address has no metrics to give.
        let main = get(&http, s.url("/metrics"), None).await;
        assert_eq!(main.status, 403, "{}", main.text);
    });
}

/// In process, to take the database away under a running server: a scrape still
/// answers from the gauges the background refresh keeps.
#[test]
fn a_scrape_reads_no_database() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    rt.block_on(async {
        let server = idem_orders::bind(idem_orders::ServeConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            database_url: Some(format!("sqlite://{}", dir.path().join("m.db").display())),
            api_keys: vec![format!("t={KEY}").parse().unwrap()],
            admin_token: Some(ADMIN.into()),
            ..idem_orders::ServeConfig::default()
        })
        .await
        .unwrap();
        let http = client();
        let base = server.url();
        let before = get(&http, format!("{base}/metrics"), Some(ADMIN)).await;
        assert_eq!(before.status, 200, "{}", before.text);
        server
            .orders()
            .database()
            .sqlite()
            .unwrap()
            .pool()
            .close()
            .await;
        let health = get(&http, format!("{base}/healthz"), None).await;
        assert_eq!(health.status, 503, "the database is gone");
        for _ in 0..3 {
            let after = get(&http, format!("{base}/metrics"), Some(ADMIN)).await;
            assert_eq!(after.status, 200, "{}", after.text);
            assert!(after.text.contains("idem_orders_outbox_unpublished"));
        }
        drop(server);
    });
}

// ---------------------------------------------------------------------------------------
// Item 10: internal errors are logged, not answered

/// A trigger that fails every insert into `table` with `message`: the store answers
/// with an error whose text must not reach the client.
fn break_inserts(path: &Path, table: &str, message: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        use sqlx::Connection;
        let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
            .await
            .unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE TRIGGER break_{table} BEFORE INSERT ON {table} \
             BEGIN SELECT RAISE(ABORT, '{message}'); END"
        )))
        .execute(&mut conn)
        .await
        .unwrap();
        conn.close().await.unwrap();
    });
}

#[test]
fn internal_errors_answer_a_stable_detail_and_the_request_id() {
    let db = db();
    let key = format!("t={KEY}");
    let s = Serve::start(&db, &["--api-key", &key], &[]);
    let rt = runtime();
    let http = client();
    let order = json!({"user_id": "U-1", "show_id": "S-204", "quantity": 1});

    // The business write fails (the orders ledger).
    break_inserts(&db.path, "orders", "secret-ledger-text");
    let r = rt.block_on(async {
        reply(
            http.post(s.url("/v1/orders"))
                .bearer_auth(KEY)
                .header("Idempotency-Key", "leak-1")
                .header("x-request-id", "req-abc-123")
                .json(&order)
                .send()
                .await
                .unwrap(),
        )
        .await
    });
    assert_eq!(r.status, 500, "{}", r.text);
    // Our own request id, not the client's; the client's is logged beside it.
    let id = r.headers["x-request-id"].to_str().unwrap().to_owned();
    assert_ne!(id, "req-abc-123");
    assert_eq!(r.body["request_id"], id.as_str(), "{}", r.text);
    for leak in ["secret-ledger-text", "database", "sqlite", "error returned"] {
        assert!(
            !r.text.to_lowercase().contains(leak),
            "{leak} in {}",
            r.text
        );
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while !s.stderr().lines().any(|l| {
        l.contains("secret-ledger-text")
            && l.contains(&format!("request_id={id} "))
            && l.contains("client_request_id=\"req-abc-123\"")
    }) {
        assert!(
            Instant::now() < deadline,
            "the error is not logged with its request id:\n{}",
            s.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // The idempotency store itself fails; a request id the client cannot be trusted
    // with (too long, not visible ASCII) is replaced.
    break_inserts(&db.path, "idem_records", "secret-claim-text");
    for sent in ["x".repeat(200), "has spaces in it".to_owned()] {
        let r = rt.block_on(async {
            reply(
                http.post(s.url("/v1/orders"))
                    .bearer_auth(KEY)
                    .header("Idempotency-Key", "leak-2")
                    .header("x-request-id", sent.as_str())
                    .json(&order)
                    .send()
                    .await
                    .unwrap(),
            )
            .await
        });
        assert_eq!(r.status, 500, "{}", r.text);
        assert!(!r.text.contains("secret-claim-text"), "{}", r.text);
        let id = r.headers["x-request-id"].to_str().unwrap();
        assert_ne!(id, sent);
        assert!(!id.is_empty() && id.len() <= 64, "{id}");
        assert_eq!(r.body["request_id"], id, "{}", r.text);
    }
}

// ---------------------------------------------------------------------------------------
// Item 11: secrets off the command line, checked, compared in constant time; private files

fn private_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

fn assert_not_on_the_command_line(s: &Serve) {
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", s.child.id())).unwrap();
    assert!(
        !String::from_utf8_lossy(&cmdline).contains("secret-"),
        "a secret on the command line"
    );
}

#[test]
fn api_keys_from_the_environment() {
    let db = db();
    let s = Serve::start(
        &db,
        &[],
        &[
            ("IDEM_API_KEYS", "a=secret-from-env-1, t=secret-from-env-3"),
            ("IDEM_ADMIN_TOKEN", "admin-token-from-env-01"),
        ],
    );
    assert_not_on_the_command_line(&s);
    let rt = runtime();
    let http = client();
    rt.block_on(async {
        for token in ["secret-from-env-1", "secret-from-env-3"] {
            let r = get(&http, s.url("/v1/orders"), Some(token)).await;
            assert_eq!(r.status, 200, "{token}: {}", r.text);
        }
        for token in [
            "secret-from-env",
            "secret-from-env-11",
            "a=secret-from-env-1",
        ] {
            let r = get(&http, s.url("/v1/orders"), Some(token)).await;
            assert_eq!(r.status, 401, "{token}");
        }
        let r = get(
            &http,
            s.url("/v1/admin/freezes"),
            Some("admin-token-from-env-01"),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text);
    });
}

#[test]
fn api_keys_and_admin_token_from_files() {
    let db = db();
    let secrets = tempfile::tempdir().unwrap();
    let keys = private_file(
        secrets.path(),
        "keys",
        "# tenants of this server\n\nb=secret-from-file-2\n  # c=commented-out-key\n",
    );
    let admin = private_file(secrets.path(), "admin", "admin-token-from-file-01\n");
    let s = Serve::start(
        &db,
        &[
            "--api-keys-file",
            keys.to_str().unwrap(),
            "--admin-token-file",
            admin.to_str().unwrap(),
        ],
        &[("IDEM_API_KEYS", "a=secret-from-env-1")],
    );
    assert_not_on_the_command_line(&s);
    let rt = runtime();
    let http = client();
    rt.block_on(async {
        for token in ["secret-from-env-1", "secret-from-file-2"] {
            let r = get(&http, s.url("/v1/orders"), Some(token)).await;
            assert_eq!(r.status, 200, "{token}: {}", r.text);
        }
        let r = get(&http, s.url("/v1/orders"), Some("commented-out-key")).await;
        assert_eq!(r.status, 401);
        let r = get(
            &http,
            s.url("/v1/admin/freezes"),
            Some("admin-token-from-file-01"),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text);
    });
}

#[test]
fn ambiguous_or_weak_secrets_are_refused_at_start() {
    let db = db();
    let serve = |args: &[&str], env: &[(&str, &str)]| {
        let mut all = vec!["serve", "--listen", "127.0.0.1:0", "--sweep-every", "0s"];
        all.extend_from_slice(args);
        refused(command(&db.url, &all, env))
    };

    let (status, stderr) = serve(
        &[
            "--api-key",
            "a=dup-secret-0001",
            "--api-key",
            "b=dup-secret-0001",
        ],
        &[],
    );
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("tenants a and b"), "{stderr}");
    assert!(
        !stderr.contains("dup-secret"),
        "the secret is echoed: {stderr}"
    );

    // A key source that holds no key is an error, not development mode.
    let (status, stderr) = serve(&[], &[("IDEM_API_KEYS", "")]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("holds no"), "{stderr}");
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("keys");
    std::fs::write(&empty, "# no keys yet\n").unwrap();
    let (status, stderr) = serve(&["--api-keys-file", empty.to_str().unwrap()], &[]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("holds no"), "{stderr}");

    // Across sources too: the environment and the command line.
    let (status, stderr) = serve(
        &["--api-key", "a=dup-secret-0002"],
        &[("IDEM_API_KEYS", "b=dup-secret-0002")],
    );
    assert_eq!(status.code(), Some(2), "{stderr}");

    let (status, stderr) = serve(
        &[
            "--api-key",
            "a=secret-ok-0001",
            "--admin-token",
            "short-tok",
        ],
        &[],
    );
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("at least 16"), "{stderr}");
    assert!(!stderr.contains("short-tok"), "{stderr}");

    let (status, stderr) = serve(
        &["--api-key", "a=secret-ok-0001"],
        &[("IDEM_ADMIN_TOKEN", "fifteen-chars15")],
    );
    assert_eq!(status.code(), Some(2), "{stderr}");

    let (status, stderr) = serve(
        &[
            "--api-key",
            "a=shared-with-admin-01",
            "--admin-token",
            "shared-with-admin-01",
        ],
        &[],
    );
    assert_eq!(status.code(), Some(2), "{stderr}");
}

#[test]
fn sqlite_files_are_created_readable_by_their_owner_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data/sub/x.db");
    let db = Db {
        url: format!("sqlite://{}", path.display()),
        path: path.clone(),
        _dir: tempfile::tempdir().unwrap(),
    };
    let key = format!("t={KEY}");
    let s = Serve::start(&db, &["--api-key", &key], &[]);
    let rt = runtime();
    rt.block_on(create_order(&client(), &s, "mode-1"));
    for file in ["x.db", "x.db-wal", "x.db-shm"] {
        let file = path.with_file_name(file);
        assert!(file.exists(), "{}", file.display());
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }
    assert_eq!(mode(&dir.path().join("data")), 0o700);
    assert_eq!(mode(&dir.path().join("data/sub")), 0o700);
}

// ---------------------------------------------------------------------------------------
// The operations kit in deploy/: dashboard, example configurations, systemd units

fn deploy(path: &str) -> String {
    let full = format!("{}/../../deploy/{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{full}: {e}"))
}

/// The metric families a Prometheus expression reads (`idem_…`, with the suffixes of
/// counters and histograms taken off).
fn families(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("idem_"))
        .map(|w| {
            ["_total", "_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| w.strip_suffix(s))
                .unwrap_or(w)
                .to_owned()
        })
        .collect()
}

/// Every series the Grafana dashboard queries is exported by a running `idem serve` or
/// `idem gateway`; the example gateway configuration is valid; the units start the
/// binary with flags it has and read settings it knows.
#[test]
fn the_operations_kit_names_what_the_servers_export() {
    let db = db();
    let key = format!("t={KEY}");
    let s = Serve::start(&db, &["--api-key", &key, "--admin-token", ADMIN], &[]);
    let rt = runtime();
    let http = client();
    let (serve_text, gateway_text) = rt.block_on(async {
        let serve = get(&http, s.url("/metrics"), Some(ADMIN)).await;
        assert_eq!(serve.status, 200, "{}", serve.text);
        let config = idem_gateway::GatewayConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            upstream: format!("http://{}", s.addr),
            ..Default::default()
        };
        let (addr, _served) = idem_gateway::bind(config, std::future::pending())
            .await
            .expect("gateway");
        let gateway = get(&http, format!("http://{addr}/_idem/metrics"), None).await;
        assert_eq!(gateway.status, 200, "{}", gateway.text);
        (serve.text, gateway.text)
    });
    let exported = |family: &str| {
        let declared = format!("# TYPE {family} ");
        serve_text.contains(&declared) || gateway_text.contains(&declared)
    };

    let dashboard: serde_json::Value =
        serde_json::from_str(&deploy("grafana/idem-dashboard.json")).expect("dashboard JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "{} panels", panels.len());
    let mut queried = 0;
    for panel in panels {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            for family in families(expr) {
                assert!(
                    exported(&family),
                    "panel {:?} queries {family}, which no server exports",
                    panel["title"]
                );
                queried += 1;
            }
        }
    }
    assert!(queried >= panels.len(), "{queried} series");
    // The alert rules too.
    for family in families(&deploy("alerts/idem-alerts.yml")) {
        assert!(
            exported(&family),
            "an alert reads {family}, which no server exports"
        );
    }

    let gateway = idem_gateway::GatewayConfig::from_json(&deploy("config/gateway.json"))
        .expect("the example gateway configuration is valid");
    assert!(gateway.redis_url.is_some() && !gateway.routes.is_empty());

    let help = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(args)
            .output()
            .expect("idem --help");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let serve_help = help(&["serve", "--help"]);
    let gateway_help = help(&["gateway", "--help"]);
    for (unit, help) in [
        ("systemd/idem-serve.service", &serve_help),
        ("systemd/idem-gateway.service", &gateway_help),
    ] {
        let unit_text = deploy(unit);
        let exec = unit_text
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .unwrap_or_else(|| panic!("{unit} has no ExecStart"));
        for flag in exec.split_whitespace().filter(|w| w.starts_with("--")) {
            assert!(
                help.contains(flag),
                "{unit} passes {flag}, which idem does not take"
            );
        }
    }
    for (env_file, help) in [
        ("config/serve.env", &serve_help),
        ("config/gateway.env", &gateway_help),
    ] {
        for line in deploy(env_file).lines() {
            let line = line.trim_start_matches('#');
            let Some((name, _)) = line.split_once('=') else {
                continue;
            };
            if name == "IDEM_LISTEN" || name.contains(' ') {
                continue; // read by the unit's command line, or prose
            }
            let known = help.contains(&format!("env: {name}="))
                || ["IDEM_LOG", "IDEM_NATS_URL"].contains(&name);
            assert!(known, "{env_file} sets {name}, which idem does not read");
        }
    }
}

/// `idem serve --config FILE`: the file's settings apply, a flag beats the file and so
/// does the flag's environment variable; an unknown key stops the start.
#[tokio::test]
async fn a_config_file_sets_what_flags_and_environment_leave_open() {
    let db = db();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("serve.toml");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let metrics_port = {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        free.local_addr().unwrap().port()
    };
    std::fs::write(
        &file,
        format!(
            "# flag > IDEM_* > file > default\n\
             listen = \"{}\"\n\
             api_key = [\"acme=file-secret-key-0001\"]\n\
             metrics-listen = \"127.0.0.1:0\"\n\
             header-read-timeout = \"5s\"\n",
            taken.local_addr().unwrap()
        ),
    )
    .unwrap();
    let env_metrics = format!("127.0.0.1:{metrics_port}");
    let path = file.to_str().unwrap();
    let s = Serve::start(
        &db,
        &["--config", path],
        &[("IDEM_METRICS_LISTEN", env_metrics.as_str())],
    );
    // The flag's --listen 127.0.0.1:0 won over the file's (taken) address.
    assert_ne!(s.addr, taken.local_addr().unwrap().to_string());
    // The environment won over the file's metrics address.
    assert_eq!(s.metrics_addr.as_deref(), Some(env_metrics.as_str()));
    // The file's API key is the one the server accepts.
    let http = reqwest::Client::new();
    let ok = get(&http, s.url("/v1/orders"), Some("file-secret-key-0001")).await;
    assert_eq!(ok.status, 200, "{}", ok.text);
    drop(s);

    std::fs::write(&file, "sweep-every = \"1m\"\nno-such-setting = 1\n").unwrap();
    let out = idem(&db.url, &["serve", "--config", path]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no-such-setting") && err.contains("serve.toml"),
        "{err}"
    );
}

/// `idem gateway --config FILE.toml`: the gateway's configuration in TOML.
#[test]
fn the_gateway_reads_a_toml_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gateway.toml");
    std::fs::write(
        &file,
        "listen = \"127.0.0.1:0\"\n\
         upstream = \"http://127.0.0.1:9\"\n\
         window_ms = 60000\n\
         [[routes]]\n\
         methods = [\"POST\"]\n\
         path = \"/v1/*\"\n\
         key = \"required\"\n",
    )
    .unwrap();
    let mut child = command(
        "sqlite://unused",
        &["gateway", "--config", file.to_str().unwrap()],
        &[],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn idem gateway");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = child.kill();
    let status = child.wait().unwrap();
    assert!(
        line.starts_with("idem gateway on http://127.0.0.1:")
            && line.contains("http://127.0.0.1:9"),
        "{line} ({status})"
    );
    // A TOML syntax error names the file.
    std::fs::write(&file, "upstream = \n").unwrap();
    let out = command(
        "sqlite://unused",
        &["gateway", "--config", file.to_str().unwrap()],
        &[],
    )
    .output()
    .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("gateway.toml"));
}

// ---------------------------------------------------------------------------------------
// The console's login: a correct token always logs in; failures throttled per client

/// A client that shows the console's 303s instead of following them.
fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Posts the console's login form, as from `forwarded_for` when given. Answers the
/// status and the `Set-Cookie` header.
async fn console_login(
    http: &reqwest::Client,
    s: &Serve,
    token: &str,
    forwarded_for: Option<&str>,
) -> (u16, String) {
    let body = format!("operator=ana&token={token}");
    let mut req = http
        .post(s.url("/console/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body);
    if let Some(from) = forwarded_for {
        req = req.header("x-forwarded-for", from);
    }
    let r = req.send().await.expect("login");
    let cookie = r
        .headers()
        .get("set-cookie")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (r.status().as_u16(), cookie)
}

fn logged_in((status, cookie): &(u16, String)) -> bool {
    *status == 303 && cookie.starts_with("idem_console=") && !cookie.contains("Max-Age=0")
}

/// A flood of wrong logins (about 50 a second for 8 s, from 60 forwarded addresses and
/// from the proxy's own) does not lock the operator out: each of its logins succeeds,
/// through the proxy and from the proxy's address alike, while failures are throttled
/// per address and in all.
#[test]
fn the_operator_logs_in_during_a_flood_of_wrong_logins() {
    let db = db();
    let key = format!("t={KEY}");
    let s = Arc::new(Serve::start(
        &db,
        &["--api-key", &key, "--trusted-proxies", "127.0.0.1"],
        &[("IDEM_ADMIN_TOKEN", ADMIN)],
    ));
    let rt = runtime();
    rt.block_on(async {
        let http = no_redirects();
        let started = Instant::now();
        let flood_for = Duration::from_secs(8);
        let flood = tokio::spawn({
            let (http, s) = (http.clone(), s.clone());
            async move {
                let mut tick = tokio::time::interval(Duration::from_millis(20));
                let mut sent = Vec::new();
                let mut n = 0usize;
                while started.elapsed() < flood_for {
                    tick.tick().await;
                    // One in five from the proxy's own address, the rest forwarded.
                    let from = (!n.is_multiple_of(5)).then(|| format!("198.51.100.{}", n % 60 + 1));
                    let (http, s) = (http.clone(), s.clone());
                    sent.push(tokio::spawn(async move {
                        let (status, _) =
                            console_login(&http, &s, "wrong-token-0000000", from.as_deref()).await;
                        (from.is_some(), status, started.elapsed())
                    }));
                    n += 1;
                }
                let mut answers = Vec::new();
                for t in sent {
                    answers.push(t.await.unwrap());
                }
                answers
            }
        });

        // The operator, every 250 ms, alternately through the proxy and from its address.
        let mut latencies = Vec::new();
        let mut at = Vec::new();
        let mut i = 0;
        while started.elapsed() < flood_for {
            let from = (i % 2 == 0).then_some("203.0.113.50");
            let t = Instant::now();
            let answer = console_login(&http, &s, ADMIN, from).await;
            latencies.push(t.elapsed());
            at.push(started.elapsed());
            assert!(
                logged_in(&answer),
                "login {i} ({from:?}) during the flood: {answer:?}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
            i += 1;
        }
        let answers = flood.await.unwrap();

        let count = |forwarded: bool, status: u16| {
            answers
                .iter()
                .filter(|(f, st, _)| *f == forwarded && *st == status)
                .count()
        };
        let others: Vec<_> = answers
            .iter()
            .filter(|(_, st, _)| *st != 401 && *st != 429)
            .collect();
        assert!(others.is_empty(), "{others:?}");
        // The proxy's own address: 10 failures a minute, then 429.
        assert_eq!(count(false, 401), 10, "{answers:?}");
        assert!(count(false, 429) > 50);
        // All addresses: 200 failures a minute (no forwarded address reaches its own
        // 10 in 8 s), then 429.
        assert_eq!(count(false, 401) + count(true, 401), 200);
        let global_from = answers
            .iter()
            .filter(|(f, st, _)| *f && *st == 429)
            .map(|(_, _, t)| *t)
            .min()
            .expect("the global throttle engaged");
        let under_global = at.iter().filter(|t| **t > global_from).count();
        assert!(
            under_global >= 3,
            "only {under_global} operator logins after {global_from:?}"
        );
        // Still within the minute: failures from a new address and from the proxy's
        // are refused; the token still logs in.
        let fresh = console_login(&http, &s, "wrong-token-0000000", Some("192.0.2.77")).await;
        assert_eq!(fresh.0, 429, "the global limit");
        let bare = console_login(&http, &s, "wrong-token-0000000", None).await;
        assert_eq!(bare.0, 429, "the proxy address's limit");
        assert!(logged_in(&console_login(&http, &s, ADMIN, None).await));

        let mut sorted = latencies.clone();
        sorted.sort();
        let p50 = sorted[sorted.len() / 2];
        let max = *sorted.last().unwrap();
        println!(
            "operator login during a flood of {} wrong logins in {:?} ({} answered 429): \
             {} logins, all 303; latency p50 {:.1} ms, max {:.1} ms",
            answers.len(),
            flood_for,
            answers.iter().filter(|(_, st, _)| *st == 429).count(),
            latencies.len(),
            p50.as_secs_f64() * 1e3,
            max.as_secs_f64() * 1e3,
        );
    });
}

/// `X-Forwarded-For` names the client of a login only when the peer is a trusted proxy
/// (here from the config file): each client then has its own 10 failures a minute.
/// Without trusted proxies every caller is the peer, whatever it forwards.
#[test]
fn the_login_throttle_believes_forwarded_for_only_from_trusted_proxies() {
    let db = db();
    let key = format!("t={KEY}");
    let dir = tempfile::tempdir().unwrap();
    let config = private_file(
        dir.path(),
        "serve.toml",
        "trusted-proxies = [\"10.0.0.0/8\", \"127.0.0.1\"]\n",
    );
    let s = Serve::start(
        &db,
        &["--api-key", &key, "--config", config.to_str().unwrap()],
        &[("IDEM_ADMIN_TOKEN", ADMIN)],
    );
    let rt = runtime();
    rt.block_on(async {
        let http = no_redirects();
        let wrong = "wrong-token-0000000";
        for _ in 0..10 {
            let r = console_login(&http, &s, wrong, Some("198.51.100.7")).await;
            assert_eq!(r.0, 401);
        }
        let r = console_login(&http, &s, wrong, Some("198.51.100.7")).await;
        assert_eq!(r.0, 429, "the client's own limit");
        // The same client behind a second trusted proxy.
        let r = console_login(&http, &s, wrong, Some("198.51.100.7, 10.1.2.3")).await;
        assert_eq!(r.0, 429);
        // The rightmost untrusted address is the client: a forged entry left of it
        // changes nothing.
        let r = console_login(&http, &s, wrong, Some("198.51.100.8, 198.51.100.9")).await;
        assert_eq!(r.0, 401, "198.51.100.9 has failures left");
        let r = console_login(&http, &s, wrong, None).await;
        assert_eq!(r.0, 401, "the proxy's own address has failures left");
        let r = console_login(&http, &s, ADMIN, Some("198.51.100.7")).await;
        assert!(
            logged_in(&r),
            "the token logs in from a throttled client: {r:?}"
        );
        // The audit names the client and the proxy it came through.
        let cookie = r.1.split(';').next().unwrap().to_owned();
        let audit = http
            .get(s.url("/console/audit"))
            .header("cookie", cookie)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(audit.contains("198.51.100.9 via 127.0.0.1"), "{audit}");
    });
    drop(s);

    // No trusted proxy: forwarded addresses are the peer's.
    let s = Serve::start(&db, &["--api-key", &key], &[("IDEM_ADMIN_TOKEN", ADMIN)]);
    rt.block_on(async {
        let http = no_redirects();
        for n in 0..10 {
            let from = format!("198.51.100.{}", 20 + n);
            let r = console_login(&http, &s, "wrong-token-0000000", Some(&from)).await;
            assert_eq!(r.0, 401);
        }
        let r = console_login(&http, &s, "wrong-token-0000000", Some("192.0.2.1")).await;
        assert_eq!(r.0, 429, "every caller is 127.0.0.1");
        assert!(logged_in(
            &console_login(&http, &s, ADMIN, Some("192.0.2.1")).await
        ));
    });
}

// ---------------------------------------------------------------------------------------
// Secrets in sight; the console cookie behind a TLS-terminating proxy

/// Waits for `needle` on the server's stderr.
fn wait_for_log(s: &Serve, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let log = s.stderr();
        if log.contains(needle) {
            return log;
        }
        assert!(Instant::now() < deadline, "no {needle:?} in:\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_secret_on_the_command_line_or_in_a_world_readable_config_warns_at_start() {
    use std::os::unix::fs::PermissionsExt;
    let db = db();
    let key = format!("t={KEY}");
    let s = Serve::start(&db, &["--api-key", &key, "--admin-token", ADMIN], &[]);
    let log = wait_for_log(&s, "shows in `ps`");
    assert!(
        log.contains("flag=\"--admin-token\"") && log.contains("flag=\"--api-key\""),
        "{log}"
    );
    assert!(!log.contains(ADMIN) && !log.contains(KEY), "{log}");
    drop(s);

    // From the environment: nothing in `ps`, no warning.
    let quiet = |s: &Serve| {
        std::thread::sleep(Duration::from_millis(300));
        let log = s.stderr();
        assert!(
            !log.contains("shows in `ps`") && !log.contains("holds secrets"),
            "{log}"
        );
    };
    let env = [("IDEM_API_KEYS", key.as_str()), ("IDEM_ADMIN_TOKEN", ADMIN)];
    quiet(&Serve::start(&db, &[], &env));

    // A config file holding the admin token, readable by every user.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("serve.toml");
    std::fs::write(
        &file,
        format!("admin_token = \"{ADMIN}\"\napi-key = [\"{key}\"]\n"),
    )
    .unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let path = file.to_str().unwrap();
    let s = Serve::start(&db, &["--config", path], &[]);
    let log = wait_for_log(&s, "holds secrets");
    assert!(
        log.contains("admin_token") && log.contains("api-key") && log.contains("serve.toml"),
        "{log}"
    );
    assert!(!log.contains(ADMIN) && !log.contains(KEY), "{log}");
    assert!(
        !log.contains("shows in `ps`"),
        "the file is not the command line: {log}"
    );
    drop(s);
    // Readable by its group only (a service group): no warning.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    quiet(&Serve::start(&db, &["--config", path], &[]));
    // Readable by all, but no secret in it.
    std::fs::write(&file, "shutdown-grace = \"2s\"\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    quiet(&Serve::start(&db, &["--config", path], &env));
}

#[test]
fn the_console_cookie_is_secure_when_forced_behind_a_tls_proxy() {
    let db = db();
    let key = format!("t={KEY}");
    let env = [("IDEM_API_KEYS", key.as_str()), ("IDEM_ADMIN_TOKEN", ADMIN)];
    let rt = runtime();
    let http = no_redirects();
    let plain = Serve::start(&db, &[], &env);
    let (status, cookie) = rt.block_on(console_login(&http, &plain, ADMIN, None));
    assert_eq!(status, 303);
    assert!(!cookie.contains("Secure"), "plain HTTP: {cookie}");
    drop(plain);

    let forced = Serve::start(&db, &["--console-secure-cookie"], &env);
    rt.block_on(async {
        let (status, cookie) = console_login(&http, &forced, ADMIN, None).await;
        assert_eq!(status, 303);
        assert!(
            cookie.ends_with("; Secure") && cookie.contains("HttpOnly; SameSite=Strict"),
            "{cookie}"
        );
        // Logging out clears it with the same flag.
        let session = cookie.split(';').next().unwrap().to_owned();
        let page = http
            .get(forced.url("/console/"))
            .header("cookie", &session)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let csrf = page
            .split("name=\"csrf\" value=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .expect("a csrf field");
        let out = http
            .post(forced.url("/console/logout"))
            .header("cookie", &session)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("csrf={csrf}"))
            .send()
            .await
            .unwrap();
        assert_eq!(out.status().as_u16(), 303);
        let cleared = out.headers()["set-cookie"].to_str().unwrap();
        assert!(
            cleared.contains("Max-Age=0") && cleared.ends_with("; Secure"),
            "{cleared}"
        );
    });
}

// ---------------------------------------------------------------------------------------
// Free text from the admin API cannot forge a log line

#[test]
fn admin_free_text_with_control_characters_is_refused_and_logged_quoted() {
    let db = db();
    let key = format!("t={KEY}");
    let s = Serve::start(&db, &["--api-key", &key], &[("IDEM_ADMIN_TOKEN", ADMIN)]);
    let rt = runtime();
    let http = client();
    rt.block_on(async {
        let forged = [
            (
                "/v1/admin/freezes",
                json!({"scope": "user:U-1", "what": "ticketing", "reason": "x\nINFO forged"}),
                "reason",
            ),
            (
                "/v1/admin/freezes",
                json!({"scope": "user:U-1", "what": "ticketing", "actor": "ops\r\nWARN forged"}),
                "actor",
            ),
            (
                "/v1/admin/unfreeze",
                json!({"scope": "user:U-1", "what": "ticketing", "actor": "ops\nERROR forged"}),
                "actor",
            ),
        ];
        for (path, body, field) in forged {
            let r = post(&http, s.url(path), ADMIN, None, &body).await;
            assert_eq!(r.status, 422, "{path} {body}: {}", r.text);
            assert_eq!(
                r.body["type"],
                "https://idem.dev/problems/orders/invalid-field"
            );
            assert_eq!(r.body["field"], field, "{}", r.text);
        }
        // A malformed tenant is the caller's mistake too, not a server error.
        let r = post(
            &http,
            s.url("/v1/admin/freezes"),
            ADMIN,
            None,
            &json!({"scope": "user:U-1", "what": "ticketing", "tenant": "no such/tenant"}),
        )
        .await;
        assert_eq!(r.status, 422, "{}", r.text);
        let listed = get(&http, s.url("/v1/admin/freezes"), Some(ADMIN)).await;
        assert_eq!(listed.body["history"], json!([]), "nothing was frozen");

        let r = post(
            &http,
            s.url("/v1/admin/freezes"),
            ADMIN,
            None,
            &json!({"scope": "user:U-1 x", "what": "ticketing",
                    "reason": "disk \"full\" on db-2", "actor": "ana b"}),
        )
        .await;
        assert_eq!(r.status, 201, "{}", r.text);
    });
    let log = wait_for_log(&s, " frozen ");
    let line = log.lines().find(|l| l.contains(" frozen ")).unwrap();
    assert!(
        line.contains(r#"reason="disk \"full\" on db-2""#)
            && line.contains(r#"by="ana b""#)
            && line.contains(r#"scope="user:U-1 x""#),
        "{line}"
    );
    for l in log.lines() {
        let l = l.trim_start();
        assert!(
            !(l.starts_with("INFO forged")
                || l.starts_with("WARN forged")
                || l.starts_with("ERROR forged")),
            "a forged line:\n{log}"
        );
    }
    assert!(!log.contains("forged"), "{log}");
}

// ---------------------------------------------------------------------------------------
// Request ids are the server's own

#[test]
fn every_request_gets_its_own_request_id_and_the_clients_is_logged_beside_it() {
    let db = db();
    let key = format!("t={KEY}");
    let s = Serve::start(&db, &["--api-key", &key], &[("IDEM_ADMIN_TOKEN", ADMIN)]);
    let rt = runtime();
    let http = client();
    let ids: Vec<String> = rt.block_on(async {
        let mut ids = Vec::new();
        for user in ["user:U-1", "user:U-2"] {
            let r = reply(
                http.post(s.url("/v1/admin/freezes"))
                    .bearer_auth(ADMIN)
                    .header("x-request-id", "same-id-1")
                    .json(&json!({"scope": user, "what": "ticketing"}))
                    .send()
                    .await
                    .unwrap(),
            )
            .await;
            assert_eq!(r.status, 201, "{}", r.text);
            ids.push(r.headers["x-request-id"].to_str().unwrap().to_owned());
        }
        for _ in 0..2 {
            let r = reply(
                http.get(s.url("/healthz"))
                    .header("x-request-id", "same-id-1")
                    .send()
                    .await
                    .unwrap(),
            )
            .await;
            ids.push(r.headers["x-request-id"].to_str().unwrap().to_owned());
        }
        ids
    });
    let mut distinct = ids.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), ids.len(), "{ids:?}");
    assert!(!ids.iter().any(|id| id == "same-id-1"), "{ids:?}");
    // The freezes' log lines carry each request's own id and the client's beside it.
    wait_for_log(&s, &format!("request_id={} ", ids[1]));
    let log = s.stderr();
    for id in &ids[..2] {
        let line = log
            .lines()
            .find(|l| l.contains(&format!("request_id={id} ")))
            .unwrap_or_else(|| panic!("no line for {id}:\n{log}"));
        assert!(line.contains("client_request_id=\"same-id-1\""), "{line}");
    }
}
