//! The service's searches (by order, user and show) and the order a key made, for the
//! console's search and key pages. Reads the orders ledger; writes nothing.

use idem_console::pages::search::{archived_table, record_rows};
use idem_console::view::{key_href, q, table, time};
use idem_console::{Console, SearchKind};
use idem_core::{IdempotencyKey, Record, TenantId};
use maud::{html, Markup};

use super::OrdersConsole;
use crate::db::{sql, Database, Row};
use crate::error::Error;

pub(super) const SEARCH_KINDS: [SearchKind; 3] = [
    SearchKind {
        value: "order",
        label: "order id",
        needs_tenant: false,
    },
    SearchKind {
        value: "user",
        label: "user id",
        needs_tenant: true,
    },
    SearchKind {
        value: "show",
        label: "show id",
        needs_tenant: true,
    },
];

/// Keys listed per order found.
const KEYS_PER_ORDER: usize = 20;

pub(super) async fn search(
    orders: &OrdersConsole,
    console: &Console,
    by: &str,
    needle: &str,
    tenant: Option<&TenantId>,
) -> Result<Markup, Error> {
    let tenant_arg = tenant.map(|t| t.as_str().to_owned());
    let mut conn = orders.db.acquire().await?;
    let mut c = conn.conn();
    if by == "order" {
        let found = c
            .all(
                sql("SELECT order_id, tenant_id, user_id, show_id, status, idempotency_key, \
                       created_at FROM orders WHERE order_id = $1 AND ($2 IS NULL OR tenant_id = $2)")
                .bind(needle)
                .bind(tenant_arg),
            )
            .await?;
        drop(conn);
        // Every key whose stored result names this order (create, pay, cancel): the
        // service's result reference is the order's path. Within the order's tenant.
        let order_path = format!("/v1/orders/{needle}");
        let mut keys = Vec::new();
        for o in &found {
            let Ok(t) = TenantId::new(o.text("tenant_id")?) else {
                continue;
            };
            for reference in [needle, order_path.as_str()] {
                keys.extend(
                    console
                        .inspect()
                        .by_result_ref(&t, reference, KEYS_PER_ORDER)
                        .await?,
                );
            }
        }
        keys.sort_by_key(|k| k.created_at);
        let mut archived = console.archive().archived_by_ref(tenant, needle).await?;
        archived.extend(
            console
                .archive()
                .archived_by_ref(tenant, &order_path)
                .await?,
        );
        let head = ["tenant", "key", "state", "updated"];
        return Ok(html! {
            (orders_table(&found)?)
            h3 { "Keys whose result names this order" }
            (table(Some("order-keys"), "", &head, &record_rows(&keys)))
            (archived_table(&archived))
        });
    }
    let stmt =
        if by == "user" {
            sql("SELECT order_id, tenant_id, user_id, show_id, status, idempotency_key, created_at \
             FROM orders WHERE user_id = $1 AND ($2 IS NULL OR tenant_id = $2) \
             ORDER BY created_at DESC LIMIT 100")
        } else {
            sql("SELECT order_id, tenant_id, user_id, show_id, status, idempotency_key, created_at \
             FROM orders WHERE show_id = $1 AND ($2 IS NULL OR tenant_id = $2) \
             ORDER BY created_at DESC LIMIT 100")
        };
    let found = c.all(stmt.bind(needle).bind(tenant_arg.clone())).await?;
    let dupes = format!(
        "/console/reconcile?tenant={}&{by}={}",
        q(tenant_arg.as_deref().unwrap_or("")),
        q(needle)
    );
    Ok(html! {
        (orders_table(&found)?)
        p { a href=(dupes) { "Look for duplicates of this " (by) } }
    })
}

fn orders_table(orders: &[Row]) -> Result<Markup, Error> {
    let rows = orders
        .iter()
        .map(|r| {
            let tenant = r.text("tenant_id")?;
            let key = r.opt_text("idempotency_key")?;
            Ok(html! {
                tr {
                    td { code { (r.text("order_id")?) } }
                    td { (tenant) }
                    td { (r.text("user_id")?) }
                    td { (r.text("show_id")?) }
                    td { (r.text("status")?) }
                    td {
                        @match &key {
                            Some(k) => a href=(key_href(&tenant, k)) { (k) },
                            None => span class="muted" { "none (legacy)" },
                        }
                    }
                    td { (time(r.int("created_at")?)) }
                }
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let head = [
        "order", "tenant", "user", "show", "status", "key", "created",
    ];
    Ok(table(Some("orders"), "", &head, &rows))
}

/// The order this key made or names, for the key page.
pub(super) async fn key_order(
    db: &Database,
    tenant: &TenantId,
    key: &IdempotencyKey,
    record: Option<&Record>,
) -> Result<Option<Markup>, Error> {
    let order = {
        let mut conn = db.acquire().await?;
        conn.conn()
            .optional(
                sql("SELECT order_id, status FROM orders WHERE tenant_id = $1 AND idempotency_key = $2")
                    .bind(tenant.as_str())
                    .bind(key.as_str()),
            )
            .await?
    };
    let found = match &order {
        Some(o) => Some((o.text("order_id")?, Some(o.text("status")?))),
        None => record
            .and_then(|r| r.result.as_ref())
            .and_then(|res| {
                res.result_ref.clone().or_else(|| {
                    serde_json::from_slice::<serde_json::Value>(&res.body)
                        .ok()?
                        .get("order_id")?
                        .as_str()
                        .map(str::to_owned)
                })
            })
            .map(|id| (id, None)),
    };
    Ok(found.map(|(id, status)| {
        html! {
            p id="key-order" {
                "Order "
                a href=(format!("/console/search?by=order&q={}", q(&id))) { code { (id) } }
                @if let Some(s) = status { " — " (s) }
            }
        }
    }))
}
