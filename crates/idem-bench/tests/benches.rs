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
            "plain",
            "layer_fresh_keys",
            "layer_replay_hits"
        ]
    );
    for p in &report.phases {
        assert!(p.ok > 0, "{} made no requests", p.phase);
        assert_eq!(p.errors, 0, "{} had errors", p.phase);
    }
    assert!(report.fresh_vs_plain > 0.0 && report.replay_vs_plain > 0.0);
    assert!(report.fresh_vs_store > 0.0);
    assert_eq!(report.backend, "sqlite");
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
    assert_eq!(report.scenarios.len(), 2);
    for s in &report.scenarios {
        for t in &s.targets {
            assert!(t.requests > 0, "{}: {} made no requests", s.name, t.target);
            assert_eq!(t.errors, 0, "{}: {} had errors", s.name, t.target);
        }
        assert!(s.gateway_vs_direct > 0.0);
        assert_eq!(s.gateway_vs_nginx.is_some(), report.nginx.available);
    }
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
