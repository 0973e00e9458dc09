//! `idem bench store`: claim+complete and replay throughput of an idem store against a
//! raw-driver baseline doing the naive equivalent on the same server, in the same run.
//!
//! Phases alternate (baseline, idem, baseline, idem) so drift in the machine's load hits
//! both sides alike. Figures are printed as ratios; absolute numbers depend on the host.
//! On PostgreSQL it also measures claim latency as the table grows (`PgGrowth`). The
//! baselines themselves are `baseline`'s; this module must not name a backend's driver
//! but for that growth measurement.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::{
    Claim, ClaimRequest, Fingerprint, IdempotencyKey, IdempotencyStore, OwnerId, Principal, Scope,
    StoreError, StoredResult, TenantId,
};
use idem_sql::{Backend, OpenOptions, SqlStore, Store};
use idem_sqlite::SqliteOptions;
use serde::Serialize;

use super::baseline::{
    raw, Baseline, MysqlBaseline, MysqlBenchDb, PgBaseline, RedisBaseline, SqliteBaseline, PG_NOW,
};
use super::load::{collect, drive, phase, Load, Phase};
use crate::open::bench_url;

#[derive(Debug, Serialize)]
pub struct BenchReport {
    pub backend: String,
    /// Redis-compatible servers: which one and its version (e.g. `valkey 8.1.8`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    pub concurrency: usize,
    pub duration_s: f64,
    pub phases: Vec<Phase>,
    /// PostgreSQL only (and not with `--no-growth`): claim latency as the table grows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub growth: Option<Growth>,
    /// What the throughput phases (both sides) were limited by.
    pub saturation: idem_bench::saturation::Saturation,
}

/// Claim p50 on fresh keys with few and with many stored keys (PostgreSQL). Target:
/// `ratio` (p50 at the large size / p50 at the small size) at most 1.5.
#[derive(Debug, Serialize)]
pub struct Growth {
    /// Fresh-key claims timed at each size (after a short warm-up).
    pub claims: usize,
    pub concurrency: usize,
    /// Stored keys when the first measurement started.
    pub small_keys: i64,
    /// Stored keys when the second measurement started (after the bulk load).
    pub large_keys: i64,
    pub small_p50_us: u64,
    pub small_p99_us: u64,
    pub large_p50_us: u64,
    pub large_p99_us: u64,
    pub ratio: f64,
    /// Wall time from the start of the bulk load to the end of the second measurement.
    pub load_s: f64,
}

/// What `idem bench store` runs against.
pub struct BenchTargets {
    pub store: Arc<dyn IdempotencyStore>,
    pub baseline: Arc<dyn Baseline>,
    /// PostgreSQL only: the growth measurement on the store's own table.
    pub growth: Option<PgGrowth>,
    /// Redis-compatible servers: which one and its version.
    pub server: Option<String>,
    /// The embedded store's temporary directory, kept until this drops.
    pub _tmp: Option<tempfile::TempDir>,
}

/// Opens the store and its raw-driver baseline for `idem bench store`. The store is
/// opened in a schema (PostgreSQL) or under a key prefix (Redis) of its own; without an
/// explicit URL the embedded store runs in a temporary directory, kept until the
/// returned targets drop.
pub async fn open_bench(url: &str) -> Result<BenchTargets, StoreError> {
    let run = uuid::Uuid::now_v7().simple();
    let schema = format!("idem_bench_{run}");
    let prefix = format!("idem-bench-{run}");
    // MySQL: a database of the bench's own, where both sides' tables go.
    let mysql = match Backend::of_url(url)? {
        Backend::Mysql => Some(MysqlBenchDb::create(url, &schema).await?),
        _ => None,
    };
    let url = mysql.as_ref().map_or(url, |db| db.url.as_str());
    // Both sides get a pool of 32 with the same settings (see `PgBaseline::new`).
    let options = {
        let mut o = OpenOptions::default();
        o.pg_schema = Some(schema.clone());
        o.pg_max_connections = Some(32);
        o.redis_prefix = Some(prefix.clone());
        o.mysql_max_connections = Some(32);
        o
    };
    let (url, tmp) = bench_url(url, "bench.db")?;
    let store = Store::open(&url, &options).await?;
    // The baseline is each backend's own driver doing the same work: one per backend.
    let baseline: Arc<dyn Baseline> = match store.backend() {
        Backend::Sqlite => Arc::new(SqliteBaseline::new(&SqliteOptions::from_url(&url)?).await?),
        Backend::Postgres => Arc::new(PgBaseline::new(&url, &schema).await?),
        Backend::Redis => Arc::new(RedisBaseline::new(&url, &prefix).await?),
        Backend::Mysql => Arc::new(MysqlBaseline::new(mysql.expect("made above")).await?),
    };
    let growth = store
        .sql()
        .and_then(SqlStore::postgres)
        .map(|pg| PgGrowth::new(pg.clone()));
    Ok(BenchTargets {
        server: store.redis().map(|r| r.server().to_string()),
        store: store.records(),
        baseline,
        growth,
        _tmp: tmp,
    })
}

