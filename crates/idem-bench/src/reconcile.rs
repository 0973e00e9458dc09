//! `idem bench reconcile`: orders scanned per second by a reconcile dry run (the ordered
//! scan, grouping, the other ledgers of every cluster, the plan) against a raw ordered
//! SELECT of the same rows, decoded the same way, in the same run.
//!
//! It never loads its orders into the operator's database: SQLite runs on a temporary
//! file, PostgreSQL in a fresh schema that is dropped at the end. The dry run is
//! [`idem_orders::reconcile::survey`], the same scan and plan `idem reconcile` runs.

use crate::saturation::{Meter, Saturation};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use serde::{Deserialize, Serialize};
use sqlx::Row as _;

use idem_orders::db::redact;
use idem_orders::reconcile::{survey, ReconcileOptions};
use idem_orders::{Database, DatabaseOptions, Error};

/// How big a ledger to reconcile.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub orders: u64,
    /// One intent in this many is a duplicate pair (two orders, same session).
    pub duplicate_every: u64,
    /// Timed rounds of each side; the best round counts.
    pub rounds: u32,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            orders: 1_000_000,
            duplicate_every: 500,
            rounds: 2,
        }
    }
}

/// The measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    pub backend: String,
    pub database: String,
    pub orders: u64,
    pub clusters: usize,
    pub load_ms: u64,
    /// Best round of the raw ordered SELECT.
    pub raw_ms: u64,
    pub raw_orders_per_s: f64,
    /// Best round of the reconcile dry run (scan, group, cluster facts, plan).
    pub reconcile_ms: u64,
    pub reconcile_orders_per_s: f64,
    /// reconcile_orders_per_s / raw_orders_per_s.
    pub ratio: f64,
    /// What the last reconcile round was limited by.
    pub saturation: Saturation,
}

impl BenchReport {
    pub fn render_text(&self) -> String {
        format!(
            "reconcile scan on {} ({}): {} orders, {} duplicate clusters (load {} ms)\n\
             raw ordered SELECT:  {:>10.0} orders/s ({} ms)\n\
             reconcile dry run:   {:>10.0} orders/s ({} ms)\n\
             ratio reconcile/raw: {:.2}\n\
             saturated: {}\n",
            self.backend,
            self.database,
            self.orders,
            self.clusters,
            self.load_ms,
            self.raw_orders_per_s,
            self.raw_ms,
            self.reconcile_orders_per_s,
            self.reconcile_ms,
            self.ratio,
            self.saturation.saturated
        )
    }
}

const TENANT: &str = "bench";
const BASE_MS: i64 = 1_700_000_000_000;

const LOAD_SQLITE: &str =
    "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < $1) \
     INSERT INTO orders (order_id, tenant_id, user_id, show_id, quantity, amount_cents, \
       client_session, idempotency_key, status, version, created_at, updated_at) \
     SELECT printf('ord_%010d', i), $2, 'U-' || (i / 2), \
       CASE WHEN (i / 2) % $3 = 0 THEN 'S-0' ELSE 'S-' || (i % 2) END, 1, 1000, \
       'sess-' || (i / 2), NULL, 'pending_payment', 1, $4 + i * 10, $4 + i * 10 FROM n";

const LOAD_PG: &str = "INSERT INTO orders (order_id, tenant_id, user_id, show_id, quantity, \
       amount_cents, client_session, idempotency_key, status, version, created_at, updated_at) \
     SELECT 'ord_' || lpad(i::text, 10, '0'), $2, 'U-' || (i / 2), \
       CASE WHEN (i / 2) % $3 = 0 THEN 'S-0' ELSE 'S-' || (i % 2) END, 1, 1000, \
       'sess-' || (i / 2), NULL, 'pending_payment', 1, $4 + i * 10, $4 + i * 10 \
     FROM generate_series(0::bigint, $1 - 1) AS g(i)";

const LOAD_HOLDS: &str = "INSERT INTO inventory_holds (hold_id, tenant_id, order_id, show_id, \
       quantity, status, created_at) \
     SELECT 'hold_' || order_id, tenant_id, order_id, show_id, quantity, 'held', created_at \
     FROM orders WHERE tenant_id = $1";

/// The baseline: the same rows, the same order, the same columns decoded.
const RAW: &str = "SELECT order_id, tenant_id, user_id, show_id, quantity, amount_cents, \
       client_session, idempotency_key, status, created_at FROM orders WHERE tenant_id = $1 \
     ORDER BY tenant_id, user_id, show_id, created_at, order_id";

macro_rules! raw_scan {
    ($pool:expr) => {{
        let mut rows = sqlx::query(RAW).bind(TENANT).fetch($pool);
        let mut n = 0u64;
        let mut bytes = 0usize;
        while let Some(row) = rows.try_next().await? {
            let order_id: String = row.try_get("order_id")?;
            let tenant: String = row.try_get("tenant_id")?;
            let user: String = row.try_get("user_id")?;
            let show: String = row.try_get("show_id")?;
            let q: i64 = row.try_get("quantity")?;
            let a: i64 = row.try_get("amount_cents")?;
            let s: Option<String> = row.try_get("client_session")?;
            let k: Option<String> = row.try_get("idempotency_key")?;
            let st: String = row.try_get("status")?;
            let at: i64 = row.try_get("created_at")?;
            bytes += order_id.len() + tenant.len() + user.len() + show.len() + st.len();
            bytes += s.map_or(0, |s| s.len()) + k.map_or(0, |k| k.len());
            bytes += (q + a + at) as usize & 1;
            n += 1;
        }
        std::hint::black_box(bytes);
        n
    }};
}

