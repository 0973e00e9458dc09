//! Leases with fencing tokens on SQLite, and the fenced write for resources in the file.
//!
//! Owns the `idem_leases`, `idem_lease_tokens`, `idem_lease_events` and `idem_fences`
//! tables and the triggers on them (migration 4). A grant bumps the per-name counter in
//! `idem_lease_tokens`, which nothing deletes, so tokens never go back (not even when a
//! lease row is deleted by hand). Expiry is judged by SQLite's clock plus the
//! [`ClockShift`](idem_core::ClockShift).
//!
//! # One statement per change
//!
//! SQLite has one write lock, so what matters is how long a change holds it. The two
//! changes every lease makes are single statements, with the evidence written by
//! triggers inside them:
//! - a grant is one upsert: a new row, or the expired row taken over with a new token
//!   (one above both the counter and the row's token); the triggers raise the counter
//!   and record `expired` (for a row taken over) and `acquired`. A live lease makes it
//!   write nothing (a contender polling a held lease still takes the write lock for
//!   that one statement), and a plain read reports the holder;
//! - the holder's release is one insert of its `released` event, made only if the
//!   caller holds the live lease; a trigger then deletes the lease row.
//!
//! Everything else (renew, a release by a non-holder, force-release) is one
//! `BEGIN IMMEDIATE` transaction that reads the lease and the store time once, writes,
//! and records its event, so the evidence commits with the change.
//!
//! It must not invent lease rules: `idem_core::lease` states them, and
//! `idem-conformance::lease` checks them.

use std::time::Duration;

use async_trait::async_trait;
use idem_core::lease::{check_ttl, fence_accepts};
use idem_core::{
    Acquire, ClockShift, FencingToken, Lease, LeaseError, LeaseEvent, LeaseName, LeaseStatus,
    LeaseStore, Millis, OwnerId, Release, Renew,
};
use idem_store_kit::row::{
    FenceRefusal, FenceSteps, LeaseEventRow, LeaseRow, LeaseSnapshot, LeaseSteps,
};
use sqlx::sqlite::{SqliteConnection, SqliteRow};
use sqlx::Row;

use crate::{map_err, now_on, now_sql, SqliteStore, SqliteTx, NOW};

pub use idem_store_kit::row::FencedWriteFuture;

/// The id of a new event of the name bound at `$name`: one above the name's highest
/// (the log is keyed by (name, id); the migration-4 triggers spell the same rule).
macro_rules! next_event_id {
    ($name:literal) => {
        concat!(
            "(SELECT COALESCE(MAX(id), 0) + 1 FROM idem_lease_events WHERE name = ",
            $name,
            ")"
        )
    };
}

fn lerr(e: sqlx::Error) -> LeaseError {
    map_err(e).into()
}

/// Reads the lease row, the token counter and the store time in one statement.
async fn snapshot(
    conn: &mut SqliteConnection,
    clock: &ClockShift,
    name: &LeaseName,
) -> Result<LeaseSnapshot, LeaseError> {
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {NOW} AS now_ms, l.name IS NOT NULL AS found, \
           l.owner, l.token, l.acquired_at, l.expires_at, l.renewals, \
           MAX(COALESCE(t.last_token, 0), COALESCE(l.token, 0)) AS last_token \
         FROM (SELECT 1) \
         LEFT JOIN idem_leases l ON l.name = ?2 \
         LEFT JOIN idem_lease_tokens t ON t.name = ?2"
    )))
    .bind(clock.millis())
    .bind(name.as_str())
    .fetch_one(conn)
    .await
    .map_err(lerr)?;
    let found: bool = row.try_get("found").map_err(lerr)?;
    LeaseSnapshot::decode(
        name,
        row.try_get("now_ms").map_err(lerr)?,
        found.then(|| lease_row(&row)).transpose()?,
        row.try_get("last_token").map_err(lerr)?,
    )
}

fn lease_row(row: &SqliteRow) -> Result<LeaseRow, LeaseError> {
    Ok(LeaseRow {
        owner: row.try_get("owner").map_err(lerr)?,
        token: row.try_get("token").map_err(lerr)?,
        acquired_at: row.try_get("acquired_at").map_err(lerr)?,
        expires_at: row.try_get("expires_at").map_err(lerr)?,
        renewals: row.try_get("renewals").map_err(lerr)?,
    })
}

