//! idem store on Redis: the gateway's short window, shared by many instances.
//!
//! # When to choose Redis, and when not
//!
//! Redis is the store for the **gateway layer** (docs/DESIGN.md: two layers, where each store fits): many gateway instances
//! share one short window in which concurrent duplicates are coalesced and a finished
//! result is replayed quickly. It is **not** the authoritative record of a business
//! action. Choose PostgreSQL (`idem-postgres`) when the idempotency record must commit
//! in the same transaction as the business write (orders, payments, outbox) and must
//! survive crashes and failovers; choose SQLite (`idem-sqlite`) for one machine.
//!
//! # Durability limits (read before relying on this store)
//!
//! - Redis acknowledges a write once it is in memory. Without AOF (`appendfsync always`)
//!   or RDB snapshots — and the Redis used by this project's tests and default deployment
//!   runs with neither — **every record is lost when Redis restarts**. After a restart a
//!   retried intent is treated as absent and executes again unless a lower layer (the
//!   business database's UNIQUE constraint) stops it.
//! - Replication is asynchronous. A record acknowledged by the primary can be missing on
//!   the replica promoted after a failover, so a duplicate can be admitted. `WAIT` narrows
//!   this window but does not close it.
//! - Records expire (see *Expiry*): once a record is gone the key is absent again.
//!
//! So this store deduplicates bursts (double clicks, gateway retries, concurrent
//! duplicates) efficiently; exactly-once effects still need the authoritative store.
//!
//! # Layout
//!
//! One string value per record, at
//!
//! ```text
//! <prefix>:r:{<enc(tenant)>:<enc(key)>}
//! ```
//!
//! where `enc` percent-escapes `%`, `{`, `}` and `:` (`%25`, `%7B`, `%7D`, `%3A`). Tenants
//! and keys are visible ASCII and may contain any of these; after encoding neither part
//! contains a brace or a colon, so
//! - the Redis Cluster hash tag (the text between the first `{` and the next `}`) is
//!   always exactly `enc(tenant):enc(key)`: every script touches a single key in a
//!   single slot;
//! - the encoding is injective and the `:` between the parts is unambiguous, so two
//!   different `(tenant, key)` pairs never share a Redis key.
//!
//! The prefix must not contain `{` or `}` (checked by [`RedisStore::connect`]).
//!
//! # Record encoding
//!
//! A record is one binary-safe string, so a claim is `TIME` + `GET` + `SET` and a replay
//! a single `GET` inside the script (no per-field hash commands, no JSON in Lua).
//! Integers are big-endian, times are store milliseconds:
//!
//! ```text
//! header (46 bytes)  u8 format = 1 | u8 state ('P' 'S' 'R' 'T') | i64 version |
//!                    i64 lease deadline (meaningful in 'P') | i32 attempts |
//!                    i64 created | i64 updated | i64 completed (meaningful in 'S' 'T')
//! owner block        u16 length | owner (empty: none)
//! identity block     u16 length | u16 len + principal | 32-byte fingerprint |
//!                    u16 len + tenant | u16 len + key
//! result (optional)  u16 status | u8 has_ref [u32 len + ref] | u32 header count |
//!                    (u32 len + name, u32 len + value)* | u32 len + body
//! ```
//!
//! The scripts read the header with `struct.unpack`, compare the owner and identity
//! blocks byte for byte with blocks the caller encoded (both are length-prefixed, so a
//! prefix match is an exact match) and never look inside the result, which Rust alone
//! encodes and decodes ([`encode_record`], [`decode_record`]). A value whose format
//! byte is not 1 is refused as corrupt; a record key holding a hash (the layout of
//! earlier builds) answers `WRONGTYPE`, which surfaces as a backend error, so such a key
//! fails closed until it expires rather than being treated as absent.
//!
//! # Atomicity, time and the decision table
//!
//! claim, finish and extend are Lua scripts (`EVALSHA`, loaded on `NOSCRIPT`; see below
//! for the paths that need none). Redis runs a script alone, so each is a single atomic
//! read-decide-write on one key:
//! - claim implements [`idem_core::decide`] exactly: absent → PROCESSING (version 1,
//!   attempt 1); PROCESSING with a live lease → in progress; SUCCEEDED/FAILED_TERMINAL →
//!   replay; a different fingerprint or principal → mismatch in every state, nothing
//!   written; FAILED_RETRYABLE or PROCESSING with an expired lease → takeover, which bumps
//!   version and attempts and sets the new owner and lease;
//! - finish and extend compare state PROCESSING, version and owner; a lost compare
//!   changes nothing and returns [`StoreError::Superseded`]. A record that has expired
//!   is a lost compare too.
//!
//! Replies are small: a replay returns the stored value as one bulk string (decoded in
//! Rust), the other claim outcomes a short array of integers, and finish returns the
//! new record without the result the caller just sent.
//!
//! Time is read inside the scripts with `TIME` — the Redis server's clock, never the
//! caller's — plus the [`ClockShift`] passed as an argument (zero in production; tests
//! move it to control timelines).
//!
//! # Without scripts, where the server allows
//!
//! Read at connect ([`ServerInfo`]):
//! - with `SET … NX GET` (Redis ≥ 7.0, every Valkey) a claim first tries one `SET` of a
//!   fresh PROCESSING record; when the key exists the same command hands back its value,
//!   and a replay, a mismatch or a lease surely still live is answered from it. Only a
//!   takeover (FAILED_RETRYABLE, or a lease that may have ended) runs the claim script;
//! - with `SET … IFEQ` (Valkey ≥ 8.1, Redis ≥ 8.4) a completion is one `SET` of the
//!   finished record, conditional on the exact value the claim wrote (kept in
//!   [`ClaimToken::written`]). If the value changed — a heartbeat rewrote it, or the claim
//!   was superseded — the finish script decides as before.
//!
//! These writes carry times without running on the server, so they take an upper bound
//! of the server's clock from a `TIME` reading at most a second old (see `clock`): a
//! lease written this way is never shorter than asked, and every decision that ends a
//! lease still reads `TIME` inside a script. [`StoreLimits`] and lease bounds are checked in Rust
//! before any script runs, so bad input writes nothing.
//!
//! # Expiry
//!
//! Every write is a `SET … PX`: a finished record (any final state) expires `retention`
//! after it finished; a PROCESSING record expires `retention + lease` after its last
//! claim or heartbeat, so it never disappears while its owner may still be executing.
//!
//! # Uniqueness guard
//!
//! [`IdempotencyStore::unique_guard`] answers `true`: there is no schema to inspect; the
//! guard is that every claim is one atomic script on one key, so of any number of
//! concurrent claims of an absent key exactly one creates the record.
//!
//! # Errors and connections
//!
//! The store holds one redis-rs [`ConnectionManager`] (a multiplexed connection that is
//! replaced after an I/O error; a plain multiplexed connection would stay broken).
//! Connection setup is bounded by `connect_timeout`, every command by
//! `response_timeout`. A reconnect is a single attempt (also bounded by
//! `connect_timeout`); during an outage each call fails fast with `Unavailable` and the
//! next call tries to reconnect again, so recovery never silently stops. Refused or dropped connections, I/O errors and timeouts, and the
//! server saying it cannot serve now (`LOADING`, `BUSY`, `READONLY`, `MASTERDOWN`,
//! `TRYAGAIN`, `CLUSTERDOWN`, `OOM`) map to [`StoreError::Unavailable`]; anything else to
//! [`StoreError::Backend`]. Nothing is retried inside the store: a claim whose reply was
//! lost may have been applied, and only the caller can decide to ask again (a retried
//! claim then sees its own PROCESSING record as in progress, and the key becomes free
//! when the lease expires — it never executes twice). The connection carries a client
//! name (`CLIENT SETNAME`), re-applied after a connection error, so operators can find
//! it in `CLIENT LIST`.
//!
//! Requires Redis 5 or newer (scripts write after reading `TIME`).
//!
//! # Redis Cluster
//!
//! `redis+cluster://host:port,host:port` (or `rediss+cluster://`) connects to a cluster
//! through its seeds ([`conn`]). Every key carries a hash tag of its scope or lease, so a
//! script's keys share a slot; `SCAN` walks each primary. A cluster connection has no
//! client name, and the fault tests that kill named connections run on one server only.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::store::{check_lease, verdict, Verdict};
use idem_core::{
    Claim, ClaimKind, ClaimRequest, ClaimToken, ClockShift, Finish, IdempotencyStore, Millis,
    OwnerId, Record, RecordState, Scope, StoreError, StoreLimits,
};
use idem_store_kit::RecentKeys;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

