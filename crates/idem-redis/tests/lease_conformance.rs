//! The lease conformance suite on Redis: a unique key prefix per scenario (removed when
//! the harness drops). The protected resource lives in an authoritative SQL store — a
//! temporary SQLite file written through `idem_sqlite::SqliteStore::fenced_write` with
//! the Redis-issued lease — which is how a Redis lease is made safe: when Redis loses the
//! lease (`lose_lease` deletes the lease and counter keys, as after an unreplicated
//! failover) a second holder is granted, and the SQL fence refuses the first holder's
//! stale token.

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::RedisHarness;
use idem_conformance::lease::{fresh_name, LeaseHarness};
use idem_core::lease::holder_detail;
use idem_core::{
    Acquire, ClockShift, FencingToken, Lease, LeaseError, LeaseEventKind, LeaseName, LeaseStore,
    OwnerId, Release, Renew,
};
use idem_redis::{lease_keys, RedisStore};
use idem_sqlite::{SqliteOptions, SqliteStore};
use tokio::sync::OnceCell;

struct RedisLeaseHarness {
    redis: RedisHarness,
    /// The store `fenced_write` reports refusals to; `open` gives fresh ones.
    side: OnceCell<RedisStore>,
    /// The authoritative fence and the protected resource.
    fence: OnceCell<SqliteStore>,
    dir: tempfile::TempDir,
}

impl RedisLeaseHarness {
    async fn side(&self) -> &RedisStore {
        self.side
            .get_or_init(|| async { self.redis.store().await.expect("open redis store") })
            .await
    }

    async fn fence(&self) -> &SqliteStore {
        self.fence
            .get_or_init(|| async {
                let mut opts = SqliteOptions::new(self.dir.path().join("fence.db"));
                opts.clock = self.redis.clock.clone();
                let store = SqliteStore::open(opts).await.expect("open sqlite fence");
                sqlx::query(
                    "CREATE TABLE IF NOT EXISTS protected_resource \
                     (resource TEXT PRIMARY KEY, value TEXT NOT NULL, token INTEGER NOT NULL)",
                )
                .execute(store.pool())
                .await
                .expect("resource table");
                store
            })
            .await
    }

    async fn del(&self, keys: &[&str]) {
        self.redis.del(keys).await;
    }
}

#[async_trait]
impl LeaseHarness for RedisLeaseHarness {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        Arc::new(self.redis.store().await.expect("open redis store"))
    }

    fn clock(&self) -> &ClockShift {
        &self.redis.clock
    }

    async fn lose_lease(&self, name: &LeaseName) {
        // As after an unreplicated failover: the lease state (and its token) is gone.
        let keys = lease_keys(&self.redis.prefix, name);
        self.del(&[&keys.state]).await;
    }

    async fn fenced_write(
        &self,
        resource: &str,
        lease: &Lease,
        value: &str,
    ) -> Result<(), LeaseError> {
        let (resource_owned, value, token) = (resource.to_owned(), value.to_owned(), lease.token);
        let res = self
            .fence()
            .await
            .fenced_write(resource, lease, move |tx| {
                Box::pin(async move {
                    sqlx::query(
                        "INSERT INTO protected_resource (resource, value, token) VALUES (?, ?, ?) \
                         ON CONFLICT (resource) DO UPDATE SET value = excluded.value, \
                           token = excluded.token",
                    )
                    .bind(resource_owned)
                    .bind(value)
                    .bind(token.get())
                    .execute(tx)
                    .await
                    .map_err(|e| LeaseError::Backend(e.to_string()))?;
                    Ok(())
                })
            })
            .await;
        if let Err(LeaseError::Fenced(fenced)) = &res {
            // The refusal becomes evidence of the Redis lease too.
            self.side()
                .await
                .record_fence_rejection(fenced)
                .await
                .expect("record the refusal");
        }
        res
    }

    async fn resource_value(&self, resource: &str) -> Option<String> {
        sqlx::query_scalar("SELECT value FROM protected_resource WHERE resource = ?")
            .bind(resource)
            .fetch_optional(self.fence().await.pool())
            .await
            .expect("read resource")
    }
}