async fn record(conn: &mut SqliteConnection, event: &LeaseEvent) -> Result<(), LeaseError> {
    sqlx::query(concat!(
        "INSERT INTO idem_lease_events \
           (name, id, kind, at, owner, token, acquired_at, expires_at, detail) \
         VALUES (?1, ",
        next_event_id!("?1"),
        ", ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
    ))
    .bind(event.name.as_str())
    .bind(event.kind.as_str())
    .bind(event.at)
    .bind(event.owner.as_ref().map(OwnerId::as_str))
    .bind(event.token.map(FencingToken::get))
    .bind(event.acquired_at)
    .bind(event.expires_at)
    .bind(event.detail.as_deref())
    .execute(conn)
    .await
    .map_err(lerr)?;
    Ok(())
}

async fn delete_lease(conn: &mut SqliteConnection, name: &LeaseName) -> Result<(), LeaseError> {
    sqlx::query("DELETE FROM idem_leases WHERE name = ?")
        .bind(name.as_str())
        .execute(conn)
        .await
        .map_err(lerr)?;
    Ok(())
}

/// One statement that grants `name` to `owner` unless a live lease holds it: a new row,
/// or the expired row taken over with a new token. The token is one above both the
/// counter and the row's token; the triggers raise the counter and record `expired`
/// (for a row taken over) and `acquired`. `None`: a live lease holds it, nothing written.
async fn grant(
    conn: &mut SqliteConnection,
    clock: &ClockShift,
    name: &LeaseName,
    owner: &OwnerId,
    ttl: Duration,
) -> Result<Option<Lease>, LeaseError> {
    let row = sqlx::query(concat!(
        "WITH n(now) AS (SELECT ",
        now_sql!("?1"),
        ") \
         INSERT INTO idem_leases (name, owner, token, acquired_at, expires_at, renewals) \
         SELECT ?2, ?3, \
           MAX(COALESCE((SELECT last_token FROM idem_lease_tokens WHERE name = ?2), 0), \
               COALESCE((SELECT token FROM idem_leases WHERE name = ?2), 0)) + 1, \
           n.now, n.now + ?4, 0 \
         FROM n WHERE true \
         ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, token = excluded.token, \
           acquired_at = excluded.acquired_at, expires_at = excluded.expires_at, renewals = 0 \
         WHERE idem_leases.expires_at <= excluded.acquired_at \
         RETURNING token, acquired_at, expires_at"
    ))
    .bind(clock.millis())
    .bind(name.as_str())
    .bind(owner.as_str())
    .bind(idem_core::retention::millis(ttl))
    .fetch_optional(conn)
    .await
    .map_err(lerr)?;
    row.map(|row| {
        let token = FencingToken::new(row.try_get("token").map_err(lerr)?);
        let acquired_at = row.try_get("acquired_at").map_err(lerr)?;
        let expires_at = row.try_get("expires_at").map_err(lerr)?;
        Ok(Lease::granted(name, owner, token, acquired_at, expires_at))
    })
    .transpose()
}

impl SqliteStore {
    async fn begin_lease(&self) -> Result<crate::SqliteTx, LeaseError> {
        Ok(self.begin().await?)
    }

    /// One statement that records `released` if `owner` holds the live lease with
    /// `token`; the trigger then deletes the lease. `None`: not the live holder, nothing
    /// written.
    async fn release_held(
        &self,
        name: &LeaseName,
        owner: &OwnerId,
        token: FencingToken,
    ) -> Result<Option<Release>, LeaseError> {
        let _writer = crate::lock(self.writer.as_deref()).await;
        let row = sqlx::query(concat!(
            "INSERT INTO idem_lease_events \
               (name, id, kind, at, owner, token, acquired_at, expires_at, renewals) \
             SELECT l.name, ",
            next_event_id!("?2"),
            ", 'released', n.now, l.owner, l.token, l.acquired_at, l.expires_at, l.renewals \
             FROM idem_leases l, (SELECT ",
            now_sql!("?1"),
            " AS now) n \
             WHERE l.name = ?2 AND l.owner = ?3 AND l.token = ?4 AND l.expires_at > n.now \
             RETURNING at, acquired_at, expires_at, renewals"
        ))
        .bind(self.clock.millis())
        .bind(name.as_str())
        .bind(owner.as_str())
        .bind(token.get())
        .fetch_optional(&self.pool)
        .await
        .map_err(lerr)?;
        let Some(row) = row else {
            return Ok(None);
        };
        let lease = LeaseRow {
            owner: owner.to_string(),
            token: token.get(),
            acquired_at: row.try_get("acquired_at").map_err(lerr)?,
            expires_at: row.try_get("expires_at").map_err(lerr)?,
            renewals: row.try_get("renewals").map_err(lerr)?,
        }
        .decode(name)?;
        Ok(Some(Release::Released {
            lease,
            released_at: row.try_get("at").map_err(lerr)?,
        }))
    }

