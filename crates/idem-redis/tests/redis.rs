//! Redis-specific behaviour: key encoding, expiry, binary results, server clock, error
//! mapping, and faults (connections killed mid-race, reconnects).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{client_ids_named, kill_clients_named, RedisHarness};
use idem_conformance::{fresh_tenant, request, result};
use idem_core::{
    Claim, ClaimKind, ErrorKind, IdempotencyKey, IdempotencyStore, RecordState, Scope,
    StoredResult, TenantId,
};
use idem_redis::{RedisOptions, RedisStore};
use tokio::sync::Barrier;

fn proceed(claim: Claim) -> idem_core::ClaimToken {
    match claim {
        Claim::Proceed(t) => t,
        other => panic!("expected proceed, got {other:?}"),
    }
}

/// Removes a record behind the store's back (an operator's `DEL`, a flush, eviction).
async fn remove_record(
    admin: &mut redis::aio::MultiplexedConnection,
    store: &RedisStore,
    scope: &Scope,
) {
    let _: () = redis::cmd("DEL")
        .arg(store.record_key(scope))
        .query_async(admin)
        .await
        .unwrap();
}

async fn pttl(h: &RedisHarness, key: &str) -> i64 {
    let mut admin = h.admin().await;
    redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut admin)
        .await
        .unwrap()
}

/// Tenants and keys full of `{`, `}`, `:` and `%` stay distinct records, each under a
/// well-formed hash tag.
#[tokio::test]
async fn braces_and_colons_stay_distinct() {
    let Some(h) = RedisHarness::new().await else {
        return;
    };
    let store = h.store().await.unwrap();
    let base = fresh_tenant();
    let pairs = [
        ("a:b", "c"),
        ("a", "b:c"),
        ("{x}", "y"),
        ("x", "}{"),
        ("%7B", "k"),
        ("{", "k"),
        ("%", "25"),
        ("%25", "k"),
        ("a", "b"),
        ("}", "{}:{}"),
        ("{a:b}", "{c}"),
        ("{a", "b}:{c}"),
    ];
    let mut scopes = Vec::new();
    for (i, (t, k)) in pairs.iter().enumerate() {
        let tenant = TenantId::new(format!("{base}{t}")).unwrap();
        let req = request(&tenant, k, &format!("payload-{i}"), "o");
        let tok = proceed(store.claim(&req).await.unwrap());
        assert_eq!(tok.kind, ClaimKind::Fresh, "{t:?}/{k:?} was not fresh");
        store
            .complete(&tok, result(&format!("r{i}")))
            .await
            .unwrap();
        scopes.push((req, i));
    }
    for (req, i) in &scopes {
        let rec = store.get(&req.scope).await.unwrap().unwrap();
        assert_eq!(rec.tenant, req.scope.tenant);
        assert_eq!(rec.key, req.scope.key);
        assert_eq!(rec.result, Some(result(&format!("r{i}"))));
        // The same request replays its own result; nobody else's payload leaks in.
        match store.claim(req).await.unwrap() {
            Claim::Replay(r) => assert_eq!(r.result, Some(result(&format!("r{i}")))),
            other => panic!("expected replay, got {other:?}"),
        }
    }
    let keys = h.keys().await;
    assert_eq!(keys.len(), pairs.len(), "{keys:?}");
    for key in &keys {
        let open = key.find('{').expect("hash tag opens");
        let close = open + key[open..].find('}').expect("hash tag closes");
        assert_eq!(
            close,
            key.len() - 1,
            "{key}: the tag must be the whole tail"
        );
        assert!(close > open + 1, "{key}: empty hash tag");
        assert_eq!(key[open + 1..close].matches(':').count(), 1, "{key}");
    }
    for (req, _) in &scopes {
        assert!(keys.contains(&store.record_key(&req.scope)));
    }
}

