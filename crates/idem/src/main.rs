//! The `idem` command line: one binary for operators and developers.
//!
//! It parses arguments, opens the configured store and calls into the library crates;
//! the rules themselves live in idem-core and the stores, never here.

use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};
use idem_core::{IdempotencyKey, StoreError, TenantId};

mod bench;
mod bench_lock;
mod chaos;
mod drill;
mod keys;
mod lock;
mod log;
mod open;
mod reconcile;
mod service;
mod settings;
mod signal;
mod sweep;

#[derive(Parser)]
#[command(
    name = "idem",
    version,
    about = "Make one business intent take effect once."
)]
struct Cli {
    /// Store to use: sqlite://PATH (default ./idem-data/idem.db).
    #[arg(long, global = true, env = "IDEM_DATABASE_URL")]
    database_url: Option<String>,
    /// Log lines on stderr as text or as one JSON object per line (filter: IDEM_LOG,
    /// else RUST_LOG).
    #[arg(
        long,
        global = true,
        env = "IDEM_LOG_FORMAT",
        value_enum,
        default_value_t
    )]
    log_format: log::LogFormat,
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Retention: move terminal records past their window one tier down (retry →
    /// replay → dispute → archive), recover stale PROCESSING records, expire the archive.
    /// Windows from IDEM_RETENTION_* / IDEM_REPLAY_* (see idem_sweep::config).
    Sweep {
        /// Count what would move; write nothing.
        #[arg(long)]
        dry_run: bool,
        /// Sweep as of this time (RFC 3339) instead of the store's clock. The stale
        /// PROCESSING scan never uses a time ahead of the store's clock.
        #[arg(long)]
        now: Option<String>,
        /// Print the summary (counts per transition) as JSON.
        #[arg(long)]
        json: bool,
        /// Share of wall time spent working, in [0.01, 1]: after each batch the sweep rests
        /// so claims on the same database keep their latency.
        #[arg(long, default_value_t = idem_sweep::DEFAULT_DUTY, value_parser = parse_duty)]
        duty: f64,
    },
    /// Fire N concurrent duplicates of one fresh intent and check exactly one executes.
    Drill {
        /// Concurrent duplicates of one fresh intent to fire.
        #[arg(long, default_value_t = 64)]
        duplicates: usize,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
    /// Inspect idempotency records.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Reverse proxy in front of any HTTP service: requires keys, coalesces duplicates,
    /// keeps a short window, never mints a key.
    Gateway {
        /// Address to listen on (default 127.0.0.1:8080, or the config file's).
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
        /// The upstream base URL (http://host:port or https://host[:port]). Repeat it
        /// for several copies of one service on one database: each request goes to the
        /// least busy one that answers.
        #[arg(long, value_name = "URL")]
        upstream: Vec<String>,
        /// A private CA (PEM) an https:// upstream's certificate may chain to, besides
        /// the Mozilla roots.
        #[arg(long, env = "IDEM_UPSTREAM_CA_FILE", value_name = "PATH")]
        upstream_ca_file: Option<std::path::PathBuf>,
        /// Share the short window through Redis with other gateway instances
        /// (redis:// or rediss://).
        #[arg(long)]
        redis_url: Option<String>,
        /// For rediss://: the CA (PEM) the Redis server's certificate must chain to,
        /// instead of the system's trust store.
        #[arg(long, env = "IDEM_REDIS_CA_FILE", value_name = "PATH")]
        redis_ca_file: Option<std::path::PathBuf>,
        /// Serve HTTPS with this certificate chain (PEM); needs --tls-key.
        #[arg(long, env = "IDEM_TLS_CERT", value_name = "PATH", requires = "tls_key")]
        tls_cert: Option<std::path::PathBuf>,
        /// The private key (PEM) of --tls-cert.
        #[arg(long, env = "IDEM_TLS_KEY", value_name = "PATH", requires = "tls_cert")]
        tls_key: Option<std::path::PathBuf>,
        /// The gateway's configuration (TOML, or JSON): routes, API keys → tenants,
        /// windows, timeouts. Its flags override the file.
        #[arg(long, env = "IDEM_CONFIG", value_name = "PATH")]
        config: Option<std::path::PathBuf>,
    },
    /// Run the ticketing order service (SQLite by default, or PostgreSQL).
    Serve {
        /// Settings from a TOML file whose keys are these flags; a flag or its
        /// environment variable wins over the file.
        #[arg(long, env = "IDEM_CONFIG", value_name = "PATH")]
        config: Option<std::path::PathBuf>,
        /// Address to listen on (default 127.0.0.1:8080).
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// TENANT=SECRET (repeatable); clients send `Authorization: Bearer SECRET`. The
        /// command line shows in `ps`: prefer IDEM_API_KEYS (comma-separated
        /// TENANT=SECRET) or --api-keys-file.
        #[arg(long = "api-key")]
        api_keys: Vec<String>,
        /// A file of TENANT=SECRET lines (blank lines and `#` comments skipped).
        #[arg(long, value_name = "PATH")]
        api_keys_file: Option<std::path::PathBuf>,
        /// Enables the admin API (freezes, shows), `/metrics` and the console; at least 16
        /// characters. The command line shows in `ps`: prefer IDEM_ADMIN_TOKEN or
        /// --admin-token-file.
        #[arg(long, env = "IDEM_ADMIN_TOKEN", hide_env_values = true)]
        admin_token: Option<String>,
        /// Read the admin token from this file (its first line).
        #[arg(long, value_name = "PATH")]
        admin_token_file: Option<std::path::PathBuf>,
        /// Relay the outbox to NATS JetStream instead of in process (nats:// or tls://).
        #[arg(long, env = "IDEM_NATS_URL", hide_env_values = true)]
        nats_url: Option<String>,
        /// A private CA (PEM) the NATS server's certificate may chain to.
        #[arg(
            long,
            env = "IDEM_NATS_CA_FILE",
            value_name = "PATH",
            requires = "nats_url"
        )]
        nats_ca_file: Option<std::path::PathBuf>,
        /// Serve HTTPS with this certificate chain (PEM); needs --tls-key. The metrics
        /// listener serves HTTPS too.
        #[arg(long, env = "IDEM_TLS_CERT", value_name = "PATH", requires = "tls_key")]
        tls_cert: Option<std::path::PathBuf>,
        /// The private key (PEM) of --tls-cert.
        #[arg(long, env = "IDEM_TLS_KEY", value_name = "PATH", requires = "tls_cert")]
        tls_key: Option<std::path::PathBuf>,
        /// How often the retention sweeper runs beside the server (0s: never).
        #[arg(long, value_parser = lock::parse_duration, default_value = "5m")]
        sweep_every: Duration,
        /// A request head must arrive within this, or the connection is closed (an idle
        /// keep-alive connection is closed after it too).
        #[arg(long, value_parser = lock::parse_duration, default_value = "10s")]
        header_read_timeout: Duration,
        /// A request body must arrive in full within this, or the answer is 408.
        #[arg(long, value_parser = lock::parse_duration, default_value = "10s")]
        body_read_timeout: Duration,
        /// On SIGTERM or SIGINT, requests in flight get this long to finish; executions
        /// still running then are cut off and their keys left FAILED_RETRYABLE.
        #[arg(long, value_parser = lock::parse_duration, default_value = "10s")]
        shutdown_grace: Duration,
        /// Also serve `/metrics`, without credentials, on this address (keep it internal).
        #[arg(long)]
        metrics_listen: Option<std::net::SocketAddr>,
        /// Reverse proxies (addresses or CIDR blocks; repeatable or comma-separated) whose
        /// X-Forwarded-For names the client of a console login, for its throttle and
        /// audit. Default none: the peer is the client.
        #[arg(long, value_delimiter = ',', value_name = "ADDR|CIDR")]
        trusted_proxies: Vec<idem_orders::IpNet>,
        /// Give the console's session cookie `Secure` on plain HTTP too, when TLS ends at
        /// a proxy in front (with --tls-cert it always has it).
        #[arg(long)]
        console_secure_cookie: bool,
        #[command(flatten)]
        tuning: service::ServeTuning,
    },
    /// Freeze the automatic chain for a scope (user:U, show:S or all).
    Freeze {
        /// What to act on: user:U, show:S or all.
        #[arg(long)]
        scope: String,
        /// payment-confirm,ticketing,inventory-release (or all)
        #[arg(long, default_value = "all")]
        what: String,
        /// The tenant, as the service authenticated it.
        #[arg(long)]
        tenant: Option<String>,
        /// Why, in words; recorded with the change.
        #[arg(long)]
        reason: Option<String>,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
    /// Lift a freeze; queued work resumes.
    Unfreeze {
        /// What to act on: user:U, show:S or all.
        #[arg(long)]
        scope: String,
        /// Which automatic steps, comma-separated (payment-confirm, ticketing, inventory-release); all when omitted.
        #[arg(long, default_value = "all")]
        what: String,
        /// The tenant, as the service authenticated it.
        #[arg(long)]
        tenant: Option<String>,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
    /// Demonstrations.
    Demo {
        #[command(subcommand)]
        command: DemoCommand,
    },
    /// Reconcile duplicate orders across the four ledgers (orders, payments, inventory
    /// holds, messages): keep one order per intent, cancel and refund the others through
    /// the state machine, release their holds, stop their messages. Dry run by default.
    /// Exit 1 when a ledger check fails, 3 when --apply is refused (chain not frozen).
    Reconcile {
        /// The tenant, as the service authenticated it.
        #[arg(long)]
        tenant: Option<String>,
        /// Only this user's orders.
        #[arg(long)]
        user: Option<String>,
        /// Only this show's orders.
        #[arg(long)]
        show: Option<String>,
        /// Orders created at or after this time (RFC 3339).
        #[arg(long)]
        since: Option<String>,
        /// Orders created before this time (RFC 3339).
        #[arg(long)]
        until: Option<String>,
        /// Orders of one session this close to the intent's first order are one intent.
        #[arg(long, value_parser = lock::parse_duration, default_value = "2m")]
        window: Duration,
        /// Execute the plan (every action is idempotent; rerunning changes nothing).
        #[arg(long)]
        apply: bool,
        /// Apply even though the automatic chain is not frozen for the scope.
        #[arg(long)]
        force: bool,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long, conflicts_with = "html")]
        json: bool,
        /// Write a self-contained HTML report to FILE.
        #[arg(long, value_name = "FILE")]
        html: Option<std::path::PathBuf>,
    },
    /// Apply the store's schema migrations (also done on open).
    Migrate,
    /// Print a shell completion script (bash, zsh, fish, powershell, elvish) to stdout.
    Completions {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
    /// Leases with fencing tokens: acquire, renew, release, show, force-release.
    Lock {
        #[command(subcommand)]
        command: LockCommand,
    },
    /// Benchmarks that print ratios against a baseline measured in the same run.
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
    /// Exactly-once under faults: start N servers and M gateways on PostgreSQL, Redis
    /// (and NATS), drive a seeded workload, inject kills, stops, connection and network
    /// faults, then check the ledgers. Exit 1 on any anomaly.
    Chaos(chaos::ChaosArgs),
}

