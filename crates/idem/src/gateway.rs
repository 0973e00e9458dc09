//! `idem gateway`: the command line of the reverse proxy (`idem-gateway`). Layers its
//! settings (flag > `IDEM_*` variable > file > default), binds and serves until SIGTERM or
//! SIGINT. What the gateway does with a request is `idem-gateway`'s, never decided here.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use idem_gateway::{GatewayConfig, GatewayError};

use crate::cli::{CliError, CliResult};
use crate::open::redact;

#[derive(clap::Args)]
pub struct GatewayArgs {
    /// Address to listen on (default 127.0.0.1:8080, or the config file's).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// The upstream base URL (http://host:port or https://host[:port]). Repeat it
    /// for several copies of one service on one database: each request goes to the
    /// least busy one that answers.
    #[arg(long, value_name = "URL")]
    upstream: Vec<String>,
    /// A private CA (PEM) an https:// upstream's certificate may chain to, besides
    /// the Mozilla roots.
    #[arg(long, env = "IDEM_UPSTREAM_CA_FILE", value_name = "PATH")]
    upstream_ca_file: Option<PathBuf>,
    /// Share the short window through Redis with other gateway instances
    /// (redis:// or rediss://).
    #[arg(long)]
    redis_url: Option<String>,
    /// For rediss://: the CA (PEM) the Redis server's certificate must chain to,
    /// instead of the system's trust store.
    #[arg(long, env = "IDEM_REDIS_CA_FILE", value_name = "PATH")]
    redis_ca_file: Option<PathBuf>,
    /// Serve HTTPS with this certificate chain (PEM); needs --tls-key.
    #[arg(long, env = "IDEM_TLS_CERT", value_name = "PATH", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "IDEM_TLS_KEY", value_name = "PATH", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The gateway's configuration (TOML, or JSON): routes, API keys → tenants,
    /// windows, timeouts. Its flags override the file.
    #[arg(long, env = "IDEM_CONFIG", value_name = "PATH")]
    config: Option<PathBuf>,
}

fn gw_err(e: GatewayError) -> CliError {
    CliError::invalid(e.to_string())
}

pub async fn run(args: GatewayArgs) -> CliResult {
    let cfg = config(args)?;
    let scheme = if cfg.tls_cert_file.is_some() {
        "https"
    } else {
        "http"
    };
    let window = cfg.redis_url.as_deref().map_or_else(
        || "in memory".to_string(),
        |u| format!("in Redis at {}", redact(u)),
    );
    let upstream = cfg
        .upstream_urls()
        .into_iter()
        .map(redact)
        .collect::<Vec<_>>()
        .join(", ");
    let shutdown = crate::signal::shutdown()?;
    let (addr, served) = idem_gateway::bind(cfg, shutdown).await.map_err(gw_err)?;
    // Best effort: a closed stdout must not stop the server (`println!` would panic).
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stdout(),
        "idem gateway on {scheme}://{addr} → {upstream} (window {window})"
    );
    served
        .await
        .map_err(|e| CliError::backend(format!("gateway task: {e}")))?
        .map_err(gw_err)?;
    Ok(ExitCode::SUCCESS)
}

/// The configuration: flag > IDEM_* variable > file > default.
fn config(args: GatewayArgs) -> Result<GatewayConfig, CliError> {
    let cfg = match args.config {
        Some(path) => GatewayConfig::from_file(path).map_err(gw_err)?,
        None => GatewayConfig::default(),
    };
    let mut cfg = cfg.with_env(std::env::vars()).map_err(gw_err)?;
    if let Some(l) = args.listen {
        cfg.listen = l;
    }
    if !args.upstream.is_empty() {
        cfg.set_upstreams(args.upstream);
    } else if cfg.upstream_urls().is_empty() {
        return Err(CliError::invalid("--upstream URL is required"));
    }
    if args.redis_url.is_some() {
        cfg.redis_url = args.redis_url;
    }
    if args.upstream_ca_file.is_some() {
        cfg.upstream_ca_file = args.upstream_ca_file;
    }
    if args.redis_ca_file.is_some() {
        cfg.redis_ca_file = args.redis_ca_file;
    }
    if args.tls_cert.is_some() {
        cfg.tls_cert_file = args.tls_cert;
        cfg.tls_key_file = args.tls_key;
    }
    Ok(cfg)
}
