//! `idem bench orders`: `POST /v1/orders` through the order service's real handler
//! (`idem serve`'s app, in this process) with a fresh key per request, against the same
//! create without idempotency (`POST /v1/legacy/orders`) on the same server, the same
//! pool and in the same run. A second server on the same database claims ahead (two
//! commits per create), for comparison.
//!
//! Each client task orders from a show of its own, so the sides measure commits. With
//! `shows` a fourth side, `hot`, runs the one-commit create with every client on that
//! many shows (1: the flash sale, everybody buying the same show), and `hot_vs_spread`
//! is its ratio to the one-commit side. The store is the one
//! `database_url` names (PostgreSQL in a schema of its own, removed afterwards; SQLite)
//! or a temporary SQLite file. This module only measures: it must not change the
//! service's behaviour beyond the options a measurement needs.

use std::sync::Arc;
use std::time::Duration;

use idem_core::TenantId;
use idem_orders::ledgers::ShowSeed;
use idem_orders::{ApiKey, ClaimMode, ServeConfig, ServiceOptions};
use idem_sql::{redact, Backend};
use serde::{Deserialize, Serialize};

use crate::http::{drive, BenchError, PhaseRate};
use crate::saturation::{Meter, Saturation};

/// What to run.
#[derive(Debug, Clone)]
pub struct OrdersBenchOptions {
    /// `postgres://…`, `mysql://…` or `sqlite://…`; a temporary SQLite file when `None`.
    pub database_url: Option<String>,
    pub concurrency: usize,
    /// Time per side; spread over [`ROUNDS`] alternating slices.
    pub duration: Duration,
    /// Also run the one-commit create with every client on this many shows.
    pub shows: Option<usize>,
}