    /// Runs `write` in a `BEGIN IMMEDIATE` transaction only if `lease.token` passes the
    /// fence of `resource` (see [`fence_accepts`]); the fence then remembers the token and
    /// commits with the write. An older token gets `LeaseError::Fenced` (converted into
    /// `E`), nothing of the write runs, and a `fenced_write_rejected` event is recorded
    /// under the lease's name. An error from `write` rolls everything back, the fence
    /// included.
    ///
    /// The closure owns what it writes (the future borrows only the connection) and
    /// writes through `tx` only: a method of this store that starts its own transaction
    /// would wait for this one.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idem_core::{LeaseError, LeaseName, LeaseStore, OwnerId};
    /// # #[tokio::main]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let store = idem_sqlite::SqliteStore::open_path(dir.path().join("idem.db")).await?;
    /// # sqlx::query("CREATE TABLE inventory (event INTEGER, held INTEGER)")
    /// #     .execute(store.pool()).await?;
    /// # sqlx::query("INSERT INTO inventory VALUES (42, 3)").execute(store.pool()).await?;
    /// let name = LeaseName::new("inventory:event-42")?;
    /// let owner = OwnerId::new("worker-1")?;
    /// let lease = store
    ///     .try_acquire(&name, &owner, Duration::from_secs(10))
    ///     .await?
    ///     .granted()
    ///     .expect("nobody else holds it");
    /// let event = 42_i64;
    /// store
    ///     .fenced_write("inventory:event-42", &lease, move |tx| {
    ///         Box::pin(async move {
    ///             sqlx::query("UPDATE inventory SET held = held - 1 WHERE event = ?")
    ///                 .bind(event)
    ///                 .execute(tx)
    ///                 .await
    ///                 .map_err(|e| LeaseError::Backend(e.to_string()))?;
    ///             Ok::<_, LeaseError>(())
    ///         })
    ///     })
    ///     .await?;
    /// # let held: i64 = sqlx::query_scalar("SELECT held FROM inventory").fetch_one(store.pool()).await?;
    /// # assert_eq!(held, 2);
    /// # Ok(()) }
    /// ```
    pub async fn fenced_write<T, E, F>(
        &self,
        resource: &str,
        lease: &Lease,
        write: F,
    ) -> Result<T, E>
    where
        E: From<LeaseError>,
        F: for<'c> FnOnce(&'c mut SqliteConnection) -> FencedWriteFuture<'c, T, E>,
    {
        idem_store_kit::row::fenced_write(&Fence(self), resource, lease, write).await
    }
}

/// This store's part of the lease changes made under the name's lock ([`LeaseSteps`]):
/// one `BEGIN IMMEDIATE` transaction that reads the lease and the store time once.
struct Change<'s>(&'s SqliteStore);

impl LeaseSteps for Change<'_> {
    type Tx = SqliteTx;

    async fn lock<'a>(
        &'a self,
        name: &'a LeaseName,
    ) -> Result<(SqliteTx, Option<Lease>, Millis), LeaseError> {
        let mut tx = self.0.begin_lease().await?;
        let snap = snapshot(&mut tx, &self.0.clock, name).await?;
        Ok((tx, snap.lease, snap.now))
    }

    async fn record<'a>(
        &'a self,
        tx: &'a mut SqliteTx,
        event: &'a LeaseEvent,
    ) -> Result<(), LeaseError> {
        record(tx, event).await
    }

    async fn end<'a>(
        &'a self,
        tx: &'a mut SqliteTx,
        name: &'a LeaseName,
        _: Millis,
    ) -> Result<(), LeaseError> {
        delete_lease(tx, name).await
    }

    async fn extend<'a>(
        &'a self,
        tx: &'a mut SqliteTx,
        lease: &'a Lease,
    ) -> Result<(), LeaseError> {
        sqlx::query("UPDATE idem_leases SET expires_at = ?, renewals = ? WHERE name = ?")
            .bind(lease.expires_at)
            .bind(i64::from(lease.renewals))
            .bind(lease.name.as_str())
            .execute(&mut **tx)
            .await
            .map_err(lerr)?;
        Ok(())
    }

    async fn end_held<'a>(
        &'a self,
        tx: &'a mut SqliteTx,
        released: &'a LeaseEvent,
    ) -> Result<(), LeaseError> {
        // The `released` event ends the lease (trigger idem_lease_released).
        record(tx, released).await
    }

    fn mismatched(&self, name: &LeaseName, owner: &OwnerId, token: FencingToken, detail: &str) {
        tracing::warn!(
            lease = %name, %owner, %token, current = %detail,
            "owner-mismatch release: the caller no longer held the lease"
        );
    }

    async fn commit(tx: SqliteTx) -> Result<(), LeaseError> {
        Ok(tx.commit().await?)
    }
}

