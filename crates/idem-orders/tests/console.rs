//! The operator console's routes on a real server, on SQLite, PostgreSQL and MySQL: login and
//! sessions, CSRF and cross-site posts, the arrival timeline, and escaping of stored
//! bodies and keys.

#[macro_use]
mod common;

use std::time::Duration;

use common::*;
use serde_json::json;

/// A client that does not follow redirects (the tests look at them).
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

struct Page {
    status: u16,
    location: String,
    set_cookie: String,
    text: String,
}

async fn page_of(r: reqwest::Response) -> Page {
    let header = |n: &str| {
        r.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let (location, set_cookie) = (header("location"), header("set-cookie"));
    Page {
        status: r.status().as_u16(),
        location,
        set_cookie,
        text: r.text().await.unwrap(),
    }
}

async fn get(s: &TestServer, path: &str, cookie: Option<&str>) -> Page {
    let mut req = client().get(format!("{}{path}", s.base));
    if let Some(c) = cookie {
        req = req.header("cookie", c);
    }
    page_of(req.send().await.unwrap()).await
}

async fn post_form(
    s: &TestServer,
    path: &str,
    cookie: Option<&str>,
    fields: &[(&str, &str)],
    origin: Option<&str>,
) -> Page {
    let body: String = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(fields)
        .finish();
    let mut req = client()
        .post(format!("{}{path}", s.base))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body);
    if let Some(c) = cookie {
        req = req.header("cookie", c);
    }
    if let Some(o) = origin {
        req = req.header("origin", o);
    }
    page_of(req.send().await.unwrap()).await
}

/// Logs in as `name`: the session cookie and the page's CSRF token.
async fn login(s: &TestServer, name: &str) -> (String, String) {
    let p = post_form(
        s,
        "/console/login",
        None,
        &[("operator", name), ("token", ADMIN)],
        None,
    )
    .await;
    assert_eq!(p.status, 303, "login: {}", p.text);
    let cookie = p.set_cookie.split(';').next().unwrap().to_owned();
    let overview = get(s, "/console/", Some(&cookie)).await;
    assert_eq!(overview.status, 200, "{}", overview.text);
    (cookie, csrf_of(&overview.text))
}

fn csrf_of(html: &str) -> String {
    let at = html.find("name=\"csrf\" value=\"").expect("a csrf field") + 19;
    html[at..at + 64].to_owned()
}

