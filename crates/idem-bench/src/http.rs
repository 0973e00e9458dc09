//! `idem bench http`: requests per second through an axum app with the layer, against the
//! same app without it, in the same run, plus the store's own claim+complete rate.
//!
//! The layer's bounds: a request through it costs at least the app's request plus the
//! store's work, so fresh keys are compared with `1/(1/plain + 1/store claim+complete)`
//! and replays with `1/(1/plain + 1/store replay)`, both measured in the same run.
//!
//! Every phase drives a real server on 127.0.0.1:0 with concurrent reqwest clients (the
//! store phase calls the store directly) for a fixed time, so the whole run is bounded.
//! Figures are reported as ratios; absolute numbers depend on the host. The store is the
//! one `database_url` names (SQLite, PostgreSQL in a schema of its own, Redis under a key
//! prefix of its own, each removed afterwards) or a temporary SQLite file; the report
//! names the backend it measured. This module only
//! measures, through the layer's public API: it must not change the layer's configuration
//! beyond what a phase needs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use idem_core::{
    Claim, ClaimRequest, Fingerprint, IdempotencyKey, IdempotencyStore, OwnerId, Principal, Scope,
    StoreError, StoredResult, TenantId,
};
use idem_http::{BearerTokens, IdempotencyLayer, Identity};
use idem_sql::{redact, Backend, OpenOptions, Store};

use crate::saturation::{Meter, Saturation};
use serde::{Deserialize, Serialize};

/// What to run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchOptions {
    /// Length of each of the four phases.
    pub phase: Duration,
    /// Concurrent clients (store phase: concurrent tasks).
    pub concurrency: usize,
    /// The store to measure (`sqlite:…`, `postgres://…`, `redis://…`); a fresh
    /// temporary SQLite file when `None`.
    pub database_url: Option<String>,
    /// Distinct keys cycled through in the replay phase.
    pub replay_keys: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            phase: Duration::from_millis(1500),
            concurrency: 16,
            database_url: None,
            replay_keys: 256,
        }
    }
}

/// One phase's throughput.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PhaseRate {
    pub phase: String,
    pub ok: u64,
    pub errors: u64,
    pub per_second: f64,
}

/// The result of [`bench()`]; the ratios are what to compare across machines.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HttpBenchReport {
    /// The store measured: `sqlite`, `postgres` or `redis`.
    pub backend: String,
    /// Where (the URL without its password, or the temporary file).
    pub database: String,
    /// Redis-compatible servers: which one and its version (e.g. `valkey 8.1.8`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    pub concurrency: usize,
    pub phase_seconds: f64,
    pub phases: Vec<PhaseRate>,
    /// Layer with fresh keys ÷ the same app without the layer.
    pub fresh_vs_plain: f64,
    /// Layer answering replays ÷ the same app without the layer.
    pub replay_vs_plain: f64,
    /// Replays with the arrival timeline recording (the console's, SQL stores only) ÷
    /// replays without it, in alternating slices; the bar is 0.9.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_timeline_vs_replay: Option<f64>,
    /// Arrivals the timeline wrote and dropped (buffer full) during the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline_written: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline_dropped: Option<u64>,
    /// Layer with fresh keys ÷ the store's own claim+complete rate: how much of the
    /// store's rate the layer passes on. Informational; the bars are on the two `_bound`
    /// ratios below, which count the app's cost too.
    pub fresh_vs_store: f64,
    /// Both `_bound` ratios reach their bars.
    pub meets_target: bool,
    /// Layer with fresh keys ÷ `1/(1/plain + 1/store_claim_complete)`: what is left of
    /// the cost of the app and the store added together.
    pub fresh_vs_bound: f64,
    pub fresh_vs_bound_target: f64,
    /// Layer answering replays ÷ `1/(1/plain + 1/store_replay)`.
    pub replay_vs_bound: f64,
    pub replay_vs_bound_target: f64,
    /// What the layer's fresh-key phase was limited by.
    pub saturation: Saturation,
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("server: {0}")]
    Io(#[from] std::io::Error),
    #[error("client: {0}")]
    Client(#[from] reqwest::Error),
    #[error("{0}")]
    Setup(String),
}

pub(crate) const TOKEN: &str = "bench-token";
pub(crate) const BODY: &str = r#"{"user_id":"U-7318","show_id":"S-204","seats":2}"#;

pub(crate) async fn create_order(
    Json(body): Json<serde_json::Value>,
) -> (StatusCode, Json<serde_json::Value>) {
    let order = serde_json::json!({
        "order_id": uuid::Uuid::now_v7().to_string(),
        "status": "PENDING_PAYMENT",
        "request": body,
    });
    (StatusCode::CREATED, Json(order))
}

async fn serve(app: Router) -> Result<(String, tokio::task::JoinHandle<()>), BenchError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/v1/orders", listener.local_addr()?);
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((url, server))
}

