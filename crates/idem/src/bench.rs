//! `idem bench store`: claim+complete and replay throughput of an idem store against a
//! raw-driver baseline doing the naive equivalent on the same server, in the same run.
//!
//! Phases alternate (baseline, idem, baseline, idem) so drift in the machine's load hits
//! both sides alike. Figures are printed as ratios; absolute numbers depend on the host.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use idem_core::{
    Claim, ClaimRequest, Fingerprint, IdempotencyKey, IdempotencyStore, OwnerId, Principal, Scope,
    StoreError, StoredResult, TenantId,
};
use serde::Serialize;

/// The raw driver doing the naive version of the same work.
#[async_trait]
pub trait Baseline: Send + Sync {
    fn describe(&self) -> &'static str;
    /// What the replay baseline runs.
    fn describe_replay(&self) -> &'static str;
    /// Naive claim+complete: insert if absent, then update to the final result.
    async fn claim_complete(&self, tenant: &str, key: &str, body: &[u8]) -> Result<(), StoreError>;
    /// Plain read of one record.
    async fn replay(&self, tenant: &str, key: &str) -> Result<(), StoreError>;
    /// Removes what the bench wrote (its schema or key prefix), idem's records included.
    async fn cleanup(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

#[derive(Debug, Serialize)]
pub struct Phase {
    pub phase: &'static str,
    pub idem_ops_per_s: f64,
    pub baseline_ops_per_s: f64,
    pub ratio: f64,
    pub idem_p50_us: u64,
    pub idem_p99_us: u64,
    pub baseline_p50_us: u64,
    pub baseline_p99_us: u64,
    pub baseline: &'static str,
}

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

#[derive(Default)]
pub(crate) struct Load {
    ops: u64,
    elapsed: Duration,
    latencies_us: Vec<u64>,
}

impl Load {
    pub(crate) fn merge(&mut self, other: Load) {
        self.ops += other.ops;
        self.elapsed += other.elapsed;
        self.latencies_us.extend(other.latencies_us);
    }

    fn rate(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn percentile(&mut self, p: f64) -> u64 {
        if self.latencies_us.is_empty() {
            return 0;
        }
        self.latencies_us.sort_unstable();
        let idx = ((self.latencies_us.len() as f64 - 1.0) * p).round() as usize;
        self.latencies_us[idx]
    }
}

/// Runs `op(task, seq)` from `concurrency` tasks until `duration` passes.
/// Alternating slices per phase and side.
const ROUNDS: u32 = 8;

pub(crate) async fn drive<F, Fut>(
    concurrency: usize,
    duration: Duration,
    op: F,
) -> Result<Load, StoreError>
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), StoreError>> + Send,
{
    let op = Arc::new(op);
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = Vec::new();
    for task in 0..concurrency {
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut seq = 0u64;
            while Instant::now() < deadline {
                let t0 = Instant::now();
                op(task, seq).await?;
                lat.push(t0.elapsed().as_micros() as u64);
                seq += 1;
            }
            Ok::<_, StoreError>(lat)
        }));
    }
    let mut load = Load::default();
    for t in tasks {
        let lat = t
            .await
            .map_err(|e| StoreError::Backend(format!("bench task: {e}")))??;
        load.ops += lat.len() as u64;
        load.latencies_us.extend(lat);
    }
    load.elapsed = started.elapsed();
    Ok(load)
}

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

