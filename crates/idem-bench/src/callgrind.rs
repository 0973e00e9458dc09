//! `idem bench callgrind`: instructions per request (keyed, or the gateway's key-less
//! pass-through), counted by valgrind's callgrind.
//!
//! The server under test — the gateway, or an axum app behind the HTTP layer — runs as a
//! child `idem bench callgrind-serve` under `valgrind --tool=callgrind`; the upstream
//! (`idem-stub`) and the client run in this process, outside valgrind. Each measurement
//! is two runs of the child: an idle one (start, the seeding a workload needs, stop) and
//! one that also serves `requests` requests; instructions per request are the
//! difference over `requests`, so start-up and shutdown cancel out. Workloads: fresh keys
//! (every request claims, forwards or executes, and finishes), replays (a few keys
//! executed once, then answered from the window or store) and, for the gateway, key-less
//! requests it passes through.
//!
//! Owns the child's command line and the reading of callgrind's totals. It must not
//! change what the server under test is configured with beyond what the bench uses.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use http::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST};
use http::{Method, Request};
use http_body_util::Full;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

use crate::client::{background, connect, send_one};
use crate::gateway::{bench_config, keyed_request, pass_request, BenchError, TENANT_HEADER};
use idem_core::{IdempotencyStore, Principal, TenantId};
use idem_http::{BearerTokens, IdempotencyLayer, Identity};

/// Hot keys of the replay workload, executed once before the counted requests.
const REPLAY_KEYS: usize = 8;
/// The line the child prints once it listens.
const LISTENING: &str = "listening ";

/// What serves the counted requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// The gateway in front of `idem-stub`.
    Gateway,
    /// An axum app behind `IdempotencyLayer`.
    Layer,
}

impl Target {
    pub fn parse(s: &str) -> Option<Target> {
        match s {
            "gateway" => Some(Target::Gateway),
            "layer" => Some(Target::Layer),
            _ => None,
        }
    }

    fn slug(self) -> &'static str {
        match self {
            Target::Gateway => "gateway",
            Target::Layer => "layer",
        }
    }
}

impl Workload {
    fn slug(self) -> &'static str {
        match self {
            Workload::Fresh => "fresh",
            Workload::Replay => "replay",
            Workload::Pass => "pass",
        }
    }
}

/// Which requests are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// A new key every request.
    Fresh,
    /// A few keys executed before counting, then repeated: replays.
    Replay,
    /// Key-less requests the gateway passes through (gateway only).
    Pass,
}

