//! Gateway instances sharing their window through Redis: cross-instance coalescing with
//! pub/sub wake-ups, and what happens when Redis goes away.

mod common;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use common::*;
use futures::future::join_all;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_200_duplicates_one_upstream_execution() {
    let Some(redis) = RedisPrefix::new().await else {
        return;
    };
    let up = stub().await;
    // Long enough for all 200 to pile up behind the first.
    up.state.delay_executions(Duration::from_millis(400));
    let mut cfg = config(&up.url());
    redis.apply(&mut cfg);
    cfg.lease_ms = 10_000;
    let a = idem_gateway::start(cfg.clone()).await.unwrap();
    let b = idem_gateway::start(cfg).await.unwrap();
    let c = client();
    let key = fresh("storm");
    let bases = [a.url(), b.url()];
    let t = Instant::now();
    let results = join_all((0..200).map(|i| {
        let req = order(&c, &bases[i % 2], &key, r#"{"show":"S-204","seats":2}"#);
        async move {
            let r = req.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    }))
    .await;
    let elapsed = t.elapsed();
    assert_eq!(
        up.state.calls(&key),
        1,
        "one upstream call for 200 duplicates"
    );
    assert_eq!(up.state.executions(&key), 1);
    let statuses: HashMap<u16, usize> = results.iter().fold(HashMap::new(), |mut m, r| {
        *m.entry(r.0).or_default() += 1;
        m
    });
    assert_eq!(statuses.get(&201), Some(&200), "{statuses:?}");
    let bodies: HashSet<&str> = results.iter().map(|r| r.1.as_str()).collect();
    assert_eq!(bodies.len(), 1, "every client got the same body");
    // Waiters on the other instance were woken by pub/sub, not by the 10 s lease.
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    let waited: u64 = [&a, &b]
        .iter()
        .map(|g| g.metrics().coalesced_waiters() + g.metrics().window_hits())
        .sum();
    assert!(waited >= 199, "{waited}");
    assert_eq!(up.state.state_queries(), 0);

    // Later duplicates on either instance are window hits.
    for base in &bases {
        let r = order(&c, base, &key, r#"{"seats":2,"show":"S-204"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.headers()["idempotent-replayed"], "true");
        assert_eq!(r.text().await.unwrap(), results[0].1);
    }
    assert_eq!(up.state.calls(&key), 1);
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn different_payload_on_another_instance_is_422_at_once() {
    let Some(redis) = RedisPrefix::new().await else {
        return;
    };
    let up = stub().await;
    up.state.delay_executions(Duration::from_millis(1500));
    let mut cfg = config(&up.url());
    redis.apply(&mut cfg);
    let a = idem_gateway::start(cfg.clone()).await.unwrap();
    let b = idem_gateway::start(cfg).await.unwrap();
    let c = client();
    let key = fresh("mismatch");
    let first = tokio::spawn(order(&c, &a.url(), &key, r#"{"seats":2}"#).send());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let other = order(&c, &b.url(), &key, r#"{"seats":3}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(
        problem(other).await,
        (422, problem_type("idempotency-key-reused"))
    );
    assert!(
        !first.is_finished(),
        "422 must not wait for the first request"
    );
    assert_eq!(first.await.unwrap().unwrap().status(), 201);
    assert_eq!(up.state.calls(&key), 1);
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

/// Sends `dups` concurrent duplicates of each key, spread over the gateways; returns
/// key → (statuses, bodies).
async fn burst(
    c: &reqwest::Client,
    bases: &[String],
    keys: &[String],
    dups: usize,
) -> HashMap<String, (Vec<u16>, HashSet<String>)> {
    let reqs = keys
        .iter()
        .flat_map(|k| (0..dups).map(move |i| (k.clone(), bases[i % bases.len()].clone())));
    let results = join_all(reqs.map(|(k, base)| {
        let req = order(c, &base, &k, r#"{"show":"S-204"}"#);
        async move {
            let r = req.send().await.unwrap();
            (k, r.status().as_u16(), r.text().await.unwrap())
        }
    }))
    .await;
    let mut out: HashMap<String, (Vec<u16>, HashSet<String>)> = HashMap::new();
    for (k, s, b) in results {
        let e = out.entry(k).or_default();
        e.0.push(s);
        e.1.insert(b);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_stopped_mid_test_requests_still_succeed_without_duplicate_execution() {
    let Some(mut redis) = PrivateRedis::start().await else {
        return;
    };
    let up = stub().await;
    up.state.delay_executions(Duration::from_millis(100));
    let mut cfg = config(&up.url());
    cfg.redis_url = Some(redis.url());
    cfg.redis_timeout_ms = 500;
    let a = idem_gateway::start(cfg.clone()).await.unwrap();
    let b = idem_gateway::start(cfg).await.unwrap();
    let bases = [a.url(), b.url()];
    let c = client();

    let before: Vec<String> = (0..10).map(|_| fresh("before")).collect();
    let first = burst(&c, &bases, &before, 6).await;
    for k in &before {
        assert_eq!(up.state.calls(k), 1, "window coalesced {k}");
        assert!(first[k].0.iter().all(|s| *s == 201), "{:?}", first[k].0);
        assert_eq!(first[k].1.len(), 1);
    }
    assert!(!a.metrics().is_degraded() && !b.metrics().is_degraded());

    redis.kill();

    // New intents and retries of old ones, while Redis is gone.
    let during: Vec<String> = (0..10).map(|_| fresh("during")).collect();
    let all: Vec<String> = during.iter().chain(before.iter()).cloned().collect();
    let second = burst(&c, &bases, &all, 6).await;
    for k in &all {
        let (statuses, bodies) = &second[k];
        assert!(statuses.iter().all(|s| *s == 201), "{k}: {statuses:?}");
        assert_eq!(bodies.len(), 1, "{k}: one result");
        assert_eq!(up.state.executions(k), 1, "{k}: executed once");
    }
    for k in &before {
        assert_eq!(
            second[k].1, first[k].1,
            "{k}: the same result as before the outage"
        );
    }
    assert!(a.metrics().is_degraded() && b.metrics().is_degraded());
    assert!(a.metrics().degraded_requests() + b.metrics().degraded_requests() > 0);
    let h: serde_json::Value = c
        .get(format!("{}/_idem/health", a.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(h["status"], "degraded");
    let m = c
        .get(format!("{}/_idem/metrics", a.url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(m.contains("idem_gateway_degraded 1"), "{m}");
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

#[tokio::test]
async fn redis_unreachable_at_start_gateway_still_forwards() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let up = stub().await;
    let mut cfg = config(&up.url());
    cfg.redis_url = Some(format!("redis://127.0.0.1:{dead}"));
    cfg.redis_timeout_ms = 300;
    let gw = idem_gateway::start(cfg).await.unwrap();
    let c = client();
    let key = fresh("no-redis");
    for _ in 0..3 {
        let r = order(&c, &gw.url(), &key, "{}").send().await.unwrap();
        assert_eq!(r.status(), 201);
    }
    assert_eq!(
        up.state.executions(&key),
        1,
        "the business layer guarded the key"
    );
    assert!(gw.metrics().is_degraded());
    assert_eq!(gw.metrics().degraded_requests(), 3);
    gw.stop().await.unwrap();
}

/// A flight whose caller hung up finishes in a task of its own; when it forwards only
/// after that (it waited on another instance's attempt, which ended retryable), the
/// upstream still gets the arrival's request id, captured when the request came in.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flight_forwarding_after_its_caller_hung_up_sends_the_arrival_request_id() {
    let Some(redis) = RedisPrefix::new().await else {
        return;
    };
    // Instance A's upstream accepts connections and never answers.
    let hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hole_addr = hole.local_addr().unwrap();
    let (reached, mut reached_rx) = tokio::sync::mpsc::unbounded_channel();
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((s, _)) = hole.accept().await {
            conns.push(s);
            let _ = reached.send(());
        }
    });
    let up = stub().await;
    let mut a_cfg = config(&format!("http://{hole_addr}"));
    redis.apply(&mut a_cfg);
    a_cfg.upstream_timeout_ms = 1_500;
    a_cfg.state_query.timeout_ms = 200;
    let mut b_cfg = config(&up.url());
    redis.apply(&mut b_cfg);
    let a = idem_gateway::start(a_cfg).await.unwrap();
    let b = idem_gateway::start(b_cfg).await.unwrap();
    let key = fresh("detached-id");
    let echo = |c: &reqwest::Client, base: &str| {
        c.post(format!("{base}/v1/echo"))
            .header("x-api-key", T1_KEY)
            .header("content-type", "application/json")
            .header("idempotency-key", key.as_str())
            .body(r#"{"show":"S-9"}"#)
    };
    let c = client();
    // A claims the key and waits on its silent upstream.
    let first = tokio::spawn(echo(&c, &a.url()).send());
    tokio::time::timeout(Duration::from_secs(5), reached_rx.recv())
        .await
        .expect("A forwards once it holds the key");
    // B's caller finds the key in progress on A, waits, and hangs up.
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    assert!(echo(&impatient, &b.url()).send().await.is_err(), "hung up");
    // A's attempt ends unknown (no answer, no state): the key opens again, and B's
    // flight, now on its own, claims it and forwards to the stub.
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), 504);
    // A retry on B joins that flight or replays its stored answer: what the stub saw.
    // (On A it could claim the key first and meet the silent upstream again.)
    let deadline = Instant::now() + Duration::from_secs(10);
    let seen = loop {
        let r = echo(&c, &b.url()).send().await.unwrap();
        if r.status() == 200 {
            assert!(r.headers().contains_key("idempotent-replayed"));
            let v: serde_json::Value = r.json().await.unwrap();
            break v;
        }
        assert!(Instant::now() < deadline, "B's flight never finished");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Without the id captured at arrival the detached task has none to send: reading the
    // task-local at send time left the upstream without `X-Request-Id` here.
    let id = seen["headers"]["x-request-id"].as_str().unwrap_or_default();
    assert!(
        id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "the upstream saw request id {id:?}: {seen}"
    );
    assert!(seen["headers"].get("traceparent").is_some(), "{seen}");
    held.abort();
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}
