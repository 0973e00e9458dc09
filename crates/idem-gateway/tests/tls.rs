//! The gateway over TLS on both sides: it serves HTTPS with a certificate file and key,
//! and reaches an `https://` upstream whose certificate chains to a private CA it is
//! given. Without that CA the upstream is refused and the caller learns nothing sent.

mod common;

use std::time::Duration;

use common::{config, order, T1_KEY};
use idem_net::testing::TestPki;

fn https_client(pki: &TestPki) -> reqwest::Client {
    let ca = std::fs::read(&pki.ca).unwrap();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .tls_certs_only([reqwest::Certificate::from_pem(&ca).unwrap()])
        .build()
        .unwrap()
}

async fn https_stub(pki: &TestPki) -> idem_stub::Stub {
    let tls = idem_net::tls::acceptor(&pki.cert, &pki.key).unwrap();
    idem_stub::Stub::start_tls("x-idem-tenant", tls)
        .await
        .unwrap()
}

#[tokio::test]
async fn https_in_front_of_an_https_upstream() {
    let pki = TestPki::new();
    let upstream = https_stub(&pki).await;
    assert!(upstream.url().starts_with("https://localhost:"));
    let mut c = config(&upstream.url());
    c.upstream_ca_file = Some(pki.ca.clone());
    c.tls_cert_file = Some(pki.cert.clone());
    c.tls_key_file = Some(pki.key.clone());
    let gw = idem_gateway::start(c).await.unwrap();
    let base = format!("https://localhost:{}", gw.addr.port());
    assert!(gw.url().starts_with("https://"));
    let client = https_client(&pki);

    let first = order(&client, &base, "tls-k1", r#"{"sku":"a"}"#)
        .send()
        .await
        .expect("HTTPS through the gateway");
    assert_eq!(first.status(), 201);
    let first_body = first.text().await.unwrap();
    let again = order(&client, &base, "tls-k1", r#"{"sku":"a"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 201);
    assert_eq!(again.text().await.unwrap(), first_body, "replayed over TLS");
    assert_eq!(upstream.state.executions("tls-k1"), 1);
    // Later keys go out on the kept TLS connection (its session tickets read while it
    // waited idle must not count as the upstream closing it).
    for key in ["tls-k2", "tls-k3"] {
        let r = order(&client, &base, key, r#"{"sku":"b"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "{key}");
        assert_eq!(upstream.state.executions(key), 1);
    }

    // Plain HTTP to the TLS listener gets no HTTP answer.
    let plain = common::client()
        .get(format!("http://127.0.0.1:{}/v1/anything", gw.addr.port()))
        .header("x-api-key", T1_KEY)
        .send()
        .await;
    assert!(plain.is_err(), "{plain:?}");
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn an_upstream_signed_by_an_unknown_ca_is_never_sent_to() {
    let pki = TestPki::new();
    let upstream = https_stub(&pki).await;
    // No CA for the upstream: its certificate chains to nothing the gateway trusts.
    let gw = idem_gateway::start(config(&upstream.url())).await.unwrap();
    let client = common::client();
    let r = order(&client, &gw.url(), "tls-k2", r#"{"sku":"a"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502, "{:?}", r.text().await);
    assert_eq!(upstream.state.total_calls(), 0);
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn half_a_certificate_pair_is_a_configuration_error() {
    let pki = TestPki::new();
    let mut c = config("http://127.0.0.1:9");
    c.tls_cert_file = Some(pki.cert.clone());
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("key file"), "{e}");
    let mut c = config("http://127.0.0.1:9");
    c.tls_cert_file = Some(pki.dir().join("missing.pem"));
    c.tls_key_file = Some(pki.key.clone());
    let Err(e) = idem_gateway::start(c).await else {
        panic!("started with a missing certificate file");
    };
    let e = e.to_string();
    assert!(e.contains("missing.pem"), "{e}");
}
