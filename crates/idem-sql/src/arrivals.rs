//! The arrival timeline: every request that reached a key, with the layer's decision,
//! for the operator console's key inspector — in the store's own database, its tables
//! (`idem_arrival_keys`, `idem_arrivals`) in the store's own migrations.
//!
//! Recording is off the request path: [`ArrivalLog`] is the layer's
//! [`ArrivalSink`] (`IdempotencyLayer::with_arrivals`); `record` puts the arrival into a bounded buffer and returns (a full
//! buffer drops it and counts the drop). A writer task takes what gathered every
//! `flush_every` and writes it in one transaction: per key, one upsert of the counts
//! (`idem_arrival_keys`) and a row per arrival only for the first `per_key` arrivals
//! (`idem_arrivals`), so a hot key costs one row however often it replays.
//!
//! Retention follows the record: a key's arrivals are deleted once the key has neither
//! an online record nor an archive entry (and its last arrival is older than
//! `keep_at_least`, so a refusal that never made a record is still shown for a while).
//! This module must not decide anything about a request, and deletes nothing but its
//! own two tables' rows.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    ArchiveLookup, Arrival, ArrivalDecision, ArrivalSink, IdempotencyKey, IdempotencyStore, Millis,
    Scope, TenantId,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use serde::Serialize;
use tokio::sync::{mpsc, watch, Mutex};
use tokio::task::JoinHandle;

use idem_core::StoreError;

use crate::sql::{sql, Conn, Row, Sql, SqlStore};

/// How the timeline is buffered and kept.
#[derive(Debug, Clone)]
pub struct ArrivalOptions {
    /// Arrivals waiting to be written; more are dropped (and counted). Default 65 536.
    pub buffer: usize,
    /// Arrivals kept one by one per key; later ones are only counted. Default 64.
    pub per_key: usize,
    /// How long the writer gathers arrivals before one write. Default 1 s.
    pub flush_every: Duration,
    /// How often keys without a record are looked for. Default 10 min.
    pub sweep_every: Duration,
    /// A key's arrivals stay at least this long after its last arrival. Default 1 h.
    pub keep_at_least: Duration,
}

impl Default for ArrivalOptions {
    fn default() -> Self {
        Self {
            buffer: 65_536,
            per_key: 64,
            flush_every: Duration::from_secs(1),
            sweep_every: Duration::from_secs(600),
            keep_at_least: Duration::from_secs(3600),
        }
    }
}

/// One write takes at most this many arrivals (gathered in memory while waiting).
const MAX_BATCH: usize = 65_536;
/// How often a gathering writer looks at the buffer's fill.
const GLANCE: Duration = Duration::from_millis(100);
/// Keys looked at per page of a retention pass.
const SWEEP_PAGE: i64 = 500;

/// The process clock in epoch ms: arrivals are evidence for people, stamped by the
/// process that received them.
pub(crate) fn now_ms() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A statement of the timeline that failed: the server is gone (unavailable) or refused.
fn failed(e: sqlx::Error) -> StoreError {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => {
            StoreError::Unavailable(format!("arrival timeline: {e}"))
        }
        e => StoreError::Backend(format!("arrival timeline: {e}")),
    }
}

#[derive(Default, Clone)]
struct Counters {
    recorded: Counter,
    dropped: Counter,
    written: Counter,
    write_failures: Counter,
}

