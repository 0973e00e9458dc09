//! Leases with fencing tokens on MySQL / MariaDB, and the fenced write for resources in
//! the same database.
//!
//! # Tables (migration 2)
//! - `idem_lease_tokens(name, last_token)`: the highest token granted per name, and the
//!   name's lock: every lease change first takes this row's exclusive lock (an `INSERT …
//!   ON DUPLICATE KEY UPDATE` on the primary key: a record lock, never a gap lock) and
//!   holds it until its transaction ends. Triggers refuse lowering or deleting a counter
//!   (`TRUNCATE` fires no trigger on either server: revoke `DROP` from the application's
//!   user where that matters).
//! - `idem_leases(name, owner, token, acquired_at, expires_at, renewals)`: the current
//!   or last lease per name. The holder's release ends the row in place (migration 8):
//!   owner `''`, the deadline moved to the release time, the token kept, so the next
//!   grant updates the row (token + 1) instead of inserting one. A lease noticed expired
//!   or force-released is deleted; a trigger keeps a deleted row's token in the counter.
//!   A live row is one with an owner (`''` is never an `OwnerId`).
//! - `idem_lease_events`: the evidence, ordered by an `AUTO_INCREMENT` id.
//! - `idem_fences(resource, last_token, lease_name, owner, updated_at)`: the last token
//!   each protected resource accepted.
//!
//! # Atomicity
//! The uncontended cycle is one statement each way, in place on the lease row
//! (`lease_cycle.rs`): a grant over an ended row, and the holder's release; triggers on
//! `idem_leases` write their evidence (`acquired`, `released`) inside the statement. An
//! acquire that finds a live holder answers from one plain read and writes nothing, so
//! contenders polling a held lease do not queue on the lock. Every other change is one
//! READ COMMITTED transaction: the name's counter row locked, then the lease row locked
//! (`FOR UPDATE`, so the one-statement changes wait for it) and the server clock read
//! after those locks (so no change this one waited for is later than its time), then the
//! writes and their evidence, committed together. A change InnoDB refuses over a lock
//! (deadlock victim, lock wait timeout) wrote nothing and runs again.
//!
//! Tokens: the row's token + 1 in place (the row holds the name's last token), the
//! counter's (which keeps a deleted row's token) or the row's, whichever is higher, + 1
//! on the locked path.
//!
//! Upgrade every process using a database together: an idem older than migration 8
//! reads an ended row (no owner) as a lease it cannot decode, and refuses the change.
//!
//! It must not invent lease rules: `idem_core::lease` states them, `idem_store_kit::row`
//! orders the locked changes, and `idem-conformance::lease` checks them.

use std::time::Duration;

use async_trait::async_trait;
use idem_core::lease::check_ttl;
use idem_core::retention::millis;
use idem_core::{
    Acquire, ClockShift, FencingToken, Lease, LeaseError, LeaseEvent, LeaseName, LeaseStatus,
    LeaseStore, Millis, OwnerId, Release, Renew,
};
use idem_store_kit::row::{
    FenceRefusal, FenceSteps, LeaseEventRow, LeaseRow, LeaseSnapshot, LeaseSteps,
};
use sqlx::mysql::MySqlRow;
use sqlx::{MySql, MySqlConnection, MySqlExecutor, Row};

use crate::error::map_err;
use crate::lease_cycle::{self, CLOCK_AFTER_LOCKS};
use crate::sql::CLOCK;
use crate::MysqlStore;

pub use idem_store_kit::row::FencedWriteFuture;

/// The lease of a procedure's answer row (`owner`, `token`, `acquired_at`, `expires_at`,
/// `renewals`) and its `now_ms`.
fn answered_lease(
    name: &LeaseName,
    row: &MySqlRow,
    what: &'static str,
) -> Result<(Lease, Millis), LeaseError> {
    let e = lerr(what);
    let lease = LeaseRow {
        owner: row.try_get("owner").map_err(&e)?,
        token: row.try_get("token").map_err(&e)?,
        acquired_at: row.try_get("acquired_at").map_err(&e)?,
        expires_at: row.try_get("expires_at").map_err(&e)?,
        renewals: row.try_get("renewals").map_err(&e)?,
    }
    .decode(name)?;
    Ok((lease, row.try_get("now_ms").map_err(&e)?))
}

