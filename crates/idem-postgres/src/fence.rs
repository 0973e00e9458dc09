//! Fenced writes: a write under a lease lands only if the lease's token is the newest the
//! resource has seen, inside the caller's transaction or one of its own.
//!
//! Owns the fence rows' statements and this store's [`FenceSteps`]; the order of the
//! steps is `idem_store_kit::row::fenced_write`'s. It must not grant or end leases.

use idem_core::lease::fence_accepts;
use idem_core::{FencingToken, Lease, LeaseError, Millis};
use idem_store_kit::row::{FenceRefusal, FenceSteps, FencedWriteFuture};
use sqlx::{PgConnection, Postgres, Row};

use crate::lease::{lerr, record, Tables, CLOCK};
use crate::PgStore;

impl PgStore {
    /// Takes the fence of `resource` on `conn`: accepted (and remembered) when
    /// `lease.token` passes [`fence_accepts`]; otherwise `Some((last accepted, now))`
    /// and nothing written. Either way the fence row stays locked until `conn`'s
    /// transaction ends, so writes under one resource are serialized in token order.
    async fn take_fence(
        &self,
        conn: &mut PgConnection,
        t: &Tables,
        resource: &str,
        lease: &Lease,
    ) -> Result<Option<(FencingToken, Millis)>, LeaseError> {
        idem_store_kit::row::check_resource(resource)?;
        // DO UPDATE … WHERE locks the conflicting row even when the WHERE is false.
        let accepted: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {fences} AS f (resource, last_token, lease_name, owner, updated_at) \
             VALUES ($1, $2, $3, $4, {CLOCK} + $5) \
             ON CONFLICT (resource) DO UPDATE SET last_token = EXCLUDED.last_token, \
               lease_name = EXCLUDED.lease_name, owner = EXCLUDED.owner, \
               updated_at = EXCLUDED.updated_at \
             WHERE EXCLUDED.last_token >= f.last_token \
             RETURNING f.last_token",
            fences = t.fences,
        )))
        .bind(resource)
        .bind(lease.token.get())
        .bind(lease.name.as_str())
        .bind(lease.owner.as_str())
        .bind(self.clock.millis())
        .fetch_optional(&mut *conn)
        .await
        .map_err(lerr("fence"))?;
        if accepted.is_some() {
            return Ok(None);
        }
        // Under the row lock: the value that refused us, and the time of the refusal.
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT last_token, {CLOCK} + $2 AS now_ms FROM {fences} WHERE resource = $1",
            fences = t.fences,
        )))
        .bind(resource)
        .bind(self.clock.millis())
        .fetch_one(&mut *conn)
        .await
        .map_err(lerr("fence"))?;
        let last = FencingToken::new(row.try_get(0).map_err(lerr("fence"))?);
        let now: Millis = row.try_get(1).map_err(lerr("fence"))?;
        debug_assert!(!fence_accepts(Some(last), lease.token));
        Ok(Some((last, now)))
    }

    /// Runs `write` in a transaction only if `lease.token` passes the fence of
    /// `resource` (see [`fence_accepts`]); the fence then remembers the token and
    /// commits with the write. An older token gets `LeaseError::Fenced` (converted into
    /// `E`), nothing of the write runs, and a `fenced_write_rejected` event is recorded
    /// under the lease's name. An error from `write` rolls everything back, the fence
    /// included. Concurrent writes to one resource are serialized by the fence row's lock.
    ///
    /// The closure owns what it writes (the future borrows only the connection) and
    /// writes through `tx` only.
    ///
    /// ```no_run
    /// # use idem_core::{Lease, LeaseError};
    /// # async fn demo(store: idem_postgres::PgStore, lease: Lease) -> Result<(), LeaseError> {
    /// let event = 42_i64;
    /// store
    ///     .fenced_write("inventory:event-42", &lease, move |tx| {
    ///         Box::pin(async move {
    ///             sqlx::query("UPDATE inventory SET held = held - 1 WHERE event = $1")
    ///                 .bind(event)
    ///                 .execute(tx)
    ///                 .await
    ///                 .map_err(|e| LeaseError::Backend(e.to_string()))?;
    ///             Ok(())
    ///         })
    ///     })
    ///     .await
    /// # }
    /// ```
    pub async fn fenced_write<T, E, F>(
        &self,
        resource: &str,
        lease: &Lease,
        write: F,
    ) -> Result<T, E>
    where
        E: From<LeaseError>,
        F: for<'c> FnOnce(&'c mut PgConnection) -> FencedWriteFuture<'c, T, E>,
    {
        idem_store_kit::row::fenced_write(&Fence(self), resource, lease, write).await
    }

    /// The fence inside the caller's transaction (`conn` is typically `&mut *tx`), for a
    /// service that writes its business rows itself: `Ok` means the token passed and the
    /// fence remembers it when the caller commits; the fence row stays locked until
    /// then. `LeaseError::Fenced` means an older token: the fence wrote nothing, a
    /// `fenced_write_rejected` event was recorded in its own commit, and the caller must
    /// not write (roll back).
    pub async fn fence_in_tx(
        &self,
        conn: &mut PgConnection,
        resource: &str,
        lease: &Lease,
    ) -> Result<(), LeaseError> {
        let t = self.lease_tables();
        match self.take_fence(conn, &t, resource, lease).await? {
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
struct Fence<'s>(&'s PgStore);

impl FenceSteps for Fence<'_> {
    type Tx = sqlx::Transaction<'static, Postgres>;
    type Conn = PgConnection;

    async fn begin(&self) -> Result<Self::Tx, LeaseError> {
        self.0.begin_lease().await
    }

    async fn take<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        resource: &'a str,
        lease: &'a Lease,
    ) -> Result<Option<(FencingToken, Millis)>, LeaseError> {
        let t = self.0.lease_tables();
        self.0.take_fence(tx, &t, resource, lease).await
    }

    fn conn(tx: &mut Self::Tx) -> &mut PgConnection {
        tx
    }

    async fn commit(tx: Self::Tx) -> Result<(), LeaseError> {
        tx.commit().await.map_err(lerr("fenced write commit"))
    }

    async fn rollback(tx: Self::Tx) -> Result<(), LeaseError> {
        tx.rollback().await.map_err(lerr("fenced write rollback"))
    }

    async fn refused<'a>(&'a self, refusal: &'a FenceRefusal) {
        let t = self.0.lease_tables();
        let f = &refusal.fenced;
        if let Err(e) = record(&self.0.pool, &t, &refusal.event).await {
            tracing::error!(error = %e, lease = %f.name, resource = %f.resource, "fenced-write evidence not recorded");
        }
        tracing::warn!(
            lease = %f.name, owner = %f.owner, token = %f.token,
            resource = %f.resource, last_accepted = %f.last_accepted, "fenced write rejected"
        );
    }
}
