//! Leases with fencing tokens on PostgreSQL, and the fenced write for resources in the
//! same database.
//!
//! PostgreSQL is where fencing tokens for high-risk writes come from (docs/DESIGN.md: where each store fits): the
//! counter, the lease and the protected resource's fence are rows committed by the same
//! database, so a token the fence has seen can never be granted again.
//!
//! # Tables (migration 2, in the store's schema)
//!
//! - `idem_leases(name, owner, token, acquired_at, expires_at, renewals, ended_at)`: the
//!   current or last lease per name (migration 8). The row outlives its lease: a
//!   release, a recorded expiry or a force-release sets `ended_at`, so the row's token is
//!   the last one granted. An expired row stays live until the store notices it (a later
//!   acquire, renew, release or force-release), which records `expired` and ends or
//!   replaces it. Triggers refuse lowering a row's token and `TRUNCATE`; a row deleted
//!   anyway leaves its token in the counter.
//! - `idem_lease_tokens(name, last_token)`: the per-name lock of the locked path, the
//!   token of a name's first grant, and the keeper of a deleted row's token. Never
//!   deleted and never lowered: a trigger refuses `DELETE`, `TRUNCATE` and any `UPDATE`
//!   that would lower `last_token`. With the row's token it makes sure tokens do not go
//!   back after a release, an expiry, a deleted lease row, a restart, or an operator's
//!   cleanup by hand.
//! - `idem_lease_event_rows`: the stored evidence (owner, token, acquire and expiry
//!   times, detail), ordered by an identity column. The holder's release is not a row
//!   of its own (migration 9): it is recorded in place on the lease row
//!   (`release_after`: the name's last stored event then) and the next grant's `acquired` row
//!   carries it (`released_*`). Read the evidence through the view `idem_lease_events`:
//!   every event once, releases included, in id order.
//! - `idem_fences(resource, last_token, lease_name, owner, updated_at)`: the last token
//!   each protected resource accepted.
//!
//! # Atomicity
//!
//! The two common changes are one statement each, and write the lease row in place
//! (no insert or delete churn). The uncontended grant updates an ended row under its
//! row lock, token + 1, and records `acquired`; concurrent grants wait on the lock and
//! re-check the row (READ COMMITTED), so one wins. The holder's release is a
//! compare-and-set on owner, token and a live lease that ends the row and records the
//! release on it. A locked change holds the row `FOR UPDATE`, so these wait for it.
//! A name's first grant (no row) bumps the counter under its row lock (`INSERT … ON
//! CONFLICT DO UPDATE`, which waits for a concurrent holder of the row and then sees its
//! committed value), inserts the row unless one appeared meanwhile (`ON CONFLICT DO
//! NOTHING` sees committed rows, not only the snapshot) and records `acquired`; a bump
//! whose insert lost leaves a gap in the counter, never a repeat.
//!
//! Every other change (a grant over an expired lease, renewals, a release by a
//! non-holder, force-release) is one READ COMMITTED transaction that first locks the
//! name's counter row (against a first grant), then reads the lease row `FOR UPDATE`
//! (against the one-statement changes) and the database clock *after* that lock, so the
//! row is stable until commit and no change it waited for is later than its time; the
//! evidence commits with the change. An acquire that finds a live holder answers from
//! one plain read and writes nothing, so contenders polling a held lease do not queue on
//! the lock.
//!
//! Tokens: the row's token + 1 for the one-statement grant (the row holds the last
//! grant; an insert below the counter is refused), the counter + 1 for a first grant
//! (the counter keeps a deleted row's token), `max(counter, row's token) + 1` on the
//! locked path. A renew, release or force-release of a name never granted leaves its
//! counter row at 0 (the lock it took); [`LeaseStore::show`] reports no token for it.
//!
//! Upgrade every process using a schema together: an idem older than migration 8 would
//! take an ended row for a live lease; its grants over such rows are refused by a
//! trigger rather than allowed to grant twice.
//!
//! # Time
//!
//! Every time is epoch milliseconds from `clock_timestamp()` (the database's clock,
//! never the caller's) plus the [`ClockShift`], which is zero in
//! production.
//!
//! # Limits
//!
//! Tokens never go back as far as committed transactions survive. With asynchronous
//! streaming replication a failover can lose the last committed transactions, and with
//! them the grants they made: the promoted standby could grant a token again. Where a
//! lost grant matters, run the lease tables with synchronous replication
//! (`synchronous_commit = on` / `remote_apply` and `synchronous_standby_names`).
//!
//! It must not invent lease rules: `idem_core::lease` states them, and
//! `idem-conformance::lease` checks them.

