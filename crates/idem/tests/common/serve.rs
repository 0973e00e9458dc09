//! What the hardening tests of `idem serve` share: the binary on a SQLite file of the
//! test's own (`Db`, `Serve`, one-shot `idem` commands), HTTP and raw-TCP clients, and
//! reading the server's log.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub const BIN: &str = env!("CARGO_BIN_EXE_idem");
/// Tenant `t`'s API key.
pub const KEY: &str = "t-secret-key-0001";
pub const ADMIN: &str = "admin-token-0123456789";

pub struct Db {
    pub _dir: tempfile::TempDir,
    pub path: PathBuf,
    pub url: String,
}

pub fn db() -> Db {
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
pub fn command(url: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
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
pub fn idem(url: &str, args: &[&str]) -> Output {
    command(url, args, &[]).output().expect("run idem")
}

pub fn key_state(url: &str, key: &str) -> Option<String> {
    let out = idem(url, &["keys", "show", key, "--tenant", "t", "--json"]);
    if !out.status.success() {
        return None;
    }
    let v: Value = serde_json::from_slice(&out.stdout).expect("keys show --json");
    v["state"].as_str().map(str::to_owned)
}

pub fn wait_for_state(url: &str, key: &str, state: &str, within: Duration) {
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
pub struct Serve {
    pub child: Child,
    pub addr: String,
    pub metrics_addr: Option<String>,
    stderr: Arc<Mutex<String>>,
}

impl Serve {
    /// `idem serve --listen 127.0.0.1:0 ARGS…`, ready once it printed where it listens.
    pub fn start(db: &Db, args: &[&str], env: &[(&str, &str)]) -> Serve {
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

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    pub fn sigterm(&self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -TERM failed");
    }

    pub fn exit_within(&mut self, within: Duration) -> ExitStatus {
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

    pub fn running(&mut self) -> bool {
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
pub fn refused(mut cmd: Command) -> (ExitStatus, String) {
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

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
    pub text: String,
}

pub async fn reply(r: reqwest::Response) -> Reply {
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

pub async fn post(
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

pub async fn get(http: &reqwest::Client, url: String, token: Option<&str>) -> Reply {
    let mut req = http.get(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    reply(req.send().await.expect("request")).await
}

pub async fn create_order(http: &reqwest::Client, s: &Serve, key: &str) -> String {
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
pub fn raw(addr: &str, request: &[u8], read_for: Duration) -> (String, Duration, bool) {
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

pub fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

pub fn private_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// Waits for `needle` on the server's stderr.
pub fn wait_for_log(s: &Serve, needle: &str) -> String {
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
