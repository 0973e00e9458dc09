//! Runs the example's `self-check` mode against PostgreSQL, so `cargo test --workspace`
//! keeps the example working. The binary is run as a user would run it: its exit code
//! and summary are what is checked.

use std::process::Command;
use std::time::Duration;

const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

#[tokio::test]
async fn self_check_passes_on_postgres() {
    let url = std::env::var("IDEM_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_PG_URL.into());
    // Probe first: an absent server is a skip (or a failure when services are required),
    // not a self-check failure.
    let probe = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(5))
        .connect(&url)
        .await;
    match probe {
        Ok(pool) => pool.close().await,
        Err(e) => return idem_conformance::skip_or_fail("PostgreSQL", &e),
    }
    let out = Command::new(env!("CARGO_BIN_EXE_idem-example-orders-lite"))
        .arg("self-check")
        .env("DATABASE_URL", &url)
        .output()
        .expect("the example binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "self-check failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stdout.contains("self-check passed"), "{stdout}");
    println!("{stdout}");
}
