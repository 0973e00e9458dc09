//! The payments ledger: the charges and refunds the provider confirmed, one row per
//! provider key.
//!
//! Owns the `payments` statements. It must not call the provider; it records what the
//! provider already answered.

use serde::{Deserialize, Serialize};

use super::new_id;
use crate::db::{sql, Conn};
use crate::error::Error;

/// A charge or refund the provider confirmed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payment {
    pub payment_id: String,
    pub order_id: String,
    /// `charge` or `refund`.
    pub kind: String,
    /// The business-derived key the provider deduplicated on.
    pub provider_key: String,
    pub provider_ref: String,
    pub amount_cents: i64,
    pub status: String,
    pub created_at: i64,
}

/// Records a provider-confirmed payment once per provider key. False when it was
/// already recorded.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn record_payment(
    c: &mut Conn<'_>,
    tenant: &str,
    order_id: &str,
    kind: &str,
    provider_key: &str,
    provider_ref: &str,
    amount_cents: i64,
    now: i64,
) -> Result<bool, Error> {
    let insert = c.pick(
        "INSERT INTO payments (payment_id, tenant_id, order_id, kind, provider_key, \
           provider_ref, amount_cents, status, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'succeeded', $8) \
         ON CONFLICT (tenant_id, provider_key) DO NOTHING",
        "INSERT INTO payments (payment_id, tenant_id, order_id, kind, provider_key, \
           provider_ref, amount_cents, status, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'succeeded', $8)",
    );
    Ok(c.insert_new(
        sql(insert)
            .bind(new_id("pay"))
            .bind(tenant)
            .bind(order_id)
            .bind(kind)
            .bind(provider_key)
            .bind(provider_ref)
            .bind(amount_cents)
            .bind(now),
    )
    .await?
        == 1)
}

pub(crate) async fn payments_of(
    c: &mut Conn<'_>,
    tenant: &str,
    order_id: &str,
) -> Result<Vec<Payment>, Error> {
    c.all(
        sql(
            "SELECT payment_id, order_id, kind, provider_key, provider_ref, amount_cents, \
               status, created_at FROM payments WHERE tenant_id = $1 AND order_id = $2 \
             ORDER BY created_at, payment_id",
        )
        .bind(tenant)
        .bind(order_id),
    )
    .await?
    .iter()
    .map(|r| {
        Ok(Payment {
            payment_id: r.text("payment_id")?,
            order_id: r.text("order_id")?,
            kind: r.text("kind")?,
            provider_key: r.text("provider_key")?,
            provider_ref: r.text("provider_ref")?,
            amount_cents: r.int("amount_cents")?,
            status: r.text("status")?,
            created_at: r.int("created_at")?,
        })
    })
    .collect()
}
