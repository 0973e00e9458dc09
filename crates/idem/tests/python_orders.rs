//! A service in another language on idem's SQL functions: runs
//! `examples/python-orders/self-check` with this build's `idem` binary. The self-check
//! migrates a fresh schema with `idem migrate`, checks the Python service (duplicates,
//! mismatches, a SIGKILL between claim and commit, `idem gateway` in front) and reads its
//! records back with `idem keys show`, `idem console` and `idem sweep`. Skips visibly
//! without PostgreSQL or Python (and its packages); fails instead under
//! `IDEM_REQUIRE_SERVICES=1`.

use std::process::Command;

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

#[test]
fn python_orders_self_check() {
    let url = std::env::var("IDEM_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_URL.into());
    if let Err(e) = Command::new("python3").arg("--version").output() {
        idem_conformance::skip_or_fail("python3", &e);
        return;
    }
    if let Err(e) = std::net::TcpStream::connect(postgres_addr(&url)) {
        idem_conformance::skip_or_fail("PostgreSQL", &e);
        return;
    }
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/python-orders/self-check"
    );
    let out = Command::new(script)
        .env("IDEM_BIN", env!("CARGO_BIN_EXE_idem"))
        .env("IDEM_TEST_POSTGRES_URL", &url)
        // The guard-vs-plain throughput is measured by hand, not under a test's load.
        .arg("--no-bench")
        .output()
        .expect("run self-check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    if out.status.code() == Some(77) {
        idem_conformance::skip_or_fail("Python venv with its packages", &stderr.trim());
        return;
    }
    assert!(
        out.status.success(),
        "self-check failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
}

/// `host:port` of a `postgres://` URL (the default port when none is given).
fn postgres_addr(url: &str) -> String {
    let rest = url.split("://").nth(1).unwrap_or("");
    let host = rest
        .rsplit('@')
        .next()
        .unwrap_or("")
        .split(['/', '?'])
        .next();
    match host {
        Some(h) if h.contains(':') => h.to_string(),
        Some(h) if !h.is_empty() => format!("{h}:5432"),
        _ => "127.0.0.1:5432".into(),
    }
}
