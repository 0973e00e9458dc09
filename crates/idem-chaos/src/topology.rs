//! The campaign's processes and links: `idem serve` and `idem gateway` children of the
//! `idem` binary, a fresh database (PostgreSQL or MySQL), a Redis key prefix, a JetStream stream,
//! and the fault proxies between them.
//!
//! Owns starting, signalling and restarting the children and removing everything it
//! created: children are killed when the topology is dropped (and, on Linux, when this
//! process dies), the database, the stream and the Redis keys are removed by
//! [`Topology::teardown`]. It must not touch rows inside the database: that is the
//! workload's and the checker's business.

use std::net::{SocketAddr, TcpListener as StdListener, ToSocketAddrs};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use reqwest::Url;
use serde_json::json;
use tokio::process::{Child, Command};

use crate::db::Backend;
use crate::proxy::FaultProxy;
use crate::ChaosError;

/// Timings the children run with: short enough that a stopped process loses its claims
/// and leases within a campaign of seconds.
pub const CLAIM_LEASE: Duration = Duration::from_secs(2);
pub const SWEEP_LEASE: Duration = Duration::from_secs(2);
pub const ACK_WAIT: Duration = Duration::from_secs(2);
pub const LEASE_TTL: Duration = Duration::from_secs(3);

/// Where the topology's servers are and what to call it.
#[derive(Debug, Clone)]
pub struct Servers {
    pub database_url: String,
    pub redis_url: String,
    pub nats_url: Option<String>,
}

/// One child process the topology can kill, stop and restart.
pub struct Node {
    pub name: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// Answers 200 once the child is ready.
    ready: &'static str,
    log: PathBuf,
    child: Option<Child>,
    pub restarts: u32,
    /// Exits nobody asked for (not a SIGKILL of the campaign's).
    pub crashes: u32,
}

impl Node {
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(|c| c.id())
    }

    /// Whether the child is still there; one that exited on its own is reaped and
    /// counted in `crashes`.
    pub fn alive(&mut self) -> bool {
        match self.child.as_mut().map(|c| c.try_wait()) {
            Some(Ok(None)) => true,
            Some(_) => {
                self.child = None;
                self.crashes += 1;
                false
            }
            None => false,
        }
    }

    async fn spawn(&mut self, bin: &Path) -> Result<(), ChaosError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| ChaosError::Setup(format!("log {}: {e}", self.log.display())))?;
        let err = log
            .try_clone()
            .map_err(|e| ChaosError::Setup(format!("log {}: {e}", self.log.display())))?;
        let mut cmd = Command::new(bin);
        cmd.args(&self.args)
            .env_remove("IDEM_DATABASE_URL")
            .env_remove("IDEM_API_KEYS")
            .env_remove("IDEM_ADMIN_TOKEN")
            .env("IDEM_LOG", "warn")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .kill_on_drop(true);
        #[cfg(target_os = "linux")]
        unsafe {
            // A child outlives an interrupted campaign otherwise.
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| ChaosError::Setup(format!("start {}: {e}", self.name)))?;
        self.child = Some(child);
        Ok(())
    }

    async fn wait_ready(&mut self, http: &reqwest::Client) -> Result<(), ChaosError> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(ChaosError::Setup(format!(
                        "{} exited at start ({status}); see {}",
                        self.name,
                        self.log.display()
                    )));
                }
            }
            if let Ok(r) = http
                .get(format!("{}{}", self.base, self.ready))
                .send()
                .await
            {
                if r.status().is_success() {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(ChaosError::Setup(format!(
            "{} not ready within 60 s; see {}",
            self.name,
            self.log.display()
        )))
    }

    pub async fn start(&mut self, bin: &Path, http: &reqwest::Client) -> Result<(), ChaosError> {
        self.spawn(bin).await?;
        self.wait_ready(http).await
    }

    /// SIGKILL, and reap it.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    pub fn signal(&self, signal: libc::c_int) -> bool {
        match self.pid() {
            // SAFETY: kill(2) on our own child's pid.
            Some(pid) => unsafe { libc::kill(pid as libc::pid_t, signal) == 0 },
            None => false,
        }
    }

    pub async fn restart(&mut self, bin: &Path, http: &reqwest::Client) -> Result<(), ChaosError> {
        self.kill().await;
        self.restarts += 1;
        self.start(bin, http).await
    }
}

