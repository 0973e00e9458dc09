//! The `idem` binary as an operator runs it: exit codes and JSON reports, on real stores.

use std::process::{Command, Output};

mod common;
use common::{service_url, tcp_up};

fn idem(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .arg("--database-url")
        .arg(url)
        .args(args)
        .env_remove("IDEM_DATABASE_URL")
        .output()
        .expect("run idem")
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

fn check_drill_passes(url: &str) -> serde_json::Value {
    let out = idem(url, &["drill", "--duplicates", "64", "--json"]);
    let report = json(&out);
    assert!(out.status.success(), "drill failed: {report}");
    assert_eq!(report["executions"], 1);
    assert_eq!(report["replays"], 63);
    assert_eq!(report["replays_identical"], true);
    assert_eq!(report["mismatches"], 1);
    assert_eq!(report["unique_guard"], true);
    report
}

#[test]
fn drill_on_fresh_sqlite_passes_and_keys_show_finds_it() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("fresh/idem.db").display());
    let report = check_drill_passes(&url);

    let key = report["key"].as_str().unwrap();
    let out = idem(
        &url,
        &["keys", "show", key, "--tenant", "idem-drill", "--json"],
    );
    assert!(out.status.success());
    let rec = json(&out);
    assert_eq!(rec["state"], "SUCCEEDED");
    assert_eq!(rec["result_ref"], report["order_id"]);
    assert_eq!(rec["attempts"], 1);

    let missing = idem(
        &url,
        &["keys", "show", "no-such-key", "--tenant", "idem-drill"],
    );
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no record"));
}

#[test]
fn drill_reports_a_missing_unique_guard() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let url = format!("sqlite://{}", path.display());
    check_drill_passes(&url);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = idem_sqlite::SqliteStore::open_path(&path).await.unwrap();
        sqlx::query("DROP INDEX idem_records_scope_uq")
            .execute(store.pool())
            .await
            .unwrap();
    });
    let out = idem(&url, &["drill", "--duplicates", "8", "--json"]);
    assert!(!out.status.success());
    let report = json(&out);
    assert_eq!(report["unique_guard"], false);
    assert_eq!(report["passed"], false);
}

#[test]
fn bad_input_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    let out = idem(&url, &["keys", "show", "has space", "--tenant", "t"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("idempotency key"));
    let out = idem("mongodb://x", &["drill"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unsupported database URL"));
    let out = idem(&url, &["drill", "--duplicates", "0"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn drill_on_postgres_in_its_own_schema() {
    let Some(base) = service_url(
        "IDEM_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
        tcp_up,
        "PostgreSQL",
    ) else {
        return;
    };
    let schema = format!("idem_cli_{}", uuid::Uuid::now_v7().simple());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let pool = rt.block_on(async {
        let pool = sqlx::PgPool::connect(&base).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
            .execute(&pool)
            .await
            .unwrap();
        pool
    });
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}options=-c%20search_path%3D{schema}");
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let report = check_drill_passes(&url);
        assert_eq!(report["backend"], "postgres");
        // Leases on the same database.
        let out = idem(
            &url,
            &[
                "lock", "acquire", "inv", "--owner", "A", "--ttl", "30s", "--json",
            ],
        );
        assert!(out.status.success());
        let out = idem(
            &url,
            &["lock", "acquire", "inv", "--owner", "B", "--ttl", "30s"],
        );
        assert_eq!(out.status.code(), Some(1));
        // The guard check reads the live catalog.
        rt.block_on(async {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP INDEX {schema}.idem_records_scope_uq"
            )))
            .execute(&pool)
            .await
            .unwrap();
        });
        let out = idem(&url, &["drill", "--duplicates", "8", "--json"]);
        assert!(!out.status.success());
        assert_eq!(json(&out)["unique_guard"], false);
    }));
    rt.block_on(async {
        sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
            .execute(&pool)
            .await
            .unwrap();
    });
    if let Err(p) = outcome {
        std::panic::resume_unwind(p);
    }
}