/// PTTL follows the retention window: retention + lease while PROCESSING, retention
/// after the end; an expired record is absent and a stale finish is superseded.
#[tokio::test]
async fn record_ttl_is_retention() {
    let Some(h) = RedisHarness::with_retention(Duration::from_secs(120)).await else {
        return;
    };
    let store = h.store().await.unwrap();
    let t = fresh_tenant();
    let mut req = request(&t, "ttl", "p", "a");
    req.lease = Duration::from_secs(30);
    let tok = proceed(store.claim(&req).await.unwrap());
    let key = store.record_key(&req.scope);
    let ttl = pttl(&h, &key).await;
    assert!((145_000..=150_000).contains(&ttl), "processing pttl {ttl}");

    store
        .extend_lease(&tok, Duration::from_secs(60))
        .await
        .unwrap();
    let ttl = pttl(&h, &key).await;
    assert!((175_000..=180_000).contains(&ttl), "extended pttl {ttl}");

    store.complete(&tok, result("x")).await.unwrap();
    let ttl = pttl(&h, &key).await;
    assert!((115_000..=120_000).contains(&ttl), "finished pttl {ttl}");

    // A short retention actually removes the record.
    let Some(short) = RedisHarness::with_retention(Duration::from_millis(300)).await else {
        return;
    };
    let store = short.store().await.unwrap();
    let mut req = request(&t, "short", "p", "a");
    req.lease = Duration::from_millis(200);
    let tok = proceed(store.claim(&req).await.unwrap());
    let done = store.complete(&tok, result("y")).await.unwrap();
    assert_eq!(done.state, RecordState::Succeeded);
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(store.get(&req.scope).await.unwrap(), None);
    // A token whose record expired cannot finish (nothing is recreated).
    let stale = proceed(store.claim(&req).await.unwrap());
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(store
        .complete(&stale, result("late"))
        .await
        .unwrap_err()
        .is_superseded());
    assert_eq!(store.get(&req.scope).await.unwrap(), None);
}

/// Result bodies are stored as raw bytes.
#[tokio::test]
async fn binary_body_round_trips() {
    let Some(h) = RedisHarness::new().await else {
        return;
    };
    let store = h.store().await.unwrap();
    let t = fresh_tenant();
    let req = request(&t, "bin", "p", "a");
    let tok = proceed(store.claim(&req).await.unwrap());
    let body: Vec<u8> = (0..=255u8).chain([0, 0xff, 0xc3, 0x28]).collect();
    let stored = StoredResult {
        status: 500,
        headers: vec![
            ("x-\"q\"".into(), "a\nb".into()),
            ("content-type".into(), "application/octet-stream".into()),
        ],
        body: body.clone(),
        result_ref: None,
    };
    let rec = store.fail(&tok, false, Some(stored.clone())).await.unwrap();
    assert_eq!(rec.result.as_ref(), Some(&stored));
    assert_eq!(rec.state, RecordState::FailedTerminal);
    let again = store.get(&req.scope).await.unwrap().unwrap();
    assert_eq!(again.result, Some(stored));
    assert_eq!(again, rec);
}

/// Lease deadlines come from the Redis clock (plus the shift), not the caller's.
#[tokio::test]
async fn time_comes_from_redis() {
    let Some(h) = RedisHarness::new().await else {
        return;
    };
    let store = h.store().await.unwrap();
    let mut admin = h.admin().await;
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut admin).await.unwrap();
    let server_now = secs * 1000 + micros / 1000;
    h.clock.advance(Duration::from_secs(3600));
    let t = fresh_tenant();
    let mut req = request(&t, "clock", "p", "a");
    req.lease = Duration::from_secs(10);
    let tok = proceed(store.claim(&req).await.unwrap());
    let expected = server_now + 3_600_000 + 10_000;
    assert!(
        (tok.lease_expires_at - expected).abs() < 2_000,
        "deadline {} vs server-derived {expected}",
        tok.lease_expires_at
    );
    let rec = store.get(&req.scope).await.unwrap().unwrap();
    assert_eq!(rec.lease_expires_at, Some(tok.lease_expires_at));
    assert_eq!(rec.created_at, tok.lease_expires_at - 10_000);
}

