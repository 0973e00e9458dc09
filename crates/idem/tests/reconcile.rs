//! `idem reconcile --apply` killed half-way (the process aborts after N applied actions,
//! like `kill -9`) and run again ends in exactly the ledgers of an uninterrupted run on a
//! copy of the same database; a third run applies nothing. SQLite and PostgreSQL.

use std::process::{Command, Output};

use sqlx::{Connection, Executor, PgConnection, SqliteConnection};

const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

fn idem(url: &str, args: &[&str], abort_after: Option<usize>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idem"));
    cmd.arg("--database-url")
        .arg(url)
        .args(args)
        .env_remove("IDEM_DATABASE_URL")
        .env_remove("IDEM_RECONCILE_ABORT_AFTER");
    if let Some(n) = abort_after {
        cmd.env("IDEM_RECONCILE_ABORT_AFTER", n.to_string());
    }
    cmd.output().expect("run idem")
}

fn ok(out: &Output) -> &Output {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout {}\nstderr {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): stdout {} stderr {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The ledgers, without the ids and times each run mints for itself.
const SNAPSHOT: [&str; 8] = [
    "SELECT order_id || '|' || status || '|' || CAST(version AS TEXT) FROM orders",
    "SELECT order_id || '|' || kind || '|' || provider_key || '|' || CAST(amount_cents AS TEXT) FROM payments",
    "SELECT provider_key || '|' || kind || '|' || CAST(amount_cents AS TEXT) || '|' || CAST(calls AS TEXT) FROM psp_operations",
    "SELECT order_id || '|' || status FROM inventory_holds",
    "SELECT i.tenant_id || '|' || i.show_id || '|' || CAST(i.available + COALESCE((SELECT \
     SUM(b.available) FROM inventory_buckets b WHERE b.tenant_id = i.tenant_id \
     AND b.show_id = i.show_id), 0) AS TEXT) FROM inventory i",
    "SELECT order_id || '|' || topic FROM outbox_messages",
    "SELECT consumer || '|' || business_key || '|' || order_id FROM consumer_processed",
    "SELECT order_id || '|' || COALESCE(from_status, '-') || '|' || to_status || '|' || event FROM order_transitions",
];

enum Db {
    Sqlite(std::path::PathBuf),
    Pg { url: String, schema: String },
}

impl Db {
    fn url(&self) -> String {
        match self {
            Db::Sqlite(p) => format!("sqlite://{}", p.display()),
            Db::Pg { url, schema } => format!("{url}?options[search_path]={schema}"),
        }
    }

    async fn snapshot(&self) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        for q in SNAPSHOT {
            let mut rows: Vec<String> = match self {
                Db::Sqlite(p) => {
                    let mut c = SqliteConnection::connect(&format!("sqlite://{}", p.display()))
                        .await
                        .unwrap();
                    sqlx::query_scalar(q).fetch_all(&mut c).await.unwrap()
                }
                Db::Pg { .. } => {
                    let mut c = PgConnection::connect(&self.url()).await.unwrap();
                    sqlx::query_scalar(q).fetch_all(&mut c).await.unwrap()
                }
            };
            rows.sort();
            out.push(rows);
        }
        out
    }
}

/// A copy of `from` (the whole database) at `to`.
async fn copy(from: &Db, to: &Db) {
    match (from, to) {
        (Db::Sqlite(a), Db::Sqlite(b)) => {
            let mut c = SqliteConnection::connect(&format!("sqlite://{}", a.display()))
                .await
                .unwrap();
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "VACUUM INTO '{}'",
                b.display()
            )))
            .execute(&mut c)
            .await
            .unwrap();
        }
        (Db::Pg { url, schema: a }, Db::Pg { schema: b, .. }) => {
            let mut c = PgConnection::connect(url).await.unwrap();
            c.execute(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {b}")))
                .await
                .unwrap();
            let tables: Vec<String> =
                sqlx::query_scalar("SELECT tablename::text FROM pg_tables WHERE schemaname = $1")
                    .bind(a)
                    .fetch_all(&mut c)
                    .await
                    .unwrap();
            for t in tables {
                c.execute(sqlx::AssertSqlSafe(format!(
                    "CREATE TABLE {b}.{t} (LIKE {a}.{t} INCLUDING ALL)"
                )))
                .await
                .unwrap();
                c.execute(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO {b}.{t} OVERRIDING SYSTEM VALUE SELECT * FROM {a}.{t}"
                )))
                .await
                .unwrap();
            }
            // Views (the lease evidence is one), on the copied tables.
            let views: Vec<(String, String)> = sqlx::query_as(
                "SELECT viewname::text, definition FROM pg_views WHERE schemaname = $1",
            )
            .bind(a)
            .fetch_all(&mut c)
            .await
            .unwrap();
            for (v, definition) in views {
                let definition = definition.replace(&format!("{a}."), &format!("{b}."));
                c.execute(sqlx::AssertSqlSafe(format!(
                    "CREATE VIEW {b}.{v} AS {definition}"
                )))
                .await
                .unwrap();
            }
            // Identity columns got fresh sequences: move them past the copied rows.
            let identities: Vec<(String, String)> = sqlx::query_as(
                "SELECT table_name::text, column_name::text FROM information_schema.columns \
                 WHERE table_schema = $1 AND is_identity = 'YES'",
            )
            .bind(b)
            .fetch_all(&mut c)
            .await
            .unwrap();
            for (t, col) in identities {
                c.execute(sqlx::AssertSqlSafe(format!(
                    "SELECT setval(pg_get_serial_sequence('{b}.{t}', '{col}'), \
                         COALESCE((SELECT MAX({col}) FROM {b}.{t}), 0) + 1, false)"
                )))
                .await
                .unwrap();
            }
        }
        _ => unreachable!(),
    }
}