fn lerr(what: &'static str) -> impl Fn(sqlx::Error) -> LeaseError {
    move |e| map_err(what, e).into()
}

fn lease_row(row: &MySqlRow) -> Result<LeaseRow, LeaseError> {
    let e = lerr("lease decode");
    Ok(LeaseRow {
        owner: row.try_get("owner").map_err(&e)?,
        token: row.try_get("token").map_err(&e)?,
        acquired_at: row.try_get("acquired_at").map_err(&e)?,
        expires_at: row.try_get("expires_at").map_err(&e)?,
        renewals: row.try_get::<i32, _>("renewals").map_err(&e)?.into(),
    })
}

/// The lease (unless ended), the name's last token and the store time, from one
/// statement. Plain (`show`), or under the name's lock (`locked`: the counter row is
/// there, and the lease row is locked too, so the in-place changes wait for this
/// transaction); the clock is read after the locks.
async fn snapshot(
    exec: impl MySqlExecutor<'_>,
    clock: &ClockShift,
    name: &LeaseName,
    locked: bool,
) -> Result<LeaseSnapshot, LeaseError> {
    let from = if locked {
        "FROM idem_lease_tokens t LEFT JOIN idem_leases l ON l.name = t.name \
         WHERE t.name = ? FOR UPDATE"
    } else {
        "FROM (SELECT 1 AS one) o LEFT JOIN idem_leases l ON l.name = ? \
         LEFT JOIN idem_lease_tokens t ON t.name = ?"
    };
    let mut query = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {CLOCK_AFTER_LOCKS} AS now_ms, l.name IS NOT NULL AND l.owner <> '' AS found, \
           l.owner, l.token, l.acquired_at, l.expires_at, l.renewals, \
           GREATEST(COALESCE(t.last_token, 0), COALESCE(l.token, 0)) AS last_token {from}"
    )))
    .bind(clock.millis())
    .bind(name.as_str());
    if !locked {
        query = query.bind(name.as_str());
    }
    let row = query.fetch_one(exec).await.map_err(lerr("lease read"))?;
    let e = lerr("lease read");
    let found: i64 = row.try_get("found").map_err(&e)?;
    LeaseSnapshot::decode(
        name,
        row.try_get("now_ms").map_err(&e)?,
        (found != 0).then(|| lease_row(&row)).transpose()?,
        row.try_get("last_token").map_err(&e)?,
    )
}

/// Begins the change's transaction and takes the name's lock (its counter row, created
/// at 0 when missing); then reads the lease, the counter and the clock after the lock.
async fn lock(
    store: &MysqlStore,
    name: &LeaseName,
) -> Result<(sqlx::Transaction<'static, MySql>, LeaseSnapshot), LeaseError> {
    let mut tx = store.pool.begin().await.map_err(lerr("lease begin"))?;
    sqlx::query(
        "INSERT INTO idem_lease_tokens (name, last_token) VALUES (?, 0) \
         ON DUPLICATE KEY UPDATE last_token = last_token",
    )
    .bind(name.as_str())
    .execute(&mut *tx)
    .await
    .map_err(lerr("lease lock"))?;
    let snap = snapshot(&mut *tx, &store.clock, name, true).await?;
    Ok((tx, snap))
}