struct Inner {
    tx: mpsc::Sender<Arrival>,
    counters: Counters,
    stop: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// The layer's arrival sink and its writer (see the module docs). Cheap to clone.
#[derive(Clone)]
pub struct ArrivalLog {
    inner: Arc<Inner>,
}

impl ArrivalSink for ArrivalLog {
    fn record(&self, arrival: Arrival) {
        match self.inner.tx.try_send(arrival) {
            Ok(()) => {
                self.inner.counters.recorded.inc();
            }
            Err(_) => {
                self.inner.counters.dropped.inc();
            }
        }
    }
}

impl ArrivalLog {
    /// Starts the writer and the retention pass over `db`'s own timeline tables (a key's
    /// timeline is kept while `db` has its record or archive entry). Needs a Tokio runtime.
    pub fn start(db: SqlStore, options: ArrivalOptions) -> Self {
        let records = db.records();
        let archive = Some(db.archive());
        let (tx, rx) = mpsc::channel(options.buffer.max(1));
        let (stop, stopped) = watch::channel(false);
        let inner = Arc::new(Inner {
            tx,
            counters: Counters::default(),
            stop,
            tasks: Mutex::new(Vec::new()),
        });
        let log = Self { inner };
        // Not the log itself: its sender would keep the buffer open after the last log
        // is dropped.
        let writer = tokio::spawn(write_loop(
            db.clone(),
            rx,
            options.clone(),
            stopped.clone(),
            log.inner.counters.clone(),
        ));
        let sweeper = tokio::spawn(sweep_loop(db, records, archive, options, stopped));
        log.inner
            .tasks
            .try_lock()
            .expect("fresh lock")
            .extend([writer, sweeper]);
        log
    }

    /// Adds the log's counters to `registry`.
    pub fn register(&self, registry: &mut Registry) {
        let c = &self.inner.counters;
        registry.register(
            "idem_arrivals_recorded",
            "Keyed arrivals handed to the timeline's buffer",
            c.recorded.clone(),
        );
        registry.register(
            "idem_arrivals_dropped",
            "Keyed arrivals dropped because the timeline's buffer was full",
            c.dropped.clone(),
        );
        registry.register(
            "idem_arrivals_written",
            "Arrivals written to the timeline",
            c.written.clone(),
        );
        registry.register(
            "idem_arrival_write_failures",
            "Timeline writes that failed (their arrivals are lost)",
            c.write_failures.clone(),
        );
    }

    /// Arrivals dropped so far because the buffer was full.
    pub fn dropped(&self) -> u64 {
        self.inner.counters.dropped.get()
    }

    /// Arrivals written so far.
    pub fn written(&self) -> u64 {
        self.inner.counters.written.get()
    }

    /// Writes what is buffered and stops the writer and the retention pass.
    pub async fn close(&self) {
        self.stop();
        let tasks = std::mem::take(&mut *self.inner.tasks.lock().await);
        for task in tasks {
            let _ = task.await;
        }
    }

    /// Tells the writer and the retention pass to stop, without waiting (a server
    /// dropped without a shutdown); the writer still writes what is buffered.
    pub fn stop(&self) {
        self.inner.stop.send_replace(true);
    }
}

async fn write_loop(
    db: SqlStore,
    mut rx: mpsc::Receiver<Arrival>,
    options: ArrivalOptions,
    mut stopped: watch::Receiver<bool>,
    counters: Counters,
) {
    let mut batch = Vec::new();
    loop {
        let mut stopping = tokio::select! {
            got = rx.recv() => match got {
                Some(a) => { batch.push(a); false }
                None => true,
            },
            _ = stopped.wait_for(|s| *s) => true,
        };
        // Gather for a moment: one transaction for many arrivals, one upsert per key. The
        // writer sleeps meanwhile (waking per arrival would cost the request path its
        // CPU), looking every `GLANCE` whether the buffer is half full already.
        let deadline = tokio::time::Instant::now() + options.flush_every;
        let half = options.buffer.max(2) / 2;
        while !stopping {
            let now = tokio::time::Instant::now();
            if now >= deadline || rx.len() >= half {
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep(GLANCE.min(deadline - now)) => {}
                _ = stopped.wait_for(|s| *s) => stopping = true,
            }
        }
        // Once stopping, everything buffered is written before the writer ends.
        stopping = stopping || *stopped.borrow();
        loop {
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(a) => batch.push(a),
                    Err(_) => break,
                }
            }
            if batch.is_empty() {
                break;
            }
            let n = batch.len();
            match write_batch(&db, &batch, options.per_key).await {
                Ok(()) => {
                    counters.written.inc_by(n as u64);
                }
                Err(e) => {
                    counters.write_failures.inc();
                    tracing::warn!(error = %e, arrivals = n, "could not write the arrival timeline");
                }
            }
            batch.clear();
            if !stopping {
                break;
            }
        }
        if stopping {
            return;
        }
    }
}

