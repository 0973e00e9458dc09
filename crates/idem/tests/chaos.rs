//! `idem chaos` against the real servers: a seeded campaign with every fault kind must
//! find nothing, and the keyless control must find duplicate orders.
//!
//! Servers: `IDEM_TEST_POSTGRES_URL`, `IDEM_TEST_MYSQL_URL`, `IDEM_TEST_REDIS_URL`,
//! `IDEM_TEST_NATS_URL` (defaults on 127.0.0.1). Skipped visibly when one is absent, unless
//! `IDEM_REQUIRE_SERVICES=1`.

use std::net::{TcpStream, ToSocketAddrs};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use idem_conformance::skip_or_fail;
use serde_json::Value;

/// Seeds run on every CI run; a seed that ever found a defect is added here (1 found
/// the wedged pool and the replayed "in progress", 2 the client retrying a sold-out 409).
const SEEDS: [u64; 2] = [1, 2];

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// Whether something listens at the URL's host and port.
fn reachable(url: &str) -> Result<(), String> {
    let u = reqwest::Url::parse(url).map_err(|e| e.to_string())?;
    let addr = (u.host_str().unwrap_or("127.0.0.1"), u.port().unwrap_or(0))
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .next()
        .ok_or("no address")?;
    TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn chaos(args: &[&str]) -> (Option<i32>, Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .arg("chaos")
        .args(args)
        .env_remove("IDEM_DATABASE_URL")
        .env("IDEM_LOG", "error")
        .output()
        .expect("run idem chaos");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON report ({e}); stderr:\n{stderr}"));
    (out.status.code(), report, stderr)
}

#[test]
fn a_campaign_with_every_fault_finds_nothing_and_the_control_finds_duplicates() {
    let pg = env_or(
        "IDEM_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    campaigns("PostgreSQL", &pg, &SEEDS);
}

/// The same campaign with the ledgers on MySQL/MariaDB: one seed, to keep it short.
#[test]
fn on_mysql_a_campaign_with_every_fault_finds_nothing_and_the_control_finds_duplicates() {
    let mysql = env_or("IDEM_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
    campaigns("MySQL", &mysql, &SEEDS[..1]);
}

/// Campaigns with every fault kind for `seeds` on the database at `db`, then the
/// keyless control; skips when a server is absent.
fn campaigns(db_name: &str, db: &str, seeds: &[u64]) {
    // One campaign at a time: two would share the cores and the Redis and NATS servers.
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let redis = env_or("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    let nats = env_or("IDEM_TEST_NATS_URL", "nats://127.0.0.1:4222");
    for (name, url) in [(db_name, db), ("Redis", &redis), ("NATS", &nats)] {
        if let Err(e) = reachable(url) {
            skip_or_fail(name, &e);
            return;
        }
    }
    let servers = [
        "--database-url",
        db,
        "--redis-url",
        redis.as_str(),
        "--nats-url",
        nats.as_str(),
    ];
    let dir = tempfile::tempdir().unwrap();
    for &seed in seeds {
        let html = dir.path().join(format!("chaos-{seed}.html"));
        let seed_arg = seed.to_string();
        let mut args = servers.to_vec();
        args.extend([
            "--duration",
            "25s",
            "--seed",
            &seed_arg,
            "--json",
            "--html",
            html.to_str().unwrap(),
        ]);
        let (code, r, stderr) = chaos(&args);
        assert!(
            stderr.contains(&format!("seed {seed}")),
            "the seed is printed: {stderr}"
        );
        assert_eq!(
            r["anomalies"],
            serde_json::json!([]),
            "seed {seed}: anomalies; faults {:#}; observed {:#}",
            r["faults"],
            r["observed"]
        );
        assert_eq!(r["passed"], true);
        assert_eq!(code, Some(0), "seed {seed}: {stderr}");
        for kind in ["kill", "stop", "gateway", "db-conn", "redis", "bus", "net"] {
            assert!(
                r["faults_by_kind"][kind].as_u64().unwrap_or(0) >= 1,
                "seed {seed}: {kind} never injected: {:#}",
                r["faults_by_kind"]
            );
            let a = &r["availability_by_fault"][kind];
            let sane = a["windows"] == r["faults_by_kind"][kind]
                && a["seconds"].as_f64().is_some_and(|s| s > 0.0)
                && a["outside_per_s"].as_f64().is_some_and(|o| o > 0.0)
                && a["ratio"].as_f64().is_some_and(|q| q >= 0.0);
            assert!(sane, "seed {seed}: {kind} availability {a:#}");
        }
        assert!(r["acknowledged_ratio"].as_f64().unwrap() >= 0.95, "{r:#}");
        assert!(r["answered_ratio"].as_f64().unwrap() >= 0.95, "{r:#}");
        assert_eq!(r["observed"]["unexpected_exits"], 0, "{:#}", r["observed"]);
        assert!(
            r["intents"].as_u64().unwrap() > 100,
            "a real load: {}",
            r["intents"]
        );
        let invariants = r["invariants"].as_array().unwrap();
        assert_eq!(invariants.len(), 8);
        assert!(invariants.iter().all(|i| i["passed"] == true));
        let page = std::fs::read_to_string(&html).unwrap();
        assert!(page.contains("<svg") && page.contains("PASSED"));
    }

    // The same workload through the keyless route: the checker must see duplicates.
    let mut args = servers.to_vec();
    args.extend([
        "--duration",
        "10s",
        "--seed",
        "1",
        "--control",
        "legacy",
        "--json",
    ]);
    let (code, r, stderr) = chaos(&args);
    assert_eq!(code, Some(1), "the control fails: {stderr}");
    assert_eq!(r["passed"], false);
    assert!(
        r["anomalies_by_invariant"]["I2"].as_u64().unwrap_or(0) > 0,
        "the control shows duplicate orders: {:#}",
        r["anomalies_by_invariant"]
    );
}

#[test]
fn bad_arguments_are_refused_before_anything_starts() {
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["chaos", "--redis-url", "redis://127.0.0.1:6379", "--json"])
        .env_remove("IDEM_DATABASE_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--database-url"));
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args([
            "chaos",
            "--database-url",
            "postgres://postgres@127.0.0.1:5432/test",
            "--redis-url",
            "redis://127.0.0.1:6379",
            "--faults",
            "kill,flood",
        ])
        .env_remove("IDEM_DATABASE_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown fault kind \"flood\""));
}
