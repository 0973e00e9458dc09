//! The console of `idem serve`: a correct token always logs in while failures are
//! throttled per client, and its cookie is secure behind a TLS-terminating proxy.
//!
//! The `idem` binary in its own process on a fresh SQLite file, spoken to by a real HTTP
//! client (and by raw TCP where a client misbehaves). Each test has its own directory and
//! ports (the server binds 127.0.0.1:0 and says where); a process still running at the
//! end is killed.

use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::serve::*;

// ---------------------------------------------------------------------------------------
// The console's login: a correct token always logs in; failures throttled per client

/// A client that shows the console's 303s instead of following them.
fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Posts the console's login form, as from `forwarded_for` when given. Answers the
/// status and the `Set-Cookie` header.
async fn console_login(
    http: &reqwest::Client,
    s: &Serve,
    token: &str,
    forwarded_for: Option<&str>,
) -> (u16, String) {
    let body = format!("operator=ana&token={token}");
    let mut req = http
        .post(s.url("/console/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body);
    if let Some(from) = forwarded_for {
        req = req.header("x-forwarded-for", from);
    }
    let r = req.send().await.expect("login");
    let cookie = r
        .headers()
        .get("set-cookie")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (r.status().as_u16(), cookie)
}

fn logged_in((status, cookie): &(u16, String)) -> bool {
    *status == 303 && cookie.starts_with("idem_console=") && !cookie.contains("Max-Age=0")
}

/// A flood of wrong logins (about 50 a second for 8 s, from 60 forwarded addresses and
/// from the proxy's own) does not lock the operator out: each of its logins succeeds,
/// through the proxy and from the proxy's address alike, while failures are throttled
/// per address and in all.
#[test]
fn the_operator_logs_in_during_a_flood_of_wrong_logins() {
    let db = db();
    let key = format!("t={KEY}");
    let s = Arc::new(Serve::start(
        &db,
        &["--api-key", &key, "--trusted-proxies", "127.0.0.1"],
        &[("IDEM_ADMIN_TOKEN", ADMIN)],
    ));
    let rt = runtime();
    rt.block_on(async {
        let http = no_redirects();
        let started = Instant::now();
        let flood_for = Duration::from_secs(8);
        let flood = tokio::spawn({
            let (http, s) = (http.clone(), s.clone());
            async move {
                let mut tick = tokio::time::interval(Duration::from_millis(20));
                let mut sent = Vec::new();
                let mut n = 0usize;
                while started.elapsed() < flood_for {
                    tick.tick().await;
                    // One in five from the proxy's own address, the rest forwarded.
                    let from = (!n.is_multiple_of(5)).then(|| format!("198.51.100.{}", n % 60 + 1));
                    let (http, s) = (http.clone(), s.clone());
                    sent.push(tokio::spawn(async move {
                        let (status, _) =
                            console_login(&http, &s, "wrong-token-0000000", from.as_deref()).await;
                        (from.is_some(), status, started.elapsed())
                    }));
                    n += 1;
                }
                let mut answers = Vec::new();
                for t in sent {
                    answers.push(t.await.unwrap());
                }
                answers
            }
        });

        // The operator, every 250 ms, alternately through the proxy and from its address.
        let mut latencies = Vec::new();
        let mut at = Vec::new();
        let mut i = 0;
        while started.elapsed() < flood_for {
            let from = (i % 2 == 0).then_some("203.0.113.50");
            let t = Instant::now();
            let answer = console_login(&http, &s, ADMIN, from).await;
            latencies.push(t.elapsed());
            at.push(started.elapsed());
            assert!(
                logged_in(&answer),
                "login {i} ({from:?}) during the flood: {answer:?}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
            i += 1;
        }
        let answers = flood.await.unwrap();

        let count = |forwarded: bool, status: u16| {
            answers
                .iter()
                .filter(|(f, st, _)| *f == forwarded && *st == status)
                .count()
        };
        let others: Vec<_> = answers
            .iter()
            .filter(|(_, st, _)| *st != 401 && *st != 429)
            .collect();
        assert!(others.is_empty(), "{others:?}");
        // The proxy's own address: 10 failures a minute, then 429.
        assert_eq!(count(false, 401), 10, "{answers:?}");
        assert!(count(false, 429) > 50);
        // All addresses: 200 failures a minute (no forwarded address reaches its own
        // 10 in 8 s), then 429.
        assert_eq!(count(false, 401) + count(true, 401), 200);
        let global_from = answers
            .iter()
            .filter(|(f, st, _)| *f && *st == 429)
            .map(|(_, _, t)| *t)
            .min()
            .expect("the global throttle engaged");
        let under_global = at.iter().filter(|t| **t > global_from).count();
        assert!(
            under_global >= 3,
            "only {under_global} operator logins after {global_from:?}"
        );
        // Still within the minute: failures from a new address and from the proxy's
        // are refused; the token still logs in.
        let fresh = console_login(&http, &s, "wrong-token-0000000", Some("192.0.2.77")).await;
        assert_eq!(fresh.0, 429, "the global limit");
        let bare = console_login(&http, &s, "wrong-token-0000000", None).await;
        assert_eq!(bare.0, 429, "the proxy address's limit");
        assert!(logged_in(&console_login(&http, &s, ADMIN, None).await));

        let mut sorted = latencies.clone();
        sorted.sort();
        let p50 = sorted[sorted.len() / 2];
        let max = *sorted.last().unwrap();
        println!(
            "operator login during a flood of {} wrong logins in {:?} ({} answered 429): \
             {} logins, all 303; latency p50 {:.1} ms, max {:.1} ms",
            answers.len(),
            flood_for,
            answers.iter().filter(|(_, st, _)| *st == 429).count(),
            latencies.len(),
            p50.as_secs_f64() * 1e3,
            max.as_secs_f64() * 1e3,
        );
    });
}

/// `X-Forwarded-For` names the client of a login only when the peer is a trusted proxy
/// (here from the config file): each client then has its own 10 failures a minute.
/// Without trusted proxies every caller is the peer, whatever it forwards.
#[test]
fn the_login_throttle_believes_forwarded_for_only_from_trusted_proxies() {
    let db = db();
    let key = format!("t={KEY}");
    let dir = tempfile::tempdir().unwrap();
    let config = private_file(
        dir.path(),
        "serve.toml",
        "trusted-proxies = [\"10.0.0.0/8\", \"127.0.0.1\"]\n",
    );
    let s = Serve::start(
        &db,
        &["--api-key", &key, "--config", config.to_str().unwrap()],
        &[("IDEM_ADMIN_TOKEN", ADMIN)],
    );
    let rt = runtime();
    rt.block_on(async {
        let http = no_redirects();
        let wrong = "wrong-token-0000000";
        for _ in 0..10 {
            let r = console_login(&http, &s, wrong, Some("198.51.100.7")).await;
            assert_eq!(r.0, 401);
        }
        let r = console_login(&http, &s, wrong, Some("198.51.100.7")).await;
        assert_eq!(r.0, 429, "the client's own limit");
        // The same client behind a second trusted proxy.
        let r = console_login(&http, &s, wrong, Some("198.51.100.7, 10.1.2.3")).await;
        assert_eq!(r.0, 429);
        // The rightmost untrusted address is the client: a forged entry left of it
        // changes nothing.
        let r = console_login(&http, &s, wrong, Some("198.51.100.8, 198.51.100.9")).await;
        assert_eq!(r.0, 401, "198.51.100.9 has failures left");
        let r = console_login(&http, &s, wrong, None).await;
        assert_eq!(r.0, 401, "the proxy's own address has failures left");
        let r = console_login(&http, &s, ADMIN, Some("198.51.100.7")).await;
        assert!(
            logged_in(&r),
            "the token logs in from a throttled client: {r:?}"
        );
        // The audit names the client and the proxy it came through.
        let cookie = r.1.split(';').next().unwrap().to_owned();
        let audit = http
            .get(s.url("/console/audit"))
            .header("cookie", cookie)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(audit.contains("198.51.100.9 via 127.0.0.1"), "{audit}");
    });
    drop(s);

    // No trusted proxy: forwarded addresses are the peer's.
    let s = Serve::start(&db, &["--api-key", &key], &[("IDEM_ADMIN_TOKEN", ADMIN)]);
    rt.block_on(async {
        let http = no_redirects();
        for n in 0..10 {
            let from = format!("198.51.100.{}", 20 + n);
            let r = console_login(&http, &s, "wrong-token-0000000", Some(&from)).await;
            assert_eq!(r.0, 401);
        }
        let r = console_login(&http, &s, "wrong-token-0000000", Some("192.0.2.1")).await;
        assert_eq!(r.0, 429, "every caller is 127.0.0.1");
        assert!(logged_in(
            &console_login(&http, &s, ADMIN, Some("192.0.2.1")).await
        ));
    });
}

#[test]
fn the_console_cookie_is_secure_when_forced_behind_a_tls_proxy() {
    let db = db();
    let key = format!("t={KEY}");
    let env = [("IDEM_API_KEYS", key.as_str()), ("IDEM_ADMIN_TOKEN", ADMIN)];
    let rt = runtime();
    let http = no_redirects();
    let plain = Serve::start(&db, &[], &env);
    let (status, cookie) = rt.block_on(console_login(&http, &plain, ADMIN, None));
    assert_eq!(status, 303);
    assert!(!cookie.contains("Secure"), "plain HTTP: {cookie}");
    drop(plain);

    let forced = Serve::start(&db, &["--console-secure-cookie"], &env);
    rt.block_on(async {
        let (status, cookie) = console_login(&http, &forced, ADMIN, None).await;
        assert_eq!(status, 303);
        assert!(
            cookie.ends_with("; Secure") && cookie.contains("HttpOnly; SameSite=Strict"),
            "{cookie}"
        );
        // Logging out clears it with the same flag.
        let session = cookie.split(';').next().unwrap().to_owned();
        let page = http
            .get(forced.url("/console/"))
            .header("cookie", &session)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let csrf = page
            .split("name=\"csrf\" value=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .expect("a csrf field");
        let out = http
            .post(forced.url("/console/logout"))
            .header("cookie", &session)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("csrf={csrf}"))
            .send()
            .await
            .unwrap();
        assert_eq!(out.status().as_u16(), 303);
        let cleared = out.headers()["set-cookie"].to_str().unwrap();
        assert!(
            cleared.contains("Max-Age=0") && cleared.ends_with("; Secure"),
            "{cleared}"
        );
    });
}
