//! `idem drill`: the seed's acceptance check as an operator tool.
//!
//! Fires N concurrent arrivals of one fresh intent at the configured store (one
//! execution expected, every other arrival a replay of the first result), then one
//! arrival with the same key and a different payload (a mismatch expected), and reads
//! whether the UNIQUE guard exists in the live schema. It writes only drill records under
//! its own tenant and never touches business rows.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::{
    Claim, ClaimRequest, Fingerprinter, IdempotencyKey, IdempotencyStore, OwnerId, Principal,
    RequestParts, Scope, StoreError, StoredResult, TenantId,
};
use serde::Serialize;
use tokio::sync::Barrier;

use crate::cli::{passed, print_json, CliResult};

#[derive(clap::Args)]
pub struct DrillArgs {
    /// Concurrent duplicates of one fresh intent to fire.
    #[arg(long, default_value_t = 64)]
    duplicates: usize,
    /// Print the result as JSON (a failure as an `error` object).
    #[arg(long)]
    json: bool,
}

/// `idem drill`: exit 1 when the drill failed.
pub async fn run(url: &str, args: DrillArgs) -> CliResult {
    let store = crate::open::open_store(url).await?;
    let report = fire(store, args.duplicates).await?;
    if args.json {
        print_json(&report);
    } else {
        print_human(&report);
    }
    Ok(passed(report.passed))
}

#[derive(Debug, Serialize)]
pub struct DrillReport {
    pub backend: String,
    pub tenant: String,
    pub key: String,
    pub duplicates: usize,
    pub executions: usize,
    pub replays: usize,
    /// Whether every replay returned the first execution's result.
    pub replays_identical: bool,
    /// Arrivals that found the first execution still in progress at least once.
    pub in_progress: usize,
    pub mismatches: usize,
    pub unique_guard: bool,
    pub errors: Vec<String>,
    pub order_id: Option<String>,
    pub elapsed_ms: u128,
    pub passed: bool,
}

enum Arrival {
    Executed(Vec<u8>),
    Replayed(Vec<u8>),
    Failed(String),
}

fn request(tenant: &TenantId, key: &IdempotencyKey, payload: &str, owner: String) -> ClaimRequest {
    let principal = Principal::new("drill").expect("static principal");
    let fingerprint = Fingerprinter::new().fingerprint(&RequestParts {
        method: "POST",
        path: "/v1/orders",
        query: None,
        principal: principal.as_str(),
        content_type: Some("application/json"),
        body: payload.as_bytes(),
        headers: &[],
    });
    ClaimRequest {
        scope: Scope::new(tenant.clone(), key.clone()),
        principal,
        fingerprint,
        owner: OwnerId::new(owner).expect("owner id"),
        lease: Duration::from_secs(30),
    }
}

