//! Lease rows once read, and the order of the steps of a fenced write and of the lease
//! changes made under a name's lock (each SQL store supplies only the statements).
//!
//! Owns only pure code, like the rest of [`crate::row`]: it must not do I/O or know a SQL
//! dialect, nor invent lease rules (`idem_core::lease` states them).

use std::fmt::Display;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use idem_core::lease::{
    check_reason, check_ttl, Acquire, Fenced, FencingToken, Lease, LeaseError, LeaseEvent,
    LeaseEventKind, LeaseName, LeaseStatus, Release, Renew,
};
use idem_core::{Millis, OwnerId};

fn corrupt_lease(what: &str, detail: impl Display) -> LeaseError {
    LeaseError::Backend(format!("corrupt stored lease {what}: {detail}"))
}

/// Lease names as a store listed them (`LeaseStore::names`).
pub fn lease_names(names: Vec<String>) -> Result<Vec<LeaseName>, LeaseError> {
    names
        .into_iter()
        .map(|n| LeaseName::new(n).map_err(|e| corrupt_lease("name", e)))
        .collect()
}

/// The columns of a lease row (the name is the caller's: it asked for it).
#[derive(Debug, Clone, Default)]
pub struct LeaseRow {
    pub owner: String,
    pub token: i64,
    pub acquired_at: Millis,
    pub expires_at: Millis,
    pub renewals: i64,
}

impl LeaseRow {
    pub fn decode(self, name: &LeaseName) -> Result<Lease, LeaseError> {
        Ok(Lease {
            name: name.clone(),
            owner: OwnerId::new(self.owner).map_err(|e| corrupt_lease("owner", e))?,
            token: FencingToken::new(self.token),
            acquired_at: self.acquired_at,
            expires_at: self.expires_at,
            renewals: u32::try_from(self.renewals).map_err(|e| corrupt_lease("renewals", e))?,
        })
    }
}

/// The columns of a lease event.
#[derive(Debug, Clone, Default)]
pub struct LeaseEventRow {
    pub kind: String,
    pub at: Millis,
    pub owner: Option<String>,
    pub token: Option<i64>,
    pub acquired_at: Option<Millis>,
    pub expires_at: Option<Millis>,
    pub detail: Option<String>,
}

impl LeaseEventRow {
    pub fn decode(self, name: &LeaseName) -> Result<LeaseEvent, LeaseError> {
        Ok(LeaseEvent {
            name: name.clone(),
            kind: self.kind.parse().map_err(|e| corrupt_lease("kind", e))?,
            at: self.at,
            owner: self
                .owner
                .map(OwnerId::new)
                .transpose()
                .map_err(|e| corrupt_lease("owner", e))?,
            token: self.token.map(FencingToken::new),
            acquired_at: self.acquired_at,
            expires_at: self.expires_at,
            detail: self.detail,
        })
    }
}

/// What one read of a name sees: the store time, its lease row (live or expired) and the
/// last token granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSnapshot {
    pub now: Millis,
    pub lease: Option<Lease>,
    pub last_token: Option<FencingToken>,
}

impl LeaseSnapshot {
    /// From the read: `lease` is the row when one was found, `last_token` is 0 when no
    /// token was ever granted.
    pub fn decode(
        name: &LeaseName,
        now: Millis,
        lease: Option<LeaseRow>,
        last_token: i64,
    ) -> Result<Self, LeaseError> {
        Ok(Self {
            now,
            lease: lease.map(|row| row.decode(name)).transpose()?,
            last_token: (last_token > 0).then_some(FencingToken::new(last_token)),
        })
    }

    /// The live lease, if any: an expired one holds nothing.
    pub fn holder(&self) -> Option<&Lease> {
        self.lease.as_ref().filter(|l| l.is_live(self.now))
    }

    /// An acquire's answer when the read found a live holder.
    pub fn held(&self) -> Option<Acquire> {
        self.holder().map(|holder| Acquire::Held {
            holder: holder.clone(),
            now: self.now,
        })
    }

    /// What `show` reports from this read.
    pub fn status(self, name: &LeaseName) -> LeaseStatus {
        LeaseStatus::of(name, self.lease, self.last_token, self.now)
    }
}

/// Whether `owner` with `token` holds `lease`, live at `now`: the compare-and-set every
/// renew and release makes.
pub fn holds(lease: &Lease, owner: &OwnerId, token: FencingToken, now: Millis) -> bool {
    lease.owner == *owner && lease.token == token && lease.is_live(now)
}

