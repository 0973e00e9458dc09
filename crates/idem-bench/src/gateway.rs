//! `idem bench gateway`: throughput and latency through the gateway against the upstream
//! directly and against nginx `proxy_pass` to the same upstream, in the same run; then a
//! duplicate storm that must cost one upstream call.
//!
//! Setup: the stand-in upstream ([`idem_stub`]) and the gateway each run on a
//! single-threaded runtime on a thread of their own; nginx runs as one process
//! (`master_process off`), so both proxies are one event loop on one thread. Load comes from this process: `concurrency` keep-alive
//! HTTP/1.1 connections, each sending requests back to back for `phase` time. Targets
//! alternate within each round (direct, nginx, gateway) so drift in the machine's load
//! hits all of them alike. Scenarios: key-less pass-through (`GET /ping`) and keyed
//! writes with fresh keys (`POST /v1/orders`).
//!
//! nginx: `options.nginx`, else `/usr/sbin/nginx` or `nginx` on `PATH`. The bench never
//! installs it: when there is none the report says so (text and JSON) and the nginx
//! column and ratios are left out. It drives the gateway through its public API only.

use crate::saturation::{Meter, Saturation};
use std::collections::{BTreeMap, HashSet};
use std::ffi::OsString;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, HOST};
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use idem_gateway::{
    ApiKeyEntry, GatewayConfig, GatewayError, GatewayMetrics, KeyRule, RouteConfig,
};
use idem_stub::{Stub, StubState};

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

/// What to run.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct BenchOptions {
    /// Length of one measured phase (one target, one scenario, one round), in ms.
    pub phase_ms: u64,
    /// Rounds of (direct, nginx, gateway) per scenario.
    pub rounds: usize,
    /// Concurrent keep-alive connections of the load generator.
    pub concurrency: usize,
    /// Duplicates in the storm.
    pub storm: usize,
    /// Connections the storm is spread over (each sends its share back to back).
    pub storm_connections: usize,
    /// How long the storm's single execution takes upstream, in ms, so that duplicates
    /// pile up while it runs.
    pub storm_exec_ms: u64,
    /// Share the gateway's window through this Redis (default: in-process memory).
    pub redis_url: Option<String>,
    /// nginx binary to use; default `/usr/sbin/nginx` or `nginx` on `PATH`.
    pub nginx: Option<PathBuf>,
    /// Scenarios to run: `pass` (key-less pass-through) and/or `keyed` (fresh keys).
    pub scenarios: Vec<String>,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            phase_ms: 2_000,
            rounds: 2,
            concurrency: 32,
            storm: 1_000,
            storm_connections: 1_000,
            storm_exec_ms: 300,
            redis_url: None,
            nginx: None,
            scenarios: vec!["pass".into(), "keyed".into()],
        }
    }
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

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Scenario {
    pub name: String,
    pub targets: Vec<TargetResult>,
    /// Gateway throughput / direct throughput.
    pub gateway_vs_direct: f64,
    /// Gateway throughput / nginx throughput (when nginx ran).
    pub gateway_vs_nginx: Option<f64>,
    /// What the gateway's last round was limited by (client, gateway and upstream share
    /// the machine).
    pub gateway_saturation: Option<Saturation>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Storm {
    pub duplicates: usize,
    pub connections: usize,
    /// Requests the upstream received for the storm's key: must be 1.
    pub upstream_calls: u64,
    pub upstream_executions: u64,
    pub ok: u64,
    pub errors: u64,
    /// Distinct response bodies the clients saw: must be 1.
    pub distinct_bodies: usize,
    pub statuses: BTreeMap<u16, u64>,
    pub coalesced_waiters: u64,
    pub window_hits: u64,
    pub elapsed_ms: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub one_upstream_call: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NginxInfo {
    pub available: bool,
    pub binary: Option<String>,
    /// What was used, or why there is no nginx column.
    pub note: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchReport {
    pub phase_ms: u64,
    pub rounds: usize,
    pub concurrency: usize,
    pub window: String,
    pub nginx: NginxInfo,
    pub scenarios: Vec<Scenario>,
    pub storm: Storm,
    /// The target: pass-through at least this fraction of nginx's throughput.
    pub target_passthrough_vs_nginx: f64,
    pub passthrough_vs_nginx: Option<f64>,
    pub meets_target: Option<bool>,
}

impl BenchReport {
    /// A human-readable table.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        s.push_str(&format!(
            "idem bench gateway: {} connections, {} ms x {} rounds per target, window {}\n",
            self.concurrency, self.phase_ms, self.rounds, self.window
        ));
        s.push_str(&format!("nginx: {}\n", self.nginx.note));
        for sc in &self.scenarios {
            s.push_str(&format!("\n{}\n", sc.name));
            s.push_str(&format!(
                "  {:<8} {:>10} {:>8} {:>10} {:>10}\n",
                "target", "req/s", "errors", "p50 us", "p99 us"
            ));
            for t in &sc.targets {
                s.push_str(&format!(
                    "  {:<8} {:>10.0} {:>8} {:>10} {:>10}\n",
                    t.target, t.rps, t.errors, t.p50_us, t.p99_us
                ));
            }
            s.push_str(&format!("  gateway/direct {:.2}", sc.gateway_vs_direct));
            match sc.gateway_vs_nginx {
                Some(r) => s.push_str(&format!("  gateway/nginx {r:.2}\n")),
                None => s.push_str("  gateway/nginx n/a\n"),
            }
            if let Some(sat) = &sc.gateway_saturation {
                s.push_str(&format!("  saturated: {}\n", sat.saturated));
            }
        }
        let st = &self.storm;
        s.push_str(&format!(
            "\nstorm: {} duplicates over {} connections in {} ms: {} upstream call(s), {} execution(s), {} distinct bodies, {} ok, {} errors, {} coalesced, {} window hits, p50 {} us, p99 {} us\n",
            st.duplicates, st.connections, st.elapsed_ms, st.upstream_calls, st.upstream_executions,
            st.distinct_bodies, st.ok, st.errors, st.coalesced_waiters, st.window_hits, st.p50_us, st.p99_us
        ));
        match (self.passthrough_vs_nginx, self.meets_target) {
            (Some(r), Some(ok)) => s.push_str(&format!(
                "pass-through vs nginx: {r:.2} (target >= {:.2}: {})\n",
                self.target_passthrough_vs_nginx,
                if ok { "met" } else { "NOT met" }
            )),
            _ => s.push_str("pass-through vs nginx: not measured (no nginx)\n"),
        }
        s
    }
}

