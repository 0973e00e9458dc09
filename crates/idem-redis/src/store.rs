//! [`RedisStore`]: connecting, and the records' claim, finish, heartbeat and reads.
//!
//! Owns the store's connection and its scripts; key names are `keys.rs`'s, reply
//! decoding `reply.rs`'s, the record encoding `codec.rs`'s. It must not decide a claim
//! anywhere but in the scripts and [`idem_core::store::verdict`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::store::{check_lease, verdict, Verdict};
use idem_core::{
    Claim, ClaimKind, ClaimRequest, ClaimToken, ClockShift, Finish, IdempotencyStore, Millis,
    Record, RecordState, Scope, StoreError, StoreLimits,
};
use idem_store_kit::{FinishedRecords, RecentKeys};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, Script, Value};

use crate::conn::open_client;
use crate::keys::{millis_u64, record_key};
use crate::options::{RedisOptions, ServerInfo};
use crate::reply::{corrupt, map_err, parse_claim};
use crate::{clock, codec, conn};

const CLAIM_LUA: &str = include_str!("lua/claim.lua");
const FINISH_LUA: &str = include_str!("lua/finish.lua");
const EXTEND_LUA: &str = include_str!("lua/extend.lua");
const ABANDON_LUA: &str = include_str!("lua/abandon.lua");

