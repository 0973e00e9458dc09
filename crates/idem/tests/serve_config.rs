//! The operations kit in deploy/ (dashboard, example configurations, systemd units)
//! against the servers it describes, and `--config` files for `idem serve` and
//! `idem gateway`.
//!
//! The `idem` binary in its own process on a fresh SQLite file, spoken to by a real HTTP
//! client (and by raw TCP where a client misbehaves). Each test has its own directory and
//! ports (the server binds 127.0.0.1:0 and says where); a process still running at the
//! end is killed.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

mod common;

use common::serve::*;

// ---------------------------------------------------------------------------------------
// The operations kit in deploy/: dashboard, example configurations, systemd units

fn deploy(path: &str) -> String {
    let full = format!("{}/../../deploy/{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{full}: {e}"))
}

/// The metric families a Prometheus expression reads (`idem_…`, with the suffixes of
/// counters and histograms taken off).
fn families(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("idem_"))
        .map(|w| {
            ["_total", "_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| w.strip_suffix(s))
                .unwrap_or(w)
                .to_owned()
        })
        .collect()
}

/// Every series the Grafana dashboard queries is exported by a running `idem serve` or
/// `idem gateway`; the example gateway configuration is valid; the units start the
/// binary with flags it has and read settings it knows.
#[test]
fn the_operations_kit_names_what_the_servers_export() {
    let db = db();
    let key = format!("t={KEY}");
    let s = Serve::start(&db, &["--api-key", &key, "--admin-token", ADMIN], &[]);
    let rt = runtime();
    let http = client();
    let (serve_text, gateway_text) = rt.block_on(async {
        let serve = get(&http, s.url("/metrics"), Some(ADMIN)).await;
        assert_eq!(serve.status, 200, "{}", serve.text);
        let config = idem_gateway::GatewayConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            upstream: format!("http://{}", s.addr),
            ..Default::default()
        };
        let (addr, _served) = idem_gateway::bind(config, std::future::pending())
            .await
            .expect("gateway");
        let gateway = get(&http, format!("http://{addr}/_idem/metrics"), None).await;
        assert_eq!(gateway.status, 200, "{}", gateway.text);
        (serve.text, gateway.text)
    });
    let exported = |family: &str| {
        let declared = format!("# TYPE {family} ");
        serve_text.contains(&declared) || gateway_text.contains(&declared)
    };

    let dashboard: serde_json::Value =
        serde_json::from_str(&deploy("grafana/idem-dashboard.json")).expect("dashboard JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "{} panels", panels.len());
    let mut queried = 0;
    for panel in panels {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            for family in families(expr) {
                assert!(
                    exported(&family),
                    "panel {:?} queries {family}, which no server exports",
                    panel["title"]
                );
                queried += 1;
            }
        }
    }
    assert!(queried >= panels.len(), "{queried} series");
    // The alert rules too.
    for family in families(&deploy("alerts/idem-alerts.yml")) {
        assert!(
            exported(&family),
            "an alert reads {family}, which no server exports"
        );
    }

    let gateway = idem_gateway::GatewayConfig::from_json(&deploy("config/gateway.json"))
        .expect("the example gateway configuration is valid");
    assert!(gateway.redis_url.is_some() && !gateway.routes.is_empty());

    let help = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(args)
            .output()
            .expect("idem --help");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let serve_help = help(&["serve", "--help"]);
    let gateway_help = help(&["gateway", "--help"]);
    for (unit, help) in [
        ("systemd/idem-serve.service", &serve_help),
        ("systemd/idem-gateway.service", &gateway_help),
    ] {
        let unit_text = deploy(unit);
        let exec = unit_text
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .unwrap_or_else(|| panic!("{unit} has no ExecStart"));
        for flag in exec.split_whitespace().filter(|w| w.starts_with("--")) {
            assert!(
                help.contains(flag),
                "{unit} passes {flag}, which idem does not take"
            );
        }
    }
    for (env_file, help) in [
        ("config/serve.env", &serve_help),
        ("config/gateway.env", &gateway_help),
    ] {
        for line in deploy(env_file).lines() {
            let line = line.trim_start_matches('#');
            let Some((name, _)) = line.split_once('=') else {
                continue;
            };
            if name == "IDEM_LISTEN" || name.contains(' ') {
                continue; // read by the unit's command line, or prose
            }
            let known = help.contains(&format!("env: {name}="))
                || ["IDEM_LOG", "IDEM_NATS_URL"].contains(&name);
            assert!(known, "{env_file} sets {name}, which idem does not read");
        }
    }
}

/// `idem serve --config FILE`: the file's settings apply, a flag beats the file and so
/// does the flag's environment variable; an unknown key stops the start.
#[tokio::test]
async fn a_config_file_sets_what_flags_and_environment_leave_open() {
    let db = db();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("serve.toml");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let metrics_port = {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        free.local_addr().unwrap().port()
    };
    std::fs::write(
        &file,
        format!(
            "# flag > IDEM_* > file > default\n\
             listen = \"{}\"\n\
             api_key = [\"acme=file-secret-key-0001\"]\n\
             metrics-listen = \"127.0.0.1:0\"\n\
             header-read-timeout = \"5s\"\n",
            taken.local_addr().unwrap()
        ),
    )
    .unwrap();
    let env_metrics = format!("127.0.0.1:{metrics_port}");
    let path = file.to_str().unwrap();
    let s = Serve::start(
        &db,
        &["--config", path],
        &[("IDEM_METRICS_LISTEN", env_metrics.as_str())],
    );
    // The flag's --listen 127.0.0.1:0 won over the file's (taken) address.
    assert_ne!(s.addr, taken.local_addr().unwrap().to_string());
    // The environment won over the file's metrics address.
    assert_eq!(s.metrics_addr.as_deref(), Some(env_metrics.as_str()));
    // The file's API key is the one the server accepts.
    let http = reqwest::Client::new();
    let ok = get(&http, s.url("/v1/orders"), Some("file-secret-key-0001")).await;
    assert_eq!(ok.status, 200, "{}", ok.text);
    drop(s);

    std::fs::write(&file, "sweep-every = \"1m\"\nno-such-setting = 1\n").unwrap();
    let out = idem(&db.url, &["serve", "--config", path]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no-such-setting") && err.contains("serve.toml"),
        "{err}"
    );
}

/// `idem gateway --config FILE.toml`: the gateway's configuration in TOML.
#[test]
fn the_gateway_reads_a_toml_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gateway.toml");
    std::fs::write(
        &file,
        "listen = \"127.0.0.1:0\"\n\
         upstream = \"http://127.0.0.1:9\"\n\
         window_ms = 60000\n\
         [[routes]]\n\
         methods = [\"POST\"]\n\
         path = \"/v1/*\"\n\
         key = \"required\"\n",
    )
    .unwrap();
    let mut child = command(
        "sqlite://unused",
        &["gateway", "--config", file.to_str().unwrap()],
        &[],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn idem gateway");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = child.kill();
    let status = child.wait().unwrap();
    assert!(
        line.starts_with("idem gateway on http://127.0.0.1:")
            && line.contains("http://127.0.0.1:9"),
        "{line} ({status})"
    );
    // A TOML syntax error names the file.
    std::fs::write(&file, "upstream = \n").unwrap();
    let out = command(
        "sqlite://unused",
        &["gateway", "--config", file.to_str().unwrap()],
        &[],
    )
    .output()
    .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("gateway.toml"));
}
