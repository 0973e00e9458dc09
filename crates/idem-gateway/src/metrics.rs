//! What the gateway counts, in the Prometheus text format at `<admin_prefix>/metrics`.
//!
//! Every gateway instance owns its own registry (no global recorder), so tests and the
//! bench can start several in one process.
//!
//! | metric | meaning |
//! |---|---|
//! | `idem_gateway_requests_total{route}` | requests, by `passthrough`, `keyed`, `admin` |
//! | `idem_gateway_upstream_calls_total{route}` | requests sent upstream (state queries excluded) |
//! | `idem_gateway_coalesced_waiters_total` | duplicates that waited for another request's execution |
//! | `idem_gateway_window_hits_total` | duplicates answered from the short window |
//! | `idem_gateway_uncertain_results_total` | keyed upstream calls that timed out or broke after sending |
//! | `idem_gateway_state_queries_total{result}` | key state queries: `succeeded`, `processing`, `absent`, `error` |
//! | `idem_gateway_uncertain_resends_total` | same-key re-sends after the upstream reported the key absent |
//! | `idem_gateway_problems_total{type}` | error responses, by problem slug |
//! | `idem_gateway_degraded` | 1 while the shared window (Redis) is unreachable |
//! | `idem_gateway_degraded_requests_total` | keyed requests forwarded without the window |
//! | `idem_gateway_caller_quota_refusals_total` | new keys refused because their caller's share (window bytes, keys in progress) was used up |
//! | `idem_gateway_body_budget_refusals_total` | keyed requests refused because the body buffering budget was used up |
//! | `idem_gateway_buffered_body_bytes` | bytes of keyed request bodies buffered now |
//! | `idem_gateway_upstream_requests_total{upstream}` | requests sent to each upstream (state queries and re-sends included) |
//! | `idem_gateway_upstream_ejections_total{upstream}` | times an upstream was left out after failing in a row |
//! | `idem_gateway_upstreams_healthy` | upstreams not ejected (as of the last failure or scrape) |
//!
//! The `upstream` label is the upstream's URL without any `user:password@`.

use std::sync::atomic::AtomicI64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type Labels = [(&'static str, &'static str); 1];
/// By upstream URL (credentials stripped).
type UpstreamLabel = [(&'static str, String); 1];

/// The gateway's counters. Cheap to read from tests through the getters.
pub struct GatewayMetrics {
    registry: Registry,
    requests: Family<Labels, Counter>,
    upstream_calls: Family<Labels, Counter>,
    coalesced: Counter,
    window_hits: Counter,
    uncertain: Counter,
    state_queries: Family<Labels, Counter>,
    resends: Counter,
    problems: Family<Labels, Counter>,
    degraded: Gauge<i64, AtomicI64>,
    degraded_requests: Counter,
    window_full: Gauge<i64, AtomicI64>,
    window_full_refusals: Counter,
    caller_quota_refusals: Counter,
    body_budget_refusals: Counter,
    buffered_body_bytes: Gauge<i64, AtomicI64>,
    upstream_requests: Family<UpstreamLabel, Counter>,
    upstream_ejections: Family<UpstreamLabel, Counter>,
    upstreams_healthy: Gauge<i64, AtomicI64>,
    /// Hot-path handles into the families above (no label hashing per request).
    hot: [Counter; 5],
}

const ROUTES: [&str; 3] = ["passthrough", "keyed", "admin"];

impl std::fmt::Debug for GatewayMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayMetrics").finish_non_exhaustive()
    }
}