async fn kill_half_way_then_rerun(a: Db, b: Db) {
    let (url_a, url_b) = (a.url(), b.url());
    ok(&idem(&url_a, &["demo", "incident"], None));
    ok(&idem(
        &url_a,
        &["freeze", "--scope", "user:U-7318", "--tenant", "legacy"],
        None,
    ));
    copy(&a, &b).await;
    let plan = json(ok(&idem(
        &url_a,
        &["reconcile", "--tenant", "legacy", "--json"],
        None,
    )));
    assert_eq!(plan["clusters"].as_array().unwrap().len(), 1);
    assert_eq!(plan["applied"], 0);

    // Uninterrupted, on the copy.
    let whole = json(ok(&idem(
        &url_b,
        &["reconcile", "--tenant", "legacy", "--apply", "--json"],
        None,
    )));
    let total = whole["applied"].as_u64().unwrap();
    assert_eq!(total, 22, "8 stops, 1 refund, 6 cancels, 7 releases");
    assert_eq!(whole["passed"], true);

    // Killed after 9 actions (in the middle of the duplicates), then rerun.
    let killed = idem(
        &url_a,
        &["reconcile", "--tenant", "legacy", "--apply", "--json"],
        Some(9),
    );
    assert!(!killed.status.success(), "the process was aborted");
    assert!(killed.stdout.is_empty(), "it died before reporting");
    let half = a.snapshot().await;
    assert_ne!(half, b.snapshot().await, "killed half-way, not at the end");
    let rest = json(ok(&idem(
        &url_a,
        &["reconcile", "--tenant", "legacy", "--apply", "--json"],
        None,
    )));
    assert_eq!(
        rest["applied"].as_u64().unwrap(),
        total - 9,
        "the rerun completes exactly the rest"
    );
    assert_eq!(rest["passed"], true);
    assert_eq!(a.snapshot().await, b.snapshot().await, "same final ledgers");

    // And a third run changes nothing.
    let again = json(ok(&idem(
        &url_a,
        &["reconcile", "--tenant", "legacy", "--apply", "--json"],
        None,
    )));
    assert_eq!(again["applied"], 0);
    assert_eq!(a.snapshot().await, b.snapshot().await);

    // The report page.
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("incident.html");
    ok(&idem(
        &url_a,
        &[
            "reconcile",
            "--tenant",
            "legacy",
            "--html",
            page.to_str().unwrap(),
        ],
        None,
    ));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("ledger check passed"), "{html}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_kill_half_way_then_rerun() {
    let dir = tempfile::tempdir().unwrap();
    kill_half_way_then_rerun(
        Db::Sqlite(dir.path().join("a.db")),
        Db::Sqlite(dir.path().join("b.db")),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_kill_half_way_then_rerun() {
    let url = std::env::var("IDEM_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_PG_URL.into());
    let mut admin = match PgConnection::connect(&url).await {
        Ok(c) => c,
        Err(e) => {
            idem_conformance::skip_or_fail("PostgreSQL", &e);
            return;
        }
    };
    let id = uuid::Uuid::now_v7().simple().to_string();
    let (sa, sb) = (format!("idem_rec_a_{id}"), format!("idem_rec_b_{id}"));
    admin
        .execute(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {sa}")))
        .await
        .unwrap();
    let run = tokio::spawn(kill_half_way_then_rerun(
        Db::Pg {
            url: url.clone(),
            schema: sa.clone(),
        },
        Db::Pg {
            url: url.clone(),
            schema: sb.clone(),
        },
    ))
    .await;
    for s in [&sa, &sb] {
        let _ = admin
            .execute(sqlx::AssertSqlSafe(format!(
                "DROP SCHEMA IF EXISTS {s} CASCADE"
            )))
            .await;
    }
    if let Err(e) = run {
        std::panic::resume_unwind(e.into_panic());
    }
}