async fn on(redis: Option<RedisHarness>) -> Option<RedisLeaseHarness> {
    Some(RedisLeaseHarness {
        redis: redis?,
        side: OnceCell::new(),
        fence: OnceCell::new(),
        dir: tempfile::tempdir().expect("tempdir"),
    })
}

async fn harness() -> Option<RedisLeaseHarness> {
    on(RedisHarness::new().await).await
}

idem_conformance::lease_tests!(harness());

/// The same scenarios on Valkey.
mod valkey {
    async fn harness() -> Option<super::RedisLeaseHarness> {
        super::on(super::RedisHarness::valkey().await).await
    }

    idem_conformance::lease_tests!(harness());
}

/// The same scenarios on a three-node Redis Cluster.
mod cluster {
    async fn harness() -> Option<super::RedisLeaseHarness> {
        super::on(super::RedisHarness::cluster().await).await
    }

    idem_conformance::lease_tests!(harness());
}

fn owner(s: &str) -> OwnerId {
    OwnerId::new(s).unwrap()
}

fn granted(a: Acquire) -> Lease {
    a.granted().expect("granted")
}

/// Everything Redis knew about the name is gone (a restart without persistence): the
/// next token is still higher, from the microsecond clock.
#[tokio::test]
async fn tokens_rise_after_every_key_is_lost() {
    let Some(h) = harness().await else { return };
    let store = h.side().await;
    let name = fresh_name("wiped");
    let a = granted(
        store
            .try_acquire(&name, &owner("A"), Duration::from_secs(30))
            .await
            .unwrap(),
    );
    let keys = store.lease_keys(&name);
    h.del(&[&keys.state, &keys.events]).await;
    assert_eq!(store.show(&name).await.unwrap().last_token, None);
    let b = granted(
        store
            .try_acquire(&name, &owner("B"), Duration::from_secs(30))
            .await
            .unwrap(),
    );
    assert!(b.token > a.token, "{} after {}", b.token, a.token);
    // Tokens are store-clock microseconds (or above them).
    assert!(b.token.get() >= b.acquired_at * 1000, "{b:?}");
}

/// An old-layout token counter for `name`, as an older idem left it; returns the keys,
/// the store time and the counter's token. Tokens of the old layout were store
/// microseconds too: one far ahead of the clock shows a new grant rises from the old
/// counter, not from the time floor.
async fn legacy_counter(
    h: &RedisLeaseHarness,
    store: &RedisStore,
    name: &LeaseName,
) -> (idem_redis::LeaseKeys, i64, i64) {
    let now = store.show(name).await.unwrap().now;
    let (keys, old_token) = (store.lease_keys(name), (now + 3_600_000) * 1000);
    let _: () = redis::cmd("SET")
        .arg(&keys.legacy_counter)
        .arg(old_token)
        .query_async(&mut h.redis.admin().await)
        .await
        .unwrap();
    (keys, now, old_token)
}