const BENCH_API_KEY: &str = "bench-key";
const TENANT_HEADER: &str = "x-idem-tenant";

/// Runs the benchmark. Bounded in time: about `2 scenarios x rounds x 3 targets x phase`
/// plus the storm and setup.
pub async fn bench(options: BenchOptions) -> Result<BenchReport, BenchError> {
    let phase = Duration::from_millis(options.phase_ms.max(100));
    let concurrency = options.concurrency.max(1);

    let (upstream, _upstream_rt) = background("idem-bench-upstream", || async {
        let stub = Stub::start(TENANT_HEADER)
            .await
            .map_err(|e| BenchError::Setup(format!("upstream: {e}")))?;
        Ok(((stub.addr, stub.state.clone()), stub))
    })
    .await?;
    let (upstream_addr, upstream_state): (SocketAddr, Arc<StubState>) = upstream;

    let mut config = GatewayConfig::new(
        "127.0.0.1:0".parse().expect("address"),
        format!("http://{upstream_addr}"),
    );
    config.redis_url = options.redis_url.clone();
    let redis_prefix = format!("idem-bench-{}", uuid::Uuid::new_v4().simple());
    config.redis_prefix = redis_prefix.clone();
    config.routes = vec![RouteConfig {
        methods: vec!["POST".into()],
        path: "/v1/*".into(),
        key: KeyRule::Required,
    }];
    config.auth.api_keys.insert(
        BENCH_API_KEY.into(),
        ApiKeyEntry::Tenant(idem_core::TenantId::new("bench").expect("tenant")),
    );
    config.max_wait_ms = 60_000;
    let window = if config.redis_url.is_some() {
        "redis"
    } else {
        "memory"
    }
    .to_string();
    let (gateway, _gateway_rt) = background("idem-bench-gateway", move || async move {
        let gw = idem_gateway::start(config).await?;
        Ok(((gw.addr, gw.shared_metrics()), gw))
    })
    .await?;
    let (gateway_addr, gateway_metrics): (SocketAddr, Arc<GatewayMetrics>) = gateway;

    let (nginx_info, nginx) = match find_nginx(&options, std::env::var_os("PATH")) {
        Ok(binary) => match Nginx::start(&binary, upstream_addr).await {
            Ok(n) => (
                NginxInfo {
                    available: true,
                    binary: Some(binary.display().to_string()),
                    note: format!(
                        "{} (found), one process (single event loop), keepalive to the upstream",
                        binary.display(),
                    ),
                },
                Some(n),
            ),
            Err(e) => (
                NginxInfo {
                    available: false,
                    binary: Some(binary.display().to_string()),
                    note: format!("found {} but it did not start: {e}", binary.display()),
                },
                None,
            ),
        },
        Err(note) => (
            NginxInfo {
                available: false,
                binary: None,
                note,
            },
            None,
        ),
    };

    let mut targets: Vec<(&str, SocketAddr)> = vec![("direct", upstream_addr)];
    if let Some(n) = &nginx {
        targets.push(("nginx", n.addr));
    }
    targets.push(("gateway", gateway_addr));

    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let mut scenarios = Vec::new();
    let chosen = [ScenarioKind::PassThrough, ScenarioKind::KeyedFresh]
        .into_iter()
        .filter(|k| options.scenarios.iter().any(|s| s == k.slug()));
    for scenario in chosen {
        let mut loads: Vec<Load> = targets.iter().map(|_| Load::default()).collect();
        let mut gateway_saturation = None;
        for round in 0..options.rounds.max(1) {
            for (i, (name, addr)) in targets.iter().enumerate() {
                let prefix = format!("{run_id}-{}-{name}-{round}", scenario.slug());
                let meter = Meter::start();
                let l = drive(*addr, concurrency, phase, scenario, &prefix).await;
                if *name == "gateway" {
                    gateway_saturation = Some(meter.stop("the gateway's proxying"));
                }
                loads[i].merge(l);
            }
        }
        let results: Vec<TargetResult> = targets
            .iter()
            .zip(loads.iter_mut())
            .map(|((name, _), l)| l.result(name))
            .collect();
        let rps = |t: &str| results.iter().find(|r| r.target == t).map(|r| r.rps);
        let gw = rps("gateway").unwrap_or(0.0);
        scenarios.push(Scenario {
            name: scenario.name().to_string(),
            gateway_vs_direct: ratio(gw, rps("direct").unwrap_or(0.0)),
            gateway_vs_nginx: rps("nginx").map(|n| ratio(gw, n)),
            targets: results,
            gateway_saturation,
        });
    }

    let storm = storm(
        gateway_addr,
        &upstream_state,
        &gateway_metrics,
        &options,
        &run_id,
    )
    .await;
    drop(nginx);
    if let Some(url) = &options.redis_url {
        if let Err(e) = purge_prefix(url, &redis_prefix).await {
            tracing::warn!(error = %e, prefix = %redis_prefix, "bench: removing the window records from Redis failed; they expire with the window");
        }
    }

    let passthrough_vs_nginx = scenarios
        .iter()
        .find(|s| s.name == ScenarioKind::PassThrough.name())
        .and_then(|s| s.gateway_vs_nginx);
    const TARGET: f64 = 0.9;
    Ok(BenchReport {
        phase_ms: phase.as_millis() as u64,
        rounds: options.rounds.max(1),
        concurrency,
        window,
        nginx: nginx_info,
        scenarios,
        storm,
        target_passthrough_vs_nginx: TARGET,
        passthrough_vs_nginx,
        meets_target: passthrough_vs_nginx.map(|r| r >= TARGET),
    })
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        (a / b * 1000.0).round() / 1000.0
    } else {
        0.0
    }
}

