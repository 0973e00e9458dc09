//! `kill -9` between the commit and the response, with a real server process.
//!
//! The test binary runs twice: as the parent (no env var), and re-invoked by the parent
//! as the server child (`IDEM_ORDERS_KILL9_CHILD` set). The first child has a fault hook
//! that sends itself SIGKILL right after an idempotent create committed (order, hold,
//! outbox row and idempotency record in one transaction) and before the response is
//! written. The client's request fails; the parent restarts the server on the same
//! database, and the client's retry with the same key returns the original order.
//! Runs on SQLite and on PostgreSQL (skipped without a server unless
//! `IDEM_REQUIRE_SERVICES=1`). Unix only (uses `kill`).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use idem_orders::{ApiKey, Faults, ServeConfig, ServiceOptions};
use serde_json::{json, Value};
use sqlx::{Connection, Executor, PgConnection};

const CHILD: &str = "IDEM_ORDERS_KILL9_CHILD";
const URL: &str = "IDEM_ORDERS_KILL9_URL";
const SCHEMA: &str = "IDEM_ORDERS_KILL9_SCHEMA";
const FAULT: &str = "IDEM_ORDERS_KILL9_FAULT";
const TOKEN: &str = "kill9-secret-key";
const KEY: &str = "confirm:U-7318:S-204:kill9";

fn main() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    if std::env::var_os(CHILD).is_some() {
        rt.block_on(child());
        return;
    }
    if !cfg!(unix) {
        println!("test kill9_after_commit_before_response ... skipped (not unix)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}", dir.path().join("kill9.db").display());
    rt.block_on(parent(&sqlite, None));
    println!("test kill9_after_commit_before_response::sqlite ... ok");

    let pg = std::env::var("IDEM_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    match rt.block_on(PgConnection::connect(&pg)) {
        Err(e) => {
            idem_conformance::skip_or_fail("PostgreSQL", &e);
            println!("test kill9_after_commit_before_response::postgres ... skipped");
        }
        Ok(conn) => {
            rt.block_on(async { drop(conn.close().await) });
            let schema = format!("idem_orders_t_{}", uuid::Uuid::now_v7().simple());
            let outcome = std::panic::catch_unwind(|| rt.block_on(parent(&pg, Some(&schema))));
            rt.block_on(async {
                let mut c = PgConnection::connect(&pg).await.unwrap();
                c.execute(sqlx::AssertSqlSafe(format!(
                    "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
                )))
                .await
                .unwrap();
            });
            if let Err(p) = outcome {
                std::panic::resume_unwind(p);
            }
            println!("test kill9_after_commit_before_response::postgres ... ok");
        }
    }
}

/// The server process. Prints `LISTENING addr`, then serves until killed.
async fn child() {
    let url = std::env::var(URL).expect("database url");
    let mut faults = Faults::default();
    if std::env::var_os(FAULT).is_some() {
        faults.after_create_commit = Some(Arc::new(|| {
            // SIGKILL, like `kill -9`: no destructor, no flush, no response.
            let _ = Command::new("kill")
                .args(["-9", &std::process::id().to_string()])
                .status();
            std::thread::sleep(Duration::from_secs(10));
            unreachable!("still alive after kill -9");
        }));
    }
    let mut options = ServiceOptions {
        pg_schema: std::env::var(SCHEMA).ok(),
        ..ServiceOptions::default()
    };
    options.orders.faults = faults;
    let server = idem_orders::bind(ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        database_url: Some(url),
        api_keys: vec![format!("t1={TOKEN}").parse::<ApiKey>().unwrap()],
        admin_token: None,
        nats_url: None,
        tls: None,
        options,
    })
    .await
    .expect("child server starts");
    println!("LISTENING {}", server.addr());
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    server.wait().await.expect("serve");
}

struct ChildServer {
    process: Child,
    addr: SocketAddr,
}

fn spawn(url: &str, schema: Option<&str>, fault: bool) -> ChildServer {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.env(CHILD, "1")
        .env(URL, url)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(s) = schema {
        cmd.env(SCHEMA, s);
    }
    if fault {
        cmd.env(FAULT, "1");
    }
    let mut process = cmd.spawn().expect("spawn the server");
    let stdout = process.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(addr) = line.strip_prefix("LISTENING ") {
                let _ = tx.send(addr.parse::<SocketAddr>().unwrap());
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the server reports its address");
    ChildServer { process, addr }
}

async fn parent(url: &str, schema: Option<&str>) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let body =
        json!({"user_id": "U-7318", "show_id": "S-204", "quantity": 2, "client_session": "kill9"});

    // 1. The server dies after the commit, before the response.
    let mut first = spawn(url, schema, true);
    let lost = http
        .post(format!("http://{}/v1/orders", first.addr))
        .bearer_auth(TOKEN)
        .header("Idempotency-Key", KEY)
        .json(&body)
        .send()
        .await;
    assert!(lost.is_err(), "the response must be lost, got {lost:?}");
    let status = first.process.wait().unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "killed by SIGKILL: {status:?}");
    }
    assert!(!status.success());

    // 2. A new process on the same database.
    let mut second = spawn(url, schema, false);
    let base = format!("http://{}", second.addr);
    // The gateway's state query already knows the key ended, with a result reference.
    let state: Value = http
        .get(format!(
            "{base}/v1/idempotency-keys/{}",
            KEY.replace('/', "%2F")
        ))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(state["state"], "SUCCEEDED", "{state:#}");
    let committed_id = state["order_id"]
        .as_str()
        .expect("result reference")
        .to_owned();

    // 3. The client's retry with the same key gets the original order.
    let retry = http
        .post(format!("{base}/v1/orders"))
        .bearer_auth(TOKEN)
        .header("Idempotency-Key", KEY)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let retried: Value = retry.json().await.unwrap();
    assert_eq!(retried["order_id"], committed_id.as_str());
    assert_eq!(retried["status"], "pending_payment");
    let list: Value = http
        .get(format!("{base}/v1/orders?user_id=U-7318"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let orders = list["orders"].as_array().unwrap();
    assert_eq!(orders.len(), 1, "one order: {list:#}");
    assert_eq!(orders[0]["order_id"], committed_id.as_str());
    assert_eq!(orders[0]["hold"]["status"], "held");
    second.process.kill().unwrap();
    second.process.wait().unwrap();
}