mod conn;
pub use conn::scan as scan_keys;
use redis::{RedisError, Script, Value};

mod clock;
mod codec;
mod lease;
pub mod retention;
pub use codec::{decode_record, encode_record};
pub use lease::*;

/// Removes every key under `prefix:` in SCAN batches (what a bench or a chaos campaign
/// wrote under a prefix of its own) and returns how many there were. Keys outside the
/// prefix are never touched.
pub async fn unlink_prefix<C>(conn: &mut C, prefix: &str) -> Result<u64, redis::RedisError>
where
    C: redis::aio::ConnectionLike + Send,
{
    let pattern = format!("{prefix}:*");
    let mut cursor: u64 = 0;
    let mut removed = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await?;
        if !keys.is_empty() {
            let n: u64 = redis::cmd("UNLINK").arg(&keys).query_async(conn).await?;
            removed += n;
        }
        if next == 0 {
            return Ok(removed);
        }
        cursor = next;
    }
}

/// Default key prefix.
pub const DEFAULT_PREFIX: &str = "idem";
/// Default record expiry: 24 h (Stripe keeps keys at least 24 h; Restate's default).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// Default bound on connection setup.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default bound on one command.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

const CLAIM_LUA: &str = include_str!("lua/claim.lua");
const FINISH_LUA: &str = include_str!("lua/finish.lua");
const EXTEND_LUA: &str = include_str!("lua/extend.lua");
const ABANDON_LUA: &str = include_str!("lua/abandon.lua");

