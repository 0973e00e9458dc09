//! The lease conformance suite on MySQL / MariaDB: a fresh database per scenario
//! (dropped with the harness). The protected resource is a table in the same database,
//! written through `MysqlStore::fenced_write`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::MyHarness;
use idem_conformance::lease::LeaseHarness;
use idem_core::{
    ClockShift, FencingToken, Lease, LeaseError, LeaseEventKind, LeaseName, LeaseStore, OwnerId,
};
use idem_mysql::MysqlStore;
use sqlx::Executor;
use tokio::sync::OnceCell;

struct MyLeaseHarness {
    /// The handle the resource and the failover hook use; `open` gives fresh ones.
    /// Declared first so its pool goes before the database is dropped.
    side: OnceCell<MysqlStore>,
    my: MyHarness,
}

impl MyLeaseHarness {
    async fn side(&self) -> &MysqlStore {
        self.side
            .get_or_init(|| async {
                let store = self.my.store().await;
                store
                    .pool()
                    .execute(
                        "CREATE TABLE IF NOT EXISTS protected_resource \
                         (resource VARCHAR(255) PRIMARY KEY, value TEXT NOT NULL, \
                          token BIGINT NOT NULL) ENGINE = InnoDB",
                    )
                    .await
                    .expect("resource table");
                store
            })
            .await
    }
}

