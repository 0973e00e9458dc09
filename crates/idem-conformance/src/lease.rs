//! Lease scenarios every lease store must pass (SQLite, PostgreSQL, Redis).
//!
//! Each scenario takes a [`LeaseHarness`] and asserts what holders and protected
//! resources rely on: the seed's four ways a lock dies (docs/DESIGN.md: how locks die) on controlled time,
//! tokens that never go back, compare-and-set renew and release, and the evidence. A
//! backend's test module calls [`lease_tests!`](crate::lease_tests) once.
//!
//! Time is the store's: scenarios move it with the harness's [`ClockShift`] and never
//! sleep through a lease. Every scenario uses lease names of its own.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{
    Acquire, ClockShift, ErrorKind, FencingToken, Lease, LeaseError, LeaseEvent, LeaseEventKind,
    LeaseName, LeaseStore, OwnerId, Release, Renew,
};
use tokio::sync::Barrier;

use crate::owner;

/// Opens the lease store under test and the protected resource beside it.
#[async_trait]
pub trait LeaseHarness: Send + Sync + 'static {
    /// Opens the store; every call sees the same data (a reopen is a restart).
    async fn open(&self) -> Arc<dyn LeaseStore>;

    /// The shift applied to the store clock of every store this harness opens.
    fn clock(&self) -> &ClockShift;

    /// Simulates a failover that lost the lease `name`: afterwards the store must act
    /// as if it never recorded the lease. Remove everything the backend's deployment
    /// may lose that way. SQLite: the lease row only (its token counter commits in the
    /// same transaction, so it cannot be lost apart from the row). Redis: the lease key
    /// and the name's token counter key too, as after an unreplicated failover. The
    /// scenarios still demand a strictly higher token for the next grant.
    async fn lose_lease(&self, name: &LeaseName);

    /// The authoritative protected resource: stores `value` under `resource` through the
    /// backend's fenced write, with `lease`'s token. Returns `LeaseError::Fenced` when
    /// the fence refuses it (and the value must then be unchanged).
    async fn fenced_write(
        &self,
        resource: &str,
        lease: &Lease,
        value: &str,
    ) -> Result<(), LeaseError>;

    /// The value last stored under `resource` by an accepted fenced write.
    async fn resource_value(&self, resource: &str) -> Option<String>;
}