/// Misconfiguration and unreachable servers give typed errors, quickly.
#[tokio::test]
async fn connect_errors_are_typed() {
    let opts = || {
        let mut o = RedisOptions::default();
        o.connect_timeout = Duration::from_secs(2);
        o
    };
    // Port 1 on loopback: nothing listens there.
    let started = std::time::Instant::now();
    let err = RedisStore::connect("redis://127.0.0.1:1", opts())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(5));

    let err = RedisStore::connect("not-a-url", opts()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err:?}");
    let mut braces = opts();
    braces.prefix = "idem{x}".into();
    let err = RedisStore::connect("redis://127.0.0.1:6379", braces)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err:?}");
    let mut bad_name = opts();
    bad_name.client_name = Some("has space".into());
    let err = RedisStore::connect("redis://127.0.0.1:6379", bad_name)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err:?}");
}

/// After its connection is killed the store reconnects by itself, under its name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_after_kill() {
    let Some(h) = RedisHarness::new().await else {
        return;
    };
    let store = h.store().await.unwrap();
    let mut admin = h.admin().await;
    let t = fresh_tenant();
    let req = request(&t, "reconnect", "p", "a");
    let tok = proceed(store.claim(&req).await.unwrap());

    for round in 0..3 {
        let killed = kill_clients_named(&mut admin, store.client_name()).await;
        assert_eq!(killed, 1, "round {round}: the store's one connection");
        let mut unavailable = 0;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let rec = loop {
            assert!(std::time::Instant::now() < deadline, "no reconnect");
            match store.get(&req.scope).await {
                Ok(rec) => break rec.unwrap(),
                Err(e) => {
                    assert!(e.is_unavailable(), "{e:?}");
                    unavailable += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        assert_eq!(rec.state, RecordState::Processing);
        assert!(unavailable <= 3, "round {round}: {unavailable} failures");
        // The name is back on the new connection.
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(&mut admin)
            .await
            .unwrap();
        assert_eq!(
            client_ids_named(&list, store.client_name()).len(),
            1,
            "round {round}: renamed connection"
        );
    }
    // The claim is still good across reconnects.
    store.complete(&tok, result("after")).await.unwrap();
}

#[derive(Debug)]
enum Outcome {
    Executed(Vec<u8>),
    Replayed(Vec<u8>),
}

/// 64 concurrent duplicates while this store's connection is killed repeatedly:
/// still exactly one execution; every other arrival replays the same result (after
/// retrying the `Unavailable` answers); nothing is left PROCESSING.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_connections_during_race_execute_once() {
    let Some(h) = RedisHarness::new().await else {
        return;
    };
    let store: Arc<RedisStore> = Arc::new(h.store().await.unwrap());
    let name = store.client_name().to_string();
    let t = fresh_tenant();
    let n = 64;
    let mut total_kills = 0;
    let mut total_unavailable = 0;
    for rep in 0..4 {
        let k = format!("fault-{rep}");
        let barrier = Arc::new(Barrier::new(n + 1));
        let executions = Arc::new(AtomicUsize::new(0));
        let unavailable = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..n {
            let store = store.clone();
            let barrier = barrier.clone();
            let executions = executions.clone();
            let unavailable = unavailable.clone();
            let mut req = request(&t, &k, "same-payload", &format!("owner-{i}"));
            req.lease = Duration::from_secs(2);
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
                loop {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "race did not settle"
                    );
                    let claim = match store.claim(&req).await {
                        Ok(c) => c,
                        Err(e) => {
                            assert!(e.is_unavailable(), "claim: {e:?}");
                            unavailable.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            continue;
                        }
                    };
                    match claim {
                        Claim::Proceed(token) => {
                            executions.fetch_add(1, Ordering::SeqCst);
                            // The "side effect" takes a while, so kills land mid-race.
                            tokio::time::sleep(Duration::from_millis(40)).await;
                            let body = result(&uuid::Uuid::new_v4().to_string());
                            loop {
                                assert!(tokio::time::Instant::now() < deadline, "complete");
                                match store.complete(&token, body.clone()).await {
                                    Ok(_) => return Outcome::Executed(body.body),
                                    Err(e) if e.is_unavailable() => {
                                        unavailable.fetch_add(1, Ordering::Relaxed);
                                        tokio::time::sleep(Duration::from_millis(5)).await;
                                    }
                                    Err(e) if e.is_superseded() => {
                                        // Our earlier attempt may have been applied with
                                        // its reply lost: the record must hold our result.
                                        let rec = loop {
                                            assert!(tokio::time::Instant::now() < deadline);
                                            match store.get(&req.scope).await {
                                                Ok(rec) => break rec.expect("record"),
                                                Err(e) => assert!(e.is_unavailable()),
                                            }
                                            tokio::time::sleep(Duration::from_millis(5)).await;
                                        };
                                        assert_eq!(rec.result, Some(body.clone()), "lost");
                                        return Outcome::Executed(body.body);
                                    }
                                    Err(e) => panic!("complete: {e:?}"),
                                }
                            }
                        }
                        Claim::InProgress { .. } => {
                            tokio::time::sleep(Duration::from_millis(3)).await;
                        }
                        Claim::Replay(rec) => {
                            return Outcome::Replayed(rec.result.expect("result").body)
                        }
                        Claim::Mismatch { .. } => panic!("same payload reported as mismatch"),
                    }
                }
            }));
        }
        let mut admin = h.admin().await;
        let killer_name = name.clone();
        let killer_barrier = barrier.clone();
        let killer = tokio::spawn(async move {
            killer_barrier.wait().await;
            let mut kills = 0;
            for delay in [0u64, 5, 15, 30, 50] {
                tokio::time::sleep(Duration::from_millis(delay)).await;
                kills += kill_clients_named(&mut admin, &killer_name).await;
            }
            kills
        });
        let mut outcomes = Vec::new();
        for task in tasks {
            outcomes.push(task.await.expect("task"));
        }
        total_kills += killer.await.unwrap();
        total_unavailable += unavailable.load(Ordering::Relaxed);

        assert_eq!(
            executions.load(Ordering::SeqCst),
            1,
            "rep {rep}: executions"
        );
        let executed: Vec<&Vec<u8>> = outcomes
            .iter()
            .filter_map(|o| match o {
                Outcome::Executed(b) => Some(b),
                _ => None,
            })
            .collect();
        assert_eq!(executed.len(), 1, "rep {rep}");
        for o in &outcomes {
            if let Outcome::Replayed(b) = o {
                assert_eq!(b, executed[0], "rep {rep}: replay differs");
            }
        }
        let rec = loop {
            match store
                .get(&Scope::new(t.clone(), IdempotencyKey::new(&k).unwrap()))
                .await
            {
                Ok(rec) => break rec.unwrap(),
                Err(e) => assert!(e.is_unavailable()),
            }
        };
        assert_eq!(rec.state, RecordState::Succeeded, "rep {rep}");
        assert_eq!(rec.result.unwrap().body, *executed[0]);
    }
    assert!(
        total_kills >= 4,
        "the killer found the store's connections: {total_kills}"
    );
    assert!(total_unavailable > 0, "kills must have hit requests");
    eprintln!("fault race: {total_kills} kills, {total_unavailable} unavailable answers");
    // Nothing under this prefix is left PROCESSING.
    let mut admin = h.admin().await;
    for key in h.keys().await {
        let value: Vec<u8> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut admin)
            .await
            .unwrap();
        let rec = idem_redis::decode_record(&value).unwrap();
        assert_ne!(rec.state, RecordState::Processing, "{key}");
    }
}

