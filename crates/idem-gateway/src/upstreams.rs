//! The upstreams one gateway fronts: which one a request goes to, and passive health.
//!
//! Owns the choice of upstream and each upstream's health (consecutive failures,
//! ejection); it does not talk HTTP itself ([`crate::upstream::Upstream`] does) and
//! does not decide what a failure means for the request (the caller does).
//!
//! **Choice: least in flight.** A request goes to the healthy upstream with the fewest
//! requests this gateway has in flight to it, ties taken in turn. Round robin would keep
//! sending every n-th request to an upstream that has stopped answering (a long GC
//! pause, a SIGSTOP) until enough of them time out to eject it; with least in flight the
//! requests stuck there count against it at once, so new ones go elsewhere within a
//! request or two.
//!
//! **Passive health** (nginx `max_fails`/`fail_timeout`, Envoy outlier detection):
//! `consecutive_failures` failures in a row (no answer: connect failure, timeout,
//! connection broken before the answer) eject an upstream for `eject_ms`; any answer,
//! 5xx included, resets the count. Failures of requests sent before an ejection do not
//! extend it. After it the upstream gets requests again, on probation: its count stays
//! at the threshold, so one more failure ejects it again and one answer clears it.
//! When every upstream is ejected, the gateway does not refuse the request: it goes to
//! the upstream whose ejection ends first.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;

use crate::metrics::GatewayMetrics;
use crate::upstream::{Exchange, PassError, StateError, Upstream};

/// When an upstream is ejected, and for how long.
#[derive(Debug, Clone, Copy)]
pub struct HealthPolicy {
    pub consecutive_failures: u32,
    pub eject: Duration,
}

#[derive(Debug, Clone, Default)]
struct MemberHealth {
    failures: u32,
    ejected_until: Option<Instant>,
}

/// The health of n upstreams: a state machine that is told the time, so it is tested
/// without waiting.
#[derive(Debug, Clone)]
pub struct Health {
    policy: HealthPolicy,
    members: Vec<MemberHealth>,
}

impl Health {
    pub fn new(n: usize, policy: HealthPolicy) -> Self {
        Self {
            policy,
            members: vec![MemberHealth::default(); n],
        }
    }

    pub fn is_ejected(&self, i: usize, now: Instant) -> bool {
        self.members[i].ejected_until.is_some_and(|t| now < t)
    }

    /// Upstreams not ejected at `now`.
    pub fn healthy(&self, now: Instant) -> usize {
        (0..self.members.len())
            .filter(|&i| !self.is_ejected(i, now))
            .count()
    }

    /// An answer from `i`: its failure count starts again (an ejection runs its course).
    pub fn success(&mut self, i: usize) {
        self.members[i].failures = 0;
    }

    /// No answer from `i`. Returns whether this failure ejected it.
    pub fn failure(&mut self, i: usize, now: Instant) -> bool {
        if self.is_ejected(i, now) {
            // Sent before the ejection: it says nothing new.
            return false;
        }
        let m = &mut self.members[i];
        m.failures = m.failures.saturating_add(1);
        if m.failures < self.policy.consecutive_failures {
            return false;
        }
        // The count stays at the threshold: after the ejection one more failure is
        // enough to eject it again.
        m.failures = self.policy.consecutive_failures;
        m.ejected_until = Some(now + self.policy.eject);
        true
    }

    /// The upstream for a request: among those not ejected (leaving out `avoid` when
    /// another is healthy), the one with the fewest `in_flight`, ties taken from
    /// `start` on. With every upstream ejected, the one whose ejection ends first
    /// (`avoid` again only when it is the only one).
    pub fn choose(
        &self,
        now: Instant,
        start: usize,
        avoid: Option<usize>,
        in_flight: impl Fn(usize) -> usize,
    ) -> usize {
        let n = self.members.len();
        let best = |skip: Option<usize>| {
            (0..n)
                .map(|k| (start + k) % n)
                .filter(|&i| Some(i) != skip && !self.is_ejected(i, now))
                .min_by_key(|&i| in_flight(i))
        };
        let back_first = |skip: Option<usize>| {
            (0..n)
                .filter(|&i| Some(i) != skip)
                .min_by_key(|&i| self.members[i].ejected_until)
        };
        best(avoid)
            .or_else(|| best(None))
            .or_else(|| back_first(avoid))
            .or_else(|| back_first(None))
            .unwrap_or(0)
    }
}

/// One upstream and what the gateway tracks of it.
struct Member {
    client: Upstream,
    /// Its URL without credentials: the metric label and the log field.
    label: String,
    in_flight: AtomicUsize,
    /// Whether its failure count may be above zero (an answer then takes the lock).
    failing: AtomicBool,
    requests: Counter,
    ejections: Counter,
}

/// The gateway's upstreams: one client each, the choice per request, their health.
pub(crate) struct Upstreams {
    members: Vec<Member>,
    policy: HealthPolicy,
    health: Mutex<Health>,
    next: AtomicUsize,
    metrics: Arc<GatewayMetrics>,
}