use std::time::Duration;

use async_trait::async_trait;
use idem_core::lease::check_ttl;
use idem_core::retention::millis;
use idem_core::{
    Acquire, ClockShift, FencingToken, Lease, LeaseError, LeaseEvent, LeaseEventKind, LeaseName,
    LeaseStatus, LeaseStore, Millis, OwnerId, Release, Renew,
};
use idem_store_kit::row::{LeaseEventRow, LeaseRow, LeaseSnapshot, LeaseSteps};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgExecutor, Postgres, Row};

use crate::error::map_err;
use crate::PgStore;

pub use idem_store_kit::row::FencedWriteFuture;

/// The database clock in epoch milliseconds (`clock_timestamp()`: the time of reading,
/// not of the transaction start).
pub(crate) const CLOCK: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// The (possibly schema-qualified) lease tables.
pub(crate) struct Tables {
    pub(crate) leases: String,
    pub(crate) tokens: String,
    /// The evidence as read: a view over the stored events and the releases recorded
    /// in place (migration 9).
    pub(crate) events: String,
    /// The stored events, where evidence is written and trimmed.
    pub(crate) event_rows: String,
    pub(crate) fences: String,
}

impl Tables {
    fn of(schema: Option<&str>) -> Self {
        // `schema` passed `validate_schema`: a plain lower-case identifier.
        let q = |t: &str| match schema {
            Some(s) => format!("\"{s}\".{t}"),
            None => t.to_string(),
        };
        Self {
            leases: q("idem_leases"),
            tokens: q("idem_lease_tokens"),
            events: q("idem_lease_events"),
            event_rows: q("idem_lease_event_rows"),
            fences: q("idem_fences"),
        }
    }
}

pub(crate) fn lerr(what: &'static str) -> impl Fn(sqlx::Error) -> LeaseError {
    move |e| map_err(what, e).into()
}

/// The lease row, the token counter and the store time in one statement (one snapshot),
/// without locks.
async fn snapshot(
    exec: impl PgExecutor<'_>,
    clock: &ClockShift,
    t: &Tables,
    name: &LeaseName,
) -> Result<LeaseSnapshot, LeaseError> {
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {CLOCK} + $2 AS now_ms, l.name IS NOT NULL AND l.ended_at IS NULL AS found, \
           l.owner, l.token, l.acquired_at, l.expires_at, l.renewals, \
           GREATEST(t.last_token, l.token, 0) AS last_token \
         FROM (SELECT 1) one \
         LEFT JOIN {leases} l ON l.name = $1 \
         LEFT JOIN {tokens} t ON t.name = $1",
        leases = t.leases,
        tokens = t.tokens,
    )))
    .bind(name.as_str())
    .bind(clock.millis())
    .fetch_one(exec)
    .await
    .map_err(lerr("lease read"))?;
    let found: bool = row.try_get("found").map_err(lerr("lease read"))?;
    LeaseSnapshot::decode(
        name,
        row.try_get("now_ms").map_err(lerr("lease read"))?,
        found.then(|| lease_row(&row)).transpose()?,
        row.try_get("last_token").map_err(lerr("lease read"))?,
    )
}

fn lease_from_row(name: &LeaseName, row: &PgRow) -> Result<Lease, LeaseError> {
    lease_row(row)?.decode(name)
}

fn lease_row(row: &PgRow) -> Result<LeaseRow, LeaseError> {
    let e = lerr("lease decode");
    Ok(LeaseRow {
        owner: row.try_get("owner").map_err(&e)?,
        token: row.try_get("token").map_err(&e)?,
        acquired_at: row.try_get("acquired_at").map_err(&e)?,
        expires_at: row.try_get("expires_at").map_err(&e)?,
        renewals: row.try_get::<i32, _>("renewals").map_err(&e)?.into(),
    })
}

/// What the common grant found.
enum FastGrant {
    Granted(Lease),
    /// The name has a row that is not ended (live, or expired and to be settled).
    Taken,
    /// The name has no row: never granted (or its row was deleted).
    NoRow,
}