impl Default for GatewayMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl GatewayMetrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("idem_gateway");
        let m = Self {
            registry: Registry::default(),
            requests: Family::default(),
            upstream_calls: Family::default(),
            coalesced: Counter::default(),
            window_hits: Counter::default(),
            uncertain: Counter::default(),
            state_queries: Family::default(),
            resends: Counter::default(),
            problems: Family::default(),
            degraded: Gauge::default(),
            degraded_requests: Counter::default(),
            window_full: Gauge::default(),
            window_full_refusals: Counter::default(),
            caller_quota_refusals: Counter::default(),
            body_budget_refusals: Counter::default(),
            buffered_body_bytes: Gauge::default(),
            upstream_requests: Family::default(),
            upstream_ejections: Family::default(),
            upstreams_healthy: Gauge::default(),
            hot: Default::default(),
        };
        registry.register("requests", "Requests received", m.requests.clone());
        registry.register(
            "upstream_calls",
            "Requests sent upstream (state queries excluded)",
            m.upstream_calls.clone(),
        );
        registry.register(
            "coalesced_waiters",
            "Duplicates that waited for another request's execution",
            m.coalesced.clone(),
        );
        registry.register(
            "window_hits",
            "Duplicates answered from the short window",
            m.window_hits.clone(),
        );
        registry.register(
            "uncertain_results",
            "Keyed upstream calls that timed out or broke after the request was sent",
            m.uncertain.clone(),
        );
        registry.register(
            "state_queries",
            "Key state queries sent to the upstream, by result",
            m.state_queries.clone(),
        );
        registry.register(
            "uncertain_resends",
            "Same-key re-sends after the upstream reported the key absent",
            m.resends.clone(),
        );
        registry.register("problems", "Error responses, by type", m.problems.clone());
        registry.register(
            "degraded",
            "1 while the shared window is unreachable (keys still forwarded)",
            m.degraded.clone(),
        );
        registry.register(
            "degraded_requests",
            "Keyed requests forwarded without the window",
            m.degraded_requests.clone(),
        );
        registry.register(
            "window_full",
            "1 while the in-memory window is full and refuses new keys (503)",
            m.window_full.clone(),
        );
        registry.register(
            "window_full_refusals",
            "New keys refused because the in-memory window was full",
            m.window_full_refusals.clone(),
        );
        registry.register(
            "caller_quota_refusals",
            "New keys refused because their caller's share of the window or of the keys in progress was used up",
            m.caller_quota_refusals.clone(),
        );
        registry.register(
            "body_budget_refusals",
            "Keyed requests refused because the body buffering budget was used up",
            m.body_budget_refusals.clone(),
        );
        registry.register(
            "buffered_body_bytes",
            "Bytes of keyed request bodies buffered now",
            m.buffered_body_bytes.clone(),
        );
        registry.register(
            "upstream_requests",
            "Requests sent to each upstream, state queries and re-sends included",
            m.upstream_requests.clone(),
        );
        registry.register(
            "upstream_ejections",
            "Times an upstream was left out after failing in a row",
            m.upstream_ejections.clone(),
        );
        registry.register(
            "upstreams_healthy",
            "Upstreams not ejected",
            m.upstreams_healthy.clone(),
        );
        // Through a function: each family read guard is gone before the next
        // get_or_create takes the write lock (in one array literal they would all live
        // to the end of the statement and deadlock).
        let counter = |f: &Family<Labels, Counter>, route: &'static str| -> Counter {
            f.get_or_create(&[("route", route)]).clone()
        };
        let hot = [
            counter(&m.requests, ROUTES[0]),
            counter(&m.requests, ROUTES[1]),
            counter(&m.requests, ROUTES[2]),
            counter(&m.upstream_calls, ROUTES[0]),
            counter(&m.upstream_calls, ROUTES[1]),
        ];
        Self { registry, hot, ..m }
    }

    pub(crate) fn request(&self, route: &'static str) {
        match ROUTES.iter().position(|r| *r == route) {
            Some(i) => self.hot[i].inc(),
            None => self.requests.get_or_create(&[("route", route)]).inc(),
        };
    }
    pub(crate) fn upstream_call(&self, route: &'static str) {
        match ROUTES.iter().position(|r| *r == route) {
            Some(i) if i < 2 => self.hot[3 + i].inc(),
            _ => self.upstream_calls.get_or_create(&[("route", route)]).inc(),
        };
    }
    pub(crate) fn coalesced(&self) {
        self.coalesced.inc();
    }
    pub(crate) fn window_hit(&self) {
        self.window_hits.inc();
    }
    pub(crate) fn uncertain(&self) {
        self.uncertain.inc();
    }
    pub(crate) fn state_query(&self, result: &'static str) {
        self.state_queries
            .get_or_create(&[("result", result)])
            .inc();
    }
    pub(crate) fn resend(&self) {
        self.resends.inc();
    }
    pub(crate) fn problem(&self, slug: &'static str) {
        self.problems.get_or_create(&[("type", slug)]).inc();
    }
    /// Sets degraded mode; returns the previous value (for logging transitions).
    pub(crate) fn set_degraded(&self, on: bool) -> bool {
        self.degraded.set(i64::from(on)) == 1
    }
    pub(crate) fn degraded_request(&self) {
        self.degraded_requests.inc();
    }
    pub(crate) fn window_full(&self) {
        self.window_full.set(1);
        self.window_full_refusals.inc();
    }
    /// The window's fill level as of now (read when health or metrics are asked for).
    pub(crate) fn set_window_full(&self, full: bool) {
        self.window_full.set(i64::from(full));
    }
    pub(crate) fn caller_quota(&self) {
        self.caller_quota_refusals.inc();
    }
    pub fn caller_quota_refusals(&self) -> u64 {
        self.caller_quota_refusals.get()
    }
    pub(crate) fn body_budget_refused(&self) {
        self.body_budget_refusals.inc();
    }
    pub(crate) fn buffered_body_bytes(&self, delta: i64) {
        self.buffered_body_bytes.inc_by(delta);
    }
    /// One upstream's request and ejection counters (`label` free of credentials).
    pub(crate) fn upstream(&self, label: &str) -> (Counter, Counter) {
        let l = [("upstream", label.to_string())];
        let requests = self.upstream_requests.get_or_create(&l).clone();
        let ejections = self.upstream_ejections.get_or_create(&l).clone();
        (requests, ejections)
    }
    pub(crate) fn set_upstreams_healthy(&self, n: usize) {
        self.upstreams_healthy.set(n as i64);
    }
    pub fn upstream_requests(&self, label: &str) -> u64 {
        let l = [("upstream", label.to_string())];
        self.upstream_requests.get_or_create(&l).get()
    }
    pub fn upstream_ejections(&self, label: &str) -> u64 {
        let l = [("upstream", label.to_string())];
        self.upstream_ejections.get_or_create(&l).get()
    }
    pub fn upstreams_healthy(&self) -> u64 {
        self.upstreams_healthy.get().max(0) as u64
    }
    pub fn window_full_refusals(&self) -> u64 {
        self.window_full_refusals.get()
    }

    pub fn requests(&self, route: &'static str) -> u64 {
        self.requests.get_or_create(&[("route", route)]).get()
    }
    pub fn upstream_calls(&self, route: &'static str) -> u64 {
        self.upstream_calls.get_or_create(&[("route", route)]).get()
    }
    pub fn coalesced_waiters(&self) -> u64 {
        self.coalesced.get()
    }
    pub fn window_hits(&self) -> u64 {
        self.window_hits.get()
    }
    pub fn uncertain_results(&self) -> u64 {
        self.uncertain.get()
    }
    pub fn state_queries(&self, result: &'static str) -> u64 {
        self.state_queries
            .get_or_create(&[("result", result)])
            .get()
    }
    pub fn uncertain_resends(&self) -> u64 {
        self.resends.get()
    }
    pub fn problems(&self, slug: &'static str) -> u64 {
        self.problems.get_or_create(&[("type", slug)]).get()
    }
    pub fn is_degraded(&self) -> bool {
        self.degraded.get() == 1
    }
    pub fn degraded_requests(&self) -> u64 {
        self.degraded_requests.get()
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}
