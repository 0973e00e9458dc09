//! orders-lite: the smallest service that uses idem the way a real one should.
//!
//! `POST /orders` runs behind [`IdempotencyLayer`] (bearer-token auth, `Idempotency-Key`
//! required). The handler takes the [`TransactionalClaim`] from the request extensions and
//! finishes the idempotency record in the same PostgreSQL transaction as its order row, so
//! the order and the stored answer commit together or not at all. `GET /orders/{id}` reads
//! an order of the caller's tenant. Every keyed arrival goes to the arrival timeline in the
//! store's own tables (`idem_sql::ArrivalLog`), which `idem console --database-url` shows;
//! a duplicate that arrives while the first is executing waits for its answer (up to 5 s)
//! instead of getting 409.
//!
//! `serve --listen ADDR` runs it. `self-check` runs it on a loopback port in-process, sends
//! one create 8 times at once plus a retry, the same key with another body (422) and a new
//! key, then checks in SQL that each key made exactly one order; it uses a schema of its
//! own and drops it at the end. The orders table has no unique constraint on the key on
//! purpose: one row per key is what the layer guarantees, and the check would otherwise
//! prove nothing.

use std::collections::HashSet;
use std::error::Error;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{request::Parts, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use clap::{Parser, Subcommand};
use idem_client::{IdempotentClient, IdempotentResponse};
use idem_core::{Principal, TenantId};
use idem_http::config::{IdempotencyConfig, InProgressMode};
use idem_http::{Authenticate, BearerTokens, IdempotencyLayer, Identity, TransactionalClaim};
use idem_postgres::{PgOptions, PgStore};
use idem_sql::arrivals::key_arrivals;
use idem_sql::{ArrivalLog, ArrivalOptions, SqlStore};
use serde_json::{json, Value};

type BoxError = Box<dyn Error + Send + Sync>;
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

#[derive(Parser)]
struct Cli {
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_URL)]
    database_url: String,
    /// Schema for the idempotency records and the orders table (default: `orders_lite`,
    /// or `orders_lite_<pid>` for the self-check, which creates and drops it).
    #[arg(long, global = true)]
    schema: Option<String>,
    /// The bearer token standing for the demo tenant.
    #[arg(long, env = "ORDERS_LITE_TOKEN", default_value = "demo-token")]
    token: String,
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand)]
enum Mode {
    /// Serves the API until Ctrl-C.
    Serve {
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
    },
    /// Runs the app in-process on a fresh schema, checks once-only creates, drops it.
    SelfCheck,
}

#[derive(Clone)]
struct App {
    store: PgStore,
    auth: BearerTokens,
    timeline: ArrivalLog,
}

#[derive(serde::Deserialize)]
struct NewOrder {
    item: String,
    quantity: i32,
}

/// A failed handler: its transaction (dropped unfinished) rolls back and the caller gets
/// a 500, which the layer records as retryable. The cause is logged, not sent.
struct Failed;

impl<E: Error> From<E> for Failed {
    fn from(e: E) -> Self {
        eprintln!("request failed: {e}");
        Failed
    }
}

impl IntoResponse for Failed {
    fn into_response(self) -> Response {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "the order was not created",
        )
            .into_response()
    }
}