/// The common grant in one statement (one round trip, one commit): the name's row has
/// ended. It is updated in place under its row lock, so concurrent grants get strictly
/// rising tokens in commit order (the row's token is the last one granted), and the
/// evidence is written from what was updated. The time is read per row (the subquery
/// refers to it): again after the lock when the row changed while this waited; when it
/// was only locked, the time is from before the wait and the lease a little shorter.
async fn fast_update(
    exec: impl PgExecutor<'_>,
    clock: &ClockShift,
    t: &Tables,
    name: &LeaseName,
    owner: &OwnerId,
    ttl: Duration,
) -> Result<FastGrant, LeaseError> {
    let sql = format!(
        // SET reads the row as it was: the ended tenure is kept in `prev_*`, and comes
        // back in RETURNING for the event row to carry its in-place release.
        "WITH u AS ( \
           UPDATE {leases} l SET prev_owner = l.owner, prev_token = l.token, \
             prev_acquired_at = l.acquired_at, prev_expires_at = l.expires_at, \
             prev_ended_at = l.ended_at, prev_release_after = l.release_after, \
             owner = $2, token = l.token + 1, \
             (acquired_at, expires_at) = (SELECT n, n + $3 FROM \
               (SELECT {CLOCK} + $4 + 0 * l.token AS n) c), \
             renewals = 0, ended_at = NULL, release_after = NULL \
           WHERE name = $1 AND ended_at IS NOT NULL \
           RETURNING token, acquired_at, expires_at, prev_release_after AS rel, \
             prev_owner AS r_owner, prev_token AS r_token, prev_acquired_at AS r_acquired, \
             prev_expires_at AS r_expires, prev_ended_at AS r_at \
         ), ev AS ( \
           INSERT INTO {rows} (name, kind, at, owner, token, acquired_at, expires_at, \
             released_after, released_owner, released_token, released_acquired_at, \
             released_expires_at, released_at) \
           SELECT $1, $5, acquired_at, $2, token, acquired_at, expires_at, rel, \
             CASE WHEN rel IS NOT NULL THEN r_owner END, \
             CASE WHEN rel IS NOT NULL THEN r_token END, \
             CASE WHEN rel IS NOT NULL THEN r_acquired END, \
             CASE WHEN rel IS NOT NULL THEN r_expires END, \
             CASE WHEN rel IS NOT NULL THEN r_at END FROM u \
         ) \
         SELECT u.token, u.acquired_at, u.expires_at, \
           CASE WHEN u.token IS NULL THEN EXISTS (SELECT 1 FROM {leases} WHERE name = $1) END \
         FROM (SELECT 1) one LEFT JOIN u ON true",
        leases = t.leases,
        rows = t.event_rows,
    );
    let row: (Option<i64>, Option<i64>, Option<i64>, Option<bool>) =
        grant_query(sql, name, owner, ttl, clock)
            .fetch_one(exec)
            .await
            .map_err(lerr("lease grant"))?;
    Ok(match row {
        (Some(token), Some(acquired_at), Some(expires_at), _) => {
            FastGrant::Granted(new_lease(name, owner, (token, acquired_at, expires_at)))
        }
        (_, _, _, Some(false)) => FastGrant::NoRow,
        _ => FastGrant::Taken,
    })
}

/// The first grant of a name in one statement: no lease row for the name in this
/// statement's snapshot. The counter (which keeps the token of a deleted row) is bumped
/// under its row lock (so concurrent grants get strictly rising tokens in commit
/// order), the lease row is inserted unless one appeared meanwhile, and the evidence is
/// written from what was inserted. `None`: a lease row exists or appeared concurrently —
/// the locked path decides. A bump whose insert lost leaves a gap in the counter, never
/// a repeat.
async fn fast_insert(
    exec: impl PgExecutor<'_>,
    clock: &ClockShift,
    t: &Tables,
    name: &LeaseName,
    owner: &OwnerId,
    ttl: Duration,
) -> Result<Option<Lease>, LeaseError> {
    // The time is read in `g`'s select list, after `bump` holds the counter row lock.
    let sql = format!(
        "WITH bump AS ( \
           INSERT INTO {tokens} AS t (name, last_token) \
           SELECT $1, 1 WHERE NOT EXISTS (SELECT 1 FROM {leases} WHERE name = $1) \
           ON CONFLICT (name) DO UPDATE SET last_token = t.last_token + 1 \
           RETURNING t.last_token \
         ), g AS ( \
           INSERT INTO {leases} (name, owner, token, acquired_at, expires_at, renewals) \
           SELECT $1, $2, b.last_token, n.now_ms, n.now_ms + $3, 0 \
           FROM bump b CROSS JOIN LATERAL (SELECT {CLOCK} + $4 + 0 * b.last_token AS now_ms) n \
           ON CONFLICT (name) DO NOTHING \
           RETURNING token, acquired_at, expires_at \
         ), ev AS ( \
           {acquired} FROM g \
         ) \
         SELECT token, acquired_at, expires_at FROM g",
        tokens = t.tokens,
        leases = t.leases,
        acquired = acquired_event(t),
    );
    let row: Option<(i64, i64, i64)> = grant_query(sql, name, owner, ttl, clock)
        .fetch_optional(exec)
        .await
        .map_err(lerr("lease grant"))?;
    Ok(row.map(|granted| new_lease(name, owner, granted)))
}