async fn record(exec: impl MySqlExecutor<'_>, event: &LeaseEvent) -> Result<(), LeaseError> {
    sqlx::query(
        "INSERT INTO idem_lease_events (name, kind, at, owner, token, acquired_at, \
           expires_at, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    )
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

/// Ends the name's lease noticed expired or force-released: the row goes, its token stays
/// in the counter (the trigger writes it there).
async fn end_lease(conn: &mut MySqlConnection, name: &LeaseName) -> Result<(), LeaseError> {
    sqlx::query("DELETE FROM idem_leases WHERE name = ?")
        .bind(name.as_str())
        .execute(&mut *conn)
        .await
        .map_err(lerr("lease end"))?;
    Ok(())
}

/// Whether a lease call failed in a way that running it again can fix: the server was
/// unreachable, or InnoDB refused it over a lock (all of it rolled back).
fn worth_another_run(err: &LeaseError) -> bool {
    match err {
        LeaseError::Unavailable(_) => true,
        LeaseError::Backend(m) => {
            m.contains(&format!(" [{}]: ", crate::error::LOCK_DEADLOCK))
                || m.contains(&format!(" [{}]: ", crate::error::LOCK_WAIT_TIMEOUT))
        }
        _ => false,
    }
}

impl MysqlStore {
    /// Runs `call` again after an unavailable answer (one try per pooled connection,
    /// plus one) or a lock conflict (up to `LOCK_CONFLICT_RETRIES`).
    async fn lease_retrying<T, F, Fut>(&self, mut call: F) -> Result<T, LeaseError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, LeaseError>>,
    {
        let mut tries = 0;
        let mut conflicts = 0;
        loop {
            match call().await {
                Err(LeaseError::Unavailable(e)) if self.try_another(&e, &mut tries) => {}
                Err(e) if worth_another_run(&e) && conflicts < crate::LOCK_CONFLICT_RETRIES => {
                    conflicts += 1;
                    self.lock_conflicts
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(2 << conflicts)).await;
                }
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
        let row = sqlx::query("CALL idem_lease_acquire(?, ?, ?, ?)")
            .bind(name.as_str())
            .bind(owner.as_str())
            .bind(millis(ttl))
            .bind(self.clock.millis())
            .fetch_one(&self.pool)
            .await
            .map_err(lerr("lease acquire"))?;
        let outcome: String = row.try_get("outcome").map_err(lerr("lease acquire"))?;
        let (lease, now) = answered_lease(name, &row, "lease acquire")?;
        match outcome.as_str() {
            "granted" => {
                tracing::debug!(lease = %name, %owner, token = %lease.token, "lease granted");
                Ok(Acquire::Granted(lease))
            }
            "held" => Ok(Acquire::Held { holder: lease, now }),
            other => Err(LeaseError::Backend(format!(
                "idem_lease_acquire answered {other:?}"
            ))),
        }
    }

    /// The holder's release in one call; `None` when the procedure left the case to the
    /// general release (it wrote nothing then).
    async fn release_held_once(
        &self,
        name: &LeaseName,
        owner: &OwnerId,
        token: FencingToken,
    ) -> Result<Option<Release>, LeaseError> {
        let row = sqlx::query("CALL idem_lease_release(?, ?, ?, ?)")
            .bind(name.as_str())
            .bind(owner.as_str())
            .bind(token.get())
            .bind(self.clock.millis())
            .fetch_one(&self.pool)
            .await
            .map_err(lerr("lease release"))?;
        let outcome: String = row.try_get("outcome").map_err(lerr("lease release"))?;
        if outcome != "released" {
            return Ok(None);
        }
        let (lease, released_at) = answered_lease(name, &row, "lease release")?;
        Ok(Some(Release::Released { lease, released_at }))
    }

    /// The release by the quickest path that settles it: the one statement when this
    /// store granted the lease as it is, the procedure, then the general change (which
    /// records a mismatch).
    async fn release_any(
        &self,
        name: &LeaseName,
        owner: &OwnerId,
        token: FencingToken,
    ) -> Result<Release, LeaseError> {
        if let Some(lease) = self.held.holding(name, owner, token) {
            let released = self
                .lease_retrying(|| lease_cycle::release(&self.pool, &self.clock, &lease))
                .await?;
            if let Some(released_at) = released {
                return Ok(Release::Released { lease, released_at });
            }
        }
        if let Some(released) = self
            .lease_retrying(|| self.release_held_once(name, owner, token))
            .await?
        {
            return Ok(released);
        }
        let change = Change(self);
        self.lease_retrying(|| change.release(name, owner, token))
            .await
    }

    /// Takes the fence of `resource` on `conn`: accepted (and remembered) when
    /// `lease.token` is at least the last accepted; otherwise `Some((last accepted,
    /// now))` and nothing changed. Either way the fence row stays locked until `conn`'s
    /// transaction ends, so writes under one resource are serialized in token order.
    async fn take_fence(
        &self,
        conn: &mut MySqlConnection,
        resource: &str,
        lease: &Lease,
    ) -> Result<Option<(FencingToken, Millis)>, LeaseError> {
        idem_store_kit::row::check_resource(resource)?;
        // `last_token` is assigned last: the other assignments compare against the old
        // value (MySQL assigns left to right; MariaDB too unless SIMULTANEOUS_ASSIGNMENT,
        // which would compare against the old value anyway).
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO idem_fences (resource, last_token, lease_name, owner, updated_at) \
             VALUES (?, ?, ?, ?, {CLOCK}) \
             ON DUPLICATE KEY UPDATE \
               lease_name = IF(VALUES(last_token) >= last_token, VALUES(lease_name), lease_name), \
               owner = IF(VALUES(last_token) >= last_token, VALUES(owner), owner), \
               updated_at = IF(VALUES(last_token) >= last_token, VALUES(updated_at), updated_at), \
               last_token = GREATEST(last_token, VALUES(last_token))"
        )))
        .bind(resource)
        .bind(lease.token.get())
        .bind(lease.name.as_str())
        .bind(lease.owner.as_str())
        .bind(self.clock.millis())
        .execute(&mut *conn)
        .await
        .map_err(lerr("fence"))?;
        // Under the row lock: the value now stored, and the time of a refusal.
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT last_token, {CLOCK} AS now_ms FROM idem_fences WHERE resource = ?"
        )))
        .bind(self.clock.millis())
        .bind(resource)
        .fetch_one(&mut *conn)
        .await
        .map_err(lerr("fence"))?;
        let last: i64 = row.try_get(0).map_err(lerr("fence"))?;
        let now: Millis = row.try_get(1).map_err(lerr("fence"))?;
        if last == lease.token.get() {
            return Ok(None);
        }
        Ok(Some((FencingToken::new(last), now)))
    }

    /// Runs `write` in a transaction only if `lease.token` passes the fence of
    /// `resource` ([`idem_core::fence_accepts`]); the fence then remembers the token and
    /// commits with the write. An older token gets `LeaseError::Fenced` (converted into
    /// `E`), nothing of the write runs, and a `fenced_write_rejected` event is recorded.
    pub async fn fenced_write<T, E, F>(
        &self,
        resource: &str,
        lease: &Lease,
        write: F,
    ) -> Result<T, E>
    where
        E: From<LeaseError>,
        F: for<'c> FnOnce(&'c mut MySqlConnection) -> FencedWriteFuture<'c, T, E>,
    {
        idem_store_kit::row::fenced_write(&Fence(self), resource, lease, write).await
    }

    /// The fence inside the caller's transaction: `Ok` means the token passed and the
    /// fence remembers it when the caller commits. `LeaseError::Fenced` means an older
    /// token: nothing written by the fence, the refusal recorded in its own commit; the
    /// caller must roll back.
    pub async fn fence_in_tx(
        &self,
        conn: &mut MySqlConnection,
        resource: &str,
        lease: &Lease,
    ) -> Result<(), LeaseError> {
        match self.take_fence(conn, resource, lease).await? {
            None => Ok(()),
            Some((last, now)) => {
                let refusal = FenceRefusal::new(resource, lease, last, now);
                Fence(self).refused(&refusal).await;
                Err(refusal.fenced.into())
            }
        }
    }
}