/// One key's arrivals of a batch.
#[derive(Default)]
struct KeyBatch<'a> {
    arrivals: Vec<&'a Arrival>,
    counts: [i64; 5],
}

fn slot(decision: ArrivalDecision) -> usize {
    match decision {
        ArrivalDecision::Executed => 0,
        ArrivalDecision::Replayed => 1,
        ArrivalDecision::InProgress => 2,
        ArrivalDecision::Mismatch => 3,
        ArrivalDecision::Refused => 4,
    }
}

/// Rows per multi-row statement (at most 10 parameters each: well within both
/// databases' limits).
const ROWS_PER_INSERT: usize = 32;

/// A multi-row statement: `head (…), (…) tail`, with `columns` parameters a row.
struct MultiRow {
    head: &'static str,
    columns: usize,
    tail: &'static str,
    /// Its text for one row and for [`ROWS_PER_INSERT`] rows, made once.
    texts: &'static std::sync::OnceLock<[&'static str; 2]>,
}

impl MultiRow {
    fn text(&self, rows: usize) -> String {
        let values: Vec<String> = (0..rows)
            .map(|r| {
                let p: Vec<String> = (1..=self.columns)
                    .map(|c| format!("${}", r * self.columns + c))
                    .collect();
                format!("({})", p.join(", "))
            })
            .collect();
        format!("{} {} {}", self.head, values.join(", "), self.tail)
    }

    fn texts(&self) -> [&'static str; 2] {
        // Built once per process; statements take static text.
        *self.texts.get_or_init(|| {
            [1, ROWS_PER_INSERT].map(|n| &*Box::leak(self.text(n).into_boxed_str()))
        })
    }

    /// Runs the statement over `items`, [`ROWS_PER_INSERT`] at a time (a key's first batch
    /// can hold thousands of rows; one round trip each would stall the writer), the rest
    /// one by one. Returns the rows the statements answered.
    async fn run<T>(
        &self,
        c: &mut Conn<'_>,
        items: &[T],
        bind: impl Fn(Sql, &T) -> Sql,
    ) -> Result<Vec<Row>, StoreError> {
        let [one, many] = self.texts();
        let chunks = items.chunks_exact(ROWS_PER_INSERT);
        let rest = chunks.remainder().chunks(1);
        let mut answered = Vec::new();
        for (text, group) in chunks.map(|g| (many, g)).chain(rest.map(|g| (one, g))) {
            let q = group.iter().fold(sql(text), &bind);
            answered.extend(c.all(q).await.map_err(failed)?);
        }
        Ok(answered)
    }
}

