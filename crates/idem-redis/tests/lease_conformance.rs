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
    OwnerId, Release,
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
        let mut admin = self.redis.admin().await;
        let _: i64 = redis::cmd("DEL")
            .arg(keys)
            .query_async(&mut admin)
            .await
            .expect("DEL");
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
        // As after an unreplicated failover: the lease and the token counter are gone.
        let keys = lease_keys(&self.redis.prefix, name);
        self.del(&[&keys.lease, &keys.counter]).await;
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

async fn harness() -> Option<RedisLeaseHarness> {
    Some(RedisLeaseHarness {
        redis: RedisHarness::new().await?,
        side: OnceCell::new(),
        fence: OnceCell::new(),
        dir: tempfile::tempdir().expect("tempdir"),
    })
}

idem_conformance::lease_tests!(harness());

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
    h.del(&[&keys.lease, &keys.counter, &keys.events]).await;
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

/// The counter alone is lost, the lease hash survives: the hash's token still counts.
#[tokio::test]
async fn counter_lost_lease_kept() {
    let Some(h) = harness().await else { return };
    let store = h.side().await;
    let name = fresh_name("counter-lost");
    let a = granted(
        store
            .try_acquire(&name, &owner("A"), Duration::from_secs(3))
            .await
            .unwrap(),
    );
    h.del(&[&store.lease_keys(&name).counter]).await;
    assert_eq!(store.show(&name).await.unwrap().last_token, Some(a.token));
    h.redis.clock.advance(Duration::from_millis(3001));
    let b = granted(
        store
            .try_acquire(&name, &owner("B"), Duration::from_secs(3))
            .await
            .unwrap(),
    );
    assert!(b.token > a.token);
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
/// (the lease hash outlives its deadline by the grace period, so an expiry can still be
/// recorded); the event list is capped.
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
    let mut admin = h.redis.admin().await;
    let grace = h.redis.retention.as_millis() as i64;
    for key in [&keys.lease, &keys.counter, &keys.events] {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut admin)
            .await
            .unwrap();
        assert!(ttl > grace && ttl <= grace + 3000, "{key}: {ttl}");
    }
    let tags: Vec<_> = [&keys.lease, &keys.counter, &keys.events]
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