/// How to open a [`RedisStore`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RedisOptions {
    /// Prepended to every key (`<prefix>:r:{…}`); must not contain `{` or `}`.
    pub prefix: String,
    /// Record expiry after a record finished (see the module docs, *Expiry*).
    pub retention: Duration,
    pub limits: StoreLimits,
    /// Added to the Redis clock; zero in production.
    pub clock: ClockShift,
    /// Bound on connecting (the whole setup, and each reconnect attempt).
    pub connect_timeout: Duration,
    /// Bound on each command.
    pub response_timeout: Duration,
    /// `CLIENT SETNAME` of this store's connection; `None` picks `idem-<uuid>`.
    /// Letters, digits and `-_.:` only (Redis forbids spaces in client names).
    pub client_name: Option<String>,
    /// Scopes remembered as holding a record (`idem_store_kit::recent`): a claim on one of
    /// them first tries a plain `GET` and answers a replay or a mismatch of a finished
    /// record from it. 0 turns the shortcut off.
    pub recent_capacity: usize,
    /// For `rediss://`: the CA (PEM) the server's certificate must chain to, instead of
    /// the system's trust store.
    pub ca_file: Option<std::path::PathBuf>,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.to_string(),
            retention: DEFAULT_RETENTION,
            limits: StoreLimits::default(),
            clock: ClockShift::default(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            client_name: None,
            ca_file: None,
            recent_capacity: idem_store_kit::recent::DEFAULT_RECENT_CAPACITY,
        }
    }
}

/// What answered at the URL: which server, which version, and the commands idem can use
/// beyond Redis 7's. Read once at connect (`INFO server`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// `redis` or `valkey` (a server that does not say is taken for Redis).
    pub name: String,
    /// The server's own version (`valkey_version` on Valkey, `redis_version` otherwise).
    pub version: (u32, u32, u32),
    /// `SET … IFEQ` (compare-and-set without a script): Valkey ≥ 8.1, Redis ≥ 8.4.
    pub set_ifeq: bool,
    /// `SET … NX GET` (create, or read what is there, in one command): Redis ≥ 7.0 and
    /// every Valkey.
    pub set_nx_get: bool,
}

impl ServerInfo {
    /// Reads the `INFO server` text.
    pub fn parse(info: &str) -> Self {
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        let name = field("server_name").unwrap_or("redis").to_ascii_lowercase();
        let version_text = if name == "valkey" {
            field("valkey_version").or_else(|| field("redis_version"))
        } else {
            field("redis_version")
        };
        let version = version_text.map_or((0, 0, 0), parse_version);
        let (set_ifeq, set_nx_get) = match name.as_str() {
            "valkey" => (version >= (8, 1, 0), true),
            _ => (version >= (8, 4, 0), version >= (7, 0, 0)),
        };
        Self {
            name,
            version,
            set_ifeq,
            set_nx_get,
        }
    }
}

impl std::fmt::Display for ServerInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (a, b, c) = self.version;
        write!(f, "{} {a}.{b}.{c}", self.name)
    }
}

fn parse_version(text: &str) -> (u32, u32, u32) {
    let mut parts = text.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    )
}

/// Idempotency records in Redis. Cheap to clone; clones share one connection.
#[derive(Clone)]
pub struct RedisStore {
    conn: conn::Conn,
    inner: Arc<Inner>,
}

