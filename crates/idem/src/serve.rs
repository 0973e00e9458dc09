//! `idem serve`: the command line of the order service (`idem-orders`) — its flags, its
//! secrets (where they come from, warnings where others can read them) — plus the
//! retention sweeper that runs beside the server. The service's rules stay in
//! `idem-orders`; where the flags' values may also come from is `settings`'.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{CompensationCheck, StoreError};
use idem_orders::compensation::OrderCompensation;
use idem_orders::{ApiKey, HttpTimeouts, ServeConfig, ServiceOptions};
use idem_sweep::Sweeper;

use crate::cli::{orders_error, parse_duration, parse_positive_duration, CliResult};
use crate::open::{backend_of, Backend};

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Settings from a TOML file whose keys are these flags; a flag or its
    /// environment variable wins over the file.
    #[arg(long, env = "IDEM_CONFIG", value_name = "PATH")]
    config: Option<PathBuf>,
    /// Address to listen on (default 127.0.0.1:8080).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// TENANT=SECRET (repeatable); clients send `Authorization: Bearer SECRET`. The
    /// command line shows in `ps`: prefer IDEM_API_KEYS (comma-separated
    /// TENANT=SECRET) or --api-keys-file.
    #[arg(long = "api-key")]
    api_keys: Vec<String>,
    /// A file of TENANT=SECRET lines (blank lines and `#` comments skipped).
    #[arg(long, value_name = "PATH")]
    api_keys_file: Option<PathBuf>,
    /// Enables the admin API (freezes, shows), `/metrics` and the console; at least 16
    /// characters. The command line shows in `ps`: prefer IDEM_ADMIN_TOKEN or
    /// --admin-token-file.
    #[arg(long, env = "IDEM_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Read the admin token from this file (its first line).
    #[arg(long, value_name = "PATH")]
    admin_token_file: Option<PathBuf>,
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
    nats_ca_file: Option<PathBuf>,
    /// Serve HTTPS with this certificate chain (PEM); needs --tls-key. The metrics
    /// listener serves HTTPS too.
    #[arg(long, env = "IDEM_TLS_CERT", value_name = "PATH", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "IDEM_TLS_KEY", value_name = "PATH", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// How often the retention sweeper runs beside the server (0s: never).
    #[arg(long, value_parser = parse_duration, default_value = "5m")]
    sweep_every: Duration,
    /// A request head must arrive within this, or the connection is closed (an idle
    /// keep-alive connection is closed after it too).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    header_read_timeout: Duration,
    /// A request body must arrive in full within this, or the answer is 408.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    body_read_timeout: Duration,
    /// On SIGTERM or SIGINT, requests in flight get this long to finish; executions
    /// still running then are cut off and their keys left FAILED_RETRYABLE.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    shutdown_grace: Duration,
    /// Also serve `/metrics`, without credentials, on this address (keep it internal).
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
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
    tuning: ServeTuning,
}

/// `--create-claim`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CreateClaim {
    InTransaction,
    Ahead,
}

impl From<CreateClaim> for idem_orders::ClaimMode {
    fn from(c: CreateClaim) -> Self {
        match c {
            CreateClaim::InTransaction => idem_orders::ClaimMode::InTransaction,
            CreateClaim::Ahead => idem_orders::ClaimMode::Ahead,
        }
    }
}