#[async_trait]
impl LeaseHarness for MyLeaseHarness {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        Arc::new(self.my.store().await)
    }

    fn clock(&self) -> &ClockShift {
        &self.my.clock
    }

    async fn lose_lease(&self, name: &LeaseName) {
        // The lease row only: the token counter commits with it (and cannot be deleted).
        sqlx::query("DELETE FROM idem_leases WHERE name = ?")
            .bind(name.as_str())
            .execute(self.side().await.pool())
            .await
            .expect("delete lease row");
    }

    async fn fenced_write(
        &self,
        resource: &str,
        lease: &Lease,
        value: &str,
    ) -> Result<(), LeaseError> {
        let (resource_owned, value, token) = (resource.to_owned(), value.to_owned(), lease.token);
        self.side()
            .await
            .fenced_write(resource, lease, move |tx| {
                Box::pin(async move {
                    sqlx::query(
                        "INSERT INTO protected_resource (resource, value, token) VALUES (?, ?, ?) \
                         ON DUPLICATE KEY UPDATE value = VALUES(value), token = VALUES(token)",
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
            .await
    }

    async fn resource_value(&self, resource: &str) -> Option<String> {
        sqlx::query_scalar("SELECT value FROM protected_resource WHERE resource = ?")
            .bind(resource)
            .fetch_optional(self.side().await.pool())
            .await
            .expect("read resource")
    }
}

async fn harness() -> Option<MyLeaseHarness> {
    Some(MyLeaseHarness {
        side: OnceCell::new(),
        my: common::harness().await?,
    })
}

idem_conformance::lease_tests!(harness());

fn lease(name: &LeaseName, owner: &str, token: i64) -> Lease {
    Lease {
        name: name.clone(),
        owner: OwnerId::new(owner).unwrap(),
        token: FencingToken::new(token),
        acquired_at: 0,
        expires_at: 0,
        renewals: 0,
    }
}

/// The counter is the schema's invariant, not only the code's: it can be neither
/// deleted nor lowered by hand, and a lease row deleted by hand leaves its token there.
#[tokio::test]
async fn token_counter_cannot_go_back() {
    let Some(h) = harness().await else { return };
    let store = h.open().await;
    let name = idem_conformance::lease::fresh_name("guard");
    let a_owner = OwnerId::new("A").unwrap();
    let a = store
        .try_acquire(&name, &a_owner, Duration::from_secs(3))
        .await
        .unwrap()
        .granted()
        .unwrap();
    let mut admin = h.my.admin().await;
    for sql in [
        "DELETE FROM idem_lease_tokens WHERE name = ?",
        "UPDATE idem_lease_tokens SET last_token = last_token - 1 WHERE name = ?",
    ] {
        let err = sqlx::query(sql)
            .bind(name.as_str())
            .execute(&mut admin)
            .await
            .expect_err(sql);
        assert!(
            err.to_string().contains("idem_lease_tokens"),
            "{sql}: {err}"
        );
    }
    assert_eq!(store.show(&name).await.unwrap().last_token, Some(a.token));
    sqlx::query("DELETE FROM idem_leases WHERE name = ?")
        .bind(name.as_str())
        .execute(&mut admin)
        .await
        .unwrap();
    let b = store
        .try_acquire(&name, &OwnerId::new("B").unwrap(), Duration::from_secs(3))
        .await
        .unwrap()
        .granted()
        .unwrap();
    assert!(b.token > a.token, "{b:?} after {a:?}");
}

/// `fence_in_tx` fences inside the caller's transaction: the fence commits (or rolls
/// back) with the caller's write, and an older token is refused with evidence.
#[tokio::test]
async fn fence_in_callers_transaction() {
    let Some(h) = harness().await else { return };
    let store = h.side().await.clone();
    let name = idem_conformance::lease::fresh_name("in-tx");
    let resource = format!("res-{name}");

    // Token 5 passes but the caller rolls back: the fence forgets it.
    let mut tx = store.pool().begin().await.unwrap();
    store
        .fence_in_tx(&mut tx, &resource, &lease(&name, "A", 5))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let mut tx = store.pool().begin().await.unwrap();
    store
        .fence_in_tx(&mut tx, &resource, &lease(&name, "B", 3))
        .await
        .expect("token 5 was rolled back with its transaction");
    tx.commit().await.unwrap();

    let mut tx = store.pool().begin().await.unwrap();
    let err = store
        .fence_in_tx(&mut tx, &resource, &lease(&name, "A", 2))
        .await
        .unwrap_err();
    assert_eq!(
        err.fenced().map(|f| f.last_accepted),
        Some(FencingToken::new(3))
    );
    tx.rollback().await.unwrap();
    let events = store.events(&name, 10).await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].token, Some(FencingToken::new(2)));
    assert!(events[0].detail.as_deref().unwrap().contains(&resource));

    // Resources differing only in case or trailing space are different fences.
    for other in [resource.to_uppercase(), format!("{resource} ")] {
        let mut tx = store.pool().begin().await.unwrap();
        store
            .fence_in_tx(&mut tx, &other, &lease(&name, "A", 1))
            .await
            .unwrap_or_else(|e| panic!("{other:?} has a fence of its own: {e}"));
        tx.rollback().await.unwrap();
    }

    let err = store
        .fenced_write::<(), LeaseError, _>("", &lease(&name, "A", 9), |_| {
            Box::pin(async { Ok(()) })
        })
        .await
        .unwrap_err();
    assert_eq!(err.kind(), idem_core::ErrorKind::InvalidInput);
}

/// 64 contenders on one name, repeated: every round grants exactly one, the tokens are
/// 1 then 2 (no gap, no repeat), and no call fails over a lock (InnoDB deadlocks and
/// lock wait timeouts are retried inside the store).
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn acquire_64_way_races_repeated() {
    let Some(h) = harness().await else { return };
    let store = Arc::new(h.my.store().await);
    for round in 0..10 {
        // A new name each round: the counter row is created under the race too.
        let name = idem_conformance::lease::fresh_name(&format!("race{round}"));
        let mut tasks = Vec::new();
        for i in 0..64 {
            let (store, name) = (store.clone(), name.clone());
            tasks.push(tokio::spawn(async move {
                let owner = OwnerId::new(format!("o{i}")).unwrap();
                store
                    .try_acquire(&name, &owner, Duration::from_secs(30))
                    .await
            }));
        }
        let mut granted = Vec::new();
        for t in tasks {
            if let Some(lease) = t.await.unwrap().expect("no lock error escapes").granted() {
                granted.push(lease);
            }
        }
        assert_eq!(granted.len(), 1, "round {round}: {granted:?}");
        // The same name again, released and raced: the token rises.
        let first = granted.remove(0);
        store
            .release(&name, &first.owner, first.token)
            .await
            .unwrap();
        let mut tasks = Vec::new();
        for i in 0..64 {
            let (store, name) = (store.clone(), name.clone());
            tasks.push(tokio::spawn(async move {
                let owner = OwnerId::new(format!("p{i}")).unwrap();
                store
                    .try_acquire(&name, &owner, Duration::from_secs(30))
                    .await
            }));
        }
        let mut again = Vec::new();
        for t in tasks {
            if let Some(lease) = t.await.unwrap().expect("no lock error escapes").granted() {
                again.push(lease);
            }
        }
        assert_eq!(again.len(), 1, "round {round} again: {again:?}");
        // A new name's first grant is token 1, the next one 2: no gaps, no repeats.
        assert_eq!(first.token, FencingToken::new(1), "round {round}");
        assert_eq!(again[0].token, FencingToken::new(2), "round {round}");
    }
    eprintln!(
        "acquire races: {} calls ran again after a lock conflict",
        store.lock_conflicts()
    );
}

/// The holder's cycle keeps one lease row in place: a release ends it (no owner, the
/// token kept) and the next grant takes it with token + 1, one statement each way for
/// the store that did the last change, through the procedures for another; the evidence
/// is every grant and release once, with the times the calls answered.
#[tokio::test]
async fn cycles_keep_the_row_in_place_with_their_evidence() {
    let Some(h) = harness().await else { return };
    let (one, other) = (h.my.store().await, h.my.store().await);
    let name = idem_conformance::lease::fresh_name("in-place");
    let ttl = Duration::from_secs(30);
    let mut answered = Vec::new();
    // One store cycles (its second grant and both releases are the one-statement
    // changes); then another store, which knows nothing of the row, grants and releases.
    for (store, who) in [(&one, "A"), (&one, "A"), (&other, "B")] {
        let owner = OwnerId::new(who).unwrap();
        let lease = store
            .try_acquire(&name, &owner, ttl)
            .await
            .unwrap()
            .granted()
            .expect("granted");
        let released_at = match store.release(&name, &owner, lease.token).await.unwrap() {
            idem_core::Release::Released {
                lease: l,
                released_at,
            } => {
                assert_eq!(l, lease);
                released_at
            }
            other => panic!("{other:?}"),
        };
        assert!(released_at >= lease.acquired_at);
        answered.push((lease, released_at));
    }
    let tokens: Vec<i64> = answered.iter().map(|(l, _)| l.token.get()).collect();
    assert_eq!(tokens, [1, 2, 3]);
    let (rows, owner, token): (i64, String, i64) =
        sqlx::query_as("SELECT COUNT(*), MAX(owner), MAX(token) FROM idem_leases WHERE name = ?")
            .bind(name.as_str())
            .fetch_one(one.pool())
            .await
            .unwrap();
    assert_eq!((rows, owner.as_str(), token), (1, "", 3), "one ended row");
    let status = one.show(&name).await.unwrap();
    assert_eq!(status.holder, None);
    assert_eq!(status.last_token, Some(FencingToken::new(3)));

    let events = one.events(&name, 100).await.unwrap();
    let mut expected = Vec::new();
    for (lease, released_at) in &answered {
        expected.push((
            LeaseEventKind::Acquired,
            lease.acquired_at,
            lease.token,
            lease.expires_at,
        ));
        expected.push((
            LeaseEventKind::Released,
            *released_at,
            lease.token,
            lease.expires_at,
        ));
    }
    let got: Vec<_> = events
        .iter()
        .map(|e| {
            assert_eq!(
                e.owner.as_ref().map(OwnerId::as_str),
                Some(if e.token.unwrap().get() < 3 { "A" } else { "B" })
            );
            (e.kind, e.at, e.token.unwrap(), e.expires_at.unwrap())
        })
        .collect();
    assert_eq!(got, expected);

    // A memory that went stale (the other store granted since) changes nothing: the
    // grant falls back and answers the live holder, and the stale release is refused.
    let b = other
        .try_acquire(&name, &OwnerId::new("B").unwrap(), ttl)
        .await
        .unwrap()
        .granted()
        .unwrap();
    let a = OwnerId::new("A").unwrap();
    match one.try_acquire(&name, &a, ttl).await.unwrap() {
        idem_core::Acquire::Held { holder, .. } => assert_eq!(holder, b),
        other => panic!("{other:?}"),
    }
    let stale = one.release(&name, &a, answered[1].0.token).await.unwrap();
    assert!(matches!(stale, idem_core::Release::NotHolder { current: Some(ref l) } if *l == b));
}