/// This store's steps of [`idem_store_kit::row::fenced_write`].
struct Fence<'s>(&'s SqliteStore);

impl FenceSteps for Fence<'_> {
    type Tx = SqliteTx;
    type Conn = SqliteConnection;

    async fn begin(&self) -> Result<SqliteTx, LeaseError> {
        self.0.begin_lease().await
    }

    async fn take<'a>(
        &'a self,
        tx: &'a mut SqliteTx,
        resource: &'a str,
        lease: &'a Lease,
    ) -> Result<Option<(FencingToken, Millis)>, LeaseError> {
        let now = now_on(tx, &self.0.clock).await.map_err(LeaseError::from)?;
        let accepted: Option<i64> = sqlx::query_scalar(
            "INSERT INTO idem_fences (resource, last_token, lease_name, owner, updated_at) \
             VALUES (?, ?, ?, ?, ?) \
             ON CONFLICT (resource) DO UPDATE SET last_token = excluded.last_token, \
               lease_name = excluded.lease_name, owner = excluded.owner, \
               updated_at = excluded.updated_at \
             WHERE excluded.last_token >= idem_fences.last_token \
             RETURNING last_token",
        )
        .bind(resource)
        .bind(lease.token.get())
        .bind(lease.name.as_str())
        .bind(lease.owner.as_str())
        .bind(now)
        .fetch_optional(&mut **tx)
        .await
        .map_err(lerr)?;
        if accepted.is_some() {
            return Ok(None);
        }
        let last: i64 = sqlx::query_scalar("SELECT last_token FROM idem_fences WHERE resource = ?")
            .bind(resource)
            .fetch_one(&mut **tx)
            .await
            .map_err(lerr)?;
        let last = FencingToken::new(last);
        debug_assert!(!fence_accepts(Some(last), lease.token));
        Ok(Some((last, now)))
    }

    fn conn(tx: &mut SqliteTx) -> &mut SqliteConnection {
        tx
    }

    async fn commit(tx: SqliteTx) -> Result<(), LeaseError> {
        Ok(tx.commit().await?)
    }

    async fn rollback(tx: SqliteTx) -> Result<(), LeaseError> {
        Ok(tx.rollback().await?)
    }

    async fn refused<'a>(&'a self, refusal: &'a FenceRefusal) {
        let recorded = async {
            let mut evidence = self.0.begin_lease().await?;
            record(&mut evidence, &refusal.event).await?;
            evidence.commit().await.map_err(LeaseError::from)
        };
        let f = &refusal.fenced;
        if let Err(e) = recorded.await {
            tracing::error!(error = %e, lease = %f.name, resource = %f.resource, "fenced-write evidence not recorded");
        }
        tracing::warn!(
            lease = %f.name, owner = %f.owner, token = %f.token,
            resource = %f.resource, last_accepted = %f.last_accepted, "fenced write rejected"
        );
    }
}

#[async_trait]
impl LeaseStore for SqliteStore {
    async fn try_acquire(
        &self,
        name: &LeaseName,
        owner: &OwnerId,
        ttl: Duration,
    ) -> Result<Acquire, LeaseError> {
        check_ttl(ttl)?;
        // The common case is one statement. A live holder makes it write nothing (it
        // still takes the write lock for that statement) and a plain read reports the
        // holder.
        {
            let _writer = crate::lock(self.writer.as_deref()).await;
            let mut conn = self.pool.acquire().await.map_err(lerr)?;
            if let Some(lease) = grant(&mut conn, &self.clock, name, owner, ttl).await? {
                return Ok(Acquire::Granted(lease));
            }
        }
        let mut conn = self.pool.acquire().await.map_err(lerr)?;
        let snap = snapshot(&mut conn, &self.clock, name).await?;
        drop(conn);
        if let Some(held) = snap.held() {
            return Ok(held);
        }
        // The holder went between the two: decide under the write lock, where the
        // answer cannot change.
        let mut tx = self.begin_lease().await?;
        if let Some(lease) = grant(&mut tx, &self.clock, name, owner, ttl).await? {
            tx.commit().await?;
            return Ok(Acquire::Granted(lease));
        }
        let snap = snapshot(&mut tx, &self.clock, name).await?;
        snap.held()
            .ok_or_else(|| LeaseError::Backend(format!("lease {name}: no grant and no holder")))
    }