/// Alternating slices per phase and side.
const ROUNDS: u32 = 8;

fn claim_request(tenant: &TenantId, key: &str, owner: usize) -> ClaimRequest {
    ClaimRequest {
        scope: Scope::new(tenant.clone(), IdempotencyKey::new(key).expect("bench key")),
        principal: Principal::new("bench").expect("static"),
        fingerprint: Fingerprint::of_bytes(b"bench-payload"),
        owner: OwnerId::new(format!("bench-{owner}")).expect("owner"),
        lease: Duration::from_secs(30),
    }
}

fn bench_result() -> StoredResult {
    StoredResult {
        status: 201,
        headers: vec![("content-type".into(), "application/json".into())],
        body: br#"{"order_id":"ord_0192f0c0bench","status":"pending_payment"}"#.to_vec(),
        result_ref: Some("ord_0192f0c0bench".into()),
    }
}

pub async fn run(
    store: Arc<dyn IdempotencyStore>,
    baseline: Arc<dyn Baseline>,
    growth: Option<&PgGrowth>,
    tenant: &TenantId,
    concurrency: usize,
    duration: Duration,
) -> Result<BenchReport, StoreError> {
    if concurrency == 0 || duration.is_zero() {
        return Err(StoreError::InvalidInput(
            "--concurrency and --duration must be positive".into(),
        ));
    }
    // Many short alternating slices: load from elsewhere on the host lands on both sides.
    let half = duration / ROUNDS;
    let run_id = uuid::Uuid::now_v7().simple().to_string();

    // claim+complete on fresh keys
    let meter = idem_bench::saturation::Meter::start();
    let mut idem = Load::default();
    let mut base = Load::default();
    for round in 0..ROUNDS {
        let b = baseline.clone();
        let t = tenant.to_string();
        let prefix = format!("{run_id}-b{round}");
        base.merge(
            drive(concurrency, half, move |task, seq| {
                let b = b.clone();
                let t = t.clone();
                let key = format!("{prefix}-{task}-{seq}");
                async move { b.claim_complete(&t, &key, &bench_result().body).await }
            })
            .await?,
        );
        let s = store.clone();
        let t = tenant.clone();
        let prefix = format!("{run_id}-i{round}");
        idem.merge(
            drive(concurrency, half, move |task, seq| {
                let s = s.clone();
                let req = claim_request(&t, &format!("{prefix}-{task}-{seq}"), task);
                async move {
                    match s.claim(&req).await? {
                        Claim::Proceed(token) => {
                            s.complete(&token, bench_result()).await.map(|_| ())
                        }
                        other => Err(StoreError::Backend(format!(
                            "fresh key was not executed: {}",
                            other.decision()
                        ))),
                    }
                }
            })
            .await?,
        );
    }
    let claim_phase = phase("claim_complete", baseline.describe(), idem, base);

    // replay of one hot key
    let hot = format!("{run_id}-hot");
    let req = claim_request(tenant, &hot, 0);
    if let Claim::Proceed(token) = store.claim(&req).await? {
        store.complete(&token, bench_result()).await?;
    }
    baseline
        .claim_complete(tenant.as_str(), &hot, &bench_result().body)
        .await?;
    let mut idem = Load::default();
    let mut base = Load::default();
    for _ in 0..ROUNDS {
        let b = baseline.clone();
        let t = tenant.to_string();
        let k = hot.clone();
        base.merge(
            drive(concurrency, half, move |_, _| {
                let b = b.clone();
                let t = t.clone();
                let k = k.clone();
                async move { b.replay(&t, &k).await }
            })
            .await?,
        );
        let s = store.clone();
        let req = req.clone();
        idem.merge(
            drive(concurrency, half, move |_, _| {
                let s = s.clone();
                let req = req.clone();
                async move {
                    match s.claim(&req).await? {
                        Claim::Replay(_) => Ok(()),
                        other => Err(StoreError::Backend(format!(
                            "hot key was not replayed: {}",
                            other.decision()
                        ))),
                    }
                }
            })
            .await?,
        );
    }
    let replay_phase = phase("replay", baseline.describe_replay(), idem, base);
    let saturation = meter.stop(idem_bench::http::store_limit(store.backend()));

    // After the throughput phases: it empties the store's table first.
    let growth = match growth {
        Some(g) => Some(g.run().await?),
        None => None,
    };

    Ok(BenchReport {
        backend: store.backend().to_string(),
        server: None,
        concurrency,
        duration_s: duration.as_secs_f64(),
        phases: vec![claim_phase, replay_phase],
        growth,
        saturation,
    })
}

