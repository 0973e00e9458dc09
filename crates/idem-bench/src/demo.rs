//! `idem demo incident`: the 20:14 incident, replayed end to end against the real HTTP
//! service, once with the legacy behaviour and once with idem.
//!
//! One user, one show, one confirm page: 6 clicks and 2 gateway retries. The first
//! request writes its order at 430 ms, but its response is stuck and the client gives up
//! (the response is lost after the commit). Then the user pays what they saw.
//! - Legacy (tenant `legacy`): `POST /v1/legacy/orders`, no key, every arrival mints an
//!   order id on the server → 8 orders, 2 of them paid, 8 holds, 8 `order.created`.
//! - idem (tenant `idem`): `POST /v1/orders` with the key fixed on the confirm page and
//!   passed through by the gateway → 1 order, and the 7 answers that reach the client are
//!   replays carrying its id.
//!
//! The chain is not started: messages stay in the outbox, as the incident's duplicates
//! stayed in queues. With a database URL the rows stay there for the reconciliation
//! tooling. This module only drives the service over HTTP and reads the ledgers; it
//! writes nothing itself.
//!
//! It is a driver, not a measurement; it lives here rather than in `idem-orders` so the
//! service library needs no HTTP client or temporary directories for it. It uses the
//! service's public API, and plain SQL on the database's pool to read the ledgers.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use idem_orders::db::redact;
use idem_orders::{
    bind, ApiKey, Database, DatabaseOptions, Error, Faults, OrdersOptions, ServeConfig,
    ServiceOptions, SlowCreate,
};
use idem_sql::sql;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// What to replay.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Keep the data in this database; default a temporary embedded file.
    pub database_url: Option<String>,
    /// PostgreSQL schema (with a `postgres://` URL).
    pub pg_schema: Option<String>,
    pub user_id: String,
    pub show_id: String,
    /// The confirm page's session; default a fresh `sess-…` per run, so runs on one
    /// database stay apart.
    pub client_session: Option<String>,
    /// Multiplies every delay of the timeline (1.0 = the incident's timings).
    pub time_scale: f64,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            database_url: None,
            pg_schema: None,
            user_id: "U-7318".into(),
            show_id: "S-204".into(),
            client_session: None,
            time_scale: 1.0,
        }
    }
}

/// The scenario as run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scenario {
    pub user_id: String,
    pub show_id: String,
    pub client_session: String,
    pub quantity: i64,
    pub clicks: usize,
    pub gateway_retries: usize,
    /// When the first request's write committed.
    pub first_commit_ms: u64,
    /// How long the client (and the gateway) waits for an answer.
    pub client_timeout_ms: u64,
}

/// One arrival at the service and what the client got back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Arrival {
    /// `click 1` … `click 6`, `gateway retry 1`, `gateway retry 2`.
    pub label: String,
    pub sent_at_ms: u64,
    /// HTTP status, absent when the response was lost.
    pub status: Option<u16>,
    pub order_id: Option<String>,
    pub replayed: bool,
    /// `created`, `replayed`, `lost (client timed out)`, or the error.
    pub outcome: String,
}

/// One side of the comparison: what the client saw and what the four ledgers hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArmReport {
    pub tenant: String,
    pub behaviour: String,
    /// The key every request carried (idem only).
    pub idempotency_key: Option<String>,
    pub requests: usize,
    pub responses_received: usize,
    pub responses_lost: usize,
    /// Responses marked `Idempotent-Replayed: true`.
    pub replays: usize,
    /// The order ids in the responses the client received, in arrival order.
    pub order_ids: Vec<String>,
    pub distinct_order_ids: usize,
    /// Orders ledger: rows this run wrote.
    pub orders: usize,
    pub orders_by_status: BTreeMap<String, usize>,
    pub paid_orders: usize,
    /// Payments ledger.
    pub payments: usize,
    pub refunds: usize,
    pub charged_cents: i64,
    /// Calls the payment provider received (it deduplicates on `pay:{order}`).
    pub provider_calls: i64,
    /// Inventory ledger: holds (vouchers) and the tickets they keep off sale.
    pub holds: usize,
    pub held_tickets: i64,
    /// Messages ledger: outbox rows, by topic; none published (the chain is stopped).
    pub messages: usize,
    pub messages_by_topic: BTreeMap<String, usize>,
    pub messages_unpublished: usize,
    pub arrivals: Vec<Arrival>,
}