/// The running campaign topology.
pub struct Topology {
    pub bin: PathBuf,
    pub run: String,
    pub dir: PathBuf,
    pub http: reqwest::Client,
    /// The kind of server the campaign's database lives on.
    pub backend: Backend,
    /// The checker's and the fault injector's own connection string (direct, no proxy).
    pub db_url: String,
    admin_url: String,
    pub db_name: String,
    pub redis_url: String,
    pub redis_prefix: String,
    pub nats_url: Option<String>,
    pub nats_stream: String,
    pub services: Vec<Node>,
    pub gateways: Vec<Node>,
    /// gateways → service, one per service: every gateway fronts every service, each
    /// through its proxy.
    pub to_service: Vec<FaultProxy>,
    /// service → database, one per service.
    pub to_database: Vec<FaultProxy>,
    /// gateways → Redis (shared).
    pub to_redis: FaultProxy,
    pub api_key: String,
    pub admin_token: String,
    principal_secret: String,
    pub tenant: String,
}

/// Deletes every key under `prefix` (the gateways' window and wake-up state).
pub async fn delete_prefix(url: &str, prefix: &str) -> Result<u64, ChaosError> {
    let client = redis::Client::open(url).map_err(|e| ChaosError::Setup(e.to_string()))?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| ChaosError::Setup(format!("Redis: {e}")))?;
    idem_redis::unlink_prefix(&mut conn, prefix)
        .await
        .map_err(|e| ChaosError::Setup(format!("Redis: {e}")))
}

fn free_port() -> Result<u16, ChaosError> {
    let l = StdListener::bind("127.0.0.1:0").map_err(|e| ChaosError::Setup(e.to_string()))?;
    Ok(l.local_addr()
        .map_err(|e| ChaosError::Setup(e.to_string()))?
        .port())
}

fn socket_of(url: &Url, default_port: u16) -> Result<SocketAddr, ChaosError> {
    let host = url.host_str().unwrap_or("127.0.0.1");
    let port = url.port_or_known_default().unwrap_or(default_port);
    (host, port)
        .to_socket_addrs()
        .map_err(|e| ChaosError::Setup(format!("resolve {host}:{port}: {e}")))?
        .next()
        .ok_or_else(|| ChaosError::Setup(format!("{host}:{port} resolves to nothing")))
}

/// Points `url` at the proxy `addr`; a URL that cannot (a Unix socket) would bypass it.
fn via(url: &mut Url, addr: SocketAddr) -> Result<(), ChaosError> {
    url.set_ip_host(addr.ip())
        .and_then(|()| url.set_port(Some(addr.port())))
        .map_err(|()| {
            ChaosError::Setup(format!(
                "{} cannot be routed through the fault proxy (a TCP host:port is needed)",
                url.scheme()
            ))
        })
}

fn parse_url(url: &str, what: &str) -> Result<Url, ChaosError> {
    Url::parse(url).map_err(|e| ChaosError::Setup(format!("{what} URL: {e}")))
}

impl Topology {
    /// Creates the database and the Redis link; [`Topology::start_processes`] then
    /// starts the children. Whatever happens after this returns, [`Topology::teardown`]
    /// removes it.
    pub async fn create(bin: PathBuf, servers: &Servers) -> Result<Topology, ChaosError> {
        let run = uuid::Uuid::now_v7().simple().to_string()[20..].to_string();
        let dir = std::env::temp_dir().join(format!("idem-chaos-{run}"));
        // Logs and the gateways' configs name servers: readable by this user only.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| ChaosError::Setup(format!("{}: {e}", dir.display())))?;

        let admin = parse_url(&servers.database_url, "database")?;
        let backend = Backend::of(&admin)?;
        let redis = parse_url(&servers.redis_url, "Redis")?;
        let redis_addr = socket_of(&redis, 6379)?;
        let to_redis = FaultProxy::start("gateways→redis", redis_addr)
            .await
            .map_err(|e| ChaosError::Setup(format!("proxy: {e}")))?;
        let db_name = format!("idem_chaos_{run}");
        let mut db = admin.clone();
        db.set_path(&format!("/{db_name}"));
        backend.create_database(admin.as_str(), &db_name).await?;

        let topo = Topology {
            bin,
            run: run.clone(),
            dir,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .map_err(|e| ChaosError::Setup(e.to_string()))?,
            backend,
            db_url: db.to_string(),
            admin_url: admin.to_string(),
            db_name,
            redis_url: servers.redis_url.clone(),
            redis_prefix: format!("idem-chaos-{run}"),
            nats_url: servers.nats_url.clone(),
            nats_stream: format!("IDEM_CHAOS_{}", run.to_uppercase()),
            services: Vec::new(),
            gateways: Vec::new(),
            to_service: Vec::new(),
            to_database: Vec::new(),
            to_redis,
            api_key: format!("chaos-{}", uuid::Uuid::new_v4().simple()),
            admin_token: format!("admin-{}", uuid::Uuid::new_v4().simple()),
            principal_secret: format!("principals-{}", uuid::Uuid::new_v4().simple()),
            tenant: "chaos".into(),
        };
        Ok(topo)
    }

