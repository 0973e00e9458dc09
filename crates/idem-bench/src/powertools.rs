//! `idem bench powertools`: single-caller replays through idem's store against AWS Lambda
//! Powertools' idempotency utility (Python, its Redis persistence layer) on the same Redis,
//! in the same run.
//!
//! Both sides execute one request once and then repeat it, one call at a time, for the
//! same time; every repeat is a replay. idem's call is what a caller of the store does per
//! request: fingerprint the JSON body (canonical, SHA-256) and claim, which answers with
//! the stored result, on one thread (the peer is one Python thread). idem runs twice: as
//! it ships, answering from its in-process copy of final records once it read the
//! record, and with that copy off, so every replay is one `GET` (Powertools' own local
//! cache is off by default, and stays off). Powertools' is its
//! `idempotent_function` as it ships (payload hash, its Redis reads). The sides alternate
//! `rounds` times so drift in the machine's load hits both. The peer runs from `peers/powertools/run.sh` (a virtualenv of pinned
//! versions, made on first use).
//!
//! Owns only the measurement: it must not configure either side beyond its defaults.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use idem_core::{
    Claim, ClaimRequest, Fingerprint, Fingerprinter, IdempotencyKey, IdempotencyStore, OwnerId,
    Principal, RequestParts, Scope, StoredResult, TenantId,
};
use serde::{Deserialize, Serialize};

use crate::gateway::BenchError;

/// The bar: idem's single-caller replays per second over Powertools'.
pub const TARGET: f64 = 10.0;

/// What to run.
#[derive(Debug, Clone)]
pub struct PowertoolsOptions {
    pub redis_url: String,
    /// Length of one side's turn.
    pub phase: Duration,
    /// Turns per side, alternating.
    pub rounds: usize,
    /// The peer's launcher; default `peers/powertools/run.sh` of this crate's sources.
    pub script: Option<PathBuf>,
}

/// One side's turns.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Side {
    pub calls: u64,
    pub seconds: f64,
    pub per_second: f64,
    /// Each turn's rate.
    pub turns: Vec<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PowertoolsReport {
    /// The Redis-compatible server and its version.
    pub server: String,
    /// idem as it ships: a replay the store read once is answered from its in-process
    /// copy of final records.
    pub idem: Side,
    /// idem with that copy off: every replay is one `GET`.
    pub idem_round_trip: Side,
    pub powertools: Side,
    /// idem ÷ Powertools replays per second.
    pub ratio: f64,
    /// idem without the copy ÷ Powertools.
    pub ratio_round_trip: f64,
    pub target: f64,
    pub meets_target: bool,
}

impl PowertoolsReport {
    pub fn to_text(&self) -> String {
        format!(
            "idem bench powertools: single-caller replays on {}\n\
             \x20 idem                  {:>9.0}/s  (turns {})\n\
             \x20 idem, copy off        {:>9.0}/s  (turns {}; every replay a GET)\n\
             \x20 powertools            {:>9.0}/s  (turns {})\n\
             \x20 idem/powertools {:.1} (target >= {:.0}: {}); copy off {:.1}\n",
            self.server,
            self.idem.per_second,
            turns(&self.idem.turns),
            self.idem_round_trip.per_second,
            turns(&self.idem_round_trip.turns),
            self.powertools.per_second,
            turns(&self.powertools.turns),
            self.ratio,
            self.target,
            if self.meets_target { "met" } else { "NOT met" },
            self.ratio_round_trip
        )
    }
}

fn turns(t: &[f64]) -> String {
    t.iter()
        .map(|r| format!("{r:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Powertools' turn as its script reports it.
#[derive(Deserialize)]
struct PeerTurn {
    calls: u64,
    seconds: f64,
}

const BODY: &str = r#"{"user_id":"U-7318","show_id":"S-204","seats":2}"#;

/// Runs both sides, alternating, and removes every key either wrote.
pub async fn bench(options: PowertoolsOptions) -> Result<PowertoolsReport, BenchError> {
    // One caller on one thread, as the peer is one Python thread: the store's connection
    // and its caller share a current-thread runtime, so a reply wakes the caller without
    // a hop between worker threads.
    tokio::task::spawn_blocking(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| BenchError::Setup(format!("a runtime for the bench: {e}")))?
            .block_on(on_one_thread(options))
    })
    .await
    .map_err(|e| BenchError::Setup(format!("the bench's thread: {e}")))?
}

async fn on_one_thread(options: PowertoolsOptions) -> Result<PowertoolsReport, BenchError> {
    let run = uuid::Uuid::now_v7().simple().to_string();
    let prefix = format!("idem-bench-pt-{run}");
    let mut open = idem_sql::OpenOptions::default();
    open.redis_prefix = Some(prefix.clone());
    let opened = idem_sql::Store::open(&options.redis_url, &open)
        .await
        .map_err(|e| BenchError::Setup(format!("opening {}: {e}", options.redis_url)))?;
    let server = opened
        .redis()
        .map_or_else(|| "redis".to_string(), |r| r.server().to_string());
    let store = opened.records();
    // The same records through a store that keeps no copy of them.
    let mut bare = idem_redis::RedisOptions::default();
    bare.prefix = prefix.clone();
    bare.finished = idem_redis::FinishedLimits::off();
    let round_trip = idem_redis::RedisStore::connect(&options.redis_url, bare)
        .await
        .map_err(|e| BenchError::Setup(format!("opening {}: {e}", options.redis_url)))?;
    let script = options.script.clone().unwrap_or_else(|| {
        PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/peers/powertools/run.sh"
        ))
    });
    let measured = async {
        let mut idem = Vec::new();
        let mut bare = Vec::new();
        let mut peer = Vec::new();
        let request = seed(&*store, &run).await?;
        for round in 0..options.rounds.max(1) {
            // Each side goes first as often as the others.
            for side in (0..3).map(|s| (s + round) % 3) {
                match side {
                    0 => idem.push(idem_turn(&*store, &request, options.phase).await?),
                    1 => bare.push(idem_turn(&round_trip, &request, options.phase).await?),
                    _ => peer.push(peer_turn(&script, &options, &prefix).await?),
                }
            }
        }
        Ok::<_, BenchError>((idem, bare, peer))
    }
    .await;
    // The peer's keys are `<prefix>#<hash>`, the store's `<prefix>:…`.
    let cleaned = async {
        crate::cleanup::unlink_prefix_at(&options.redis_url, &prefix).await?;
        let client = redis::Client::open(options.redis_url.as_str())?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}#*"))
            .query_async(&mut conn)
            .await?;
        if !keys.is_empty() {
            redis::cmd("UNLINK")
                .arg(&keys)
                .query_async::<i64>(&mut conn)
                .await?;
        }
        Ok::<_, redis::RedisError>(())
    }
    .await;
    let (idem, bare, peer) = measured?;
    cleaned.map_err(|e| BenchError::Setup(format!("removing the bench keys: {e}")))?;
    let idem = side(&idem);
    let idem_round_trip = side(&bare);
    let powertools = side(&peer);
    let over_peer = |s: &Side| {
        if powertools.per_second > 0.0 {
            s.per_second / powertools.per_second
        } else {
            0.0
        }
    };
    let ratio = over_peer(&idem);
    let ratio_round_trip = over_peer(&idem_round_trip);
    Ok(PowertoolsReport {
        server,
        idem,
        idem_round_trip,
        powertools,
        ratio,
        ratio_round_trip,
        target: TARGET,
        meets_target: ratio >= TARGET,
    })
}