/// Both outcomes, side by side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DemoReport {
    pub scenario: Scenario,
    /// Where the rows are (`temporary` when nothing was kept).
    pub database: String,
    pub legacy: ArmReport,
    pub idem: ArmReport,
}

/// The arrivals: label and send time (ms after the first click).
const TIMELINE: [(&str, u64); 8] = [
    ("click 1", 0),
    ("click 2", 500),
    ("click 3", 800),
    ("gateway retry 1", 1000),
    ("click 4", 1200),
    ("click 5", 1500),
    ("gateway retry 2", 1800),
    ("click 6", 2100),
];
const FIRST_COMMIT_MS: u64 = 430;
/// How long the first response stays stuck after the commit: past the client's timeout,
/// but short enough that a duplicate arriving before the commit (and waiting for it)
/// still gets its replay within the timeout on a slow machine.
const STUCK_MS: u64 = 720;
const CLIENT_TIMEOUT_MS: u64 = 1000;
const QUANTITY: i64 = 2;

/// Replays the incident and reports both outcomes.
pub async fn demo_incident(options: DemoOptions) -> Result<DemoReport, Error> {
    let scale = if options.time_scale.is_finite() && options.time_scale > 0.0 {
        options.time_scale
    } else {
        1.0
    };
    let ms = move |m: u64| Duration::from_millis((m as f64 * scale).round() as u64);
    let tempdir = match &options.database_url {
        Some(_) => None,
        None => Some(tempfile::tempdir()?),
    };
    let url = match (&options.database_url, &tempdir) {
        (Some(url), _) => url.clone(),
        (None, Some(dir)) => format!("sqlite://{}", dir.path().join("incident.db").display()),
        (None, None) => unreachable!("a tempdir exists when no URL was given"),
    };
    let session = options
        .client_session
        .clone()
        .unwrap_or_else(|| format!("sess-{}", uuid::Uuid::now_v7().simple()));
    let scenario = Scenario {
        user_id: options.user_id.clone(),
        show_id: options.show_id.clone(),
        client_session: session.clone(),
        quantity: QUANTITY,
        clicks: TIMELINE
            .iter()
            .filter(|(l, _)| l.starts_with("click"))
            .count(),
        gateway_retries: TIMELINE
            .iter()
            .filter(|(l, _)| l.starts_with("gateway"))
            .count(),
        first_commit_ms: ms(FIRST_COMMIT_MS).as_millis() as u64,
        client_timeout_ms: ms(CLIENT_TIMEOUT_MS).as_millis() as u64,
    };
    let keys = [
        (
            "legacy",
            format!("legacy-{}", uuid::Uuid::new_v4().simple()),
        ),
        ("idem", format!("idem-{}", uuid::Uuid::new_v4().simple())),
    ];
    let config = |slow: bool| ServeConfig {
        listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
        database_url: Some(url.clone()),
        api_keys: keys
            .iter()
            .map(|(t, s)| format!("{t}={s}").parse::<ApiKey>())
            .collect::<Result<_, _>>()
            .expect("valid demo keys"),
        admin_token: None,
        nats_url: None,
        tls: None,
        options: ServiceOptions {
            pg_schema: options.pg_schema.clone(),
            run_chain: false,
            legacy_route: true,
            orders: OrdersOptions {
                faults: Faults {
                    slow_first_create: slow.then_some(SlowCreate {
                        commit_after: ms(FIRST_COMMIT_MS),
                        respond_after: ms(STUCK_MS),
                    }),
                    ..Faults::default()
                },
                ..OrdersOptions::default()
            },
            ..ServiceOptions::default()
        },
    };
    let client = reqwest::Client::builder()
        .timeout(ms(CLIENT_TIMEOUT_MS))
        .build()
        .map_err(|e| Error::Transport(e.to_string()))?;
    let body = serde_json::json!({
        "user_id": options.user_id,
        "show_id": options.show_id,
        "quantity": QUANTITY,
        "client_session": session,
    });

    let mut arms = Vec::new();
    for (tenant, secret) in &keys {
        // A fresh server per side: the lost first response is its first create.
        let server = bind(config(true)).await?;
        let base = server.url();
        let legacy = *tenant == "legacy";
        let key =
            (!legacy).then(|| format!("confirm:{}:{}:{session}", options.user_id, options.show_id));
        let route = if legacy {
            "/v1/legacy/orders"
        } else {
            "/v1/orders"
        };
        let start = Instant::now();
        let mut sends = Vec::new();
        for (label, at) in TIMELINE {
            let client = client.clone();
            let url = format!("{base}{route}");
            let body = body.clone();
            let secret = secret.clone();
            let key = key.clone();
            let timeout_ms = scenario.client_timeout_ms;
            sends.push(tokio::spawn(async move {
                tokio::time::sleep_until(start + ms(at)).await;
                let mut request = client.post(url).bearer_auth(secret).json(&body);
                if let Some(k) = &key {
                    request = request.header("Idempotency-Key", k);
                }
                let sent_at_ms = start.elapsed().as_millis() as u64;
                match request.send().await {
                    Ok(response) => {
                        let status = response.status().as_u16();
                        let replayed = response
                            .headers()
                            .get("idempotent-replayed")
                            .is_some_and(|v| v == "true");
                        match response.json::<serde_json::Value>().await {
                            Ok(json) => Arrival {
                                label: label.into(),
                                sent_at_ms,
                                status: Some(status),
                                order_id: json["order_id"].as_str().map(str::to_owned),
                                replayed,
                                outcome: if replayed {
                                    "replayed"
                                } else if status == 201 {
                                    "created"
                                } else {
                                    "refused"
                                }
                                .into(),
                            },
                            Err(e) => lost(label, sent_at_ms, &e, timeout_ms),
                        }
                    }
                    Err(e) => lost(label, sent_at_ms, &e, timeout_ms),
                }
            }));
        }
        let mut arrivals = Vec::new();
        for send in sends {
            arrivals.push(send.await.map_err(|e| Error::Transport(e.to_string()))?);
        }
        // The user pays what they saw: two different orders on the legacy side, the one
        // order on the idem side. Fresh keys per payment click; the provider dedups on
        // pay:{order} either way.
        let seen: Vec<String> = arrivals.iter().filter_map(|a| a.order_id.clone()).collect();
        let mut distinct = seen.clone();
        distinct.dedup();
        let to_pay: Vec<&String> = if legacy {
            distinct.iter().take(2).collect()
        } else {
            distinct.iter().take(1).collect()
        };
        let pay_client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| Error::Transport(e.to_string()))?;
        for order_id in to_pay {
            let response = pay_client
                .post(format!("{base}/v1/orders/{order_id}/pay"))
                .bearer_auth(secret)
                .header(
                    "Idempotency-Key",
                    format!("pay-click-{}", uuid::Uuid::new_v4().simple()),
                )
                .send()
                .await
                .map_err(|e| Error::Transport(e.to_string()))?;
            if !response.status().is_success() {
                return Err(Error::Transport(format!(
                    "paying {order_id} answered {}",
                    response.status()
                )));
            }
        }
        server.shutdown().await?;
        arms.push((*tenant, key, arrivals));
    }

    let db = Database::open(
        &url,
        DatabaseOptions {
            pg_schema: options.pg_schema.clone(),
            ..Default::default()
        },
    )
    .await?;
    let mut reports = Vec::new();
    for (tenant, key, arrivals) in arms {
        reports.push(arm_report(&db, tenant, key, &session, arrivals).await?);
    }
    let idem = reports.pop().expect("two arms");
    let legacy = reports.pop().expect("two arms");
    Ok(DemoReport {
        scenario,
        database: match &options.database_url {
            Some(url) => redact(url),
            None => "temporary".into(),
        },
        legacy,
        idem,
    })
}