    pub async fn start_processes(
        &mut self,
        services: usize,
        gateways: usize,
        legacy_route: bool,
    ) -> Result<(), ChaosError> {
        let redis = &parse_url(&self.redis_url, "Redis")?;
        let db_addr = socket_of(
            &parse_url(&self.db_url, "database")?,
            self.backend.default_port(),
        )?;
        for i in 0..services {
            let link = format!("serve-{i}→{}", self.backend.name());
            let db_proxy = FaultProxy::start(&link, db_addr)
                .await
                .map_err(|e| ChaosError::Setup(format!("proxy: {e}")))?;
            let mut url = parse_url(&self.db_url, "database")?;
            via(&mut url, db_proxy.addr())?;
            let port = free_port()?;
            let listen = SocketAddr::from(([127, 0, 0, 1], port));
            // Server URLs may carry credentials: they go by environment, not argv.
            let mut env = vec![
                ("IDEM_DATABASE_URL".to_string(), url.to_string()),
                (
                    "IDEM_API_KEYS".into(),
                    format!("{}={}", self.tenant, self.api_key),
                ),
                ("IDEM_ADMIN_TOKEN".into(), self.admin_token.clone()),
            ];
            let mut args = vec![
                "serve".to_string(),
                "--listen".into(),
                listen.to_string(),
                "--sweep-every".into(),
                "1s".into(),
                "--sweep-lease".into(),
                format!("{}ms", SWEEP_LEASE.as_millis()),
                "--claim-lease".into(),
                format!("{}ms", CLAIM_LEASE.as_millis()),
                "--in-progress-wait".into(),
                "3s".into(),
                "--lease-ttl".into(),
                format!("{}ms", LEASE_TTL.as_millis()),
                "--lease-wait".into(),
                "2s".into(),
                "--shutdown-grace".into(),
                "1s".into(),
            ];
            if legacy_route {
                args.push("--legacy-route".into());
            }
            if let Some(nats) = &self.nats_url {
                env.push(("IDEM_NATS_URL".into(), nats.clone()));
                args.extend([
                    "--nats-stream".into(),
                    self.nats_stream.clone(),
                    "--nats-subject-prefix".into(),
                    format!("idem.chaos.{}", self.run),
                    "--nats-durable-prefix".into(),
                    format!("idem-chaos-{}", self.run),
                    "--nats-ack-wait".into(),
                    format!("{}ms", ACK_WAIT.as_millis()),
                ]);
            }
            let mut node = Node {
                name: format!("serve-{i}"),
                args,
                env,
                base: format!("http://{listen}"),
                ready: "/readyz",
                log: self.dir.join(format!("serve-{i}.log")),
                child: None,
                restarts: 0,
                crashes: 0,
            };
            node.start(&self.bin, &self.http).await?;
            let to_service = FaultProxy::start(&format!("gateway→serve-{i}"), listen)
                .await
                .map_err(|e| ChaosError::Setup(format!("proxy: {e}")))?;
            self.services.push(node);
            self.to_database.push(db_proxy);
            self.to_service.push(to_service);
        }
        let mut redis_via_proxy = redis.clone();
        via(&mut redis_via_proxy, self.to_redis.addr())?;
        // Every gateway fronts every service: a paused service or a killed gateway
        // takes no path to the database away.
        let upstreams: Vec<String> = self
            .to_service
            .iter()
            .map(|p| format!("http://{}", p.addr()))
            .collect();
        for j in 0..gateways {
            let port = free_port()?;
            let config = json!({
                "listen": format!("127.0.0.1:{port}"),
                "upstreams": upstreams,
                "redis_url": redis_via_proxy.to_string(),
                "redis_prefix": self.redis_prefix,
                "lease_ms": 2_000,
                "max_wait_ms": 3_000,
                "upstream_timeout_ms": 4_000,
                "upstream_connect_timeout_ms": 1_000,
                "routes": [
                    {"methods": ["POST"], "path": "/v1/legacy/*", "key": "none"},
                    {"methods": ["POST"], "path": "/v1/*", "key": "required"},
                ],
            });
            let path = self.dir.join(format!("gateway-{j}.json"));
            std::fs::write(&path, config.to_string())
                .map_err(|e| ChaosError::Setup(format!("{}: {e}", path.display())))?;
            let mut node = Node {
                name: format!("gateway-{j}"),
                args: vec![
                    "gateway".into(),
                    "--config".into(),
                    path.display().to_string(),
                ],
                // Callers are told apart by their credential, the same way on every gateway.
                env: vec![(
                    "IDEM_GATEWAY_PRINCIPAL_SECRET".into(),
                    self.principal_secret.clone(),
                )],
                base: format!("http://127.0.0.1:{port}"),
                ready: "/_idem/readyz",
                log: self.dir.join(format!("gateway-{j}.log")),
                child: None,
                restarts: 0,
                crashes: 0,
            };
            node.start(&self.bin, &self.http).await?;
            self.gateways.push(node);
        }
        Ok(())
    }

