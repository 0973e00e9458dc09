//! The business layer's answer to the sweeper's question "is compensation still pending
//! for this result?" (docs/DESIGN.md: retention tiers): an idempotency record must keep its tier while its order
//! waits for a refund or still has undelivered messages.
//!
//! Reads only; it never changes a ledger.

use async_trait::async_trait;
use idem_core::{CompensationCheck, StoreError, TenantId};
use sqlx::{PgPool, SqlitePool};

/// Pending when the order is `refund_pending`, or one of its outbox messages is
/// unpublished or still waiting for a consumer.
const PENDING_SQL: &str =
    "SELECT EXISTS (SELECT 1 FROM orders o WHERE o.tenant_id = $1 AND o.order_id = $2 \
       AND o.status = 'refund_pending') \
     OR EXISTS (SELECT 1 FROM outbox_messages m WHERE m.tenant_id = $1 AND m.order_id = $2 \
       AND (m.published_at IS NULL OR EXISTS (SELECT 1 FROM message_deliveries d \
         WHERE d.message_id = m.message_id AND d.state = 'pending')))";

/// [`CompensationCheck`] over the order ledgers in the same database as the records.
#[derive(Clone)]
pub enum OrderCompensation {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

impl OrderCompensation {
    /// The check for a service database.
    pub fn for_database(db: &crate::Database) -> Self {
        match (db.sqlite(), db.postgres()) {
            (Some(s), _) => Self::Sqlite(s.pool().clone()),
            (None, Some(p)) => Self::Postgres(p.pool().clone()),
            (None, None) => unreachable!("a database is SQLite or PostgreSQL"),
        }
    }

    /// The check for a SQLite database, if it holds the order ledgers.
    pub async fn detect_sqlite(pool: &SqlitePool) -> Result<Option<Self>, StoreError> {
        let found: Option<i64> = sqlx::query_scalar(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'orders'",
        )
        .fetch_optional(pool)
        .await
        .map_err(backend)?;
        Ok(found.map(|_| Self::Sqlite(pool.clone())))
    }

    /// The check for a PostgreSQL database (its search_path), if it holds the ledgers.
    pub async fn detect_postgres(pool: &PgPool) -> Result<Option<Self>, StoreError> {
        let found: bool = sqlx::query_scalar("SELECT to_regclass('orders') IS NOT NULL")
            .fetch_one(pool)
            .await
            .map_err(backend)?;
        Ok(found.then(|| Self::Postgres(pool.clone())))
    }
}

fn backend(e: sqlx::Error) -> StoreError {
    StoreError::Unavailable(format!("compensation check: {e}"))
}

/// The order id a record's result reference names (`/v1/orders/{id}` or a bare id).
pub fn order_id_of(result_ref: &str) -> Option<&str> {
    let id = result_ref.rsplit('/').next()?;
    (!id.is_empty()).then_some(id)
}

#[async_trait]
impl CompensationCheck for OrderCompensation {
    async fn pending(&self, tenant: &TenantId, result_ref: &str) -> Result<bool, StoreError> {
        let Some(order_id) = order_id_of(result_ref) else {
            return Ok(false);
        };
        match self {
            // SQLite reads `?1`/`?2` as numbered parameters.
            Self::Sqlite(pool) => sqlx::query_scalar::<_, bool>(&PENDING_SQL.replace('$', "?"))
                .bind(tenant.as_str())
                .bind(order_id)
                .fetch_one(pool)
                .await
                .map_err(backend),
            Self::Postgres(pool) => sqlx::query_scalar::<_, bool>(PENDING_SQL)
                .bind(tenant.as_str())
                .bind(order_id)
                .fetch_one(pool)
                .await
                .map_err(backend),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::order_id_of;

    #[test]
    fn order_ids_from_references() {
        assert_eq!(order_id_of("/v1/orders/ord_1"), Some("ord_1"));
        assert_eq!(order_id_of("ord_2"), Some("ord_2"));
        assert_eq!(order_id_of("/v1/orders/"), None);
    }
}
