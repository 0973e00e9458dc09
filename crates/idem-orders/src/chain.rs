//! The automatic chain: the outbox relay and the consumer loops, over one of two
//! transports.
//!
//! - In process (the embedded default): the relay turns each outbox message into one
//!   pending delivery per subscribed consumer (`message_deliveries`, in the database), and
//!   each consumer loop claims a few due deliveries for [`CLAIM_FOR`] and works them.
//!   Relays and consumers of several instances take disjoint rows (PostgreSQL: `SKIP
//!   LOCKED`), so a paused instance holds back only what it took. A delivery is acked
//!   only after the consumer's transaction committed; one that fails (or whose process
//!   dies) stays pending and is delivered again once its claim ends. Frozen work is put
//!   back until the freeze's recheck.
//! - NATS JetStream (`--nats-url`): the relay publishes each message with
//!   `Nats-Msg-Id` = the message id, so JetStream's duplicate window also drops a second
//!   publish of the same message; consumers are durable pull consumers with explicit
//!   acks. Frozen work is nak'ed with a delay; a consumer that dies before its ack is
//!   redelivered after `ack_wait`.
//!
//! Either way delivery is at least once and the consumers ([`crate::service`]) make it
//! take effect once. This module owns the loops and the transports; it must not decide
//! what a consumer does with a message, and it never deletes a message.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull, consumer::AckPolicy, AckKind};
use futures::StreamExt;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::error::Error;

/// How long a consumer instance's claim on deliveries lasts before they come due again
/// for the others: longer than handling a batch takes, short enough that the work of an
/// instance that died is picked up within a client's patience.
const CLAIM_FOR: Duration = Duration::from_secs(10);
/// Deliveries one instance claims at a time, so a paused instance holds back few.
const CLAIM_BATCH: i64 = 16;
use crate::ledgers::{self, now_ms, Message};
use crate::service::{consumers, Handled, Orders};

/// Timings of the chain.
#[derive(Debug, Clone)]
pub struct ChainOptions {
    /// How often an idle loop looks again (it is also woken by new work).
    pub poll_interval: Duration,
    /// When frozen work is looked at again (an unfreeze through this process or the
    /// database also makes it due at once).
    pub freeze_recheck: Duration,
    /// First retry delay after a consumer failed; doubles per attempt, up to 30 s.
    pub retry_backoff: Duration,
    /// Messages per relay or consumer round.
    pub batch: i64,
}

impl Default for ChainOptions {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_millis(250),
            freeze_recheck: Duration::from_secs(1),
            retry_backoff: Duration::from_millis(100),
            batch: 100,
        }
    }
}

/// Where the relay publishes and consumers read.
#[derive(Debug, Clone, Default)]
pub enum TransportConfig {
    /// Deliveries in the service's own database.
    #[default]
    InProcess,
    Nats(NatsOptions),
}

/// NATS JetStream settings.
#[derive(Debug, Clone)]
pub struct NatsOptions {
    pub url: String,
    /// The stream holding the outbox topics (created if missing). Default `IDEM_ORDERS`.
    pub stream: String,
    /// Topic `order.paid` is published on `{subject_prefix}.order.paid`. Default
    /// `idem.orders`.
    pub subject_prefix: String,
    /// Durable consumers are named `{durable_prefix}-{consumer}`. Default `idem-orders`.
    pub durable_prefix: String,
    /// Redelivery of a message whose consumer never acked it. Default 30 s.
    pub ack_wait: Duration,
    /// JetStream's duplicate window on `Nats-Msg-Id`. Default 2 min.
    pub duplicate_window: Duration,
    /// A private CA (PEM) the server's certificate is checked against, besides the
    /// Mozilla roots. A `tls://` URL requires TLS.
    pub ca_file: Option<std::path::PathBuf>,
}

impl NatsOptions {
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            stream: "IDEM_ORDERS".into(),
            subject_prefix: "idem.orders".into(),
            durable_prefix: "idem-orders".into(),
            ack_wait: Duration::from_secs(30),
            duplicate_window: Duration::from_secs(120),
            ca_file: None,
        }
    }

    pub fn subject(&self, topic: &str) -> String {
        format!("{}.{topic}", self.subject_prefix)
    }
}

/// A connected JetStream transport.
#[derive(Clone)]
pub struct Nats {
    js: jetstream::Context,
    stream: jetstream::stream::Stream,
    options: NatsOptions,
}

impl std::fmt::Debug for Nats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nats")
            .field("stream", &self.options.stream)
            .finish_non_exhaustive()
    }
}

fn nats_err(e: impl std::fmt::Display) -> Error {
    Error::Transport(e.to_string())
}

/// What a publish found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    pub sequence: u64,
    /// JetStream had seen this `Nats-Msg-Id` within its duplicate window.
    pub duplicate: bool,
}

