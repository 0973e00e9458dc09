//! `idem bench gateway`: throughput and latency through the gateway against the upstream
//! directly and against nginx `proxy_pass` to the same upstream, in the same run; then a
//! duplicate storm that must cost one upstream call.
//!
//! Setup: the stand-in upstream ([`idem_stub`]) and the gateway each run on a
//! single-threaded runtime on a thread of their own; nginx runs as one process
//! (`master_process off`), so both proxies are one event loop on one thread. Load comes
//! from this process: `concurrency` keep-alive HTTP/1.1 connections, each sending requests
//! back to back for `phase` time. Targets alternate within each round (direct, nginx,
//! gateway), each round starting one target further on, so drift in the machine's load
//! hits all of them alike; three rounds put every target in every place once. Before each
//! phase that is not a hot-key replay, the upstream forgets the keys it has seen: its CPU
//! per write doubles over a few hundred thousand keys, which would otherwise fall on the
//! target measured last. Scenarios: key-less pass-through (`GET /ping`), keyed writes with
//! fresh keys (`POST /v1/orders`), and hot keys: every connection repeats a few keys whose
//! first request was executed before the phase, so the gateway answers replays from its
//! window while nginx passes the same requests to the upstream.
//!
//! nginx: `options.nginx`, else `/usr/sbin/nginx` or `nginx` on `PATH`. The bench never
//! installs it: when there is none the report says so (text and JSON) and the nginx
//! column and ratios are left out. It drives the gateway through its public API only.

use crate::client::{background, connect, drive, percentile, send_one, Load};
use crate::nginx::{find_nginx, Nginx};
use crate::saturation::{CpuClock, CpuTime, Meter, Saturation};
use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, HOST};
use http::{Method, Request};
use http_body_util::Full;
use serde::{Deserialize, Serialize};

use idem_gateway::{ApiKeyEntry, GatewayConfig, GatewayMetrics, KeyRule, RouteConfig};
use idem_stub::{Stub, StubState};

pub use crate::client::{BenchError, TargetResult};

/// What to run.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct BenchOptions {
    /// Length of one measured phase (one target, one scenario, one round), in ms.
    pub phase_ms: u64,
    /// Rounds of (direct, nginx, gateway) per scenario, each starting one target further
    /// on.
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
    /// Scenarios to run: `pass` (key-less pass-through), `keyed` (fresh keys), `hot`
    /// (replays of a few hot keys).
    pub scenarios: Vec<String>,
    /// Keys the `hot` scenario repeats.
    pub hot_keys: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            phase_ms: 2_000,
            rounds: 3,
            concurrency: 32,
            storm: 1_000,
            storm_connections: 1_000,
            storm_exec_ms: 300,
            redis_url: None,
            nginx: None,
            scenarios: vec!["pass".into(), "keyed".into(), "hot".into()],
            hot_keys: 8,
        }
    }
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
    /// The bar `gateway_vs_nginx` should reach in this scenario.
    pub target_vs_nginx: f64,
    /// CPU per answered request, by target, read off each server's own clock.
    pub cpu: Vec<TargetCpu>,
    /// nginx's CPU per request ÷ the gateway's (above 1: the gateway spends less). Unlike
    /// the throughput ratio it does not depend on how the scheduler shared the cores
    /// between the proxy, the upstream and the load generator.
    pub gateway_vs_nginx_cpu: Option<f64>,
}

/// One target's CPU per answered request, in microseconds: the proxy's (nginx's process,
/// the gateway's thread; none for `direct`), split into user space and kernel, and the
/// upstream's. `None` where `/proc` could not be read.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetCpu {
    pub target: String,
    pub proxy_user_us: Option<f64>,
    pub proxy_system_us: Option<f64>,
    pub upstream_us: Option<f64>,
}

