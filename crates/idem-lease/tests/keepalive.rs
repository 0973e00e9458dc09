//! Keepalive, waiting acquire and metrics, on the embedded store in real time (short
//! ttls; the store-clock timelines live in the conformance suite).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{
    Acquire, FencingToken, Lease, LeaseError, LeaseEvent, LeaseEventKind, LeaseName, LeaseStatus,
    LeaseStore, Millis, OwnerId, Release, Renew,
};
use idem_lease::{acquire_wait, Acquired, LeaseGuard, LeaseMetrics, LeaseState, LostReason};
use idem_sqlite::SqliteStore;
use prometheus_client::registry::Registry;
use tokio::time::{timeout, Instant};

fn name(s: &str) -> LeaseName {
    LeaseName::new(s).unwrap()
}

fn owner(s: &str) -> OwnerId {
    OwnerId::new(s).unwrap()
}

fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

async fn open() -> (tempfile::TempDir, Arc<SqliteStore>) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open_path(dir.path().join("idem.db"))
        .await
        .unwrap();
    (dir, Arc::new(store))
}

async fn guard(
    store: Arc<dyn LeaseStore>,
    n: &LeaseName,
    who: &str,
    ttl: Duration,
    metrics: &LeaseMetrics,
) -> LeaseGuard {
    match LeaseGuard::acquire(store, n, &owner(who), ttl, ms(0), metrics.clone())
        .await
        .unwrap()
    {
        Acquired::Guard(g) => g,
        Acquired::Busy { holder, .. } => panic!("held by {holder:?}"),
    }
}

fn count(events: &[LeaseEvent], kind: LeaseEventKind, token: FencingToken) -> usize {
    events
        .iter()
        .filter(|e| e.kind == kind && e.token == Some(token))
        .count()
}

fn metrics_text(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
    out
}

/// Waits until the guard's state satisfies `pred`, or fails after `within`.
async fn wait_state(
    rx: &mut tokio::sync::watch::Receiver<LeaseState>,
    within: Duration,
    pred: impl Fn(&LeaseState) -> bool,
) -> LeaseState {
    let matched = timeout(within, rx.wait_for(|s| pred(s)))
        .await
        .map(|r| r.expect("guard alive").clone());
    matched.unwrap_or_else(|_| panic!("state never matched; last {:?}", *rx.borrow()))
}

/// The keepalive renews about every ttl/3, so a holder working 2.5 ttls keeps its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_holds_past_the_ttl() {
    let (_dir, store) = open().await;
    let n = name("keepalive");
    let g = guard(store.clone(), &n, "A", ms(600), &LeaseMetrics::default()).await;
    let token = g.lease().token;
    tokio::time::sleep(ms(1500)).await;
    assert!(g.is_valid(), "{:?}", g.state());
    assert!(matches!(
        store.try_acquire(&n, &owner("B"), ms(600)).await.unwrap(),
        Acquire::Held { .. }
    ));
    let renewals = g.lease().renewals;
    // 1.5 s at one renewal per 200 ms: about 7; a stalled or racing loop is far off.
    assert!((4..=10).contains(&renewals), "{renewals} renewals");
    assert!(matches!(
        g.release().await.unwrap(),
        Release::Released { .. }
    ));
    let ev = store.events(&n, 100).await.unwrap();
    assert_eq!(
        count(&ev, LeaseEventKind::Renewed, token),
        renewals as usize
    );
}

/// A refused renewal flips the state to lost within a renewal period, is counted, and
/// stops protected writes before they start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_renewal_tells_the_holder() {
    let (_dir, store) = open().await;
    let mut registry = Registry::default();
    let metrics = LeaseMetrics::register(&mut registry);
    let n = name("refused");
    let g = guard(store.clone(), &n, "A", ms(900), &metrics).await;
    let mut rx = g.subscribe();
    store.force_release(&n, "test: take it away").await.unwrap();
    let b = store
        .try_acquire(&n, &owner("B"), ms(30_000))
        .await
        .unwrap()
        .granted()
        .unwrap();

    let state = wait_state(&mut rx, ms(2000), |s| matches!(s, LeaseState::Lost { .. })).await;
    assert_eq!(
        state,
        LeaseState::Lost {
            lease: g.lease(),
            reason: LostReason::NotHolder {
                current: Some(b.clone())
            }
        }
    );
    assert!(!g.is_valid());
    assert!(matches!(g.check(), Err(LeaseError::Lost { .. })));
    let wrote = AtomicBool::new(false);
    let err = g
        .fenced(|_| async {
            wrote.store(true, Ordering::SeqCst);
            Ok(())
        })
        .await
        .unwrap_err();
    assert!(matches!(err, LeaseError::Lost { .. }));
    assert!(!wrote.load(Ordering::SeqCst), "a lost guard ran the write");

    assert!(matches!(
        g.release().await.unwrap(),
        Release::NotHolder { current: Some(l) } if l == b
    ));
    let text = metrics_text(&registry);
    assert!(
        text.contains("idem_lease_renew_failures_total{reason=\"not_holder\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("idem_lease_owner_mismatch_releases_total 1"),
        "{text}"
    );
}