/// The counts per key, answering each key's new total.
const COUNTS: MultiRow = MultiRow {
    head: "INSERT INTO idem_arrival_keys (tenant_id, idem_key, first_at, last_at, executed, \
           replayed, in_progress, mismatch, refused, total) VALUES",
    columns: 10,
    tail: "ON CONFLICT (tenant_id, idem_key) DO UPDATE SET \
           first_at = CASE WHEN excluded.first_at < idem_arrival_keys.first_at \
             THEN excluded.first_at ELSE idem_arrival_keys.first_at END, \
           last_at = CASE WHEN excluded.last_at > idem_arrival_keys.last_at \
             THEN excluded.last_at ELSE idem_arrival_keys.last_at END, \
           executed = idem_arrival_keys.executed + excluded.executed, \
           replayed = idem_arrival_keys.replayed + excluded.replayed, \
           in_progress = idem_arrival_keys.in_progress + excluded.in_progress, \
           mismatch = idem_arrival_keys.mismatch + excluded.mismatch, \
           refused = idem_arrival_keys.refused + excluded.refused, \
           total = idem_arrival_keys.total + excluded.total \
         RETURNING tenant_id, idem_key, total",
    texts: &COUNTS_TEXTS,
};
static COUNTS_TEXTS: std::sync::OnceLock<[&'static str; 2]> = std::sync::OnceLock::new();

/// One arrival each.
const ROWS: MultiRow = MultiRow {
    head: "INSERT INTO idem_arrivals (tenant_id, idem_key, seq, at, decision, status, elapsed_ms, \
           principal) VALUES",
    columns: 8,
    tail: "ON CONFLICT DO NOTHING",
    texts: &ROWS_TEXTS,
};
static ROWS_TEXTS: std::sync::OnceLock<[&'static str; 2]> = std::sync::OnceLock::new();

/// MySQL's form of [`COUNTS`]: no `ON CONFLICT`, and no `RETURNING` (MySQL 8 has none),
/// so the totals are read afterwards ([`TOTALS_MYSQL`]). Each assignment reads only its
/// own column, so MySQL's left-to-right and MariaDB's simultaneous assignment agree.
#[cfg(feature = "mysql")]
const COUNTS_MYSQL: MultiRow = MultiRow {
    head: COUNTS.head,
    columns: 10,
    tail: "ON DUPLICATE KEY UPDATE \
           first_at = LEAST(first_at, VALUES(first_at)), \
           last_at = GREATEST(last_at, VALUES(last_at)), \
           executed = executed + VALUES(executed), \
           replayed = replayed + VALUES(replayed), \
           in_progress = in_progress + VALUES(in_progress), \
           mismatch = mismatch + VALUES(mismatch), \
           refused = refused + VALUES(refused), \
           total = total + VALUES(total)",
    texts: &COUNTS_MYSQL_TEXTS,
};
#[cfg(feature = "mysql")]
static COUNTS_MYSQL_TEXTS: std::sync::OnceLock<[&'static str; 2]> = std::sync::OnceLock::new();

/// The totals of keys just upserted by this transaction (it holds their row locks, so
/// nobody else's arrivals are counted in between).
#[cfg(feature = "mysql")]
const TOTALS_MYSQL: MultiRow = MultiRow {
    head: "SELECT tenant_id, idem_key, total FROM idem_arrival_keys \
           WHERE (tenant_id, idem_key) IN (",
    columns: 2,
    tail: ")",
    texts: &TOTALS_MYSQL_TEXTS,
};
#[cfg(feature = "mysql")]
static TOTALS_MYSQL_TEXTS: std::sync::OnceLock<[&'static str; 2]> = std::sync::OnceLock::new();

/// MySQL's form of [`ROWS`]: a no-op update on a duplicate, not `INSERT IGNORE` (which
/// would also turn a refused value into a warning).
#[cfg(feature = "mysql")]
const ROWS_MYSQL: MultiRow = MultiRow {
    head: ROWS.head,
    columns: 8,
    tail: "ON DUPLICATE KEY UPDATE seq = seq",
    texts: &ROWS_MYSQL_TEXTS,
};
#[cfg(feature = "mysql")]
static ROWS_MYSQL_TEXTS: std::sync::OnceLock<[&'static str; 2]> = std::sync::OnceLock::new();

type KeyEntry<'k, 'a> = (&'k (&'a str, &'a str), &'k KeyBatch<'a>);

/// The parameters of one key's [`COUNTS`] row.
fn bind_counts(q: Sql, ((tenant, key), kb): &KeyEntry<'_, '_>) -> Sql {
    let first = kb.arrivals.iter().map(|a| a.at).min().unwrap_or_default();
    let last = kb.arrivals.iter().map(|a| a.at).max().unwrap_or_default();
    let q = q.bind(*tenant).bind(*key).bind(first).bind(last);
    kb.counts
        .iter()
        .fold(q, |q, n| q.bind(*n))
        .bind(kb.arrivals.len() as i64)
}

/// The parameters of one [`ROWS`] row.
fn bind_row(q: Sql, (tenant, key, seq, a): &(&str, &str, i64, &Arrival)) -> Sql {
    q.bind(*tenant)
        .bind(*key)
        .bind(*seq)
        .bind(a.at)
        .bind(a.decision.as_str())
        .bind(i64::from(a.status))
        .bind(i64::from(a.elapsed_ms))
        .bind(a.principal.as_str())
}

async fn write_batch(db: &SqlStore, batch: &[Arrival], per_key: usize) -> Result<(), StoreError> {
    let mut by_key: BTreeMap<(&str, &str), KeyBatch<'_>> = BTreeMap::new();
    for a in batch {
        let entry = by_key
            .entry((a.scope.tenant.as_str(), a.scope.key.as_str()))
            .or_default();
        entry.counts[slot(a.decision)] += 1;
        entry.arrivals.push(a);
    }
    let per_key = i64::try_from(per_key).unwrap_or(i64::MAX);
    let mut tx = db.begin().await?;
    let mut c = tx.conn();
    // Counts first; their totals say which of a key's arrivals are among its first.
    let keys: Vec<KeyEntry<'_, '_>> = by_key.iter().collect();
    // MySQL's dialect has no `ON CONFLICT` and no `RETURNING`; every other statement of
    // the timeline is written once for all backends.
    #[cfg(feature = "mysql")]
    let mysql = db.backend() == crate::Backend::Mysql;
    #[cfg(feature = "mysql")]
    let answered = if mysql {
        COUNTS_MYSQL.run(&mut c, &keys, bind_counts).await?;
        TOTALS_MYSQL
            .run(&mut c, &keys, |q, ((tenant, key), _)| {
                q.bind(*tenant).bind(*key)
            })
            .await?
    } else {
        COUNTS.run(&mut c, &keys, bind_counts).await?
    };
    #[cfg(not(feature = "mysql"))]
    let answered = COUNTS.run(&mut c, &keys, bind_counts).await?;
    let mut totals: BTreeMap<(String, String), i64> = BTreeMap::new();
    for row in answered {
        totals.insert(
            (
                row.text("tenant_id").map_err(failed)?,
                row.text("idem_key").map_err(failed)?,
            ),
            row.int("total").map_err(failed)?,
        );
    }
    let mut rows: Vec<(&str, &str, i64, &Arrival)> = Vec::new();
    for ((tenant, key), kb) in &by_key {
        let n = kb.arrivals.len() as i64;
        let total = *totals
            .get(&((*tenant).to_owned(), (*key).to_owned()))
            .ok_or_else(|| StoreError::Backend("the arrival upsert returned no total".into()))?;
        let before = total - n;
        for (i, a) in kb.arrivals.iter().enumerate() {
            let seq = before + i as i64 + 1;
            if seq > per_key {
                break;
            }
            rows.push((tenant, key, seq, *a));
        }
    }
    #[cfg(feature = "mysql")]
    let statement = if mysql { &ROWS_MYSQL } else { &ROWS };
    #[cfg(not(feature = "mysql"))]
    let statement = &ROWS;
    statement.run(&mut c, &rows, bind_row).await?;
    tx.commit().await
}

async fn sweep_loop(
    db: SqlStore,
    records: Arc<dyn IdempotencyStore>,
    archive: Option<Arc<dyn ArchiveLookup>>,
    options: ArrivalOptions,
    mut stopped: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(options.sweep_every.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopped.wait_for(|s| *s) => return,
        }
        let cutoff = now_ms() - i64::try_from(options.keep_at_least.as_millis()).unwrap_or(0);
        // A shutdown does not wait for a pass: the next one takes up the rest.
        let passed = tokio::select! {
            passed = sweep(&db, records.as_ref(), archive.as_deref(), cutoff) => passed,
            _ = stopped.wait_for(|s| *s) => return,
        };
        match passed {
            Ok(0) => {}
            Ok(n) => tracing::debug!(
                keys = n,
                "arrival timelines of keys without a record deleted"
            ),
            Err(e) => tracing::warn!(error = %e, "could not sweep the arrival timeline"),
        }
    }
}

/// Deletes the timelines of keys last seen before `cutoff` that have neither a record
/// nor an archive entry. Returns how many keys' timelines went.
pub async fn sweep(
    db: &SqlStore,
    records: &dyn IdempotencyStore,
    archive: Option<&dyn ArchiveLookup>,
    cutoff: Millis,
) -> Result<usize, StoreError> {
    let mut deleted = 0;
    let mut after: (i64, String, String) = (i64::MIN, String::new(), String::new());
    loop {
        let page = {
            let mut conn = db.acquire().await.map_err(failed)?;
            conn.conn()
                .all(
                    sql(
                        "SELECT tenant_id, idem_key, last_at FROM idem_arrival_keys \
                         WHERE last_at < $1 AND (last_at > $2 OR (last_at = $2 AND \
                           (tenant_id > $3 OR (tenant_id = $3 AND idem_key > $4)))) \
                         ORDER BY last_at, tenant_id, idem_key LIMIT $5",
                    )
                    .bind(cutoff)
                    .bind(after.0)
                    .bind(after.1.clone())
                    .bind(after.2.clone())
                    .bind(SWEEP_PAGE),
                )
                .await
                .map_err(failed)?
        };
        let full = page.len() as i64 == SWEEP_PAGE;
        for row in &page {
            let (tenant, key, last_at) = (
                row.text("tenant_id").map_err(failed)?,
                row.text("idem_key").map_err(failed)?,
                row.int("last_at").map_err(failed)?,
            );
            after = (last_at, tenant.clone(), key.clone());
            // A key the store would refuse cannot have a record.
            let (Ok(t), Ok(k)) = (
                TenantId::new(tenant.clone()),
                IdempotencyKey::new(key.clone()),
            ) else {
                deleted += delete_key(db, &tenant, &key, cutoff).await?;
                continue;
            };
            if records
                .get(&Scope::new(t.clone(), k.clone()))
                .await?
                .is_some()
            {
                continue;
            }
            if let Some(archive) = archive {
                if archive.archived(&t, &k).await?.is_some() {
                    continue;
                }
            }
            deleted += delete_key(db, &tenant, &key, cutoff).await?;
        }
        if !full {
            return Ok(deleted);
        }
    }
}

/// Deletes one key's timeline unless it arrived again since it was read.
async fn delete_key(
    db: &SqlStore,
    tenant: &str,
    key: &str,
    cutoff: Millis,
) -> Result<usize, StoreError> {
    let mut tx = db.begin().await?;
    let mut c = tx.conn();
    let gone = c
        .execute(
            sql("DELETE FROM idem_arrival_keys WHERE tenant_id = $1 AND idem_key = $2 AND last_at < $3")
                .bind(tenant)
                .bind(key)
                .bind(cutoff),
        )
        .await.map_err(failed)?;
    if gone == 1 {
        c.execute(
            sql("DELETE FROM idem_arrivals WHERE tenant_id = $1 AND idem_key = $2")
                .bind(tenant)
                .bind(key),
        )
        .await
        .map_err(failed)?;
    }
    tx.commit().await?;
    Ok(gone as usize)
}

/// One arrival as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArrivalRow {
    pub seq: i64,
    pub at: Millis,
    pub decision: ArrivalDecision,
    pub status: u16,
    pub elapsed_ms: i64,
    pub principal: String,
}

/// A key's timeline: the counts of every arrival, and the first ones one by one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyArrivals {
    pub first_at: Millis,
    pub last_at: Millis,
    pub total: i64,
    /// By decision, in [`ArrivalDecision::ALL`] order.
    pub counts: Vec<(ArrivalDecision, i64)>,
    pub arrivals: Vec<ArrivalRow>,
}

impl KeyArrivals {
    pub fn count(&self, decision: ArrivalDecision) -> i64 {
        self.counts
            .iter()
            .find(|(d, _)| *d == decision)
            .map_or(0, |(_, n)| *n)
    }

    /// `8 arrivals: 1 executed, 7 replayed` (decisions that never happened left out).
    pub fn summary(&self) -> String {
        let parts: Vec<String> = self
            .counts
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(d, n)| format!("{n} {}", d.label()))
            .collect();
        let noun = if self.total == 1 {
            "arrival"
        } else {
            "arrivals"
        };
        format!("{} {noun}: {}", self.total, parts.join(", "))
    }
}

/// A key that arrived, found by name (it may have no record: refused before one, or its
/// record is gone).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArrivedKey {
    pub tenant: String,
    pub key: String,
    pub last_at: Millis,
}

/// Keys of `tenant` named exactly `key` that have a timeline, up to `limit`.
pub async fn arrived_keys(
    db: &SqlStore,
    tenant: &str,
    key: &str,
    limit: usize,
) -> Result<Vec<ArrivedKey>, StoreError> {
    let mut conn = db.acquire().await.map_err(failed)?;
    let rows = conn
        .conn()
        .all(
            sql(
                "SELECT tenant_id, idem_key, last_at FROM idem_arrival_keys \
                 WHERE idem_key = $1 AND tenant_id = $2 LIMIT $3",
            )
            .bind(key)
            .bind(tenant)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX)),
        )
        .await
        .map_err(failed)?;
    rows.iter()
        .map(|r| {
            Ok(ArrivedKey {
                tenant: r.text("tenant_id").map_err(failed)?,
                key: r.text("idem_key").map_err(failed)?,
                last_at: r.int("last_at").map_err(failed)?,
            })
        })
        .collect()
}