fn lost(label: &str, sent_at_ms: u64, e: &reqwest::Error, timeout_ms: u64) -> Arrival {
    Arrival {
        label: label.into(),
        sent_at_ms,
        status: None,
        order_id: None,
        replayed: false,
        outcome: if e.is_timeout() {
            format!("lost (no response within {timeout_ms} ms)")
        } else {
            format!("lost ({e})")
        },
    }
}

/// What the four ledgers hold for one tenant's session.
struct Ledgers {
    orders_by_status: BTreeMap<String, usize>,
    payments: usize,
    refunds: usize,
    charged: i64,
    provider_calls: i64,
    holds: i64,
    held_tickets: i64,
    messages_by_topic: BTreeMap<String, usize>,
    unpublished: usize,
}

const ORDERS_BY_STATUS: &str = "SELECT status, COUNT(*) AS n FROM orders \
     WHERE tenant_id = $1 AND client_session = $2 GROUP BY status";
/// The summaries that add up amounts, written once with the integer type a sum is cast
/// to: `BIGINT` on SQLite and PostgreSQL, `SIGNED` on MySQL (which has no `CAST … AS
/// BIGINT`).
struct Sums {
    payments: &'static str,
    provider_calls: &'static str,
    holds: &'static str,
    messages: &'static str,
}