/// A fenced resource needs a name.
pub fn check_resource(resource: &str) -> Result<(), LeaseError> {
    if resource.is_empty() {
        return Err(LeaseError::InvalidInput(
            "fenced resource name is empty".into(),
        ));
    }
    Ok(())
}

/// A write the fence of `resource` refused at store time `now`, `last` being the token
/// it had accepted: the evidence to record under the lease's name, and the caller's error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceRefusal {
    pub event: LeaseEvent,
    pub fenced: Fenced,
}

impl FenceRefusal {
    pub fn new(resource: &str, lease: &Lease, last: FencingToken, now: Millis) -> Self {
        let fenced = Fenced {
            resource: resource.to_owned(),
            name: lease.name.clone(),
            owner: lease.owner.clone(),
            token: lease.token,
            last_accepted: last,
        };
        Self {
            event: LeaseEvent::of_caller(
                LeaseEventKind::FencedWriteRejected,
                now,
                &lease.name,
                &lease.owner,
                lease.token,
            )
            .with_detail(fenced.detail()),
            fenced,
        }
    }
}

/// The future a fenced write's closure returns; it borrows the transaction's connection.
pub type FencedWriteFuture<'c, T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'c>>;

/// A store's part of [`fenced_write`]; the order of the steps is fixed there.
pub trait FenceSteps: Sync {
    /// The writing transaction.
    type Tx: Send;
    /// What the caller's write runs on.
    type Conn: ?Sized + Send;

    fn begin(&self) -> impl Future<Output = Result<Self::Tx, LeaseError>> + Send;

    /// Presents `lease` to the fence of `resource` in `tx`: `None` when its token passes
    /// ([`idem_core::lease::fence_accepts`]; the fence then remembers it when `tx` commits),
    /// otherwise `Some((last accepted token, store time))` and nothing written.
    fn take<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        resource: &'a str,
        lease: &'a Lease,
    ) -> impl Future<Output = Result<Option<(FencingToken, Millis)>, LeaseError>> + Send + 'a;

    fn conn(tx: &mut Self::Tx) -> &mut Self::Conn;

    fn commit(tx: Self::Tx) -> impl Future<Output = Result<(), LeaseError>> + Send;

    fn rollback(tx: Self::Tx) -> impl Future<Output = Result<(), LeaseError>> + Send;

    /// Records the refusal in a commit of its own (the write's transaction is gone, the
    /// evidence must not be), and logs it. A failure to record is logged, not returned:
    /// the write is refused either way and the caller must learn why.
    fn refused<'a>(&'a self, refusal: &'a FenceRefusal) -> impl Future<Output = ()> + Send + 'a;
}

/// Runs `write` in one transaction with the fence of `resource`, only if `lease`'s token
/// passes it; the fence then remembers the token and commits with the write. An older
/// token gets `LeaseError::Fenced` (converted into `E`), nothing of the write runs, and a
/// `fenced_write_rejected` event is recorded. An error from `write` rolls everything
/// back, the fence included.
pub async fn fenced_write<S, T, E, F>(
    steps: &S,
    resource: &str,
    lease: &Lease,
    write: F,
) -> Result<T, E>
where
    S: FenceSteps,
    E: From<LeaseError>,
    F: for<'c> FnOnce(&'c mut S::Conn) -> FencedWriteFuture<'c, T, E>,
{
    check_resource(resource)?;
    let mut tx = steps.begin().await?;
    match steps.take(&mut tx, resource, lease).await? {
        None => {
            let out = write(S::conn(&mut tx)).await?;
            S::commit(tx).await?;
            Ok(out)
        }
        Some((last, now)) => {
            S::rollback(tx).await?;
            let refusal = FenceRefusal::new(resource, lease, last, now);
            steps.refused(&refusal).await;
            Err(LeaseError::from(refusal.fenced).into())
        }
    }
}

/// A store's part of the lease changes made in one transaction under the name's lock
/// (renew, a release its one-statement path did not make, force-release). The rules, and
/// the order of the writes, are the provided methods.
pub trait LeaseSteps: Sync {
    /// The transaction the change runs in; dropping it rolls back.
    type Tx: Send;

