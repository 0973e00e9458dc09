//! `idem console`: the operator console (`idem-console`) of any SQL store on its own —
//! records, the key inspector, leases, the audit — without the order service. Owns the
//! command line: the store, the schema, the address, the admin token (from the
//! environment or a file; never printed). The console's rules stay in `idem-console`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use idem_console::{Console, ConsoleOptions, ConsoleParts};
use idem_core::StoreError;
use idem_sql::{OpenOptions, Store};

use crate::cli::CliResult;
use crate::serve::{read_admin_token, warn_about_exposed_secrets};

/// The shortest admin token accepted (as `idem serve`).
const MIN_ADMIN_TOKEN_LEN: usize = 16;

#[derive(clap::Args)]
pub struct ConsoleArgs {
    /// PostgreSQL: the schema holding the store's tables (the console's own go there
    /// too).
    #[arg(long, env = "IDEM_PG_SCHEMA")]
    schema: Option<String>,
    /// Address to listen on.
    #[arg(long, env = "IDEM_CONSOLE_LISTEN", default_value = "127.0.0.1:8081")]
    listen: SocketAddr,
    /// The token operators log in with; at least 16 characters. The command line shows
    /// in `ps`: prefer IDEM_ADMIN_TOKEN or --admin-token-file.
    #[arg(long, env = "IDEM_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Read the admin token from this file (its first line).
    #[arg(long, env = "IDEM_ADMIN_TOKEN_FILE", value_name = "PATH")]
    admin_token_file: Option<PathBuf>,
    /// Reverse proxies (addresses or CIDR blocks; repeatable or comma-separated) whose
    /// X-Forwarded-For names the client of a login. Default none.
    #[arg(long, value_delimiter = ',', value_name = "ADDR|CIDR")]
    trusted_proxies: Vec<idem_orders::IpNet>,
    /// Give the session cookie `Secure` (TLS ends at a proxy in front).
    #[arg(long)]
    secure_cookie: bool,
}

pub async fn run(url: &str, args: ConsoleArgs) -> CliResult {
    warn_about_exposed_secrets(None);
    let token = read_admin_token(&args.admin_token, &args.admin_token_file)?.ok_or_else(|| {
        StoreError::InvalidInput(
            "the console needs the admin token: IDEM_ADMIN_TOKEN or --admin-token-file".into(),
        )
    })?;
    if token.len() < MIN_ADMIN_TOKEN_LEN || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(StoreError::InvalidInput(format!(
            "the admin token must be at least {MIN_ADMIN_TOKEN_LEN} visible ASCII characters"
        ))
        .into());
    }
    let options = {
        let mut o = OpenOptions::default();
        o.pg_schema = args.schema.clone();
        o
    };
    let store = Store::open(url, &options).await?;
    let db = store
        .sql()
        .ok_or_else(|| {
            StoreError::InvalidInput(
                "the console keeps its sessions and audit in SQL: give a SQLite or PostgreSQL store"
                    .into(),
            )
        })?
        .clone();
    idem_console::migrate(&db)
        .await
        .map_err(|e| StoreError::Backend(e.to_string()))?;
    let timeline: Arc<dyn idem_console::ArrivalTimeline> =
        Arc::new(idem_console::StoreTimeline::new(db.clone(), None));
    let console = Console::new(ConsoleParts {
        db,
        admin_token: Some(token),
        options: ConsoleOptions {
            secure_cookie: args.secure_cookie,
            client_address: Arc::new(idem_orders::TrustedProxies::new(args.trusted_proxies)),
            command: "idem console",
        },
        timeline: Some(timeline),
        metrics: None,
        extension: None,
    });
    let shutdown = crate::signal::shutdown()?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| StoreError::InvalidInput(format!("cannot listen on {}: {e}", args.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| StoreError::Unavailable(e.to_string()))?;
    let router = idem_console::router(console, None);
    tracing::info!(%addr, database = %idem_sql::redact(url), "idem console listening");
    // Best effort: a closed stdout must not stop the server (`println!` would panic).
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stdout(),
        "idem console on {}",
        idem_sql::redact(url)
    );
    let _ = writeln!(
        std::io::stdout(),
        "  console: http://{addr}/console/  (log in with the admin token)"
    );
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
    .map_err(|e| StoreError::Unavailable(format!("serving the console: {e}")))?;
    Ok(ExitCode::SUCCESS)
}
