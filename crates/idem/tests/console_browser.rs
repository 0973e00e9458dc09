//! The operator console in a real browser: `idem serve` in its own process on a fresh
//! database (SQLite, then PostgreSQL in a schema of its own), and the standalone `idem
//! console` beside it on the same database, driven by
//! `e2e/console/console.test.mjs` (Node with playwright-core, in the machine's Chromium).
//!
//! Needs Chromium (`IDEM_CHROMIUM`, else /usr/bin/chromium), `node` on the PATH and
//! `npm ci --prefix e2e/console` done; without one of them the test prints a `SKIPPED:`
//! line and passes, or fails under `IDEM_REQUIRE_SERVICES=1` (as in CI). Screenshots of
//! every page go to `target/console-e2e/<backend>/`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_idem");
const TENANT: &str = "t1";
const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
/// The script stops itself after 55 s; this is the backstop.
const NODE_LIMIT: Duration = Duration::from_secs(120);

/// One browser run at a time: two Chromiums and two servers on two cores would only
/// make both slow.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn workspace_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

fn require_services() -> bool {
    std::env::var("IDEM_REQUIRE_SERVICES").as_deref() == Ok("1")
}

/// A missing prerequisite: a visible skip, or a failure under IDEM_REQUIRE_SERVICES=1.
fn skip(backend: &str, missing: &str) {
    assert!(
        !require_services(),
        "console browser test ({backend}): {missing} (required: IDEM_REQUIRE_SERVICES=1)"
    );
    eprintln!(
        "SKIPPED: console browser test ({backend}): {missing}; set IDEM_REQUIRE_SERVICES=1 to fail instead"
    );
}