struct Inner {
    prefix: String,
    retention: Duration,
    limits: StoreLimits,
    clock: ClockShift,
    client_name: String,
    server: ServerInfo,
    /// Set for a Redis Cluster: its seeds, to reach each primary.
    cluster: Option<conn::ClusterSeeds>,
    /// Bound on each command (a cluster's per-node walks are bounded by a multiple).
    response_timeout: Duration,
    /// Set after a connection error: the next command first re-applies the client name
    /// (a reconnected connection starts unnamed).
    rename: AtomicBool,
    claim: Script,
    finish: Script,
    extend: Script,
    abandon: Script,
    recent: RecentKeys,
    /// The server's clock for the commands that write times without a script.
    server_clock: clock::ServerClock,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.inner.prefix)
            .field("retention", &self.inner.retention)
            .field("client_name", &self.inner.client_name)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to `url` (`redis://[user:pass@]host:port[/db]`, `rediss://…`), names the
    /// connection and checks the server answers. The whole setup is bounded by
    /// `options.connect_timeout`.
    pub async fn connect(url: &str, options: RedisOptions) -> Result<Self, StoreError> {
        if options.prefix.is_empty() || options.prefix.contains(['{', '}']) {
            return Err(StoreError::InvalidInput(format!(
                "redis key prefix must be non-empty and free of braces, got {:?}",
                options.prefix
            )));
        }
        if options.retention.is_zero() {
            return Err(StoreError::InvalidInput(
                "redis retention must be positive".into(),
            ));
        }
        let client_name = match options.client_name.clone() {
            Some(name) => {
                let ok = !name.is_empty()
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c));
                if !ok {
                    return Err(StoreError::InvalidInput(format!(
                        "redis client name must be letters, digits and -_.: only, got {name:?}"
                    )));
                }
                name
            }
            None => format!("idem-{}", uuid::Uuid::new_v4().simple()),
        };
        if let Some(seeds) = conn::ClusterSeeds::parse(url, options.ca_file.as_deref())? {
            return Self::connect_cluster(seeds, options, client_name).await;
        }
        let client = open_client(url, options.ca_file.as_deref())?;
        // One connection attempt per (re)connect: redis-rs backs off at least 1 s between
        // attempts, and a gateway must fail closed quickly rather than hang in an outage.
        // A failed reconnect is retried by the next call.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.response_timeout))
            .set_number_of_retries(0);
        let setup = async {
            let mut conn = ConnectionManager::new_with_config(client, config).await?;
            redis::cmd("CLIENT")
                .arg("SETNAME")
                .arg(&client_name)
                .query_async::<()>(&mut conn)
                .await?;
            let info: String = redis::cmd("INFO")
                .arg("server")
                .query_async(&mut conn)
                .await?;
            Ok::<_, RedisError>((conn, ServerInfo::parse(&info)))
        };
        let (conn, server) = match tokio::time::timeout(options.connect_timeout, setup).await {
            Ok(Ok(connected)) => connected,
            Ok(Err(e)) => return Err(map_err(&e)),
            Err(_) => {
                return Err(StoreError::Unavailable(format!(
                    "redis connection setup timed out after {} ms",
                    options.connect_timeout.as_millis()
                )))
            }
        };
        tracing::debug!(prefix = %options.prefix, client_name = %client_name, %server, "redis store connected");
        Ok(Self::assemble(
            conn::Conn::Single(conn),
            options,
            client_name,
            server,
            None,
        ))
    }

    /// A Redis Cluster: the cluster connection for the records and leases (each command
    /// routed by its key's slot), `INFO` from the first seed. Cluster connections carry
    /// no client name (there is one connection per node).
    async fn connect_cluster(
        seeds: conn::ClusterSeeds,
        options: RedisOptions,
        client_name: String,
    ) -> Result<Self, StoreError> {
        let setup = async {
            let cluster = seeds
                .connect(options.connect_timeout, options.response_timeout)
                .await
                .map_err(|e| map_err(&e))?;
            let mut node = seeds.first_seed().await?;
            let info: String = redis::cmd("INFO")
                .arg("server")
                .query_async(&mut node)
                .await
                .map_err(|e| map_err(&e))?;
            Ok::<_, StoreError>((cluster, ServerInfo::parse(&info)))
        };
        let (cluster, server) = match tokio::time::timeout(options.connect_timeout, setup).await {
            Ok(connected) => connected?,
            Err(_) => {
                return Err(StoreError::Unavailable(format!(
                    "redis cluster setup timed out after {} ms",
                    options.connect_timeout.as_millis()
                )))
            }
        };
        tracing::debug!(prefix = %options.prefix, seeds = seeds.nodes.len(), %server, "redis cluster store connected");
        Ok(Self::assemble(
            conn::Conn::Cluster(cluster),
            options,
            client_name,
            server,
            Some(seeds),
        ))
    }

    fn assemble(
        conn: conn::Conn,
        options: RedisOptions,
        client_name: String,
        server: ServerInfo,
        cluster: Option<conn::ClusterSeeds>,
    ) -> Self {
        Self {
            conn,
            inner: Arc::new(Inner {
                prefix: options.prefix,
                retention: options.retention,
                limits: options.limits,
                clock: options.clock,
                client_name,
                server,
                cluster,
                response_timeout: options.response_timeout,
                rename: AtomicBool::new(false),
                claim: Script::new(CLAIM_LUA),
                finish: Script::new(FINISH_LUA),
                extend: Script::new(EXTEND_LUA),
                abandon: Script::new(ABANDON_LUA),
                recent: RecentKeys::new(options.recent_capacity),
                server_clock: clock::ServerClock::new(),
            }),
        }
    }

    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    pub fn retention(&self) -> Duration {
        self.inner.retention
    }

    /// The server this store is connected to, and what it can do.
    pub fn server(&self) -> &ServerInfo {
        &self.inner.server
    }

    /// The `CLIENT SETNAME` of this store's connection.
    pub fn client_name(&self) -> &str {
        &self.inner.client_name
    }

    /// The Redis key holding `scope`'s record.
    pub fn record_key(&self, scope: &Scope) -> String {
        record_key(&self.inner.prefix, scope)
    }

    /// Round trip to the server (readiness probes).
    pub async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.conn().await;
        let res = redis::cmd("PING").query_async::<()>(&mut conn).await;
        self.check(res)
    }

    /// Whether this store is on a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.inner.cluster.is_some()
    }

    /// Every key matching `pattern`: one server's `SCAN`, or each primary's in a cluster.
    pub(crate) async fn scan_keys(&self, pattern: &str) -> Result<Vec<String>, StoreError> {
        match &self.inner.cluster {
            None => {
                let mut conn = self.conn().await;
                self.check(conn::scan(&mut conn, pattern).await)
            }
            Some(seeds) => {
                // Each node's walk is bounded: a hung primary must not stall the caller.
                let bound = self.inner.response_timeout * 10;
                let timed_out = || StoreError::Unavailable("redis cluster scan timed out".into());
                let walk = async {
                    let mut all = Vec::new();
                    for primary in seeds.primaries().await? {
                        let mut node = seeds.node(&primary).await?;
                        all.extend(self.check(conn::scan(&mut node, pattern).await)?);
                    }
                    Ok(all)
                };
                tokio::time::timeout(bound, walk)
                    .await
                    .map_err(|_| timed_out())?
            }
        }
    }

    /// The connection, with the client name re-applied first when a connection error
    /// may have replaced it.
    async fn conn(&self) -> conn::Conn {
        let mut conn = self.conn.clone();
        // Load first: a swap on every call would write the shared flag each time.
        if matches!(conn, conn::Conn::Single(_))
            && self.inner.rename.load(Ordering::Relaxed)
            && self.inner.rename.swap(false, Ordering::SeqCst)
        {
            let res = redis::cmd("CLIENT")
                .arg("SETNAME")
                .arg(&self.inner.client_name)
                .query_async::<()>(&mut conn)
                .await;
            if let Err(e) = res {
                tracing::debug!(error = %e, "redis: re-applying the client name failed");
                self.inner.rename.store(true, Ordering::SeqCst);
            }
        }
        conn
    }

    /// Maps an error, remembering to rename the connection after a connection error.
    fn check<T>(&self, res: Result<T, RedisError>) -> Result<T, StoreError> {
        res.map_err(|e| {
            let err = map_err(&e);
            if err.is_unavailable() {
                self.inner.rename.store(true, Ordering::SeqCst);
                tracing::warn!(error = %e, "redis store unavailable");
            }
            err
        })
    }

    fn shift(&self) -> i64 {
        self.inner.clock.millis()
    }

    /// `EVALSHA <sha> 1 <key>`; the caller appends the script's arguments.
    fn evalsha(&self, script: &Script, key: &str) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(1).arg(key);
        cmd
    }

    /// Runs a prepared `EVALSHA`; on `NOSCRIPT` (a restarted or flushed server) loads the
    /// script and runs it once more.
    async fn eval(&self, script: &Script, cmd: &redis::Cmd) -> Result<Value, StoreError> {
        let mut conn = self.conn().await;
        match cmd.query_async::<Value>(&mut conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                let loaded = script.prepare_invoke().load_async(&mut conn).await;
                self.check(loaded)?;
                self.check(cmd.query_async::<Value>(&mut conn).await)
            }
            res => self.check(res),
        }
    }

    /// The replay shortcut: a plain `GET`. A finished record answers replay or mismatch
    /// (neither needs the clock, and a finished record only changes by expiring); any
    /// other state, or no record, leaves the decision to the claim script (`None`).
    async fn claim_from_get(
        &self,
        req: &ClaimRequest,
        key: &str,
    ) -> Result<Option<Claim>, StoreError> {
        let mut conn = self.conn().await;
        let value: Option<Vec<u8>> =
            self.check(redis::cmd("GET").arg(key).query_async(&mut conn).await)?;
        let Some(value) = value else {
            self.inner.recent.forget(&req.scope);
            return Ok(None);
        };
        let rec = codec::decode_record(&value)?;
        if !rec.state.is_terminal() {
            return Ok(None);
        }
        // Finished: the store time is not needed to decide.
        Ok(match verdict(rec, req, 0) {
            Verdict::Answer(claim @ (Claim::Replay(_) | Claim::Mismatch { .. })) => Some(claim),
            Verdict::Answer(_) | Verdict::TakeOver { .. } => None,
        })
    }

    fn retention_ms(&self) -> u64 {
        millis_u64(self.inner.retention)
    }

    /// Bounds on the server's clock now (see `clock`), taking a new `TIME` reading when
    /// the last one is due.
    async fn server_now(&self) -> Result<clock::Bounds, StoreError> {
        let clock = &self.inner.server_clock;
        if clock.begin_refresh() {
            // Abandoned on an error or when this future is dropped mid-way.
            let refresh = clock.refresh();
            let mut conn = self.conn().await;
            let sent = std::time::Instant::now();
            let (secs, micros): (i64, i64) =
                self.check(redis::cmd("TIME").query_async(&mut conn).await)?;
            refresh.record(secs, micros, sent, std::time::Instant::now());
        }
        match clock.bounds(self.shift()) {
            Some(bounds) => Ok(bounds),
            // Another caller's first reading is in flight: take one of our own.
            None => {
                let mut conn = self.conn().await;
                let sent = std::time::Instant::now();
                let (secs, micros): (i64, i64) =
                    self.check(redis::cmd("TIME").query_async(&mut conn).await)?;
                clock.record(secs, micros, sent, std::time::Instant::now());
                clock
                    .bounds(self.shift())
                    .ok_or_else(|| corrupt("no clock reading after TIME"))
            }
        }
    }

    /// A claim without a script: `SET … NX GET` writes a fresh PROCESSING record or
    /// hands back the one there. Replays, mismatches and leases certainly live are
    /// answered from that value; `None` leaves the rest (a takeover, or a lease that may
    /// have ended) to the claim script.
    async fn claim_scriptless(
        &self,
        req: &ClaimRequest,
        key: &str,
        lease_ms: Millis,
    ) -> Result<Option<Claim>, StoreError> {
        let now = self.server_now().await?;
        let deadline = now.upper.saturating_add(lease_ms);
        let fresh = idem_core::store::fresh_record(req, now.upper, deadline);
        let value: Arc<[u8]> = codec::encode_record(&fresh)?.into();
        let mut conn = self.conn().await;
        let old: Option<Vec<u8>> = self.check(
            redis::cmd("SET")
                .arg(key)
                .arg(&*value)
                .arg("NX")
                .arg("GET")
                .arg("PX")
                .arg(self.retention_ms().saturating_add(millis_u64(req.lease)))
                .query_async(&mut conn)
                .await,
        )?;
        let Some(old) = old else {
            let token = ClaimToken::of(req, 1, deadline, 1, ClaimKind::Fresh).with_written(value);
            return Ok(Some(Claim::Proceed(token)));
        };
        // Judged at the upper bound: "in progress" only while the lease is surely live.
        Ok(match verdict(codec::decode_record(&old)?, req, now.upper) {
            Verdict::Answer(claim) => Some(claim),
            Verdict::TakeOver { .. } => None,
        })
    }

    /// Completion without a script: `SET … IFEQ` on the value the claim wrote. `None`
    /// when that value is no longer there (a heartbeat rewrote it, or the claim was
    /// superseded); the finish script then decides.
    async fn finish_scriptless(
        &self,
        token: &ClaimToken,
        written: &[u8],
        finish: &Finish,
    ) -> Result<Option<Record>, StoreError> {
        let claimed = codec::decode_record(written)?;
        if claimed.version != token.version || claimed.state != RecordState::Processing {
            return Ok(None);
        }
        let now = self.server_now().await?.upper;
        let done = Record {
            state: finish.state,
            version: claimed.version + 1,
            lease_expires_at: None,
            result: finish.result.clone(),
            updated_at: now,
            completed_at: finish.state.is_terminal().then_some(now),
            ..claimed
        };
        let value = codec::encode_record(&done)?;
        let key = self.record_key(&token.scope);
        let mut conn = self.conn().await;
        let set: Option<String> = self.check(
            redis::cmd("SET")
                .arg(&key)
                .arg(value)
                .arg("IFEQ")
                .arg(written)
                .arg("PX")
                .arg(self.retention_ms())
                .query_async(&mut conn)
                .await,
        )?;
        Ok(set.map(|_| done))
    }
}