pub(crate) fn phase(
    name: &'static str,
    baseline: &'static str,
    mut idem: Load,
    mut base: Load,
) -> Phase {
    let (i, b) = (idem.rate(), base.rate());
    Phase {
        phase: name,
        idem_ops_per_s: i.round(),
        baseline_ops_per_s: b.round(),
        ratio: if b > 0.0 {
            (i / b * 100.0).round() / 100.0
        } else {
            0.0
        },
        idem_p50_us: idem.percentile(0.50),
        idem_p99_us: idem.percentile(0.99),
        baseline_p50_us: base.percentile(0.50),
        baseline_p99_us: base.percentile(0.99),
        baseline,
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
        let mut load = Load::default();
        for t in tasks {
            let lat = t
                .await
                .map_err(|e| StoreError::Backend(format!("bench task: {e}")))??;
            load.ops += lat.len() as u64;
            load.latencies_us.extend(lat);
        }
        load.elapsed = started.elapsed();
        Ok(load)
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

/// SQLite baseline: raw sqlx on a table of the same shape, same pool settings.
pub struct SqliteBaseline {
    pool: sqlx::SqlitePool,
}

impl SqliteBaseline {
    /// Creates the naive table on its own connection first, then opens a pool with the
    /// store's settings; pooled connections opened before DDL would see a stale schema.
    pub async fn new(opts: &idem_sqlite::SqliteOptions) -> Result<Self, StoreError> {
        let pool = sqlite_pool_after_ddl(
            opts,
            "CREATE TABLE IF NOT EXISTS idem_bench_naive (tenant_id TEXT NOT NULL, key TEXT NOT NULL, \
             principal TEXT NOT NULL, fingerprint BLOB NOT NULL, state TEXT NOT NULL, version INTEGER NOT NULL, \
             owner TEXT, lease_expires_at INTEGER, result_status INTEGER, result_headers TEXT, \
             result_body BLOB, result_ref TEXT, attempts INTEGER NOT NULL, created_at INTEGER NOT NULL, \
             updated_at INTEGER NOT NULL, completed_at INTEGER); \
             CREATE UNIQUE INDEX IF NOT EXISTS idem_bench_naive_uq ON idem_bench_naive (tenant_id, key);",
        )
        .await?;
        Ok(Self { pool })
    }
}

/// Runs `ddl` on a connection of its own, then opens a pool with the store's settings:
/// pooled connections opened before the DDL would see a stale schema.
pub(crate) async fn sqlite_pool_after_ddl(
    opts: &idem_sqlite::SqliteOptions,
    ddl: &'static str,
) -> Result<sqlx::SqlitePool, StoreError> {
    use sqlx::{ConnectOptions, Connection};
    let mut conn = opts.connect_options().connect().await.map_err(raw)?;
    sqlx::raw_sql(ddl).execute(&mut conn).await.map_err(raw)?;
    conn.close().await.map_err(raw)?;
    sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(opts.max_connections)
        .connect_with(opts.connect_options())
        .await
        .map_err(raw)
}

/// A reconnecting Redis connection, with setup bounded so a dead server fails fast.
pub(crate) async fn redis_connection(
    url: &str,
) -> Result<redis::aio::ConnectionManager, StoreError> {
    let client = redis::Client::open(url).map_err(|e| StoreError::InvalidInput(e.to_string()))?;
    tokio::time::timeout(Duration::from_secs(5), client.get_connection_manager())
        .await
        .map_err(|_| StoreError::Unavailable("redis connect timed out".into()))?
        .map_err(|e| StoreError::Unavailable(e.to_string()))
}

const SQLITE_NOW: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// Drops a bench's own PostgreSQL schema and everything in it.
pub(crate) async fn drop_bench_schema(pool: &sqlx::PgPool, schema: &str) -> Result<(), StoreError> {
    idem_bench::cleanup::drop_schema(pool, schema)
        .await
        .map_err(|e| StoreError::Backend(format!("drop bench schema {schema}: {e}")))
}

fn raw(e: sqlx::Error) -> StoreError {
    StoreError::Backend(e.to_string())
}

#[async_trait]
impl Baseline for SqliteBaseline {
    fn describe(&self) -> &'static str {
        "sqlx: INSERT ... ON CONFLICT DO NOTHING, then UPDATE (same table shape, same pool)"
    }

    fn describe_replay(&self) -> &'static str {
        "sqlx: SELECT * by (tenant_id, key) (same table shape, same pool)"
    }

    async fn claim_complete(&self, tenant: &str, key: &str, body: &[u8]) -> Result<(), StoreError> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO idem_bench_naive (tenant_id, key, principal, fingerprint, state, version, owner, \
             lease_expires_at, attempts, created_at, updated_at) VALUES (?, ?, 'bench', ?, 'PROCESSING', 1, \
             'bench', {SQLITE_NOW} + 30000, 1, {SQLITE_NOW}, {SQLITE_NOW}) ON CONFLICT (tenant_id, key) DO NOTHING"
        )))
        .bind(tenant)
        .bind(key)
        .bind(&Fingerprint::of_bytes(b"bench-payload").as_bytes()[..])
        .execute(&self.pool)
        .await
        .map_err(raw)?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE idem_bench_naive SET state = 'SUCCEEDED', version = version + 1, lease_expires_at = NULL, \
             result_status = 201, result_headers = '[[\"content-type\",\"application/json\"]]', result_body = ?, \
             result_ref = 'ord_0192f0c0bench', updated_at = {SQLITE_NOW}, completed_at = {SQLITE_NOW} \
             WHERE tenant_id = ? AND key = ?"
        )))
        .bind(body)
        .bind(tenant)
        .bind(key)
        .execute(&self.pool)
        .await
        .map_err(raw)?;
        Ok(())
    }

    async fn replay(&self, tenant: &str, key: &str) -> Result<(), StoreError> {
        sqlx::query("SELECT * FROM idem_bench_naive WHERE tenant_id = ? AND key = ?")
            .bind(tenant)
            .bind(key)
            .fetch_one(&self.pool)
            .await
            .map_err(raw)?;
        Ok(())
    }
}