/// Timings and names a deployment (or a chaos campaign) may change; the defaults suit
/// one service per database.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeTuning {
    /// How long a claim holds a key PROCESSING before another arrival may take it over;
    /// renewed every third of it while the handler runs.
    #[arg(long, value_parser = parse_positive_duration, default_value = "60s")]
    pub claim_lease: Duration,
    /// How long a duplicate waits for the request holding its key before 409.
    #[arg(long, value_parser = parse_positive_duration, default_value = "10s")]
    pub in_progress_wait: Duration,
    /// TTL of the service's per-order and per-show leases (renewed while held): how long a
    /// crashed holder blocks pay, cancel and stock release of its order or show.
    #[arg(long, value_parser = parse_positive_duration, default_value = "30s")]
    pub lease_ttl: Duration,
    /// How long a request waits for a per-order lease another request holds before 409.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub lease_wait: Duration,
    /// How long the sweeper's lease lasts before another server's sweeper may take over.
    #[arg(long, value_parser = parse_positive_duration, default_value = "30s")]
    pub sweep_lease: Duration,
    /// Also serve `POST /v1/legacy/orders`: the keyless create that mints an order per
    /// arrival (for demonstrations and controls only).
    #[arg(long)]
    pub legacy_route: bool,
    /// Where `POST /v1/orders` claims its key: `in-transaction` (one commit with the
    /// order; a duplicate waits for it) or `ahead` (a commit of its own before the order,
    /// as pay and cancel do).
    #[arg(long, value_enum, default_value_t = CreateClaim::InTransaction)]
    pub create_claim: CreateClaim,
    /// JetStream stream holding the outbox topics.
    #[arg(long, default_value = "IDEM_ORDERS", requires = "nats_url")]
    pub nats_stream: String,
    /// Subject prefix of the outbox topics (`{prefix}.order.paid`).
    #[arg(long, default_value = "idem.orders", requires = "nats_url")]
    pub nats_subject_prefix: String,
    /// Durable consumers are named `{prefix}-{consumer}`.
    #[arg(long, default_value = "idem-orders", requires = "nats_url")]
    pub nats_durable_prefix: String,
    /// Redelivery of a message whose consumer never acked it.
    #[arg(long, value_parser = parse_positive_duration, default_value = "30s", requires = "nats_url")]
    pub nats_ack_wait: Duration,
}

/// API keys from `--api-key`, `IDEM_API_KEYS` and `--api-keys-file`, all together.
const API_KEYS_ENV: &str = "IDEM_API_KEYS";

fn read_secret_file(path: &Path) -> Result<String, StoreError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| StoreError::InvalidInput(format!("cannot read {}: {e}", path.display())))?;
    if idem_gateway::config::readable_by_others(path) {
        tracing::warn!(file = %path.display(), "secret file is readable by other users; chmod 600 it");
    }
    Ok(text)
}

/// A URL that carries a password or token (`user:pass@`, `nats://TOKEN@`, `password=`).
fn url_has_secret(url: &str) -> bool {
    idem_sql::redact(url) != url || url.to_ascii_lowercase().contains("password=")
}

/// The secret-bearing flags on this process's command line, which every user of the
/// host can read (`ps`, `/proc/PID/cmdline`).
fn secrets_on_the_command_line(args: &[String]) -> Vec<&'static str> {
    let mut found = Vec::new();
    let mut args = args.iter().peekable();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) => (flag, Some(value.to_owned())),
            None => (arg.as_str(), None),
        };
        let flag = match flag {
            "--api-key" => "--api-key",
            "--admin-token" => "--admin-token",
            "--database-url" => "--database-url",
            "--nats-url" => "--nats-url",
            _ => continue,
        };
        let value = inline.or_else(|| args.peek().map(|v| v.to_string()));
        let secret = match flag {
            "--api-key" | "--admin-token" => true,
            _ => value.is_some_and(|v| url_has_secret(&v)),
        };
        if secret && !found.contains(&flag) {
            found.push(flag);
        }
    }
    found
}

/// The settings of a `--config` file that hold a secret (names only, never values).
fn secrets_in_config(text: &str) -> Vec<String> {
    let Ok(table) = text.parse::<toml::Table>() else {
        return Vec::new(); // the settings already refused it
    };
    table
        .iter()
        .filter(|(key, value)| match key.replace('_', "-").as_str() {
            "api-key" | "admin-token" => true,
            "database-url" | "nats-url" => value.as_str().is_some_and(url_has_secret),
            _ => false,
        })
        .map(|(key, _)| key.clone())
        .collect()
}

