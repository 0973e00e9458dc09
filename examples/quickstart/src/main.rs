//! The idempotency layer in an axum app on SQLite, as `docs/LIBRARY.md` adds it.
//!
//! `idem-example-quickstart [ADDR]` serves `POST /v1/orders` on ADDR (default
//! 127.0.0.1:3000) with a development bearer token. `idem-example-quickstart
//! --self-check` serves on a free port and sends one intent 8 times at once: the handler
//! must run once and the other 7 arrivals must get its answer replayed. CI runs the
//! self-check twice: built in the workspace, and built from the packaged crates.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::{routing::post, Router};
use idem_http::{BearerTokens, IdempotencyLayer, Identity, Principal, TenantId};
use idem_sqlite::SqliteStore;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const TOKEN: &str = "dev-token";

/// The guide's dozen lines: a store, who the callers are, and the layer on the router.
async fn app(db: &std::path::Path, runs: Arc<AtomicUsize>) -> Result<Router, BoxError> {
    let store = SqliteStore::open_path(db).await?;
    let auth = BearerTokens::new().with(
        TOKEN,
        Identity::new(TenantId::new("shop")?, Principal::new("checkout")?),
    );
    let create = move || async move {
        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
        (
            axum::http::StatusCode::CREATED,
            format!("{{\"order\":{n}}}"),
        )
    };
    Ok(Router::new()
        .route("/v1/orders", post(create))
        .layer(IdempotencyLayer::new(store, auth)))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let arg = std::env::args().nth(1);
    if arg.as_deref() == Some("--self-check") {
        return self_check().await;
    }
    let addr = arg.unwrap_or_else(|| "127.0.0.1:3000".into());
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(std::path::Path::new("quickstart.db"), runs).await?;
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!(
        "POST http://{addr}/v1/orders with 'Authorization: Bearer {TOKEN}' and an Idempotency-Key"
    );
    axum::serve(listener, app).await?;
    Ok(())
}

async fn self_check() -> Result<(), BoxError> {
    let dir = std::env::temp_dir().join(format!("idem-quickstart-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(&dir.join("idem.db"), runs.clone()).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/v1/orders", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });

    let client = reqwest::Client::new();
    let send = |body: &'static str| {
        client
            .post(&url)
            .bearer_auth(TOKEN)
            .header("idempotency-key", "order-42")
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let answers = futures_all((0..8).map(|_| send(r#"{"show":"s1","seats":2}"#))).await;
    let mut bodies = Vec::new();
    let mut replayed = 0;
    for answer in answers {
        let answer = answer?;
        let status = answer.status().as_u16();
        let replay = answer.headers().get("idempotent-replayed").is_some();
        if status == 409 {
            // Arrived while the first was executing: a client retries it (Retry-After).
            continue;
        }
        replayed += usize::from(replay);
        bodies.push((status, answer.text().await?));
    }
    // Every arrival the first one held off (409) retried now gets the replay too.
    while bodies.len() < 8 {
        let answer = send(r#"{"show":"s1","seats":2}"#).await?;
        replayed += usize::from(answer.headers().get("idempotent-replayed").is_some());
        bodies.push((answer.status().as_u16(), answer.text().await?));
    }
    let mismatch = send(r#"{"show":"s1","seats":3}"#).await?.status().as_u16();
    let _ = std::fs::remove_dir_all(&dir);

    let executed = runs.load(Ordering::SeqCst);
    let same = bodies.iter().all(|b| b == &bodies[0]);
    println!(
        "8 sends of one key: the handler ran {executed} time(s), {replayed} answers replayed, \
         all answers identical: {same}; the same key with another body: {mismatch}"
    );
    if executed != 1 || replayed != 7 || !same || bodies[0].0 != 201 || mismatch != 422 {
        return Err("self-check failed".into());
    }
    println!("self-check passed");
    Ok(())
}

/// Runs the sends at once (no extra dependency for a join).
async fn futures_all<F, T>(futures: impl Iterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let tasks: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("send task"));
    }
    out
}