/// How an exchange with an upstream went, for its health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Heard {
    /// It answered (any status).
    Answer,
    /// No answer: connect failure, timeout, broken connection.
    Nothing,
    /// Nothing to learn about the upstream (the client's body stalled).
    Neither,
}

impl From<&Exchange> for Heard {
    fn from(e: &Exchange) -> Self {
        match e {
            Exchange::Complete(_) | Exchange::TooLarge => Heard::Answer,
            Exchange::NotSent(_) | Exchange::Uncertain(_) => Heard::Nothing,
        }
    }
}

impl<T> From<&Result<T, PassError>> for Heard {
    fn from(r: &Result<T, PassError>) -> Self {
        match r {
            Ok(_) => Heard::Answer,
            Err(PassError::ClientStalled) => Heard::Neither,
            Err(PassError::NotSent(_) | PassError::Timeout | PassError::Failed(_)) => {
                Heard::Nothing
            }
        }
    }
}

impl<T> From<&Result<T, StateError>> for Heard {
    fn from(r: &Result<T, StateError>) -> Self {
        match r {
            Ok(_) | Err(StateError::Answered(_)) => Heard::Answer,
            Err(StateError::NoAnswer(_)) => Heard::Nothing,
        }
    }
}

/// A request's upstream, counted in flight until dropped.
pub(crate) struct Picked<'a> {
    owner: &'a Upstreams,
    index: usize,
}

impl Picked<'_> {
    pub fn client(&self) -> &Upstream {
        &self.owner.members[self.index].client
    }

    pub fn index(&self) -> usize {
        self.index
    }

    /// Records what the exchange told about the upstream's health.
    pub fn heard(&self, heard: Heard) {
        self.owner.heard(self.index, heard, Instant::now());
    }
}

impl Drop for Picked<'_> {
    fn drop(&mut self) {
        self.owner.members[self.index]
            .in_flight
            .fetch_sub(1, Ordering::Relaxed);
    }
}

impl Upstreams {
    /// `clients` in configuration order (at least one), with their URLs.
    pub fn new(
        clients: Vec<(Upstream, &str)>,
        policy: HealthPolicy,
        metrics: Arc<GatewayMetrics>,
    ) -> Self {
        let members: Vec<Member> = clients
            .into_iter()
            .map(|(client, url)| {
                let label = crate::upstream::without_userinfo(url);
                let (requests, ejections) = metrics.upstream(&label);
                Member {
                    client,
                    label,
                    in_flight: AtomicUsize::new(0),
                    failing: AtomicBool::new(false),
                    requests,
                    ejections,
                }
            })
            .collect();
        metrics.set_upstreams_healthy(members.len());
        Self {
            health: Mutex::new(Health::new(members.len(), policy)),
            members,
            policy,
            next: AtomicUsize::new(0),
            metrics,
        }
    }

    fn health(&self) -> std::sync::MutexGuard<'_, Health> {
        // Every update leaves the state whole: a poisoned one is still usable.
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// The URLs (without credentials), in configuration order.
    pub fn labels(&self) -> impl Iterator<Item = &str> {
        self.members.iter().map(|m| m.label.as_str())
    }