/// A lease name unique to one scenario.
pub fn fresh_name(prefix: &str) -> LeaseName {
    LeaseName::new(format!("{prefix}-{}", uuid::Uuid::now_v7().simple())).unwrap()
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

fn granted(a: Acquire) -> Lease {
    match a {
        Acquire::Granted(lease) => lease,
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn held_by(a: Acquire) -> Lease {
    match a {
        Acquire::Held { holder, .. } => holder,
        other => panic!("expected the lease to be held, got {other:?}"),
    }
}

fn not_holder_release(r: Release) -> Option<Lease> {
    match r {
        Release::NotHolder { current } => current,
        other => panic!("expected a not-holder release, got {other:?}"),
    }
}

fn not_holder_renew(r: Renew) -> Option<Lease> {
    match r {
        Renew::NotHolder { current } => current,
        other => panic!("expected a not-holder renew, got {other:?}"),
    }
}

async fn events(store: &dyn LeaseStore, name: &LeaseName) -> Vec<LeaseEvent> {
    store.events(name, 1000).await.expect("events")
}

/// The events of `kind`, as (owner, token).
fn of_kind(events: &[LeaseEvent], kind: LeaseEventKind) -> Vec<(Option<OwnerId>, Option<i64>)> {
    events
        .iter()
        .filter(|e| e.kind == kind)
        .map(|e| (e.owner.clone(), e.token.map(FencingToken::get)))
        .collect()
}

fn who(o: &str, t: FencingToken) -> (Option<OwnerId>, Option<i64>) {
    (Some(owner(o)), Some(t.get()))
}

/// Seed failure 1: A takes the lease and its process exits without releasing. Everyone
/// else sees A as the holder until the deadline; then the lease is over and the next
/// acquirer gets a higher token. The expiry is recorded.
pub async fn holder_exits_lease_expires(h: &dyn LeaseHarness) {
    let name = fresh_name("exit");
    let a = {
        let store = h.open().await;
        granted(
            store
                .try_acquire(&name, &owner("A"), secs(3))
                .await
                .unwrap(),
        )
    }; // A's process is gone; nothing released.
    assert_eq!(a.expires_at - a.acquired_at, 3000);
    let store = h.open().await;
    assert_eq!(
        held_by(
            store
                .try_acquire(&name, &owner("B"), secs(3))
                .await
                .unwrap()
        ),
        a
    );
    assert_eq!(store.show(&name).await.unwrap().holder, Some(a.clone()));

    h.clock().advance(ms(3100));
    let status = store.show(&name).await.unwrap();
    assert_eq!(status.holder, None, "an expired lease has no holder");
    assert_eq!(status.last_token, Some(a.token));
    let b = granted(
        store
            .try_acquire(&name, &owner("B"), secs(3))
            .await
            .unwrap(),
    );
    assert!(b.token > a.token, "{} after {}", b.token, a.token);
    assert!(b.acquired_at >= a.expires_at);

    let ev = events(&*store, &name).await;
    assert_eq!(
        of_kind(&ev, LeaseEventKind::Expired),
        vec![who("A", a.token)]
    );
    assert_eq!(
        of_kind(&ev, LeaseEventKind::Acquired),
        vec![who("A", a.token), who("B", b.token)]
    );
    let expired = ev
        .iter()
        .find(|e| e.kind == LeaseEventKind::Expired)
        .unwrap();
    assert_eq!(expired.expires_at, Some(a.expires_at));
    assert_eq!(expired.acquired_at, Some(a.acquired_at));
}

/// Seed failure 2: the lease is 3 s, A works 8 s, B acquires at 3.1 s and writes. A's
/// write at 8 s is fenced; B's writes (several, same token) are accepted. A's renew is
/// refused. The rejection is recorded with A's owner and token.
pub async fn expiry_too_short_write_fenced(h: &dyn LeaseHarness) {
    let store = h.open().await;
    let name = fresh_name("short");
    let resource = format!("resource-{name}");
    let a = granted(
        store
            .try_acquire(&name, &owner("A"), secs(3))
            .await
            .unwrap(),
    );
    h.fenced_write(&resource, &a, "A@0").await.unwrap();

    h.clock().advance(ms(3100));
    let b = granted(
        store
            .try_acquire(&name, &owner("B"), secs(3))
            .await
            .unwrap(),
    );
    assert!(b.token > a.token);
    h.fenced_write(&resource, &b, "B@3.1").await.unwrap();
    h.fenced_write(&resource, &b, "B@3.1-again").await.unwrap();

    h.clock().advance(ms(4900));
    let err = h.fenced_write(&resource, &a, "A@8").await.unwrap_err();
    let fenced = err
        .fenced()
        .unwrap_or_else(|| panic!("expected fenced, got {err:?}"));
    assert_eq!(fenced.token, a.token);
    assert_eq!(fenced.owner, owner("A"));
    assert_eq!(fenced.last_accepted, b.token);
    assert_eq!(fenced.resource, resource);
    assert_eq!(err.kind(), ErrorKind::Conflict);
    assert_eq!(
        h.resource_value(&resource).await.as_deref(),
        Some("B@3.1-again")
    );
    assert!(not_holder_renew(
        store
            .renew(&name, &owner("A"), a.token, secs(3))
            .await
            .unwrap()
    )
    .is_none());

    let ev = events(&*store, &name).await;
    assert_eq!(
        of_kind(&ev, LeaseEventKind::FencedWriteRejected),
        vec![who("A", a.token)]
    );
    assert!(ev
        .iter()
        .any(|e| e.kind == LeaseEventKind::FencedWriteRejected
            && e.detail.as_deref().is_some_and(|d| d.contains(&resource))));
}

/// Seed failure 3: A's lease expires, B acquires at 3.1 s (and keeps it alive by
/// renewing), A finishes at 8 s and releases. The release is an owner mismatch: B's
/// lease stays exactly as it was, so C cannot enter; the mismatch is recorded.
pub async fn stale_release_keeps_holder(h: &dyn LeaseHarness) {
    let store = h.open().await;
    let name = fresh_name("stale-release");
    let a = granted(
        store
            .try_acquire(&name, &owner("A"), secs(3))
            .await
            .unwrap(),
    );
    h.clock().advance(ms(3100));
    let b = granted(
        store
            .try_acquire(&name, &owner("B"), secs(3))
            .await
            .unwrap(),
    );
    h.clock().advance(ms(2000));
    let Renew::Renewed(b) = store
        .renew(&name, &owner("B"), b.token, secs(3))
        .await
        .unwrap()
    else {
        panic!("B's renewal refused")
    };
    // 7.1 s: A ended long ago; B holds until 8.1 s, a margin for a loaded machine.
    h.clock().advance(ms(2000));

    let current = not_holder_release(store.release(&name, &owner("A"), a.token).await.unwrap());
    assert_eq!(current, Some(b.clone()));
    assert_eq!(store.show(&name).await.unwrap().holder, Some(b.clone()));
    assert_eq!(
        held_by(
            store
                .try_acquire(&name, &owner("C"), secs(3))
                .await
                .unwrap()
        ),
        b
    );
    let ev = events(&*store, &name).await;
    let mismatches: Vec<_> = ev
        .iter()
        .filter(|e| e.kind == LeaseEventKind::ReleaseOwnerMismatch)
        .collect();
    assert_eq!(mismatches.len(), 1);
    assert_eq!(mismatches[0].owner, Some(owner("A")));
    assert_eq!(mismatches[0].token, Some(a.token));
    assert!(mismatches[0].detail.as_deref().unwrap().contains("B"));

    assert!(matches!(
        store.release(&name, &owner("B"), b.token).await.unwrap(),
        Release::Released { .. }
    ));
}

/// Seed failure 4: the store loses the lease (an unreplicated failover), so a second
/// holder is granted — with a higher token, which the authoritative fenced write uses to
/// reject the first holder's late write. The first holder can neither renew nor release
/// the second holder's lease.
pub async fn failover_loses_lease_write_fenced(h: &dyn LeaseHarness) {
    let store = h.open().await;
    let name = fresh_name("failover");
    let resource = format!("resource-{name}");
    let a = granted(
        store
            .try_acquire(&name, &owner("A"), secs(30))
            .await
            .unwrap(),
    );
    h.fenced_write(&resource, &a, "A-1").await.unwrap();

    h.lose_lease(&name).await;
    let b = granted(
        store
            .try_acquire(&name, &owner("B"), secs(30))
            .await
            .unwrap(),
    );
    assert!(b.token > a.token, "{} after {}", b.token, a.token);
    h.fenced_write(&resource, &b, "B-1").await.unwrap();

    let err = h.fenced_write(&resource, &a, "A-2").await.unwrap_err();
    assert_eq!(err.fenced().map(|f| f.last_accepted), Some(b.token));
    assert_eq!(h.resource_value(&resource).await.as_deref(), Some("B-1"));
    let renew = store
        .renew(&name, &owner("A"), a.token, secs(30))
        .await
        .unwrap();
    assert_eq!(not_holder_renew(renew), Some(b.clone()));
    let release = store.release(&name, &owner("A"), a.token).await.unwrap();
    assert_eq!(not_holder_release(release), Some(b.clone()));
    assert_eq!(store.show(&name).await.unwrap().holder, Some(b));
}

/// `cycles` acquire/release cycles by `contenders` concurrent tasks, with a store restart
/// halfway: never two holders at once, and tokens strictly increase in grant order.
pub async fn tokens_increase_under_contention(
    h: &dyn LeaseHarness,
    contenders: usize,
    cycles: usize,
) {
    let name = fresh_name("cycles");
    let log = Arc::new(Mutex::new(Vec::<FencingToken>::new()));
    for target in [cycles / 2, cycles] {
        let store = h.open().await; // the second phase runs on a restarted store
        let inside = Arc::new(AtomicBool::new(false));
        let grants = Arc::new(AtomicUsize::new(log.lock().unwrap().len()));
        let barrier = Arc::new(Barrier::new(contenders));
        let mut tasks = Vec::new();
        for i in 0..contenders {
            let (store, log, inside, grants, barrier, name) = (
                store.clone(),
                log.clone(),
                inside.clone(),
                grants.clone(),
                barrier.clone(),
                name.clone(),
            );
            let me = owner(&format!("contender-{i}"));
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                while grants.load(Ordering::SeqCst) < target {
                    match store
                        .try_acquire(&name, &me, secs(30))
                        .await
                        .expect("acquire")
                    {
                        Acquire::Granted(lease) => {
                            assert!(!inside.swap(true, Ordering::SeqCst), "two holders");
                            log.lock().unwrap().push(lease.token);
                            grants.fetch_add(1, Ordering::SeqCst);
                            tokio::task::yield_now().await;
                            inside.store(false, Ordering::SeqCst);
                            let released = store.release(&name, &me, lease.token).await;
                            assert!(
                                matches!(released, Ok(Release::Released { .. })),
                                "{released:?}"
                            );
                        }
                        Acquire::Held { .. } => tokio::time::sleep(ms(1)).await,
                    }
                }
            }));
        }
        for t in tasks {
            t.await.expect("contender");
        }
    }
    let log = log.lock().unwrap().clone();
    assert!(log.len() >= cycles, "{} grants", log.len());
    for pair in log.windows(2) {
        assert!(pair[1] > pair[0], "token {} after {}", pair[1], pair[0]);
    }
    let store = h.open().await;
    assert_eq!(
        store.show(&name).await.unwrap().last_token,
        log.last().copied()
    );
}