/// PostgreSQL baseline: the naive two statements on a table of the same shape (LIKE
/// idem_records, indexes included) in the bench's own schema, with its own pool of the
/// same size. `cleanup` drops the schema.
pub struct PgBaseline {
    pool: sqlx::PgPool,
    schema: String,
}

/// The pool of a PostgreSQL baseline: what the store's own pool does per checkout (no
/// ping, which would add a round trip to every statement of the baseline alone).
pub(crate) fn pg_bench_pool() -> sqlx::postgres::PgPoolOptions {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(32)
        .acquire_timeout(Duration::from_secs(5))
        .test_before_acquire(false)
}

const PG_NOW: &str = "((extract(epoch from clock_timestamp()) * 1000)::bigint)";

impl PgBaseline {
    pub async fn new(url: &str, schema: &str) -> Result<Self, StoreError> {
        // The same pool settings as the store under test (`open_bench`): 32 connections,
        // no ping when taken from the pool.
        let pool = pg_bench_pool()
            .connect(url)
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE TABLE IF NOT EXISTS {schema}.idem_bench_naive (LIKE {schema}.idem_records INCLUDING ALL)"
        )))
        .execute(&pool)
        .await
        .map_err(raw)?;
        Ok(Self {
            pool,
            schema: schema.to_string(),
        })
    }
}

