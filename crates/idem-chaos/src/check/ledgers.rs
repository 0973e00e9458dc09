//! Reading the campaign's ledgers once, after the settle phase, in one snapshot.
//!
//! Owns the checker's own SQL over the service's tables (it shares no code with the
//! service it checks). It must not write.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::db::{Backend, Cells, Db};
use crate::ChaosError;

#[derive(Debug, Clone)]
pub(super) struct Order {
    pub(super) id: String,
    pub(super) session: Option<String>,
    pub(super) key: Option<String>,
    pub(super) show: String,
    pub(super) quantity: i64,
    pub(super) amount: i64,
    pub(super) status: String,
}

#[derive(Debug, Clone)]
pub(super) struct Hold {
    pub(super) order: String,
    pub(super) show: String,
    pub(super) quantity: i64,
    pub(super) status: String,
    pub(super) released_at: Option<i64>,
    pub(super) token: Option<i64>,
    pub(super) owner: Option<String>,
}

/// What the ledgers hold, read once after the settle phase.
#[derive(Debug, Default)]
pub struct Ledgers {
    pub(super) orders: Vec<Order>,
    pub(super) passed_through: HashMap<String, HashSet<String>>,
    pub(super) payments: Vec<(String, String, String, i64)>,
    pub(super) stock: Vec<(String, i64, i64)>,
    pub(super) holds: Vec<Hold>,
    pub(super) tickets: HashMap<String, i64>,
    pub(super) processed: HashSet<(String, String)>,
    pub(super) unpublished: Vec<(String, String)>,
    pub(super) stale_processing: Vec<(String, String, Option<String>)>,
    pub(super) lease_grants: Vec<(String, i64, String)>,
    pub(super) fences: HashMap<String, i64>,
    pub(super) records: u64,
    /// Provider operations (charges, refunds) with no payment row: money moved unrecorded.
    pub(super) unrecorded_provider_ops: Vec<(String, String)>,
    /// (order, event, times) for an event recorded more than once.
    pub(super) repeated_transitions: Vec<(String, String, i64)>,
    pub observed: BTreeMap<String, u64>,
}

fn db_err(e: sqlx::Error) -> ChaosError {
    ChaosError::Check(e.to_string())
}

/// The rows of `query`, with the tenant bound as `$1` when given.
async fn rows(c: &mut Db, query: &str, tenant: Option<&str>) -> Result<Vec<Cells>, ChaosError> {
    let binds: Vec<&str> = tenant.into_iter().collect();
    c.rows(query, &binds).await.map_err(db_err)
}

impl Ledgers {
    pub async fn read(db_url: &str, tenant: &str) -> Result<Ledgers, ChaosError> {
        let mut c = Db::connect(db_url).await.map_err(db_err)?;
        let read = Self::read_in(&mut c, tenant).await;
        c.close().await;
        read
    }