/// A private `redis-server` (no RDB, no AOF) on a free loopback port, killed on drop.
struct PrivateRedis {
    port: u16,
    child: Option<std::process::Child>,
}

impl PrivateRedis {
    fn start(port: u16) -> std::io::Result<Self> {
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        Ok(Self {
            port,
            child: Some(child),
        })
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    async fn wait_ready(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let ok = async {
                let client = redis::Client::open(self.url()).ok()?;
                let mut c = client.get_multiplexed_async_connection().await.ok()?;
                redis::cmd("PING").query_async::<String>(&mut c).await.ok()
            }
            .await;
            if ok.is_some() {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "redis-server did not start"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.stop();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A Redis restart: while the server is down every call is `Unavailable` (never a
/// guess); afterwards the same store reconnects by itself — and, as the module docs
/// say, the records are gone: without AOF/RDB a restart forgets every key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restart_is_unavailable_then_forgets() {
    let port = free_port();
    let mut server = match PrivateRedis::start(port) {
        Ok(s) => s,
        Err(e) => {
            idem_conformance::skip_or_fail("redis-server binary", &e);
            return;
        }
    };
    server.wait_ready().await;
    let store = RedisStore::connect(&server.url(), {
        let mut o = RedisOptions::default();
        o.prefix = "restart".into();
        // What the server does, not what this process remembers (see
        // `finished_records_answer_from_memory`).
        o.finished = idem_redis::FinishedLimits::off();
        o.connect_timeout = Duration::from_secs(1);
        o.response_timeout = Duration::from_secs(1);
        o
    })
    .await
    .unwrap();
    let t = fresh_tenant();
    let req = request(&t, "restart", "p", "a");
    let tok = proceed(store.claim(&req).await.unwrap());
    store.complete(&tok, result("before")).await.unwrap();

    server.stop();
    for _ in 0..3 {
        let err = store.claim(&req).await.unwrap_err();
        assert!(err.is_unavailable(), "{err:?}");
        let err = store.get(&req.scope).await.unwrap_err();
        assert!(err.is_unavailable(), "{err:?}");
    }

    let server = PrivateRedis::start(port).unwrap();
    server.wait_ready().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let after = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "store did not reconnect"
        );
        match store.get(&req.scope).await {
            Ok(rec) => break rec,
            Err(e) => {
                assert!(e.is_unavailable(), "{e:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert_eq!(after, None, "an in-memory Redis forgets records on restart");
    // The retried intent is absent again: it would execute a second time.
    let again = proceed(store.claim(&req).await.unwrap());
    assert_eq!(again.kind, ClaimKind::Fresh);
    drop(server);
}

/// The replay shortcut (a plain GET for scopes this store saw finished) answers replays
/// and mismatches like the script, and never answers for a record that is gone or not
/// finished.
#[tokio::test]
async fn replay_shortcut_follows_the_record() {
    let Some(h) = RedisHarness::new().await else {
        return;
    };
    let store = h.store_without_memory().await.unwrap();
    let t = fresh_tenant();
    let req = request(&t, "k", "p", "a");
    let tok = proceed(store.claim(&req).await.unwrap());
    store.complete(&tok, result("first")).await.unwrap();
    for _ in 0..3 {
        match store.claim(&req).await.unwrap() {
            Claim::Replay(r) => assert_eq!(r.result, Some(result("first"))),
            other => panic!("expected replay, got {other:?}"),
        }
        let other = request(&t, "k", "another payload", "b");
        assert!(matches!(
            store.claim(&other).await.unwrap(),
            Claim::Mismatch {
                state: RecordState::Succeeded
            }
        ));
    }
    // The record vanishes (expiry, a flush): the remembered scope must not answer.
    let mut admin = h.admin().await;
    remove_record(&mut admin, &store, &req.scope).await;
    let again = proceed(store.claim(&req).await.unwrap());
    assert_eq!(again.kind, ClaimKind::Fresh);
    // Remembered, then FAILED_RETRYABLE: taken over by the script, not replayed.
    store
        .finish(
            &again,
            idem_core::Finish {
                state: RecordState::FailedRetryable,
                result: None,
            },
        )
        .await
        .unwrap();
    let retry = proceed(store.claim(&req).await.unwrap());
    assert_eq!(retry.kind, ClaimKind::RetryAfterFailure);
}

#[tokio::test]
async fn the_server_and_its_capabilities_are_read_at_connect() {
    if let Some(h) = RedisHarness::new().await {
        let store = h.store().await.unwrap();
        let server = store.server();
        assert_eq!(server.name, "redis", "{server}");
        assert_eq!(server.set_ifeq, server.version >= (8, 4, 0), "{server}");
        assert!(server.version.0 >= 6, "{server}");
    }
    if let Some(h) = RedisHarness::valkey().await {
        let store = h.store().await.unwrap();
        let server = store.server();
        assert_eq!(server.name, "valkey", "{server}");
        assert!(server.set_ifeq, "Valkey {server} has SET IFEQ");
    }
}

/// `unlink_prefix` empties exactly `prefix:` and says how much it removed.
#[tokio::test]
async fn unlink_prefix_removes_its_prefix_only() {
    let Some(h) = RedisHarness::new().await else {
        return;
    };
    let mut admin = h.admin().await;
    let neighbour = format!("{}x:kept", h.prefix);
    for key in [
        format!("{}:a", h.prefix),
        format!("{}:b:{{c}}", h.prefix),
        neighbour.clone(),
    ] {
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg("1")
            .query_async(&mut admin)
            .await
            .unwrap();
    }
    let removed = idem_redis::unlink_prefix(&mut admin, &h.prefix)
        .await
        .unwrap();
    assert_eq!(removed, 2);
    let left: i64 = redis::cmd("EXISTS")
        .arg(&neighbour)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(left, 1, "a key of another prefix stays");
    let _: () = redis::cmd("DEL")
        .arg(&neighbour)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(
        idem_redis::unlink_prefix(&mut admin, &h.prefix)
            .await
            .unwrap(),
        0
    );
}

/// Connects as a fresh ACL user that may not run scripts (`-@scripting`); the user is
/// deleted by [`drop_user`].
async fn no_script_store(h: &RedisHarness) -> (RedisStore, String) {
    let mut admin = h.admin().await;
    let user = format!("idem-noscript-{}", uuid::Uuid::new_v4().simple());
    let password = uuid::Uuid::new_v4().simple().to_string();
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&user)
        .arg("on")
        .arg(format!(">{password}"))
        .arg(format!("~{}:*", h.prefix))
        .arg("+@all")
        .arg("-@scripting")
        .query_async::<()>(&mut admin)
        .await
        .expect("ACL SETUSER");
    let url = h
        .url
        .replacen("redis://", &format!("redis://{user}:{password}@"), 1);
    let store = RedisStore::connect(&url, h.options())
        .await
        .expect("connect as the ACL user");
    (store, user)
}

async fn drop_user(h: &RedisHarness, user: &str) {
    let mut admin = h.admin().await;
    let _: () = redis::cmd("ACL")
        .arg("DELUSER")
        .arg(user)
        .query_async(&mut admin)
        .await
        .expect("ACL DELUSER");
}

/// The hot path needs no script where the server allows: on Valkey a fresh claim, its
/// completion and the replay all work for a user forbidden to run scripts; on Redis 7
/// the fresh claim and the replay do, and completion (a script there) is refused. A
/// heartbeat rewrites the value, so the completion after it goes to the script.
#[tokio::test]
async fn fresh_claim_and_completion_run_without_scripts() {
    for h in [RedisHarness::new().await, RedisHarness::valkey().await]
        .into_iter()
        .flatten()
    {
        let (store, user) = no_script_store(&h).await;
        let ifeq = store.server().set_ifeq;
        let t = fresh_tenant();
        let req = request(&t, "no-script", "p", "a");
        let token = proceed(store.claim(&req).await.unwrap());
        assert_eq!(token.kind, ClaimKind::Fresh);
        assert!(token.written.is_some());
        // The same intent while it runs: in progress, answered from the value.
        assert!(matches!(
            store
                .claim(&request(&t, "no-script", "p", "b"))
                .await
                .unwrap(),
            Claim::InProgress { .. }
        ));
        let finished = store
            .finish(
                &token,
                idem_core::Finish {
                    state: RecordState::Succeeded,
                    result: Some(result("made")),
                },
            )
            .await;
        if ifeq {
            let rec = finished.expect("completion without a script");
            assert_eq!(rec.state, RecordState::Succeeded);
            assert_eq!(rec.version, 2);
            assert_eq!(store.get(&req.scope).await.unwrap(), Some(rec.clone()));
            match store
                .claim(&request(&t, "no-script", "p", "c"))
                .await
                .unwrap()
            {
                Claim::Replay(r) => assert_eq!(r, rec),
                other => panic!("expected a replay, got {other:?}"),
            }
            // A second completion of the same token lost its compare and is refused
            // by the script path, which this user may not run.
            assert!(store
                .finish(
                    &token,
                    idem_core::Finish {
                        state: RecordState::Succeeded,
                        result: None,
                    }
                )
                .await
                .is_err());
        } else {
            let err = finished.expect_err("Redis 7 completes with a script");
            assert!(
                err.to_string().to_ascii_uppercase().contains("NOPERM"),
                "{err}"
            );
        }
        drop_user(&h, &user).await;

        // With scripts: heartbeat, then completion, then a stale completion.
        let store = h.store().await.unwrap();
        let req = request(&t, "beat", "p", "a");
        let token = proceed(store.claim(&req).await.unwrap());
        store
            .extend_lease(&token, Duration::from_secs(60))
            .await
            .unwrap();
        let done = idem_core::Finish {
            state: RecordState::Succeeded,
            result: Some(result("ok")),
        };
        let rec = store.finish(&token, done.clone()).await.unwrap();
        assert_eq!(rec.version, token.version + 1);
        let err = store.finish(&token, done).await.unwrap_err();
        assert!(err.is_superseded(), "{err}");
    }
}

/// Finished records this process's claims read answer replays and mismatches without a
/// command: the same decision table, bounded by the record's expiry and by the entry's
/// time to live, and per process (another store asks the server).
#[tokio::test]
async fn finished_records_answer_from_memory() {
    let Some(h) = RedisHarness::with_retention(Duration::from_secs(60)).await else {
        return;
    };
    let store = Arc::new(h.store().await.unwrap());
    let t = fresh_tenant();
    let req = request(&t, "k", "p", "a");
    let tok = proceed(store.claim(&req).await.unwrap());
    store.complete(&tok, result("first")).await.unwrap();
    // Writing it keeps nothing (most keys are never sent again); the first replay,
    // read from the server, is kept.
    assert!(matches!(store.claim(&req).await.unwrap(), Claim::Replay(_)));
    // Removed outside idem: this process still knows how the intent ended.
    let mut admin = h.admin().await;
    remove_record(&mut admin, &store, &req.scope).await;
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let store = store.clone();
            let (same, other) = (req.clone(), request(&t, "k", "another payload", "b"));
            tokio::spawn(async move {
                if i % 2 == 0 {
                    match store.claim(&same).await.unwrap() {
                        Claim::Replay(r) => assert_eq!(r.result, Some(result("first"))),
                        other => panic!("expected a replay from memory, got {other:?}"),
                    }
                } else {
                    let claim = store.claim(&other).await.unwrap();
                    assert!(
                        matches!(
                            claim,
                            Claim::Mismatch {
                                state: RecordState::Succeeded
                            }
                        ),
                        "{claim:?}"
                    );
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let mut stranger = req.clone();
    stranger.principal = idem_core::Principal::new("someone-else").unwrap();
    assert!(matches!(
        store.claim(&stranger).await.unwrap(),
        Claim::Mismatch { .. }
    ));
    // Another process (store) has no copy: the server answers, and it forgot the key.
    let other_store = h.store().await.unwrap();
    let elsewhere = proceed(other_store.claim(&req).await.unwrap());
    assert_eq!(elsewhere.kind, ClaimKind::Fresh);
    other_store.abandon(&elsewhere).await.unwrap();
    // Past the entry's time to live the server decides again.
    h.clock.advance(Duration::from_secs(11));
    let again = proceed(store.claim(&req).await.unwrap());
    assert_eq!(again.kind, ClaimKind::Fresh);
    store.abandon(&again).await.unwrap();

    // A record that expires before the time to live ends is not replayed past its
    // expiry.
    let Some(h) = RedisHarness::with_retention(Duration::from_secs(2)).await else {
        return;
    };
    let store = h.store().await.unwrap();
    let tok = proceed(store.claim(&req).await.unwrap());
    store.complete(&tok, result("short")).await.unwrap();
    assert!(matches!(store.claim(&req).await.unwrap(), Claim::Replay(_)));
    remove_record(&mut admin, &store, &req.scope).await;
    assert!(matches!(store.claim(&req).await.unwrap(), Claim::Replay(_)));
    h.clock.advance(Duration::from_millis(2_100));
    let fresh = proceed(store.claim(&req).await.unwrap());
    assert_eq!(fresh.kind, ClaimKind::Fresh);
    store.abandon(&fresh).await.unwrap();
}