    /// Creates `shows` in the campaign's tenant through serve-0's admin API.
    pub async fn create_shows(&self, shows: &[&str], capacity: i64) -> Result<(), ChaosError> {
        let base = &self.services[0].base;
        for show in shows {
            let r = self
                .http
                .put(format!("{base}/v1/admin/shows/{}/{show}", self.tenant))
                .bearer_auth(&self.admin_token)
                .json(&json!({"capacity": capacity, "per_order_limit": 6, "price_cents": 5_000}))
                .send()
                .await
                .map_err(|e| ChaosError::Setup(format!("create show {show}: {e}")))?;
            if !r.status().is_success() {
                return Err(ChaosError::Setup(format!(
                    "create show {show}: {}",
                    r.status()
                )));
            }
        }
        Ok(())
    }

    /// The counters that show faults biting, summed over the services as they are now
    /// (a restarted service starts from zero): consumer runs by result, the layer's
    /// decisions and executions by outcome.
    pub async fn scrape_metrics(&self) -> std::collections::BTreeMap<String, u64> {
        const WANTED: [&str; 4] = [
            "idem_orders_deliveries_total",
            "idem_http_requests_total",
            "idem_http_executions_total",
            "idem_http_finish_errors_total",
        ];
        let mut sums = std::collections::BTreeMap::new();
        for node in &self.services {
            let url = format!("{}/metrics", node.base);
            let Ok(r) = self
                .http
                .get(&url)
                .bearer_auth(&self.admin_token)
                .send()
                .await
            else {
                continue;
            };
            let Ok(text) = r.text().await else { continue };
            for line in text.lines().filter(|l| !l.starts_with('#')) {
                let Some((series, value)) = line.rsplit_once(' ') else {
                    continue;
                };
                if !WANTED.iter().any(|w| series.starts_with(w)) {
                    continue;
                }
                if let Ok(v) = value.parse::<f64>() {
                    *sums.entry(format!("metrics.{series}")).or_insert(0) += v as u64;
                }
            }
        }
        sums
    }

    /// Base URLs of the gateways.
    pub fn gateway_urls(&self) -> Vec<String> {
        self.gateways.iter().map(|g| g.base.clone()).collect()
    }

    /// Every stopped child continued, every dead one restarted, every link passing.
    pub async fn heal(&mut self) -> Result<(), ChaosError> {
        for p in self
            .to_service
            .iter()
            .chain(self.to_database.iter())
            .chain(std::iter::once(&self.to_redis))
        {
            p.set(crate::proxy::Mode::Pass);
        }
        for node in self.services.iter_mut().chain(self.gateways.iter_mut()) {
            node.signal(libc::SIGCONT);
            if !node.alive() {
                node.restarts += 1;
                node.start(&self.bin, &self.http).await?;
            }
        }
        Ok(())
    }

    /// Kills every child and removes the database (unless kept), the stream and the Redis keys. Each
    /// server gets a bounded time: an unreachable one is reported, not waited for.
    pub async fn teardown(&mut self, keep_database: bool) {
        const BOUND: Duration = Duration::from_secs(10);
        for node in self.services.iter_mut().chain(self.gateways.iter_mut()) {
            node.signal(libc::SIGCONT);
            node.kill().await;
        }
        let drop_db = self
            .backend
            .drop_database(&self.admin_url, &self.db_url, &self.db_name);
        let dropped = async {
            if keep_database {
                return Ok(());
            }
            drop_db.await
        };
        match tokio::time::timeout(BOUND, dropped).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(database = %self.db_name, "could not drop: {e}"),
            Err(_) => tracing::warn!(database = %self.db_name, "could not drop: timed out"),
        }
        let keys = delete_prefix(&self.redis_url, &self.redis_prefix);
        match tokio::time::timeout(BOUND, keys).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(prefix = %self.redis_prefix, "could not delete Redis keys: {e}")
            }
            Err(_) => {
                tracing::warn!(prefix = %self.redis_prefix, "could not delete Redis keys: timed out")
            }
        }
        if let Some(nats) = &self.nats_url {
            let stream = async {
                let client = async_nats::connect(nats).await.map_err(|e| e.to_string())?;
                let js = async_nats::jetstream::new(client);
                js.delete_stream(&self.nats_stream)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            };
            match tokio::time::timeout(BOUND, stream).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(stream = %self.nats_stream, "could not delete: {e}"),
                Err(_) => tracing::warn!(stream = %self.nats_stream, "could not delete: timed out"),
            }
        }
    }
}
