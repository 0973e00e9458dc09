//! A service in another language on idem's SQL functions and procedures: runs
//! `examples/python-orders/self-check` with this build's `idem` binary. The self-check
//! migrates a fresh PostgreSQL schema and MySQL/MariaDB database with `idem migrate`,
//! checks the Python service (duplicates, mismatches, a SIGKILL between claim and commit,
//! `idem gateway` in front) and reads its records back with `idem keys show`, `idem
//! console` and `idem sweep`. Skips visibly
//! without PostgreSQL, MySQL/MariaDB or Python (and its packages); fails instead under
//! `IDEM_REQUIRE_SERVICES=1`.

use std::process::Command;

mod common;
use common::{service_url, tcp_up};

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
const DEFAULT_MYSQL_URL: &str = "mysql://root@127.0.0.1:3306/test";

#[test]
fn python_orders_self_check() {
    if let Err(e) = Command::new("python3").arg("--version").output() {
        idem_conformance::skip_or_fail("python3", &e);
        return;
    }
    let Some(url) = service_url("IDEM_TEST_POSTGRES_URL", DEFAULT_URL, tcp_up, "PostgreSQL") else {
        return;
    };
    let Some(mysql) = service_url(
        "IDEM_TEST_MYSQL_URL",
        DEFAULT_MYSQL_URL,
        tcp_up,
        "MySQL/MariaDB",
    ) else {
        return;
    };
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
