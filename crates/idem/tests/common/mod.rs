//! What the process tests share: free ports, the `idem` binary as a child process killed
//! when dropped, readiness polling, the servers a test needs.
#![allow(dead_code)] // each test binary uses its own subset

pub mod serve;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process killed (and reaped) when dropped.
pub struct Proc {
    name: &'static str,
    child: Option<Child>,
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} {}", self.name);
    }

    /// Waits for the process to exit by itself, up to `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let child = self.child.as_mut().expect("running");
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {limit:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn spawn(name: &'static str, args: &[&str]) -> Proc {
    spawn_to(name, args, Stdio::inherit())
}

/// Like [`spawn`], its log (stderr) going to `stderr`.
pub fn spawn_to(name: &'static str, args: &[&str], stderr: impl Into<Stdio>) -> Proc {
    let child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env_remove("IDEM_DATABASE_URL")
        .env_remove("IDEM_ADMIN_TOKEN")
        .env_remove("IDEM_API_KEYS")
        .env("IDEM_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("start {name}: {e}"));
    Proc {
        name,
        child: Some(child),
    }
}

/// `idem serve` on the SQLite file `db` (several may share one), each `(tenant,
/// token)` an API key, the sweeper off; its base URL once it is ready.
pub async fn serve_sqlite(db: &std::path::Path, api_keys: &[(&str, &str)]) -> (Proc, String) {
    let listen = format!("127.0.0.1:{}", free_port());
    let db = format!("sqlite://{}", db.display());
    let mut args = vec![
        "--database-url".to_string(),
        db,
        "serve".into(),
        "--listen".into(),
    ];
    args.push(listen.clone());
    for (tenant, token) in api_keys {
        args.extend(["--api-key".into(), format!("{tenant}={token}")]);
    }
    args.extend(["--sweep-every".into(), "0s".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let proc = spawn("idem serve", &args);
    let url = format!("http://{listen}");
    wait_ready(&format!("{url}/healthz")).await;
    (proc, url)
}

pub async fn wait_ready(url: &str) {
    let c = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(r) = c.get(url).send().await {
            if r.status().is_success() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{url} not ready within 30 s");
}

/// The URL of a server the test needs (`var`, else `default`) when `probe` reaches it;
/// otherwise skipped visibly, or failed under `IDEM_REQUIRE_SERVICES=1`.
pub fn service_url(
    var: &str,
    default: &str,
    probe: fn(&str) -> bool,
    name: &str,
) -> Option<String> {
    let url = std::env::var(var).unwrap_or_else(|_| default.to_string());
    if probe(&url) {
        Some(url)
    } else {
        idem_conformance::skip_or_fail(name, &format!("{url} unreachable"));
        None
    }
}

/// Whether the `host:port` of `url` accepts a TCP connection.
pub fn tcp_up(url: &str) -> bool {
    let hostport = url
        .split("://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .map(|hp| hp.rsplit('@').next().unwrap_or(hp).to_string())
        .unwrap_or_default();
    std::net::TcpStream::connect(hostport).is_ok()
}