/// The parameters of both one-statement grants: $1 name, $2 owner, $3 ttl (ms), $4 clock
/// shift, $5 the `acquired` event kind.
fn grant_query<'q, O>(
    sql: String,
    name: &'q LeaseName,
    owner: &'q OwnerId,
    ttl: Duration,
    clock: &ClockShift,
) -> sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>
where
    O: for<'r> sqlx::FromRow<'r, PgRow>,
{
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(name.as_str())
        .bind(owner.as_str())
        .bind(millis(ttl))
        .bind(clock.millis())
        .bind(LeaseEventKind::Acquired.as_str())
}

/// The `acquired` event of a one-statement grant, without its `FROM`: the caller names
/// the CTE holding the granted row (with [`grant_query`]'s parameters).
fn acquired_event(t: &Tables) -> String {
    format!(
        "INSERT INTO {events} (name, kind, at, owner, token, acquired_at, expires_at) \
         SELECT $1, $5, acquired_at, $2, token, acquired_at, expires_at",
        events = t.event_rows
    )
}

/// A lease just granted, from the statement's (token, acquired_at, expires_at).
fn new_lease(
    name: &LeaseName,
    owner: &OwnerId,
    (token, acquired_at, expires_at): (i64, i64, i64),
) -> Lease {
    Lease::granted(
        name,
        owner,
        FencingToken::new(token),
        acquired_at,
        expires_at,
    )
}

/// The common release in one statement: a compare-and-set ending the caller's live lease
/// (the row and its token stay) with its evidence. `None`: the caller does not hold it
/// (or it expired) — the locked path records the owner mismatch or settles the expiry.
async fn fast_release(
    exec: impl PgExecutor<'_>,
    clock: &ClockShift,
    t: &Tables,
    name: &LeaseName,
    owner: &OwnerId,
    token: FencingToken,
) -> Result<Option<Release>, LeaseError> {
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        // `release_after` is read in the statement's snapshot: an event a concurrent
        // locked change of this name committed while this waited on the row may list
        // after the release although it came first (its time is exact).
        "UPDATE {leases} SET ended_at = {CLOCK} + $4, \
           release_after = coalesce((SELECT max(id) FROM {rows} WHERE name = $1), 0) \
         WHERE name = $1 AND owner = $2 AND token = $3 AND ended_at IS NULL \
           AND expires_at > {CLOCK} + $4 \
         RETURNING owner, token, acquired_at, expires_at, renewals, ended_at AS now_ms",
        leases = t.leases,
        rows = t.event_rows,
    )))
    .bind(name.as_str())
    .bind(owner.as_str())
    .bind(token.get())
    .bind(clock.millis())
    .fetch_optional(exec)
    .await
    .map_err(lerr("lease release"))?;
    let Some(row) = row else { return Ok(None) };
    let lease = lease_from_row(name, &row)?;
    let released_at = row.try_get("now_ms").map_err(lerr("lease release"))?;
    Ok(Some(Release::Released { lease, released_at }))
}

/// Takes the name's lock (its counter row, created at 0 if missing) and returns the
/// counter. Held until the transaction ends.
async fn lock_name(
    conn: &mut PgConnection,
    t: &Tables,
    name: &LeaseName,
) -> Result<i64, LeaseError> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {tokens} AS t (name, last_token) VALUES ($1, 0) \
         ON CONFLICT (name) DO UPDATE SET last_token = t.last_token \
         RETURNING t.last_token",
        tokens = t.tokens,
    )))
    .bind(name.as_str())
    .fetch_one(&mut *conn)
    .await
    .map_err(lerr("lease lock"))
}

/// What the locked path reads under the row lock.
struct Locked {
    /// The lease, unless the row has ended.
    lease: Option<Lease>,
    /// The row's token (0 without a row).
    row_token: i64,
    /// The store time, read after the row lock.
    now: Millis,
}