/// Idempotency records in Redis. Cheap to clone; clones share one connection.
#[derive(Clone)]
pub struct RedisStore {
    pub(crate) conn: conn::Conn,
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) prefix: String,
    pub(crate) retention: Duration,
    pub(crate) limits: StoreLimits,
    pub(crate) clock: ClockShift,
    pub(crate) client_name: String,
    pub(crate) server: ServerInfo,
    /// Set for a Redis Cluster: its seeds, to reach each primary.
    pub(crate) cluster: Option<conn::ClusterSeeds>,
    /// Bound on each command (a cluster's per-node walks are bounded by a multiple).
    pub(crate) response_timeout: Duration,
    /// Set after a connection error: the next command first re-applies the client name
    /// (a reconnected connection starts unnamed).
    pub(crate) rename: AtomicBool,
    /// Whether the last command reached the server. Replays are answered from memory
    /// only while it did: during an outage the store fails as it would without the copy.
    pub(crate) reachable: AtomicBool,
    pub(crate) claim: Script,
    pub(crate) finish: Script,
    pub(crate) extend: Script,
    pub(crate) abandon: Script,
    pub(crate) recent: RecentKeys,
    /// Finished records this process's claims read: replays answered from memory.
    pub(crate) finished: FinishedRecords,
    /// The server's clock for the commands that write times without a script.
    pub(crate) server_clock: clock::ServerClock,
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
                reachable: AtomicBool::new(true),
                claim: Script::new(CLAIM_LUA),
                finish: Script::new(FINISH_LUA),
                extend: Script::new(EXTEND_LUA),
                abandon: Script::new(ABANDON_LUA),
                recent: RecentKeys::new(options.recent_capacity),
                finished: FinishedRecords::new(options.finished),
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
    pub(crate) async fn conn(&self) -> conn::Conn {
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
    pub(crate) fn check<T>(&self, res: Result<T, RedisError>) -> Result<T, StoreError> {
        let res = res.map_err(|e| {
            let err = map_err(&e);
            if err.is_unavailable() {
                self.inner.rename.store(true, Ordering::SeqCst);
                tracing::warn!(error = %e, "redis store unavailable");
            }
            err
        });
        let reached = !matches!(&res, Err(e) if e.is_unavailable());
        // Load first: a store on every command would write the shared flag each time.
        if self.inner.reachable.load(Ordering::Relaxed) != reached {
            self.inner.reachable.store(reached, Ordering::SeqCst);
        }
        res
    }

    /// Whether the last command reached the server (true before the first). An answer
    /// given while this is false came from the in-process copy, not from the server.
    pub fn is_reachable(&self) -> bool {
        self.inner.reachable.load(Ordering::SeqCst)
    }

    pub(crate) fn shift(&self) -> i64 {
        self.inner.clock.millis()
    }

    /// `EVALSHA <sha> 1 <key>`; the caller appends the script's `args` arguments,
    /// `bytes` long in all (at most): the command is written into buffers of that size
    /// at once, not grown argument by argument.
    fn evalsha(&self, script: &Script, key: &str, args: usize, bytes: usize) -> redis::Cmd {
        let hash = script.get_hash();
        let mut cmd = redis::Cmd::with_capacity(4 + args, 8 + hash.len() + key.len() + bytes);
        cmd.arg("EVALSHA").arg(hash).arg(1).arg(key);
        cmd
    }

    /// Runs a prepared `EVALSHA`; on `NOSCRIPT` (a restarted or flushed server) loads the
    /// script and runs it once more.
    pub(crate) async fn eval(
        &self,
        script: &Script,
        cmd: &redis::Cmd,
    ) -> Result<Value, StoreError> {
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

    /// Keeps a finished record in the process-local copy until shortly before its
    /// expiry (or the copy's time to live ends), by the server's clock. Nothing is kept
    /// when the clock cannot be read.
    async fn keep_finished(&self, record: &Record) {
        if self.inner.finished.is_off() || !record.state.is_terminal() {
            return;
        }
        let (Some(completed), Ok(now)) = (record.completed_at, self.server_now().await) else {
            return;
        };
        // A completion written without a script stamps its time at the clock's upper
        // bound, which can run ahead of when the `SET … PX` landed: the margin keeps
        // the copy from outliving the record.
        let retention = Millis::try_from(self.retention_ms()).unwrap_or(Millis::MAX);
        let margin = Millis::try_from(clock::REFRESH.as_millis()).unwrap_or(Millis::MAX);
        let expires_at = completed.saturating_add(retention).saturating_sub(margin);
        self.inner.finished.keep(record, now.upper, expires_at);
    }

    /// The claim answered from a finished record kept in memory, judged at the upper
    /// bound of the server's clock (an entry is dropped as soon as it may have expired).
    /// `None` when nothing is kept for the scope or the clock cannot be read (the
    /// server then decides, or the claim fails as it would without the copy).
    async fn answer_from_memory(&self, req: &ClaimRequest) -> Option<Claim> {
        let kept = self.inner.finished.lookup(&req.scope)?;
        if !self.is_reachable() {
            return None;
        }
        let now = self.server_now().await.ok()?;
        self.inner.finished.answer_from(kept, req, now.upper)
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
        self.keep_finished(&rec).await;
        // Finished: the store time is not needed to decide.
        Ok(match verdict(rec, req, 0) {
            Verdict::Answer(claim @ (Claim::Replay(_) | Claim::Mismatch { .. })) => Some(claim),
            Verdict::Answer(_) | Verdict::TakeOver { .. } => None,
        })
    }

    pub(crate) fn retention_ms(&self) -> u64 {
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
        let mut cmd = redis::Cmd::with_capacity(7, 16 + key.len() + value.len() + NUMBER);
        let old: Option<Vec<u8>> = self.check(
            cmd.arg("SET")
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
        let old = codec::decode_record(&old)?;
        self.keep_finished(&old).await;
        Ok(match verdict(old, req, now.upper) {
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
        let mut cmd =
            redis::Cmd::with_capacity(7, 16 + key.len() + value.len() + written.len() + NUMBER);
        let set: Option<String> = self.check(
            cmd.arg("SET")
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

/// The longest decimal form of a 64-bit number, for sizing a command's buffer.
const NUMBER: usize = 20;

#[async_trait]
impl IdempotencyStore for RedisStore {
    fn backend(&self) -> &'static str {
        "redis"
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        let lease_ms = self.inner.limits.claim_lease(req)?;
        if let Some(claim) = self.answer_from_memory(req).await {
            return Ok(claim);
        }
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
        let owner = codec::owner_block(&req.owner);
        let mut cmd = self.evalsha(
            &self.inner.claim,
            &key,
            5,
            3 * NUMBER + owner.len() + ident.len(),
        );
        cmd.arg(self.shift())
            .arg(millis_u64(req.lease))
            .arg(self.retention_ms())
            .arg(owner)
            .arg(ident);
        let reply = self.eval(&self.inner.claim, &cmd).await?;
        let claim = parse_claim(req, reply)?;
        if let Claim::Replay(record) = &claim {
            self.keep_finished(record).await;
        }
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
        let owner = codec::owner_block(&token.owner);
        let result = codec::result_block(finish.result.as_ref())?;
        let mut cmd = self.evalsha(
            &self.inner.finish,
            &key,
            6,
            3 * NUMBER + 1 + owner.len() + result.len(),
        );
        cmd.arg(self.shift())
            .arg(self.retention_ms())
            .arg(owner)
            .arg(token.version)
            .arg(&[codec::state_code(finish.state)][..])
            .arg(result);
        match self.eval(&self.inner.finish, &cmd).await? {
            Value::BulkString(head) => {
                let rec = codec::decode_finished(&head, Some(token), finish.result)?;
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
        let owner = codec::owner_block(&token.owner);
        let mut cmd = self.evalsha(&self.inner.extend, &key, 5, 4 * NUMBER + owner.len());
        cmd.arg(self.shift())
            .arg(millis_u64(lease))
            .arg(self.retention_ms())
            .arg(owner)
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
        let owner = codec::owner_block(&token.owner);
        let mut cmd = self.evalsha(&self.inner.abandon, &key, 2, NUMBER + owner.len());
        cmd.arg(owner).arg(token.version);
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