fn millis_u64(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Percent-escapes `%`, `{`, `}` and `:` (see the module docs, *Layout*).
pub fn encode_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            ':' => out.push_str("%3A"),
            c => out.push(c),
        }
    }
    out
}

/// `<prefix>:r:{<enc(tenant)>:<enc(key)>}`.
pub fn record_key(prefix: &str, scope: &Scope) -> String {
    format!(
        "{prefix}:r:{{{}:{}}}",
        encode_component(scope.tenant.as_str()),
        encode_component(scope.key.as_str())
    )
}

/// Redis error → store error: cannot-serve-now conditions are `Unavailable`.
/// A client for `url`; a `rediss://` one trusts `ca_file` (PEM) instead of the system's
/// roots when given.
pub fn open_client(
    url: &str,
    ca_file: Option<&std::path::Path>,
) -> Result<redis::Client, StoreError> {
    let bad = |e: RedisError| StoreError::InvalidInput(format!("redis url: {e}"));
    match ca_file {
        None => redis::Client::open(url).map_err(bad),
        Some(path) => {
            let root = std::fs::read(path).map_err(|e| {
                StoreError::InvalidInput(format!(
                    "reading the Redis CA file {}: {e}",
                    path.display()
                ))
            })?;
            if !url.starts_with("rediss://") {
                return Err(StoreError::InvalidInput(
                    "a Redis CA file needs a rediss:// URL".into(),
                ));
            }
            redis::Client::build_with_tls(
                url,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(root),
                },
            )
            .map_err(bad)
        }
    }
}

