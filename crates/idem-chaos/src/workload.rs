//! The seeded workload: virtual users creating orders, paying some and cancelling
//! others, through the gateways with the requester client, and the log of every answer
//! they saw.
//!
//! Owns the shape of the workload (which user, show, quantity; double clicks; pay or
//! cancel) and the client-side record the checker compares with the ledgers. Every
//! intent's key is fixed before its first send and every send of it, through any
//! gateway, carries that key. It must not read the database.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_client::{ClientError, IdempotentClient, RetryPolicy};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use serde_json::{json, Value};

/// The campaign's shows, created with stock the workload cannot exhaust: a sold-out
/// refusal would be a correct answer that is not an acknowledgement.
pub const SHOWS: [&str; 2] = ["S-CHAOS-1", "S-CHAOS-2"];
pub const STOCK: i64 = 10_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IntentKind {
    Create,
    Pay,
    Cancel,
}

/// One call of `Intent::send` (itself up to a few attempts) and how it ended.
#[derive(Debug, Clone, Serialize)]
pub struct SendLog {
    pub at_ms: u64,
    pub end_ms: u64,
    pub gateway: usize,
    pub attempts: u32,
    /// The final status, when an answer came.
    pub status: Option<u16>,
    pub replayed: bool,
    pub order_id: Option<String>,
    pub order_status: Option<String>,
    pub error: Option<String>,
}

impl SendLog {
    pub fn ok(&self) -> bool {
        self.status.is_some_and(|s| (200..300).contains(&s))
    }

    /// A 4xx the same key cannot change: 408 and 429 ask to try again. The client
    /// returns a 409 only when it is the key's answer.
    pub fn refusal(&self) -> Option<u16> {
        self.status
            .filter(|s| (400..500).contains(s) && ![408, 429].contains(s))
    }