/// What the browser run needs on this machine.
struct Tools {
    chromium: PathBuf,
    node: PathBuf,
    script: PathBuf,
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// Chromium, node and playwright-core; `None` (after `skip`) when one is missing.
fn tools(backend: &str) -> Option<Tools> {
    let root = workspace_root();
    let chromium = std::env::var_os("IDEM_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    let node = on_path("node");
    let playwright = root.join("e2e/console/node_modules/playwright-core/package.json");
    let mut missing = Vec::new();
    if !chromium.is_file() {
        missing.push(format!(
            "Chromium missing at {} (set IDEM_CHROMIUM, or `apt-get install -y chromium`)",
            chromium.display()
        ));
    }
    if node.is_none() {
        missing.push("node missing from the PATH".to_string());
    }
    if !playwright.is_file() {
        missing.push(format!(
            "playwright-core missing at {} (run `npm ci --prefix e2e/console`)",
            playwright.parent().unwrap().display()
        ));
    }
    if !missing.is_empty() {
        skip(backend, &missing.join("; "));
        return None;
    }
    Some(Tools {
        chromium,
        node: node.unwrap(),
        script: root.join("e2e/console/console.test.mjs"),
    })
}

fn secret() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Copies a child's output into `sink`, and each line to the test's output (shown on
/// failure, or live with `--nocapture`) when `echo` is set.
fn drain(from: impl Read + Send + 'static, sink: Arc<Mutex<String>>, echo: bool) {
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines().map_while(Result::ok) {
            if echo {
                eprintln!("{line}");
            }
            let mut s = sink.lock().unwrap();
            s.push_str(&line);
            s.push('\n');
        }
    });
}

/// The last `n` characters of a log.
fn tail(log: &Mutex<String>, n: usize) -> String {
    let s = log.lock().unwrap();
    let start = s.char_indices().rev().nth(n).map(|(i, _)| i).unwrap_or(0);
    s[start..].to_string()
}

/// A child process, killed and reaped when dropped (also when the test panics).
struct Guard {
    name: &'static str,
    child: Child,
    log: Arc<Mutex<String>>,
}

impl Guard {
    fn spawn(name: &'static str, mut cmd: Command, echo: bool) -> Guard {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        let log = Arc::new(Mutex::new(String::new()));
        drain(child.stdout.take().unwrap(), log.clone(), echo);
        drain(child.stderr.take().unwrap(), log.clone(), echo);
        Guard { name, child, log }
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// Waits for the process to exit by itself, up to `limit` (then kills it and fails).
    fn wait(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.exited() {
                // Let the drain threads take the last lines.
                std::thread::sleep(Duration::from_millis(100));
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "{} still running after {limit:?}; its output:\n{}",
                    self.name,
                    tail(&self.log, 4000)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET path` over plain HTTP/1.1; the status code, if the server answered.
fn http_status(addr: &str, path: &str) -> Option<u16> {
    let sock = addr.to_socket_addrs().ok()?.next()?;
    let mut s = TcpStream::connect_timeout(&sock, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).ok()?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A running `idem serve` with tenant t1's key and the admin token.
struct Serve {
    guard: Guard,
    addr: String,
    api_key: String,
    admin_token: String,
}

impl Serve {
    fn start(database_url: &str) -> Serve {
        let addr = format!("127.0.0.1:{}", free_port());
        let api_key = secret();
        let admin_token = secret();
        let mut cmd = Command::new(BIN);
        // Nothing of the caller's idem settings: only what is given here.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("IDEM_") {
                cmd.env_remove(name);
            }
        }
        cmd.env("IDEM_LOG", "warn").args([
            "--database-url",
            database_url,
            "serve",
            "--listen",
            &addr,
            "--api-key",
            &format!("{TENANT}={api_key}"),
            "--admin-token",
            &admin_token,
        ]);
        let mut guard = Guard::spawn("idem serve", cmd, false);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if http_status(&addr, "/readyz") == Some(200) {
                break;
            }
            if let Some(status) = guard.exited() {
                panic!(
                    "idem serve exited ({status}) before it was ready:\n{}",
                    tail(&guard.log, 4000)
                );
            }
            assert!(
                Instant::now() < deadline,
                "idem serve: GET /readyz not 200 within 30 s:\n{}",
                tail(&guard.log, 4000)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Serve {
            guard,
            addr,
            api_key,
            admin_token,
        }
    }
}

/// A running `idem console` (the standalone console) on the same database.
struct Standalone {
    _guard: Guard,
    addr: String,
}

impl Standalone {
    fn start(database_url: &str, admin_token: &str) -> Standalone {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut cmd = Command::new(BIN);
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("IDEM_") {
                cmd.env_remove(name);
            }
        }
        cmd.env("IDEM_LOG", "warn")
            .env("IDEM_ADMIN_TOKEN", admin_token)
            .args(["--database-url", database_url, "console", "--listen", &addr]);
        let mut guard = Guard::spawn("idem console", cmd, false);
        let deadline = Instant::now() + Duration::from_secs(30);
        while http_status(&addr, "/console/login") != Some(200) {
            if let Some(status) = guard.exited() {
                panic!(
                    "idem console exited ({status}) before it was ready:\n{}",
                    tail(&guard.log, 4000)
                );
            }
            assert!(
                Instant::now() < deadline,
                "idem console: GET /console/login not 200 within 30 s:\n{}",
                tail(&guard.log, 4000)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Standalone {
            _guard: guard,
            addr,
        }
    }
}

/// Starts the server and the standalone console on `database_url` and runs the browser
/// script against both.
fn run_console_e2e(tools: &Tools, backend: &str, database_url: &str) {
    let root = workspace_root();
    let artifacts = root.join("target/console-e2e").join(backend);
    let _ = std::fs::remove_dir_all(&artifacts);
    std::fs::create_dir_all(&artifacts).expect("artifacts directory");

    let mut serve = Serve::start(database_url);
    let standalone = Standalone::start(database_url, &serve.admin_token);
    let mut cmd = Command::new(&tools.node);
    cmd.arg(&tools.script)
        .current_dir(&root)
        .env("IDEM_BASE_URL", format!("http://{}", serve.addr))
        .env("IDEM_ADMIN_TOKEN", &serve.admin_token)
        .env("IDEM_API_KEY", &serve.api_key)
        .env("IDEM_TENANT", TENANT)
        .env("IDEM_BIN", BIN)
        .env("IDEM_DATABASE_URL", database_url)
        .env("IDEM_CHROMIUM", &tools.chromium)
        .env("IDEM_E2E_BACKEND", backend)
        .env("IDEM_E2E_ARTIFACTS", &artifacts)
        .env("IDEM_STANDALONE_URL", format!("http://{}", standalone.addr));
    let mut node = Guard::spawn("node e2e/console/console.test.mjs", cmd, true);
    let status = node.wait(NODE_LIMIT);
    let server_alive = serve.guard.exited().is_none();
    assert!(
        status.success(),
        "console e2e ({backend}) failed: node exited with {status} (its output is above; \
         screenshots in {}); idem serve {}; its log ends:\n{}",
        artifacts.display(),
        if server_alive {
            "still running"
        } else {
            "had exited"
        },
        tail(&serve.guard.log, 4000)
    );
    let out = node.log.lock().unwrap().clone();
    assert!(
        out.contains(&format!("console e2e: all steps passed ({backend})")),
        "node exited 0 without its closing line:\n{out}"
    );
    assert!(server_alive, "idem serve exited during the run");
}

#[test]
fn console_in_chromium_on_sqlite() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Some(tools) = tools("sqlite") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    run_console_e2e(&tools, "sqlite", &url);
}

/// `host:port` of a postgres:// URL.
fn host_port(url: &str) -> Option<String> {
    let rest = url.split("://").nth(1)?;
    let authority = rest.split(['/', '?']).next()?;
    let hp = authority.rsplit('@').next()?;
    Some(if hp.contains(':') {
        hp.to_string()
    } else {
        format!("{hp}:5432")
    })
}

fn reachable(host_port: &str) -> Result<(), String> {
    let addrs = host_port
        .to_socket_addrs()
        .map_err(|e| format!("{host_port}: {e}"))?;
    for a in addrs {
        if TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_ok() {
            return Ok(());
        }
    }
    Err(format!("nothing accepts connections on {host_port}"))
}

/// `psql URL -c SQL`, stopping at the first error.
fn psql(psql: &Path, url: &str, sql: &str) -> Result<(), String> {
    let out = Command::new(psql)
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", url, "-c", sql])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("run psql: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "psql -c {sql:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A schema of this run's own, dropped with everything in it when this drops (after the
/// server, which is declared later and so dropped first).
struct Schema {
    psql: PathBuf,
    url: String,
    name: String,
}

impl Drop for Schema {
    fn drop(&mut self) {
        let drop = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name);
        if let Err(e) = psql(&self.psql, &self.url, &drop) {
            eprintln!("note: schema {} left behind: {e}", self.name);
        }
    }
}

/// `idem serve` and `idem demo incident` have no schema option: the schema is chosen by
/// the connection's `search_path`, set in the URL (as the CLI's PostgreSQL drill test
/// does), so the server, the script's demo run and the console all use the same schema.
#[test]
fn console_in_chromium_on_postgres() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let base = std::env::var("IDEM_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_PG_URL.into());
    let hp = host_port(&base).unwrap_or_else(|| panic!("IDEM_TEST_POSTGRES_URL {base:?}"));
    if let Err(e) = reachable(&hp) {
        idem_conformance::skip_or_fail("PostgreSQL", &e);
        return;
    }
    let Some(tools) = tools("postgres") else {
        return;
    };
    let Some(psql_bin) = on_path("psql") else {
        skip(
            "postgres",
            "psql missing from the PATH (it makes and drops the test's schema)",
        );
        return;
    };
    let name = format!("console_e2e_{}", secret());
    psql(&psql_bin, &base, &format!("CREATE SCHEMA {name}"))
        .unwrap_or_else(|e| panic!("create schema {name}: {e}"));
    let _schema = Schema {
        psql: psql_bin,
        url: base.clone(),
        name: name.clone(),
    };
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}options=-c%20search_path%3D{name}");
    run_console_e2e(&tools, "postgres", &url);
}