    /// An upstream for one request; `avoid` (one that just failed it) is left out when
    /// another is healthy.
    pub fn pick(&self, avoid: Option<usize>) -> Picked<'_> {
        let index = if self.members.len() == 1 {
            0
        } else {
            let start = self.next.fetch_add(1, Ordering::Relaxed) % self.members.len();
            self.health().choose(Instant::now(), start, avoid, |i| {
                self.members[i].in_flight.load(Ordering::Relaxed)
            })
        };
        let m = &self.members[index];
        m.in_flight.fetch_add(1, Ordering::Relaxed);
        m.requests.inc();
        Picked { owner: self, index }
    }

    fn heard(&self, i: usize, heard: Heard, now: Instant) {
        let m = &self.members[i];
        match heard {
            Heard::Neither => {}
            Heard::Answer => {
                // A load first: the common case (no failure) writes nothing shared.
                if m.failing.load(Ordering::Relaxed) && m.failing.swap(false, Ordering::Relaxed) {
                    self.health().success(i);
                }
            }
            Heard::Nothing => {
                let mut health = self.health();
                let ejected = health.failure(i, now);
                // Under the lock, after the count: an answer that clears the flag
                // then also clears this failure.
                m.failing.store(true, Ordering::Relaxed);
                if ejected {
                    let healthy = health.healthy(now);
                    drop(health);
                    m.ejections.inc();
                    self.metrics.set_upstreams_healthy(healthy);
                    tracing::warn!(
                        upstream = %m.label,
                        healthy,
                        of = self.members.len(),
                        "upstream failed {} times in a row; no new requests to it for {} ms",
                        self.policy.consecutive_failures,
                        self.policy.eject.as_millis()
                    );
                }
            }
        }
    }

    /// Upstreams not ejected now (also set in the gauge).
    pub fn healthy(&self) -> usize {
        let healthy = self.health().healthy(Instant::now());
        self.metrics.set_upstreams_healthy(healthy);
        healthy
    }

    /// The URLs (without credentials) of the upstreams ejected now.
    pub fn ejected(&self) -> Vec<&str> {
        let now = Instant::now();
        let health = self.health();
        (0..self.members.len())
            .filter(|&i| health.is_ejected(i, now))
            .map(|i| self.members[i].label.as_str())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EJECT: Duration = Duration::from_secs(5);

    fn health(n: usize) -> Health {
        Health::new(
            n,
            HealthPolicy {
                consecutive_failures: 3,
                eject: EJECT,
            },
        )
    }

    /// Three failures in a row at `at`: `i` is out.
    fn eject(h: &mut Health, i: usize, at: Instant) {
        for _ in 0..3 {
            h.failure(i, at);
        }
        assert!(h.is_ejected(i, at));
    }

    fn ms(t: Instant, ms: u64) -> Instant {
        t + Duration::from_millis(ms)
    }

    #[test]
    fn three_failures_in_a_row_eject_for_the_ejection_time() {
        let t = Instant::now();
        let mut h = health(2);
        assert!(!h.failure(0, t));
        assert!(!h.failure(0, ms(t, 10)));
        assert_eq!(h.healthy(ms(t, 10)), 2);
        assert!(h.failure(0, ms(t, 20)), "the third ejects");
        assert!(h.is_ejected(0, ms(t, 20)));
        assert_eq!(h.healthy(ms(t, 20)), 1);
        assert!(h.is_ejected(0, ms(t, 20 + 4_999)));
        assert!(!h.is_ejected(0, ms(t, 20 + 5_000)), "back after eject_ms");
        assert_eq!(h.healthy(ms(t, 20 + 5_000)), 2);
    }

    #[test]
    fn an_answer_resets_the_count() {
        let t = Instant::now();
        let mut h = health(1);
        h.failure(0, t);
        h.failure(0, t);
        h.success(0);
        assert!(!h.failure(0, t));
        assert!(!h.failure(0, t));
        assert!(h.failure(0, t), "three in a row after the answer");
    }

    #[test]
    fn failures_sent_before_an_ejection_do_not_extend_it() {
        let t = Instant::now();
        let mut h = health(1);
        eject(&mut h, 0, t);
        assert!(!h.failure(0, ms(t, 4_000)), "already out");
        assert!(!h.is_ejected(0, ms(t, 5_000)), "ends when the first said");
    }

    #[test]
    fn after_an_ejection_one_failure_ejects_again_and_one_answer_clears_it() {
        let t = Instant::now();
        let mut h = health(1);
        eject(&mut h, 0, t);
        let back = ms(t, 5_000);
        assert!(h.failure(0, back), "on probation: one failure is enough");
        assert!(h.is_ejected(0, ms(back, 4_999)));
        let back = ms(back, 5_000);
        h.success(0);
        assert!(!h.failure(0, back), "cleared: the count starts again");
        assert!(!h.is_ejected(0, back));
    }

    #[test]
    fn the_least_loaded_healthy_upstream_is_chosen_ties_in_turn() {
        let t = Instant::now();
        let h = health(3);
        let loads = [4, 1, 1];
        assert_eq!(h.choose(t, 0, None, |i| loads[i]), 1);
        assert_eq!(h.choose(t, 2, None, |i| loads[i]), 2, "a tie goes in turn");
        let idle = |_| 0;
        let picks: Vec<usize> = (0..6).map(|s| h.choose(t, s % 3, None, idle)).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn an_ejected_upstream_gets_nothing_while_another_is_healthy() {
        let t = Instant::now();
        let mut h = health(2);
        eject(&mut h, 0, t);
        let loads = [0, 100];
        for start in 0..2 {
            assert_eq!(h.choose(ms(t, 1), start, None, |i| loads[i]), 1);
        }
        assert_eq!(h.choose(ms(t, 5_000), 0, None, |i| loads[i]), 0, "back");
    }

    #[test]
    fn avoid_is_left_out_only_while_another_is_healthy() {
        let t = Instant::now();
        let mut h = health(2);
        assert_eq!(h.choose(t, 0, Some(0), |_| 0), 1);
        eject(&mut h, 1, t);
        assert_eq!(h.choose(t, 0, Some(0), |_| 0), 0, "the only healthy one");
    }

    #[test]
    fn with_every_upstream_ejected_the_one_back_first_is_chosen() {
        let t = Instant::now();
        let mut h = health(3);
        for (i, at) in [(0, 300), (1, 100), (2, 200)] {
            eject(&mut h, i, ms(t, at));
        }
        assert_eq!(h.healthy(ms(t, 300)), 0);
        for start in 0..3 {
            assert_eq!(h.choose(ms(t, 300), start, None, |_| 0), 1);
            assert_eq!(h.choose(ms(t, 300), start, Some(1), |_| 0), 2, "the next");
        }
        let mut one = health(1);
        eject(&mut one, 0, t);
        assert_eq!(one.choose(t, 0, Some(0), |_| 0), 0, "the only one");
    }
}