/// This store's steps of [`idem_store_kit::row::fenced_write`].
struct Fence<'s>(&'s MysqlStore);

impl FenceSteps for Fence<'_> {
    type Tx = sqlx::Transaction<'static, MySql>;
    type Conn = MySqlConnection;

    async fn begin(&self) -> Result<Self::Tx, LeaseError> {
        self.0
            .pool
            .begin()
            .await
            .map_err(lerr("fenced write begin"))
    }

    async fn take<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        resource: &'a str,
        lease: &'a Lease,
    ) -> Result<Option<(FencingToken, Millis)>, LeaseError> {
        self.0.take_fence(tx, resource, lease).await
    }

    fn conn(tx: &mut Self::Tx) -> &mut MySqlConnection {
        tx
    }

    async fn commit(tx: Self::Tx) -> Result<(), LeaseError> {
        tx.commit().await.map_err(lerr("fenced write commit"))
    }

    async fn rollback(tx: Self::Tx) -> Result<(), LeaseError> {
        tx.rollback().await.map_err(lerr("fenced write rollback"))
    }

    async fn refused<'a>(&'a self, refusal: &'a FenceRefusal) {
        let f = &refusal.fenced;
        if let Err(e) = record(&self.0.pool, &refusal.event).await {
            tracing::error!(error = %e, lease = %f.name, resource = %f.resource, "fenced-write evidence not recorded");
        }
        tracing::warn!(
            lease = %f.name, owner = %f.owner, token = %f.token,
            resource = %f.resource, last_accepted = %f.last_accepted, "fenced write rejected"
        );
    }
}