/// Tokens go up on every grant: after a release, after an expiry, after the lease is
/// lost, after a restart, after a force-release.
pub async fn tokens_never_go_back(h: &dyn LeaseHarness) {
    let name = fresh_name("monotonic");
    let store = h.open().await;
    let acquire = |who: &'static str| {
        let store = store.clone();
        let name = name.clone();
        async move {
            granted(
                store
                    .try_acquire(&name, &owner(who), secs(3))
                    .await
                    .unwrap(),
            )
        }
    };
    let mut tokens = Vec::new();

    let first = acquire("A").await;
    tokens.push(first.token);
    store
        .release(&name, &first.owner, first.token)
        .await
        .unwrap();
    tokens.push(acquire("B").await.token); // after release
    h.clock().advance(ms(3001));
    tokens.push(acquire("C").await.token); // after expiry
    h.lose_lease(&name).await;
    tokens.push(acquire("D").await.token); // after the lease was lost
    h.lose_lease(&name).await;
    drop(store);
    let store = h.open().await;
    tokens.push(
        granted(
            store
                .try_acquire(&name, &owner("E"), secs(3))
                .await
                .unwrap(),
        )
        .token,
    ); // after restart
    store.force_release(&name, "drill").await.unwrap();
    tokens.push(
        granted(
            store
                .try_acquire(&name, &owner("F"), secs(3))
                .await
                .unwrap(),
        )
        .token,
    ); // after force-release

    for pair in tokens.windows(2) {
        assert!(pair[1] > pair[0], "tokens {tokens:?}");
    }
    assert!(tokens[0] >= FencingToken::new(1));
    assert_eq!(
        store.show(&name).await.unwrap().last_token,
        tokens.last().copied()
    );
}