/// The embedded store with faults a network store has: renewals that fail on demand,
/// renewals delivered late (already sent, so cancelling the caller does not stop them),
/// and a count of acquire attempts.
struct Instrumented {
    inner: Arc<SqliteStore>,
    failing: AtomicBool,
    renew_delay: Duration,
    acquires: AtomicUsize,
}

impl Instrumented {
    fn new(inner: Arc<SqliteStore>) -> Self {
        Self {
            inner,
            failing: AtomicBool::new(false),
            renew_delay: Duration::ZERO,
            acquires: AtomicUsize::new(0),
        }
    }
}

#[async_trait]
impl LeaseStore for Instrumented {
    async fn try_acquire(
        &self,
        name: &LeaseName,
        owner: &OwnerId,
        ttl: Duration,
    ) -> Result<Acquire, LeaseError> {
        self.acquires.fetch_add(1, Ordering::SeqCst);
        self.inner.try_acquire(name, owner, ttl).await
    }
    async fn renew(
        &self,
        name: &LeaseName,
        owner: &OwnerId,
        token: FencingToken,
        ttl: Duration,
    ) -> Result<Renew, LeaseError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(LeaseError::Unavailable("injected".into()));
        }
        let (inner, delay) = (self.inner.clone(), self.renew_delay);
        let (name, owner) = (name.clone(), owner.clone());
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            inner.renew(&name, &owner, token, ttl).await
        })
        .await
        .expect("renew task")
    }
    async fn release(
        &self,
        name: &LeaseName,
        owner: &OwnerId,
        token: FencingToken,
    ) -> Result<Release, LeaseError> {
        self.inner.release(name, owner, token).await
    }
    async fn force_release(
        &self,
        name: &LeaseName,
        reason: &str,
    ) -> Result<Option<Lease>, LeaseError> {
        self.inner.force_release(name, reason).await
    }
    async fn show(&self, name: &LeaseName) -> Result<LeaseStatus, LeaseError> {
        self.inner.show(name).await
    }
    async fn events(&self, name: &LeaseName, limit: usize) -> Result<Vec<LeaseEvent>, LeaseError> {
        self.inner.events(name, limit).await
    }
    async fn names(
        &self,
        after: Option<&LeaseName>,
        limit: usize,
    ) -> Result<Vec<LeaseName>, LeaseError> {
        self.inner.names(after, limit).await
    }

    async fn trim_events(&self, before: Millis, limit: usize) -> Result<u64, LeaseError> {
        self.inner.trim_events(before, limit).await
    }
}

/// Store errors put the guard in `RenewFailing` (still valid, retrying), a recovery
/// brings it back to `Held`, and errors past the local deadline lose the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_errors_are_loud_and_bounded() {
    let (_dir, inner) = open().await;
    let flaky = Arc::new(Instrumented::new(inner));
    flaky.failing.store(true, Ordering::SeqCst);
    let mut registry = Registry::default();
    let metrics = LeaseMetrics::register(&mut registry);
    let n = name("flaky");
    let g = guard(flaky.clone(), &n, "A", ms(1500), &metrics).await;
    let mut rx = g.subscribe();
    let failing = wait_state(&mut rx, ms(1000), |s| {
        matches!(s, LeaseState::RenewFailing { .. })
    })
    .await;
    assert!(failing.is_valid(), "time is left: {failing:?}");

    flaky.failing.store(false, Ordering::SeqCst);
    wait_state(&mut rx, ms(1000), |s| matches!(s, LeaseState::Held { .. })).await;
    assert!(g.is_valid());

    flaky.failing.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let lost = wait_state(&mut rx, ms(3000), |s| matches!(s, LeaseState::Lost { .. })).await;
    assert!(matches!(
        lost,
        LeaseState::Lost {
            reason: LostReason::Expired,
            ..
        }
    ));
    assert!(
        started.elapsed() <= ms(1500 + 300),
        "{:?}",
        started.elapsed()
    );
    assert!(!g.is_valid());
    let text = metrics_text(&registry);
    assert!(
        text.contains("idem_lease_renew_failures_total{reason=\"expired\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("idem_lease_renew_failures_total{reason=\"error\"}"),
        "{text}"
    );
    drop(g);
}