impl TargetCpu {
    fn proxy_us(&self) -> Option<f64> {
        Some(self.proxy_user_us? + self.proxy_system_us?)
    }
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
                Some(r) => s.push_str(&format!(
                    "  gateway/nginx {r:.2} (target >= {:.2}: {})\n",
                    sc.target_vs_nginx,
                    if r >= sc.target_vs_nginx {
                        "met"
                    } else {
                        "NOT met"
                    }
                )),
                None => s.push_str("  gateway/nginx n/a\n"),
            }
            if let Some(sat) = &sc.gateway_saturation {
                s.push_str(&format!("  saturated: {}\n", sat.saturated));
            }
            let us = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
            s.push_str("  cpu per request (us): proxy user + kernel, upstream\n");
            for c in &sc.cpu {
                s.push_str(&format!(
                    "  {:<8} {:>7} + {:<7} {:>7}\n",
                    c.target,
                    us(c.proxy_user_us),
                    us(c.proxy_system_us),
                    us(c.upstream_us)
                ));
            }
            if let Some(r) = sc.gateway_vs_nginx_cpu {
                s.push_str(&format!("  nginx cpu / gateway cpu per request {r:.2}\n"));
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
/// The hot-key scenario's caller: a tenant of its own, so the window partition the
/// fresh-key scenario filled does not refuse its first requests.
const HOT_API_KEY: &str = "bench-hot-key";
pub(crate) const TENANT_HEADER: &str = "x-idem-tenant";

/// The gateway the bench measures: `POST /v1/*` keyed, one API key, the window in memory
/// or in the Redis `redis_url` names under `redis_prefix`.
pub(crate) fn bench_config(
    upstream: SocketAddr,
    redis_url: Option<String>,
    redis_prefix: &str,
) -> GatewayConfig {
    let mut config = GatewayConfig::new(
        "127.0.0.1:0".parse().expect("address"),
        format!("http://{upstream}"),
    );
    config.redis_url = redis_url;
    config.redis_prefix = redis_prefix.to_string();
    config.routes = vec![RouteConfig {
        methods: vec!["POST".into()],
        path: "/v1/*".into(),
        key: KeyRule::Required,
    }];
    config.auth.api_keys.insert(
        BENCH_API_KEY.into(),
        ApiKeyEntry::Tenant(idem_core::TenantId::new("bench").expect("tenant")),
    );
    config.auth.api_keys.insert(
        HOT_API_KEY.into(),
        ApiKeyEntry::Tenant(idem_core::TenantId::new("bench-hot").expect("tenant")),
    );
    config.max_wait_ms = 60_000;
    // One caller writes every fresh key of a run: with the default share (a sixteenth
    // of the window) it would be refused with 429 after ~25k keys, and the run would
    // measure refusals.
    config.window_partition_bytes = Some(config.memory_window_bytes);
    config
}

/// A keyed write as the bench sends it to the gateway.
pub(crate) fn keyed_request(addr: SocketAddr, key: &str) -> Request<Full<Bytes>> {
    ScenarioKind::KeyedFresh.request(addr, key)
}

/// The pass-through scenario's request (no key).
pub(crate) fn pass_request(addr: SocketAddr) -> Request<Full<Bytes>> {
    ScenarioKind::PassThrough.request(addr, "")
}

/// Runs the benchmark. Bounded in time: about `scenarios x rounds x 3 targets x phase`
/// plus the storm and setup.
pub async fn bench(options: BenchOptions) -> Result<BenchReport, BenchError> {
    let phase = Duration::from_millis(options.phase_ms.max(100));
    let concurrency = options.concurrency.max(1);

    let (upstream, upstream_rt) = background("idem-bench-upstream", || async {
        let stub = Stub::start(TENANT_HEADER)
            .await
            .map_err(|e| BenchError::Setup(format!("upstream: {e}")))?;
        Ok(((stub.addr, stub.state.clone()), stub))
    })
    .await?;
    let (upstream_addr, upstream_state): (SocketAddr, Arc<StubState>) = upstream;

    let redis_prefix = format!("idem-bench-{}", uuid::Uuid::new_v4().simple());
    let config = bench_config(upstream_addr, options.redis_url.clone(), &redis_prefix);
    let window = if config.redis_url.is_some() {
        "redis"
    } else {
        "memory"
    }
    .to_string();
    let (gateway, gateway_rt) = background("idem-bench-gateway", move || async move {
        let gw = idem_gateway::start(config).await?;
        Ok(((gw.addr, gw.shared_metrics()), gw))
    })
    .await?;
    let (gateway_addr, gateway_metrics): (SocketAddr, Arc<GatewayMetrics>) = gateway;

    let (nginx_info, nginx) = match find_nginx(options.nginx.as_deref(), std::env::var_os("PATH")) {
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

    // Each target with the clock of whose CPU it costs besides the upstream's: none for
    // direct.
    let mut targets: Vec<(&str, SocketAddr, Option<CpuClock>)> =
        vec![("direct", upstream_addr, None)];
    if let Some(n) = &nginx {
        targets.push(("nginx", n.addr, n.pid().map(CpuClock::process)));
    }
    targets.push((
        "gateway",
        gateway_addr,
        gateway_rt.tid.map(CpuClock::thread),
    ));
    let upstream_clock = upstream_rt.tid.map(CpuClock::thread);

    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let mut scenarios = Vec::new();
    let chosen = [
        ScenarioKind::PassThrough,
        ScenarioKind::KeyedFresh,
        ScenarioKind::HotReplay,
    ]
    .into_iter()
    .filter(|k| options.scenarios.iter().any(|s| s == k.slug()));
    let hot_keys = options.hot_keys.max(1);
    for scenario in chosen {
        if let ScenarioKind::HotReplay = scenario {
            // Each hot key's first request executes before the phases: what follows is
            // replays (at the gateway) or the upstream's own answers (direct, nginx).
            // The upstream starts them empty and keeps them through the phases.
            upstream_state.forget();
            for (name, addr, _) in &targets {
                let mut conn = connect(*addr)
                    .await
                    .ok_or_else(|| BenchError::Setup(format!("{name}: cannot connect")))?;
                for k in 0..hot_keys {
                    let key = format!("{run_id}-hot-{name}-{k}");
                    match send_one(&mut conn, scenario.request(*addr, &key)).await {
                        Some((status, _)) if (200..300).contains(&status) => {}
                        other => {
                            return Err(BenchError::Setup(format!(
                                "{name}: seeding hot key {key}: {:?}",
                                other.map(|(s, _)| s)
                            )))
                        }
                    }
                }
            }
        }
        let mut loads: Vec<Load> = targets.iter().map(|_| Load::default()).collect();
        // Per target: the proxy's and the upstream's CPU time, summed over the rounds.
        let mut spent: Vec<(Option<CpuTime>, Option<CpuTime>)> = targets
            .iter()
            .map(|(_, _, proxy)| {
                (
                    proxy.as_ref().map(|_| CpuTime::default()),
                    upstream_clock.as_ref().map(|_| CpuTime::default()),
                )
            })
            .collect();
        let mut gateway_saturation = None;
        for round in 0..options.rounds.max(1) {
            // Each round starts one target further on, so no target always runs last.
            for k in 0..targets.len() {
                let i = (k + round) % targets.len();
                let (name, addr, proxy_clock) = &targets[i];
                let prefix = match scenario {
                    ScenarioKind::HotReplay => format!("{run_id}-hot-{name}"),
                    _ => {
                        // Every other phase meets the upstream as it started, so none
                        // pays for the keys an earlier phase left there.
                        upstream_state.forget();
                        format!("{run_id}-{}-{name}-{round}", scenario.slug())
                    }
                };
                let meter = Meter::start();
                let proxy_before = proxy_clock.as_ref().and_then(CpuClock::read);
                let upstream_before = upstream_clock.as_ref().and_then(CpuClock::read);
                let addr = *addr;
                let l = drive(addr, concurrency, phase, move |c, seq| {
                    let key = match scenario {
                        ScenarioKind::HotReplay => {
                            format!("{prefix}-{}", (c + seq as usize) % hot_keys)
                        }
                        _ => format!("{prefix}-{c}-{seq}"),
                    };
                    scenario.request(addr, &key)
                })
                .await;
                if *name == "gateway" {
                    gateway_saturation = Some(meter.stop("the gateway's proxying"));
                }
                let after = |clock: &Option<CpuClock>, before: Option<CpuTime>| {
                    Some(clock.as_ref()?.read()?.since(before?))
                };
                let (proxy, upstream) = &mut spent[i];
                *proxy = proxy
                    .zip(after(proxy_clock, proxy_before))
                    .map(|(a, b)| a + b);
                *upstream = upstream
                    .zip(after(&upstream_clock, upstream_before))
                    .map(|(a, b)| a + b);
                loads[i].merge(l);
            }
        }
        let results: Vec<TargetResult> = targets
            .iter()
            .zip(loads.iter_mut())
            .map(|((name, _, _), l)| l.result(name))
            .collect();
        let rps = |t: &str| results.iter().find(|r| r.target == t).map(|r| r.rps);
        let gw = rps("gateway").unwrap_or(0.0);
        let cpu: Vec<TargetCpu> = results
            .iter()
            .zip(&spent)
            .map(|(r, (proxy, upstream))| {
                let per = |s: f64| (r.requests > 0).then(|| round1(s * 1e6 / r.requests as f64));
                TargetCpu {
                    target: r.target.clone(),
                    proxy_user_us: proxy.and_then(|p| per(p.user_s)),
                    proxy_system_us: proxy.and_then(|p| per(p.system_s)),
                    upstream_us: upstream.and_then(|u| per(u.user_s + u.system_s)),
                }
            })
            .collect();
        let proxy_us = |t: &str| {
            cpu.iter()
                .find(|c| c.target == t)
                .and_then(TargetCpu::proxy_us)
        };
        let gateway_vs_nginx_cpu = proxy_us("nginx")
            .zip(proxy_us("gateway"))
            .map(|(n, g)| ratio(n, g));
        scenarios.push(Scenario {
            name: scenario.name().to_string(),
            gateway_vs_direct: ratio(gw, rps("direct").unwrap_or(0.0)),
            gateway_vs_nginx: rps("nginx").map(|n| ratio(gw, n)),
            targets: results,
            gateway_saturation,
            target_vs_nginx: scenario.target_vs_nginx(),
            cpu,
            gateway_vs_nginx_cpu,
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
        if let Err(e) = crate::cleanup::unlink_prefix_at(url, &redis_prefix).await {
            tracing::warn!(error = %e, prefix = %redis_prefix, "bench: removing the window records from Redis failed; they expire with the window");
        }
    }

    let passthrough_vs_nginx = scenarios
        .iter()
        .find(|s| s.name == ScenarioKind::PassThrough.name())
        .and_then(|s| s.gateway_vs_nginx);
    let target = ScenarioKind::PassThrough.target_vs_nginx();
    Ok(BenchReport {
        phase_ms: phase.as_millis() as u64,
        rounds: options.rounds.max(1),
        concurrency,
        window,
        nginx: nginx_info,
        scenarios,
        storm,
        target_passthrough_vs_nginx: target,
        passthrough_vs_nginx,
        meets_target: passthrough_vs_nginx.map(|r| r >= target),
    })
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        (a / b * 1000.0).round() / 1000.0
    } else {
        0.0
    }
}

#[derive(Debug, Clone, Copy)]
enum ScenarioKind {
    PassThrough,
    KeyedFresh,
    HotReplay,
}

impl ScenarioKind {
    fn name(self) -> &'static str {
        match self {
            ScenarioKind::PassThrough => "pass-through GET /ping (no key)",
            ScenarioKind::KeyedFresh => "keyed POST /v1/orders (fresh keys)",
            ScenarioKind::HotReplay => "keyed POST /v1/orders (hot keys: replays)",
        }
    }

    /// Short name, used in idempotency keys (which allow no spaces).
    fn slug(self) -> &'static str {
        match self {
            ScenarioKind::PassThrough => "pass",
            ScenarioKind::KeyedFresh => "keyed",
            ScenarioKind::HotReplay => "hot",
        }
    }

    /// The gateway's throughput against nginx's that the project aims for: a proxy that
    /// forwards must come close to nginx, one answering replays from its window must beat
    /// nginx forwarding the same requests.
    fn target_vs_nginx(self) -> f64 {
        match self {
            ScenarioKind::PassThrough => 0.95,
            ScenarioKind::KeyedFresh => 0.8,
            ScenarioKind::HotReplay => 1.5,
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
            ScenarioKind::KeyedFresh | ScenarioKind::HotReplay => Request::builder()
                .method(Method::POST)
                .uri("/v1/orders")
                .header(HOST, host)
                .header(CONTENT_TYPE, "application/json")
                .header(
                    "x-api-key",
                    match self {
                        ScenarioKind::HotReplay => HOT_API_KEY,
                        _ => BENCH_API_KEY,
                    },
                )
                .header("idempotency-key", key)
                .body(Full::new(Bytes::from_static(
                    br#"{"user":"U-7318","show":"S-204","seats":2}"#,
                )))
                .expect("request"),
        }
    }
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
