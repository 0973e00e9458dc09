//! `idem console` in its own process on a SQLite store whose records the idempotency
//! layer made: login, the key page with its record and stored response, search by key
//! prefix, the overview, the audit; and the refusal to start without an admin token.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use axum::routing::post;
use axum::Router;
use idem_core::{Identity, Principal, TenantId};
use idem_http::{BearerTokens, IdempotencyLayer};
use tower::ServiceExt;

const BIN: &str = env!("CARGO_BIN_EXE_idem");
const TOKEN: &str = "console-test-admin-token-0123456789";

/// The console process, killed when dropped.
struct Running {
    child: Child,
    base: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(url: &str) -> Running {
    let mut child = Command::new(BIN)
        .args(["console", "--listen", "127.0.0.1:0"])
        .env("IDEM_DATABASE_URL", url)
        .env("IDEM_ADMIN_TOKEN", TOKEN)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("idem console starts");
    let out = BufReader::new(child.stdout.take().unwrap());
    // The address is printed once it listens.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            if let Some(rest) = line.trim().strip_prefix("console: http://") {
                let addr = rest.split('/').next().unwrap_or_default().to_owned();
                let _ = tx.send(addr);
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("idem console prints its address");
    Running {
        child,
        base: format!("http://{addr}"),
    }
}

/// Three arrivals of one key through the layer: one execution, two replays.
async fn records_made_by_the_layer(url: &str) {
    let store = idem_sql::Store::open(url, &Default::default())
        .await
        .unwrap();
    let auth = BearerTokens::new().with(
        "tenant-secret",
        Identity::new(
            TenantId::new("t1").unwrap(),
            Principal::new("alice").unwrap(),
        ),
    );
    let app = Router::new()
        .route(
            "/v1/orders",
            post(|| async { r#"{"order_id":"ord-<b>1</b>"}"# }),
        )
        .layer(IdempotencyLayer::from_arcs(store.records(), Arc::new(auth)));
    for _ in 0..3 {
        let request = Request::post("/v1/orders")
            .header("authorization", "Bearer tenant-secret")
            .header("idempotency-key", "standalone-key-1")
            .header("content-type", "application/json")
            .body(Body::from(r#"{"item":"book"}"#))
            .unwrap();
        let answer = app.clone().oneshot(request).await.unwrap();
        assert!(answer.status().is_success(), "{:?}", answer.status());
    }
}

#[tokio::test]
async fn the_standalone_console_shows_records_the_layer_made() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    records_made_by_the_layer(&url).await;
    let console = start(&url);
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let get = |path: &str, cookie: Option<&str>| {
        let mut r = http.get(format!("{}{path}", console.base));
        if let Some(c) = cookie {
            r = r.header("cookie", c);
        }
        r.send()
    };

    let r = get("/console/", None).await.unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], "/console/login");

    let login = |token: &'static str| {
        http.post(format!("{}/console/login", console.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("operator=ana&token={token}"))
            .send()
    };
    assert_eq!(
        login("wrong-token-wrong-token").await.unwrap().status(),
        401
    );
    let r = login(TOKEN).await.unwrap();
    assert_eq!(r.status(), 303);
    let set = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    let cookie = set.split(';').next().unwrap().to_owned();

    let r = get("/console/keys/t1/standalone-key-1", Some(&cookie))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let csp = r.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(csp.contains("default-src 'none'"), "{csp}");
    let key = r.text().await.unwrap();
    assert!(key.contains("id=\"record-state\">succeeded<"), "{key}");
    assert!(key.contains("id=\"stored-body\""), "{key}");
    assert!(
        key.contains("ord-&lt;b&gt;1&lt;/b&gt;"),
        "escaped body: {key}"
    );
    assert!(!key.contains("<b>1</b>"), "{key}");
    // The service's pages are the host's: the standalone console has none.
    assert!(
        !key.contains("Reconcile") && key.contains("/console/leases"),
        "{key}"
    );

    let found = get(
        "/console/search?by=key&q=standalone-&tenant=t1",
        Some(&cookie),
    )
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    assert!(
        found.contains("/console/keys/t1/standalone-key-1"),
        "{found}"
    );

    let missing = get("/console/keys/t1/never-seen", Some(&cookie))
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);

    let overview = get("/console/", Some(&cookie))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        overview.contains("id=\"stale-count\" class=\"ok\">0 record(s)"),
        "{overview}"
    );
    assert!(
        overview.contains("data-state=\"SUCCEEDED\">1<"),
        "{overview}"
    );

    let audit = get("/console/audit", Some(&cookie))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(audit.contains("refused: wrong admin token"), "{audit}");
    assert!(audit.contains("<td>ana</td><td>login</td>"), "{audit}");
}

#[test]
fn the_standalone_console_needs_an_admin_token() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    let out = Command::new(BIN)
        .args(["console", "--listen", "127.0.0.1:0"])
        .env("IDEM_DATABASE_URL", &url)
        .env_remove("IDEM_ADMIN_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs the admin token"), "{err}");
}