/// Release waits for the keepalive to stop, including a renewal already on its way to
/// the store: however the release falls between renewals, it succeeds and no renewal
/// (or renewal attempt) reaches the store after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_stops_renewal_without_race() {
    let (_dir, inner) = open().await;
    let store = Arc::new(Instrumented {
        renew_delay: ms(60),
        ..Instrumented::new(inner)
    });
    let n = name("release-race");
    let metrics = LeaseMetrics::default();
    let mut tokens = Vec::new();
    for i in 0..12u64 {
        let g = guard(store.clone(), &n, "A", ms(450), &metrics).await;
        tokens.push(g.lease().token);
        // Spread the releases over a few renewal periods (150 ms each).
        tokio::time::sleep(ms(i * 37 % 400)).await;
        let answer = g.release().await.unwrap();
        assert!(matches!(answer, Release::Released { .. }), "{answer:?}");
    }
    tokio::time::sleep(ms(500)).await;
    let ev = store.events(&n, 10_000).await.unwrap();
    for token in tokens {
        let of_token: Vec<_> = ev.iter().filter(|e| e.token == Some(token)).collect();
        let released = of_token
            .iter()
            .position(|e| e.kind == LeaseEventKind::Released)
            .expect("released");
        assert_eq!(
            released,
            of_token.len() - 1,
            "after release: {:?}",
            &of_token[released..]
        );
        assert_eq!(count(&ev, LeaseEventKind::RenewRejected, token), 0);
    }
    assert_eq!(store.show(&n).await.unwrap().holder, None);
}

/// A guard dropped without release stops renewing; the lease expires and the next
/// acquirer gets a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_guard_stops_renewing() {
    let (_dir, store) = open().await;
    let n = name("dropped");
    let g = guard(store.clone(), &n, "A", ms(400), &LeaseMetrics::default()).await;
    let a = g.lease();
    drop(g);
    let renewed = |ev: &[LeaseEvent]| count(ev, LeaseEventKind::Renewed, a.token);
    let before = renewed(&store.events(&n, 100).await.unwrap());
    let started = Instant::now();
    let b = acquire_wait(&*store, &n, &owner("B"), ms(400), ms(3000))
        .await
        .unwrap()
        .granted()
        .expect("the dropped lease expires");
    assert!(b.token > a.token);
    assert!(started.elapsed() < ms(1500), "{:?}", started.elapsed());
    tokio::time::sleep(ms(300)).await;
    let ev = store.events(&n, 100).await.unwrap();
    assert_eq!(renewed(&ev), before, "renewed after drop");
    assert_eq!(count(&ev, LeaseEventKind::Expired, a.token), 1);
}

/// A waiter gives up at its deadline with the holder's identity, having polled with
/// backoff rather than in a tight loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_gives_up_at_its_deadline() {
    let (_dir, inner) = open().await;
    let n = name("busy");
    let a = inner
        .try_acquire(&n, &owner("A"), ms(30_000))
        .await
        .unwrap()
        .granted()
        .unwrap();
    let counting = Instrumented::new(inner);
    let started = Instant::now();
    let answer = acquire_wait(&counting, &n, &owner("B"), ms(30_000), ms(600))
        .await
        .unwrap();
    let waited = started.elapsed();
    assert!(matches!(answer, Acquire::Held { ref holder, .. } if *holder == a));
    assert!(waited >= ms(600) && waited < ms(1200), "{waited:?}");
    let attempts = counting.acquires.load(Ordering::SeqCst);
    // 10 ms doubling to 500 ms, jittered: a handful of tries, not hundreds.
    assert!((3..=20).contains(&attempts), "{attempts} attempts");

    let once = acquire_wait(&counting, &n, &owner("B"), ms(30_000), ms(0))
        .await
        .unwrap();
    assert!(matches!(once, Acquire::Held { .. }));
    assert_eq!(counting.acquires.load(Ordering::SeqCst), attempts + 1);
}

