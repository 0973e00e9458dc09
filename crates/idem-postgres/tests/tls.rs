//! TLS to PostgreSQL: `sslmode` and `sslrootcert` in the URL, against the test server
//! (TLS on, with a self-signed certificate for `localhost`). A failure says which step
//! failed and what to do about it.

mod common;

use std::path::Path;
use std::time::Duration;

use idem_postgres::{PgOptions, PgStore};
use sqlx::{Connection, PgConnection};

/// The test server's own certificate, self-signed for `localhost`, as the trust anchor.
const SERVER_CERT: &str = "/etc/ssl/certs/ssl-cert-snakeoil.pem";

fn with_params(url: &str, params: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}

fn options() -> PgOptions {
    {
        let mut o = PgOptions::default();
        o.max_connections = 1;
        o.acquire_timeout = Duration::from_secs(5);
        o
    }
}

/// The server's URL when it is reachable and has TLS on; `None` after a visible skip.
async fn tls_server() -> Option<String> {
    let url = common::url();
    let mut conn = match PgConnection::connect(&url).await {
        Ok(c) => c,
        Err(e) => {
            idem_conformance::skip_or_fail("PostgreSQL", &e);
            return None;
        }
    };
    let ssl: String = sqlx::query_scalar("SHOW ssl")
        .fetch_one(&mut conn)
        .await
        .expect("SHOW ssl");
    let _ = conn.close().await;
    if ssl != "on" {
        idem_conformance::skip_or_fail("PostgreSQL with TLS on", &"ssl = off");
        return None;
    }
    Some(url)
}

async fn connect_err(url: &str) -> String {
    match PgStore::connect(url, options()).await {
        Ok(_) => panic!("{url} connected"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn sslmode_require_encrypts_the_connection() {
    let Some(url) = tls_server().await else {
        return;
    };
    let store = PgStore::connect(&with_params(&url, "sslmode=require"), options())
        .await
        .expect("sslmode=require connects");
    let (ssl, version): (bool, Option<String>) =
        sqlx::query_as("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert!(ssl, "the session is not encrypted");
    assert!(version.is_some_and(|v| v.starts_with("TLS")));
}

#[tokio::test]
async fn verify_full_refuses_an_untrusted_certificate_and_says_why() {
    let Some(url) = tls_server().await else {
        return;
    };
    // No CA given: the self-signed certificate chains to none of the known roots.
    let e = connect_err(&with_params(&url, "sslmode=verify-full")).await;
    assert!(e.contains("TLS certificate verification failed"), "{e}");
    assert!(e.contains("CA file"), "{e}");
    assert!(!e.contains("without TLS support"), "{e}");
}

#[tokio::test]
async fn verify_full_checks_the_host_name_against_the_certificate() {
    let Some(url) = tls_server().await else {
        return;
    };
    if !Path::new(SERVER_CERT).exists() {
        idem_conformance::skip_or_fail("the server's certificate file", &SERVER_CERT);
        return;
    }
    let trusted = format!("sslmode=verify-full&sslrootcert={SERVER_CERT}");
    // Trusted, but issued for `localhost`, not for the address connected to.
    let by_address = with_params(&url.replace("@localhost", "@127.0.0.1"), &trusted);
    let e = connect_err(&by_address).await;
    assert!(e.contains("does not name the host"), "{e}");
    // Trusted and issued for the name connected to: verified.
    let by_name = with_params(&url.replace("@127.0.0.1", "@localhost"), &trusted);
    let store = PgStore::connect(&by_name, options())
        .await
        .expect("verify-full with the server's CA connects by its name");
    let ssl: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(ssl);
    // verify-ca checks the chain only, so the address works there.
    let ca_only = with_params(
        &url.replace("@localhost", "@127.0.0.1"),
        &format!("sslmode=verify-ca&sslrootcert={SERVER_CERT}"),
    );
    PgStore::connect(&ca_only, options())
        .await
        .expect("verify-ca with the server's CA connects by address");
}

#[tokio::test]
async fn a_missing_root_certificate_file_is_named() {
    let Some(url) = tls_server().await else {
        return;
    };
    let e = connect_err(&with_params(
        &url,
        "sslmode=verify-full&sslrootcert=/nonexistent/idem-ca.pem",
    ))
    .await;
    assert!(e.contains("/nonexistent/idem-ca.pem"), "{e}");
}
