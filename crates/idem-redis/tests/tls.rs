//! `rediss://` against a `redis-server` this test starts on a side port with TLS only,
//! its certificate signed by a CA the test generates. A client given that CA works the
//! store end to end; one without it is refused, and the error says why.

use std::process::Command;
use std::time::Duration;

use idem_conformance::{fresh_tenant, request, result};
use idem_core::{Claim, IdempotencyStore, RecordState};
use idem_net::testing::{free_port, Spawned, TestPki};
use idem_redis::{RedisOptions, RedisStore};

/// A TLS-only `redis-server`, killed on drop.
struct TlsRedis {
    server: Spawned,
    pki: TestPki,
}

/// `None` after a visible skip when `redis-server` is not installed.
fn start() -> Option<TlsRedis> {
    let pki = TestPki::new();
    let port = free_port();
    let mut command = Command::new("redis-server");
    command
        .args([
            "--port",
            "0",
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--tls-port")
        .arg(port.to_string())
        .arg("--tls-cert-file")
        .arg(&pki.cert)
        .arg("--tls-key-file")
        .arg(&pki.key)
        .arg("--tls-ca-cert-file")
        .arg(&pki.ca)
        .args(["--tls-auth-clients", "no"])
        .arg("--dir")
        .arg(pki.dir());
    match Spawned::start(command, port) {
        Ok(server) => Some(TlsRedis { server, pki }),
        Err(e) => {
            idem_conformance::skip_or_fail("redis-server (to start with TLS)", &e);
            None
        }
    }
}

fn options(ca: Option<std::path::PathBuf>) -> RedisOptions {
    {
        let mut o = RedisOptions::default();
        o.prefix = format!("idem-tls-{}", uuid::Uuid::now_v7().simple());
        o.connect_timeout = Duration::from_secs(3);
        o.response_timeout = Duration::from_secs(3);
        o.ca_file = ca;
        o
    }
}

#[tokio::test]
async fn rediss_with_the_servers_ca_runs_the_store() {
    let Some(server) = start() else {
        return;
    };
    let url = format!("rediss://127.0.0.1:{}", server.server.port);
    let store = RedisStore::connect(&url, options(Some(server.pki.ca.clone())))
        .await
        .expect("rediss:// with the CA connects");
    let t = fresh_tenant();
    let req = request(&t, "tls-1", "p", "a");
    let token = match store.claim(&req).await.unwrap() {
        Claim::Proceed(t) => t,
        other => panic!("expected proceed, got {other:?}"),
    };
    store.complete(&token, result("over TLS")).await.unwrap();
    let record = store.get(&req.scope).await.unwrap().expect("the record");
    assert_eq!(record.state, RecordState::Succeeded);
    match store.claim(&req).await.unwrap() {
        Claim::Replay(r) => assert_eq!(r.result.expect("a result").body, b"over TLS"),
        other => panic!("expected a replay, got {other:?}"),
    }
}

#[tokio::test]
async fn rediss_without_the_ca_is_refused_with_the_reason() {
    let Some(server) = start() else {
        return;
    };
    let url = format!("rediss://127.0.0.1:{}", server.server.port);
    let e = RedisStore::connect(&url, options(None))
        .await
        .expect_err("a certificate from an unknown CA");
    let text = e.to_string();
    assert!(
        text.contains("TLS certificate verification failed"),
        "{text}"
    );
    // Plain redis:// to a TLS-only port never gets an answer it understands.
    let plain = format!("redis://127.0.0.1:{}", server.server.port);
    assert!(RedisStore::connect(&plain, options(None)).await.is_err());
    // A CA file is only for rediss://, and a missing one is named.
    let e = RedisStore::connect(&plain, options(Some(server.pki.ca.clone())))
        .await
        .expect_err("a CA file with redis://");
    assert!(e.to_string().contains("rediss://"), "{e}");
    let e = RedisStore::connect(&url, options(Some("/nonexistent/ca.pem".into())))
        .await
        .expect_err("a missing CA file");
    assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
}