/// A server running on a runtime (and thread) of its own, stopped when dropped.
struct Background {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
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
async fn background<T, G, F, Fut>(name: &str, start: F) -> Result<(T, Background), BenchError>
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
            rt.block_on(async move {
                match start().await {
                    Ok((value, guard)) => {
                        let _ = ready_tx.send(Ok(value));
                        let _ = stop_rx.await;
                        drop(guard);
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            });
        })?;
    let bg = Background {
        stop: Some(stop_tx),
        thread: Some(thread),
    };
    let value = ready_rx
        .await
        .map_err(|_| BenchError::Setup(format!("{name} did not start")))??;
    Ok((value, bg))
}

#[derive(Debug, Clone, Copy)]
enum ScenarioKind {
    PassThrough,
    KeyedFresh,
}

impl ScenarioKind {
    fn name(self) -> &'static str {
        match self {
            ScenarioKind::PassThrough => "pass-through GET /ping (no key)",
            ScenarioKind::KeyedFresh => "keyed POST /v1/orders (fresh keys)",
        }
    }

    /// Short name, used in idempotency keys (which allow no spaces).
    fn slug(self) -> &'static str {
        match self {
            ScenarioKind::PassThrough => "pass",
            ScenarioKind::KeyedFresh => "keyed",
        }
    }

    fn request(self, addr: SocketAddr, key: &str) -> Request<Full<Bytes>> {
        let host = HeaderValue::from_str(&addr.to_string()).expect("address");
        match self {
            ScenarioKind::PassThrough => Request::builder()
                .method(Method::GET)
                .uri("/ping")
                .header(HOST, host)
                .body(Full::new(Bytes::new()))
                .expect("request"),
            ScenarioKind::KeyedFresh => Request::builder()
                .method(Method::POST)
                .uri("/v1/orders")
                .header(HOST, host)
                .header(CONTENT_TYPE, "application/json")
                .header("x-api-key", BENCH_API_KEY)
                .header("idempotency-key", key)
                .body(Full::new(Bytes::from_static(
                    br#"{"user":"U-7318","show":"S-204","seats":2}"#,
                )))
                .expect("request"),
        }
    }
}