/// Runs `op(task, seq)` from `concurrency` tasks for `phase`; counts Ok(true) as done,
/// Ok(false) as an error response.
pub(crate) async fn drive<F, Fut>(
    name: &str,
    concurrency: usize,
    phase: Duration,
    op: F,
) -> PhaseRate
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let op = Arc::new(op);
    let ok = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + phase;
    let tasks: Vec<_> = (0..concurrency)
        .map(|task| {
            let (op, ok, errors) = (op.clone(), ok.clone(), errors.clone());
            tokio::spawn(async move {
                let mut seq = 0;
                while Instant::now() < deadline {
                    let counter = if op(task, seq).await { &ok } else { &errors };
                    counter.fetch_add(1, Ordering::Relaxed);
                    seq += 1;
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = started.elapsed().as_secs_f64().max(1e-9);
    let ok = ok.load(Ordering::Relaxed);
    PhaseRate {
        phase: name.to_owned(),
        ok,
        errors: errors.load(Ordering::Relaxed),
        per_second: ok as f64 / elapsed,
    }
}

async fn post_order(client: &reqwest::Client, url: &str, key: Option<&str>) -> bool {
    let mut request = client
        .post(url)
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(BODY);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    match request.send().await {
        Ok(response) => {
            let success = response.status().is_success();
            success && response.bytes().await.is_ok()
        }
        Err(_) => false,
    }
}

/// Measures, in one run: the store's claim+complete rate, the app without the layer, the
/// app with the layer on fresh keys, and the app with the layer answering replays.
pub async fn bench(options: BenchOptions) -> Result<HttpBenchReport, BenchError> {
    let concurrency = options.concurrency.max(1);
    let phase = options.phase;
    let tempdir = tempfile::tempdir()?;
    let (url, database) = match &options.database_url {
        Some(url) if Backend::of_url(url)? == Backend::Mysql => {
            return Err(BenchError::Setup(
                "bench http cleans up after itself on sqlite://, postgres:// and redis:// only"
                    .into(),
            ))
        }
        Some(url) => (url.clone(), redact(url)),
        None => (
            format!("sqlite://{}", tempdir.path().join("bench.db").display()),
            "temporary SQLite file".to_owned(),
        ),
    };
    let run_id = uuid::Uuid::now_v7().simple().to_string();
    let open = {
        let mut o = OpenOptions::default();
        o.pg_schema = Some(format!("idem_bench_http_{run_id}"));
        o.pg_max_connections = Some(u32::try_from(concurrency + 4).unwrap_or(64));
        o.redis_prefix = Some(format!("idem-bench-http-{run_id}"));
        o
    };
    let opened = Store::open(&url, &open).await?;
    // The arrival timeline lives in the SQL store's own tables, next to the records.
    let timeline = opened
        .sql()
        .map(|sql| idem_sql::ArrivalLog::start(sql.clone(), idem_sql::ArrivalOptions::default()));
    let measured = measure(
        opened.records(),
        concurrency,
        phase,
        options.replay_keys,
        timeline.clone(),
    )
    .await;
    if let Some(log) = &timeline {
        log.close().await;
    }
    let cleaned = clean_up(&opened, &url, &open).await;
    let mut report = measured?;
    cleaned?;
    if let Some(log) = &timeline {
        report.timeline_written = Some(log.written());
        report.timeline_dropped = Some(log.dropped());
    }
    report.database = database;
    report.server = opened.redis().map(|r| r.server().to_string());
    Ok(report)
}

/// Removes what the run wrote outside a temporary file: its schema or its key prefix.
async fn clean_up(store: &Store, url: &str, open: &OpenOptions) -> Result<(), BenchError> {
    match store.backend() {
        Backend::Sqlite | Backend::Mysql => Ok(()),
        Backend::Postgres => {
            let pg = store.sql().and_then(idem_sql::SqlStore::postgres);
            if let (Some(pg), Some(schema)) = (pg, &open.pg_schema) {
                crate::cleanup::drop_schema(pg.pool(), schema)
                    .await
                    .map_err(|e| BenchError::Setup(format!("dropping the bench schema: {e}")))?;
            }
            Ok(())
        }
        Backend::Redis => {
            let Some(prefix) = &open.redis_prefix else {
                return Ok(());
            };
            crate::cleanup::unlink_prefix_at(url, prefix)
                .await
                .map(|_| ())
                .map_err(|e| BenchError::Setup(format!("removing the bench keys: {e}")))
        }
    }
}

async fn measure(
    store: Arc<dyn IdempotencyStore>,
    concurrency: usize,
    phase: Duration,
    replay_keys: usize,
    timeline: Option<idem_sql::ArrivalLog>,
) -> Result<HttpBenchReport, BenchError> {
    let tenant = TenantId::new("bench").map_err(|e| BenchError::Setup(e.to_string()))?;
    let principal = Principal::new("bench").map_err(|e| BenchError::Setup(e.to_string()))?;
    let auth = BearerTokens::new().with(TOKEN, Identity::new(tenant.clone(), principal.clone()));
    let run = uuid::Uuid::now_v7().simple().to_string();
    let mut phases = Vec::new();

    // 1. The store alone: claim + complete with fresh keys.
    {
        let store = store.clone();
        let (tenant, principal, run) = (tenant.clone(), principal.clone(), run.clone());
        let fingerprint = Fingerprint::of_bytes(BODY.as_bytes());
        let result = StoredResult {
            status: 201,
            headers: vec![("content-type".into(), "application/json".into())],
            body: BODY.as_bytes().to_vec(),
            result_ref: None,
        };
        phases.push(
            drive(
                "store_claim_complete",
                concurrency,
                phase,
                move |task, seq| {
                    let store = store.clone();
                    let request = ClaimRequest {
                        scope: Scope::new(
                            tenant.clone(),
                            IdempotencyKey::new(format!("store-{run}-{task}-{seq}"))
                                .expect("bench keys are valid"),
                        ),
                        principal: principal.clone(),
                        fingerprint,
                        owner: OwnerId::new(format!("bench-{task}")).expect("valid owner"),
                        lease: Duration::from_secs(30),
                    };
                    let result = result.clone();
                    async move {
                        match store.claim(&request).await {
                            Ok(Claim::Proceed(token)) => {
                                store.complete(&token, result).await.is_ok()
                            }
                            _ => false,
                        }
                    }
                },
            )
            .await,
        );
    }

    // 1b. The store alone: replays (claims of keys that finished), as the layer's replay
    // phase cycles through its keys.
    {
        let keys = replay_keys.max(1);
        let fingerprint = Fingerprint::of_bytes(BODY.as_bytes());
        let request = |i: usize| ClaimRequest {
            scope: Scope::new(
                tenant.clone(),
                IdempotencyKey::new(format!("store-replay-{run}-{i}"))
                    .expect("bench keys are valid"),
            ),
            principal: principal.clone(),
            fingerprint,
            owner: OwnerId::new("bench").expect("valid owner"),
            lease: Duration::from_secs(30),
        };
        let requests: Arc<Vec<ClaimRequest>> = Arc::new((0..keys).map(request).collect());
        let result = StoredResult {
            status: 201,
            headers: vec![("content-type".into(), "application/json".into())],
            body: BODY.as_bytes().to_vec(),
            result_ref: None,
        };
        for r in requests.iter() {
            match store.claim(r).await? {
                Claim::Proceed(token) => store.complete(&token, result.clone()).await?,
                other => {
                    return Err(BenchError::Setup(format!(
                        "seeding a store replay key answered {}",
                        other.decision()
                    )))
                }
            };
        }
        let store = store.clone();
        phases.push(
            drive("store_replay", concurrency, phase, move |task, seq| {
                let (store, requests) = (store.clone(), requests.clone());
                async move {
                    let r = &requests[(task + seq as usize * concurrency) % requests.len()];
                    matches!(store.claim(r).await, Ok(Claim::Replay(_)))
                }
            })
            .await,
        );
    }

    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .build()?;

    // 2. The same app without the layer.
    let (plain_url, plain_server) =
        serve(Router::new().route("/v1/orders", post(create_order))).await?;
    {
        let (client, url) = (client.clone(), plain_url.clone());
        phases.push(
            drive("plain", concurrency, phase, move |_, _| {
                let (client, url) = (client.clone(), url.clone());
                async move { post_order(&client, &url, None).await }
            })
            .await,
        );
    }
    plain_server.abort();

    // 3. With the layer, fresh keys.
    let auth = Arc::new(auth);
    let layered = Router::new()
        .route("/v1/orders", post(create_order))
        .layer(IdempotencyLayer::from_arcs(store.clone(), auth.clone()));
    let (url, server) = serve(layered).await?;
    let meter = Meter::start();
    {
        let (client, url, run) = (client.clone(), url.clone(), run.clone());
        phases.push(
            drive("layer_fresh_keys", concurrency, phase, move |task, seq| {
                let (client, url) = (client.clone(), url.clone());
                let key = format!("fresh-{run}-{task}-{seq}");
                async move { post_order(&client, &url, Some(&key)).await }
            })
            .await,
        );
    }

    let saturation = meter.stop(store_limit(store.backend()));

    // 4. With the layer, replay hits.
    let keys: Arc<Vec<String>> = Arc::new(
        (0..replay_keys.max(1))
            .map(|i| format!("replay-{run}-{i}"))
            .collect(),
    );
    for key in keys.iter() {
        if !post_order(&client, &url, Some(key)).await {
            return Err(BenchError::Setup("seeding a replay key failed".into()));
        }
    }
    // With the timeline: the same replays through a layer that hands every arrival to
    // the console's log, in alternating slices against the layer without it.
    let timeline_server = match &timeline {
        Some(log) => {
            let app = Router::new().route("/v1/orders", post(create_order)).layer(
                IdempotencyLayer::from_arcs(store.clone(), auth.clone())
                    .with_arrivals(Arc::new(log.clone())),
            );
            Some(serve(app).await?)
        }
        None => None,
    };
    let slices = if timeline_server.is_some() { 4 } else { 1 };
    let slice = phase / slices;
    let mut replay_slices = Vec::new();
    let mut timeline_slices = Vec::new();
    for i in 0..slices {
        let mut targets: Vec<(String, bool)> = std::iter::once((url.clone(), false))
            .chain(timeline_server.iter().map(|(u, _)| (u.clone(), true)))
            .collect();
        // Each side goes first as often as the other.
        if i % 2 == 1 {
            targets.reverse();
        }
        for (target, with_timeline) in targets {
            let (client, keys) = (client.clone(), keys.clone());
            let name = if with_timeline {
                "layer_replay_hits_timeline"
            } else {
                "layer_replay_hits"
            };
            let rate = drive(name, concurrency, slice, move |task, seq| {
                let (client, url) = (client.clone(), target.clone());
                let key = keys[(task + seq as usize * concurrency) % keys.len()].clone();
                async move { post_order(&client, &url, Some(&key)).await }
            })
            .await;
            if with_timeline {
                timeline_slices.push(rate);
            } else {
                replay_slices.push(rate);
            }
        }
    }
    phases.push(merged("layer_replay_hits", &replay_slices));
    if let Some((_, timeline_task)) = timeline_server {
        timeline_task.abort();
        phases.push(merged("layer_replay_hits_timeline", &timeline_slices));
    }
    server.abort();

    let rate = |name: &str| {
        phases
            .iter()
            .find(|p| p.phase == name)
            .map_or(0.0, |p| p.per_second)
    };
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let fresh = rate("layer_fresh_keys");
    let fresh_vs_store = ratio(fresh, rate("store_claim_complete"));
    const FRESH_TARGET: f64 = 0.7;
    const REPLAY_TARGET: f64 = 0.8;
    // Requests per second when each request costs the app's and the store's time.
    let bound = |store: f64| {
        let plain = rate("plain");
        if plain > 0.0 && store > 0.0 {
            1.0 / (1.0 / plain + 1.0 / store)
        } else {
            0.0
        }
    };
    let fresh_vs_bound = ratio(fresh, bound(rate("store_claim_complete")));
    let replay_vs_bound = ratio(rate("layer_replay_hits"), bound(rate("store_replay")));
    Ok(HttpBenchReport {
        backend: store.backend().to_owned(),
        database: String::new(),
        server: None,
        concurrency,
        phase_seconds: phase.as_secs_f64(),
        fresh_vs_plain: ratio(fresh, rate("plain")),
        replay_vs_plain: ratio(rate("layer_replay_hits"), rate("plain")),
        replay_timeline_vs_replay: timeline.as_ref().map(|_| {
            ratio(
                rate("layer_replay_hits_timeline"),
                rate("layer_replay_hits"),
            )
        }),
        timeline_written: None,
        timeline_dropped: None,
        fresh_vs_store,
        meets_target: fresh_vs_bound >= FRESH_TARGET && replay_vs_bound >= REPLAY_TARGET,
        fresh_vs_bound,
        fresh_vs_bound_target: FRESH_TARGET,
        replay_vs_bound,
        replay_vs_bound_target: REPLAY_TARGET,
        phases,
        saturation,
    })
}

/// Slices of one phase as one rate.
fn merged(name: &str, slices: &[PhaseRate]) -> PhaseRate {
    let ok: u64 = slices.iter().map(|s| s.ok).sum();
    // The mean of the slices' rates: every slice lasts as long.
    let per_second = slices.iter().map(|s| s.per_second).sum::<f64>() / slices.len().max(1) as f64;
    PhaseRate {
        phase: name.to_owned(),
        ok,
        errors: slices.iter().map(|s| s.errors).sum(),
        per_second,
    }
}

/// What bounds a store when neither the CPU nor the disk does.
pub fn store_limit(backend: &str) -> &'static str {
    match backend {
        "sqlite" => "commits: SQLite's single writer",
        "postgres" => "commits and round trips to PostgreSQL",
        "redis" => "round trips to Redis",
        _ => "the store",
    }
}