/// The lease row under the name's lock, and the clock read after the row's lock too.
async fn locked_lease(
    conn: &mut PgConnection,
    clock: &ClockShift,
    t: &Tables,
    name: &LeaseName,
) -> Result<Locked, LeaseError> {
    // FOR UPDATE as well, against the one-statement grant and release, which write the
    // row without the name's lock: one may have committed while this waited, and the
    // select list (the clock) is computed after the subquery's lock.
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {CLOCK} + $2 AS now_ms, l.* FROM (SELECT 1) one LEFT JOIN LATERAL ( \
           SELECT owner, token, acquired_at, expires_at, renewals, \
             ended_at IS NOT NULL AS ended \
           FROM {leases} WHERE name = $1 FOR UPDATE) l ON true",
        leases = t.leases,
    )))
    .bind(name.as_str())
    .bind(clock.millis())
    .fetch_one(&mut *conn)
    .await
    .map_err(lerr("lease read"))?;
    let e = lerr("lease read");
    let now: Millis = row.try_get("now_ms").map_err(&e)?;
    let Some(row_token) = row.try_get::<Option<i64>, _>("token").map_err(&e)? else {
        return Ok(Locked {
            lease: None,
            row_token: 0,
            now,
        });
    };
    let lease = if row.try_get::<bool, _>("ended").map_err(&e)? {
        None
    } else {
        Some(lease_from_row(name, &row)?)
    };
    Ok(Locked {
        lease,
        row_token,
        now,
    })
}

pub(crate) async fn record(
    exec: impl PgExecutor<'_>,
    t: &Tables,
    event: &LeaseEvent,
) -> Result<(), LeaseError> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {events} (name, kind, at, owner, token, acquired_at, expires_at, detail) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        events = t.event_rows,
    )))
    .bind(event.name.as_str())
    .bind(event.kind.as_str())
    .bind(event.at)
    .bind(event.owner.as_ref().map(OwnerId::as_str))
    .bind(event.token.map(FencingToken::get))
    .bind(event.acquired_at)
    .bind(event.expires_at)
    .bind(event.detail.as_deref())
    .execute(exec)
    .await
    .map_err(lerr("lease event"))?;
    Ok(())
}

/// Marks the name's lease ended at `now`; the row and its token stay.
async fn end_lease(
    conn: &mut PgConnection,
    t: &Tables,
    name: &LeaseName,
    now: Millis,
) -> Result<(), LeaseError> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {leases} SET ended_at = $2, release_after = NULL WHERE name = $1",
        leases = t.leases
    )))
    .bind(name.as_str())
    .bind(now)
    .execute(&mut *conn)
    .await
    .map_err(lerr("lease end"))?;
    Ok(())
}

/// One page of [`LeaseStore::names`]: names with a token (a counter above 0, which is
/// never deleted, or a lease row, which holds the last grant), in byte order (`COLLATE
/// "C"`), after `after`.
async fn list_names(
    exec: impl PgExecutor<'_>,
    t: &Tables,
    after: Option<&LeaseName>,
    limit: usize,
) -> Result<Vec<LeaseName>, LeaseError> {
    // A counter at 0 is only the lock of a change to a name never granted: no name for
    // `show` either. Every name is non-empty, so '' is before all of them. Each side
    // keeps its first `limit` (a top-N sort), so the union holds at most two pages.
    let names: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT name FROM ( \
           (SELECT name FROM {tokens} WHERE last_token > 0 AND name COLLATE \"C\" > $1 \
            ORDER BY name COLLATE \"C\" LIMIT $2) \
           UNION \
           (SELECT name FROM {leases} WHERE name COLLATE \"C\" > $1 \
            ORDER BY name COLLATE \"C\" LIMIT $2) \
         ) n ORDER BY name COLLATE \"C\" LIMIT $2",
        tokens = t.tokens,
        leases = t.leases,
    )))
    .bind(after.map_or("", LeaseName::as_str))
    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
    .fetch_all(exec)
    .await
    .map_err(lerr("lease names"))?;
    idem_store_kit::row::lease_names(names)
}

impl PgStore {
    pub(crate) fn lease_tables(&self) -> Tables {
        Tables::of(self.schema.as_deref())
    }

    pub(crate) async fn begin_lease(
        &self,
    ) -> Result<sqlx::Transaction<'static, Postgres>, LeaseError> {
        self.pool.begin().await.map_err(lerr("lease begin"))
    }
}

/// This store's part of the lease changes made under the name's lock ([`LeaseSteps`]):
/// one READ COMMITTED transaction holding the name's counter row, then the lease row
/// `FOR UPDATE`.
struct Change<'s> {
    store: &'s PgStore,
    t: Tables,
}

impl<'s> Change<'s> {
    fn of(store: &'s PgStore) -> Self {
        Self {
            store,
            t: store.lease_tables(),
        }
    }
}