/// `n` concurrent acquires of a free lease, then of an expired one: exactly one grant
/// each time; everyone else sees the winner.
pub async fn concurrent_acquire_one_winner(h: &dyn LeaseHarness, n: usize) {
    let store = h.open().await;
    let name = fresh_name("race");
    let mut previous = None;
    for round in 0..2 {
        let barrier = Arc::new(Barrier::new(n));
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let (store, barrier, name) = (store.clone(), barrier.clone(), name.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    let me = owner(&format!("r{round}-{i}"));
                    store
                        .try_acquire(&name, &me, secs(3))
                        .await
                        .expect("acquire")
                })
            })
            .collect();
        let mut winners = Vec::new();
        let mut holders = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                Acquire::Granted(l) => winners.push(l),
                Acquire::Held { holder, .. } => holders.push(holder),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: grants");
        let win = winners.pop().unwrap();
        assert!(holders.iter().all(|l| *l == win), "round {round}");
        if let Some(prev) = previous {
            assert!(win.token > prev);
        }
        previous = Some(win.token);
        h.clock().advance(ms(3100));
    }
    let ev = events(&*store, &name).await;
    assert_eq!(of_kind(&ev, LeaseEventKind::Acquired).len(), 2);
    assert_eq!(of_kind(&ev, LeaseEventKind::Expired).len(), 1);
}