impl Workload {
    pub fn parse(s: &str) -> Option<Workload> {
        match s {
            "fresh" => Some(Workload::Fresh),
            "replay" => Some(Workload::Replay),
            "pass" => Some(Workload::Pass),
            _ => None,
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct CallgrindOptions {
    pub target: Target,
    pub workload: Workload,
    /// Requests counted.
    pub requests: usize,
    /// Keep-alive connections they are spread over.
    pub connections: usize,
    /// The window (gateway) or store (layer) in this Redis; in memory when `None`.
    pub redis_url: Option<String>,
    /// The `idem` binary the child runs (normally this one).
    pub exe: PathBuf,
    /// Where callgrind's output files are kept; a temporary directory when `None`.
    pub out_dir: Option<PathBuf>,
    /// Functions listed by inclusive cost.
    pub top: usize,
    /// Also simulate the caches (`--cache-sim=yes`): misses per request besides
    /// instructions. A request's CPU time follows its cache misses as well as its
    /// instructions (a large code path misses the instruction cache on every request).
    pub cache_sim: bool,
}

/// Simulated cache misses per request (valgrind's model of the first-level caches and
/// the last level), the idle run's subtracted.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct CacheMisses {
    /// First-level instruction cache misses (`I1mr`).
    pub i1: f64,
    /// First-level data cache misses, reads and writes (`D1mr` + `D1mw`).
    pub d1: f64,
    /// Last-level misses, instructions and data (`ILmr` + `DLmr` + `DLmw`).
    pub ll: f64,
}

/// The result of [`measure`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CallgrindReport {
    pub target: Target,
    pub workload: Workload,
    /// `memory` or `redis`.
    pub store: String,
    pub requests: usize,
    pub connections: usize,
    /// Instructions of the idle run (start, seeding, stop).
    pub idle_instructions: u64,
    /// Instructions of the run that also served `requests`.
    pub loaded_instructions: u64,
    /// (loaded − idle) / requests.
    pub instructions_per_request: f64,
    /// With `cache_sim`: cache misses per request.
    pub cache_misses_per_request: Option<CacheMisses>,
    /// The loaded run's callgrind file (when kept).
    pub out_file: Option<String>,
    /// `callgrind_annotate --inclusive=yes` of the loaded run: the costliest functions.
    pub top_inclusive: Vec<String>,
}

impl CallgrindReport {
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "idem bench callgrind: {} {} keys, store {}, {} requests over {} connections\n\
             instructions: idle run {}, loaded run {}, per request {:.0}\n",
            self.target.slug(),
            match self.workload {
                Workload::Fresh => "fresh",
                Workload::Replay => "replayed",
                Workload::Pass => "no",
            },
            self.store,
            self.requests,
            self.connections,
            self.idle_instructions,
            self.loaded_instructions,
            self.instructions_per_request,
        );
        if let Some(m) = &self.cache_misses_per_request {
            s.push_str(&format!(
                "cache misses per request (simulated): I1 {:.0}, D1 {:.0}, LL {:.0}\n",
                m.i1, m.d1, m.ll
            ));
        }
        if let Some(f) = &self.out_file {
            s.push_str(&format!("callgrind file: {f}\n"));
        }
        if !self.top_inclusive.is_empty() {
            s.push_str("top inclusive costs (loaded run):\n");
            for line in &self.top_inclusive {
                s.push_str(&format!("  {line}\n"));
            }
        }
        s
    }
}

/// Runs the idle and the loaded child and reports instructions per request.
pub async fn measure(options: CallgrindOptions) -> Result<CallgrindReport, BenchError> {
    if options.workload == Workload::Pass && options.target != Target::Gateway {
        return Err(BenchError::Setup(
            "the pass workload is the gateway's: the layer has no pass-through".into(),
        ));
    }
    let valgrind = find_on_path("valgrind")
        .ok_or_else(|| BenchError::Setup("valgrind not found on PATH".into()))?;
    let requests = options.requests.max(1);
    let connections = options.connections.clamp(1, requests);
    let tmp = tempfile::tempdir()?;
    let dir = options
        .out_dir
        .clone()
        .unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir)?;

    let (upstream, _upstream_rt) = background("idem-bench-upstream", || async {
        let stub = idem_stub::Stub::start(TENANT_HEADER)
            .await
            .map_err(|e| BenchError::Setup(format!("upstream: {e}")))?;
        Ok((stub.addr, stub))
    })
    .await?;

    let run = uuid::Uuid::now_v7().simple().to_string();
    let prefix = format!("idem-bench-cg-{run}");
    let child = Child {
        valgrind,
        options: &options,
        upstream,
        prefix: &prefix,
    };
    let label = format!("{}-{}", options.target.slug(), options.workload.slug());
    let idle_file = dir.join(format!("callgrind.{label}-idle.out"));
    let loaded_file = dir.join(format!("callgrind.{label}-loaded.out"));
    let measured = async {
        let idle = child.run(&idle_file, 0, connections, &run).await?;
        let loaded = child.run(&loaded_file, requests, connections, &run).await?;
        Ok::<_, BenchError>((idle, loaded))
    }
    .await;
    if let Some(url) = &options.redis_url {
        if let Err(e) = crate::cleanup::unlink_prefix_at(url, &prefix).await {
            tracing::warn!(error = %e, %prefix, "bench: removing the run's keys from Redis failed");
        }
    }
    let (idle, loaded) = measured?;
    let per_request = |event: &[&str]| {
        let sum = |t: &Totals| event.iter().map(|e| t.event(e).unwrap_or(0)).sum::<u64>();
        sum(&loaded).saturating_sub(sum(&idle)) as f64 / requests as f64
    };
    let cache_misses_per_request = options.cache_sim.then(|| CacheMisses {
        i1: per_request(&["I1mr"]),
        d1: per_request(&["D1mr", "D1mw"]),
        ll: per_request(&["ILmr", "DLmr", "DLmw"]),
    });
    let instructions_per_request = per_request(&["Ir"]);
    let (idle, loaded) = (
        idle.event("Ir").unwrap_or(0),
        loaded.event("Ir").unwrap_or(0),
    );
    let top_inclusive = annotate(&loaded_file, options.top).await;
    Ok(CallgrindReport {
        target: options.target,
        workload: options.workload,
        store: if options.redis_url.is_some() {
            "redis"
        } else {
            "memory"
        }
        .into(),
        requests,
        connections,
        idle_instructions: idle,
        loaded_instructions: loaded,
        instructions_per_request,
        cache_misses_per_request,
        out_file: options
            .out_dir
            .as_ref()
            .map(|_| loaded_file.display().to_string()),
        top_inclusive,
    })
}