/// A name written by an older idem (a lease hash and a token counter) is honoured: its
/// live lease holds, its holder can renew and release it, and the next token is above
/// the old ones; the first change moves it into the state.
#[tokio::test]
async fn legacy_layout_is_read_and_moved() {
    let Some(h) = harness().await else { return };
    let store = h.side().await;
    let name = fresh_name("legacy");
    let (keys, now, old_token) = legacy_counter(&h, store, &name).await;
    let mut admin = h.redis.admin().await;
    let _: () = redis::cmd("HSET")
        .arg(&keys.legacy_lease)
        .arg("owner")
        .arg("A")
        .arg("token")
        .arg(old_token)
        .arg("acquired_at")
        .arg(now)
        .arg("expires_at")
        .arg(now + 30_000)
        .arg("renewals")
        .arg(0)
        .query_async(&mut admin)
        .await
        .unwrap();

    let status = store.show(&name).await.unwrap();
    assert_eq!(status.last_token, Some(FencingToken::new(old_token)));
    let holder = status.holder.expect("the old lease holds");
    assert_eq!(
        (holder.owner.as_str(), holder.token.get()),
        ("A", old_token)
    );
    match store
        .try_acquire(&name, &owner("B"), Duration::from_secs(3))
        .await
        .unwrap()
    {
        Acquire::Held { holder, .. } => assert_eq!(holder.token.get(), old_token),
        other => panic!("a live legacy lease must hold: {other:?}"),
    }
    let renewed = store
        .renew(&name, &owner("A"), holder.token, Duration::from_secs(3))
        .await
        .unwrap();
    assert!(
        matches!(renewed, Renew::Renewed(ref l) if l.renewals == 1),
        "{renewed:?}"
    );
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&keys.legacy_lease)
        .arg(&keys.legacy_counter)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(exists, 0, "the renewal moved the name into the state");
    assert!(matches!(
        store
            .release(&name, &owner("A"), holder.token)
            .await
            .unwrap(),
        Release::Released { .. }
    ));
    let b = granted(
        store
            .try_acquire(&name, &owner("B"), Duration::from_secs(3))
            .await
            .unwrap(),
    );
    assert_eq!(b.token.get(), old_token + 1);
}

/// Only the old counter is left (its lease was released): the next token is above it.
#[tokio::test]
async fn legacy_counter_alone_still_counts() {
    let Some(h) = harness().await else { return };
    let store = h.side().await;
    let name = fresh_name("legacy-counter");
    let (_, _, old_token) = legacy_counter(&h, store, &name).await;
    let status = store.show(&name).await.unwrap();
    assert_eq!(status.last_token, Some(FencingToken::new(old_token)));
    assert!(status.holder.is_none());
    let a = granted(
        store
            .try_acquire(&name, &owner("A"), Duration::from_secs(3))
            .await
            .unwrap(),
    );
    assert_eq!(a.token.get(), old_token + 1);
}

/// `names` lists what `show` reads: the state, and the hash or the counter an older idem
/// left (until a change moves them into the state), each name once; a name with events
/// only (a refused renew) has no lease to list.
#[tokio::test]
async fn names_include_the_older_layout() {
    let Some(h) = harness().await else { return };
    let store = h.side().await;
    let (current, hash, counter, events) = (
        fresh_name("n-state"),
        fresh_name("n-legacy-hash:{x}"),
        fresh_name("n-legacy-counter%"),
        fresh_name("n-events"),
    );
    granted(
        store
            .try_acquire(&current, &owner("A"), Duration::from_secs(30))
            .await
            .unwrap(),
    );
    let (keys, now, old_token) = legacy_counter(&h, store, &hash).await;
    let _: () = redis::cmd("HSET")
        .arg(&keys.legacy_lease)
        .arg("owner")
        .arg("A")
        .arg("token")
        .arg(old_token)
        .arg("acquired_at")
        .arg(now)
        .arg("expires_at")
        .arg(now + 30_000)
        .arg("renewals")
        .arg(0)
        .query_async(&mut h.redis.admin().await)
        .await
        .unwrap();
    legacy_counter(&h, store, &counter).await;
    store
        .renew(
            &events,
            &owner("A"),
            FencingToken::new(1),
            Duration::from_secs(3),
        )
        .await
        .unwrap();
    assert!(!store.events(&events, 10).await.unwrap().is_empty());

    let mut expected = vec![current, hash.clone(), counter];
    expected.sort();
    assert_eq!(store.names(None, 100).await.unwrap(), expected);
    assert_eq!(store.names(None, 2).await.unwrap(), expected[..2]);
    assert_eq!(
        store.names(Some(&expected[0]), 100).await.unwrap(),
        expected[1..]
    );
    // Moved into the state by a renewal: still listed once.
    let renewed = store
        .renew(
            &hash,
            &owner("A"),
            FencingToken::new(old_token),
            Duration::from_secs(3),
        )
        .await
        .unwrap();
    assert!(matches!(renewed, Renew::Renewed(_)), "{renewed:?}");
    assert_eq!(store.names(None, 100).await.unwrap(), expected);
}