/// Renew compares owner and token, pushes the deadline from the store's clock, counts
/// renewals, and cannot bring an expired lease back.
pub async fn renew_compares_owner_and_token(h: &dyn LeaseHarness) {
    let store = h.open().await;
    let name = fresh_name("renew");
    let a = granted(
        store
            .try_acquire(&name, &owner("A"), secs(3))
            .await
            .unwrap(),
    );
    h.clock().advance(secs(2));
    let Renew::Renewed(renewed) = store
        .renew(&name, &owner("A"), a.token, secs(3))
        .await
        .unwrap()
    else {
        panic!("holder's renewal refused")
    };
    assert_eq!(renewed.token, a.token);
    assert_eq!(renewed.acquired_at, a.acquired_at);
    assert_eq!(renewed.renewals, 1);
    assert!(renewed.expires_at >= a.acquired_at + 5000, "{renewed:?}");

    let wrong_owner = store
        .renew(&name, &owner("B"), a.token, secs(3))
        .await
        .unwrap();
    assert_eq!(not_holder_renew(wrong_owner), Some(renewed.clone()));
    let stale_token = FencingToken::new(a.token.get() - 1);
    let wrong_token = store
        .renew(&name, &owner("A"), stale_token, secs(3))
        .await
        .unwrap();
    assert_eq!(not_holder_renew(wrong_token), Some(renewed.clone()));
    assert_eq!(
        store.show(&name).await.unwrap().holder,
        Some(renewed.clone())
    );

    h.clock().advance(secs(2)); // past the first deadline, inside the renewed one
    assert_eq!(
        held_by(
            store
                .try_acquire(&name, &owner("B"), secs(3))
                .await
                .unwrap()
        ),
        renewed
    );
    h.clock().advance(ms(1100)); // past the renewed deadline
    let late = store
        .renew(&name, &owner("A"), a.token, secs(3))
        .await
        .unwrap();
    assert_eq!(not_holder_renew(late), None);
    assert_eq!(store.show(&name).await.unwrap().holder, None);

    let ev = events(&*store, &name).await;
    assert_eq!(
        of_kind(&ev, LeaseEventKind::Renewed),
        vec![who("A", a.token)]
    );
    assert_eq!(
        of_kind(&ev, LeaseEventKind::RenewRejected),
        vec![who("B", a.token), who("A", stale_token), who("A", a.token)]
    );
    assert_eq!(
        of_kind(&ev, LeaseEventKind::Expired),
        vec![who("A", a.token)]
    );
}

/// Release is an atomic compare of owner and token: a wrong owner or token changes
/// nothing and is recorded as an owner mismatch; the holder's release ends the lease.
pub async fn release_compares_owner_and_token(h: &dyn LeaseHarness) {
    let store = h.open().await;
    let name = fresh_name("release");
    let a = granted(
        store
            .try_acquire(&name, &owner("A"), secs(30))
            .await
            .unwrap(),
    );
    let stale_token = FencingToken::new(a.token.get() - 1);
    let r = store
        .release(&name, &owner("A"), stale_token)
        .await
        .unwrap();
    assert_eq!(not_holder_release(r), Some(a.clone()));
    let r = store.release(&name, &owner("B"), a.token).await.unwrap();
    assert_eq!(not_holder_release(r), Some(a.clone()));
    assert_eq!(store.show(&name).await.unwrap().holder, Some(a.clone()));

    match store.release(&name, &owner("A"), a.token).await.unwrap() {
        Release::Released { lease, released_at } => {
            assert_eq!(lease, a);
            assert!(released_at >= a.acquired_at);
        }
        other => panic!("holder's release refused: {other:?}"),
    }
    assert_eq!(store.show(&name).await.unwrap().holder, None);
    let twice = store.release(&name, &owner("A"), a.token).await.unwrap();
    assert_eq!(not_holder_release(twice), None);

    let ev = events(&*store, &name).await;
    let kinds: Vec<_> = ev.iter().map(|e| e.kind).collect();
    use LeaseEventKind::*;
    assert_eq!(
        kinds,
        [
            Acquired,
            ReleaseOwnerMismatch,
            ReleaseOwnerMismatch,
            Released,
            ReleaseOwnerMismatch
        ]
    );
    assert_eq!(
        of_kind(&ev, ReleaseOwnerMismatch),
        vec![who("A", stale_token), who("B", a.token), who("A", a.token)]
    );
    let released = &ev[3];
    assert_eq!(released.acquired_at, Some(a.acquired_at));
    assert!(ev.windows(2).all(|w| w[1].at >= w[0].at));
    // `limit` keeps the most recent events, oldest first.
    let last_two = store.events(&name, 2).await.unwrap();
    assert_eq!(last_two, ev[3..].to_vec());
}