/// How the child is started.
struct Child<'a> {
    valgrind: PathBuf,
    options: &'a CallgrindOptions,
    upstream: SocketAddr,
    prefix: &'a str,
}

impl Child<'_> {
    /// One run under callgrind: start, seed, `requests` requests, stop. Returns the
    /// events callgrind counted.
    async fn run(
        &self,
        out: &Path,
        requests: usize,
        connections: usize,
        run: &str,
    ) -> Result<Totals, BenchError> {
        let o = self.options;
        let mut cmd = tokio::process::Command::new(&self.valgrind);
        cmd.arg("--tool=callgrind");
        if o.cache_sim {
            cmd.arg("--cache-sim=yes");
        }
        cmd.arg(format!("--callgrind-out-file={}", out.display()))
            .arg(&o.exe)
            .args(["bench", "callgrind-serve", "--target", o.target.slug()])
            .arg("--upstream")
            .arg(self.upstream.to_string())
            .arg("--prefix")
            .arg(self.prefix);
        if let Some(url) = &o.redis_url {
            cmd.arg("--redis-url").arg(url);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        let errors = tokio::spawn(async move {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s).await;
            s
        });
        let mut lines = BufReader::new(stdout).lines();
        let addr = tokio::time::timeout(Duration::from_secs(300), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(a) = line.strip_prefix(LISTENING) {
                    return a.trim().parse::<SocketAddr>().ok();
                }
            }
            None
        })
        .await
        .ok()
        .flatten();
        let Some(addr) = addr else {
            let _ = child.start_kill();
            let log = errors.await.unwrap_or_default();
            return Err(BenchError::Setup(format!(
                "the child under valgrind did not start: {}",
                tail(&log)
            )));
        };
        let sent = self.send(addr, requests, connections, run).await;
        // End of stdin is the child's signal to stop.
        drop(child.stdin.take());
        let status = tokio::time::timeout(Duration::from_secs(300), child.wait())
            .await
            .map_err(|_| BenchError::Setup("the child under valgrind did not stop".into()))??;
        let log = errors.await.unwrap_or_default();
        sent?;
        if !status.success() {
            return Err(BenchError::Setup(format!(
                "the child under valgrind failed ({status}): {}",
                tail(&log)
            )));
        }
        totals(&std::fs::read_to_string(out)?)
            .ok_or_else(|| BenchError::Setup(format!("no totals in {}", out.display())))
    }

    /// The workload's seeding, then `requests` requests spread over `connections`.
    async fn send(
        &self,
        addr: SocketAddr,
        requests: usize,
        connections: usize,
        run: &str,
    ) -> Result<(), BenchError> {
        let target = self.options.target;
        let workload = self.options.workload;
        if workload == Workload::Replay {
            let mut conn = connect(addr)
                .await
                .ok_or_else(|| BenchError::Setup("cannot connect".into()))?;
            for k in 0..REPLAY_KEYS {
                expect_ok(
                    send_one(&mut conn, request(target, addr, &format!("hot-{run}-{k}"))).await,
                )?;
            }
        }
        let mut tasks = Vec::with_capacity(connections);
        for c in 0..connections {
            let share = requests / connections + usize::from(c < requests % connections);
            let run = run.to_string();
            tasks.push(tokio::spawn(async move {
                if share == 0 {
                    return Ok(());
                }
                let mut conn = connect(addr)
                    .await
                    .ok_or_else(|| BenchError::Setup("cannot connect".into()))?;
                for i in 0..share {
                    let req = match workload {
                        Workload::Fresh => request(target, addr, &format!("fresh-{run}-{c}-{i}")),
                        Workload::Replay => request(
                            target,
                            addr,
                            &format!("hot-{run}-{}", (c + i) % REPLAY_KEYS),
                        ),
                        Workload::Pass => pass_request(addr),
                    };
                    expect_ok(send_one(&mut conn, req).await)?;
                }
                Ok::<_, BenchError>(())
            }));
        }
        for t in tasks {
            t.await
                .map_err(|e| BenchError::Setup(format!("client task: {e}")))??;
        }
        Ok(())
    }
}