/// Slices per side, alternated so load from elsewhere lands on every side.
pub const ROUNDS: u32 = 6;
/// The bar `one_commit_vs_plain` should reach on `backend`: 0.80 on PostgreSQL, 0.75 on
/// MySQL/MariaDB (InnoDB's commit costs more of a create there). SQLite has no bar of its
/// own and is held to PostgreSQL's.
pub fn target(backend: Backend) -> f64 {
    match backend {
        Backend::Mysql => 0.75,
        _ => 0.8,
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrdersBenchReport {
    pub backend: String,
    pub database: String,
    pub concurrency: usize,
    /// The create without a key (`/v1/legacy/orders`).
    pub plain: PhaseRate,
    /// `/v1/orders`, the claim in the order's transaction (one commit).
    pub one_commit: PhaseRate,
    /// `/v1/orders` on a server that claims ahead (two commits).
    pub two_commit: PhaseRate,
    pub one_commit_vs_plain: f64,
    pub two_commit_vs_plain: f64,
    /// `/v1/orders` (one commit) with every client on `shows` shows.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub hot: Option<PhaseRate>,
    /// How many shows the `hot` side spread its clients over.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub shows: Option<usize>,
    /// `hot` against `one_commit` (every client on its own show), same run.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub hot_vs_spread: Option<f64>,
    /// The bar of this backend ([`target`]).
    pub target: f64,
    pub meets_target: bool,
    pub saturation: Saturation,
}

const TENANT: &str = "bench";

fn ratio(a: &PhaseRate, b: &PhaseRate) -> f64 {
    if b.per_second > 0.0 {
        (a.per_second / b.per_second * 100.0).round() / 100.0
    } else {
        0.0
    }
}

fn merge(into: &mut Option<PhaseRate>, slice: PhaseRate, seconds: f64) {
    let total = into.get_or_insert(PhaseRate {
        phase: slice.phase.clone(),
        ok: 0,
        errors: 0,
        per_second: 0.0,
    });
    total.ok += slice.ok;
    total.errors += slice.errors;
    total.per_second = total.ok as f64 / seconds.max(1e-9);
}

async fn post(
    client: &reqwest::Client,
    url: &str,
    secret: &str,
    show: usize,
    key: Option<String>,
) -> bool {
    let body = format!(r#"{{"user_id":"U-bench-{show}","show_id":"BENCH-{show}","quantity":1}}"#);
    let mut request = client
        .post(url)
        .bearer_auth(secret)
        .header("content-type", "application/json")
        .body(body);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    match request.send().await {
        Ok(response) => {
            response.status() == reqwest::StatusCode::CREATED && response.bytes().await.is_ok()
        }
        Err(_) => false,
    }
}

/// Runs the three sides and reports their ratios.
pub async fn bench(options: OrdersBenchOptions) -> Result<OrdersBenchReport, BenchError> {
    let concurrency = options.concurrency.max(1);
    if options.duration.is_zero() {
        return Err(BenchError::Setup("--duration must be positive".into()));
    }
    if options.shows == Some(0) {
        return Err(BenchError::Setup("--shows must be at least 1".into()));
    }
    let tempdir = tempfile::tempdir()?;
    let (url, database) = match &options.database_url {
        Some(url) => (url.clone(), redact(url)),
        None => (
            format!("sqlite://{}", tempdir.path().join("orders.db").display()),
            "temporary SQLite file".to_owned(),
        ),
    };
    let backend = Backend::of_url(&url)?;
    if backend == Backend::Redis {
        return Err(BenchError::Setup(
            "the order service keeps its orders in SQLite, PostgreSQL or MySQL, not Redis".into(),
        ));
    }
    let run_id = uuid::Uuid::now_v7().simple().to_string();
    let schema = format!("idem_bench_orders_{run_id}");
    // MySQL: a database of the bench's own beside the URL's (its schemas are databases).
    let server_url = url.clone();
    let url = match backend {
        Backend::Mysql => crate::cleanup::create_mysql_database(&url, &schema)
            .await
            .map_err(|e| BenchError::Setup(format!("bench database: {e}")))?,
        _ => url,
    };
    let secret = format!("bench-secret-{run_id}");
    let catalogue: Vec<ShowSeed> = (0..concurrency)
        .map(|i| ShowSeed {
            show_id: format!("BENCH-{i}"),
            title: format!("Bench show {i}"),
            capacity: 1_000_000_000,
            per_order_limit: 10,
            price_cents: 100,
        })
        .collect();
    let config = |claim: ClaimMode| ServeConfig {
        listen: "127.0.0.1:0".parse().expect("address"),
        database_url: Some(url.clone()),
        api_keys: vec![ApiKey {
            tenant: TenantId::new(TENANT).expect("tenant"),
            secret: secret.clone(),
        }],
        admin_token: None,
        nats_url: None,
        tls: None,
        options: ServiceOptions {
            pg_schema: (backend == Backend::Postgres).then(|| schema.clone()),
            catalogue: catalogue.clone(),
            legacy_route: true,
            create_claim: claim,
            ..ServiceOptions::default()
        },
    };
    let setup = |e: idem_orders::Error| BenchError::Setup(format!("order service: {e}"));
    let one = idem_orders::bind(config(ClaimMode::InTransaction))
        .await
        .map_err(setup)?;
    let two = match idem_orders::bind(config(ClaimMode::Ahead)).await {
        Ok(server) => server,
        Err(e) => {
            let _ = one.shutdown().await;
            return Err(setup(e));
        }
    };
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .build()?;
    // (side, URL, keyed, shows the clients share: None = one each)
    let mut sides = vec![
        (
            "plain",
            format!("{}/v1/legacy/orders", one.url()),
            false,
            None,
        ),
        ("one_commit", format!("{}/v1/orders", one.url()), true, None),
        ("two_commit", format!("{}/v1/orders", two.url()), true, None),
    ];
    if let Some(shows) = options.shows {
        sides.push(("hot", format!("{}/v1/orders", one.url()), true, Some(shows)));
    }
    let slice = options.duration / ROUNDS;
    let mut totals: Vec<Option<PhaseRate>> = vec![None; sides.len()];
    let meter = Meter::start();
    for round in 0..ROUNDS {
        for (i, (name, target, keyed, shows)) in sides.iter().enumerate() {
            let (client, target, secret) =
                (client.clone(), Arc::new(target.clone()), secret.clone());
            let (name, keyed, shows, run_id) = (*name, *keyed, *shows, run_id.clone());
            let rate = drive(name, concurrency, slice, move |task, seq| {
                let (client, target, secret) = (client.clone(), target.clone(), secret.clone());
                let key = keyed.then(|| format!("{run_id}-{name}-{round}-{task}-{seq}"));
                let show = shows.map_or(task, |n| task % n);
                async move { post(&client, &target, &secret, show, key).await }
            })
            .await;
            merge(
                &mut totals[i],
                rate,
                slice.as_secs_f64() * f64::from(round + 1),
            );
        }
    }
    let saturation = meter.stop(match backend {
        Backend::Sqlite => "commits: SQLite's single writer",
        Backend::Mysql => "commits and round trips to MySQL",
        _ => "commits and round trips to PostgreSQL",
    });
    let _ = two.shutdown().await;
    let database_handle = one.orders().database().clone();
    let _ = one.shutdown().await;
    if let Some(pg) = database_handle.postgres() {
        if let Err(e) = crate::cleanup::drop_schema(pg.pool(), &schema).await {
            tracing::warn!(error = %e, %schema, "could not drop the bench schema");
        }
    }
    if backend == Backend::Mysql {
        if let Err(e) = crate::cleanup::drop_mysql_database(&server_url, &schema).await {
            tracing::warn!(error = %e, %schema, "could not drop the bench database");
        }
    }
    let mut totals = totals.into_iter().map(|t| t.expect("every side ran"));
    let (plain, one_commit, two_commit) = (
        totals.next().expect("plain"),
        totals.next().expect("one_commit"),
        totals.next().expect("two_commit"),
    );
    let hot = totals.next();
    let one_commit_vs_plain = ratio(&one_commit, &plain);
    Ok(OrdersBenchReport {
        backend: backend.as_str().to_owned(),
        database,
        concurrency,
        two_commit_vs_plain: ratio(&two_commit, &plain),
        hot_vs_spread: hot.as_ref().map(|h| ratio(h, &one_commit)),
        shows: options.shows,
        hot,
        one_commit_vs_plain,
        plain,
        one_commit,
        two_commit,
        target: target(backend),
        meets_target: one_commit_vs_plain >= target(backend),
        saturation,
    })
}

pub fn print_human(r: &OrdersBenchReport) {
    println!(
        "idem bench orders on {} ({}) ({} clients, POST through the order service's handler)",
        r.backend, r.database, r.concurrency
    );
    for (side, what) in [
        (&r.plain, "no key: /v1/legacy/orders"),
        (
            &r.one_commit,
            "fresh key, claim in the order's transaction (one commit)",
        ),
        (&r.two_commit, "fresh key, claim ahead (two commits)"),
    ] {
        println!(
            "  {:<11} {:>9.0} creates/s  ({} errors)  {what}",
            side.phase, side.per_second, side.errors
        );
    }
    println!(
        "  one_commit / plain {:.2} (target {:.2}: {})   two_commit / plain {:.2}",
        r.one_commit_vs_plain,
        r.target,
        if r.meets_target { "met" } else { "missed" },
        r.two_commit_vs_plain
    );
    if let (Some(hot), Some(shows), Some(vs)) = (&r.hot, r.shows, r.hot_vs_spread) {
        println!(
            "  {:<11} {:>9.0} creates/s  ({} errors)  fresh key, one commit, all clients on {shows} show(s)",
            hot.phase, hot.per_second, hot.errors
        );
        println!("  hot / spread {vs:.2}");
    }
    println!("  saturated   {}", r.saturation.saturated);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_backend_has_its_own_bar() {
        assert_eq!(target(Backend::Postgres), 0.8);
        assert_eq!(target(Backend::Mysql), 0.75);
        assert_eq!(target(Backend::Sqlite), 0.8);
    }
}
