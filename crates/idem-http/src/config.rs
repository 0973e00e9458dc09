//! What the layer does, per route and method: whether a key is required, what a
//! duplicate arriving while the first is in progress gets, what happens when the store is
//! down, limits, timeouts, and which parts of requests and responses count.
//!
//! Owns the defaults and their resolution for one request. It does no I/O and must not
//! reach into the store or the request body.

use std::time::Duration;

use http::header::{HeaderName, CONTENT_TYPE, ETAG, LOCATION};
use http::Method;
pub use idem_core::KeyRule;
use idem_core::{wire::PathPattern, Fingerprinter, OutcomePolicy};

use crate::routes::{self, RouteMatcher};

/// What a request gets when the first request with its key is still processing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InProgressMode {
    /// Answer 409 at once, with `Retry-After`.
    Reject { retry_after: Duration },
    /// Wait up to `max_wait` for the first request to finish and then replay its
    /// result; 409 if it has not finished by then. Woken when this process finishes the
    /// claim, or at the record's lease deadline when another process owns it.
    Wait { max_wait: Duration },
}

impl Default for InProgressMode {
    fn default() -> Self {
        InProgressMode::Reject {
            retry_after: Duration::from_secs(1),
        }
    }
}

/// What happens when the store cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StoreUnavailableMode {
    /// 503 with `Retry-After`; the handler is not called.
    #[default]
    FailClosed,
    /// Call the handler without idempotency protection (for routes that prefer
    /// availability to exactly-once, such as idempotent-by-nature writes).
    FailOpen,
}

/// Where the claim of a keyed request commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClaimMode {
    /// The layer claims before the handler runs (a commit of its own) and the handler,
    /// or the layer, finishes the record afterwards. Right for handlers that act on the
    /// outside world (a payment provider, another service) before they commit.
    #[default]
    Ahead,
    /// The handler claims inside its business transaction
    /// ([`crate::TransactionalClaim::deferred_request`]) and finishes there, so an
    /// idempotent write costs one commit; a concurrent duplicate waits on the unique
    /// index until the first commits, and a crash rolls the claim back with the rows.
    /// Only for handlers whose every effect is in that transaction. A layer with an
    /// archive ([`crate::IdempotencyLayer::with_archive`]) claims ahead instead.
    InTransaction,
}

/// A per-route (and optionally per-method) override. `route` is a pattern matched
/// against the request's concrete path: literal segments, `{name}` for one segment, a
/// final `*` or `{*name}` for any rest — so a router's template (`/v1/orders/{id}`)
/// applies to every order. A route that is not a valid pattern matches only itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteRule {
    // Private with its pattern: the pattern is computed from it once.
    route: String,
    pattern: Option<PathPattern>,
    pub method: Option<Method>,
    pub key: Option<KeyRule>,
    pub in_progress: Option<InProgressMode>,
    pub on_store_unavailable: Option<StoreUnavailableMode>,
    pub claim: Option<ClaimMode>,
}

impl RouteRule {
    /// The route as given.
    pub fn route(&self) -> &str {
        &self.route
    }

    pub fn new(route: impl Into<String>) -> Self {
        let route = route.into();
        Self {
            pattern: PathPattern::parse(&route).ok(),
            route,
            method: None,
            key: None,
            in_progress: None,
            on_store_unavailable: None,
            claim: None,
        }
    }

    pub fn claim(mut self, mode: ClaimMode) -> Self {
        self.claim = Some(mode);
        self
    }

    pub fn method(mut self, method: Method) -> Self {
        self.method = Some(method);
        self
    }

    pub fn key(mut self, key: KeyRule) -> Self {
        self.key = Some(key);
        self
    }

    pub fn in_progress(mut self, mode: InProgressMode) -> Self {
        self.in_progress = Some(mode);
        self
    }

    pub fn on_store_unavailable(mut self, mode: StoreUnavailableMode) -> Self {
        self.on_store_unavailable = Some(mode);
        self
    }
}