#[derive(Default)]
struct Load {
    ok: u64,
    errors: u64,
    elapsed: Duration,
    latencies_us: Vec<u64>,
}

impl Load {
    fn merge(&mut self, other: Load) {
        self.ok += other.ok;
        self.errors += other.errors;
        self.elapsed += other.elapsed;
        self.latencies_us.extend(other.latencies_us);
    }

    fn result(&mut self, target: &str) -> TargetResult {
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

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(addr: SocketAddr) -> Option<Sender> {
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
async fn send_one(send: &mut Sender, req: Request<Full<Bytes>>) -> Option<(u16, Bytes)> {
    send.ready().await.ok()?;
    let resp = send.send_request(req).await.ok()?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.ok()?.to_bytes();
    Some((status, body))
}

/// `concurrency` connections sending back to back until `phase` has passed.
async fn drive(
    addr: SocketAddr,
    concurrency: usize,
    phase: Duration,
    scenario: ScenarioKind,
    key_prefix: &str,
) -> Load {
    let start = Instant::now();
    let deadline = start + phase;
    let mut tasks = Vec::with_capacity(concurrency);
    for c in 0..concurrency {
        let prefix = format!("{key_prefix}-{c}");
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
                let req = scenario.request(addr, &format!("{prefix}-{seq}"));
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

/// `options.storm` requests with one key, all at once, through the gateway.
async fn storm(
    gateway: SocketAddr,
    upstream: &StubState,
    metrics: &GatewayMetrics,
    options: &BenchOptions,
    run_id: &str,
) -> Storm {
    let duplicates = options.storm.max(1);
    let connections = options.storm_connections.clamp(1, duplicates);
    let key = format!("storm-{run_id}");
    upstream.delay_executions(Duration::from_millis(options.storm_exec_ms));
    let coalesced_before = metrics.coalesced_waiters();
    let hits_before = metrics.window_hits();
    // Connect first, so the requests themselves start together.
    let mut conns = Vec::with_capacity(connections);
    for _ in 0..connections {
        conns.push(connect(gateway).await);
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(connections));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(connections);
    for (c, conn) in conns.into_iter().enumerate() {
        let share = duplicates / connections + usize::from(c < duplicates % connections);
        let key = key.clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::with_capacity(share);
            let mut conn = conn;
            barrier.wait().await;
            for _ in 0..share {
                let t = Instant::now();
                let res = match &mut conn {
                    Some(s) => send_one(s, ScenarioKind::KeyedFresh.request(gateway, &key)).await,
                    None => None,
                };
                if res.is_none() {
                    conn = connect(gateway).await;
                }
                out.push((res, t.elapsed().as_micros() as u64));
            }
            out
        }));
    }
    let mut statuses = BTreeMap::new();
    let mut bodies = HashSet::new();
    let (mut ok, mut errors) = (0, 0);
    let mut latencies = Vec::with_capacity(duplicates);
    for t in tasks {
        for (res, us) in t.await.unwrap_or_default() {
            latencies.push(us);
            match res {
                Some((status, body)) => {
                    *statuses.entry(status).or_insert(0) += 1;
                    if (200..300).contains(&status) {
                        ok += 1;
                        bodies.insert(body);
                    } else {
                        errors += 1;
                    }
                }
                None => errors += 1,
            }
        }
    }
    let elapsed_ms = start.elapsed().as_millis() as u64;
    upstream.delay_executions(Duration::ZERO);
    latencies.sort_unstable();
    let upstream_calls = upstream.calls(&key);
    Storm {
        duplicates,
        connections,
        upstream_calls,
        upstream_executions: upstream.executions(&key),
        ok,
        errors,
        distinct_bodies: bodies.len(),
        statuses,
        coalesced_waiters: metrics.coalesced_waiters() - coalesced_before,
        window_hits: metrics.window_hits() - hits_before,
        elapsed_ms,
        p50_us: percentile(&latencies, 0.50),
        p99_us: percentile(&latencies, 0.99),
        one_upstream_call: upstream_calls == 1,
    }
}

/// Deletes the bench's window records (`<prefix>:*`) from Redis.
async fn purge_prefix(url: &str, prefix: &str) -> redis::RedisResult<()> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}:*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await?;
        if !batch.is_empty() {
            redis::cmd("UNLINK")
                .arg(&batch)
                .query_async::<i64>(&mut conn)
                .await?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// Finds nginx: `options.nginx`, else `/usr/sbin/nginx` or `nginx` on `path` (the
/// `PATH` value). Never installs it: a missing nginx is a note in the report.
fn find_nginx(options: &BenchOptions, path: Option<OsString>) -> Result<PathBuf, String> {
    if let Some(p) = &options.nginx {
        return if p.is_file() {
            Ok(p.clone())
        } else {
            Err(format!(
                "nginx {} does not exist; nginx figures skipped",
                p.display()
            ))
        };
    }
    let mut candidates = vec![PathBuf::from("/usr/sbin/nginx")];
    if let Some(path) = path {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("nginx")));
    }
    candidates.into_iter().find(|p| p.is_file()).ok_or_else(|| {
        "nginx not found (/usr/sbin/nginx, PATH); nginx figures skipped (install nginx to compare)"
            .to_string()
    })
}

