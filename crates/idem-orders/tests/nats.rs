//! The outbox relay and consumers over NATS JetStream (`nats://127.0.0.1:4222`, or
//! `IDEM_TEST_NATS_URL`): `Nats-Msg-Id` is the message id, so JetStream drops a second
//! publish of one message; a consumer that crashes before its ack is redelivered after
//! `ack_wait`; a redelivery with another id is absorbed by the consumer. Exactly one
//! ticket. Every test uses its own stream and subjects and deletes them.

#[macro_use]
mod common;

use std::time::Duration;

use async_nats::jetstream;
use common::{Env, T1};
use futures::FutureExt;
use idem_orders::chain::Nats;
use idem_orders::{Faults, NatsOptions};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

on_both_stores!(nats_transport_makes_one_ticket);

fn nats_url() -> String {
    std::env::var("IDEM_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

/// Options for a stream of this test's own; `None` (after `skip_or_fail`) without NATS
/// JetStream. The probe creates the stream the test then uses.
async fn nats_options() -> Option<NatsOptions> {
    let id = uuid::Uuid::now_v7().simple().to_string();
    let mut o = NatsOptions::new(nats_url());
    o.stream = format!("IDEM_ORDERS_T_{id}");
    o.subject_prefix = format!("idem_orders_t_{id}");
    o.durable_prefix = format!("t-{id}");
    o.ack_wait = Duration::from_secs(1);
    match Nats::connect(o.clone()).await {
        Ok(_) => Some(o),
        Err(e) => {
            idem_conformance::skip_or_fail("NATS JetStream", &e);
            None
        }
    }
}

async fn delete_stream(options: &NatsOptions) {
    let client = async_nats::connect(&options.url).await.expect("connect");
    let js = jetstream::new(client);
    js.delete_stream(&options.stream)
        .await
        .expect("delete the test stream");
}

async fn nats_transport_makes_one_ticket(env: Env) {
    let Some(nats) = nats_options().await else {
        return;
    };
    let s = env
        .start_with(|c| {
            c.options.nats = Some(nats.clone());
            c.options.orders.faults = Faults {
                ticket_issuer_crashes_after_issue: 1,
                ..Faults::default()
            };
        })
        .await;
    let result = async {
        let id = s.create(T1, "n-1", "U-n", "S-204", 1).await.order_id();
        assert_eq!(
            s.post(
                &format!("/v1/orders/{id}/pay"),
                T1,
                Some("n-pay"),
                &json!({})
            )
            .await
            .status,
            200
        );
        // The issuer crashes after its commit and does not ack; JetStream redelivers
        // after ack_wait and the second run finds the key processed.
        // The relay marks a message published after JetStream acks it, which can
        // trail the consumer that already issued the ticket.
        let published = |view: &serde_json::Value, topic: &str| {
            view["messages"].as_array().is_some_and(|ms| {
                ms.iter()
                    .any(|m| m["topic"] == topic && m["published_at"].is_string())
            })
        };
        s.wait_order(
            T1,
            &id,
            WAIT,
            "ticketed, order.created and order.paid published",
            |v| {
                v["status"] == "ticketed"
                    && published(v, "order.created")
                    && published(v, "order.paid")
            },
        )
        .await;
        let orders = s.server.orders().clone();
        let transport = s.server.chain().nats().expect("NATS transport").clone();
        let paid = orders
            .messages("t1", &id)
            .await
            .unwrap()
            .into_iter()
            .find(|m| m.topic == "order.paid")
            .unwrap();
        // The relay publishing the same message again: JetStream's window drops it.
        let again = transport.publish(&paid).await.unwrap();
        assert!(again.duplicate, "Nats-Msg-Id deduplicated");
        // A redelivery JetStream cannot recognise (another id): the consumer absorbs it.
        transport
            .context()
            .send_publish(
                nats.subject("order.paid"),
                jetstream::message::PublishMessage::build()
                    .payload(serde_json::to_vec(&paid).unwrap().into())
                    .message_id(format!("{}-replayed", paid.message_id)),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let m = s.metrics().await;
            let duplicates = m
                .lines()
                .find(|l| l.starts_with("idem_orders_deliveries_total{consumer=\"ticket-issuer\",result=\"duplicate\"}"))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
            if duplicates >= 2 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "redeliveries not seen:\n{m}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            orders.counts("t1").await.unwrap().tickets,
            1,
            "exactly one ticket"
        );
    };
    let outcome = std::panic::AssertUnwindSafe(result).catch_unwind().await;
    s.shutdown().await;
    delete_stream(&nats).await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}