#[derive(Subcommand)]
enum DemoCommand {
    /// Replay the 20:14 incident with and without idem, side by side.
    Incident {
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum LockCommand {
    /// Acquire NAME for OWNER; non-zero exit when not acquired.
    Acquire {
        /// The lease name.
        name: String,
        /// The holder's owner id.
        #[arg(long)]
        owner: String,
        /// Lease length: 500ms, 3s, 2m …
        #[arg(long, value_parser = lock::parse_duration)]
        ttl: Duration,
        /// Wait up to this long for the holder to go away.
        #[arg(long, value_parser = lock::parse_duration, default_value = "0s")]
        wait: Duration,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
    /// Renew a lease you hold (owner and token must match).
    Renew {
        /// The lease name.
        name: String,
        /// The holder's owner id.
        #[arg(long)]
        owner: String,
        /// The fencing token the holder was granted.
        #[arg(long)]
        token: i64,
        /// How long the lease lasts from now, e.g. 3s.
        #[arg(long, value_parser = lock::parse_duration)]
        ttl: Duration,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
    /// Release a lease you hold; non-zero exit when you are not the holder.
    Release {
        /// The lease name.
        name: String,
        /// The holder's owner id.
        #[arg(long)]
        owner: String,
        /// The fencing token the holder was granted.
        #[arg(long)]
        token: i64,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
    /// Holder, token, times, renewals and recent events.
    Show {
        /// The lease name.
        name: String,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
    /// Admin: release whoever holds NAME; the reason is recorded.
    ForceRelease {
        /// The lease name.
        name: String,
        /// Why, in words; recorded with the change.
        #[arg(long)]
        reason: String,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Audit lookup by order number (result reference) in the archive.
    Audit {
        /// The order number (result reference).
        #[arg(long)]
        order: String,
        /// The tenant, as the service authenticated it.
        #[arg(long)]
        tenant: Option<String>,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
    /// Show one record: state, version, owner, times, fingerprint, result reference.
    Show {
        /// The idempotency key.
        key: String,
        /// The tenant, as the service authenticated it.
        #[arg(long)]
        tenant: String,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Requests per second through the gateway against the upstream directly and nginx
    /// proxy_pass, plus a duplicate storm that must cost one upstream call.
    Gateway {
        /// Share the window through this Redis during the keyed scenarios.
        #[arg(long)]
        redis_url: Option<String>,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
    /// Lease acquire+release cycles against the raw driver's classic lock.
    Lock {
        /// Concurrent tasks driving the load.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// Seconds per side.
        #[arg(long, default_value_t = 4.0)]
        duration: f64,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
    /// Requests per second through an axum app with the layer against the same app
    /// without it (fresh keys, replay hits) and the store's own claim+complete rate, on
    /// the store `--database-url` names (a schema or key prefix of its own, removed
    /// afterwards) or a temporary SQLite file.
    Http {
        /// Concurrent tasks driving the load.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// Seconds per phase.
        #[arg(long, default_value_t = 1.5)]
        phase: f64,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
    /// POST /v1/orders through the order service's handler with fresh keys (claim in the
    /// order's transaction, and claim ahead) against the same create without a key, in
    /// one run, on the database `--database-url` names (a schema of its own, removed
    /// afterwards) or a temporary SQLite file
    Orders {
        /// Concurrent clients, each ordering from a show of its own.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// Seconds per side (spread over alternating slices).
        #[arg(long, default_value_t = 6.0)]
        duration: f64,
        /// Also run every client on this many shows (1: the flash sale) and report
        /// `hot_vs_spread` against each client on a show of its own.
        #[arg(long)]
        shows: Option<usize>,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
    /// Sweep N expired records: records/s, claim p99 with vs without the sweep, bytes
    /// per record in each tier.
    Sweep {
        /// Expired records to seed and sweep.
        #[arg(long, default_value_t = 1_000_000)]
        records: u64,
        /// Concurrent tasks driving the load.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// Records per sweep batch.
        #[arg(long, default_value_t = 500)]
        batch: usize,
        /// The sweeper's share of wall time, as for `idem sweep --duty`.
        #[arg(long, default_value_t = idem_sweep::DEFAULT_DUTY, value_parser = parse_duty)]
        duty: f64,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
    /// claim+complete and replay throughput against the raw driver doing the naive thing.
    Store {
        /// Concurrent tasks driving the load.
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
        /// Seconds per phase.
        #[arg(long, default_value_t = 4.0)]
        duration: f64,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
        /// Skip the PostgreSQL growth measurement (claim p50 with 1 thousand and with
        /// 1 million stored keys; the bulk load takes a while).
        #[arg(long)]
        no_growth: bool,
    },
    /// Reconcile dry run over N bulk-loaded orders (temporary SQLite file or a fresh
    /// PostgreSQL schema): orders/s against a raw ordered SELECT of the same rows.
    Reconcile {
        /// Orders to bulk-load.
        #[arg(long, default_value_t = 1_000_000)]
        orders: u64,
        /// One intent in this many is a duplicate pair.
        #[arg(long, default_value_t = 500)]
        duplicate_every: u64,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
}

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {msg}");
    ExitCode::from(2)
}

/// A failed command's error, as JSON on stdout when the command was asked for JSON (a
/// script reading stdout gets an object either way), and as a line on stderr.
fn fail_json(kind: &str, msg: impl std::fmt::Display) -> ExitCode {
    print_json(&serde_json::json!({ "error": { "kind": kind, "message": msg.to_string() } }));
    fail(msg)
}

/// Whether the command that runs has `--json` set.
fn wants_json(matches: &ArgMatches) -> bool {
    let mut m = matches;
    while let Some((_, sub)) = m.subcommand() {
        m = sub;
    }
    matches!(m.try_get_one::<bool>("json"), Ok(Some(true)))
}

fn kind_name(kind: idem_core::ErrorKind) -> &'static str {
    match kind {
        idem_core::ErrorKind::InvalidInput => "invalid_input",
        idem_core::ErrorKind::Conflict => "conflict",
        idem_core::ErrorKind::NotFound => "not_found",
        idem_core::ErrorKind::Unavailable => "unavailable",
        _ => "backend",
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cmd = settings::with_env(Cli::command());
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let matches = match settings::parse(&cmd, args) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let json = wants_json(&matches);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Err(e) = log::init(cli.log_format) {
        return if json {
            fail_json("invalid_input", e)
        } else {
            fail(e)
        };
    }
    let url = cli.database_url.clone().unwrap_or_else(open::default_url);
    match run(cli.command, &url, cli.database_url.clone()).await {
        Ok(code) => code,
        Err(e) if json => fail_json(kind_name(e.kind()), e),
        Err(e) => fail(e),
    }
}

fn print_json<T: serde::Serialize>(v: &T) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).expect("serialisable report")
    );
}

/// `url` is the store to use; `explicit_url` is set only when the operator named one
/// (the demo uses a temporary store otherwise).
async fn run(
    command: Command,
    url: &str,
    explicit_url: Option<String>,
) -> Result<ExitCode, StoreError> {
    match command {
        Command::Chaos(args) => chaos::run(explicit_url, args).await,
        Command::Drill { duplicates, json } => {
            let store = open::open_store(url).await?;
            let report = drill::run(store, duplicates).await?;
            if json {
                print_json(&report);
            } else {
                drill::print_human(&report);
            }
            Ok(if report.passed {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Keys {
            command: KeysCommand::Show { key, tenant, json },
        } => {
            let tenant =
                TenantId::new(tenant).map_err(|e| StoreError::InvalidInput(e.to_string()))?;
            let key =
                IdempotencyKey::new(key).map_err(|e| StoreError::InvalidInput(e.to_string()))?;
            let store = open::open_store(url).await?;
            match keys::show(store.as_ref(), &tenant, &key).await? {
                Some(v) if json => print_json(&v),
                Some(v) => keys::print_human(&v),
                None => {
                    // Past the online tiers the key may be in the archive.
                    let archived = match open::open_archive(url).await? {
                        Some(archive) => archive.archived(&tenant, &key).await?,
                        None => None,
                    };
                    match archived {
                        Some(a) if json => print_json(&keys::archived_view(&a)),
                        Some(a) => keys::print_archived(&a),
                        None => {
                            eprintln!("no record for key {key} in tenant {tenant}");
                            return Ok(ExitCode::FAILURE);
                        }
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Keys {
            command:
                KeysCommand::Audit {
                    order,
                    tenant,
                    json,
                },
        } => {
            let tenant = tenant
                .map(TenantId::new)
                .transpose()
                .map_err(|e| StoreError::InvalidInput(e.to_string()))?;
            let Some(archive) = open::open_archive(url).await? else {
                return Err(StoreError::InvalidInput(
                    "this store keeps no archive (Redis records only expire)".into(),
                ));
            };
            let found = archive.archived_by_ref(tenant.as_ref(), &order).await?;
            if json {
                print_json(&found.iter().map(keys::archived_view).collect::<Vec<_>>());
            } else {
                for a in &found {
                    keys::print_archived(a);
                    println!();
                }
            }
            if found.is_empty() {
                eprintln!("no archived record refers to {order}");
                return Ok(ExitCode::FAILURE);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Lock { command } => {
            let store = open::open_lease_store(url).await?;
            let store = store.as_ref();
            let invalid = |e: idem_core::KeyError| StoreError::InvalidInput(e.to_string());
            let lease_err = |e: idem_core::LeaseError| StoreError::Backend(e.to_string());
            let (outcome, json) = match command {
                LockCommand::Acquire {
                    name,
                    owner,
                    ttl,
                    wait,
                    json,
                } => {
                    let name = idem_core::LeaseName::new(name).map_err(invalid)?;
                    let owner = idem_core::OwnerId::new(owner).map_err(invalid)?;
                    (lock::acquire(store, &name, &owner, ttl, wait).await, json)
                }
                LockCommand::Renew {
                    name,
                    owner,
                    token,
                    ttl,
                    json,
                } => {
                    let name = idem_core::LeaseName::new(name).map_err(invalid)?;
                    let owner = idem_core::OwnerId::new(owner).map_err(invalid)?;
                    let token = idem_core::FencingToken::new(token);
                    (lock::renew(store, &name, &owner, token, ttl).await, json)
                }
                LockCommand::Release {
                    name,
                    owner,
                    token,
                    json,
                } => {
                    let name = idem_core::LeaseName::new(name).map_err(invalid)?;
                    let owner = idem_core::OwnerId::new(owner).map_err(invalid)?;
                    let token = idem_core::FencingToken::new(token);
                    (lock::release(store, &name, &owner, token).await, json)
                }
                LockCommand::Show { name, json } => {
                    let name = idem_core::LeaseName::new(name).map_err(invalid)?;
                    (lock::show(store, &name).await, json)
                }
                LockCommand::ForceRelease { name, reason, json } => {
                    let name = idem_core::LeaseName::new(name).map_err(invalid)?;
                    (lock::force_release(store, &name, &reason).await, json)
                }
            };
            let outcome = outcome.map_err(lease_err)?;
            if json {
                print_json(&outcome.json);
            } else if outcome.ok {
                println!("{}", outcome.text);
            } else {
                eprintln!("{}", outcome.text);
            }
            Ok(if outcome.ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Sweep {
            dry_run,
            now,
            json,
            duty,
        } => sweep::run(url, dry_run, now, json, duty).await,
        Command::Bench {
            command:
                BenchCommand::Sweep {
                    records,
                    concurrency,
                    batch,
                    duty,
                    json,
                },
        } => sweep::bench(url, records, concurrency, batch, duty, json).await,
        Command::Serve {
            config,
            listen,
            api_keys,
            api_keys_file,
            admin_token,
            admin_token_file,
            nats_url,
            nats_ca_file,
            tls_cert,
            tls_key,
            sweep_every,
            header_read_timeout,
            body_read_timeout,
            shutdown_grace,
            metrics_listen,
            trusted_proxies,
            console_secure_cookie,
            tuning,
        } => {
            service::serve(
                url,
                service::ServeArgs {
                    config,
                    listen,
                    api_keys,
                    api_keys_file,
                    admin_token,
                    admin_token_file,
                    nats_url,
                    nats_ca_file,
                    tls: idem_net::tls::CertFiles::pair(tls_cert, tls_key)
                        .map_err(StoreError::InvalidInput)?,
                    sweep_every,
                    header_read_timeout,
                    body_read_timeout,
                    shutdown_grace,
                    metrics_listen,
                    trusted_proxies,
                    console_secure_cookie,
                    tuning,
                },
            )
            .await
        }
        Command::Freeze {
            scope,
            what,
            tenant,
            reason,
            json,
        } => {
            let request = service::freeze_request(&scope, &what, tenant, reason)?;
            service::freeze(url, request, false, json).await
        }
        Command::Unfreeze {
            scope,
            what,
            tenant,
            json,
        } => {
            let request = service::freeze_request(&scope, &what, tenant, None)?;
            service::freeze(url, request, true, json).await
        }
        Command::Demo {
            command: DemoCommand::Incident { json },
        } => service::demo_incident(explicit_url.clone(), json).await,
        Command::Reconcile {
            tenant,
            user,
            show,
            since,
            until,
            window,
            apply,
            force,
            json,
            html,
        } => {
            let args = reconcile::ReconcileArgs {
                tenant,
                user,
                show,
                since,
                until,
                window,
                apply,
                force,
                json,
                html,
            };
            reconcile::run(url, args).await
        }
        Command::Bench {
            command:
                BenchCommand::Reconcile {
                    orders,
                    duplicate_every,
                    json,
                },
        } => reconcile::bench(url, orders, duplicate_every, json).await,
        Command::Bench {
            command:
                BenchCommand::Lock {
                    concurrency,
                    duration,
                    json,
                },
        } => {
            if !(duration.is_finite() && duration > 0.0) {
                return Err(StoreError::InvalidInput(
                    "--duration must be a positive number of seconds".into(),
                ));
            }
            let report =
                bench_lock::run(url, concurrency, Duration::from_secs_f64(duration)).await?;
            if json {
                print_json(&report);
            } else {
                bench_lock::print_human(&report);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench {
            command:
                BenchCommand::Http {
                    concurrency,
                    phase,
                    json,
                },
        } => {
            if !(phase.is_finite() && phase > 0.0) || concurrency == 0 {
                return Err(StoreError::InvalidInput(
                    "--phase and --concurrency must be positive".into(),
                ));
            }
            // Without an explicit URL: a temporary SQLite file, not the working one.
            let report = idem_bench::http::bench(idem_bench::http::BenchOptions {
                phase: Duration::from_secs_f64(phase),
                concurrency,
                database_url: explicit_url,
                ..Default::default()
            })
            .await
            .map_err(|e| StoreError::Backend(e.to_string()))?;
            if json {
                print_json(&report);
            } else {
                println!("{}", serde_json::to_string_pretty(&report).expect("report"));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench {
            command:
                BenchCommand::Orders {
                    concurrency,
                    duration,
                    shows,
                    json,
                },
        } => {
            if !(duration.is_finite() && duration > 0.0) || concurrency == 0 {
                return Err(StoreError::InvalidInput(
                    "--duration and --concurrency must be positive".into(),
                ));
            }
            let report = idem_bench::orders::bench(idem_bench::orders::OrdersBenchOptions {
                database_url: explicit_url,
                concurrency,
                duration: Duration::from_secs_f64(duration),
                shows,
            })
            .await
            .map_err(|e| StoreError::Backend(e.to_string()))?;
            if json {
                print_json(&report);
            } else {
                idem_bench::orders::print_human(&report);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Gateway {
            listen,
            upstream,
            upstream_ca_file,
            redis_url,
            redis_ca_file,
            tls_cert,
            tls_key,
            config,
        } => {
            let gw_err = |e: idem_gateway::GatewayError| StoreError::InvalidInput(e.to_string());
            let cfg = match config {
                Some(path) => idem_gateway::GatewayConfig::from_file(path).map_err(gw_err)?,
                None => idem_gateway::GatewayConfig::default(),
            };
            // flag > IDEM_* variable > file > default.
            let mut cfg = cfg.with_env(std::env::vars()).map_err(gw_err)?;
            if let Some(l) = listen {
                cfg.listen = l;
            }
            if !upstream.is_empty() {
                cfg.set_upstreams(upstream);
            } else if cfg.upstream_urls().is_empty() {
                return Err(StoreError::InvalidInput(
                    "--upstream URL is required".into(),
                ));
            }
            if redis_url.is_some() {
                cfg.redis_url = redis_url;
            }
            if upstream_ca_file.is_some() {
                cfg.upstream_ca_file = upstream_ca_file;
            }
            if redis_ca_file.is_some() {
                cfg.redis_ca_file = redis_ca_file;
            }
            if tls_cert.is_some() {
                cfg.tls_cert_file = tls_cert;
                cfg.tls_key_file = tls_key;
            }
            let scheme = if cfg.tls_cert_file.is_some() {
                "https"
            } else {
                "http"
            };
            let window = cfg.redis_url.as_deref().map_or_else(
                || "in memory".to_string(),
                |u| format!("in Redis at {}", open::redact(u)),
            );
            let upstream = cfg
                .upstream_urls()
                .into_iter()
                .map(open::redact)
                .collect::<Vec<_>>()
                .join(", ");
            let shutdown = signal::shutdown()?;
            let (addr, served) = idem_gateway::bind(cfg, shutdown).await.map_err(gw_err)?;
            println!("idem gateway on {scheme}://{addr} → {upstream} (window {window})");
            served
                .await
                .map_err(|e| StoreError::Backend(format!("gateway task: {e}")))?
                .map_err(gw_err)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench {
            command: BenchCommand::Gateway { redis_url, json },
        } => {
            let report = idem_bench::gateway::bench(idem_bench::gateway::BenchOptions {
                redis_url,
                ..Default::default()
            })
            .await
            .map_err(|e| StoreError::Backend(e.to_string()))?;
            if json {
                print_json(&report);
            } else {
                println!("{}", report.to_text());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "idem", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Command::Migrate => {
            open::open_store(url).await?;
            println!("migrations applied to {}", open::redact(url));
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench {
            command:
                BenchCommand::Store {
                    concurrency,
                    duration,
                    json,
                    no_growth,
                },
        } => {
            if !(duration.is_finite() && duration > 0.0) {
                return Err(StoreError::InvalidInput(
                    "--duration must be a positive number of seconds".into(),
                ));
            }
            let targets = open::open_bench(url).await?;
            let baseline = targets.baseline.clone();
            let growth = targets.growth.as_ref().filter(|_| !no_growth);
            let tenant =
                TenantId::new(format!("bench-{}", uuid::Uuid::now_v7().simple())).expect("tenant");
            let report = bench::run(
                targets.store.clone(),
                baseline.clone(),
                growth,
                &tenant,
                concurrency,
                Duration::from_secs_f64(duration),
            )
            .await;
            let cleaned = baseline.cleanup().await;
            let mut report = report?;
            cleaned?;
            report.server = targets.server.clone();
            if json {
                print_json(&report);
            } else {
                bench::print_human(&report);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `--duty`: a share of wall time in [MIN_DUTY, 1].
fn parse_duty(text: &str) -> Result<f64, String> {
    let v: f64 = text
        .parse()
        .map_err(|e| format!("{text:?} is not a number: {e}"))?;
    if v.is_finite() && (idem_sweep::MIN_DUTY..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "{text} is outside [{}, 1]; 1 means no rest between batches",
            idem_sweep::MIN_DUTY
        ))
    }
}

#[cfg(test)]
mod cli_tests {
    use super::*;

    fn missing_help(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
        let path = format!("{path} {}", cmd.get_name());
        if cmd.get_about().is_none() && cmd.get_long_about().is_none() {
            out.push(format!("{path} (the command)"));
        }
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            if arg.get_help().is_none() && arg.get_long_help().is_none() {
                out.push(format!("{path} --{id}"));
            }
        }
        for sub in cmd.get_subcommands() {
            if sub.get_name() != "help" {
                missing_help(sub, &path, out);
            }
        }
    }

    #[test]
    fn every_command_and_argument_has_help_text() {
        Cli::command().debug_assert();
        let mut missing = Vec::new();
        missing_help(&Cli::command(), "", &mut missing);
        assert!(missing.is_empty(), "no help text:\n{}", missing.join("\n"));
    }
}
