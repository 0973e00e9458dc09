//! A service in another language on idem's SQL functions and procedures: runs
//! `examples/python-orders/self-check` with this build's `idem` binary. The self-check
//! migrates a fresh PostgreSQL schema and MySQL/MariaDB database with `idem migrate`,
//! checks the Python service (duplicates, mismatches, a SIGKILL between claim and commit,
//! `idem gateway` in front) and reads its records back with `idem keys show`, `idem
//! console` and `idem sweep`. Skips visibly
//! without PostgreSQL, MySQL/MariaDB or Python (and its packages); fails instead under
//! `IDEM_REQUIRE_SERVICES=1`.

use std::process::Command;

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
const DEFAULT_MYSQL_URL: &str = "mysql://root@127.0.0.1:3306/test";

#[test]
fn python_orders_self_check() {
    let url = std::env::var("IDEM_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_URL.into());
    if let Err(e) = Command::new("python3").arg("--version").output() {
        idem_conformance::skip_or_fail("python3", &e);
        return;
    }
    let mysql = std::env::var("IDEM_TEST_MYSQL_URL").unwrap_or_else(|_| DEFAULT_MYSQL_URL.into());
    for (server, addr) in [
        ("PostgreSQL", server_addr(&url, 5432)),
        ("MySQL/MariaDB", server_addr(&mysql, 3306)),
    ] {
        if let Err(e) = std::net::TcpStream::connect(addr) {
            idem_conformance::skip_or_fail(server, &e);
            return;
        }
    }
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/python-orders/self-check"
    );
    let out = Command::new(script)
        .env("IDEM_BIN", env!("CARGO_BIN_EXE_idem"))
        .env("IDEM_TEST_POSTGRES_URL", &url)
        .env("IDEM_TEST_MYSQL_URL", &mysql)
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

/// `host:port` of a database URL (`port` when it names none).
fn server_addr(url: &str, port: u16) -> String {
    let rest = url.split("://").nth(1).unwrap_or("");
    let host = rest
        .rsplit('@')
        .next()
        .unwrap_or("")
        .split(['/', '?'])
        .next();
    match host {
        Some(h) if h.contains(':') => h.to_string(),
        Some(h) if !h.is_empty() => format!("{h}:{port}"),
        _ => format!("127.0.0.1:{port}"),
    }
}
