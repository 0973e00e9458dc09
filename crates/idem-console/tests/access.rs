//! The console in process on a real SQLite store: login, sessions, CSRF, the throttle,
//! the security headers, a disabled console, and a host's page and navigation entry
//! behind the same login.

use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use axum::body::{to_bytes, Body};
use axum::extract::ConnectInfo;
use axum::http::{Request, Response, StatusCode};
use axum::routing::get;
use axum::Router;
use idem_console::{
    ok_page, Console, ConsoleError, ConsoleExtension, ConsoleOptions, ConsoleParts, NavEntry,
    Operator,
};
use idem_sql::SqlStore;
use maud::{html, Markup};
use tower::ServiceExt;

const TOKEN: &str = "an-admin-token-of-some-length";

struct Host;

#[async_trait]
impl ConsoleExtension for Host {
    fn nav(&self) -> Vec<NavEntry> {
        vec![NavEntry {
            label: "Host page",
            href: "/console/host",
        }]
    }

    async fn overview_section(&self, _console: &Console) -> Result<Option<Markup>, ConsoleError> {
        Ok(Some(html! { h2 id="host-section" { "From the host" } }))
    }
}

async fn host_page(op: Operator) -> axum::response::Response {
    ok_page(
        &op,
        "Host",
        "Host page",
        html! { h1 { "Host page of " (op.name) } },
    )
}

async fn app(token: Option<&str>) -> (Router, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let db = SqlStore::open_sqlite_path(dir.path().join("console.db"))
        .await
        .unwrap();
    idem_console::migrate(&db).await.unwrap();
    // Twice: the migrations are idempotent.
    idem_console::migrate(&db).await.unwrap();
    let console = Console::new(ConsoleParts {
        db,
        admin_token: token.map(str::to_owned),
        options: ConsoleOptions::default(),
        timeline: None,
        metrics: None,
        extension: Some(Arc::new(Host)),
    });
    let host = Router::new().route("/console/host", get(host_page));
    (idem_console::router(console, Some(host)), dir)
}

fn from(peer: &str, mut r: Request<Body>) -> Request<Body> {
    let addr: SocketAddr = peer.parse().unwrap();
    r.extensions_mut().insert(ConnectInfo(addr));
    r
}

fn login(token: &str, peer: &str) -> Request<Body> {
    from(
        peer,
        Request::post("/console/login")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(Body::from(format!("operator=ana&token={token}")))
            .unwrap(),
    )
}

fn get_with(path: &str, cookie: Option<&str>) -> Request<Body> {
    let mut r = Request::get(path);
    if let Some(c) = cookie {
        r = r.header("cookie", c);
    }
    r.body(Body::empty()).unwrap()
}

async fn text(r: Response<Body>) -> String {
    String::from_utf8(to_bytes(r.into_body(), 1 << 20).await.unwrap().to_vec()).unwrap()
}

fn header(r: &Response<Body>, name: &str) -> String {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

#[tokio::test]
async fn sessions_csrf_headers_and_a_hosts_page() {
    let (app, _dir) = app(Some(TOKEN)).await;
    let r = app
        .clone()
        .oneshot(get_with("/console/", None))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(header(&r, "location"), "/console/login");
    let r = app
        .clone()
        .oneshot(get_with("/console/host", None))
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::SEE_OTHER,
        "the host's page needs a session too"
    );

    let r = app
        .clone()
        .oneshot(login(TOKEN, "10.0.0.1:1"))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let set = header(&r, "set-cookie");
    for attr in [
        "HttpOnly",
        "SameSite=Strict",
        "Path=/console",
        "Max-Age=28800",
    ] {
        assert!(set.contains(attr), "{attr} in {set}");
    }
    assert!(!set.contains("Secure"), "{set}");
    let cookie = set.split(';').next().unwrap().to_owned();

    let r = app
        .clone()
        .oneshot(get_with("/console/", Some(&cookie)))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(header(&r, "content-security-policy").contains("default-src 'none'"));
    assert_eq!(header(&r, "cache-control"), "no-store");
    assert_eq!(header(&r, "x-frame-options"), "DENY");
    let overview = text(r).await;
    assert!(overview.contains("<h1>Overview</h1>"), "{overview}");
    assert!(overview.contains("id=\"host-section\""), "{overview}");
    assert!(
        overview.contains("<a href=\"/console/host\">Host page</a>"),
        "{overview}"
    );
    assert!(!overview.contains("<script"), "{overview}");

    let r = app
        .clone()
        .oneshot(get_with("/console/host", Some(&cookie)))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(header(&r, "content-security-policy").contains("default-src 'none'"));
    let page = text(r).await;
    assert!(page.contains("<h1>Host page of ana</h1>"), "{page}");
    assert!(
        page.contains("href=\"/console/host\" aria-current=\"page\""),
        "{page}"
    );

    // Logging out needs the session's CSRF token, and a post from this site.
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();
    let logout = |body: String, site: &'static str| {
        Request::post("/console/logout")
            .header("cookie", cookie.as_str())
            .header("content-type", "application/x-www-form-urlencoded")
            .header("sec-fetch-site", site)
            .body(Body::from(body))
            .unwrap()
    };
    let r = app
        .clone()
        .oneshot(logout("csrf=forged".into(), "same-origin"))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = app
        .clone()
        .oneshot(logout(format!("csrf={csrf}"), "cross-site"))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = app
        .clone()
        .oneshot(logout(format!("csrf={csrf}"), "same-origin"))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert!(header(&r, "set-cookie").contains("Max-Age=0"));
    let r = app
        .clone()
        .oneshot(get_with("/console/", Some(&cookie)))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER, "the session ended");

    let r = app
        .clone()
        .oneshot(login(TOKEN, "10.0.0.1:1"))
        .await
        .unwrap();
    let cookie = header(&r, "set-cookie")
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let audit = text(
        app.oneshot(get_with("/console/audit", Some(&cookie)))
            .await
            .unwrap(),
    )
    .await;
    assert!(audit.contains("<td>ana</td><td>logout</td>"), "{audit}");
}

#[tokio::test]
async fn failed_logins_are_throttled_per_address_not_the_token() {
    let (app, _dir) = app(Some(TOKEN)).await;
    for _ in 0..10 {
        let r = app
            .clone()
            .oneshot(login("wrong", "10.0.0.9:1"))
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    }
    let r = app
        .clone()
        .oneshot(login("wrong", "10.0.0.9:1"))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    // Another address still fails normally; the token still logs in from the first.
    let r = app
        .clone()
        .oneshot(login("wrong", "10.0.0.8:1"))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = app
        .clone()
        .oneshot(login(TOKEN, "10.0.0.9:1"))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn without_an_admin_token_every_page_is_disabled() {
    let (app, _dir) = app(None).await;
    for path in [
        "/console/",
        "/console/login",
        "/console/host",
        "/console/audit",
    ] {
        let r = app.clone().oneshot(get_with(path, None)).await.unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{path}");
        assert!(text(r).await.contains("The console is disabled"), "{path}");
    }
}