/// A client for publish/subscribe beside a store on `url`: the server itself, or a
/// cluster's first seed (a cluster broadcasts `PUBLISH` to every node).
pub fn pubsub_client(
    url: &str,
    ca_file: Option<&std::path::Path>,
) -> Result<redis::Client, StoreError> {
    match conn::ClusterSeeds::parse(url, ca_file)? {
        Some(seeds) => open_client(&seeds.nodes[0], ca_file),
        None => open_client(url, ca_file),
    }
}

pub fn map_err(e: &RedisError) -> StoreError {
    use redis::{ErrorKind as K, ServerErrorKind as S};
    let unavailable = e.is_io_error()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_connection_dropped()
        || matches!(
            e.kind(),
            K::Server(S::BusyLoading | S::TryAgain | S::ClusterDown | S::MasterDown | S::ReadOnly)
                | K::ClusterConnectionNotFound
        )
        || matches!(e.code(), Some("BUSY" | "OOM" | "LOADING" | "MASTERDOWN"));
    if let Some(tls) = idem_net::tls::describe_failure(e) {
        return StoreError::Unavailable(format!("redis: {tls}"));
    }
    if unavailable {
        StoreError::Unavailable(format!("redis: {e}"))
    } else {
        StoreError::Backend(format!("redis: {e}"))
    }
}

fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(format!("redis: malformed reply or record: {what}"))
}