fn expect_ok(answer: Option<(u16, Bytes)>) -> Result<(), BenchError> {
    match answer {
        Some((status, _)) if (200..300).contains(&status) => Ok(()),
        Some((status, body)) => Err(BenchError::Setup(format!(
            "answered {status}: {}",
            String::from_utf8_lossy(&body)
        ))),
        None => Err(BenchError::Setup("the connection failed".into())),
    }
}

fn request(target: Target, addr: SocketAddr, key: &str) -> Request<Full<Bytes>> {
    match target {
        Target::Gateway => keyed_request(addr, key),
        Target::Layer => Request::builder()
            .method(Method::POST)
            .uri("/v1/orders")
            .header(
                HOST,
                HeaderValue::from_str(&addr.to_string()).expect("address"),
            )
            .header(CONTENT_TYPE, "application/json")
            .header(AUTHORIZATION, format!("Bearer {}", crate::http::TOKEN))
            .header("idempotency-key", key)
            .body(Full::new(Bytes::from_static(crate::http::BODY.as_bytes())))
            .expect("request"),
    }
}

/// The child: serves `target` until its stdin ends, after printing `listening <addr>`.
pub async fn serve(
    target: Target,
    upstream: SocketAddr,
    redis_url: Option<String>,
    prefix: String,
) -> Result<(), BenchError> {
    let (addr, server) = match target {
        Target::Gateway => {
            let config = bench_config(upstream, redis_url, &prefix);
            background("idem-bench-gateway", move || async move {
                let gw = idem_gateway::start(config).await?;
                Ok((gw.addr, gw))
            })
            .await?
        }
        Target::Layer => {
            let store = layer_store(redis_url, prefix).await?;
            background("idem-bench-layer", move || async move {
                let tenant = TenantId::new("bench").expect("tenant");
                let principal = Principal::new("bench").expect("principal");
                let auth =
                    BearerTokens::new().with(crate::http::TOKEN, Identity::new(tenant, principal));
                let app = Router::new()
                    .route("/v1/orders", post(crate::http::create_order))
                    .layer(IdempotencyLayer::from_arcs(store, Arc::new(auth)));
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                let addr = listener.local_addr()?;
                let server = tokio::spawn(async move {
                    let _ = axum::serve(listener, app).await;
                });
                Ok((addr, AbortOnDrop(server)))
            })
            .await?
        }
    };
    println!("{LISTENING}{addr}");
    // Stop when the parent closes stdin.
    let mut sink = Vec::new();
    let _ = tokio::io::stdin().read_to_end(&mut sink).await;
    drop(server);
    Ok(())
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn layer_store(
    redis_url: Option<String>,
    prefix: String,
) -> Result<Arc<dyn IdempotencyStore>, BenchError> {
    match redis_url {
        None => Ok(Arc::new(idem_gateway::MemoryStore::new(
            idem_gateway::MemoryOptions::default(),
        ))),
        Some(url) => {
            let mut open = idem_sql::OpenOptions::default();
            open.redis_prefix = Some(prefix);
            let store = idem_sql::Store::open(&url, &open)
                .await
                .map_err(|e| BenchError::Setup(format!("opening {url}: {e}")))?;
            Ok(store.records())
        }
    }
}

/// callgrind's event totals, by event name (`Ir`, and with the cache simulation `I1mr`,
/// `D1mr`, …).
#[derive(Debug, Clone, PartialEq)]
struct Totals(Vec<(String, u64)>);

impl Totals {
    fn event(&self, name: &str) -> Option<u64> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }
}