macro_rules! sums {
    ($int:literal) => {
        Sums {
            payments: concat!(
                "SELECT p.kind, COUNT(*) AS n, CAST(COALESCE(SUM(p.amount_cents), 0) AS ",
                $int,
                ") AS total FROM payments p JOIN orders o ON o.order_id = p.order_id \
                 WHERE o.tenant_id = $1 AND o.client_session = $2 GROUP BY p.kind"
            ),
            provider_calls: concat!(
                "SELECT CAST(COALESCE(SUM(ps.calls), 0) AS ",
                $int,
                ") AS calls FROM psp_operations ps JOIN orders o ON o.order_id = ps.order_id \
                 WHERE o.tenant_id = $1 AND o.client_session = $2"
            ),
            holds: concat!(
                "SELECT COUNT(*) AS n, CAST(COALESCE(SUM(h.quantity), 0) AS ",
                $int,
                ") AS tickets FROM inventory_holds h JOIN orders o ON o.order_id = h.order_id \
                 WHERE o.tenant_id = $1 AND o.client_session = $2 AND h.status = 'held'"
            ),
            messages: concat!(
                "SELECT m.topic, COUNT(*) AS n, \
                 CAST(SUM(CASE WHEN m.published_at IS NULL THEN 1 ELSE 0 END) AS ",
                $int,
                ") AS waiting FROM outbox_messages m JOIN orders o ON o.order_id = m.order_id \
                 WHERE o.tenant_id = $1 AND o.client_session = $2 GROUP BY m.topic"
            ),
        }
    };
}

const SUMS: Sums = sums!("BIGINT");
const MYSQL_SUMS: Sums = sums!("SIGNED");

/// Reads [`Ledgers`] through the facade: plain SQL every database runs, but for the cast
/// of a sum.
async fn read_ledgers(db: &Database, tenant: &str, session: &str) -> Result<Ledgers, Error> {
    let mut pooled = db.store().acquire().await?;
    let mut conn = pooled.conn();
    let q = |text: &'static str| sql(text).bind(tenant).bind(session);
    let sums = match conn.backend() {
        idem_sql::Backend::Mysql => &MYSQL_SUMS,
        _ => &SUMS,
    };
    let mut orders_by_status = BTreeMap::new();
    for row in conn.all(q(ORDERS_BY_STATUS)).await? {
        orders_by_status.insert(row.text("status")?, row.int("n")? as usize);
    }
    let (mut payments, mut refunds, mut charged) = (0, 0, 0);
    for row in conn.all(q(sums.payments)).await? {
        let n = row.int("n")? as usize;
        match row.text("kind")?.as_str() {
            "charge" => {
                payments = n;
                charged = row.int("total")?;
            }
            _ => refunds = n,
        }
    }
    let provider_calls = conn.one(q(sums.provider_calls)).await?.int("calls")?;
    let holds = conn.one(q(sums.holds)).await?;
    let mut messages_by_topic = BTreeMap::new();
    let mut unpublished = 0usize;
    for row in conn.all(q(sums.messages)).await? {
        messages_by_topic.insert(row.text("topic")?, row.int("n")? as usize);
        unpublished += row.int("waiting")? as usize;
    }
    Ok(Ledgers {
        orders_by_status,
        payments,
        refunds,
        charged,
        provider_calls,
        holds: holds.int("n")?,
        held_tickets: holds.int("tickets")?,
        messages_by_topic,
        unpublished,
    })
}

async fn arm_report(
    db: &Database,
    tenant: &str,
    key: Option<String>,
    session: &str,
    arrivals: Vec<Arrival>,
) -> Result<ArmReport, Error> {
    let ledgers = read_ledgers(db, tenant, session).await?;
    let Ledgers {
        orders_by_status,
        payments,
        refunds,
        charged,
        provider_calls,
        holds,
        held_tickets,
        messages_by_topic,
        unpublished,
    } = ledgers;
    let order_ids: Vec<String> = arrivals.iter().filter_map(|a| a.order_id.clone()).collect();
    let mut distinct = order_ids.clone();
    distinct.sort();
    distinct.dedup();
    let received = arrivals.iter().filter(|a| a.status.is_some()).count();
    Ok(ArmReport {
        tenant: tenant.to_owned(),
        behaviour: if key.is_some() {
            "Idempotency-Key fixed on the confirm page, passed through by the gateway".into()
        } else {
            "no key: every arrival gets a server-generated order id".into()
        },
        idempotency_key: key,
        requests: arrivals.len(),
        responses_received: received,
        responses_lost: arrivals.len() - received,
        replays: arrivals.iter().filter(|a| a.replayed).count(),
        distinct_order_ids: distinct.len(),
        order_ids,
        orders: orders_by_status.values().sum(),
        paid_orders: ["paid", "ticketed"]
            .iter()
            .filter_map(|s| orders_by_status.get(*s))
            .sum(),
        orders_by_status,
        payments,
        refunds,
        charged_cents: charged,
        provider_calls,
        holds: holds as usize,
        held_tickets,
        messages: messages_by_topic.values().sum(),
        messages_by_topic,
        messages_unpublished: unpublished,
        arrivals,
    })
}