/// Warns at start where others can read a secret: on the command line, or in a config
/// file every user may read. Starting anyway keeps a running deployment running.
pub(crate) fn warn_about_exposed_secrets(config: Option<&Path>) {
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    for flag in secrets_on_the_command_line(&args) {
        tracing::warn!(
            flag,
            "a secret on the command line shows in `ps` to every user of this host; use \
             IDEM_API_KEYS / --api-keys-file, IDEM_ADMIN_TOKEN / --admin-token-file, or \
             IDEM_DATABASE_URL / IDEM_NATS_URL instead"
        );
    }
    #[cfg(unix)]
    if let Some(path) = config {
        use std::os::unix::fs::PermissionsExt;
        let readable_by_all =
            std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o004 != 0);
        let secrets = std::fs::read_to_string(path)
            .map(|text| secrets_in_config(&text))
            .unwrap_or_default();
        if readable_by_all && !secrets.is_empty() {
            tracing::warn!(
                file = %path.display(),
                settings = ?secrets,
                "the config file holds secrets and every user of this host can read it; \
                 chmod o-r it, or move them to --api-keys-file / --admin-token-file"
            );
        }
    }
}

fn api_keys(args: &ServeArgs) -> Result<Vec<ApiKey>, StoreError> {
    let mut keys = args
        .api_keys
        .iter()
        .map(|k| k.parse::<ApiKey>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(orders_error)?;
    // A source that was given but holds no key is a mistake, not a request for the
    // development mode (which would print credentials and change who can call).
    if let Ok(list) = std::env::var(API_KEYS_ENV) {
        let found = ApiKey::parse_list(&list, API_KEYS_ENV).map_err(orders_error)?;
        if found.is_empty() {
            return Err(StoreError::InvalidInput(format!(
                "{API_KEYS_ENV} is set but holds no TENANT=SECRET"
            )));
        }
        keys.extend(found);
    }
    if let Some(path) = &args.api_keys_file {
        let text = read_secret_file(path)?;
        let origin = path.display().to_string();
        let found = ApiKey::parse_lines(&text, &origin).map_err(orders_error)?;
        if found.is_empty() {
            return Err(StoreError::InvalidInput(format!(
                "{origin} holds no TENANT=SECRET line"
            )));
        }
        keys.extend(found);
    }
    Ok(keys)
}

fn admin_token(args: &ServeArgs) -> Result<Option<String>, StoreError> {
    read_admin_token(&args.admin_token, &args.admin_token_file)
}

/// The admin token from `--admin-token` / `IDEM_ADMIN_TOKEN` or `--admin-token-file`
/// (its first line); giving both is refused. Shared by `serve` and `console`.
pub(crate) fn read_admin_token(
    token: &Option<String>,
    file: &Option<PathBuf>,
) -> Result<Option<String>, StoreError> {
    match (token, file) {
        (Some(_), Some(_)) => Err(StoreError::InvalidInput(
            "give the admin token once: --admin-token (or IDEM_ADMIN_TOKEN) or \
             --admin-token-file"
                .into(),
        )),
        (token, None) => Ok(token.clone()),
        (None, Some(path)) => {
            let text = read_secret_file(path)?;
            let token = text.lines().next().unwrap_or_default().trim();
            if token.is_empty() {
                return Err(StoreError::InvalidInput(format!(
                    "{} holds no admin token",
                    path.display()
                )));
            }
            Ok(Some(token.to_owned()))
        }
    }
}

/// The retention sweeper beside the server: lease-guarded (one sweeper per database
/// however many servers run), with the order ledgers answering "compensation pending".
async fn start_sweeper(
    url: &str,
    every: Duration,
    lease_ttl: Duration,
) -> Result<idem_sweep::BackgroundSweep, StoreError> {
    let (policy, _) = idem_sweep::config::from_env().map_err(StoreError::InvalidInput)?;
    // Opening the service database first applies the ledgers' migrations, so the
    // compensation check has its tables from the first sweep on.
    let db = idem_orders::Database::open(url, idem_orders::DatabaseOptions::default())
        .await
        .map_err(orders_error)?;
    let check: Arc<dyn CompensationCheck> = Arc::new(OrderCompensation::for_database(&db));
    let (_, retention, leases) = crate::sweep::open(url).await?;
    // The process id in the owner tells an operator which server's sweeper holds the lease.
    let owner = idem_core::OwnerId::new(format!(
        "sweeper-pid{}-{}",
        std::process::id(),
        uuid::Uuid::now_v7().simple()
    ))
    .map_err(|e| StoreError::InvalidInput(e.to_string()))?;
    let sweeper = Sweeper::new(retention, policy)
        .with_lease(leases, idem_lease::LeaseMetrics::default())
        .with_lease_ttl(lease_ttl)
        .with_owner(owner)
        .with_compensation(check);
    Ok(sweeper.spawn(every))
}

pub async fn run(url: &str, args: ServeArgs) -> CliResult {
    let tls = idem_net::tls::CertFiles::pair(args.tls_cert.clone(), args.tls_key.clone())
        .map_err(StoreError::InvalidInput)?;
    if backend_of(url)? == Backend::Redis {
        return Err(StoreError::InvalidInput(
            "the order service needs SQLite, PostgreSQL or MySQL/MariaDB (its ledgers and records share one database)".into(),
        )
        .into());
    }
    // Validate the retention policy before binding: a bad policy is a start-up error.
    idem_sweep::config::from_env().map_err(StoreError::InvalidInput)?;
    warn_about_exposed_secrets(args.config.as_deref());
    let shutdown = crate::signal::shutdown()?;
    let tuning = args.tuning.clone();
    let nats = args.nats_url.as_ref().map(|url| idem_orders::NatsOptions {
        stream: tuning.nats_stream.clone(),
        subject_prefix: tuning.nats_subject_prefix.clone(),
        durable_prefix: tuning.nats_durable_prefix.clone(),
        ack_wait: tuning.nats_ack_wait,
        ca_file: args.nats_ca_file.clone(),
        ..idem_orders::NatsOptions::new(url.clone())
    });
    let config = ServeConfig {
        listen: args.listen,
        database_url: Some(url.to_string()),
        api_keys: api_keys(&args)?,
        admin_token: admin_token(&args)?,
        nats_url: args.nats_url,
        tls,
        options: ServiceOptions {
            timeouts: HttpTimeouts {
                header_read: args.header_read_timeout,
                body_read: args.body_read_timeout,
                shutdown_grace: args.shutdown_grace,
            },
            metrics_listen: args.metrics_listen,
            trusted_proxies: idem_orders::TrustedProxies::new(args.trusted_proxies),
            console_secure_cookie: args.console_secure_cookie,
            nats,
            legacy_route: tuning.legacy_route,
            in_progress_wait: tuning.in_progress_wait,
            claim_lease: tuning.claim_lease,
            create_claim: tuning.create_claim.into(),
            orders: idem_orders::OrdersOptions {
                lease_timings: idem_orders::LeaseTimings {
                    ttl: tuning.lease_ttl,
                    wait: tuning.lease_wait,
                },
                ..Default::default()
            },
            ..ServiceOptions::default()
        },
    };
    let _sweep = if args.sweep_every.is_zero() {
        None
    } else {
        Some(start_sweeper(url, args.sweep_every, tuning.sweep_lease).await?)
    };
    idem_orders::serve(config, shutdown)
        .await
        .map_err(orders_error)?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_in_sight_are_named_never_shown() {
        let args: Vec<String> = [
            "serve",
            "--admin-token-file",
            "/etc/idem/admin",
            "--api-key=t=secret-1234",
            "--database-url",
            "postgres://idem:pw@db/idem",
            "--nats-url=nats://nats.internal:4222",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            secrets_on_the_command_line(&args),
            ["--api-key", "--database-url"]
        );
        let file = "admin_token = \"x\"\nadmin-token-file = \"/p\"\n\
                    database-url = \"postgres://idem@db/idem?password=pw\"\n\
                    nats-url = \"nats://n:4222\"\n";
        assert_eq!(secrets_in_config(file), ["admin_token", "database-url"]);
        assert!(secrets_in_config("listen = \"0.0.0.0:80\"\n").is_empty());
    }
}