fn int(v: &Value) -> Result<i64, StoreError> {
    match v {
        Value::Int(i) => Ok(*i),
        other => Err(corrupt(format!("expected an integer, got {other:?}"))),
    }
}

fn bytes(v: &Value) -> Result<&[u8], StoreError> {
    match v {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.as_bytes()),
        other => Err(corrupt(format!("expected a string, got {other:?}"))),
    }
}

fn opt_owner(v: &Value) -> Result<Option<OwnerId>, StoreError> {
    let b = bytes(v)?;
    if b.is_empty() {
        return Ok(None);
    }
    let s = std::str::from_utf8(b).map_err(|_| corrupt("owner is not UTF-8"))?;
    OwnerId::new(s).map(Some).map_err(corrupt)
}

/// Reads a `claim.lua` reply (see the script's header for the shapes).
fn parse_claim(req: &ClaimRequest, reply: Value) -> Result<Claim, StoreError> {
    let items = match reply {
        // The stored record itself: a replay.
        Value::BulkString(v) => return Ok(Claim::Replay(codec::decode_record(&v)?)),
        Value::Array(items) => items,
        other => return Err(corrupt(format!("claim reply {other:?}"))),
    };
    let item = |i: usize| {
        items
            .get(i)
            .ok_or_else(|| corrupt(format!("claim reply has {} items", items.len())))
    };
    match int(item(0)?)? {
        1 => {
            let kind = match int(item(1)?)? {
                1 => ClaimKind::Fresh,
                2 => ClaimKind::RetryAfterFailure,
                3 => ClaimKind::ExpiredLease {
                    previous_owner: opt_owner(item(5)?)?,
                },
                other => return Err(corrupt(format!("claim kind {other}"))),
            };
            let version = int(item(2)?)?;
            let lease_expires_at = int(item(3)?)?;
            let attempt = i32::try_from(int(item(4)?)?).map_err(corrupt)?;
            let token = ClaimToken::of(req, version, lease_expires_at, attempt, kind);
            Ok(Claim::Proceed(token))
        }
        2 => Ok(Claim::InProgress {
            now: int(item(1)?)?,
            lease_expires_at: int(item(2)?)?,
            owner: opt_owner(item(3)?)?,
        }),
        3 => {
            let state = match bytes(item(1)?)? {
                [code] => codec::state_of(*code)?,
                other => return Err(corrupt(format!("state {other:?}"))),
            };
            Ok(Claim::Mismatch { state })
        }
        other => Err(corrupt(format!("claim decision {other}"))),
    }
}

