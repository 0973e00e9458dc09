//! Restart: the server is a separate process (this test binary re-run as a child); it is
//! killed and a new one started on the same SQLite file. Replays still return the first
//! result.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use idem_http::{IdempotencyConfig, IdempotencyLayer};
use serde_json::json;

const CHILD_DB: &str = "IDEM_HTTP_TEST_CHILD_DB";

/// Not a test: the server process the restart test starts.
#[tokio::test]
#[ignore = "helper: run by restart_keeps_replaying_the_first_result as a separate process"]
async fn child_server() {
    let Ok(db) = std::env::var(CHILD_DB) else {
        return;
    };
    let store = idem_sqlite::SqliteStore::open_path(db).await.unwrap();
    let layer = IdempotencyLayer::new(store, auth()).with_config(IdempotencyConfig::default());
    let (base, task) = serve_router(app(Arc::default()).layer(layer)).await;
    println!("\nLISTENING {base}");
    task.await.unwrap();
}

struct ChildServer {
    child: Child,
    base: String,
}

impl ChildServer {
    fn start(db: &Path) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "child_server",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_DB, db)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if let Some(at) = line.find("LISTENING ") {
                    let _ = tx.send(line[at + "LISTENING ".len()..].trim().to_owned());
                }
            }
        });
        let base = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the child server started");
        Self { child, base }
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn restart_keeps_replaying_the_first_result() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("idem.db");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = reqwest::Client::new();
    let body = json!({"user_id": "U-7318", "show_id": "S-204"});

    let first_server = ChildServer::start(&db);
    let pid = first_server.child.id();
    let url = format!("{}/v1/orders", first_server.base);
    let first = rt.block_on(send(order(&client, &url, ALICE, "restart-1", &body)));
    assert_eq!((first.status, first.replayed()), (201, false));
    drop(first_server); // SIGKILL: no graceful shutdown

    let second_server = ChildServer::start(&db);
    assert_ne!(second_server.child.id(), pid, "a new process");
    let url = format!("{}/v1/orders", second_server.base);
    let replay = rt.block_on(send(order(&client, &url, ALICE, "restart-1", &body)));
    assert_eq!((replay.status, replay.replayed()), (201, true));
    assert_eq!(replay.body, first.body, "the first result, same order id");
    assert_eq!(replay.header("location"), first.header("location"));
    let changed = rt.block_on(send(order(
        &client,
        &url,
        ALICE,
        "restart-1",
        &json!({"x": 1}),
    )));
    assert_eq!(
        changed.status, 422,
        "the fingerprint survived the restart too"
    );
}