/// The timeline of `(tenant, key)`, if it had an arrival.
pub async fn key_arrivals(
    db: &SqlStore,
    tenant: &str,
    key: &str,
) -> Result<Option<KeyArrivals>, StoreError> {
    let mut conn = db.acquire().await.map_err(failed)?;
    let mut c = conn.conn();
    key_arrivals_on(&mut c, tenant, key).await
}

async fn key_arrivals_on(
    c: &mut Conn<'_>,
    tenant: &str,
    key: &str,
) -> Result<Option<KeyArrivals>, StoreError> {
    let Some(head) = c
        .optional(
            sql(
                "SELECT first_at, last_at, executed, replayed, in_progress, mismatch, refused, \
                   total FROM idem_arrival_keys WHERE tenant_id = $1 AND idem_key = $2",
            )
            .bind(tenant)
            .bind(key),
        )
        .await
        .map_err(failed)?
    else {
        return Ok(None);
    };
    let counts = ArrivalDecision::ALL
        .into_iter()
        .map(|d| Ok((d, head.int(d.as_str()).map_err(failed)?)))
        .collect::<Result<Vec<_>, StoreError>>()?;
    let rows = c
        .all(
            sql(
                "SELECT seq, at, decision, status, elapsed_ms, principal FROM idem_arrivals \
                 WHERE tenant_id = $1 AND idem_key = $2 ORDER BY at, seq",
            )
            .bind(tenant)
            .bind(key),
        )
        .await
        .map_err(failed)?;
    let arrivals = rows
        .iter()
        .map(|r| {
            Ok(ArrivalRow {
                seq: r.int("seq").map_err(failed)?,
                at: r.int("at").map_err(failed)?,
                decision: r
                    .text("decision")
                    .map_err(failed)?
                    .parse()
                    .map_err(StoreError::Backend)?,
                status: u16::try_from(r.int("status").map_err(failed)?).unwrap_or(0),
                elapsed_ms: r.int("elapsed_ms").map_err(failed)?,
                principal: r.text("principal").map_err(failed)?,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    Ok(Some(KeyArrivals {
        first_at: head.int("first_at").map_err(failed)?,
        last_at: head.int("last_at").map_err(failed)?,
        total: head.int("total").map_err(failed)?,
        counts,
        arrivals,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::Principal;

    fn arrival(key: &str, decision: ArrivalDecision, at: Millis) -> Arrival {
        Arrival {
            scope: Scope::new(
                TenantId::new("t1").unwrap(),
                IdempotencyKey::new(key).unwrap(),
            ),
            principal: Principal::new("p").unwrap(),
            decision,
            status: 201,
            at,
            elapsed_ms: 3,
        }
    }

    #[tokio::test]
    async fn bounded_per_key_and_kept_while_the_record_is() {
        let dir = tempfile::tempdir().unwrap();
        let db = SqlStore::open_sqlite_path(dir.path().join("a.db"))
            .await
            .unwrap();
        let t1 = TenantId::new("t1").unwrap();
        db.seed_terminal(&t1, "kept-", 1, now_ms(), 10)
            .await
            .unwrap();
        // 70 arrivals of a recorded key in two batches, 2 of a key without a record.
        let now = now_ms() - 10_000;
        let mut batch: Vec<Arrival> = (0..40)
            .map(|i| {
                arrival(
                    "kept-0",
                    if i == 0 {
                        ArrivalDecision::Executed
                    } else {
                        ArrivalDecision::Replayed
                    },
                    now + i,
                )
            })
            .collect();
        batch.push(arrival("gone", ArrivalDecision::Refused, now));
        write_batch(&db, &batch, 64).await.unwrap();
        let batch: Vec<Arrival> = (40..70)
            .map(|i| arrival("kept-0", ArrivalDecision::Replayed, now + i))
            .chain([arrival("gone", ArrivalDecision::Mismatch, now + 1)])
            .collect();
        write_batch(&db, &batch, 64).await.unwrap();
        let kept = key_arrivals(&db, "t1", "kept-0").await.unwrap().unwrap();
        assert_eq!(kept.total, 70);
        assert_eq!(kept.arrivals.len(), 64);
        assert_eq!(kept.summary(), "70 arrivals: 1 executed, 69 replayed");
        assert_eq!(kept.arrivals.last().unwrap().seq, 64);
        assert_eq!((kept.first_at, kept.last_at), (now, now + 69));
        let records = db.records();
        let archive = db.archive();
        // Too recent to go, whatever the record says.
        assert_eq!(
            sweep(&db, records.as_ref(), Some(archive.as_ref()), now - 1)
                .await
                .unwrap(),
            0
        );
        // Older than the cutoff: the key without a record goes, the other stays.
        assert_eq!(
            sweep(&db, records.as_ref(), Some(archive.as_ref()), now_ms())
                .await
                .unwrap(),
            1
        );
        assert!(key_arrivals(&db, "t1", "gone").await.unwrap().is_none());
        assert_eq!(
            key_arrivals(&db, "t1", "kept-0")
                .await
                .unwrap()
                .unwrap()
                .total,
            70
        );
        // Many keys per write, and MySQL and PostgreSQL: tests/facade.rs.
    }

    #[test]
    fn summary_names_what_happened() {
        let k = KeyArrivals {
            first_at: 0,
            last_at: 1,
            total: 8,
            counts: vec![
                (ArrivalDecision::Executed, 1),
                (ArrivalDecision::Replayed, 7),
                (ArrivalDecision::InProgress, 0),
                (ArrivalDecision::Mismatch, 0),
                (ArrivalDecision::Refused, 0),
            ],
            arrivals: vec![],
        };
        assert_eq!(k.summary(), "8 arrivals: 1 executed, 7 replayed");
        assert_eq!(k.count(ArrivalDecision::Replayed), 7);
    }
}