    /// Begins the transaction and reads under the name's lock its lease unless it has
    /// ended (live or expired), with the store time read after the lock.
    fn lock<'a>(
        &'a self,
        name: &'a LeaseName,
    ) -> impl Future<Output = Result<(Self::Tx, Option<Lease>, Millis), LeaseError>> + Send + 'a;

    fn record<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        event: &'a LeaseEvent,
    ) -> impl Future<Output = Result<(), LeaseError>> + Send + 'a;

    /// Ends the lease of `name` at `now`; its token stays the name's last.
    fn end<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        name: &'a LeaseName,
        now: Millis,
    ) -> impl Future<Output = Result<(), LeaseError>> + Send + 'a;

    /// Writes the deadline and renewal count of `lease`, just renewed.
    fn extend<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        lease: &'a Lease,
    ) -> impl Future<Output = Result<(), LeaseError>> + Send + 'a;

    /// Ends the caller's lease and records `released`, its evidence.
    fn end_held<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        released: &'a LeaseEvent,
    ) -> impl Future<Output = Result<(), LeaseError>> + Send + 'a;

    /// A release by `owner` with `token`, who no longer holds the lease (`detail` names
    /// the live one), before its mismatch is recorded: the store logs it.
    fn mismatched(&self, name: &LeaseName, owner: &OwnerId, token: FencingToken, detail: &str);

    fn commit(tx: Self::Tx) -> impl Future<Output = Result<(), LeaseError>> + Send;

    /// Renews the lease if `owner` and `token` hold it live; otherwise records
    /// `renew_rejected` (after the expiry it notices) and changes nothing else.
    fn renew<'a>(
        &'a self,
        name: &'a LeaseName,
        owner: &'a OwnerId,
        token: FencingToken,
        ttl: Duration,
    ) -> impl Future<Output = Result<Renew, LeaseError>> + Send + 'a {
        async move {
            check_ttl(ttl)?;
            let (mut tx, lease, now) = self.lock(name).await?;
            let answer = match lease {
                Some(lease) if holds(&lease, owner, token, now) => {
                    let lease = lease.renewed(now, ttl);
                    self.extend(&mut tx, &lease).await?;
                    let renewed = LeaseEvent::of_lease(LeaseEventKind::Renewed, now, &lease);
                    self.record(&mut tx, &renewed).await?;
                    Renew::Renewed(lease)
                }
                other => {
                    let current = settle_expired(self, &mut tx, other, now).await?;
                    let kind = LeaseEventKind::RenewRejected;
                    let event =
                        LeaseEvent::rejected(kind, now, name, owner, token, current.as_ref());
                    self.record(&mut tx, &event).await?;
                    Renew::NotHolder { current }
                }
            };
            Self::commit(tx).await?;
            Ok(answer)
        }
    }

    /// Ends the lease if `owner` and `token` hold it live; otherwise records
    /// `release_owner_mismatch` (after the expiry it notices) and leaves any live lease
    /// alone.
    fn release<'a>(
        &'a self,
        name: &'a LeaseName,
        owner: &'a OwnerId,
        token: FencingToken,
    ) -> impl Future<Output = Result<Release, LeaseError>> + Send + 'a {
        async move {
            let (mut tx, lease, now) = self.lock(name).await?;
            let answer = match lease {
                Some(lease) if holds(&lease, owner, token, now) => {
                    let released = LeaseEvent::of_lease(LeaseEventKind::Released, now, &lease);
                    self.end_held(&mut tx, &released).await?;
                    Release::Released {
                        lease,
                        released_at: now,
                    }
                }
                other => {
                    let current = settle_expired(self, &mut tx, other, now).await?;
                    let kind = LeaseEventKind::ReleaseOwnerMismatch;
                    let event =
                        LeaseEvent::rejected(kind, now, name, owner, token, current.as_ref());
                    self.mismatched(name, owner, token, event.detail.as_deref().unwrap_or(""));
                    self.record(&mut tx, &event).await?;
                    Release::NotHolder { current }
                }
            };
            Self::commit(tx).await?;
            Ok(answer)
        }
    }

    /// Ends whatever lease `name` has and records `force_released` with the reason (also
    /// when there was none); returns the live lease it ended.
    fn force_release<'a>(
        &'a self,
        name: &'a LeaseName,
        reason: &'a str,
    ) -> impl Future<Output = Result<Option<Lease>, LeaseError>> + Send + 'a {
        async move {
            check_reason(reason)?;
            let (mut tx, lease, now) = self.lock(name).await?;
            let removed = settle_expired(self, &mut tx, lease, now).await?;
            let event = match &removed {
                Some(lease) => {
                    self.end(&mut tx, name, now).await?;
                    LeaseEvent::of_lease(LeaseEventKind::ForceReleased, now, lease)
                }
                None => LeaseEvent::new(name, LeaseEventKind::ForceReleased, now),
            };
            self.record(&mut tx, &event.with_detail(reason)).await?;
            Self::commit(tx).await?;
            Ok(removed)
        }
    }
}

