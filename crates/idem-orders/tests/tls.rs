//! `idem serve` over HTTPS: the service and its metrics listener serve TLS with a
//! certificate file and key; a client trusting the CA reaches both, plain HTTP does not.

use std::time::Duration;

use idem_net::testing::TestPki;
use idem_orders::ServeConfig;

#[tokio::test]
async fn the_service_and_its_metrics_listener_serve_https() {
    let pki = TestPki::new();
    let dir = tempfile::tempdir().unwrap();
    let server = idem_orders::bind(ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        database_url: Some(format!("sqlite://{}", dir.path().join("tls.db").display())),
        tls: Some(idem_net::tls::CertFiles {
            cert: pki.cert.clone(),
            key: pki.key.clone(),
        }),
        options: idem_orders::ServiceOptions {
            metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
            ..Default::default()
        },
        ..ServeConfig::default()
    })
    .await
    .expect("serve with TLS");
    assert!(server.url().starts_with("https://"), "{}", server.url());
    let ca = std::fs::read(&pki.ca).unwrap();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .tls_certs_only([reqwest::Certificate::from_pem(&ca).unwrap()])
        .build()
        .unwrap();
    let port = server.addr().port();
    let live = client
        .get(format!("https://localhost:{port}/livez"))
        .send()
        .await
        .expect("HTTPS request");
    assert_eq!(live.status(), 200);
    let metrics = server.metrics_addr().expect("metrics listener").port();
    let scraped = client
        .get(format!("https://localhost:{metrics}/metrics"))
        .send()
        .await
        .expect("HTTPS metrics");
    assert_eq!(scraped.status(), 200);
    assert!(scraped
        .text()
        .await
        .unwrap()
        .contains("idem_http_requests_total"));
    // Plain HTTP to the TLS port gets no HTTP answer.
    let plain = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/livez"))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(plain.is_err(), "{plain:?}");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_bad_certificate_file_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::new();
    let Err(e) = idem_orders::bind(ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        database_url: Some(format!("sqlite://{}", dir.path().join("bad.db").display())),
        tls: Some(idem_net::tls::CertFiles {
            cert: pki.key.clone(),
            key: pki.key.clone(),
        }),
        ..ServeConfig::default()
    })
    .await
    else {
        panic!("a key file served as the certificate");
    };
    assert!(e.to_string().contains("holds no PEM certificate"), "{e}");
}