async fn arrive(
    store: Arc<dyn IdempotencyStore>,
    req: ClaimRequest,
    saw_wait: &AtomicUsize,
) -> Arrival {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut waited = false;
    loop {
        if Instant::now() > deadline {
            return Arrival::Failed("gave up waiting for the first execution".into());
        }
        match store.claim(&req).await {
            Ok(Claim::Proceed(token)) => {
                // The "business action": mint the order id once, inside the execution.
                tokio::time::sleep(Duration::from_millis(20)).await;
                let order_id = format!("ord_{}", uuid::Uuid::now_v7().simple());
                let body = serde_json::json!({"order_id": order_id, "status": "pending_payment"})
                    .to_string()
                    .into_bytes();
                let result = StoredResult {
                    status: 201,
                    headers: vec![("content-type".into(), "application/json".into())],
                    body: body.clone(),
                    result_ref: Some(order_id),
                };
                return match store.complete(&token, result).await {
                    Ok(_) => Arrival::Executed(body),
                    Err(e) => Arrival::Failed(format!("complete: {e}")),
                };
            }
            Ok(Claim::InProgress { .. }) => {
                if !waited {
                    waited = true;
                    saw_wait.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Ok(Claim::Replay(record)) => {
                return match record.result {
                    Some(r) => Arrival::Replayed(r.body),
                    None => Arrival::Failed("replayed record has no result".into()),
                }
            }
            Ok(Claim::Mismatch { .. }) => {
                return Arrival::Failed("same payload reported as mismatch".into())
            }
            Err(e) if e.is_unavailable() => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => return Arrival::Failed(format!("claim: {e}")),
        }
    }
}

/// Fires the drill at `store` and reads the outcome.
pub async fn fire(
    store: Arc<dyn IdempotencyStore>,
    duplicates: usize,
) -> Result<DrillReport, StoreError> {
    if duplicates == 0 {
        return Err(StoreError::InvalidInput(
            "--duplicates must be at least 1".into(),
        ));
    }
    let started = Instant::now();
    let tenant = TenantId::new("idem-drill").expect("static tenant");
    let key = IdempotencyKey::new(format!("drill-{}", uuid::Uuid::now_v7())).expect("uuid key");
    let payload = r#"{"user_id":"U-7318","show_id":"S-204","quantity":1}"#;
    let unique_guard = store.unique_guard().await?;

    let barrier = Arc::new(Barrier::new(duplicates));
    let saw_wait = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::with_capacity(duplicates);
    for i in 0..duplicates {
        let store = store.clone();
        let barrier = barrier.clone();
        let saw_wait = saw_wait.clone();
        let req = request(&tenant, &key, payload, format!("drill-{i}"));
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            arrive(store, req, &saw_wait).await
        }));
    }
    let mut executed = Vec::new();
    let mut replayed = Vec::new();
    let mut errors = Vec::new();
    for t in tasks {
        match t.await {
            Ok(Arrival::Executed(b)) => executed.push(b),
            Ok(Arrival::Replayed(b)) => replayed.push(b),
            Ok(Arrival::Failed(e)) => errors.push(e),
            Err(e) => errors.push(format!("task: {e}")),
        }
    }
    let replays_identical = executed.len() == 1 && replayed.iter().all(|b| *b == executed[0]);

    // Same key, different payload: must be refused, never replayed or executed.
    let other = request(
        &tenant,
        &key,
        r#"{"user_id":"U-7318","show_id":"S-204","quantity":2}"#,
        "drill-mismatch".into(),
    );
    let mismatches = match store.claim(&other).await {
        Ok(Claim::Mismatch { .. }) => 1,
        Ok(other) => {
            errors.push(format!(
                "different payload was not refused: {}",
                other.decision()
            ));
            0
        }
        Err(e) => {
            errors.push(format!("mismatch claim: {e}"));
            0
        }
    };
    let order_id = executed.first().and_then(|b| {
        serde_json::from_slice::<serde_json::Value>(b)
            .ok()
            .and_then(|v| v["order_id"].as_str().map(str::to_string))
    });
    let executions = executed.len();
    let passed = executions == 1
        && replayed.len() == duplicates - 1
        && replays_identical
        && mismatches == 1
        && unique_guard
        && errors.is_empty();
    Ok(DrillReport {
        backend: store.backend().to_string(),
        tenant: tenant.to_string(),
        key: key.to_string(),
        duplicates,
        executions,
        replays: replayed.len(),
        replays_identical,
        in_progress: saw_wait.load(Ordering::Relaxed),
        mismatches,
        unique_guard,
        errors,
        order_id,
        elapsed_ms: started.elapsed().as_millis(),
        passed,
    })
}

pub fn print_human(r: &DrillReport) {
    println!(
        "idem drill on {} ({} duplicates of one intent, key {})",
        r.backend, r.duplicates, r.key
    );
    println!("  executions        {:>6}   (expected 1)", r.executions);
    println!(
        "  replays           {:>6}   (expected {}; identical to the first result: {})",
        r.replays,
        r.duplicates.saturating_sub(1),
        r.replays_identical
    );
    println!("  saw in progress   {:>6}", r.in_progress);
    println!("  mismatch refused  {:>6}   (expected 1)", r.mismatches);
    println!(
        "  unique guard      {:>6}",
        if r.unique_guard { "yes" } else { "MISSING" }
    );
    if let Some(id) = &r.order_id {
        println!("  order id          {id}");
    }
    for e in &r.errors {
        println!("  error: {e}");
    }
    println!(
        "{} in {} ms",
        if r.passed { "PASSED" } else { "FAILED" },
        r.elapsed_ms
    );
}