/// An operator's force-release needs a reason, removes the holder's lease, keeps the
/// token counter, and is recorded with the reason and the evicted owner and token.
pub async fn force_release_is_recorded(h: &dyn LeaseHarness) {
    let store = h.open().await;
    let name = fresh_name("force");
    let a = granted(
        store
            .try_acquire(&name, &owner("A"), secs(30))
            .await
            .unwrap(),
    );
    let err = store.force_release(&name, " ").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert_eq!(store.show(&name).await.unwrap().holder, Some(a.clone()));

    let reason = "INC-7318: holder host is gone";
    assert_eq!(
        store.force_release(&name, reason).await.unwrap(),
        Some(a.clone())
    );
    assert_eq!(store.show(&name).await.unwrap().holder, None);
    let b = granted(
        store
            .try_acquire(&name, &owner("B"), secs(30))
            .await
            .unwrap(),
    );
    assert!(b.token > a.token);
    let r = store.release(&name, &owner("A"), a.token).await.unwrap();
    assert_eq!(not_holder_release(r), Some(b.clone()));
    store.release(&name, &owner("B"), b.token).await.unwrap();
    assert_eq!(store.force_release(&name, "cleanup").await.unwrap(), None);

    let ev = events(&*store, &name).await;
    let forced: Vec<_> = ev
        .iter()
        .filter(|e| e.kind == LeaseEventKind::ForceReleased)
        .collect();
    assert_eq!(forced.len(), 2, "{ev:?}");
    assert_eq!(forced[0].owner, Some(owner("A")));
    assert_eq!(forced[0].token, Some(a.token));
    assert_eq!(forced[0].detail.as_deref(), Some(reason));
    assert_eq!(forced[1].owner, None);
    assert_eq!(forced[1].detail.as_deref(), Some("cleanup"));
}

/// Show reports the live holder, its token, times and renewals, the last token, and
/// the store's time; an unknown name has none of them.
pub async fn show_reports_holder(h: &dyn LeaseHarness) {
    let store = h.open().await;
    let name = fresh_name("show");
    let empty = store.show(&name).await.unwrap();
    assert_eq!(empty.name, name);
    assert_eq!(empty.holder, None);
    assert_eq!(empty.last_token, None);
    assert!(empty.now > 0);
    assert!(events(&*store, &name).await.is_empty());

    let a = granted(
        store
            .try_acquire(&name, &owner("A"), secs(10))
            .await
            .unwrap(),
    );
    let status = store.show(&name).await.unwrap();
    assert_eq!(status.holder, Some(a.clone()));
    assert_eq!(status.last_token, Some(a.token));
    assert!(status.now >= a.acquired_at && status.now < a.expires_at);
    assert_eq!(a.renewals, 0);
    assert_eq!(a.expires_at - a.acquired_at, 10_000);
    h.clock().advance(secs(1));
    store
        .renew(&name, &owner("A"), a.token, secs(10))
        .await
        .unwrap();
    let holder = store.show(&name).await.unwrap().holder.unwrap();
    assert_eq!(holder.renewals, 1);
    assert!(holder.expires_at >= a.expires_at + 1000);
}