#[async_trait]
impl IdempotencyStore for RedisStore {
    fn backend(&self) -> &'static str {
        "redis"
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        let lease_ms = self.inner.limits.claim_lease(req)?;
        let key = self.record_key(&req.scope);
        if self.inner.recent.contains(&req.scope) {
            if let Some(claim) = self.claim_from_get(req, &key).await? {
                return Ok(claim);
            }
        }
        if self.inner.server.set_nx_get {
            if let Some(claim) = self.claim_scriptless(req, &key, lease_ms).await? {
                if !matches!(claim, Claim::Proceed(_)) {
                    self.inner.recent.note(&req.scope);
                }
                tracing::debug!(scope = %req.scope, owner = %req.owner, decision = claim.decision(), "redis claim without a script");
                return Ok(claim);
            }
        }
        let ident = codec::identity_block(
            &req.principal,
            &req.fingerprint,
            &req.scope.tenant,
            &req.scope.key,
        );
        let mut cmd = self.evalsha(&self.inner.claim, &key);
        cmd.arg(self.shift())
            .arg(millis_u64(req.lease))
            .arg(self.retention_ms())
            .arg(codec::owner_block(&req.owner))
            .arg(ident);
        let reply = self.eval(&self.inner.claim, &cmd).await?;
        let claim = parse_claim(req, reply)?;
        if !matches!(claim, Claim::Proceed(_)) {
            self.inner.recent.note(&req.scope);
        }
        tracing::debug!(scope = %req.scope, owner = %req.owner, decision = claim.decision(), "redis claim");
        Ok(claim)
    }

    async fn finish(&self, token: &ClaimToken, finish: Finish) -> Result<Record, StoreError> {
        self.inner.limits.check_finish(&finish)?;
        if let (true, Some(written)) = (self.inner.server.set_ifeq, &token.written) {
            if let Some(rec) = self.finish_scriptless(token, written, &finish).await? {
                self.inner.recent.note(&token.scope);
                tracing::debug!(scope = %token.scope, state = %rec.state, version = rec.version, "redis finish without a script");
                return Ok(rec);
            }
        }
        let key = self.record_key(&token.scope);
        let mut cmd = self.evalsha(&self.inner.finish, &key);
        cmd.arg(self.shift())
            .arg(self.retention_ms())
            .arg(codec::owner_block(&token.owner))
            .arg(token.version)
            .arg(&[codec::state_code(finish.state)][..])
            .arg(codec::result_block(finish.result.as_ref())?);
        match self.eval(&self.inner.finish, &cmd).await? {
            Value::BulkString(head) => {
                let rec = codec::decode_finished(&head, finish.result)?;
                self.inner.recent.note(&token.scope);
                tracing::debug!(scope = %token.scope, state = %rec.state, version = rec.version, "redis finish");
                Ok(rec)
            }
            Value::Nil => {
                tracing::info!(scope = %token.scope, owner = %token.owner, version = token.version, "redis finish superseded");
                Err(StoreError::superseded(token))
            }
            other => Err(corrupt(format!("finish reply {other:?}"))),
        }
    }

    async fn extend_lease(
        &self,
        token: &ClaimToken,
        lease: Duration,
    ) -> Result<Millis, StoreError> {
        check_lease(lease)?;
        let key = self.record_key(&token.scope);
        let mut cmd = self.evalsha(&self.inner.extend, &key);
        cmd.arg(self.shift())
            .arg(millis_u64(lease))
            .arg(self.retention_ms())
            .arg(codec::owner_block(&token.owner))
            .arg(token.version);
        match self.eval(&self.inner.extend, &cmd).await? {
            Value::Int(deadline) => Ok(deadline),
            Value::Nil => Err(StoreError::superseded(token)),
            other => Err(corrupt(format!("extend reply {other:?}"))),
        }
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        let key = self.record_key(scope);
        let mut conn = self.conn().await;
        let reply: Option<Vec<u8>> =
            self.check(redis::cmd("GET").arg(&key).query_async(&mut conn).await)?;
        reply.map(|v| codec::decode_record(&v)).transpose()
    }

    /// Always `true`: the guard is the atomic single-key claim script, not a schema
    /// object (see the module docs, *Uniqueness guard*).
    async fn unique_guard(&self) -> Result<bool, StoreError> {
        Ok(true)
    }

    /// Removes the claim's record: nothing of it stays for the retention.
    async fn abandon(&self, token: &ClaimToken) -> Result<(), StoreError> {
        let key = self.record_key(&token.scope);
        let mut cmd = self.evalsha(&self.inner.abandon, &key);
        cmd.arg(codec::owner_block(&token.owner)).arg(token.version);
        match self.eval(&self.inner.abandon, &cmd).await? {
            Value::Int(1) => {
                tracing::debug!(scope = %token.scope, "redis claim abandoned");
                Ok(())
            }
            Value::Int(0) => Err(StoreError::superseded(token)),
            other => Err(corrupt(format!("abandon reply {other:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_info_from_info_text() {
        let valkey = ServerInfo::parse(
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.8\r\n",
        );
        assert_eq!(valkey.to_string(), "valkey 8.1.8");
        assert!(valkey.set_ifeq);
        let redis7 = ServerInfo::parse("# Server\r\nredis_version:7.0.15\r\n");
        assert_eq!(redis7.to_string(), "redis 7.0.15");
        assert!(!redis7.set_ifeq);
        assert!(redis7.set_nx_get && valkey.set_nx_get);
        assert!(!ServerInfo::parse("redis_version:6.2.14\r\n").set_nx_get);
        assert!(ServerInfo::parse("redis_version:8.4.0\r\n").set_ifeq);
        assert!(!ServerInfo::parse("server_name:valkey\r\nvalkey_version:8.0.2\r\n").set_ifeq);
    }
    use idem_core::{IdempotencyKey, TenantId};

    fn scope(t: &str, k: &str) -> Scope {
        Scope::new(TenantId::new(t).unwrap(), IdempotencyKey::new(k).unwrap())
    }

    #[test]
    fn keys_are_injective_and_tagged() {
        let pairs = [
            ("a:b", "c"),
            ("a", "b:c"),
            ("{x}", "y"),
            ("x", "}{"),
            ("%7B", "k"),
            ("{", "k"),
            ("%", "25"),
            ("%25", "k"),
            ("a", "b"),
            ("a%3Ab", "c"),
        ];
        let mut seen = std::collections::HashSet::new();
        for (t, k) in pairs {
            let key = record_key("idem", &scope(t, k));
            assert!(seen.insert(key.clone()), "{key} collides");
            let open = key.find('{').unwrap();
            let close = open + key[open..].find('}').unwrap();
            let tag = &key[open + 1..close];
            assert_eq!(
                tag,
                format!("{}:{}", encode_component(t), encode_component(k))
            );
            assert_eq!(close, key.len() - 1, "{key}: tag must end the key");
            assert_eq!(tag.matches(':').count(), 1);
        }
        assert_eq!(
            record_key("idem", &scope("t{1}", "k:2")),
            "idem:r:{t%7B1%7D:k%3A2}"
        );
    }

    #[test]
    fn error_mapping() {
        let io: RedisError = std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into();
        assert!(map_err(&io).is_unavailable());
        let dropped: RedisError = std::io::Error::from(std::io::ErrorKind::BrokenPipe).into();
        assert!(map_err(&dropped).is_unavailable());
        let timeout: RedisError = std::io::Error::from(std::io::ErrorKind::TimedOut).into();
        assert!(map_err(&timeout).is_unavailable());
        let loading: RedisError = (
            redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading),
            "loading",
        )
            .into();
        assert!(map_err(&loading).is_unavailable());
        let other: RedisError = (redis::ErrorKind::UnexpectedReturnType, "wrong type").into();
        assert_eq!(map_err(&other).kind(), idem_core::ErrorKind::Backend);
    }
}