async fn login_and_sessions(env: Env) {
    let s = env.start().await;
    // No session: to the login page.
    let p = get(&s, "/console/", None).await;
    assert_eq!((p.status, p.location.as_str()), (303, "/console/login"));
    let p = get(&s, "/console/login", None).await;
    assert_eq!(p.status, 200);
    assert!(p.text.contains("Admin token") && p.text.contains("type=\"password\""));

    // A wrong token: refused, no cookie, still no way in.
    let p = post_form(
        &s,
        "/console/login",
        None,
        &[("operator", "mallory"), ("token", "not-the-admin-token")],
        None,
    )
    .await;
    assert_eq!(p.status, 401);
    assert!(p.text.contains("not accepted"), "{}", p.text);
    assert!(p.set_cookie.is_empty());

    // The right token: an HttpOnly, SameSite=Strict cookie with an expiry.
    let p = post_form(
        &s,
        "/console/login",
        None,
        &[("operator", "ana"), ("token", ADMIN)],
        None,
    )
    .await;
    assert_eq!((p.status, p.location.as_str()), (303, "/console/"));
    for attr in ["HttpOnly", "SameSite=Strict", "Max-Age=", "Path=/console"] {
        assert!(p.set_cookie.contains(attr), "{attr} in {}", p.set_cookie);
    }
    let cookie = p.set_cookie.split(';').next().unwrap().to_owned();
    let overview = get(&s, "/console/", Some(&cookie)).await;
    assert_eq!(overview.status, 200);
    assert!(overview.text.contains("<h1>Overview</h1>"));
    assert!(overview.text.contains("aria-label=\"Console\""));
    // No script anywhere, and a policy that allows none.
    assert!(!overview.text.contains("<script"));
    let r = client()
        .get(format!("{}/console/", s.base))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    let csp = r.headers()["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("default-src 'none'"), "{csp}");
    assert_eq!(r.headers()["cache-control"], "no-store");

    // A forged cookie is no session.
    let forged = format!("idem_console={}", "ab".repeat(32));
    assert_eq!(get(&s, "/console/", Some(&forged)).await.status, 303);

    // Logging out needs the form token, then ends the session everywhere.
    let csrf = csrf_of(&overview.text);
    let p = post_form(&s, "/console/logout", Some(&cookie), &[("csrf", "x")], None).await;
    assert_eq!(p.status, 403);
    let p = post_form(
        &s,
        "/console/logout",
        Some(&cookie),
        &[("csrf", &csrf)],
        None,
    )
    .await;
    assert_eq!((p.status, p.location.as_str()), (303, "/console/login"));
    assert!(p.set_cookie.contains("Max-Age=0"));
    assert_eq!(get(&s, "/console/", Some(&cookie)).await.status, 303);

    // Both logins and the refusal are in the audit.
    let (cookie, _) = login(&s, "ben").await;
    let audit = get(&s, "/console/audit", Some(&cookie)).await;
    assert!(
        audit.text.contains("refused: wrong admin token"),
        "{}",
        audit.text
    );
    assert!(audit.text.contains("<td>ana</td>") && audit.text.contains("<td>logout</td>"));
    // A refused login does not keep what was typed as the name.
    assert!(!audit.text.contains("mallory"), "{}", audit.text);
    s.shutdown().await;
}

async fn csrf_and_cross_site_posts(env: Env) {
    let s = env.start().await;
    let (cookie, csrf) = login(&s, "ana").await;
    let freeze = |csrf: &'static str| {
        vec![
            ("csrf", csrf),
            ("tenant", "t1"),
            ("scope_kind", "user"),
            ("scope_value", "U-csrf"),
            ("what", "payment-confirm"),
            ("what", "ticketing"),
            ("reason", "drill"),
        ]
    };
    // No token, a wrong token, a right token from another origin: all refused.
    let mut no_token = freeze("");
    no_token.remove(0);
    let p = post_form(&s, "/console/freezes", Some(&cookie), &no_token, None).await;
    assert_eq!(p.status, 403, "{}", p.text);
    let p = post_form(&s, "/console/freezes", Some(&cookie), &freeze("0000"), None).await;
    assert_eq!(p.status, 403);
    let csrf: &'static str = Box::leak(csrf.into_boxed_str());
    let p = post_form(
        &s,
        "/console/freezes",
        Some(&cookie),
        &freeze(csrf),
        Some("http://evil.example"),
    )
    .await;
    assert_eq!(p.status, 403);
    assert!(s.get_admin("/v1/admin/freezes").await["active"]
        .as_array()
        .unwrap()
        .is_empty());
    // Without a session, a post goes to the login page and changes nothing.
    let p = post_form(&s, "/console/freezes", None, &freeze(csrf), None).await;
    assert_eq!(p.status, 303);

    // The right token, same origin: frozen, recorded with who and why.
    let origin = s.base.clone();
    let p = post_form(
        &s,
        "/console/freezes",
        Some(&cookie),
        &freeze(csrf),
        Some(&origin),
    )
    .await;
    assert_eq!(
        (p.status, p.location.as_str()),
        (303, "/console/freezes"),
        "{}",
        p.text
    );
    let active = s.get_admin("/v1/admin/freezes").await;
    let active = active["active"].as_array().unwrap();
    assert_eq!(active.len(), 2, "{active:?}");
    assert_eq!(active[0]["frozen_by"], "console:ana");
    let page = get(&s, "/console/freezes", Some(&cookie)).await;
    assert!(page.text.contains("user:U-csrf") && page.text.contains("drill"));

    // A reason is required.
    let p = post_form(
        &s,
        "/console/freezes/unfreeze",
        Some(&cookie),
        &[
            ("csrf", csrf),
            ("tenant", "t1"),
            ("scope", "user:U-csrf"),
            ("what", "payment-confirm"),
            ("what", "ticketing"),
        ],
        None,
    )
    .await;
    assert_eq!(p.status, 400);
    let p = post_form(
        &s,
        "/console/freezes/unfreeze",
        Some(&cookie),
        &[
            ("csrf", csrf),
            ("tenant", "t1"),
            ("scope", "user:U-csrf"),
            ("what", "payment-confirm"),
            ("what", "ticketing"),
            ("reason", "drill over"),
        ],
        None,
    )
    .await;
    assert_eq!(p.status, 303, "{}", p.text);
    assert!(s.get_admin("/v1/admin/freezes").await["active"]
        .as_array()
        .unwrap()
        .is_empty());
    let audit = get(&s, "/console/audit", Some(&cookie)).await;
    assert!(audit.text.contains("unfreeze") && audit.text.contains("drill over"));
    s.shutdown().await;
}