    async fn renew(
        &self,
        name: &LeaseName,
        owner: &OwnerId,
        token: FencingToken,
        ttl: Duration,
    ) -> Result<Renew, LeaseError> {
        Change(self).renew(name, owner, token, ttl).await
    }

    async fn release(
        &self,
        name: &LeaseName,
        owner: &OwnerId,
        token: FencingToken,
    ) -> Result<Release, LeaseError> {
        if let Some(released) = self.release_held(name, owner, token).await? {
            return Ok(released);
        }
        // Not the live holder (or a race the statement lost): decide again in a
        // transaction that records the mismatch, or the expiry it notices.
        Change(self).release(name, owner, token).await
    }

    async fn force_release(
        &self,
        name: &LeaseName,
        reason: &str,
    ) -> Result<Option<Lease>, LeaseError> {
        let removed = Change(self).force_release(name, reason).await?;
        tracing::warn!(lease = %name, reason, removed = ?removed, "lease force-released");
        Ok(removed)
    }

    async fn show(&self, name: &LeaseName) -> Result<LeaseStatus, LeaseError> {
        let mut conn = self.pool.acquire().await.map_err(lerr)?;
        Ok(snapshot(&mut conn, &self.clock, name).await?.status(name))
    }

    async fn events(&self, name: &LeaseName, limit: usize) -> Result<Vec<LeaseEvent>, LeaseError> {
        let rows = sqlx::query(
            "SELECT kind, at, owner, token, acquired_at, expires_at, detail FROM ( \
               SELECT * FROM idem_lease_events WHERE name = ? ORDER BY id DESC LIMIT ?) \
             ORDER BY id",
        )
        .bind(name.as_str())
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(lerr)?;
        rows.iter()
            .map(|row| {
                LeaseEventRow {
                    kind: row.try_get("kind").map_err(lerr)?,
                    at: row.try_get("at").map_err(lerr)?,
                    owner: row.try_get("owner").map_err(lerr)?,
                    token: row.try_get("token").map_err(lerr)?,
                    acquired_at: row.try_get("acquired_at").map_err(lerr)?,
                    expires_at: row.try_get("expires_at").map_err(lerr)?,
                    detail: row.try_get("detail").map_err(lerr)?,
                }
                .decode(name)
            })
            .collect()
    }

    /// A plain read (no write lock) of the token counters, which every grant writes and
    /// nothing deletes, joined with the lease rows (a row inserted by hand without its
    /// counter is still a name `show` reports). Both are keyed by name (`BINARY`
    /// collation: byte order), so a page is a walk of the two keys from `after`.
    async fn names(
        &self,
        after: Option<&LeaseName>,
        limit: usize,
    ) -> Result<Vec<LeaseName>, LeaseError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // Every name is non-empty, so '' is before all of them.
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM idem_lease_tokens WHERE name > ?1 \
             UNION SELECT name FROM idem_leases WHERE name > ?1 \
             ORDER BY name LIMIT ?2",
        )
        .bind(after.map_or("", LeaseName::as_str))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(lerr)?;
        idem_store_kit::row::lease_names(names)
    }

    /// One batch, found by a plain read that scans the log (keyed by name, not time; an
    /// index on the time would cost every lease change a write) and never holds the
    /// write lock, then deleted by key under it.
    async fn trim_events(&self, before: Millis, limit: usize) -> Result<u64, LeaseError> {
        let old: Vec<(String, i64)> =
            sqlx::query_as("SELECT name, id FROM idem_lease_events WHERE at < ?1 LIMIT ?2")
                .bind(before)
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(&self.pool)
                .await
                .map_err(lerr)?;
        if old.is_empty() {
            return Ok(0);
        }
        let keys = serde_json::to_string(&old)
            .map_err(|e| LeaseError::Backend(format!("event keys: {e}")))?;
        let _writer = crate::lock(self.writer.as_deref()).await;
        let done = sqlx::query(
            "DELETE FROM idem_lease_events WHERE (name, id) IN ( \
               SELECT value ->> 0, value ->> 1 FROM json_each(?1))",
        )
        .bind(keys)
        .execute(&self.pool)
        .await
        .map_err(lerr)?;
        Ok(done.rows_affected())
    }
}