pub fn print_human(r: &BenchReport) {
    println!(
        "idem bench store on {}{} ({} tasks, {:.0} s per phase)",
        r.backend,
        r.server
            .as_ref()
            .map(|s| format!(" ({s})"))
            .unwrap_or_default(),
        r.concurrency,
        r.duration_s
    );
    for p in &r.phases {
        println!(
            "  {:<15} idem {:>9.0} ops/s (p50 {} us, p99 {} us)  baseline {:>9.0} ops/s (p50 {} us, p99 {} us)  ratio {:.2}",
            p.phase, p.idem_ops_per_s, p.idem_p50_us, p.idem_p99_us, p.baseline_ops_per_s,
            p.baseline_p50_us, p.baseline_p99_us, p.ratio
        );
        println!("  {:<15} baseline: {}", "", p.baseline);
    }
    println!("  {:<15} {}", "saturated", r.saturation.saturated);
    if let Some(g) = &r.growth {
        println!(
            "  {:<15} claim p50 {} us (p99 {} us) with {} stored keys, {} us (p99 {} us) with {}  ratio {:.2} (target <= 1.50)",
            "growth", g.small_p50_us, g.small_p99_us, g.small_keys, g.large_p50_us,
            g.large_p99_us, g.large_keys, g.ratio
        );
        println!(
            "  {:<15} {} fresh-key claims per size at concurrency {}; bulk load, ANALYZE and claims {:.1} s",
            "", g.claims, g.concurrency, g.load_s
        );
    }
}

/// Stored keys for the first growth measurement.
const GROWTH_SMALL: i64 = 1_000;
/// Stored keys for the second growth measurement.
const GROWTH_LARGE: i64 = 1_000_000;
/// Timed fresh-key claims per size, and how many tasks issue them.
const GROWTH_CLAIMS: usize = 2_000;
const GROWTH_CONCURRENCY: usize = 8;
/// Untimed claims first at each size (connections, statement caches, buffers).
const GROWTH_WARMUP: usize = 200;
/// Tenants the bulk-loaded keys and the timed claims spread over, so claims land all
/// over the unique index rather than at one edge of it.
const GROWTH_TENANTS: usize = 100;

/// The PostgreSQL growth measurement: claim p50 on fresh keys with 1 thousand stored
/// keys, then again after a bulk load to 1 million (`INSERT … SELECT … FROM
/// generate_series`, then `ANALYZE`). Runs in the bench's own schema, whose table it
/// empties first; the bench's cleanup drops the schema.
pub struct PgGrowth {
    store: idem_postgres::PgStore,
}

impl PgGrowth {
    pub fn new(store: idem_postgres::PgStore) -> Self {
        Self { store }
    }

    async fn sql(&self, sql: String) -> Result<(), StoreError> {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(self.store.pool())
            .await
            .map_err(raw)?;
        Ok(())
    }