/// The live lease of a locked read; an expired one is recorded as `expired` and ended, so
/// the expiry is recorded once.
async fn settle_expired<S: LeaseSteps + ?Sized>(
    steps: &S,
    tx: &mut S::Tx,
    lease: Option<Lease>,
    now: Millis,
) -> Result<Option<Lease>, LeaseError> {
    match lease {
        Some(lease) if !lease.is_live(now) => {
            let expired = LeaseEvent::of_lease(LeaseEventKind::Expired, now, &lease);
            steps.record(tx, &expired).await?;
            steps.end(tx, &lease.name, now).await?;
            Ok(None)
        }
        live => Ok(live),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_and_snapshots() {
        let name = LeaseName::new("n").unwrap();
        let row = LeaseRow {
            owner: "a".into(),
            token: 3,
            acquired_at: 10,
            expires_at: 20,
            renewals: 1,
        };
        let snap = LeaseSnapshot::decode(&name, 15, Some(row.clone()), 3).unwrap();
        let holder = snap.holder().unwrap();
        assert!(holds(
            holder,
            &OwnerId::new("a").unwrap(),
            FencingToken::new(3),
            15
        ));
        assert!(!holds(
            holder,
            &OwnerId::new("a").unwrap(),
            FencingToken::new(2),
            15
        ));
        let later = LeaseSnapshot::decode(&name, 20, Some(row.clone()), 3).unwrap();
        assert!(later.holder().is_none(), "expired at its deadline");
        let never = LeaseSnapshot::decode(&name, 20, None, 0).unwrap();
        assert_eq!(never.last_token, None);
        let bad = LeaseRow {
            renewals: -1,
            ..row
        };
        assert!(bad.decode(&name).is_err());
        let event = LeaseEventRow {
            kind: "released".into(),
            token: Some(3),
            ..LeaseEventRow::default()
        }
        .decode(&name)
        .unwrap();
        assert_eq!(event.kind, LeaseEventKind::Released);
        assert!(LeaseEventRow::default().decode(&name).is_err());
    }

    #[test]
    fn refusals_carry_evidence() {
        let lease = LeaseRow {
            owner: "a".into(),
            token: 2,
            ..LeaseRow::default()
        }
        .decode(&LeaseName::new("n").unwrap())
        .unwrap();
        let r = FenceRefusal::new("res", &lease, FencingToken::new(5), 9);
        assert_eq!(r.event.kind, LeaseEventKind::FencedWriteRejected);
        assert_eq!(r.event.at, 9);
        assert_eq!(r.fenced.last_accepted, FencingToken::new(5));
        assert_eq!(
            r.event.detail.as_deref(),
            Some("resource res accepted token 5")
        );
        assert!(check_resource("").is_err());
    }

    #[test]
    fn snapshots_answer_acquire_and_show() {
        let name = LeaseName::new("n").unwrap();
        let row = LeaseRow {
            owner: "a".into(),
            token: 3,
            acquired_at: 10,
            expires_at: 20,
            renewals: 0,
        };
        let live = LeaseSnapshot::decode(&name, 15, Some(row.clone()), 3).unwrap();
        assert!(matches!(live.held(), Some(Acquire::Held { now: 15, .. })));
        let status = live.status(&name);
        assert_eq!(status.holder.map(|l| l.token), Some(FencingToken::new(3)));
        assert_eq!(status.last_token, Some(FencingToken::new(3)));
        let expired = LeaseSnapshot::decode(&name, 20, Some(row), 3).unwrap();
        assert_eq!(expired.held(), None);
        assert_eq!(expired.status(&name).holder, None);
    }

    /// Steps that write nothing but a log: what each change did, in order, and the
    /// writes that reached a commit.
    struct Fake {
        lease: Option<Lease>,
        now: Millis,
        committed: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    }

    type FakeTx = (std::sync::Arc<std::sync::Mutex<Vec<String>>>, Vec<String>);

    impl LeaseSteps for Fake {
        type Tx = FakeTx;

        async fn lock<'a>(
            &'a self,
            _: &'a LeaseName,
        ) -> Result<(FakeTx, Option<Lease>, Millis), LeaseError> {
            let tx = (self.committed.clone(), Vec::new());
            Ok((tx, self.lease.clone(), self.now))
        }

        async fn record<'a>(
            &'a self,
            tx: &'a mut FakeTx,
            event: &'a LeaseEvent,
        ) -> Result<(), LeaseError> {
            let detail = event.detail.as_deref().unwrap_or("-");
            tx.1.push(format!("record {} {detail}", event.kind));
            Ok(())
        }

        async fn end<'a>(
            &'a self,
            tx: &'a mut FakeTx,
            _: &'a LeaseName,
            now: Millis,
        ) -> Result<(), LeaseError> {
            tx.1.push(format!("end {now}"));
            Ok(())
        }

        async fn extend<'a>(
            &'a self,
            tx: &'a mut FakeTx,
            lease: &'a Lease,
        ) -> Result<(), LeaseError> {
            tx.1.push(format!("extend {} {}", lease.expires_at, lease.renewals));
            Ok(())
        }

        async fn end_held<'a>(
            &'a self,
            tx: &'a mut FakeTx,
            released: &'a LeaseEvent,
        ) -> Result<(), LeaseError> {
            tx.1.push(format!("end_held {}", released.kind));
            Ok(())
        }

        fn mismatched(&self, _: &LeaseName, owner: &OwnerId, _: FencingToken, detail: &str) {
            let line = format!("warn {owner}: {detail}");
            self.committed.lock().unwrap().push(line);
        }

        async fn commit((log, writes): FakeTx) -> Result<(), LeaseError> {
            log.lock().unwrap().extend(writes);
            Ok(())
        }
    }

    fn block_on<F: Future>(f: F) -> F::Output {
        struct Noop;
        impl std::task::Wake for Noop {
            fn wake(self: std::sync::Arc<Self>) {}
        }
        let waker = std::task::Waker::from(std::sync::Arc::new(Noop));
        let mut cx = std::task::Context::from_waker(&waker);
        let mut f = std::pin::pin!(f);
        loop {
            if let std::task::Poll::Ready(out) = f.as_mut().poll(&mut cx) {
                return out;
            }
        }
    }

    #[test]
    fn locked_changes_follow_the_lease_rules() {
        let name = LeaseName::new("n").unwrap();
        let a = OwnerId::new("a").unwrap();
        let b = OwnerId::new("b").unwrap();
        let t = FencingToken::new(3);
        let ttl = Duration::from_millis(50);
        let lease = Lease::granted(&name, &a, t, 10, 20);
        let fake = |now| Fake {
            lease: Some(lease.clone()),
            now,
            committed: Default::default(),
        };
        let log = |f: &Fake| f.committed.lock().unwrap().clone();

        let f = fake(15);
        let Renew::Renewed(renewed) = block_on(f.renew(&name, &a, t, ttl)).unwrap() else {
            panic!("the holder renews");
        };
        assert_eq!((renewed.expires_at, renewed.renewals), (65, 1));
        assert_eq!(log(&f), ["extend 65 1", "record renewed -"]);

        let f = fake(15);
        let answer = block_on(f.renew(&name, &b, t, ttl)).unwrap();
        assert_eq!(
            answer,
            Renew::NotHolder {
                current: Some(lease.clone())
            }
        );
        assert_eq!(
            log(&f),
            ["record renew_rejected held by a with token 3 until 20"]
        );

        let f = fake(20);
        let answer = block_on(f.renew(&name, &a, t, ttl)).unwrap();
        assert_eq!(answer, Renew::NotHolder { current: None });
        assert_eq!(
            log(&f),
            [
                "record expired -",
                "end 20",
                "record renew_rejected no live lease"
            ]
        );

        let f = fake(15);
        let answer = block_on(f.release(&name, &a, t)).unwrap();
        assert!(matches!(
            answer,
            Release::Released {
                released_at: 15,
                ..
            }
        ));
        assert_eq!(log(&f), ["end_held released"]);

        let f = fake(15);
        let answer = block_on(f.release(&name, &a, FencingToken::new(2))).unwrap();
        assert!(matches!(answer, Release::NotHolder { current: Some(_) }));
        assert_eq!(
            log(&f),
            [
                "warn a: held by a with token 3 until 20",
                "record release_owner_mismatch held by a with token 3 until 20"
            ]
        );

        let f = fake(15);
        let removed = block_on(f.force_release(&name, "INC-7")).unwrap();
        assert_eq!(removed, Some(lease.clone()));
        assert_eq!(log(&f), ["end 15", "record force_released INC-7"]);

        let f = fake(30);
        assert_eq!(block_on(f.force_release(&name, "INC-7")).unwrap(), None);
        assert_eq!(
            log(&f),
            ["record expired -", "end 30", "record force_released INC-7"]
        );

        // Bad input is refused before the lock: nothing is written.
        let f = fake(15);
        let err = block_on(f.renew(&name, &a, t, Duration::ZERO)).unwrap_err();
        assert_eq!(err.kind(), idem_core::ErrorKind::InvalidInput);
        let err = block_on(f.force_release(&name, " ")).unwrap_err();
        assert_eq!(err.kind(), idem_core::ErrorKind::InvalidInput);
        assert!(log(&f).is_empty());
    }
}