/// The script spells the holder detail exactly as `idem_core::lease::holder_detail`.
#[tokio::test]
async fn holder_detail_matches_core() {
    let Some(h) = harness().await else { return };
    let store = h.side().await;
    let name = fresh_name("detail");
    let a = granted(
        store
            .try_acquire(&name, &owner("A"), Duration::from_secs(30))
            .await
            .unwrap(),
    );
    let stale = FencingToken::new(a.token.get() - 1);
    let r = store.release(&name, &owner("A"), stale).await.unwrap();
    assert_eq!(
        r,
        Release::NotHolder {
            current: Some(a.clone())
        }
    );
    store.release(&name, &owner("A"), a.token).await.unwrap();
    store
        .renew(&name, &owner("A"), a.token, Duration::from_secs(3))
        .await
        .unwrap();
    let ev = store.events(&name, 10).await.unwrap();
    let details: Vec<_> = ev.iter().map(|e| (e.kind, e.detail.clone())).collect();
    assert_eq!(
        details,
        vec![
            (LeaseEventKind::Acquired, None),
            (
                LeaseEventKind::ReleaseOwnerMismatch,
                Some(holder_detail(Some(&a)))
            ),
            (LeaseEventKind::Released, None),
            (LeaseEventKind::RenewRejected, Some(holder_detail(None))),
        ]
    );
    assert_eq!(ev[2].expires_at, Some(a.expires_at));
    assert_eq!(ev[2].acquired_at, Some(a.acquired_at));
}

/// Layout: the keys of one name share a hash tag; `PEXPIRE` is garbage collection only
/// (the state outlives its lease's deadline by the grace period, so an expiry can still
/// be recorded, and keeps the token after a release); the event list is capped.
#[tokio::test]
async fn keys_expire_only_after_the_grace_period() {
    let Some(h) = harness().await else { return };
    let store = h.side().await;
    let name = fresh_name("gc");
    granted(
        store
            .try_acquire(&name, &owner("A"), Duration::from_secs(3))
            .await
            .unwrap(),
    );
    let keys = store.lease_keys(&name);
    let admin = h.redis.admin().await;
    let grace = h.redis.retention.as_millis() as i64;
    let pttl = |key: String| {
        let mut admin = admin.clone();
        async move {
            let ttl: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query_async(&mut admin)
                .await
                .unwrap();
            ttl
        }
    };
    for key in [&keys.state, &keys.events] {
        let ttl = pttl(key.clone()).await;
        assert!(ttl > grace && ttl <= grace + 3000, "{key}: {ttl}");
    }
    let a = store.show(&name).await.unwrap().holder.expect("held");
    store.release(&name, &owner("A"), a.token).await.unwrap();
    for key in [&keys.state, &keys.events] {
        let ttl = pttl(key.clone()).await;
        assert!(
            ttl > grace - 3000 && ttl <= grace,
            "{key} after release: {ttl}"
        );
    }
    let tags: Vec<_> = [&keys.state, &keys.events]
        .iter()
        .map(|k| k[k.find('{').unwrap()..].to_string())
        .collect();
    assert!(tags.windows(2).all(|w| w[0] == w[1]), "{tags:?}");
}

#[tokio::test]
async fn event_list_is_capped() {
    let Some(h) = harness().await else { return };
    let store = h.side().await;
    let name = fresh_name("cap");
    for _ in 0..(idem_redis::LEASE_EVENTS_KEPT / 2 + 1) {
        let a = granted(
            store
                .try_acquire(&name, &owner("A"), Duration::from_secs(3))
                .await
                .unwrap(),
        );
        store.release(&name, &owner("A"), a.token).await.unwrap();
    }
    let ev = store.events(&name, usize::MAX).await.unwrap();
    assert_eq!(ev.len(), idem_redis::LEASE_EVENTS_KEPT);
    assert_eq!(ev.last().unwrap().kind, LeaseEventKind::Released);
    assert!(store.events(&name, 0).await.unwrap().is_empty());
}