    /// The user got a definite answer: a 2xx or a refusal, not a transport error,
    /// timeout, 5xx or "try again".
    pub fn completed(&self) -> bool {
        self.ok() || self.refusal().is_some()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct IntentLog {
    /// Also the order's `client_session`: the intent the ledgers are matched against.
    pub id: String,
    pub kind: IntentKind,
    pub key: String,
    pub user: String,
    pub show: String,
    pub quantity: i64,
    /// Pay and cancel: the order acted on. Create: the order its first 2xx named.
    pub order_id: Option<String>,
    /// Two sends started at once (a double click).
    pub double_click: bool,
    /// Sent at the same time as the opposite command on the same order (pay against
    /// cancel): one of the two is refused by design.
    pub race: bool,
    pub sends: Vec<SendLog>,
    /// Some send ended 2xx.
    pub acknowledged: bool,
    /// The final answer was a refusal the same key cannot change (4xx).
    pub refused: Option<u16>,
}

impl IntentLog {
    pub fn first_ms(&self) -> u64 {
        self.sends.iter().map(|s| s.at_ms).min().unwrap_or(0)
    }
    pub fn last_ms(&self) -> u64 {
        self.sends.iter().map(|s| s.end_ms).max().unwrap_or(0)
    }
}

#[derive(Clone)]
pub struct Workload {
    pub gateways: Vec<String>,
    pub api_key: String,
    pub seed: u64,
    pub users: usize,
    /// Creates through the keyless legacy route (the control).
    pub legacy: bool,
    pub started: Instant,
    /// No new intents once set.
    pub stop: Arc<AtomicBool>,
    /// In-flight intents give up at this campaign time.
    pub deadline: Arc<Mutex<Duration>>,
    pub log: Arc<Mutex<Vec<IntentLog>>>,
}

/// A user's memory of gateways that did not answer at all (connection refused or
/// broken, no status): it sends elsewhere for a while, as a client with several
/// endpoints does, instead of spending its next intents on a dead one.
struct Endpoints {
    down_until: Mutex<Vec<Option<Instant>>>,
}

/// How long a user avoids a gateway that did not answer.
const AVOID: Duration = Duration::from_secs(5);

impl Endpoints {
    fn new(n: usize) -> Self {
        Self {
            down_until: Mutex::new(vec![None; n]),
        }
    }

    /// `wanted`, or the next gateway after it that is not being avoided (`wanted` when
    /// all are).
    fn pick(&self, wanted: usize) -> usize {
        let down = self.down_until.lock().expect("endpoints lock");
        let now = Instant::now();
        let n = down.len();
        (0..n)
            .map(|i| (wanted + i) % n)
            .find(|&g| down[g].is_none_or(|until| until <= now))
            .unwrap_or(wanted % n)
    }

    fn record(&self, g: usize, send: &SendLog) {
        let mut down = self.down_until.lock().expect("endpoints lock");
        down[g] = send.status.is_none().then(|| Instant::now() + AVOID);
    }
}

/// Who sends an intent and how.
struct Meta {
    id: String,
    user: String,
    show: String,
    quantity: i64,
    order: Option<String>,
    double: bool,
    gateway: usize,
    race: bool,
}

struct Spec {
    kind: IntentKind,
    path: String,
    key: String,
    body: Value,
}

impl Workload {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn past_deadline(&self) -> bool {
        self.started.elapsed() >= *self.deadline.lock().expect("deadline lock")
    }

    fn client(&self) -> IdempotentClient {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(6))
            .pool_max_idle_per_host(4)
            .build()
            .expect("HTTP client");
        IdempotentClient::new(http).with_policy(
            RetryPolicy::default()
                .max_attempts(3)
                .time_budget(Duration::from_secs(8))
                .attempt_timeout(Duration::from_secs(5))
                .backoff(Duration::from_millis(50), Duration::from_millis(800)),
        )
    }

    /// Runs every virtual user until [`Workload::stop`], then lets their intents in
    /// flight finish (or reach the deadline).
    pub async fn run(&self) {
        let users = (0..self.users).map(|v| {
            let w = self.clone();
            tokio::spawn(async move { w.user(v).await })
        });
        for u in futures::future::join_all(users).await {
            if let Err(e) = u {
                tracing::error!("virtual user failed: {e}");
            }
        }
    }

    async fn user(&self, v: usize) {
        let mut rng = StdRng::seed_from_u64(self.seed.wrapping_mul(1_000_003) ^ v as u64);
        let client = self.client();
        let endpoints = Endpoints::new(self.gateways.len());
        let user = format!("U-{v}");
        let mut n = 0u64;
        while !self.stop.load(Ordering::Relaxed) {
            n += 1;
            // Every choice of the round is drawn first, so the sequence of choices does
            // not depend on how the faults landed.
            let show = SHOWS[rng.random_range(0..SHOWS.len())];
            let quantity = rng.random_range(1..=3);
            let double = [rng.random_bool(0.2), rng.random_bool(0.2)];
            let gateway = [
                rng.random_range(0..self.gateways.len()),
                rng.random_range(0..self.gateways.len()),
            ];
            let next = rng.random_range(0..100);
            let think = Duration::from_millis(rng.random_range(0..60));

            let id = format!("i-{v}-{n}");
            let create = Spec {
                kind: IntentKind::Create,
                path: if self.legacy {
                    "/v1/legacy/orders".into()
                } else {
                    "/v1/orders".into()
                },
                key: format!("create-{id}"),
                body: json!({"user_id": user, "show_id": show, "quantity": quantity,
                             "client_session": id}),
            };
            let meta = |id: String, order: Option<String>, k: usize, race: bool| Meta {
                id,
                user: user.clone(),
                show: show.to_string(),
                quantity,
                order,
                double: double[k] && !race,
                gateway: gateway[k],
                race,
            };
            let created = self
                .intent(
                    &client,
                    &endpoints,
                    &create,
                    meta(id.clone(), None, 0, false),
                )
                .await;
            if let Some(order) = created {
                let follow = |verb: &str| Spec {
                    kind: if verb == "pay" {
                        IntentKind::Pay
                    } else {
                        IntentKind::Cancel
                    },
                    path: format!("/v1/orders/{order}/{verb}"),
                    key: format!("{verb}-{order}"),
                    body: json!({}),
                };
                match next {
                    0..57 => {
                        let m = meta(format!("{id}-pay"), Some(order.clone()), 1, false);
                        self.intent(&client, &endpoints, &follow("pay"), m).await;
                    }
                    57..82 => {
                        let m = meta(format!("{id}-cancel"), Some(order.clone()), 1, false);
                        self.intent(&client, &endpoints, &follow("cancel"), m).await;
                    }
                    // Pay and cancel at once: the order's lease lets one win, the other
                    // is refused for good.
                    82..87 => {
                        let pay = meta(format!("{id}-pay"), Some(order.clone()), 0, true);
                        let cancel = meta(format!("{id}-cancel"), Some(order.clone()), 1, true);
                        let (p, c) = (follow("pay"), follow("cancel"));
                        tokio::join!(
                            self.intent(&client, &endpoints, &p, pay),
                            self.intent(&client, &endpoints, &c, cancel)
                        );
                    }
                    _ => {}
                }
            }
            // Think time: keeps the load per user moderate and varied.
            tokio::time::sleep(think).await;
        }
    }

    /// Sends one intent until acknowledged, refused or past the deadline; logs it and
    /// returns the order id a 2xx named.
    async fn intent(
        &self,
        client: &IdempotentClient,
        endpoints: &Endpoints,
        spec: &Spec,
        m: Meta,
    ) -> Option<String> {
        let double = m.double;
        let gateway = endpoints.pick(m.gateway % self.gateways.len());
        let mut log = IntentLog {
            id: m.id,
            kind: spec.kind,
            key: spec.key.clone(),
            user: m.user,
            show: m.show,
            quantity: m.quantity,
            order_id: m.order,
            double_click: m.double,
            race: m.race,
            sends: Vec::new(),
            acknowledged: false,
            refused: None,
        };
        let mut g = gateway;
        if double {
            // Two sends at once through two gateways; both must end in the same answer.
            let other = endpoints.pick((g + 1) % self.gateways.len());
            let (a, b) = tokio::join!(self.send(client, spec, g), self.send(client, spec, other));
            endpoints.record(g, &a);
            endpoints.record(other, &b);
            log.sends.push(a);
            log.sends.push(b);
            g = other;
        }
        while !log.sends.iter().any(SendLog::ok) && log.refused.is_none() && !self.past_deadline() {
            if let Some(last) = log.sends.last() {
                if let Some(s) = last.refusal() {
                    log.refused = Some(s);
                    break;
                }
                // Another gateway for the next try, as a client with several endpoints would.
                g = endpoints.pick((g + 1) % self.gateways.len());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let sent = self.send(client, spec, g).await;
            endpoints.record(g, &sent);
            log.sends.push(sent);
        }
        log.acknowledged = log.sends.iter().any(SendLog::ok);
        if spec.kind == IntentKind::Create {
            log.order_id = log
                .sends
                .iter()
                .find(|s| s.ok())
                .and_then(|s| s.order_id.clone());
        }
        let order = log.order_id.clone().filter(|_| log.acknowledged);
        self.log.lock().expect("log lock").push(log);
        order
    }

    async fn send(&self, client: &IdempotentClient, spec: &Spec, g: usize) -> SendLog {
        let at_ms = self.now_ms();
        let url = format!("{}{}", self.gateways[g], spec.path);
        let intent = client
            .post(url)
            .business_key(spec.key.clone())
            .and_then(|i| i.bearer_auth(&self.api_key).json(&spec.body));
        let mut log = SendLog {
            at_ms,
            end_ms: at_ms,
            gateway: g,
            attempts: 0,
            status: None,
            replayed: false,
            order_id: None,
            order_status: None,
            error: None,
        };
        let answer = match intent {
            Ok(intent) => intent.send().await,
            Err(e) => Err(e),
        };
        match answer {
            Ok(r) => {
                log.attempts = r.attempts;
                log.status = Some(r.status.as_u16());
                log.replayed = r.replayed;
                if let Ok(v) = r.json::<Value>() {
                    log.order_id = v["order_id"].as_str().map(str::to_string);
                    log.order_status = v["status"].as_str().map(str::to_string);
                }
                if !r.status.is_success() {
                    // The problem document says why: kept for the anomaly's story.
                    log.error = Some(r.text().chars().take(300).collect());
                }
            }
            Err(ClientError::Rejected { response, .. }) => {
                log.attempts = response.attempts;
                log.status = Some(response.status.as_u16());
                log.error = Some(response.text().chars().take(200).collect());
            }
            Err(e) => {
                if let ClientError::GaveUp { attempts, .. } = &e {
                    log.attempts = *attempts;
                }
                log.error = Some(e.to_string());
            }
        }
        log.end_ms = self.now_ms();
        log
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(status: Option<u16>) -> SendLog {
        SendLog {
            at_ms: 0,
            end_ms: 0,
            gateway: 0,
            attempts: 1,
            status,
            replayed: false,
            order_id: None,
            order_status: None,
            error: None,
        }
    }

    #[test]
    fn a_gateway_that_does_not_answer_is_avoided_until_it_answers_again() {
        let e = Endpoints::new(3);
        assert_eq!(e.pick(1), 1);
        e.record(1, &send(None));
        assert_eq!(e.pick(1), 2, "the next one instead");
        e.record(2, &send(None));
        assert_eq!(e.pick(1), 0, "round to the first");
        e.record(0, &send(None));
        assert_eq!(e.pick(1), 1, "all avoided: the one wanted");
        // Any status is an answer, a 503 too.
        e.record(1, &send(Some(503)));
        assert_eq!(e.pick(1), 1);
        // The avoidance ends by itself.
        e.down_until.lock().unwrap()[2] = Some(Instant::now() - Duration::from_millis(1));
        assert_eq!(e.pick(2), 2);
    }
}