impl LeaseSteps for Change<'_> {
    type Tx = sqlx::Transaction<'static, Postgres>;

    async fn lock<'a>(
        &'a self,
        name: &'a LeaseName,
    ) -> Result<(Self::Tx, Option<Lease>, Millis), LeaseError> {
        let mut tx = self.store.begin_lease().await?;
        lock_name(&mut tx, &self.t, name).await?;
        let Locked { lease, now, .. } =
            locked_lease(&mut tx, &self.store.clock, &self.t, name).await?;
        Ok((tx, lease, now))
    }

    async fn record<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        event: &'a LeaseEvent,
    ) -> Result<(), LeaseError> {
        record(&mut **tx, &self.t, event).await
    }

    async fn end<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        name: &'a LeaseName,
        now: Millis,
    ) -> Result<(), LeaseError> {
        end_lease(tx, &self.t, name, now).await
    }

    async fn extend<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        lease: &'a Lease,
    ) -> Result<(), LeaseError> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {leases} SET expires_at = $2, renewals = $3 WHERE name = $1",
            leases = self.t.leases,
        )))
        .bind(lease.name.as_str())
        .bind(lease.expires_at)
        .bind(i32::try_from(lease.renewals).unwrap_or(i32::MAX))
        .execute(&mut **tx)
        .await
        .map_err(lerr("lease renew"))?;
        Ok(())
    }

    async fn end_held<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        released: &'a LeaseEvent,
    ) -> Result<(), LeaseError> {
        end_lease(tx, &self.t, &released.name, released.at).await?;
        record(&mut **tx, &self.t, released).await
    }

    fn mismatched(&self, name: &LeaseName, owner: &OwnerId, token: FencingToken, detail: &str) {
        tracing::warn!(
            lease = %name, %owner, %token, current = %detail,
            "owner-mismatch release: the caller no longer held the lease"
        );
    }

    async fn commit(tx: Self::Tx) -> Result<(), LeaseError> {
        tx.commit().await.map_err(lerr("lease commit"))
    }
}

/// The lease operations, one try each; the [`LeaseStore`] methods retry them on another
/// connection when a pooled one turns out dead (see `PgStore::once_more`).
impl PgStore {
    /// Runs `call`, again after an unavailable answer: the failed connection was closed
    /// on release (the pool tests returned connections), so the next try takes another;
    /// one try per pooled connection, plus one. A store that cannot be reached keeps
    /// failing and the error stands.
    async fn lease_retrying<T, F, Fut>(&self, mut call: F) -> Result<T, LeaseError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, LeaseError>>,
    {
        let mut tries = 0;
        loop {
            match call().await {
                Err(LeaseError::Unavailable(e)) if self.try_another(&e, &mut tries) => {}
                answer => return answer,
            }
        }
    }

