//! `idem serve` with a misbehaving client or a failing store: request heads and bodies
//! read in time, internal errors logged and not answered, free text that cannot forge a
//! log line, request ids that are the server's own.
//!
//! The `idem` binary in its own process on a fresh SQLite file, spoken to by a real HTTP
//! client (and by raw TCP where a client misbehaves). Each test has its own directory and
//! ports (the server binds 127.0.0.1:0 and says where); a process still running at the
//! end is killed.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

mod common;

use common::serve::*;

// ---------------------------------------------------------------------------------------
// Item 7: request head and body read timeouts

const HALF_HEAD: &[u8] = b"POST /v1/orders HTTP/1.1\r\nHost: idem\r\nAuthoriz";

#[test]
fn a_half_sent_request_head_is_closed_after_the_header_read_timeout() {
    let db = db();
    let key = format!("t={KEY}");
    let s = Serve::start(
        &db,
        &["--api-key", &key, "--header-read-timeout", "1s"],
        &[],
    );
    let (_, took, closed) = raw(&s.addr, HALF_HEAD, Duration::from_secs(8));
    assert!(closed, "a half-sent head was held open for {took:?}");
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(5),
        "closed after {took:?}, not about 1 s"
    );
    let rt = runtime();
    let ok = rt.block_on(get(&client(), s.url("/healthz"), None));
    assert_eq!(ok.status, 200, "the server still serves others");
}

#[test]
fn the_default_header_read_timeout_is_10_seconds() {
    let db = db();
    let key = format!("t={KEY}");
    let s = Serve::start(&db, &["--api-key", &key], &[]);
    let (_, took, closed) = raw(&s.addr, HALF_HEAD, Duration::from_secs(25));
    assert!(closed, "a half-sent head was held open for {took:?}");
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(16),
        "closed after {took:?}, not about 10 s"
    );
}

#[test]
fn a_stalled_body_gets_408_problem_json_and_its_connection_closed() {
    let db = db();
    let key = format!("t={KEY}");
    let s = Serve::start(
        &db,
        &[
            "--api-key",
            &key,
            "--admin-token",
            ADMIN,
            "--body-read-timeout",
            "1s",
        ],
        &[],
    );
    let keyed = format!(
        "POST /v1/orders HTTP/1.1\r\nHost: idem\r\nAuthorization: Bearer {KEY}\r\n\
         Idempotency-Key: stall-1\r\nContent-Type: application/json\r\n\
         Content-Length: 100\r\n\r\n{{\"user_id\":"
    );
    let admin = format!(
        "POST /v1/admin/freezes HTTP/1.1\r\nHost: idem\r\nAuthorization: Bearer {ADMIN}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"scope\":"
    );
    for request in [keyed, admin] {
        let (answer, took, closed) = raw(&s.addr, request.as_bytes(), Duration::from_secs(8));
        assert!(
            answer.starts_with("HTTP/1.1 408"),
            "after {took:?}: {answer:?}"
        );
        let lower = answer.to_ascii_lowercase();
        assert!(
            lower.contains("content-type: application/problem+json"),
            "{answer}"
        );
        assert!(answer.contains("/request-timeout\""), "{answer}");
        assert!(answer.contains("\"request_id\""), "{answer}");
        assert!(closed, "the connection stayed open after the 408");
        assert!(took < Duration::from_secs(5), "{took:?}");
    }
    assert_eq!(key_state(&db.url, "stall-1"), None, "nothing was recorded");

    // Without a credential nothing is buffered: refused at once, not after the timeout.
    for (path, status) in [("/v1/orders", "401"), ("/v1/admin/freezes", "401")] {
        let anonymous = format!(
            "POST {path} HTTP/1.1\r\nHost: idem\r\nContent-Type: application/json\r\n\
             Content-Length: 100\r\n\r\n{{\"x\":"
        );
        let (answer, took, _) = raw(&s.addr, anonymous.as_bytes(), Duration::from_secs(8));
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{path} after {took:?}: {answer:?}"
        );
        assert!(took < Duration::from_millis(900), "{path}: {took:?}");
    }
}

