//! Every bench runs end to end on a tiny budget and produces every figure. Figures are
//! checked for being there, never for their size: timings depend on the host.
//!
//! The gateway's duplicate storm must cost one upstream call. nginx is used when
//! present; without it the report says so and leaves its figures out.

use std::time::Duration;

use idem_core::Tier;
use idem_sqlite::{SqliteOptions, SqliteStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_bench_smoke() {
    let report = idem_bench::http::bench(idem_bench::http::BenchOptions {
        phase: Duration::from_millis(200),
        concurrency: 2,
        replay_keys: 8,
        ..Default::default()
    })
    .await
    .unwrap();
    let names: Vec<&str> = report.phases.iter().map(|p| p.phase.as_str()).collect();
    assert_eq!(
        names,
        [
            "store_claim_complete",
            "store_replay",
            "plain",
            "layer_fresh_keys",
            "layer_replay_hits",
            "layer_replay_hits_timeline"
        ]
    );
    // The timeline recorded the replays (written, or counted as dropped).
    let timeline = report
        .replay_timeline_vs_replay
        .expect("a SQL store has the timeline");
    assert!(timeline > 0.0);
    assert!(report.timeline_written.unwrap() + report.timeline_dropped.unwrap() > 0);
    for p in &report.phases {
        assert!(p.ok > 0, "{} made no requests", p.phase);
        assert_eq!(p.errors, 0, "{} had errors", p.phase);
    }
    assert!(report.fresh_vs_plain > 0.0 && report.replay_vs_plain > 0.0);
    assert!(report.fresh_vs_store > 0.0);
    // The verdict is the two bounds' bars, not the store-only ratio.
    assert_eq!(
        report.meets_target,
        report.fresh_vs_bound >= report.fresh_vs_bound_target
            && report.replay_vs_bound >= report.replay_vs_bound_target
    );
    assert_eq!(
        (report.fresh_vs_bound_target, report.replay_vs_bound_target),
        (0.7, 0.8)
    );
    assert_eq!(report.backend, "sqlite");
    // Says what it was limited by, from the kernel's counters.
    assert!(
        report.saturation.process_cores > 0.0,
        "{:?}",
        report.saturation
    );
    assert!(!report.saturation.saturated.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_bench_smoke() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(SqliteOptions::new(dir.path().join("sweep.db")))
        .await
        .unwrap();
    let sql = idem_sql::SqlStore::from(store);
    let report = idem_bench::sweep::bench(
        &sql,
        idem_bench::sweep::BenchOptions {
            records: 2_000,
            concurrency: 2,
            slice: Duration::from_millis(50),
            batch: 200,
            sample: 50,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(report.records, 2_000);
    assert_eq!(
        report.sweep.moved(Tier::Dispute),
        2_000,
        "all walked to the archive"
    );
    assert!(report.records_per_sec > 0.0);
    let tiers: Vec<Tier> = report.bytes_per_record.iter().map(|u| u.tier).collect();
    assert_eq!(
        tiers,
        [Tier::Retry, Tier::Replay, Tier::Dispute, Tier::Archive]
    );
    assert!(
        report.bytes_per_record.iter().all(|u| u.records > 0),
        "{report:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_bench_smoke() {
    // A `sqlite:` URL runs on a temporary file, never the named one.
    let report = idem_bench::reconcile::bench(
        "sqlite://./never-written.db",
        &idem_bench::reconcile::BenchOptions {
            orders: 2_000,
            duplicate_every: 10,
            rounds: 1,
        },
    )
    .await
    .unwrap();
    assert!(!std::path::Path::new("./never-written.db").exists());
    assert_eq!(report.orders, 2_000);
    // 1000 users with two orders each; every tenth user's pair is on one show.
    assert_eq!(report.clusters, 100);
    assert_eq!(report.database, "temporary SQLite file");
    assert!(report.ratio > 0.0);
    assert!(report.render_text().contains("ratio reconcile/raw"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_bench_smoke() {
    let report = idem_bench::gateway::bench(idem_bench::gateway::BenchOptions {
        phase_ms: 200,
        rounds: 1,
        concurrency: 4,
        storm: 300,
        storm_connections: 100,
        storm_exec_ms: 200,
        ..idem_bench::gateway::BenchOptions::default()
    })
    .await
    .unwrap();
    let names: Vec<&str> = report.scenarios.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names.len(), 3, "{names:?}");
    for s in &report.scenarios {
        for t in &s.targets {
            assert!(t.requests > 0, "{}: {} made no requests", s.name, t.target);
            assert_eq!(t.errors, 0, "{}: {} had errors", s.name, t.target);
        }
        assert!(s.gateway_vs_direct > 0.0);
        assert_eq!(s.gateway_vs_nginx.is_some(), report.nginx.available);
        let sat = s
            .gateway_saturation
            .as_ref()
            .expect("the gateway's rounds are metered");
        assert!(!sat.saturated.is_empty());
        // Each target's CPU is read off its own servers' clocks: the proxy's (none for
        // direct, nginx's process only when it ran) and the upstream's.
        let cpu: Vec<&str> = s.cpu.iter().map(|c| c.target.as_str()).collect();
        let targets: Vec<&str> = s.targets.iter().map(|t| t.target.as_str()).collect();
        assert_eq!(cpu, targets);
        for c in &s.cpu {
            let metered = c.target != "direct";
            assert_eq!(c.proxy_user_us.is_some(), metered, "{c:?}");
            assert_eq!(c.proxy_system_us.is_some(), metered, "{c:?}");
            assert!(c.upstream_us.is_some(), "{c:?}");
        }
        assert_eq!(s.gateway_vs_nginx_cpu.is_some(), report.nginx.available);
    }
    // The gateway's thread did the proxying: its clock moved (10 ms ticks).
    let gateway_us: f64 = report
        .scenarios
        .iter()
        .flat_map(|s| &s.cpu)
        .filter(|c| c.target == "gateway")
        .map(|c| c.proxy_user_us.unwrap() + c.proxy_system_us.unwrap())
        .sum();
    assert!(gateway_us > 0.0, "{:?}", report.scenarios);
    assert!(report.to_text().contains("cpu per request (us)"));
    let st = &report.storm;
    assert!(st.one_upstream_call, "{st:?}");
    assert_eq!(st.upstream_executions, 1);
    assert_eq!(st.ok, 300);
    assert_eq!(st.distinct_bodies, 1);
    assert_eq!(st.coalesced_waiters + st.window_hits, 299);
    // The report serialises for `--json`.
    let json = serde_json::to_value(&report).unwrap();
    assert!(json["storm"]["upstream_calls"].as_u64() == Some(1));
    let text = report.to_text();
    assert!(text.contains("storm: 300 duplicates"));
    if !report.nginx.available {
        assert!(report.passthrough_vs_nginx.is_none() && report.meets_target.is_none());
        assert!(json["nginx"]["note"].as_str().unwrap().contains("nginx"));
        assert!(text.contains("gateway/nginx n/a"), "{text}");
        assert!(text.contains("not measured (no nginx)"), "{text}");
    }
}

/// `--database-url` is honoured: the run measures the store it names, says so, and
/// leaves nothing behind on the shared server.
async fn http_bench_on(url: &str, backend: &str) -> Option<idem_bench::http::HttpBenchReport> {
    let report = idem_bench::http::bench(idem_bench::http::BenchOptions {
        phase: Duration::from_millis(200),
        concurrency: 2,
        replay_keys: 8,
        database_url: Some(url.to_owned()),
    })
    .await;
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            idem_conformance::skip_or_fail(backend, &e);
            return None;
        }
    };
    assert_eq!(report.backend, backend);
    assert!(!report.database.contains("sqlite"), "{}", report.database);
    for p in &report.phases {
        assert!(p.ok > 0, "{} made no requests on {backend}", p.phase);
    }
    Some(report)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_bench_measures_postgres_when_told_to() {
    let url = std::env::var("IDEM_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    if http_bench_on(&url, "postgres").await.is_none() {
        return;
    }
    assert_eq!(
        schemas_like(&url, "idem_bench_http_%").await,
        0,
        "the bench schema is dropped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_bench_measures_redis_when_told_to() {
    let url =
        std::env::var("IDEM_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    if http_bench_on(&url, "redis").await.is_none() {
        return;
    }
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let (_, keys): (u64, Vec<String>) = redis::cmd("SCAN")
        .arg(0)
        .arg("MATCH")
        .arg("idem-bench-http-*")
        .arg("COUNT")
        .arg(100_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(keys.is_empty(), "bench keys left behind: {}", keys.len());
}

async fn orders_bench_on(
    url: Option<&str>,
    backend: &str,
) -> Option<idem_bench::orders::OrdersBenchReport> {
    let report = idem_bench::orders::bench(idem_bench::orders::OrdersBenchOptions {
        database_url: url.map(str::to_owned),
        concurrency: 4,
        duration: Duration::from_millis(600),
        shows: Some(1),
    })
    .await;
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            idem_conformance::skip_or_fail(backend, &e);
            return None;
        }
    };
    assert_eq!(report.backend, backend);
    for side in [&report.plain, &report.one_commit, &report.two_commit] {
        assert!(side.ok > 0, "{} made no orders on {backend}", side.phase);
        assert_eq!(side.errors, 0, "{} had errors on {backend}", side.phase);
    }
    assert!(report.one_commit_vs_plain > 0.0 && report.two_commit_vs_plain > 0.0);
    // Every client on one show: it sells, and the ratio to the spread side is reported.
    let hot = report.hot.as_ref().expect("the hot side ran");
    assert!(hot.ok > 0, "the hot show sold nothing on {backend}");
    assert_eq!(report.shows, Some(1));
    assert!(report.hot_vs_spread.is_some_and(|r| r > 0.0));
    assert!(!report.saturation.saturated.is_empty());
    Some(report)
}

/// The order service's create, keyed and not, through its real handler: every request
/// answered 201 on every side, on SQLite and on PostgreSQL (whose schema is dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_bench_smoke() {
    orders_bench_on(None, "sqlite")
        .await
        .expect("SQLite needs no server");
    let url = std::env::var("IDEM_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    if orders_bench_on(Some(&url), "postgres").await.is_none() {
        return;
    }
    assert_eq!(
        schemas_like(&url, "idem_bench_orders_%").await,
        0,
        "the bench schema is dropped"
    );
}

/// The same on MySQL/MariaDB, held to its own bar.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_bench_smoke_mysql() {
    let url = std::env::var("IDEM_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
    let Some(report) = orders_bench_on(Some(&url), "mysql").await else {
        return;
    };
    assert_eq!(report.target, 0.75, "MySQL's own bar, not PostgreSQL's");
}

/// How many schemas on the server at `url` match the LIKE `pattern`.
async fn schemas_like(url: &str, pattern: &str) -> i64 {
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    sqlx::query_scalar("SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name LIKE $1")
        .bind(pattern)
        .fetch_one(&pool)
        .await
        .unwrap()
}
