//! Runs `examples/python-orders/self-check` (the Python service against PostgreSQL) in a
//! schema this test migrates and drops. Skips visibly without PostgreSQL or Python (and
//! its packages); fails instead under `IDEM_REQUIRE_SERVICES=1`.

use std::process::Command;

use idem_postgres::{PgOptions, PgStore};
use sqlx::{Connection, Executor, PgConnection};

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

#[tokio::test]
async fn python_orders_self_check() {
    let url = std::env::var("IDEM_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_URL.into());
    if let Err(e) = Command::new("python3").arg("--version").output() {
        idem_conformance::skip_or_fail("python3", &e);
        return;
    }
    if let Err(e) = PgConnection::connect(&url).await {
        idem_conformance::skip_or_fail("PostgreSQL", &e);
        return;
    }
    let schema = format!("idem_py_{}", uuid::Uuid::now_v7().simple());
    let mut options = PgOptions::default();
    options.schema = Some(schema.clone());
    options.max_connections = 1;
    let store = PgStore::connect(&url, options).await.expect("connect");
    store.migrate().await.expect("migrate");
    store.pool().close().await;

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/self-check");
    let out = tokio::task::spawn_blocking({
        let (url, schema) = (url.clone(), schema.clone());
        move || {
            Command::new(script)
                .env("IDEM_TEST_POSTGRES_URL", url)
                .env("IDEM_PYTHON_ORDERS_SCHEMA", schema)
                .output()
        }
    })
    .await
    .expect("join")
    .expect("run self-check");

    let mut conn = PgConnection::connect(&url).await.expect("connect");
    conn.execute(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
    )))
    .await
    .expect("drop schema");

    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    if out.status.code() == Some(77) {
        idem_conformance::skip_or_fail("Python venv with flask and psycopg", &stderr.trim());
        return;
    }
    assert!(
        out.status.success(),
        "self-check failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
}