#[async_trait]
impl Baseline for PgBaseline {
    fn describe(&self) -> &'static str {
        "sqlx: INSERT ... ON CONFLICT DO NOTHING, then UPDATE (same table shape, pool of 32)"
    }

    fn describe_replay(&self) -> &'static str {
        "sqlx: SELECT * by (tenant_id, key) (same table shape, pool of 32)"
    }

    async fn claim_complete(&self, tenant: &str, key: &str, body: &[u8]) -> Result<(), StoreError> {
        let s = &self.schema;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {s}.idem_bench_naive (tenant_id, key, principal, fingerprint, state, version, owner, \
             lease_expires_at, attempts, created_at, updated_at) VALUES ($1, $2, 'bench', $3, 'PROCESSING', 1, \
             'bench', {PG_NOW} + 30000, 1, {PG_NOW}, {PG_NOW}) ON CONFLICT (tenant_id, key) DO NOTHING"
        )))
        .bind(tenant)
        .bind(key)
        .bind(&Fingerprint::of_bytes(b"bench-payload").as_bytes()[..])
        .execute(&self.pool)
        .await
        .map_err(raw)?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {s}.idem_bench_naive SET state = 'SUCCEEDED', version = version + 1, lease_expires_at = NULL, \
             result_status = 201, result_headers = '[[\"content-type\",\"application/json\"]]'::jsonb, result_body = $1, \
             result_ref = 'ord_0192f0c0bench', updated_at = {PG_NOW}, completed_at = {PG_NOW} \
             WHERE tenant_id = $2 AND key = $3"
        )))
        .bind(body)
        .bind(tenant)
        .bind(key)
        .execute(&self.pool)
        .await
        .map_err(raw)?;
        Ok(())
    }

    async fn replay(&self, tenant: &str, key: &str) -> Result<(), StoreError> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT * FROM {}.idem_bench_naive WHERE tenant_id = $1 AND key = $2",
            self.schema
        )))
        .bind(tenant)
        .bind(key)
        .fetch_one(&self.pool)
        .await
        .map_err(raw)?;
        Ok(())
    }

    async fn cleanup(&self) -> Result<(), StoreError> {
        drop_bench_schema(&self.pool, &self.schema).await
    }
}

/// Redis baseline: `SET NX PX` then `SET PX` with the result; replay is a `GET`.
pub struct RedisBaseline {
    conn: redis::aio::ConnectionManager,
    prefix: String,
}

fn redis_err(e: redis::RedisError) -> StoreError {
    StoreError::Backend(e.to_string())
}

impl RedisBaseline {
    pub async fn new(url: &str, prefix: &str) -> Result<Self, StoreError> {
        let conn = redis_connection(url).await?;
        Ok(Self {
            conn,
            prefix: prefix.to_string(),
        })
    }
}

#[async_trait]
impl Baseline for RedisBaseline {
    fn describe(&self) -> &'static str {
        "redis-rs: SET NX PX, then SET PX with the result"
    }

    fn describe_replay(&self) -> &'static str {
        "redis-rs: GET"
    }

    async fn claim_complete(&self, tenant: &str, key: &str, body: &[u8]) -> Result<(), StoreError> {
        let k = format!("{}:naive:{{{tenant}:{key}}}", self.prefix);
        let mut c = self.conn.clone();
        let _: Option<String> = redis::cmd("SET")
            .arg(&k)
            .arg("PROCESSING")
            .arg("NX")
            .arg("PX")
            .arg(86_400_000)
            .query_async(&mut c)
            .await
            .map_err(redis_err)?;
        let _: () = redis::cmd("SET")
            .arg(&k)
            .arg(body)
            .arg("PX")
            .arg(86_400_000)
            .query_async(&mut c)
            .await
            .map_err(redis_err)?;
        Ok(())
    }

    async fn replay(&self, tenant: &str, key: &str) -> Result<(), StoreError> {
        let k = format!("{}:naive:{{{tenant}:{key}}}", self.prefix);
        let mut c = self.conn.clone();
        let _: Option<Vec<u8>> = redis::cmd("GET")
            .arg(&k)
            .query_async(&mut c)
            .await
            .map_err(redis_err)?;
        Ok(())
    }

    async fn cleanup(&self) -> Result<(), StoreError> {
        unlink_prefix(&self.conn, &self.prefix).await
    }
}

/// Removes every key under `prefix:` (what a bench wrote).
pub(crate) async fn unlink_prefix(
    conn: &redis::aio::ConnectionManager,
    prefix: &str,
) -> Result<(), StoreError> {
    idem_bench::cleanup::unlink_prefix(&mut conn.clone(), prefix)
        .await
        .map(|_| ())
        .map_err(redis_err)
}