/// The `events:` line names the columns of the `totals:` line (or `summary:`) of
/// callgrind's output file; both are needed, and `Ir` must be among them. Trailing
/// columns left out are zero (callgrind writes no trailing zero counts).
fn totals(out: &str) -> Option<Totals> {
    let names = out.lines().find_map(|l| l.strip_prefix("events:"))?;
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("totals:"))
        .or_else(|| out.lines().find_map(|l| l.strip_prefix("summary:")))?;
    let values: Vec<u64> = line
        .split_whitespace()
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    let names: Vec<&str> = names.split_whitespace().collect();
    if values.is_empty() || values.len() > names.len() {
        return None;
    }
    let totals = Totals(
        names
            .into_iter()
            .map(str::to_string)
            .zip(values.into_iter().chain(std::iter::repeat(0)))
            .collect(),
    );
    totals.event("Ir").map(|_| totals)
}

/// The costliest functions by inclusive instructions, as `callgrind_annotate` lists them.
async fn annotate(file: &Path, top: usize) -> Vec<String> {
    if top == 0 {
        return Vec::new();
    }
    let Ok(out) = tokio::process::Command::new("callgrind_annotate")
        .arg("--inclusive=yes")
        .arg(file)
        .output()
        .await
    else {
        return vec!["callgrind_annotate did not run".into()];
    };
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .skip_while(|l| !l.contains("file:function"))
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("--"))
        .take(top)
        .map(str::to_string)
        .collect()
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The last lines of a child's log, for an error message.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_are_read_from_callgrind_output() {
        let ir = |out: &str| totals(out).and_then(|t| t.event("Ir"));
        let out = "version: 1\ncmd: idem\nevents: Ir\nfn=(1) main\n1 5\nsummary: 123456\ntotals: 123456\n";
        assert_eq!(ir(out), Some(123456));
        assert_eq!(ir("events: Ir\nsummary: 42\n"), Some(42));
        assert_eq!(ir("events: Ir\n"), None);
        // With the cache simulation every event has its column.
        let out =
            "events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw\nsummary: 100 40 30 9 8 7 3 2 1\n";
        let t = totals(out).unwrap();
        assert_eq!(t.event("Ir"), Some(100));
        assert_eq!(t.event("I1mr"), Some(9));
        assert_eq!(t.event("DLmw"), Some(1));
        assert_eq!(t.event("Bc"), None);
        // Trailing zero counts are left out of the line; more values than names, or
        // none, or no `Ir` among the names, are refused.
        let t = totals("events: Ir I1mr D1mr\nsummary: 100\n").unwrap();
        assert_eq!(
            (t.event("Ir"), t.event("I1mr"), t.event("D1mr")),
            (Some(100), Some(0), Some(0))
        );
        assert!(totals("events: Ir\nsummary: 100 5\n").is_none());
        assert!(totals("events: Ir\nsummary:\n").is_none());
        assert!(totals("events: I1mr\nsummary: 100\n").is_none());
    }
}
