//! Route precedence: which of several rules matching one request decides. The layer's
//! [`RouteRule`](crate::RouteRule)s and the gateway's route table both resolve through
//! [`matching`], so one list of rules means the same in either.
//!
//! Of the rules that match a request, a rule naming the request's method overrides one
//! that names none. Within each of those two tiers the most specific path wins (more
//! literal segments, then more segments, then no final rest:
//! [`PathPattern::specificity`]), and the first listed among equally specific ones. The
//! order of a list therefore never lets a general pattern shadow a more specific one.
//! This module owns that rule only; what a rule sets is its caller's.

use http::Method;
pub use idem_core::wire::PathPattern;

/// A route rule as precedence sees it.
pub trait RouteMatcher {
    /// Whether the rule names methods (a rule naming none applies to every method).
    fn names_methods(&self) -> bool;
    /// Whether the rule applies to `method` and to `path` (the concrete path, without
    /// the query).
    fn matches(&self, method: &Method, path: &str) -> bool;
    /// How specific the rule's path is; greater wins ([`PathPattern::specificity`]).
    fn specificity(&self) -> (usize, usize, bool);
}

/// The rules that decide for one request: the best of those naming no method, and the
/// best of those naming the request's method, which overrides it.
#[derive(Debug, PartialEq, Eq)]
pub struct Matched<'a, R> {
    pub general: Option<&'a R>,
    pub specific: Option<&'a R>,
}

impl<'a, R> Matched<'a, R> {
    /// The general rule, then the method-specific one: apply them in this order so the
    /// second overrides what both set.
    pub fn in_order(&self) -> impl Iterator<Item = &'a R> {
        self.general.into_iter().chain(self.specific)
    }

    /// The rule that decides when a rule sets everything: the method-specific one, else
    /// the general one.
    pub fn winner(&self) -> Option<&'a R> {
        self.specific.or(self.general)
    }
}

impl<R> Clone for Matched<'_, R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R> Copy for Matched<'_, R> {}

/// The rules of `rules` that decide for a request with `method` to `path`.
pub fn matching<'a, R: RouteMatcher>(
    rules: &'a [R],
    method: &Method,
    path: &str,
) -> Matched<'a, R> {
    // Reversed, so that of equally specific rules `max_by_key` (which keeps the last
    // maximum) keeps the first listed.
    let best = |names_methods: bool| {
        rules
            .iter()
            .rev()
            .filter(|r| r.names_methods() == names_methods && r.matches(method, path))
            .max_by_key(|r| r.specificity())
    };
    Matched {
        general: best(false),
        specific: best(true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RouteRule;

    fn rule(method: Option<Method>, path: &str, name: &'static str) -> (RouteRule, &'static str) {
        let r = RouteRule::new(path);
        (method.map_or(r.clone(), |m| r.method(m)), name)
    }

    fn winner(
        rules: &[(RouteRule, &'static str)],
        method: Method,
        path: &str,
    ) -> Option<&'static str> {
        let only: Vec<RouteRule> = rules.iter().map(|(r, _)| r.clone()).collect();
        let won = matching(&only, &method, path).winner()?;
        let at = only.iter().position(|r| std::ptr::eq(r, won))?;
        Some(rules[at].1)
    }

    #[test]
    fn the_most_specific_wins_whatever_the_order() {
        let post = || Some(Method::POST);
        let rules = [
            rule(post(), "/v1/*", "any"),
            rule(post(), "/v1/orders/{id}", "order"),
            rule(post(), "/v1/orders/search", "search"),
            rule(post(), "/v1/orders/{id}", "order, again"),
        ];
        assert_eq!(
            winner(&rules, Method::POST, "/v1/orders/search"),
            Some("search")
        );
        assert_eq!(winner(&rules, Method::POST, "/v1/orders/7"), Some("order"));
        assert_eq!(winner(&rules, Method::POST, "/v1/carts"), Some("any"));
        assert_eq!(winner(&rules, Method::GET, "/v1/carts"), None);
        assert_eq!(winner(&rules, Method::POST, "/v2"), None);
    }

    #[test]
    fn a_rule_naming_the_method_overrides_one_naming_none() {
        let rules = [
            rule(None, "/v1/orders/search", "every method"),
            rule(Some(Method::POST), "/v1/*", "writes"),
        ];
        let only: Vec<RouteRule> = rules.iter().map(|(r, _)| r.clone()).collect();
        let m = matching(&only, &Method::POST, "/v1/orders/search");
        let order: Vec<_> = m.in_order().map(RouteRule::route).collect();
        assert_eq!(order, ["/v1/orders/search", "/v1/*"]);
        assert_eq!(
            winner(&rules, Method::POST, "/v1/orders/search"),
            Some("writes")
        );
        assert_eq!(
            winner(&rules, Method::GET, "/v1/orders/search"),
            Some("every method")
        );
    }
}