fn side(turns: &[(u64, f64)]) -> Side {
    let calls = turns.iter().map(|t| t.0).sum();
    let seconds = turns.iter().map(|t| t.1).sum::<f64>();
    Side {
        calls,
        seconds,
        per_second: calls as f64 / seconds.max(1e-9),
        turns: turns.iter().map(|t| t.0 as f64 / t.1.max(1e-9)).collect(),
    }
}

/// Executes the request once: claim and complete.
async fn seed(store: &dyn IdempotencyStore, run: &str) -> Result<ClaimRequest, BenchError> {
    let setup = |e: &dyn std::fmt::Display| BenchError::Setup(e.to_string());
    let request = ClaimRequest {
        scope: Scope::new(
            TenantId::new("bench").map_err(|e| setup(&e))?,
            IdempotencyKey::new(format!("replay-{run}")).map_err(|e| setup(&e))?,
        ),
        principal: Principal::new("bench").map_err(|e| setup(&e))?,
        fingerprint: fingerprint(),
        owner: OwnerId::new("bench").map_err(|e| setup(&e))?,
        lease: Duration::from_secs(30),
    };
    match store.claim(&request).await.map_err(|e| setup(&e))? {
        Claim::Proceed(token) => {
            let result = StoredResult {
                status: 201,
                headers: vec![("content-type".into(), "application/json".into())],
                body: br#"{"order_id":"O-1","status":"PENDING_PAYMENT"}"#.to_vec(),
                result_ref: None,
            };
            store
                .complete(&token, result)
                .await
                .map_err(|e| setup(&e))?;
            Ok(request)
        }
        other => Err(BenchError::Setup(format!(
            "a fresh key answered {}",
            other.decision()
        ))),
    }
}

fn fingerprint() -> Fingerprint {
    Fingerprinter::new().fingerprint(&RequestParts {
        method: "POST",
        path: "/v1/orders",
        query: None,
        principal: "bench",
        content_type: Some("application/json"),
        body: BODY.as_bytes(),
        headers: &[],
    })
}

/// One caller replaying `request` back to back for `phase`.
async fn idem_turn(
    store: &dyn IdempotencyStore,
    request: &ClaimRequest,
    phase: Duration,
) -> Result<(u64, f64), BenchError> {
    let started = Instant::now();
    let deadline = started + phase;
    let mut calls = 0u64;
    let mut request = request.clone();
    while Instant::now() < deadline {
        request.fingerprint = fingerprint();
        match store.claim(&request).await {
            Ok(Claim::Replay(_)) => calls += 1,
            Ok(other) => {
                return Err(BenchError::Setup(format!(
                    "a replay answered {}",
                    other.decision()
                )))
            }
            Err(e) => return Err(BenchError::Setup(format!("claim: {e}"))),
        }
    }
    Ok((calls, started.elapsed().as_secs_f64()))
}

async fn peer_turn(
    script: &std::path::Path,
    options: &PowertoolsOptions,
    prefix: &str,
) -> Result<(u64, f64), BenchError> {
    let out = tokio::process::Command::new(script)
        .arg("--redis-url")
        .arg(&options.redis_url)
        .arg("--prefix")
        .arg(prefix)
        .arg("--seconds")
        .arg(options.phase.as_secs_f64().to_string())
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| BenchError::Setup(format!("{}: {e}", script.display())))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().rev().find(|l| l.starts_with('{'));
    match (out.status.success(), line) {
        (true, Some(line)) => {
            let turn: PeerTurn = serde_json::from_str(line)
                .map_err(|e| BenchError::Setup(format!("the peer's report {line}: {e}")))?;
            Ok((turn.calls, turn.seconds))
        }
        _ => Err(BenchError::Setup(format!(
            "the peer failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .rev()
                .take(10)
                .collect::<Vec<_>>()
                .join(" | ")
        ))),
    }
}