    async fn read_in(c: &mut Db, tenant: &str) -> Result<Ledgers, ChaosError> {
        let b = c.backend();
        // One snapshot: a consumer or sweeper finishing mid-read cannot tear the ledgers.
        c.begin_snapshot().await.map_err(db_err)?;
        let c = &mut *c;
        let mut l = Ledgers::default();
        for r in rows(
            c,
            "SELECT order_id, client_session, idempotency_key, show_id, quantity, amount_cents, \
             status FROM orders WHERE tenant_id = $1",
            Some(tenant),
        )
        .await?
        {
            l.orders.push(Order {
                id: r.get(0)?,
                session: r.get(1)?,
                key: r.get(2)?,
                show: r.get(3)?,
                quantity: r.get(4)?,
                amount: r.get(5)?,
                status: r.get(6)?,
            });
        }
        for r in rows(
            c,
            "SELECT order_id, to_status FROM order_transitions WHERE tenant_id = $1",
            Some(tenant),
        )
        .await?
        {
            l.passed_through
                .entry(r.get(0)?)
                .or_default()
                .insert(r.get(1)?);
        }
        for r in rows(
            c,
            "SELECT payment_id, order_id, kind, amount_cents FROM payments WHERE tenant_id = $1",
            Some(tenant),
        )
        .await?
        {
            l.payments
                .push((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?));
        }
        let integer = match b {
            Backend::Postgres => "BIGINT",
            Backend::MySql => "SIGNED",
        };
        // Stock is the show's reserve plus its buckets.
        let stock = format!(
            "SELECT i.show_id, i.capacity, i.available + CAST(COALESCE((SELECT \
             SUM(b.available) FROM inventory_buckets b WHERE b.tenant_id = i.tenant_id \
             AND b.show_id = i.show_id), 0) AS {integer}) FROM inventory i WHERE i.tenant_id = $1"
        );
        for r in rows(c, &stock, Some(tenant)).await? {
            l.stock.push((r.get(0)?, r.get(1)?, r.get(2)?));
        }
        for r in rows(
            c,
            "SELECT order_id, show_id, quantity, status, released_at, release_token, \
             release_owner FROM inventory_holds WHERE tenant_id = $1",
            Some(tenant),
        )
        .await?
        {
            l.holds.push(Hold {
                order: r.get(0)?,
                show: r.get(1)?,
                quantity: r.get(2)?,
                status: r.get(3)?,
                released_at: r.get(4)?,
                token: r.get(5)?,
                owner: r.get(6)?,
            });
        }
        for r in rows(
            c,
            "SELECT order_id, count(*) FROM tickets WHERE tenant_id = $1 GROUP BY order_id",
            Some(tenant),
        )
        .await?
        {
            l.tickets.insert(r.get(0)?, r.get(1)?);
        }
        for r in rows(
            c,
            "SELECT consumer, business_key FROM consumer_processed WHERE tenant_id = $1",
            Some(tenant),
        )
        .await?
        {
            l.processed.insert((r.get(0)?, r.get(1)?));
        }
        for r in rows(
            c,
            "SELECT topic, order_id FROM outbox_messages WHERE tenant_id = $1 AND \
             published_at IS NULL",
            Some(tenant),
        )
        .await?
        {
            l.unpublished.push((r.get(0)?, r.get(1)?));
        }
        let stale = format!(
            "SELECT tenant_id, {}, owner FROM idem_records WHERE state = 'PROCESSING' AND \
             (lease_expires_at IS NULL OR lease_expires_at < {})",
            b.key_column(),
            b.now_ms()
        );
        for r in rows(c, &stale, None).await? {
            l.stale_processing.push((r.get(0)?, r.get(1)?, r.get(2)?));
        }
        for r in rows(
            c,
            "SELECT name, token, coalesce(owner, '') FROM idem_lease_events \
             WHERE kind = 'acquired' ORDER BY id",
            None,
        )
        .await?
        {
            l.lease_grants.push((r.get(0)?, r.get(1)?, r.get(2)?));
        }
        for r in rows(c, "SELECT resource, last_token FROM idem_fences", None).await? {
            l.fences.insert(r.get(0)?, r.get(1)?);
        }
        for r in rows(
            c,
            "SELECT kind, count(*) FROM idem_lease_events GROUP BY kind",
            None,
        )
        .await?
        {
            let kind: String = r.get(0)?;
            let n: i64 = r.get(1)?;
            l.observed.insert(format!("lease_events.{kind}"), n as u64);
        }
        for r in rows(
            c,
            "SELECT o.order_id, o.kind FROM psp_operations o WHERE o.tenant_id = $1 AND \
             NOT EXISTS (SELECT 1 FROM payments p WHERE p.tenant_id = o.tenant_id AND \
             p.provider_key = o.provider_key)",
            Some(tenant),
        )
        .await?
        {
            l.unrecorded_provider_ops.push((r.get(0)?, r.get(1)?));
        }
        for r in rows(
            c,
            "SELECT order_id, event, count(*) FROM order_transitions WHERE tenant_id = $1 \
             GROUP BY order_id, event HAVING count(*) > 1",
            Some(tenant),
        )
        .await?
        {
            l.repeated_transitions
                .push((r.get(0)?, r.get(1)?, r.get(2)?));
        }
        let records = c
            .count("SELECT count(*) FROM idem_records", &[])
            .await
            .map_err(db_err)?;
        l.records = records as u64;
        let reexecuted = c
            .count(
                "SELECT count(*) FROM idem_records WHERE tenant_id = $1 AND attempts > 1",
                &[tenant],
            )
            .await
            .map_err(db_err)?;
        l.observed
            .insert("records_claimed_again".into(), reexecuted as u64);
        c.commit().await.map_err(db_err)?;
        Ok(l)
    }
}
