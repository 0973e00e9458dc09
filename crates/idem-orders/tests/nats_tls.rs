//! The outbox transport over `tls://`: a `nats-server` with JetStream this test starts on
//! a side port, TLS on with a certificate from a CA the test generates.

use std::process::Command;

use idem_net::testing::{free_port, Spawned, TestPki};
use idem_orders::chain::Nats;
use idem_orders::NatsOptions;

struct TlsNats {
    server: Spawned,
    pki: TestPki,
}

fn start() -> Option<TlsNats> {
    let pki = TestPki::new();
    let port = free_port();
    let mut command = Command::new("nats-server");
    command
        .args(["-a", "127.0.0.1", "-js", "--tls"])
        .arg("-p")
        .arg(port.to_string())
        .arg("-sd")
        .arg(pki.dir().join("jetstream"))
        .arg("--tlscert")
        .arg(&pki.cert)
        .arg("--tlskey")
        .arg(&pki.key);
    match Spawned::start(command, port) {
        Ok(server) => Some(TlsNats { server, pki }),
        Err(e) => {
            idem_conformance::skip_or_fail("nats-server (to start with TLS)", &e);
            None
        }
    }
}

#[tokio::test]
async fn jetstream_over_tls_with_a_private_ca() {
    let Some(server) = start() else {
        return;
    };
    let mut options = NatsOptions::new(format!("tls://localhost:{}", server.server.port));
    options.ca_file = Some(server.pki.ca.clone());
    let nats = Nats::connect(options.clone())
        .await
        .expect("tls:// with the CA connects and creates the stream");
    let ack = nats
        .context()
        .publish(
            format!("{}.order.created", options.subject_prefix),
            "{}".into(),
        )
        .await
        .unwrap()
        .await
        .expect("JetStream acked over TLS");
    assert_eq!(ack.sequence, 1);
}

#[tokio::test]
async fn an_unknown_ca_is_refused_with_the_reason() {
    let Some(server) = start() else {
        return;
    };
    let options = NatsOptions::new(format!("tls://localhost:{}", server.server.port));
    let e = match Nats::connect(options).await {
        Ok(_) => panic!("connected to a server whose CA is unknown"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("TLS certificate verification failed"), "{e}");
    let mut options = NatsOptions::new(format!("tls://localhost:{}", server.server.port));
    options.ca_file = Some(server.pki.dir().join("missing.pem"));
    let Err(e) = Nats::connect(options).await else {
        panic!("connected with a missing CA file");
    };
    assert!(e.to_string().contains("missing.pem"), "{e}");
}