async fn create_order(
    State(app): State<App>,
    Extension(claim): Extension<TransactionalClaim>,
    Json(new): Json<NewOrder>,
) -> Result<Response, Failed> {
    let id = uuid::Uuid::now_v7().to_string();
    let scope = &claim.token().scope;
    let body = serde_json::to_vec(&json!({"id": id, "item": new.item, "quantity": new.quantity}))?;
    let headers =
        HeaderMap::from_iter([(CONTENT_TYPE, HeaderValue::from_static("application/json"))]);
    let mut tx = app.store.pool().begin().await?;
    sqlx::query(
        "INSERT INTO orders (id, tenant_id, idem_key, item, quantity) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(&id)
    .bind(scope.tenant.as_str())
    .bind(scope.key.as_str())
    .bind(&new.item)
    .bind(new.quantity)
    .execute(&mut *tx)
    .await?;
    // The stored answer is exactly what this handler returns; a lost compare-and-set
    // (`Superseded`) fails here and the order rolls back with it.
    let finish = claim.finish_for(StatusCode::CREATED, &headers, &body);
    let record = app
        .store
        .finish_in_tx(&mut tx, claim.token(), finish)
        .await?;
    tx.commit().await?;
    // Only after the commit: the layer must not finish the record a second time.
    claim.finished_in_transaction(record);
    Ok((StatusCode::CREATED, headers, body).into_response())
}

async fn get_order(
    State(app): State<App>,
    Path(id): Path<String>,
    parts: Parts,
) -> Result<Response, Failed> {
    // GETs pass the layer without a claim, so this handler authenticates by itself.
    let Ok(who) = app.auth.authenticate(&parts).await else {
        return Ok(StatusCode::UNAUTHORIZED.into_response());
    };
    let row: Option<(String, String, i32)> =
        sqlx::query_as("SELECT id, item, quantity FROM orders WHERE id = $1 AND tenant_id = $2")
            .bind(&id)
            .bind(who.tenant.as_str())
            .fetch_optional(app.store.pool())
            .await?;
    Ok(match row {
        Some((id, item, quantity)) => {
            Json(json!({"id": id, "item": item, "quantity": quantity})).into_response()
        }
        None => StatusCode::NOT_FOUND.into_response(),
    })
}

fn router(app: App) -> Router {
    let mut config = IdempotencyConfig::default();
    config.in_progress = InProgressMode::Wait {
        max_wait: Duration::from_secs(5),
    };
    let layer = IdempotencyLayer::new(app.store.clone(), app.auth.clone())
        .with_config(config)
        .with_arrivals(Arc::new(app.timeline.clone()));
    Router::new()
        .route("/orders", post(create_order))
        .route("/orders/{id}", get(get_order))
        .with_state(app)
        .layer(layer)
}

/// Connects, migrates the idempotency tables and creates the orders table, all in `schema`.
/// `fresh`: the schema must not exist yet (the self-check drops it at the end, so it must
/// never take over a schema someone else uses).
async fn open(cli: &Cli, schema: &str, fresh: bool) -> Result<App, BoxError> {
    let mut options = PgOptions::default();
    options.schema = Some(schema.to_owned());
    let store = PgStore::connect(&cli.database_url, options).await?;
    // The schema name was validated by `connect`; the pool's search_path is the schema.
    if fresh {
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
            .execute(store.pool())
            .await
            .map_err(|e| format!("creating schema {schema}: {e}"))?;
    }
    store.migrate().await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, tenant_id text NOT NULL, \
         idem_key text NOT NULL, item text NOT NULL, quantity integer NOT NULL, \
         created_at timestamptz NOT NULL DEFAULT now())",
    )
    .execute(store.pool())
    .await?;
    let identity = Identity::new(TenantId::new("demo")?, Principal::new("demo")?);
    let timeline = ArrivalLog::start(SqlStore::from(store.clone()), ArrivalOptions::default());
    Ok(App {
        store,
        auth: BearerTokens::new().with(cli.token.clone(), identity),
        timeline,
    })
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match &cli.mode {
        Mode::Serve { listen } => {
            let app = open(&cli, cli.schema.as_deref().unwrap_or("orders_lite"), false).await?;
            let listener = tokio::net::TcpListener::bind(listen).await?;
            eprintln!("orders-lite listening on http://{}", listener.local_addr()?);
            axum::serve(listener, router(app.clone()))
                .with_graceful_shutdown(async { tokio::signal::ctrl_c().await.unwrap_or(()) })
                .await?;
            // What the timeline still buffers is written before the process ends.
            app.timeline.close().await;
            Ok(())
        }
        Mode::SelfCheck => {
            let schema = cli
                .schema
                .clone()
                .unwrap_or_else(|| format!("orders_lite_{}", std::process::id()));
            let app = open(&cli, &schema, true).await?;
            let outcome = self_check(app.clone(), &cli.token).await;
            // Dropped whatever the outcome, so a failed run leaves nothing behind.
            sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
                .execute(app.store.pool())
                .await?;
            let summary = outcome?;
            println!("self-check passed (schema {schema} dropped)\n{summary}");
            Ok(())
        }
    }
}