/// This store's part of the changes made under the name's lock ([`LeaseSteps`]).
struct Change<'s>(&'s MysqlStore);

impl LeaseSteps for Change<'_> {
    type Tx = sqlx::Transaction<'static, MySql>;

    async fn lock<'a>(
        &'a self,
        name: &'a LeaseName,
    ) -> Result<(Self::Tx, Option<Lease>, Millis), LeaseError> {
        let (tx, snap) = lock(self.0, name).await?;
        Ok((tx, snap.lease, snap.now))
    }

    async fn record<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        event: &'a LeaseEvent,
    ) -> Result<(), LeaseError> {
        record(&mut **tx, event).await
    }

    async fn end<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        name: &'a LeaseName,
        _now: Millis,
    ) -> Result<(), LeaseError> {
        end_lease(tx, name).await
    }

    async fn extend<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        lease: &'a Lease,
    ) -> Result<(), LeaseError> {
        sqlx::query("UPDATE idem_leases SET expires_at = ?, renewals = ? WHERE name = ?")
            .bind(lease.expires_at)
            .bind(i32::try_from(lease.renewals).unwrap_or(i32::MAX))
            .bind(lease.name.as_str())
            .execute(&mut **tx)
            .await
            .map_err(lerr("lease renew"))?;
        Ok(())
    }

    /// In place, as the one-statement release does; the trigger records `released` from
    /// the row (the same event: the lease as it was, at the release time).
    async fn end_held<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        released: &'a LeaseEvent,
    ) -> Result<(), LeaseError> {
        sqlx::query("UPDATE idem_leases SET owner = '', expires_at = ? WHERE name = ?")
            .bind(released.at)
            .bind(released.name.as_str())
            .execute(&mut **tx)
            .await
            .map_err(lerr("lease release"))?;
        Ok(())
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

/// Leases whose tokens rise from a per-name counter that is never deleted or lowered
/// (enforced by triggers); each grant commits with its evidence; times from the server
/// clock. Tokens never go back as far as committed transactions survive: with
/// asynchronous replication a failover can lose the last grants (use semi-synchronous
/// replication or Galera where that matters).
#[async_trait]
impl LeaseStore for MysqlStore {
    async fn try_acquire(
        &self,
        name: &LeaseName,
        owner: &OwnerId,
        ttl: Duration,
    ) -> Result<Acquire, LeaseError> {
        check_ttl(ttl)?;
        if let Some(last) = self.held.last_ended(name) {
            let granted = self
                .lease_retrying(|| {
                    lease_cycle::grant(&self.pool, &self.clock, name, owner, ttl, last)
                })
                .await?;
            if let Some(lease) = granted {
                tracing::debug!(lease = %name, %owner, token = %lease.token, "lease granted in place");
                self.held.live(&lease);
                return Ok(Acquire::Granted(lease));
            }
        }
        let answer = self
            .lease_retrying(|| self.try_acquire_once(name, owner, ttl))
            .await?;
        if let Acquire::Granted(lease) = &answer {
            self.held.live(lease);
        }
        Ok(answer)
    }

    async fn renew(
        &self,
        name: &LeaseName,
        owner: &OwnerId,
        token: FencingToken,
        ttl: Duration,
    ) -> Result<Renew, LeaseError> {
        let change = Change(self);
        let answer = self
            .lease_retrying(|| change.renew(name, owner, token, ttl))
            .await?;
        match &answer {
            Renew::Renewed(lease) => self.held.live(lease),
            Renew::NotHolder { .. } => self.held.forget(name),
        }
        Ok(answer)
    }

    async fn release(
        &self,
        name: &LeaseName,
        owner: &OwnerId,
        token: FencingToken,
    ) -> Result<Release, LeaseError> {
        let answer = self.release_any(name, owner, token).await?;
        match &answer {
            Release::Released { .. } => self.held.ended(name, token),
            Release::NotHolder { .. } => self.held.forget(name),
        }
        Ok(answer)
    }

    async fn force_release(
        &self,
        name: &LeaseName,
        reason: &str,
    ) -> Result<Option<Lease>, LeaseError> {
        self.held.forget(name);
        let change = Change(self);
        let removed = self
            .lease_retrying(|| change.force_release(name, reason))
            .await?;
        tracing::warn!(lease = %name, reason, removed = ?removed, "lease force-released");
        Ok(removed)
    }

    async fn show(&self, name: &LeaseName) -> Result<LeaseStatus, LeaseError> {
        let snap = self
            .lease_retrying(|| snapshot(&self.pool, &self.clock, name, false))
            .await?;
        Ok(snap.status(name))
    }

    async fn events(&self, name: &LeaseName, limit: usize) -> Result<Vec<LeaseEvent>, LeaseError> {
        let rows = sqlx::query(
            "SELECT kind, at, owner, token, acquired_at, expires_at, detail FROM ( \
               SELECT * FROM idem_lease_events WHERE name = ? ORDER BY id DESC LIMIT ?) e \
             ORDER BY id",
        )
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

    /// Names with a token (every grant raised the counter, which is never deleted), in
    /// byte order (`ascii_bin`), through the counter's primary key.
    async fn names(
        &self,
        after: Option<&LeaseName>,
        limit: usize,
    ) -> Result<Vec<LeaseName>, LeaseError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let names: Vec<String> = self
            .lease_retrying(|| async {
                sqlx::query_scalar(
                    "SELECT name FROM idem_lease_tokens WHERE last_token > 0 AND name > ? \
                     ORDER BY name LIMIT ?",
                )
                .bind(after.map_or("", LeaseName::as_str))
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(&self.pool)
                .await
                .map_err(lerr("lease names"))
            })
            .await?;
        idem_store_kit::row::lease_names(names)
    }

    /// One batch through the index on `at`.
    async fn trim_events(&self, before: Millis, limit: usize) -> Result<u64, LeaseError> {
        Ok(
            sqlx::query("DELETE FROM idem_lease_events WHERE at < ? ORDER BY at LIMIT ?")
                .bind(before)
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .execute(&self.pool)
                .await
                .map_err(lerr("lease event trim"))?
                .rows_affected(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migration_lists_every_event_kind() {
        let sql = crate::migrate::migration(2).sql;
        for kind in idem_core::LeaseEventKind::ALL {
            assert!(
                sql.contains(&format!("'{}'", kind.as_str())),
                "{kind} missing from the CHECK"
            );
        }
    }

    #[test]
    fn in_place_drops_each_trigger_and_procedure_before_creating_it() {
        assert_eq!(crate::migrate::creates_after_drops(&[7, 8]).len(), 7);
    }

    #[test]
    fn lock_conflicts_run_again_and_refusals_do_not() {
        assert!(worth_another_run(&LeaseError::Backend(
            "backend error: mysql lease lock [1213]: Deadlock".into()
        )));
        assert!(!worth_another_run(&LeaseError::Backend(
            "backend error: mysql lease lock [1146]: no table".into()
        )));
        assert!(!worth_another_run(&LeaseError::InvalidInput("x".into())));
    }
}