impl RouteMatcher for RouteRule {
    fn names_methods(&self) -> bool {
        self.method.is_some()
    }

    fn matches(&self, method: &Method, path: &str) -> bool {
        self.method.as_ref().is_none_or(|m| m == method)
            && match &self.pattern {
                Some(pattern) => pattern.matches(path),
                None => self.route == path,
            }
    }

    /// A rule that is not a pattern compares the whole path: the most specific.
    fn specificity(&self) -> (usize, usize, bool) {
        self.pattern
            .as_ref()
            .map_or((usize::MAX, usize::MAX, true), PathPattern::specificity)
    }
}

/// The rules in force for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolvedRules {
    pub key: KeyRule,
    pub in_progress: InProgressMode,
    pub on_store_unavailable: StoreUnavailableMode,
    pub claim: ClaimMode,
}

/// The layer's configuration. `Default` is what one line in an app gets.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct IdempotencyConfig {
    /// Methods that require a key unless a [`RouteRule`] says otherwise. Default: POST
    /// and PATCH. Keys are meaningless on GET and DELETE.
    pub required_methods: Vec<Method>,
    /// Overrides; of the rules matching a request, one naming the method wins over one
    /// that does not, and the most specific path over a more general one, whatever the
    /// order of the list ([`crate::routes`]).
    pub routes: Vec<RouteRule>,
    /// Default: 409 with `Retry-After: 1`.
    pub in_progress: InProgressMode,
    /// Default: fail closed (503).
    pub on_store_unavailable: StoreUnavailableMode,
    /// Request bodies are buffered (to fingerprint them) up to this many bytes; beyond
    /// it → 413 and nothing is recorded. Default 1 MiB.
    pub max_request_body: usize,
    /// Response bodies are stored for replay up to this many bytes. A larger body still
    /// reaches the first caller in full; replays then carry status and headers only, with
    /// `Idempotent-Body-Omitted: true`. Default 512 KiB.
    pub max_stored_body: usize,
    /// Response headers stored and replayed. Default: content-type, location, etag.
    pub replay_headers: Vec<HeaderName>,
    /// Which request headers and JSON fields count towards the fingerprint.
    pub fingerprint: Fingerprinter,
    /// Which outcomes end the intent (replayed) and which leave the key open to retry.
    pub outcome_policy: OutcomePolicy,
    /// How long a claim holds PROCESSING before another request may take it over. The
    /// layer renews it every `lease / 3` while the handler runs. Default 60 s.
    pub lease: Duration,
    /// A handler running longer is cancelled, answered 504, and its record becomes
    /// FAILED_RETRYABLE. Default 30 s.
    pub execution_timeout: Duration,
    /// How long a terminal record is kept (what the sweeper is configured with); used
    /// for `Idempotency-Expires`. Default 24 h, counted from completion.
    pub retention: Duration,
    /// `Retry-After` on 503 when the store is down. Default 1 s.
    pub store_unavailable_retry_after: Duration,
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        Self {
            required_methods: vec![Method::POST, Method::PATCH],
            routes: Vec::new(),
            in_progress: InProgressMode::default(),
            on_store_unavailable: StoreUnavailableMode::default(),
            max_request_body: 1024 * 1024,
            max_stored_body: 512 * 1024,
            replay_headers: vec![CONTENT_TYPE, LOCATION, ETAG],
            fingerprint: Fingerprinter::default(),
            outcome_policy: OutcomePolicy::default(),
            lease: Duration::from_secs(60),
            execution_timeout: Duration::from_secs(30),
            retention: Duration::from_secs(24 * 3600),
            store_unavailable_retry_after: Duration::from_secs(1),
        }
    }
}

impl IdempotencyConfig {
    pub fn route(mut self, rule: RouteRule) -> Self {
        self.routes.push(rule);
        self
    }