/// nginx with a generated config, in a temporary prefix, killed when dropped. It runs as
/// a single process (`master_process off`): one event loop, like one worker, and nothing
/// left behind when the process is killed.
struct Nginx {
    addr: SocketAddr,
    child: tokio::process::Child,
    _dir: tempfile::TempDir,
}

impl Nginx {
    async fn start(binary: &Path, upstream: SocketAddr) -> Result<Nginx, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
            l.local_addr().map_err(|e| e.to_string())?.port()
        };
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let d = dir.path().display();
        let conf = format!(
            r#"worker_processes 1;
master_process off;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {d}/client_body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  keepalive_requests 10000000;
  upstream idem_bench_upstream {{
    server {upstream};
    keepalive 256;
    keepalive_requests 10000000;
  }}
  server {{
    listen {addr};
    location / {{
      proxy_pass http://idem_bench_upstream;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }}
  }}
}}
"#
        );
        let conf_path = dir.path().join("nginx.conf");
        std::fs::write(&conf_path, conf).map_err(|e| e.to_string())?;
        let mut child = tokio::process::Command::new(binary)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf_path)
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| e.to_string())?;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if TcpStream::connect(addr).await.is_ok() {
                return Ok(Nginx {
                    addr,
                    child,
                    _dir: dir,
                });
            }
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default();
                return Err(format!("nginx exited with {status}: {}", log.trim()));
            }
            if Instant::now() > deadline {
                return Err("nginx did not start listening within 5 s".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // One process (master_process off), so killing it leaves no worker behind.
        let _ = self.child.start_kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_nginx_is_a_note_never_an_install() {
        let none = find_nginx(&BenchOptions::default(), Some(OsString::new()));
        if std::path::Path::new("/usr/sbin/nginx").is_file() {
            assert!(none.is_ok());
        } else {
            let note = none.unwrap_err();
            assert!(note.contains("nginx not found"), "{note}");
        }
        let named = BenchOptions {
            nginx: Some("/nonexistent/nginx".into()),
            ..BenchOptions::default()
        };
        let note = find_nginx(&named, None).unwrap_err();
        assert!(note.contains("does not exist"), "{note}");
    }
}
