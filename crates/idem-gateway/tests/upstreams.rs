//! A gateway fronting several upstreams: one that stops answering or refuses
//! connections is routed around and ejected; the others keep answering.

mod common;

use common::{client, config, fresh, order, stub};

/// Accepts connections and never answers: an upstream paused mid-flight (a long GC
/// pause, SIGSTOP), as the gateway sees it.
async fn silent() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    (url, task)
}

/// The test gateway configuration, fronting `upstreams`.
fn fronting(upstreams: &[&str]) -> idem_gateway::GatewayConfig {
    let mut cfg = config("");
    cfg.upstream.clear();
    cfg.upstreams = upstreams.iter().map(|u| u.to_string()).collect();
    cfg
}

async fn get(c: &reqwest::Client, url: String) -> reqwest::Response {
    c.get(url).send().await.unwrap()
}

/// A port nothing listens on.
fn refused() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", l.local_addr().unwrap())
}

#[tokio::test]
async fn a_silent_upstream_is_ejected_and_every_key_completes_on_the_other() {
    let up = stub().await;
    let (dead, _task) = silent().await;
    let mut cfg = fronting(&[&dead, &up.url()]);
    cfg.upstream_timeout_ms = 300;
    cfg.upstream_health.eject_ms = 60_000;
    let gw = idem_gateway::start(cfg).await.unwrap();
    let c = client();
    let keys: Vec<String> = (0..12).map(|_| fresh("fleet")).collect();
    for key in &keys {
        let r = order(&c, &gw.url(), key, "{}").send().await.unwrap();
        assert_eq!(r.status(), 201, "{key}");
    }
    for key in &keys {
        assert_eq!(up.state.executions(key), 1, "{key}");
    }
    let m = gw.metrics();
    assert_eq!(m.upstream_ejections(&dead), 1);
    assert_eq!(m.upstreams_healthy(), 1);
    // Ejected after its third timeout: nothing new goes there.
    assert_eq!(m.upstream_requests(&dead), 3);
    assert_eq!(m.uncertain_results(), 3);
    let health: serde_json::Value = get(&c, format!("{}/_idem/health", gw.url()))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(health["upstreams"], 2);
    assert_eq!(health["upstreams_healthy"], 1);
    assert_eq!(health["upstreams_ejected"], serde_json::json!([dead]));
    let text = get(&c, format!("{}/_idem/metrics", gw.url()))
        .await
        .text()
        .await
        .unwrap();
    assert!(
        text.contains(&format!(
            "idem_gateway_upstream_ejections_total{{upstream=\"{dead}\"}} 1"
        )),
        "{text}"
    );
    assert!(text.contains("idem_gateway_upstreams_healthy 1"), "{text}");
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn a_refused_connection_goes_to_the_next_upstream_at_once() {
    let up = stub().await;
    let dead = refused();
    let gw = idem_gateway::start(fronting(&[&dead, &up.url()]))
        .await
        .unwrap();
    let c = client();
    for _ in 0..6 {
        let key = fresh("refused");
        let r = order(&c, &gw.url(), &key, "{}").send().await.unwrap();
        assert_eq!(r.status(), 201, "never sent, so tried on the other");
        assert_eq!(up.state.executions(&key), 1);
    }
    assert_eq!(gw.metrics().upstream_ejections(&dead), 1);
    // Pass-through bodies stream, so they are not retried: with the refusing upstream
    // ejected they all go to the other one.
    for _ in 0..4 {
        let r = get(&c, format!("{}/ping", gw.url())).await;
        assert_eq!(r.status(), 200);
    }
    gw.stop().await.unwrap();
}

/// Answers every request with 503 and closes the connection.
async fn unavailable() -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = socket
                    .write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
            });
        }
    });
    url
}

#[tokio::test]
async fn a_5xx_is_an_answer_and_no_answer_is_a_failure() {
    let busy = unavailable().await;
    let dead = refused();
    let mut cfg = fronting(&[&busy, &dead]);
    cfg.upstream_health.consecutive_failures = 1;
    cfg.upstream_health.eject_ms = 60_000;
    let gw = idem_gateway::start(cfg).await.unwrap();
    let c = client();
    let mut statuses = Vec::new();
    for _ in 0..6 {
        let r = get(&c, format!("{}/ping", gw.url())).await;
        statuses.push(r.status().as_u16());
    }
    // Idle upstreams take turns: the busy one, then the refusing one (502, not sent;
    // pass-through bodies stream, so it is not retried) and out; the busy one after.
    assert_eq!(statuses, [503, 502, 503, 503, 503, 503]);
    let m = gw.metrics();
    assert_eq!(m.upstream_ejections(&busy), 0, "it answered");
    assert_eq!(m.upstream_ejections(&dead), 1);
    assert_eq!(m.upstreams_healthy(), 1);
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn with_every_upstream_ejected_requests_go_to_the_one_back_first() {
    let (first, second) = (refused(), refused());
    let mut cfg = fronting(&[&first, &second]);
    cfg.upstream_health.consecutive_failures = 1;
    cfg.upstream_health.eject_ms = 60_000;
    let gw = idem_gateway::start(cfg).await.unwrap();
    let c = client();
    // Not sent on the first, then not sent on the second: both out, the first earlier.
    let r = order(&c, &gw.url(), &fresh("all-out"), "{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    let m = gw.metrics();
    assert_eq!(m.upstreams_healthy(), 0);
    assert_eq!(
        (m.upstream_requests(&first), m.upstream_requests(&second)),
        (1, 1)
    );
    for _ in 0..3 {
        let r = order(&c, &gw.url(), &fresh("all-out"), "{}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 502, "forwarded, not refused by the gateway");
    }
    assert_eq!(
        (m.upstream_requests(&first), m.upstream_requests(&second)),
        (4, 4),
        "the first, whose ejection ends first, then the other (not sent)"
    );
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn each_upstream_gets_its_own_host() {
    let a = stub().await;
    let b = stub().await;
    let gw = idem_gateway::start(fronting(&[&a.url(), &b.url()]))
        .await
        .unwrap();
    let c = client();
    let mut hosts = std::collections::BTreeSet::new();
    for _ in 0..4 {
        let v: serde_json::Value = c
            .get(format!("{}/echo", gw.url()))
            .header("host", "public.example")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(v["headers"]["x-forwarded-host"], "public.example", "{v}");
        hosts.insert(v["headers"]["host"].as_str().unwrap().to_string());
    }
    let want: std::collections::BTreeSet<String> = [&a, &b]
        .iter()
        .map(|s| s.url().trim_start_matches("http://").to_string())
        .collect();
    assert_eq!(hosts, want, "idle upstreams take turns, each named in Host");
    gw.stop().await.unwrap();
}
