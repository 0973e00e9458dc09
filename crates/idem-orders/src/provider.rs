//! The payment-provider simulator: an external system that is itself idempotent on the
//! key its caller derives from the business (`pay:{order_id}`, `refund:{order_id}`).
//!
//! It keeps its own books (`psp_operations`) and commits them on its own, the way a real
//! provider commits before its answer reaches us: an answer lost on the way back is
//! recovered by asking again with the same key, never by charging again. `calls` counts
//! every arrival, so tests and the demo can show that many calls made one charge.
//!
//! It must not touch the service's ledgers (recording a confirmed payment is the
//! service's job) and it never mints a key: the caller names the operation.

use std::time::Duration;

use idem_sql::Backend;
use serde::{Deserialize, Serialize};

use crate::db::{sql, Database};
use crate::error::Error;
use crate::ledgers::{new_id, now_ms};

/// `charge` or `refund`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OperationKind {
    Charge,
    Refund,
}

impl OperationKind {
    pub fn as_str(self) -> &'static str {
        match self {
            OperationKind::Charge => "charge",
            OperationKind::Refund => "refund",
        }
    }
}

/// The provider's answer; the same for every call with the same key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub provider_key: String,
    pub provider_ref: String,
    pub kind: OperationKind,
    pub amount_cents: i64,
    pub created_at: i64,
    /// How many calls this key has seen, this one included.
    pub calls: i64,
}

impl Receipt {
    /// This call found the operation already done.
    pub fn replayed(&self) -> bool {
        self.calls > 1
    }
}

/// The simulator, over the service's database.
#[derive(Debug, Clone)]
pub struct PaymentSimulator {
    db: Database,
    latency: Duration,
}

impl PaymentSimulator {
    pub fn new(db: Database, latency: Duration) -> Self {
        Self { db, latency }
    }

    /// Charges `amount_cents` for `order_id` under `key`, once however often it is asked.
    pub async fn charge(
        &self,
        tenant: &str,
        key: &str,
        order_id: &str,
        amount_cents: i64,
    ) -> Result<Receipt, Error> {
        self.operate(OperationKind::Charge, tenant, key, order_id, amount_cents)
            .await
    }

    /// Refunds under `key`, once however often it is asked.
    pub async fn refund(
        &self,
        tenant: &str,
        key: &str,
        order_id: &str,
        amount_cents: i64,
    ) -> Result<Receipt, Error> {
        self.operate(OperationKind::Refund, tenant, key, order_id, amount_cents)
            .await
    }

    /// What the provider knows under `key`, without calling it an arrival.
    pub async fn lookup(&self, tenant: &str, key: &str) -> Result<Option<Receipt>, Error> {
        let mut conn = self.db.acquire().await?;
        let row = conn
            .conn()
            .optional(
                sql(
                    "SELECT provider_key, kind, amount_cents, provider_ref, created_at, calls \
                     FROM psp_operations WHERE tenant_id = $1 AND provider_key = $2",
                )
                .bind(tenant)
                .bind(key),
            )
            .await?;
        row.map(|r| receipt_from(&r)).transpose()
    }

    async fn operate(
        &self,
        kind: OperationKind,
        tenant: &str,
        key: &str,
        order_id: &str,
        amount_cents: i64,
    ) -> Result<Receipt, Error> {
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        let now = now_ms();
        let mut tx = self.db.begin().await?;
        let mut c = tx.conn();
        let upsert = c.pick(
            "INSERT INTO psp_operations (tenant_id, provider_key, kind, order_id, \
               amount_cents, provider_ref, created_at, calls, last_call_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, 1, $7) \
             ON CONFLICT (tenant_id, provider_key) DO UPDATE SET \
               calls = psp_operations.calls + 1, last_call_at = excluded.last_call_at \
             RETURNING provider_key, kind, order_id, amount_cents, provider_ref, \
               created_at, calls",
            // MySQL: no RETURNING; the row, locked by the upsert, is read back below.
            "INSERT INTO psp_operations (tenant_id, provider_key, kind, order_id, \
               amount_cents, provider_ref, created_at, calls, last_call_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, 1, $7) \
             ON DUPLICATE KEY UPDATE calls = calls + 1, last_call_at = $7",
        );
        let q = sql(upsert)
            .bind(tenant)
            .bind(key)
            .bind(kind.as_str())
            .bind(order_id)
            .bind(amount_cents)
            .bind(new_id(match kind {
                OperationKind::Charge => "ch",
                OperationKind::Refund => "re",
            }))
            .bind(now);
        let row = if c.backend() == Backend::Mysql {
            c.execute(q).await?;
            c.one(
                sql(
                    "SELECT provider_key, kind, order_id, amount_cents, provider_ref, \
                       created_at, calls FROM psp_operations \
                     WHERE tenant_id = $1 AND provider_key = $2",
                )
                .bind(tenant)
                .bind(key),
            )
            .await?
        } else {
            c.one(q).await?
        };
        let receipt = receipt_from(&row)?;
        let same_request = receipt.kind == kind
            && row.text("order_id")? == order_id
            && receipt.amount_cents == amount_cents;
        tx.commit().await?;
        if !same_request {
            // A provider refuses a key reused for a different operation.
            return Err(Error::InvalidInput(format!(
                "provider key {key} was first used for a different {} request",
                receipt.kind.as_str()
            )));
        }
        if receipt.replayed() {
            tracing::info!(key, calls = receipt.calls, "provider replayed an operation");
        }
        Ok(receipt)
    }
}

fn receipt_from(row: &crate::db::Row) -> Result<Receipt, Error> {
    let kind = match row.text("kind")?.as_str() {
        "charge" => OperationKind::Charge,
        "refund" => OperationKind::Refund,
        other => return Err(Error::Backend(format!("psp kind {other:?}"))),
    };
    Ok(Receipt {
        provider_key: row.text("provider_key")?,
        provider_ref: row.text("provider_ref")?,
        kind,
        amount_cents: row.int("amount_cents")?,
        created_at: row.int("created_at")?,
        calls: row.int("calls")?,
    })
}