/// Connects within 5 s, retrying; a failure reports the last attempt's cause (a TLS
/// failure by its step), not only that time ran out.
async fn connect_client(options: &NatsOptions) -> Result<async_nats::Client, Error> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut connect = async_nats::ConnectOptions::new();
        if let Some(ca) = &options.ca_file {
            if let Err(e) = std::fs::metadata(ca) {
                return Err(Error::InvalidInput(format!(
                    "reading the NATS CA file {}: {e}",
                    ca.display()
                )));
            }
            // A CA file means TLS: never fall back to plain text with one.
            connect = connect.add_root_certificates(ca.clone()).require_tls(true);
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let (why, permanent) = match tokio::time::timeout(left, connect.connect(&options.url)).await
        {
            Ok(Ok(client)) => return Ok(client),
            // A certificate refused now is refused on every retry.
            Ok(Err(e)) => match idem_net::tls::describe_failure(&e) {
                Some(tls) => (tls, true),
                None => (e.to_string(), false),
            },
            Err(_) => ("did not answer".to_string(), false),
        };
        if permanent || tokio::time::Instant::now() + Duration::from_millis(250) >= deadline {
            return Err(Error::Unavailable(format!(
                "NATS at {}: {why}",
                crate::db::redact(&options.url)
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

impl Nats {
    /// Connects and creates the stream if missing.
    pub async fn connect(options: NatsOptions) -> Result<Self, Error> {
        let client = connect_client(&options).await?;
        let js = jetstream::new(client);
        let stream = js
            .get_or_create_stream(jetstream::stream::Config {
                name: options.stream.clone(),
                subjects: vec![format!("{}.>", options.subject_prefix)],
                duplicate_window: options.duplicate_window,
                ..Default::default()
            })
            .await
            .map_err(nats_err)?;
        Ok(Self {
            js,
            stream,
            options,
        })
    }

    pub fn options(&self) -> &NatsOptions {
        &self.options
    }

    pub fn context(&self) -> &jetstream::Context {
        &self.js
    }

    /// Publishes `message` with `Nats-Msg-Id` = its id and waits for JetStream's ack.
    pub async fn publish(&self, message: &Message) -> Result<Published, Error> {
        self.send(message).await?.await
    }

    /// Sends `message` and returns the wait for JetStream's ack, so a batch can be sent
    /// in order and its acks awaited together.
    async fn send(
        &self,
        message: &Message,
    ) -> Result<impl std::future::Future<Output = Result<Published, Error>>, Error> {
        let body = serde_json::to_vec(message).map_err(nats_err)?;
        let ack = self
            .js
            .send_publish(
                self.options.subject(&message.topic),
                jetstream::message::PublishMessage::build()
                    .payload(body.into())
                    .message_id(&message.message_id),
            )
            .await
            .map_err(nats_err)?;
        Ok(async move {
            let ack = ack.await.map_err(nats_err)?;
            Ok(Published {
                sequence: ack.sequence,
                duplicate: ack.duplicate,
            })
        })
    }

    async fn consumer(
        &self,
        consumer: &str,
        topic: &str,
    ) -> Result<jetstream::consumer::Consumer<pull::Config>, Error> {
        let durable = format!("{}-{consumer}", self.options.durable_prefix);
        self.stream
            .get_or_create_consumer(
                &durable,
                pull::Config {
                    durable_name: Some(durable.clone()),
                    filter_subject: self.options.subject(topic),
                    ack_policy: AckPolicy::Explicit,
                    ack_wait: self.options.ack_wait,
                    ..Default::default()
                },
            )
            .await
            .map_err(nats_err)
    }
}

/// The relay and the consumers over one transport.
#[derive(Clone)]
pub struct Chain {
    orders: Orders,
    options: ChainOptions,
    nats: Option<Nats>,
    /// One wake-up per consumer (in-process deliveries queued).
    wake: Arc<[(&'static str, Notify); 3]>,
}

/// The running loops; [`ChainHandle::stop`] ends them.
pub struct ChainHandle {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl ChainHandle {
    /// Stops every loop after its current message and waits for them.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

impl Chain {
    pub async fn new(
        orders: Orders,
        transport: TransportConfig,
        options: ChainOptions,
    ) -> Result<Self, Error> {
        let nats = match transport {
            TransportConfig::InProcess => None,
            TransportConfig::Nats(o) => Some(Nats::connect(o).await?),
        };
        Ok(Self {
            orders,
            options,
            nats,
            wake: Arc::new(consumers::SUBSCRIPTIONS.map(|(consumer, _)| (consumer, Notify::new()))),
        })
    }

    pub fn transport(&self) -> &'static str {
        if self.nats.is_some() {
            "nats"
        } else {
            "in_process"
        }
    }

    pub fn nats(&self) -> Option<&Nats> {
        self.nats.as_ref()
    }

    /// Publishes what the outbox holds unpublished. Returns how many were published.
    pub async fn relay_once(&self) -> Result<usize, Error> {
        let db = self.orders.database();
        let metrics = self.orders.metrics();
        match &self.nats {
            None => {
                let now = now_ms();
                let mut tx = db.begin().await?;
                let mut c = tx.conn();
                let batch = ledgers::lock_unpublished(&mut c, self.options.batch).await?;
                if batch.is_empty() {
                    return Ok(0);
                }
                for m in &batch {
                    for consumer in consumers::of_topic(&m.topic) {
                        ledgers::enqueue_delivery(&mut c, consumer, &m.message_id, now).await?;
                    }
                    ledgers::mark_published(&mut c, &m.message_id, now).await?;
                }
                tx.commit().await?;
                for _ in &batch {
                    metrics.published("in_process");
                }
                for (_, notify) in self.wake.iter() {
                    notify.notify_one();
                }
                Ok(batch.len())
            }
            Some(nats) => {
                // The batch stays locked (and skipped by the other relays) while it is
                // sent, in order, and its acks awaited together.
                let mut tx = db.begin().await?;
                let batch = ledgers::lock_unpublished(&mut tx.conn(), self.options.batch).await?;
                if batch.is_empty() {
                    return Ok(0);
                }
                let mut acks = Vec::with_capacity(batch.len());
                for m in &batch {
                    acks.push(nats.send(m).await);
                }
                let mut published = 0;
                let mut failure = None;
                for (m, ack) in batch.iter().zip(acks) {
                    let ack = match ack {
                        Ok(wait) => wait.await,
                        Err(e) => Err(e),
                    };
                    match ack {
                        Ok(ack) => {
                            if ack.duplicate {
                                tracing::info!(message = %m.message_id, "JetStream dropped a duplicate publish");
                            }
                            ledgers::mark_published(&mut tx.conn(), &m.message_id, now_ms())
                                .await?;
                            published += 1;
                        }
                        Err(e) => {
                            tracing::warn!(message = %m.message_id, error = %e, "publish failed; will retry");
                            ledgers::count_publish_failure(&mut tx.conn(), &m.message_id).await?;
                            failure.get_or_insert(e);
                        }
                    }
                }
                tx.commit().await?;
                for _ in 0..published {
                    metrics.published("nats");
                }
                match failure {
                    Some(e) if published == 0 => Err(e),
                    _ => Ok(published),
                }
            }
        }
    }

    /// Runs `consumer` over its due in-process deliveries. Returns how many it settled.
    pub async fn deliver_once(&self, consumer: &'static str) -> Result<usize, Error> {
        let db = self.orders.database();
        let due = {
            let now = now_ms();
            let mut tx = db.begin().await?;
            let due = ledgers::claim_deliveries(
                &mut tx.conn(),
                consumer,
                now,
                now + millis(CLAIM_FOR),
                self.options.batch.min(CLAIM_BATCH),
            )
            .await?;
            tx.commit().await?;
            due
        };
        for m in &due {
            let handled = self.orders.handle(consumer, m).await;
            let now = now_ms();
            let settle = match &handled {
                Ok(Handled::Done { .. } | Handled::Duplicate) => Ok(now),
                Ok(Handled::Deferred { what, freeze_id }) => Err((
                    now + millis(self.options.freeze_recheck),
                    format!("frozen: {what} ({freeze_id})"),
                )),
                Err(e) => {
                    tracing::warn!(consumer, message = %m.message_id, error = %e, "consumer failed; will redeliver");
                    Err((now + millis(self.options.retry_backoff), e.to_string()))
                }
            };
            let mut tx = db.begin().await?;
            ledgers::settle_delivery(&mut tx.conn(), consumer, &m.message_id, settle).await?;
            tx.commit().await?;
        }
        Ok(due.len())
    }

    /// Relays and delivers until nothing is due (in process), for tests and the demo.
    /// Frozen work stays queued. Gives up after `max_rounds`.
    pub async fn drain(&self, max_rounds: usize) -> Result<(), Error> {
        for _ in 0..max_rounds {
            let mut moved = self.relay_once().await?;
            if self.nats.is_none() {
                for (consumer, _) in consumers::SUBSCRIPTIONS {
                    moved += self.deliver_once(consumer).await?;
                }
            }
            if moved == 0 {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Starts the relay and the three consumer loops.
    pub fn spawn(self) -> ChainHandle {
        let (stop, stopped) = watch::channel(false);
        let mut tasks = Vec::new();
        let relay = self.clone();
        let mut relay_stop = stopped.clone();
        tasks.push(tokio::spawn(async move {
            relay.run_relay(&mut relay_stop).await;
        }));
        for (consumer, topic) in consumers::SUBSCRIPTIONS {
            let chain = self.clone();
            let mut stop = stopped.clone();
            tasks.push(tokio::spawn(async move {
                match chain.nats.clone() {
                    None => chain.run_in_process(consumer, &mut stop).await,
                    Some(nats) => chain.run_nats(&nats, consumer, topic, &mut stop).await,
                }
            }));
        }
        ChainHandle { stop, tasks }
    }

    async fn run_relay(&self, stop: &mut watch::Receiver<bool>) {
        let mut failures = 0u32;
        loop {
            if *stop.borrow() {
                return;
            }
            let pause = match self.relay_once().await {
                Ok(n) if n > 0 => {
                    failures = 0;
                    continue;
                }
                Ok(_) => self.options.poll_interval,
                Err(e) => {
                    failures += 1;
                    if failures.is_power_of_two() {
                        tracing::warn!(error = %e, failures, "outbox relay round failed");
                    }
                    backoff(self.options.retry_backoff, failures)
                }
            };
            tokio::select! {
                _ = self.orders.outbox_written().notified() => {}
                _ = tokio::time::sleep(pause) => {}
                _ = stop.changed() => return,
            }
        }
    }

    async fn run_in_process(&self, consumer: &'static str, stop: &mut watch::Receiver<bool>) {
        let notify = &self
            .wake
            .iter()
            .find(|(c, _)| *c == consumer)
            .expect("a wake-up per consumer")
            .1;
        loop {
            if *stop.borrow() {
                return;
            }
            match self.deliver_once(consumer).await {
                Ok(n) if n > 0 => continue,
                Ok(_) => {}
                Err(e) => tracing::warn!(consumer, error = %e, "delivery round failed"),
            }
            tokio::select! {
                _ = notify.notified() => {}
                _ = tokio::time::sleep(self.options.poll_interval) => {}
                _ = stop.changed() => return,
            }
        }
    }

    async fn run_nats(
        &self,
        nats: &Nats,
        consumer: &'static str,
        topic: &'static str,
        stop: &mut watch::Receiver<bool>,
    ) {
        let mut failures = 0u32;
        loop {
            if *stop.borrow() {
                return;
            }
            let result = self.consume_nats(nats, consumer, topic, stop).await;
            if *stop.borrow() {
                return;
            }
            failures += 1;
            if let Err(e) = result {
                tracing::warn!(consumer, error = %e, "NATS consumer stopped; reconnecting");
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff(self.options.retry_backoff, failures)) => {}
                _ = stop.changed() => return,
            }
        }
    }

    async fn consume_nats(
        &self,
        nats: &Nats,
        consumer: &'static str,
        topic: &'static str,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<(), Error> {
        let pull = nats.consumer(consumer, topic).await?;
        let mut messages = pull.messages().await.map_err(nats_err)?;
        loop {
            let next = tokio::select! {
                next = messages.next() => next,
                _ = stop.changed() => return Ok(()),
            };
            let Some(next) = next else {
                return Err(Error::Transport("message stream ended".into()));
            };
            let delivery = next.map_err(nats_err)?;
            let message: Message = match serde_json::from_slice(&delivery.payload) {
                Ok(m) => m,
                Err(e) => {
                    // Not ours to interpret: stop its redelivery, keep the evidence in logs.
                    tracing::error!(consumer, error = %e, "undecodable message; terminating it");
                    delivery.ack_with(AckKind::Term).await.map_err(nats_err)?;
                    continue;
                }
            };
            match self.orders.handle(consumer, &message).await {
                Ok(Handled::Done { .. } | Handled::Duplicate) => {
                    delivery.ack().await.map_err(nats_err)?;
                }
                Ok(Handled::Deferred { .. }) => {
                    delivery
                        .ack_with(AckKind::Nak(Some(self.options.freeze_recheck)))
                        .await
                        .map_err(nats_err)?;
                }
                Err(Error::InjectedFault(what)) => {
                    // A crash between the commit and the ack: no ack, no nak. JetStream
                    // redelivers after ack_wait.
                    tracing::warn!(consumer, message = %message.message_id, what, "not acking");
                }
                Err(e) => {
                    tracing::warn!(consumer, message = %message.message_id, error = %e, "consumer failed; nak");
                    delivery
                        .ack_with(AckKind::Nak(Some(self.options.retry_backoff)))
                        .await
                        .map_err(nats_err)?;
                }
            }
        }
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn backoff(base: Duration, failures: u32) -> Duration {
    base.saturating_mul(1 << failures.min(8))
        .min(Duration::from_secs(30))
}