fn ensure(ok: bool, failure: impl Into<String>) -> Result<(), BoxError> {
    ok.then_some(()).ok_or_else(|| failure.into().into())
}

fn order_id(response: &IdempotentResponse) -> Result<String, BoxError> {
    let (status, text) = (response.status, response.text());
    ensure(
        status.is_success(),
        format!("expected 2xx, got {status}: {text}"),
    )?;
    let body: Value = response.json()?;
    body["id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("no order id in {body}").into())
}

/// Drives the app over real HTTP and checks the database; returns a short summary.
async fn self_check(app: App, token: &str) -> Result<String, BoxError> {
    let store = app.store.clone();
    let timeline = app.timeline.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let server = tokio::spawn(async move { axum::serve(listener, router(app)).await });
    let client = IdempotentClient::new(reqwest::Client::new());
    let url = format!("{base}/orders");
    let order = json!({"item": "ticket", "quantity": 2});

    // One intent, one key, sent 8 times at once: one execution, the rest replay (after
    // a 409 the client retries with the same key).
    let intent = client.post(&url).bearer_auth(token).json(&order)?;
    let sends: Vec<_> = (0..8)
        .map(|_| {
            let intent = intent.clone();
            tokio::spawn(async move { intent.send().await })
        })
        .collect();
    let (mut ids, mut replays, mut retries) = (HashSet::new(), 0, 0);
    for send in sends {
        let response = send.await??;
        replays += usize::from(response.replayed);
        retries += response.attempts - 1;
        ids.insert(order_id(&response)?);
    }
    let retry = intent.send().await?;
    ensure(retry.replayed, "the retry was not a replay")?;
    ids.insert(order_id(&retry)?);
    let made = format!("8 sends made {} order ids and {replays} replays", ids.len());
    ensure(ids.len() == 1 && replays == 7, made)?;
    let first = ids.into_iter().next().unwrap_or_default();

    let other = json!({"item": "ticket", "quantity": 3});
    let reused = client
        .post(&url)
        .with_key(intent.key().clone())
        .bearer_auth(token)
        .json(&other)?;
    match reused.send().await {
        Err(e) if e.status() == Some(422) => {}
        other => return Err(format!("same key, other body: expected 422, got {other:?}").into()),
    }

    let fresh = client.post(&url).bearer_auth(token).json(&order)?;
    let second = order_id(&fresh.send().await?)?;
    ensure(second != first, "a new key replayed the first order")?;

    let read = reqwest::Client::new()
        .get(format!("{url}/{first}"))
        .bearer_auth(token)
        .send()
        .await?;
    let found = read.status() == StatusCode::OK && read.json::<Value>().await?["id"] == *first;
    ensure(found, "GET /orders/{id} did not return the order")?;

    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT idem_key, count(*) FROM orders GROUP BY idem_key")
            .fetch_all(store.pool())
            .await?;
    let expected = HashSet::from([intent.key().as_str(), fresh.key().as_str()]);
    let keys: HashSet<&str> = rows.iter().map(|(k, _)| k.as_str()).collect();
    let one_each = keys == expected && rows.iter().all(|(_, n)| *n == 1);
    ensure(
        one_each,
        format!("expected one order row per key, found {rows:?}"),
    )?;
    server.abort();
    // The timeline, written off the request path: flushed, then read as the console does.
    timeline.close().await;
    let k1 = intent.key().as_str();
    let story = key_arrivals(&SqlStore::from(store), "demo", k1)
        .await?
        .ok_or("the first key has no arrival timeline")?;
    let (executed, replayed) = (
        story.count(idem_core::ArrivalDecision::Executed),
        story.count(idem_core::ArrivalDecision::Replayed),
    );
    ensure(
        executed == 1 && replayed == 8,
        format!("timeline of {k1}: {}", story.summary()),
    )?;
    let k2 = fresh.key().as_str();
    Ok(format!(
        "  key {k1}: 8 concurrent sends ({retries} retries after 409) + 1 retry -> order {first}, \
         {replays}+1 replays\n  timeline: {}\n  same key, other body -> 422\n  \
         key {k2} -> order {second}\n  SQL: exactly one order row for each of the {} keys",
        story.summary(),
        rows.len()
    ))
}
