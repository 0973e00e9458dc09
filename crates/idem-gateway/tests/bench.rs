//! The benchmark runs end to end on a tiny budget: every figure is produced and the
//! duplicate storm costs one upstream call. (nginx is used when present; this test never
//! installs it.)

use idem_gateway::bench::{bench, BenchOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_smoke() {
    let report = bench(BenchOptions {
        phase_ms: 200,
        rounds: 1,
        concurrency: 4,
        storm: 300,
        storm_connections: 100,
        storm_exec_ms: 200,
        install_nginx: false,
        ..BenchOptions::default()
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
    assert!(report.to_text().contains("storm: 300 duplicates"));
}