/// A waiter gets the lease soon after the holder releases it, or when it expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_gets_the_lease_on_release_or_expiry() {
    let (_dir, store) = open().await;
    let n = name("handover");
    let a = store
        .try_acquire(&n, &owner("A"), ms(30_000))
        .await
        .unwrap()
        .granted()
        .unwrap();
    let releaser = {
        let store = store.clone();
        let a = a.clone();
        tokio::spawn(async move {
            tokio::time::sleep(ms(300)).await;
            store.release(&a.name, &a.owner, a.token).await.unwrap()
        })
    };
    let started = Instant::now();
    let b = acquire_wait(&*store, &n, &owner("B"), ms(500), ms(5000))
        .await
        .unwrap()
        .granted()
        .expect("granted after release");
    assert!(
        started.elapsed() < ms(300 + 500 + 400),
        "{:?}",
        started.elapsed()
    );
    assert!(b.token > a.token);
    releaser.await.unwrap();

    // B never releases: C waits for B's 500 ms lease to run out.
    let started = Instant::now();
    let c = acquire_wait(&*store, &n, &owner("C"), ms(500), ms(5000))
        .await
        .unwrap()
        .granted()
        .expect("granted after expiry");
    assert!(started.elapsed() < ms(500 + 400), "{:?}", started.elapsed());
    assert!(c.token > b.token);
}

/// Release records the hold fraction; a fenced write through the guard is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_record_hold_fraction_and_fenced_writes() {
    let (_dir, store) = open().await;
    let mut registry = Registry::default();
    let metrics = LeaseMetrics::register(&mut registry);
    let n = name("metrics");

    let g = guard(store.clone(), &n, "A", ms(10_000), &metrics).await;
    let a = g.lease();
    let write = |lease: Lease| {
        let store = store.clone();
        async move {
            store
                .fenced_write("metrics-resource", &lease, |_tx| Box::pin(async { Ok(()) }))
                .await
        }
    };
    g.fenced(write).await.unwrap();
    // An operator hands the lease to B, who writes; A's guard has not noticed yet.
    store.force_release(&n, "test: hand over").await.unwrap();
    let b = store
        .try_acquire(&n, &owner("B"), ms(10_000))
        .await
        .unwrap()
        .granted()
        .unwrap();
    write(b).await.unwrap();
    assert!(g.is_valid(), "the guard's next renewal is seconds away");
    let err = g.fenced(write).await.unwrap_err();
    assert_eq!(err.fenced().map(|f| f.token), Some(a.token));

    let g2 = guard(store.clone(), &name("metrics-2"), "C", ms(10_000), &metrics).await;
    assert!(matches!(
        g2.release().await.unwrap(),
        Release::Released { .. }
    ));
    let text = metrics_text(&registry);
    for line in [
        "idem_lease_fenced_rejections_total 1",
        "idem_lease_hold_fraction_count 1",
        "idem_lease_hold_fraction_bucket{le=\"0.1\"} 1",
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
    drop(g);
}

/// The alert rules read series these metrics export, under the same names.
#[test]
fn alert_rules_use_exported_series() {
    let rules = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/alerts/idem-alerts.yml"
    ))
    .unwrap();
    let mut registry = Registry::default();
    let m = LeaseMetrics::register(&mut registry);
    m.observe_hold(1, ms(10));
    m.renew_failure("error");
    let text = metrics_text(&registry);
    let referenced: Vec<&str> = rules
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("idem_lease_"))
        .collect();
    assert!(referenced.len() >= 3, "{referenced:?}");
    for series in referenced {
        assert!(
            text.contains(&format!("{series}{{")) || text.contains(&format!("{series} ")),
            "{series} is not exported:\n{text}"
        );
    }
    for alert in [
        "IdemLeaseHoldNearExpiry",
        "IdemLeaseOwnerMismatchRelease",
        "IdemDuplicateKeyConflictRate",
    ] {
        assert!(rules.contains(&format!("alert: {alert}")), "{alert}");
    }
    assert!(rules.contains("idem_lease_hold_fraction_bucket{le=\"0.7\"}"));
    assert!(rules.contains("idem_http_requests_total{decision=~\"mismatch|in_progress\"}"));
}