// ---------------------------------------------------------------------------------------
// Item 10: internal errors are logged, not answered

/// A trigger that fails every insert into `table` with `message`: the store answers
/// with an error whose text must not reach the client.
fn break_inserts(path: &Path, table: &str, message: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        use sqlx::Connection;
        let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
            .await
            .unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE TRIGGER break_{table} BEFORE INSERT ON {table} \
             BEGIN SELECT RAISE(ABORT, '{message}'); END"
        )))
        .execute(&mut conn)
        .await
        .unwrap();
        conn.close().await.unwrap();
    });
}

#[test]
fn internal_errors_answer_a_stable_detail_and_the_request_id() {
    let db = db();
    let key = format!("t={KEY}");
    let s = Serve::start(&db, &["--api-key", &key], &[]);
    let rt = runtime();
    let http = client();
    let order = json!({"user_id": "U-1", "show_id": "S-204", "quantity": 1});

    // The business write fails (the orders ledger).
    break_inserts(&db.path, "orders", "secret-ledger-text");
    let r = rt.block_on(async {
        reply(
            http.post(s.url("/v1/orders"))
                .bearer_auth(KEY)
                .header("Idempotency-Key", "leak-1")
                .header("x-request-id", "req-abc-123")
                .json(&order)
                .send()
                .await
                .unwrap(),
        )
        .await
    });
    assert_eq!(r.status, 500, "{}", r.text);
    // Our own request id, not the client's; the client's is logged beside it.
    let id = r.headers["x-request-id"].to_str().unwrap().to_owned();
    assert_ne!(id, "req-abc-123");
    assert_eq!(r.body["request_id"], id.as_str(), "{}", r.text);
    for leak in ["secret-ledger-text", "database", "sqlite", "error returned"] {
        assert!(
            !r.text.to_lowercase().contains(leak),
            "{leak} in {}",
            r.text
        );
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while !s.stderr().lines().any(|l| {
        l.contains("secret-ledger-text")
            && l.contains(&format!("request_id={id} "))
            && l.contains("client_request_id=\"req-abc-123\"")
    }) {
        assert!(
            Instant::now() < deadline,
            "the error is not logged with its request id:\n{}",
            s.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // The idempotency store itself fails; a request id the client cannot be trusted
    // with (too long, not visible ASCII) is replaced.
    break_inserts(&db.path, "idem_records", "secret-claim-text");
    for sent in ["x".repeat(200), "has spaces in it".to_owned()] {
        let r = rt.block_on(async {
            reply(
                http.post(s.url("/v1/orders"))
                    .bearer_auth(KEY)
                    .header("Idempotency-Key", "leak-2")
                    .header("x-request-id", sent.as_str())
                    .json(&order)
                    .send()
                    .await
                    .unwrap(),
            )
            .await
        });
        assert_eq!(r.status, 500, "{}", r.text);
        assert!(!r.text.contains("secret-claim-text"), "{}", r.text);
        let id = r.headers["x-request-id"].to_str().unwrap();
        assert_ne!(id, sent);
        assert!(!id.is_empty() && id.len() <= 64, "{id}");
        assert_eq!(r.body["request_id"], id, "{}", r.text);
    }
}

// ---------------------------------------------------------------------------------------
// Free text from the admin API cannot forge a log line

#[test]
fn admin_free_text_with_control_characters_is_refused_and_logged_quoted() {
    let db = db();
    let key = format!("t={KEY}");
    let s = Serve::start(&db, &["--api-key", &key], &[("IDEM_ADMIN_TOKEN", ADMIN)]);
    let rt = runtime();
    let http = client();
    rt.block_on(async {
        let forged = [
            (
                "/v1/admin/freezes",
                json!({"scope": "user:U-1", "what": "ticketing", "reason": "x\nINFO forged"}),
                "reason",
            ),
            (
                "/v1/admin/freezes",
                json!({"scope": "user:U-1", "what": "ticketing", "actor": "ops\r\nWARN forged"}),
                "actor",
            ),
            (
                "/v1/admin/unfreeze",
                json!({"scope": "user:U-1", "what": "ticketing", "actor": "ops\nERROR forged"}),
                "actor",
            ),
        ];
        for (path, body, field) in forged {
            let r = post(&http, s.url(path), ADMIN, None, &body).await;
            assert_eq!(r.status, 422, "{path} {body}: {}", r.text);
            assert_eq!(
                r.body["type"],
                "https://idem.dev/problems/orders/invalid-field"
            );
            assert_eq!(r.body["field"], field, "{}", r.text);
        }
        // A malformed tenant is the caller's mistake too, not a server error.
        let r = post(
            &http,
            s.url("/v1/admin/freezes"),
            ADMIN,
            None,
            &json!({"scope": "user:U-1", "what": "ticketing", "tenant": "no such/tenant"}),
        )
        .await;
        assert_eq!(r.status, 422, "{}", r.text);
        let listed = get(&http, s.url("/v1/admin/freezes"), Some(ADMIN)).await;
        assert_eq!(listed.body["history"], json!([]), "nothing was frozen");

        let r = post(
            &http,
            s.url("/v1/admin/freezes"),
            ADMIN,
            None,
            &json!({"scope": "user:U-1 x", "what": "ticketing",
                    "reason": "disk \"full\" on db-2", "actor": "ana b"}),
        )
        .await;
        assert_eq!(r.status, 201, "{}", r.text);
    });
    let log = wait_for_log(&s, " frozen ");
    let line = log.lines().find(|l| l.contains(" frozen ")).unwrap();
    assert!(
        line.contains(r#"reason="disk \"full\" on db-2""#)
            && line.contains(r#"by="ana b""#)
            && line.contains(r#"scope="user:U-1 x""#),
        "{line}"
    );
    for l in log.lines() {
        let l = l.trim_start();
        assert!(
            !(l.starts_with("INFO forged")
                || l.starts_with("WARN forged")
                || l.starts_with("ERROR forged")),
            "a forged line:\n{log}"
        );
    }
    assert!(!log.contains("forged"), "{log}");
}

// ---------------------------------------------------------------------------------------
// Request ids are the server's own

#[test]
fn every_request_gets_its_own_request_id_and_the_clients_is_logged_beside_it() {
    let db = db();
    let key = format!("t={KEY}");
    let s = Serve::start(&db, &["--api-key", &key], &[("IDEM_ADMIN_TOKEN", ADMIN)]);
    let rt = runtime();
    let http = client();
    let ids: Vec<String> = rt.block_on(async {
        let mut ids = Vec::new();
        for user in ["user:U-1", "user:U-2"] {
            let r = reply(
                http.post(s.url("/v1/admin/freezes"))
                    .bearer_auth(ADMIN)
                    .header("x-request-id", "same-id-1")
                    .json(&json!({"scope": user, "what": "ticketing"}))
                    .send()
                    .await
                    .unwrap(),
            )
            .await;
            assert_eq!(r.status, 201, "{}", r.text);
            ids.push(r.headers["x-request-id"].to_str().unwrap().to_owned());
        }
        for _ in 0..2 {
            let r = reply(
                http.get(s.url("/healthz"))
                    .header("x-request-id", "same-id-1")
                    .send()
                    .await
                    .unwrap(),
            )
            .await;
            ids.push(r.headers["x-request-id"].to_str().unwrap().to_owned());
        }
        ids
    });
    let mut distinct = ids.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), ids.len(), "{ids:?}");
    assert!(!ids.iter().any(|id| id == "same-id-1"), "{ids:?}");
    // The freezes' log lines carry each request's own id and the client's beside it.
    wait_for_log(&s, &format!("request_id={} ", ids[1]));
    let log = s.stderr();
    for id in &ids[..2] {
        let line = log
            .lines()
            .find(|l| l.contains(&format!("request_id={id} ")))
            .unwrap_or_else(|| panic!("no line for {id}:\n{log}"));
        assert!(line.contains("client_request_id=\"same-id-1\""), "{line}");
    }
}