/// Bad input is rejected with a typed error before anything is written.
pub async fn bad_input_writes_nothing(h: &dyn LeaseHarness) {
    for bad in ["", "has space", &"n".repeat(256)] {
        assert!(LeaseName::new(bad).is_err(), "{bad:?} accepted");
    }
    let store = h.open().await;
    let name = fresh_name("bad");
    for ttl in [Duration::ZERO, secs(25 * 3600)] {
        let err = store
            .try_acquire(&name, &owner("A"), ttl)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{ttl:?}");
    }
    assert_eq!(store.show(&name).await.unwrap().last_token, None);
    let a = granted(
        store
            .try_acquire(&name, &owner("A"), secs(3))
            .await
            .unwrap(),
    );
    let err = store
        .renew(&name, &owner("A"), a.token, Duration::ZERO)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert_eq!(store.show(&name).await.unwrap().holder, Some(a));
    assert_eq!(events(&*store, &name).await.len(), 1);
}

/// Retention of the evidence: `trim_events` deletes events recorded before a time, at
/// most `limit` per call, from every name, and nothing else: the live lease, newer
/// events and the token counter stay.
pub async fn trim_events_keeps_newer_evidence(h: &dyn LeaseHarness) {
    let store = h.open().await;
    let (old, live) = (fresh_name("trim-old"), fresh_name("trim-live"));
    let first = granted(store.try_acquire(&old, &owner("A"), secs(3)).await.unwrap());
    store.release(&old, &owner("A"), first.token).await.unwrap();
    let other = granted(
        store
            .try_acquire(&live, &owner("B"), secs(3))
            .await
            .unwrap(),
    );
    store
        .release(&live, &owner("B"), other.token)
        .await
        .unwrap();
    h.clock().advance(secs(10));
    let cutoff = store.show(&old).await.unwrap().now - 5_000;
    let held = granted(
        store
            .try_acquire(&live, &owner("C"), secs(30))
            .await
            .unwrap(),
    );

    // Four events before the cutoff (two per name), one after it.
    assert_eq!(store.trim_events(cutoff, 3).await.unwrap(), 3);
    assert_eq!(store.trim_events(cutoff, 100).await.unwrap(), 1);
    assert_eq!(store.trim_events(cutoff, 100).await.unwrap(), 0);
    assert!(events(&*store, &old).await.is_empty());
    let kept = events(&*store, &live).await;
    assert_eq!(
        of_kind(&kept, LeaseEventKind::Acquired),
        vec![who("C", held.token)]
    );
    assert_eq!(kept.len(), 1, "{kept:?}");

    // The lease and the counters are not evidence: they stay.
    assert_eq!(store.show(&live).await.unwrap().holder, Some(held.clone()));
    let again = granted(store.try_acquire(&old, &owner("D"), secs(3)).await.unwrap());
    assert!(again.token > first.token, "{again:?} after {first:?}");
    assert!(held.token > other.token);
}

/// The most names [`names_page_in_byte_order`] walks before failing: the suite may share
/// a store with other tests and runs, whose names are listed too.
const NAMES_WALKED_AT_MOST: usize = 100_000;