/// Polls the key page until `done` holds.
async fn key_page_until(
    s: &TestServer,
    cookie: &str,
    path: &str,
    done: impl Fn(&str) -> bool,
) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let p = get(s, path, Some(cookie)).await;
        if done(&p.text) {
            return p.text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "key page never showed it: {}",
            p.text
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn eight_duplicates_on_the_timeline(env: Env) {
    let s = env.start().await;
    let (cookie, _) = login(&s, "ana").await;
    let first = s.create(T1, "dup-8", "U-8", "S-204", 1).await;
    assert_eq!(first.status, 201, "{}", first.body);
    let order = first.order_id();
    let replays =
        futures::future::join_all((0..7).map(|_| s.create(T1, "dup-8", "U-8", "S-204", 1))).await;
    assert!(replays.iter().all(|r| r.replayed && r.order_id() == order));
    let text = key_page_until(&s, &cookie, "/console/keys/t1/dup-8", |t| {
        t.contains("8 arrivals: 1 executed, 7 replayed")
    })
    .await;
    assert!(text.contains("id=\"key-order\""), "{text}");
    assert!(text.contains(&order));
    assert!(text.contains("id=\"record-state\">succeeded<"), "{text}");
    assert_eq!(text.matches("<td>replayed</td>").count(), 7);
    // The other tenant's key of the same name is not this one.
    let other = get(&s, "/console/keys/t2/dup-8", Some(&cookie)).await;
    assert_eq!(other.status, 404);
    // Search by order lists the key.
    let found = get(
        &s,
        &format!("/console/search?by=order&q={order}"),
        Some(&cookie),
    )
    .await;
    assert!(
        found.text.contains("/console/keys/t1/dup-8"),
        "{}",
        found.text
    );
    s.shutdown().await;
}

async fn stored_bodies_and_keys_render_as_text(env: Env) {
    let s = env.start().await;
    let (cookie, _) = login(&s, "ana").await;
    let key = "<script>alert(1)</script>";
    let r = s
        .post(
            "/v1/orders",
            T1,
            Some(key),
            &json!({"user_id": "<script>alert(2)</script>", "show_id": "S-204", "quantity": 1}),
        )
        .await;
    assert!(r.status < 500, "{}", r.body);
    let encoded: String = form_urlencoded::byte_serialize(key.as_bytes()).collect();
    let path = format!("/console/keys/t1/{}", encoded.replace('+', "%20"));
    let text = key_page_until(&s, &cookie, &path, |t| t.contains("1 arrival:")).await;
    assert!(!text.contains("<script"), "raw markup on the page: {text}");
    assert!(text.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(text.contains("id=\"stored-body\""));
    // Search results escape it too.
    let found = get(
        &s,
        &format!("/console/search?by=key&tenant=t1&q={encoded}"),
        Some(&cookie),
    )
    .await;
    assert!(!found.text.contains("<script"));
    assert!(found.text.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    s.shutdown().await;
}

async fn disabled_without_an_admin_token(env: Env) {
    let s = env.start_with(|c| c.admin_token = None).await;
    let p = get(&s, "/console/", None).await;
    assert_eq!(p.status, 403);
    assert!(p.text.contains("The console is disabled"));
    let p = post_form(
        &s,
        "/console/login",
        None,
        &[("operator", "a"), ("token", ADMIN)],
        None,
    )
    .await;
    assert_eq!(p.status, 403);
    s.shutdown().await;
}

/// The demo incident in the database, the dry run on the page, an apply refused until
/// the scope is frozen, then applied once with its reason in the audit.
async fn reconciliation_from_the_console(env: Env) {
    idem_bench::demo::demo_incident(idem_bench::demo::DemoOptions {
        database_url: Some(env.url.clone()),
        pg_schema: env.pg_schema.clone(),
        time_scale: 0.3,
        ..Default::default()
    })
    .await
    .expect("demo runs");
    let s = env.start().await;
    let (cookie, csrf) = login(&s, "ana").await;
    let dry = get(&s, "/console/reconcile?tenant=legacy", Some(&cookie)).await;
    assert_eq!(dry.status, 200, "{}", dry.text);
    assert_eq!(
        dry.text.matches("class=\"cluster\"").count(),
        1,
        "{}",
        dry.text
    );
    assert!(dry.text.contains("class=\"keeper\">Keeper: <code>ord_"));
    assert!(dry.text.contains("id=\"freeze-gaps\""));
    let apply = |reason: &'static str, confirm: bool| {
        let mut f = vec![("csrf", csrf.clone()), ("tenant", "legacy".to_owned())];
        f.push(("reason", reason.to_owned()));
        if confirm {
            f.push(("confirm", "yes".to_owned()));
        }
        f
    };
    let post = |f: Vec<(&'static str, String)>| {
        let pairs: Vec<(&str, &str)> = f.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let body: String = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(pairs)
            .finish();
        client()
            .post(format!("{}/console/reconcile", s.base))
            .header("cookie", &cookie)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
    };
    // Without the confirmation nothing runs.
    let p = page_of(post(apply("night of 20:14", false)).await.unwrap()).await;
    assert_eq!(p.status, 400);
    // Not frozen: refused, and said so.
    let p = page_of(post(apply("night of 20:14", true)).await.unwrap()).await;
    assert_eq!(p.status, 200);
    assert!(p.text.contains("Not applied"), "{}", p.text);
    // Freeze the user's chain from the console, then apply.
    let csrf_ref: &str = &csrf;
    let p = post_form(
        &s,
        "/console/freezes",
        Some(&cookie),
        &[
            ("csrf", csrf_ref),
            ("tenant", "legacy"),
            ("scope_kind", "user"),
            ("scope_value", "U-7318"),
            ("what", "payment-confirm"),
            ("what", "ticketing"),
            ("what", "inventory-release"),
            ("reason", "reconcile the night"),
        ],
        None,
    )
    .await;
    assert_eq!(p.status, 303, "{}", p.text);
    let p = page_of(post(apply("night of 20:14", true)).await.unwrap()).await;
    assert!(p.text.contains("Applied: "), "{}", p.text);
    assert!(!p.text.contains("FAILED"), "{}", p.text);
    let again = get(&s, "/console/reconcile?tenant=legacy", Some(&cookie)).await;
    assert!(
        !again.text.contains("Apply the plan"),
        "nothing left to apply: {}",
        again.text
    );
    let audit = get(&s, "/console/audit", Some(&cookie)).await;
    assert!(audit.text.contains("reconcile-apply") && audit.text.contains("night of 20:14"));
    assert!(audit.text.contains("refused: "));
    s.shutdown().await;
}

/// Lease names, holders and evidence; a fenced rejection is marked.
async fn leases_with_their_evidence(env: Env) {
    use idem_core::{LeaseName, OwnerId};
    let s = env.start().await;
    let (cookie, _) = login(&s, "ana").await;
    let db = s.server.orders().database().clone();
    let leases = db.lease_store();
    let name = LeaseName::new(format!("console-test/{}", uuid::Uuid::now_v7().simple())).unwrap();
    let old = leases
        .try_acquire(
            &name,
            &OwnerId::new("worker-a").unwrap(),
            Duration::from_millis(300),
        )
        .await
        .unwrap()
        .granted()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let new = leases
        .try_acquire(
            &name,
            &OwnerId::new("worker-b").unwrap(),
            Duration::from_secs(30),
        )
        .await
        .unwrap()
        .granted()
        .unwrap();
    db.fenced_probe("console-test-resource", &new)
        .await
        .unwrap();
    assert!(db
        .fenced_probe("console-test-resource", &old)
        .await
        .is_err());
    let list = get(&s, "/console/leases", Some(&cookie)).await;
    assert_eq!(list.status, 200);
    assert!(list.text.contains(name.as_str()), "{}", list.text);
    assert!(list.text.contains("worker-b"));
    let path = format!("/console/leases/{}", name.as_str().replace('/', "%2F"));
    let one = get(&s, &path, Some(&cookie)).await;
    assert_eq!(one.status, 200, "{}", one.text);
    assert!(
        one.text.contains("id=\"lease-holder\">worker-b<"),
        "{}",
        one.text
    );
    let fenced = one
        .text
        .split("<tr")
        .find(|row| row.contains("<td>fenced_write_rejected</td>"))
        .expect("a fenced_write_rejected row");
    assert!(
        fenced.starts_with(" class=\"alert\""),
        "not marked: {fenced}"
    );
    let acquired = one
        .text
        .split("<tr")
        .find(|row| row.contains("<td>acquired</td>"))
        .expect("an acquired row");
    assert!(
        !acquired.starts_with(" class=\"alert\""),
        "marked: {acquired}"
    );
    assert!(one.text.contains("70 % of the lease"));
    s.shutdown().await;
}

/// A key swept into the archive shows its archive entry; the overview shows the sweep.
async fn archived_keys_show_their_archive_entry(env: Env) {
    let s = env.start().await;
    let (cookie, _) = login(&s, "ana").await;
    let created = s.create(T1, "arch-1", "U-arch", "S-204", 1).await;
    assert_eq!(created.status, 201);
    let order = created.order_id();
    let db = s.server.orders().database().clone();
    let day_100 = chrono::Utc::now().timestamp_millis() + 100 * 86_400_000;
    let report = idem_sweep::Sweeper::new(db.store().retention(), Default::default())
        .with_lease(db.lease_store(), idem_lease::LeaseMetrics::default())
        .run(&idem_sweep::SweepOptions {
            now: Some(day_100),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(report.transitions.values().sum::<u64>() > 0, "{report:?}");
    let text = key_page_until(&s, &cookie, "/console/keys/t1/arch-1", |t| {
        t.contains("Archived")
    })
    .await;
    assert!(text.contains("id=\"record-state\">succeeded<"), "{text}");
    assert!(
        text.contains(&format!(
            "<dt>result reference</dt><dd>/v1/orders/{order}</dd>"
        )),
        "the archive's result reference: {text}"
    );
    let overview = get(&s, "/console/", Some(&cookie)).await;
    assert!(
        overview.text.contains("id=\"sweeper\">Last run: released"),
        "{}",
        overview.text
    );
    s.shutdown().await;
}

/// The overview lists a record PROCESSING past its lease (by the store's clock).
async fn overview_lists_processing_past_its_lease(env: Env) {
    use idem_core::{
        ClaimRequest, Fingerprint, IdempotencyKey, OwnerId, Principal, Scope, TenantId,
    };
    let s = env.start().await;
    let (cookie, _) = login(&s, "ana").await;
    let store = s.server.orders().database().idempotency_store();
    let claimed = store
        .claim(&ClaimRequest {
            scope: Scope::new(
                TenantId::new("t1").unwrap(),
                IdempotencyKey::new("stuck-1").unwrap(),
            ),
            principal: Principal::new("api-key:t1").unwrap(),
            fingerprint: Fingerprint::of_bytes(b"stuck"),
            owner: OwnerId::new("crashed-worker").unwrap(),
            lease: Duration::from_secs(1),
        })
        .await
        .unwrap();
    assert!(matches!(claimed, idem_core::Claim::Proceed(_)));
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let p = get(&s, "/console/", Some(&cookie)).await;
    assert_eq!(p.status, 200, "{}", p.text);
    assert!(
        p.text
            .contains("id=\"stale-count\" class=\"bad\">1 record(s)"),
        "{}",
        p.text
    );
    assert!(p.text.contains("/console/keys/t1/stuck-1"));
    let key = get(&s, "/console/keys/t1/stuck-1", Some(&cookie)).await;
    assert!(
        key.text.contains("id=\"record-state\">processing<"),
        "{}",
        key.text
    );
    assert!(key.text.contains("crashed-worker") && key.text.contains("no stored result yet"));
    s.shutdown().await;
}

/// Failed logins from one address are throttled, not the admin token; cross-site posts by `Sec-Fetch-Site`
/// are refused; a session opened with a replaced admin token is no session.
async fn throttle_fetch_metadata_and_rotated_tokens(env: Env) {
    let s = env.start().await;
    let (cookie, csrf) = login(&s, "ana").await;
    let wrong = [("operator", "x"), ("token", "wrong-token-wrong")];
    for _ in 0..10 {
        let p = post_form(&s, "/console/login", None, &wrong, None).await;
        assert_eq!(p.status, 401);
    }
    let p = post_form(&s, "/console/login", None, &wrong, None).await;
    assert_eq!(p.status, 429, "{}", p.text);
    // Only failures are throttled: the token still logs in from that address.
    login(&s, "bo").await;
    // The session already open still works.
    assert_eq!(get(&s, "/console/", Some(&cookie)).await.status, 200);
    let r = client()
        .post(format!("{}/console/logout", s.base))
        .header("cookie", &cookie)
        .header("sec-fetch-site", "cross-site")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("csrf={csrf}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(
        get(&s, "/console/", Some(&cookie)).await.status,
        200,
        "still logged in"
    );
    s.shutdown().await;
    // The same database, a new admin token: the old session is gone.
    let s = env
        .start_with(|c| c.admin_token = Some("a-new-admin-token-after-rotation".into()))
        .await;
    let p = get(&s, "/console/", Some(&cookie)).await;
    assert_eq!((p.status, p.location.as_str()), (303, "/console/login"));
    s.shutdown().await;
}

on_every_store!(
    overview_lists_processing_past_its_lease,
    throttle_fetch_metadata_and_rotated_tokens,
    archived_keys_show_their_archive_entry,
    reconciliation_from_the_console,
    leases_with_their_evidence,
    login_and_sessions,
    csrf_and_cross_site_posts,
    eight_duplicates_on_the_timeline,
    stored_bodies_and_keys_render_as_text,
    disabled_without_an_admin_token,
);