    async fn try_acquire_once(
        &self,
        name: &LeaseName,
        owner: &OwnerId,
        ttl: Duration,
    ) -> Result<Acquire, LeaseError> {
        check_ttl(ttl)?;
        let t = self.lease_tables();
        let first = match fast_update(&self.pool, &self.clock, &t, name, owner, ttl).await? {
            FastGrant::Granted(lease) => Some(lease),
            FastGrant::NoRow => fast_insert(&self.pool, &self.clock, &t, name, owner, ttl).await?,
            FastGrant::Taken => None,
        };
        if let Some(lease) = first {
            tracing::debug!(lease = %name, %owner, token = %lease.token, "lease granted");
            return Ok(Acquire::Granted(lease));
        }
        // A live holder is answered from a plain read, without the lock: contenders
        // polling a held lease do not queue behind each other.
        let snap = snapshot(&self.pool, &self.clock, &t, name).await?;
        if let Some(held) = snap.held() {
            return Ok(held);
        }

        let mut tx = self.begin_lease().await?;
        let counter = lock_name(&mut tx, &t, name).await?;
        let Locked {
            lease: current,
            row_token,
            now,
        } = locked_lease(&mut tx, &self.clock, &t, name).await?;
        if let Some(holder) = current.as_ref().filter(|l| l.is_live(now)) {
            let holder = holder.clone();
            tx.rollback().await.map_err(lerr("lease rollback"))?;
            return Ok(Acquire::Held { holder, now });
        }
        // The row's token is the last grant; the counter keeps a deleted row's.
        let prior = counter.max(row_token);
        if let Some(expired) = &current {
            record(
                &mut *tx,
                &t,
                &LeaseEvent::of_lease(LeaseEventKind::Expired, now, expired),
            )
            .await?;
        }
        let token = FencingToken::new(prior + 1);
        let lease = Lease::granted(name, owner, token, now, now.saturating_add(millis(ttl)));
        // One statement: counter, lease row (replacing an expired one) and evidence. A
        // release recorded in place on the row being replaced moves into the acquired
        // row (the statement's snapshot has the row as it was; this transaction holds
        // its lock).
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "WITH counter AS ( \
               UPDATE {tokens} SET last_token = $2 WHERE name = $1 \
             ), lease AS ( \
               INSERT INTO {leases} (name, owner, token, acquired_at, expires_at, renewals) \
               VALUES ($1, $3, $2, $4, $5, 0) \
               ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, \
                 token = EXCLUDED.token, acquired_at = EXCLUDED.acquired_at, \
                 expires_at = EXCLUDED.expires_at, renewals = 0, ended_at = NULL, \
                 release_after = NULL \
             ) \
             INSERT INTO {events} (name, kind, at, owner, token, acquired_at, expires_at, \
               released_after, released_owner, released_token, released_acquired_at, \
               released_expires_at, released_at) \
             SELECT $1, $6, $4, $3, $2, $4, $5, l.release_after, l.owner, l.token, \
               l.acquired_at, l.expires_at, l.ended_at \
             FROM (SELECT 1) one LEFT JOIN {leases} l \
               ON l.name = $1 AND l.release_after IS NOT NULL",
            tokens = t.tokens,
            leases = t.leases,
            events = t.event_rows,
        )))
        .bind(name.as_str())
        .bind(lease.token.get())
        .bind(owner.as_str())
        .bind(lease.acquired_at)
        .bind(lease.expires_at)
        .bind(LeaseEventKind::Acquired.as_str())
        .execute(&mut *tx)
        .await
        .map_err(lerr("lease grant"))?;
        tx.commit().await.map_err(lerr("lease commit"))?;
        tracing::debug!(lease = %name, %owner, token = %lease.token, "lease granted");
        Ok(Acquire::Granted(lease))
    }

    async fn release_once(
        &self,
        name: &LeaseName,
        owner: &OwnerId,
        token: FencingToken,
    ) -> Result<Release, LeaseError> {
        let change = Change::of(self);
        if let Some(released) =
            fast_release(&self.pool, &self.clock, &change.t, name, owner, token).await?
        {
            return Ok(released);
        }
        change.release(name, owner, token).await
    }
}

/// Leases whose tokens rise from the last one granted, kept in the name's lease row
/// (which outlives the lease) or, for a deleted row, in a counter that is never deleted
/// or lowered (both enforced by triggers); each grant commits with its evidence; times
/// from the database clock. Tokens never go back as far as committed transactions
/// survive (use synchronous replication if a failover must not lose a grant).
#[async_trait]
impl LeaseStore for PgStore {
    async fn try_acquire(
        &self,
        name: &LeaseName,
        owner: &OwnerId,
        ttl: Duration,
    ) -> Result<Acquire, LeaseError> {
        self.lease_retrying(|| self.try_acquire_once(name, owner, ttl))
            .await
    }

    async fn renew(
        &self,
        name: &LeaseName,
        owner: &OwnerId,
        token: FencingToken,
        ttl: Duration,
    ) -> Result<Renew, LeaseError> {
        let change = Change::of(self);
        self.lease_retrying(|| change.renew(name, owner, token, ttl))
            .await
    }

    async fn release(
        &self,
        name: &LeaseName,
        owner: &OwnerId,
        token: FencingToken,
    ) -> Result<Release, LeaseError> {
        self.lease_retrying(|| self.release_once(name, owner, token))
            .await
    }

    async fn force_release(
        &self,
        name: &LeaseName,
        reason: &str,
    ) -> Result<Option<Lease>, LeaseError> {
        let removed = Change::of(self).force_release(name, reason).await?;
        tracing::warn!(lease = %name, reason, removed = ?removed, "lease force-released");
        Ok(removed)
    }