/// `names` lists every name with a lease row, live or ended, once, in byte order, in
/// pages that follow each other by `after`; a name only touched by changes that granted
/// nothing (a refused renew, a force-release of nobody) has no row and is not listed.
/// Other tests' names may be listed as well: only this run's (a unique prefix) are
/// checked, the order across all of them.
pub async fn names_page_in_byte_order(h: &dyn LeaseHarness) {
    let store = h.open().await;
    let run = format!("names-{}/", uuid::Uuid::now_v7().simple());
    let name = |suffix: &str| LeaseName::new(format!("{run}{suffix}")).unwrap();
    // Byte order `Z` < `_b` < `a…`, unlike a locale's (a, b, z); the last one needs
    // escaping in a Redis key.
    let (z, b, a) = (name("Z"), name("_b"), name("a:{x}%"));
    let mut leases = Vec::new();
    for n in [&a, &z, &b] {
        leases.push(granted(
            store.try_acquire(n, &owner("A"), secs(30)).await.unwrap(),
        ));
    }
    let ended = &leases[1];
    store.release(&z, &ended.owner, ended.token).await.unwrap();
    let never = name("never-granted");
    not_holder_renew(
        store
            .renew(&never, &owner("A"), FencingToken::new(1), secs(30))
            .await
            .unwrap(),
    );
    assert_eq!(store.force_release(&never, "drill").await.unwrap(), None);
    assert!(store.names(None, 0).await.unwrap().is_empty(), "limit 0");

    let mut after: Option<LeaseName> = None;
    let mut walked = 0;
    let mut ours = Vec::new();
    loop {
        let page = store.names(after.as_ref(), 2).await.expect("names");
        assert!(page.len() <= 2, "a page of {} names: {page:?}", page.len());
        let Some(last) = page.last().cloned() else {
            break;
        };
        for n in &page {
            if let Some(prev) = &after {
                assert!(
                    n.as_str().as_bytes() > prev.as_str().as_bytes(),
                    "{n} listed after {prev}"
                );
            }
            if n.as_str().starts_with(&run) {
                ours.push(n.clone());
            }
            after = Some(n.clone());
        }
        assert_eq!(after.as_ref(), Some(&last));
        walked += page.len();
        assert!(
            walked <= NAMES_WALKED_AT_MOST,
            "more than {NAMES_WALKED_AT_MOST} names listed: the walk does not end"
        );
    }
    assert_eq!(
        ours,
        [z, b, a.clone()],
        "this run's names, once each, in byte order"
    );

    // After the greatest of them, none of them again.
    let rest = store.names(Some(&a), 100).await.expect("names");
    assert!(rest.iter().all(|n| n > &a), "{rest:?} after {a}");
    assert!(
        !rest.iter().any(|n| n.as_str().starts_with(&run)),
        "{rest:?} after {a}"
    );
    // After the last name listed, nothing (unless another test granted one since).
    if let Some(last) = &after {
        let later = store.names(Some(last), 2).await.expect("names");
        assert!(later.iter().all(|n| n > last), "{later:?} after {last}");
    }
}

/// Expands to one `#[tokio::test]` per lease scenario for a backend. `$open` is an
/// async expression yielding `Option<impl LeaseHarness>`; `None` skips (see
/// [`skip_or_fail`](crate::skip_or_fail)).
#[macro_export]
macro_rules! lease_tests {
    ($open:expr) => {
        $crate::lease_tests!(@one $open, lease_holder_exits_lease_expires, |h| $crate::lease::holder_exits_lease_expires(h));
        $crate::lease_tests!(@one $open, lease_expiry_too_short_write_fenced, |h| $crate::lease::expiry_too_short_write_fenced(h));
        $crate::lease_tests!(@one $open, lease_stale_release_keeps_holder, |h| $crate::lease::stale_release_keeps_holder(h));
        $crate::lease_tests!(@one $open, lease_failover_loses_lease_write_fenced, |h| $crate::lease::failover_loses_lease_write_fenced(h));
        $crate::lease_tests!(@one $open, lease_tokens_increase_1000_cycles_8_contenders, |h| $crate::lease::tokens_increase_under_contention(h, 8, 1000));
        $crate::lease_tests!(@one $open, lease_tokens_never_go_back, |h| $crate::lease::tokens_never_go_back(h));
        $crate::lease_tests!(@one $open, lease_concurrent_acquire_one_winner_16, |h| $crate::lease::concurrent_acquire_one_winner(h, 16));
        $crate::lease_tests!(@one $open, lease_renew_compares_owner_and_token, |h| $crate::lease::renew_compares_owner_and_token(h));
        $crate::lease_tests!(@one $open, lease_release_compares_owner_and_token, |h| $crate::lease::release_compares_owner_and_token(h));
        $crate::lease_tests!(@one $open, lease_force_release_is_recorded, |h| $crate::lease::force_release_is_recorded(h));
        $crate::lease_tests!(@one $open, lease_show_reports_holder, |h| $crate::lease::show_reports_holder(h));
        $crate::lease_tests!(@one $open, lease_bad_input_writes_nothing, |h| $crate::lease::bad_input_writes_nothing(h));
        $crate::lease_tests!(@one $open, lease_trim_events_keeps_newer_evidence, |h| $crate::lease::trim_events_keeps_newer_evidence(h));
        $crate::lease_tests!(@one $open, lease_names_page_in_byte_order, |h| $crate::lease::names_page_in_byte_order(h));
    };
    (@one $open:expr, $name:ident, |$h:ident| $body:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $name() {
            let Some(harness) = $open.await else { return };
            let $h: &dyn $crate::lease::LeaseHarness = &harness;
            $body.await;
        }
    };
}