impl DemoReport {
    /// Both outcomes side by side, for a terminal.
    pub fn render_text(&self) -> String {
        let s = &self.scenario;
        let (l, i) = (&self.legacy, &self.idem);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "20:14 replayed: user {}, show {}, session {}",
            s.user_id, s.show_id, s.client_session
        );
        let _ = writeln!(
            out,
            "{} clicks + {} gateway retries; the first write committed at {} ms, its response never arrived (client timeout {} ms)\n",
            s.clicks, s.gateway_retries, s.first_commit_ms, s.client_timeout_ms
        );
        let mut row = |name: &str, a: String, b: String| {
            let _ = writeln!(out, "{name:<28}{a:<26}{b}");
        };
        row(
            "",
            "legacy (no key)".into(),
            "idem (Idempotency-Key)".into(),
        );
        row(
            "requests sent",
            l.requests.to_string(),
            i.requests.to_string(),
        );
        row(
            "responses received",
            l.responses_received.to_string(),
            i.responses_received.to_string(),
        );
        row(
            "  of which replays",
            l.replays.to_string(),
            i.replays.to_string(),
        );
        row(
            "distinct order ids seen",
            l.distinct_order_ids.to_string(),
            i.distinct_order_ids.to_string(),
        );
        row("orders", l.orders.to_string(), i.orders.to_string());
        let mut statuses: Vec<&String> = l
            .orders_by_status
            .keys()
            .chain(i.orders_by_status.keys())
            .collect();
        statuses.sort();
        statuses.dedup();
        for st in statuses {
            row(
                &format!("  {st}"),
                l.orders_by_status.get(st).copied().unwrap_or(0).to_string(),
                i.orders_by_status.get(st).copied().unwrap_or(0).to_string(),
            );
        }
        row(
            "payments (charges)",
            format!("{} ({} cents)", l.payments, l.charged_cents),
            format!("{} ({} cents)", i.payments, i.charged_cents),
        );
        row(
            "provider calls",
            l.provider_calls.to_string(),
            i.provider_calls.to_string(),
        );
        row(
            "inventory holds",
            format!("{} ({} tickets)", l.holds, l.held_tickets),
            format!("{} ({} tickets)", i.holds, i.held_tickets),
        );
        row(
            "messages (queued)",
            format!("{} ({})", l.messages, l.messages_unpublished),
            format!("{} ({})", i.messages, i.messages_unpublished),
        );
        let mut topics: Vec<&String> = l
            .messages_by_topic
            .keys()
            .chain(i.messages_by_topic.keys())
            .collect();
        topics.sort();
        topics.dedup();
        for t in topics {
            row(
                &format!("  {t}"),
                l.messages_by_topic.get(t).copied().unwrap_or(0).to_string(),
                i.messages_by_topic.get(t).copied().unwrap_or(0).to_string(),
            );
        }
        for arm in [l, i] {
            let _ = writeln!(out, "\n{} arrivals ({}):", arm.tenant, arm.behaviour);
            for a in &arm.arrivals {
                let _ = writeln!(
                    out,
                    "  {:>6} ms  {:<16} {:<5} {:<36} {}",
                    a.sent_at_ms,
                    a.label,
                    a.status.map_or_else(|| "-".to_owned(), |s| s.to_string()),
                    a.order_id.as_deref().unwrap_or("-"),
                    a.outcome
                );
            }
        }
        let _ = writeln!(
            out,
            "\nlegacy: {} orders, {} paid, {} holds; idem: {} order, {} replays of {}",
            l.orders,
            l.paid_orders,
            l.holds,
            i.orders,
            i.replays,
            i.order_ids.first().map_or("-", String::as_str)
        );
        if self.database != "temporary" {
            let _ = writeln!(
                out,
                "rows kept in {} (tenants `legacy` and `idem`, session {})",
                self.database, s.client_session
            );
        }
        out
    }
}