    async fn count(&self) -> Result<i64, StoreError> {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {}",
            self.store.table()
        )))
        .fetch_one(self.store.pool())
        .await
        .map_err(raw)
    }

    /// Finished records `from..=to`, shaped like the bench's own (a result of ~60 bytes),
    /// with random-looking keys spread over the growth tenants.
    async fn load(&self, from: i64, to: i64) -> Result<(), StoreError> {
        let t = self.store.table();
        self.sql(format!(
            "INSERT INTO {t} (tenant_id, key, principal, fingerprint, state, version, owner, \
             lease_expires_at, result_status, result_headers, result_body, result_ref, attempts, \
             created_at, updated_at, completed_at) \
             SELECT 'growth-' || (g % {GROWTH_TENANTS}), md5(g::text), 'bench', \
             sha256(g::text::bytea), 'SUCCEEDED', 2, 'bench-bulk', NULL, 201, \
             '[[\"content-type\",\"application/json\"]]'::jsonb, \
             convert_to('{{\"order_id\":\"ord_' || md5(g::text) || '\"}}', 'UTF8'), \
             'ord_' || g, 1, c.now_ms - g, c.now_ms - g, c.now_ms - g \
             FROM generate_series({from}, {to}) g, \
             (SELECT {PG_NOW} AS now_ms) c; \
             ANALYZE {t};"
        ))
        .await
    }

    /// `n` fresh-key claims from `GROWTH_CONCURRENCY` tasks; their latencies.
    async fn claims(&self, n: usize) -> Result<Load, StoreError> {
        let store = Arc::new(self.store.clone());
        let per_task = n.div_ceil(GROWTH_CONCURRENCY);
        let started = Instant::now();
        let mut tasks = Vec::new();
        for task in 0..GROWTH_CONCURRENCY {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::with_capacity(per_task);
                for i in 0..per_task {
                    let tenant = TenantId::new(format!("growth-{}", (task + i) % GROWTH_TENANTS))
                        .expect("tenant");
                    let key = uuid::Uuid::new_v4().simple().to_string();
                    let req = claim_request(&tenant, &key, task);
                    let t0 = Instant::now();
                    match store.claim(&req).await? {
                        Claim::Proceed(_) => {}
                        other => {
                            return Err(StoreError::Backend(format!(
                                "fresh key was not executed: {}",
                                other.decision()
                            )))
                        }
                    }
                    lat.push(t0.elapsed().as_micros() as u64);
                }
                Ok::<_, StoreError>(lat)
            }));
        }
        collect(tasks, started).await
    }

    /// Bulk-loads so that `target` keys are stored once the warm-up claims are in, then
    /// warms up and times the claims: (stored keys when the timed claims started,
    /// latencies). `next_id` numbers the bulk rows across calls.
    async fn measure(&self, target: i64, next_id: &mut i64) -> Result<(i64, Load), StoreError> {
        let missing = target - GROWTH_WARMUP as i64 - self.count().await?;
        if missing > 0 {
            self.load(*next_id, *next_id + missing - 1).await?;
            *next_id += missing;
        }
        self.claims(GROWTH_WARMUP).await?;
        let keys = self.count().await?;
        Ok((keys, self.claims(GROWTH_CLAIMS).await?))
    }

    pub async fn run(&self) -> Result<Growth, StoreError> {
        eprintln!("growth: {GROWTH_SMALL} stored keys, {GROWTH_CLAIMS} claims");
        self.sql(format!("TRUNCATE {}", self.store.table())).await?;
        let mut next_id = 1;
        let (small_keys, mut small) = self.measure(GROWTH_SMALL, &mut next_id).await?;
        eprintln!("growth: loading to {GROWTH_LARGE} stored keys, then {GROWTH_CLAIMS} claims");
        let t0 = Instant::now();
        let (large_keys, mut large) = self.measure(GROWTH_LARGE, &mut next_id).await?;
        // The bulk load dominates; the warm-up and the timed claims take a second or two.
        let load_s = t0.elapsed().as_secs_f64();
        let (small_p50, large_p50) = (small.percentile(0.50), large.percentile(0.50));
        Ok(Growth {
            claims: GROWTH_CLAIMS,
            concurrency: GROWTH_CONCURRENCY,
            small_keys,
            large_keys,
            small_p50_us: small_p50,
            small_p99_us: small.percentile(0.99),
            large_p50_us: large_p50,
            large_p99_us: large.percentile(0.99),
            ratio: if small_p50 > 0 {
                (large_p50 as f64 / small_p50 as f64 * 100.0).round() / 100.0
            } else {
                0.0
            },
            load_s: (load_s * 10.0).round() / 10.0,
        })
    }
}