async fn raw(db: &Database) -> Result<u64, Error> {
    Ok(match (db.sqlite(), db.postgres()) {
        (Some(s), _) => raw_scan!(s.pool()),
        (None, Some(p)) => raw_scan!(p.pool()),
        (None, None) => unreachable!("a database is SQLite or PostgreSQL"),
    })
}

async fn load(db: &Database, o: &BenchOptions) -> Result<(), Error> {
    let n = i64::try_from(o.orders).unwrap_or(i64::MAX);
    let every = i64::try_from(o.duplicate_every.max(1)).unwrap_or(i64::MAX);
    match (db.sqlite(), db.postgres()) {
        (Some(s), _) => {
            let mut tx = s.pool().begin().await?;
            sqlx::query(LOAD_SQLITE)
                .bind(n)
                .bind(TENANT)
                .bind(every)
                .bind(BASE_MS)
                .execute(&mut *tx)
                .await?;
            sqlx::query(LOAD_HOLDS)
                .bind(TENANT)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            sqlx::query("ANALYZE").execute(s.pool()).await?;
        }
        (None, Some(p)) => {
            let mut tx = p.pool().begin().await?;
            sqlx::query(LOAD_PG)
                .bind(n)
                .bind(TENANT)
                .bind(every)
                .bind(BASE_MS)
                .execute(&mut *tx)
                .await?;
            sqlx::query(LOAD_HOLDS)
                .bind(TENANT)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            sqlx::query("ANALYZE").execute(p.pool()).await?;
        }
        (None, None) => unreachable!("a database is SQLite or PostgreSQL"),
    }
    Ok(())
}

/// Loads `options.orders` orders and measures both sides (see the module docs).
pub async fn bench(url: &str, options: &BenchOptions) -> Result<BenchReport, Error> {
    let dir = tempfile::tempdir()?;
    let (db, schema) = if url.starts_with("sqlite:") {
        let path = dir.path().join("reconcile-bench.db");
        (Database::open_sqlite(&path).await?, None)
    } else {
        let schema = format!("idem_bench_rec_{}", uuid::Uuid::now_v7().simple());
        let db = Database::open(
            url,
            DatabaseOptions {
                pg_schema: Some(schema.clone()),
                ..Default::default()
            },
        )
        .await?;
        (db, Some(schema))
    };
    let result = measure(&db, options).await;
    if let (Some(schema), Some(pg)) = (&schema, db.postgres()) {
        if let Err(e) = crate::cleanup::drop_schema(pg.pool(), schema).await {
            tracing::warn!(error = %e, %schema, "could not drop the bench schema");
        }
    }
    let mut report = result?;
    report.database = match &schema {
        Some(s) => format!("{} (schema {s}, dropped)", redact(url)),
        None => "temporary SQLite file".into(),
    };
    Ok(report)
}

async fn measure(db: &Database, o: &BenchOptions) -> Result<BenchReport, Error> {
    let started = Instant::now();
    load(db, o).await?;
    let load_ms = started.elapsed().as_millis() as u64;
    let options = ReconcileOptions {
        tenant: Some(TENANT.into()),
        ..ReconcileOptions::default()
    };
    // Warm both paths once (page cache, statement cache), then alternate timed rounds.
    raw(db).await?;
    let mut best_raw = Duration::MAX;
    let mut best_rec = Duration::MAX;
    let mut clusters = 0;
    let mut scanned = 0;
    let mut saturation = None;
    for _ in 0..o.rounds.max(1) {
        let t = Instant::now();
        let rows = raw(db).await?;
        best_raw = best_raw.min(t.elapsed());
        let t = Instant::now();
        let meter = Meter::start();
        let s = survey(db, &options).await?;
        best_rec = best_rec.min(t.elapsed());
        saturation = Some(meter.stop("reading and grouping the orders"));
        if s.orders != rows {
            return Err(Error::Backend(format!(
                "the scan read {} orders, the raw SELECT {rows}",
                s.orders
            )));
        }
        clusters = s.clusters.len();
        scanned = s.orders;
    }
    let rate = |d: Duration| scanned as f64 / d.as_secs_f64().max(1e-9);
    Ok(BenchReport {
        backend: db.backend().into(),
        database: String::new(),
        orders: scanned,
        clusters,
        load_ms,
        raw_ms: best_raw.as_millis() as u64,
        raw_orders_per_s: rate(best_raw),
        reconcile_ms: best_rec.as_millis() as u64,
        reconcile_orders_per_s: rate(best_rec),
        ratio: rate(best_rec) / rate(best_raw),
        saturation: saturation.unwrap_or_else(|| Meter::start().stop("nothing measured")),
    })
}