    async fn show(&self, name: &LeaseName) -> Result<LeaseStatus, LeaseError> {
        let t = self.lease_tables();
        let snap = self
            .lease_retrying(|| snapshot(&self.pool, &self.clock, &t, name))
            .await?;
        // The counter can be ahead of every grant (a first grant that lost its race
        // keeps its bump: a gap, never a repeat). The highest token granted is in the
        // evidence; the row's token (or the counter) stands in only when there is none
        // (events trimmed past the retention window, or removed by hand).
        let granted: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT max(token) FROM {events} WHERE name = $1 AND kind = $2",
            events = t.event_rows,
        )))
        .bind(name.as_str())
        .bind(LeaseEventKind::Acquired.as_str())
        .fetch_one(&self.pool)
        .await
        .map_err(lerr("lease show"))?;
        let last_token = match granted {
            Some(g) => Some(FencingToken::new(
                g.max(snap.lease.as_ref().map_or(0, |l| l.token.get())),
            )),
            None => snap.last_token,
        };
        Ok(LeaseStatus {
            last_token,
            ..snap.status(name)
        })
    }

    async fn events(&self, name: &LeaseName, limit: usize) -> Result<Vec<LeaseEvent>, LeaseError> {
        let t = self.lease_tables();
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT kind, at, owner, token, acquired_at, expires_at, detail FROM ( \
               SELECT * FROM {events} WHERE name = $1 ORDER BY id DESC LIMIT $2) e \
             ORDER BY id",
            events = t.events,
        )))
        .bind(name.as_str())
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(lerr("lease events"))?;
        let e = lerr("lease events");
        rows.iter()
            .map(|row| {
                LeaseEventRow {
                    kind: row.try_get("kind").map_err(&e)?,
                    at: row.try_get("at").map_err(&e)?,
                    owner: row.try_get("owner").map_err(&e)?,
                    token: row.try_get("token").map_err(&e)?,
                    acquired_at: row.try_get("acquired_at").map_err(&e)?,
                    expires_at: row.try_get("expires_at").map_err(&e)?,
                    detail: row.try_get("detail").map_err(&e)?,
                }
                .decode(name)
            })
            .collect()
    }

    /// A plain read, retried on another connection when a pooled one is dead. The name
    /// indexes are in the database's collation, not byte order, so each page scans both
    /// tables for the names after `after` and keeps the first `limit` (a top-N sort):
    /// O(number of names) per page, fine for an operator console, not for a hot path.
    async fn names(
        &self,
        after: Option<&LeaseName>,
        limit: usize,
    ) -> Result<Vec<LeaseName>, LeaseError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let t = self.lease_tables();
        self.lease_retrying(|| list_names(&self.pool, &t, after, limit))
            .await
    }

    /// One batch through the index on `at` (migration 7), counting every event once:
    /// releases carried by a newer grant's row, then stored rows (once nothing older is
    /// carried on them), then releases still recorded on a lease row (migration 9).
    async fn trim_events(&self, before: Millis, limit: usize) -> Result<u64, LeaseError> {
        let t = self.lease_tables();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut done = 0u64;
        let statements = [
            format!(
                "UPDATE {rows} SET released_after = NULL, released_owner = NULL, \
                   released_token = NULL, released_acquired_at = NULL, \
                   released_expires_at = NULL, released_at = NULL \
                 WHERE ctid = ANY (ARRAY( \
                   SELECT ctid FROM {rows} WHERE released_at < $1 LIMIT $2))",
                rows = t.event_rows,
            ),
            format!(
                "DELETE FROM {rows} WHERE ctid = ANY (ARRAY( \
                   SELECT ctid FROM {rows} WHERE at < $1 AND released_after IS NULL LIMIT $2))",
                rows = t.event_rows,
            ),
            format!(
                "UPDATE {leases} SET release_after = NULL \
                 WHERE release_after IS NOT NULL AND ended_at < $1 AND name = ANY (ARRAY( \
                   SELECT name FROM {leases} WHERE release_after IS NOT NULL AND ended_at < $1 \
                   LIMIT $2))",
                leases = t.leases,
            ),
        ];
        for sql in statements {
            let left = limit.saturating_sub(i64::try_from(done).unwrap_or(i64::MAX));
            if left <= 0 {
                break;
            }
            done += sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(before)
                .bind(left)
                .execute(&self.pool)
                .await
                .map_err(lerr("lease event trim"))?
                .rows_affected();
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_follow_the_schema() {
        let t = Tables::of(Some("idem_x"));
        assert_eq!(t.leases, "\"idem_x\".idem_leases");
        assert_eq!(t.tokens, "\"idem_x\".idem_lease_tokens");
        let t = Tables::of(None);
        assert_eq!(t.events, "idem_lease_events");
        assert_eq!(t.fences, "idem_fences");
    }

    #[test]
    fn migration_lists_every_event_kind() {
        for kind in LeaseEventKind::ALL {
            assert!(
                include_str!("../migrations/0002_idem_leases.sql")
                    .contains(&format!("'{}'", kind.as_str())),
                "{kind} missing from the CHECK"
            );
        }
    }
}