    pub fn required_methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.required_methods = methods.into_iter().collect();
        self
    }

    pub fn in_progress(mut self, mode: InProgressMode) -> Self {
        self.in_progress = mode;
        self
    }

    pub fn on_store_unavailable(mut self, mode: StoreUnavailableMode) -> Self {
        self.on_store_unavailable = mode;
        self
    }

    pub fn max_request_body(mut self, bytes: usize) -> Self {
        self.max_request_body = bytes;
        self
    }

    pub fn max_stored_body(mut self, bytes: usize) -> Self {
        self.max_stored_body = bytes;
        self
    }

    pub fn fingerprint(mut self, fingerprint: Fingerprinter) -> Self {
        self.fingerprint = fingerprint;
        self
    }

    pub fn outcome_policy(mut self, policy: OutcomePolicy) -> Self {
        self.outcome_policy = policy;
        self
    }

    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    pub fn execution_timeout(mut self, timeout: Duration) -> Self {
        self.execution_timeout = timeout;
        self
    }

    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// The rules for one request to `path` (the concrete path, without the query).
    pub fn resolve(&self, method: &Method, path: &str) -> ResolvedRules {
        let mut resolved = ResolvedRules {
            key: if self.required_methods.contains(method) {
                KeyRule::Required
            } else {
                KeyRule::Ignored
            },
            in_progress: self.in_progress,
            on_store_unavailable: self.on_store_unavailable,
            claim: ClaimMode::Ahead,
        };
        // The precedence the gateway shares (see `routes`): most specific first, so the
        // order of the list never lets a template shadow a literal route.
        for rule in routes::matching(&self.routes, method, path).in_order() {
            if let Some(k) = rule.key {
                resolved.key = k;
            }
            if let Some(m) = rule.in_progress {
                resolved.in_progress = m;
            }
            if let Some(m) = rule.on_store_unavailable {
                resolved.on_store_unavailable = m;
            }
            if let Some(m) = rule.claim {
                resolved.claim = m;
            }
        }
        resolved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolution() {
        let wait = InProgressMode::Wait {
            max_wait: Duration::from_secs(2),
        };
        let c = IdempotencyConfig::default()
            .route(RouteRule::new("/search").key(KeyRule::Ignored))
            // A template listed before a literal route under it: the literal still wins.
            .route(RouteRule::new("/orders/{id}").key(KeyRule::Ignored))
            .route(RouteRule::new("/orders/special").key(KeyRule::Required))
            .route(RouteRule::new("/orders").in_progress(wait))
            .route(
                RouteRule::new("/orders")
                    .method(Method::PUT)
                    .key(KeyRule::Optional),
            )
            .route(RouteRule::new("/likes").on_store_unavailable(StoreUnavailableMode::FailOpen));
        let check = |m: Method, r: &str, key, ip, su| {
            let got = c.resolve(&m, r);
            assert_eq!(
                (got.key, got.in_progress, got.on_store_unavailable),
                (key, ip, su),
                "{m} {r}"
            );
        };
        use KeyRule::*;
        let reject = InProgressMode::default();
        let closed = StoreUnavailableMode::FailClosed;
        check(Method::POST, "/x", Required, reject, closed);
        check(Method::PATCH, "/x", Required, reject, closed);
        check(Method::GET, "/x", Ignored, reject, closed);
        check(Method::DELETE, "/x", Ignored, reject, closed);
        check(Method::POST, "/search", Ignored, reject, closed);
        check(Method::POST, "/orders/o1", Ignored, reject, closed);
        check(Method::POST, "/orders/special", Required, reject, closed);
        check(Method::POST, "/orders/o1/pay", Required, reject, closed);
        check(Method::POST, "/orders", Required, wait, closed);
        check(Method::PUT, "/orders", Optional, wait, closed);
        check(
            Method::POST,
            "/likes",
            Required,
            reject,
            StoreUnavailableMode::FailOpen,
        );
    }
}
