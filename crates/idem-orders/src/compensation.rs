//! The business layer's answer to the sweeper's question "is compensation still pending
//! for this result?" (docs/DESIGN.md: retention tiers): an idempotency record must keep its tier while its order
//! waits for a refund or still has undelivered messages.
//!
//! Reads only; it never changes a ledger.

use async_trait::async_trait;
use idem_core::{CompensationCheck, StoreError, TenantId};
use idem_sql::{sql, SqlStore};

/// Pending when the order is `refund_pending`, or one of its outbox messages is
/// unpublished or still waiting for a consumer.
const PENDING_SQL: &str =
    "SELECT (EXISTS (SELECT 1 FROM orders o WHERE o.tenant_id = $1 AND o.order_id = $2 \
       AND o.status = 'refund_pending') \
     OR EXISTS (SELECT 1 FROM outbox_messages m WHERE m.tenant_id = $1 AND m.order_id = $2 \
       AND (m.published_at IS NULL OR EXISTS (SELECT 1 FROM message_deliveries d \
         WHERE d.message_id = m.message_id AND d.state = 'pending')))) AS pending";

/// [`CompensationCheck`] over the order ledgers in the same database as the records.
#[derive(Clone)]
pub struct OrderCompensation {
    db: SqlStore,
}

impl OrderCompensation {
    /// The check for a service database.
    pub fn for_database(db: &crate::Database) -> Self {
        Self {
            db: db.store().clone(),
        }
    }

    /// The check for a store's database, if it holds the order ledgers.
    pub async fn detect(db: &SqlStore) -> Result<Option<Self>, StoreError> {
        let found = db.has_table("orders").await.map_err(unavailable)?;
        Ok(found.then(|| Self { db: db.clone() }))
    }
}

fn unavailable(e: sqlx::Error) -> StoreError {
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
        let mut conn = self.db.acquire().await.map_err(unavailable)?;
        let row = conn
            .conn()
            .one(sql(PENDING_SQL).bind(tenant.as_str()).bind(order_id))
            .await
            .map_err(unavailable)?;
        row.bool("pending").map_err(unavailable)
    }
}

#[cfg(test)]
mod tests {
    use idem_core::{CompensationCheck, TenantId};
    use idem_sql::{sql, SqlStore};

    use super::{order_id_of, OrderCompensation};
    use crate::{Database, DatabaseOptions};

    #[test]
    fn order_ids_from_references() {
        assert_eq!(order_id_of("/v1/orders/ord_1"), Some("ord_1"));
        assert_eq!(order_id_of("ord_2"), Some("ord_2"));
        assert_eq!(order_id_of("/v1/orders/"), None);
    }

    async fn run(db: &SqlStore, sql_text: &'static str, args: &[&str]) {
        let mut q = sql(sql_text);
        for a in args {
            q = q.bind(*a);
        }
        db.acquire().await.unwrap().conn().execute(q).await.unwrap();
    }

    /// Pending while the order waits for a refund, or one of its messages is unpublished
    /// or undelivered; not for an order that is settled.
    async fn pending_follows_the_ledgers(db: &Database) {
        let store = db.store();
        let check = OrderCompensation::detect(store)
            .await
            .unwrap()
            .expect("ledgers");
        let t = TenantId::new("t-comp").unwrap();
        assert!(!check.pending(&t, "/v1/orders/none").await.unwrap());
        const ORDER: &str = "INSERT INTO orders (order_id, tenant_id, user_id, show_id, quantity, \
             amount_cents, status, version, created_at, updated_at) \
             VALUES ($1, $2, 'u', 's', 1, 100, $3, 1, 0, 0)";
        run(store, ORDER, &["o-refund", "t-comp", "refund_pending"]).await;
        run(store, ORDER, &["o-paid", "t-comp", "paid"]).await;
        assert!(check.pending(&t, "/v1/orders/o-refund").await.unwrap());
        assert!(!check.pending(&t, "/v1/orders/o-paid").await.unwrap());
        run(
            store,
            "INSERT INTO outbox_messages (message_id, tenant_id, topic, order_id, user_id, \
             show_id, payload, created_at) VALUES ('m-1', $1, 'order.paid', $2, 'u', 's', '{}', 0)",
            &["t-comp", "o-paid"],
        )
        .await;
        assert!(check.pending(&t, "o-paid").await.unwrap(), "unpublished");
        run(
            store,
            "UPDATE outbox_messages SET published_at = 1 WHERE message_id = 'm-1'",
            &[],
        )
        .await;
        assert!(!check.pending(&t, "o-paid").await.unwrap());
        run(
            store,
            "INSERT INTO message_deliveries (consumer, message_id, state, available_at, \
             created_at) VALUES ('ticketing', 'm-1', 'pending', 0, 0)",
            &[],
        )
        .await;
        assert!(check.pending(&t, "o-paid").await.unwrap(), "undelivered");
    }

    #[tokio::test]
    async fn sqlite_pending_compensation() {
        let dir = tempfile::tempdir().unwrap();
        let bare = SqlStore::open_sqlite_path(dir.path().join("bare.db"))
            .await
            .unwrap();
        assert!(OrderCompensation::detect(&bare).await.unwrap().is_none());
        let db = Database::open_sqlite(dir.path().join("orders.db"))
            .await
            .unwrap();
        pending_follows_the_ledgers(&db).await;
    }

    #[tokio::test]
    async fn postgres_pending_compensation() {
        let url = std::env::var("IDEM_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        let schema = format!("idem_orders_comp_{}", uuid::Uuid::now_v7().simple());
        let options = DatabaseOptions {
            pg_schema: Some(schema.clone()),
            pg_max_connections: Some(2),
            ..DatabaseOptions::default()
        };
        let db = match Database::open(&url, options).await {
            Ok(db) => db,
            Err(e) if e.is_unavailable() => {
                return idem_conformance::skip_or_fail("PostgreSQL", &e)
            }
            Err(e) => panic!("{e}"),
        };
        pending_follows_the_ledgers(&db).await;
        let pg = db.postgres().unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA \"{schema}\" CASCADE"
        )))
        .execute(pg.pool())
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn mysql_pending_compensation() {
        use sqlx::{Connection, Executor};
        let server = std::env::var("IDEM_TEST_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
        let mut admin = match sqlx::MySqlConnection::connect(&server).await {
            Ok(c) => c,
            Err(e) => return idem_conformance::skip_or_fail("MySQL/MariaDB", &e),
        };
        let database = format!("idem_orders_comp_{}", uuid::Uuid::now_v7().simple());
        admin
            .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{database}`")))
            .await
            .unwrap();
        // The server's URL naming the new database.
        let (head, query) = server.split_once('?').unwrap_or((&server, ""));
        let host = head.find("://").map_or(0, |i| i + 3);
        let cut = head[host..].find('/').map_or(head.len(), |i| host + i);
        let sep = if query.is_empty() { "" } else { "?" };
        let url = format!("{}/{database}{sep}{query}", &head[..cut]);
        let options = DatabaseOptions {
            pg_max_connections: Some(2),
            ..DatabaseOptions::default()
        };
        let db = Database::open(&url, options).await.unwrap();
        pending_follows_the_ledgers(&db).await;
        drop(db);
        admin
            .execute(sqlx::AssertSqlSafe(format!("DROP DATABASE `{database}`")))
            .await
            .unwrap();
    }
}