#[test]
fn drill_on_redis() {
    let Some(url) = service_url(
        "IDEM_TEST_REDIS_URL",
        "redis://127.0.0.1:6379",
        tcp_up,
        "Redis",
    ) else {
        return;
    };
    let report = check_drill_passes(&url);
    assert_eq!(report["backend"], "redis");
    // Remove the drill's record: the server is shared.
    let scope = idem_core::Scope::new(
        idem_core::TenantId::new("idem-drill").unwrap(),
        idem_core::IdempotencyKey::new(report["key"].as_str().unwrap()).unwrap(),
    );
    let key = idem_redis::record_key(idem_redis::DEFAULT_PREFIX, &scope);
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_connection().unwrap();
    let removed: i64 = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
    assert_eq!(removed, 1, "drill record {key} not found");
}

#[test]
fn lock_commands_report_holders_and_refuse_non_holders() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    let out = idem(
        &url,
        &[
            "lock",
            "acquire",
            "inventory:S-204",
            "--owner",
            "A",
            "--ttl",
            "30s",
            "--json",
        ],
    );
    assert!(out.status.success());
    let a = json(&out);
    assert_eq!(a["owner"], "A");
    let token_a = a["token"].as_i64().unwrap();

    // B cannot take it, nor release A's lease.
    let out = idem(
        &url,
        &[
            "lock",
            "acquire",
            "inventory:S-204",
            "--owner",
            "B",
            "--ttl",
            "30s",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let out = idem(
        &url,
        &[
            "lock",
            "release",
            "inventory:S-204",
            "--owner",
            "B",
            "--token",
            &token_a.to_string(),
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not the holder"));
    let shown = json(&idem(&url, &["lock", "show", "inventory:S-204", "--json"]));
    assert_eq!(shown["holder"]["owner"], "A");

    let out = idem(
        &url,
        &[
            "lock",
            "release",
            "inventory:S-204",
            "--owner",
            "A",
            "--token",
            &token_a.to_string(),
        ],
    );
    assert!(out.status.success());
    let out = idem(
        &url,
        &[
            "lock",
            "acquire",
            "inventory:S-204",
            "--owner",
            "B",
            "--ttl",
            "30s",
            "--json",
        ],
    );
    assert!(out.status.success());
    assert!(json(&out)["token"].as_i64().unwrap() > token_a);
    let out = idem(
        &url,
        &[
            "lock",
            "force-release",
            "inventory:S-204",
            "--reason",
            "runbook",
            "--json",
        ],
    );
    assert!(out.status.success());
    let shown = json(&idem(&url, &["lock", "show", "inventory:S-204", "--json"]));
    assert!(shown["holder"].is_null());
    let kinds: Vec<String> = shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect();
    assert!(
        kinds.contains(&"ReleaseOwnerMismatch".to_string()),
        "{kinds:?}"
    );
    assert!(kinds.contains(&"ForceReleased".to_string()), "{kinds:?}");

    let out = idem(
        &url,
        &["lock", "acquire", "x", "--owner", "A", "--ttl", "3q"],
    );
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn day_100_audit_finds_the_archived_fingerprint() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    let drill = check_drill_passes(&url);
    let key = drill["key"].as_str().unwrap();
    let order = drill["order_id"].as_str().unwrap();
    let online = json(&idem(
        &url,
        &["keys", "show", key, "--tenant", "idem-drill", "--json"],
    ));

    let day_100 = (chrono::Utc::now() + chrono::Duration::days(100)).to_rfc3339();
    let out = idem(&url, &["sweep", "--now", &day_100, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sweep = json(&out);
    // A 100-day-old record passes every transition, in one write.
    assert_eq!(sweep["transitions"]["retry->replay"], 1);
    assert_eq!(sweep["transitions"]["replay->dispute"], 1);
    assert_eq!(sweep["transitions"]["dispute->archive"], 1);

    let out = idem(
        &url,
        &["keys", "show", key, "--tenant", "idem-drill", "--json"],
    );
    assert!(out.status.success());
    let archived = json(&out);
    assert_eq!(archived["tier"], "archive");
    assert_eq!(archived["fingerprint"], online["fingerprint"]);
    assert_eq!(archived["result_ref"], order);

    let out = idem(&url, &["keys", "audit", "--order", order, "--json"]);
    assert!(out.status.success());
    let found = json(&out);
    assert_eq!(found[0]["fingerprint"], online["fingerprint"]);
    let out = idem(&url, &["keys", "audit", "--order", "ord_unknown"]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn demo_incident_json_shows_eight_legacy_orders_and_one_idem_order() {
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["demo", "incident", "--json"])
        .env_remove("IDEM_DATABASE_URL")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = json(&out);
    assert_eq!(report["legacy"]["orders"], 8);
    assert_eq!(report["idem"]["orders"], 1);
    assert_eq!(report["idem"]["replays"], 7);
    let ids = report["idem"]["order_ids"].as_array().unwrap();
    assert!(ids.iter().all(|id| id == &ids[0]), "{ids:?}");
}

#[test]
fn freeze_and_unfreeze_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    let out = idem(
        &url,
        &[
            "freeze",
            "--scope",
            "user:U-7318",
            "--what",
            "payment-confirm,ticketing",
            "--json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(json(&out)["active"].as_array().unwrap().len(), 2);
    let out = idem(&url, &["unfreeze", "--scope", "user:U-7318", "--json"]);
    assert!(out.status.success());
    assert_eq!(json(&out)["active"].as_array().unwrap().len(), 0);
    let out = idem(&url, &["freeze", "--scope", "bogus"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("freeze scope"));
}

/// `idem serve` on `url` with one API key (acme), and the URL it listens on.
fn serve(url: &str) -> (std::process::Child, String) {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args([
            "--database-url",
            url,
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--api-key",
            "acme=secret-acme-1",
        ])
        .env_remove("IDEM_DATABASE_URL")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let base = first.rsplit(' ').next().unwrap().to_string();
    (child, base)
}

/// The same order created three times under one key: the three answers' order ids.
async fn three_creates(base: &str) -> Vec<serde_json::Value> {
    let client = reqwest::Client::new();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let resp = client
            .post(format!("{base}/v1/orders"))
            .bearer_auth("secret-acme-1")
            .header("Idempotency-Key", "confirm-page-1")
            .json(&serde_json::json!({"user_id": "U-7318", "show_id": "S-204", "quantity": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
        let body: serde_json::Value = resp.json().await.unwrap();
        ids.push(body["order_id"].clone());
    }
    ids
}

#[test]
fn serve_answers_duplicates_with_the_first_order() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    let (mut child, base) = serve(&url);
    assert!(base.starts_with("http://127.0.0.1:"), "{base}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ids = rt.block_on(three_creates(&base));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
}

/// `base` (a MySQL server URL) naming `database` instead of its own.
fn mysql_database_url(base: &str, database: &str) -> String {
    let (head, query) = base.split_once('?').unwrap_or((base, ""));
    let after_scheme = head.find("://").map_or(0, |i| i + 3);
    let host_end = head[after_scheme..]
        .find('/')
        .map_or(head.len(), |i| after_scheme + i);
    let sep = if query.is_empty() { "" } else { "?" };
    format!("{}/{database}{sep}{query}", &head[..host_end])
}

/// The order service on MySQL/MariaDB: `idem serve` migrates the ledgers and is ready,
/// duplicates get the first order, and `idem reconcile` reads the same database.
#[test]
fn serve_and_reconcile_on_mysql() {
    use sqlx::{Connection, Executor};
    let Some(server) = service_url(
        "IDEM_TEST_MYSQL_URL",
        "mysql://root@127.0.0.1:3306/test",
        tcp_up,
        "MySQL/MariaDB",
    ) else {
        return;
    };
    let database = format!("idem_cli_{}", uuid::Uuid::now_v7().simple());
    let rt = tokio::runtime::Runtime::new().unwrap();
    // The `mysql` driver of sqlx comes with idem-sql's default `mysql` feature.
    let admin = |sql: String| {
        let server = server.clone();
        rt.block_on(async move {
            let mut c = sqlx::MySqlConnection::connect(&server).await.unwrap();
            c.execute(sqlx::AssertSqlSafe(sql)).await.unwrap();
            c.close().await.unwrap();
        })
    };
    admin(format!(
        "CREATE DATABASE `{database}` CHARACTER SET utf8mb4"
    ));
    let url = mysql_database_url(&server, &database);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let (mut child, base) = serve(&url);
        let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            assert!(base.starts_with("http://127.0.0.1:"), "{base}");
            rt.block_on(async {
                let client = reqwest::Client::new();
                let ready = client.get(format!("{base}/readyz")).send().await.unwrap();
                assert_eq!(ready.status(), 200);
                let ready: serde_json::Value = ready.json().await.unwrap();
                assert_eq!(ready["backend"], "mysql");
                assert_eq!(
                    ready["schema"]["ledgers"],
                    ready["schema"]["ledgers_needed"]
                );
                assert_eq!(ready["schema"]["store"], ready["schema"]["store_needed"]);
                let ids = three_creates(&base).await;
                assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
            });
        }));
        child.kill().unwrap();
        child.wait().unwrap();
        if let Err(p) = served {
            std::panic::resume_unwind(p);
        }
        let out = idem(&url, &["reconcile", "--tenant", "acme", "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            json(&out)["passed"].as_bool().unwrap_or(false),
            "{}",
            json(&out)
        );
        let out = idem(&url, &["freeze", "--scope", "user:U-7318", "--json"]);
        assert!(out.status.success());
        assert_eq!(json(&out)["active"].as_array().unwrap().len(), 3);
        let out = idem(&url, &["unfreeze", "--scope", "user:U-7318", "--json"]);
        assert!(out.status.success());
        assert_eq!(json(&out)["active"].as_array().unwrap().len(), 0);
        let out = idem(&url, &["demo", "incident", "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let demo = json(&out);
        assert_eq!(demo["legacy"]["orders"], 8, "{demo}");
        assert_eq!(demo["idem"]["orders"], 1, "{demo}");
    }));
    admin(format!("DROP DATABASE IF EXISTS `{database}`"));
    if let Err(p) = outcome {
        std::panic::resume_unwind(p);
    }
}

#[test]
fn sweep_duty_outside_zero_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    for bad in ["0", "0.001", "1.5", "-1", "NaN", "half"] {
        let out = idem(&url, &["sweep", &format!("--duty={bad}")]);
        assert_eq!(out.status.code(), Some(2), "--duty {bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--duty"), "--duty {bad}: {err}");
    }
    let out = idem(&url, &["sweep", "--duty", "1", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn drill_logging(url: &str, env: &[(&str, &str)], extra: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idem"));
    cmd.arg("--database-url")
        .arg(url)
        .args(extra)
        .args(["drill", "--duplicates", "4", "--json"])
        .env_remove("IDEM_DATABASE_URL")
        .env_remove("IDEM_LOG")
        .env_remove("RUST_LOG")
        .env_remove("IDEM_LOG_FORMAT");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run idem")
}

#[test]
fn logs_follow_the_filter_variables_and_carry_no_escape_codes_off_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());

    // RUST_LOG alone is honoured; stderr is a pipe here, so no colour codes.
    let out = drill_logging(&url, &[("RUST_LOG", "debug")], &[]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.lines().count() > 0, "RUST_LOG=debug logged nothing");
    assert!(
        !err.contains('\u{1b}'),
        "escape codes in a piped log: {err}"
    );

    // IDEM_LOG wins over RUST_LOG.
    let out = drill_logging(&url, &[("RUST_LOG", "debug"), ("IDEM_LOG", "error")], &[]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");

    // One JSON object per line.
    let out = drill_logging(&url, &[("RUST_LOG", "debug")], &["--log-format", "json"]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.lines().count() > 0);
    for line in err.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(v["level"].is_string(), "{line}");
    }

    // A filter that does not parse is refused, naming the variable.
    let out = drill_logging(&url, &[("IDEM_LOG", "warn,[unclosed")], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("IDEM_LOG"));
}

#[test]
fn under_json_a_failure_is_a_json_error_too() {
    let out = idem("mongodb://nowhere/db", &["drill", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let v = json(&out);
    assert_eq!(v["error"]["kind"], "invalid_input", "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("unsupported database URL"));
    // Without --json: the line on stderr only.
    let out = idem("mongodb://nowhere/db", &["drill"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: "));
}

#[test]
fn completions_are_printed_for_a_shell() {
    for (shell, marker) in [
        ("bash", "_idem()"),
        ("zsh", "#compdef idem"),
        ("fish", "complete -c idem"),
    ] {
        let out = idem("sqlite://unused.db", &["completions", shell]);
        assert!(out.status.success(), "{shell}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(marker),
            "{shell}: {}",
            &text[..text.len().min(200)]
        );
        assert!(text.contains("reconcile"), "{shell} completes subcommands");
    }
    let out = idem("sqlite://unused.db", &["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2), "an unknown shell is refused");
}

/// The banner is best effort: a parent that stopped reading the server's stdout (a closed
/// pipe) must not take the server down with it.
#[test]
fn serve_keeps_running_when_nobody_reads_its_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["--database-url", &url, "serve", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .args(["--api-key", "acme=secret-acme-1"])
        .env_remove("IDEM_DATABASE_URL")
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let healthy = rt.block_on(async {
        let client = reqwest::Client::new();
        for _ in 0..200 {
            let answer = client
                .get(format!("http://127.0.0.1:{port}/healthz"))
                .send()
                .await;
            if answer.is_ok_and(|a| a.status().is_success()) {
                return true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        false
    });
    let still_running = child.try_wait().unwrap().is_none();
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(healthy && still_running, "server stopped: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `bench callgrind` counts a request's instructions and, with `--cache-sim`, its cache
/// misses: a keyed request through the gateway costs more of both than one it passes
/// through.
#[test]
fn bench_callgrind_counts_instructions_and_cache_misses() {
    let on_path = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("valgrind").is_file()));
    if !on_path {
        eprintln!(
            "SKIP bench_callgrind_counts_instructions_and_cache_misses: valgrind not on PATH"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    let run = |workload: &str| {
        let out = idem(
            &url,
            &[
                "bench",
                "callgrind",
                "--workload",
                workload,
                "--requests",
                "20",
                "--connections",
                "1",
                "--cache-sim",
                "--top",
                "0",
                "--json",
            ],
        );
        let report = json(&out);
        assert!(out.status.success(), "{report}");
        report
    };
    let pass = run("pass");
    let fresh = run("fresh");
    for r in [&pass, &fresh] {
        let misses = &r["cache_misses_per_request"];
        assert!(misses["i1"].as_f64().unwrap() > 0.0, "{r}");
        assert!(misses["d1"].as_f64().unwrap() > 0.0, "{r}");
        assert!(misses["ll"].as_f64().unwrap() >= 0.0, "{r}");
    }
    let per = |r: &serde_json::Value, f: &str| r[f].as_f64().unwrap();
    assert!(
        per(&fresh, "instructions_per_request") > per(&pass, "instructions_per_request"),
        "{fresh} {pass}"
    );
    assert!(
        fresh["cache_misses_per_request"]["i1"].as_f64()
            > pass["cache_misses_per_request"]["i1"].as_f64(),
        "{fresh} {pass}"
    );
}
