//! Which requests need a key: method sets plus path patterns, compiled from the
//! configuration's routes.
//!
//! Owns the compiled route table. Which rule decides is the layer's precedence
//! ([`idem_http::routes`]): a rule naming the method over one naming none, then the
//! most specific path, then the first listed; so a gateway in front of a service using
//! the layer reads one list of rules the same way. It must not look at headers or
//! bodies.

use http::Method;
use idem_http::routes::{matching, RouteMatcher};

use crate::config::RouteConfig;
use crate::error::GatewayError;

pub use idem_core::wire::{KeyRule, PathPattern};

#[derive(Debug, Clone)]
struct Rule {
    /// Empty: every method.
    methods: Vec<Method>,
    path: PathPattern,
    key: KeyRule,
}

/// The compiled route table.
#[derive(Debug, Clone)]
pub struct RouteTable {
    rules: Vec<Rule>,
}

impl RouteTable {
    pub fn compile(routes: &[RouteConfig]) -> Result<Self, GatewayError> {
        let mut rules = Vec::with_capacity(routes.len());
        for r in routes {
            let methods = if r.methods.iter().any(|m| m == "*") {
                Vec::new()
            } else {
                r.methods
                    .iter()
                    .map(|m| {
                        Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                            .map_err(|_| GatewayError::Config(format!("bad method {m:?}")))
                    })
                    .collect::<Result<_, _>>()?
            };
            rules.push(Rule {
                methods,
                path: PathPattern::parse(&r.path).map_err(GatewayError::Config)?,
                key: r.key,
            });
        }
        Ok(Self { rules })
    }

    /// The rule for a request; `KeyRule::Ignored` when no rule matches.
    pub fn key_rule(&self, method: &Method, path: &str) -> KeyRule {
        matching(&self.rules, method, path)
            .winner()
            .map_or(KeyRule::Ignored, |r| r.key)
    }
}

impl RouteMatcher for Rule {
    fn names_methods(&self) -> bool {
        !self.methods.is_empty()
    }

    fn matches(&self, method: &Method, path: &str) -> bool {
        (self.methods.is_empty() || self.methods.contains(method)) && self.path.matches(path)
    }

    fn specificity(&self) -> (usize, usize, bool) {
        self.path.specificity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(pattern: &str, path: &str, want: bool) {
        let p = PathPattern::parse(pattern).unwrap();
        assert_eq!(p.matches(path), want, "{pattern} vs {path}");
    }

    #[test]
    fn patterns() {
        check("/", "/", true);
        check("/", "/a", false);
        check("/*", "/", true);
        check("/*", "/a/b/c", true);
        check("/v1/orders", "/v1/orders", true);
        check("/v1/orders", "/v1/orders/", false);
        check("/v1/orders", "/v1/order", false);
        check("/v1/orders", "/v1/orders/1", false);
        check("/v1/orders/{id}", "/v1/orders/1", true);
        check("/v1/orders/{id}", "/v1/orders/", false);
        check("/v1/orders/{id}/confirm", "/v1/orders/9/confirm", true);
        check("/v1/*", "/v1", true);
        check("/v1/*", "/v1/x/y", true);
        check("/v1/*", "/v2/x", false);
        for bad in ["", "a", "/a/*/b", "/a{b}", "/{}"] {
            assert!(PathPattern::parse(bad).is_err(), "{bad}");
        }
    }

    fn table(rules: &[(&[&str], &str, KeyRule)]) -> RouteTable {
        let routes: Vec<RouteConfig> = rules
            .iter()
            .map(|(methods, path, key)| RouteConfig {
                methods: methods.iter().map(|m| (*m).into()).collect(),
                path: (*path).into(),
                key: *key,
            })
            .collect();
        RouteTable::compile(&routes).unwrap()
    }

    #[test]
    fn the_most_specific_rule_wins() {
        let t = table(&[
            (&["POST"], "/v1/search", KeyRule::Ignored),
            (&["post", "PATCH"], "/v1/*", KeyRule::Required),
            (&["*"], "/opt/{x}", KeyRule::Optional),
        ]);
        assert_eq!(t.key_rule(&Method::POST, "/v1/search"), KeyRule::Ignored);
        assert_eq!(t.key_rule(&Method::POST, "/v1/orders"), KeyRule::Required);
        assert_eq!(
            t.key_rule(&Method::PATCH, "/v1/orders/1"),
            KeyRule::Required
        );
        assert_eq!(t.key_rule(&Method::GET, "/v1/orders"), KeyRule::Ignored);
        assert_eq!(t.key_rule(&Method::DELETE, "/opt/1"), KeyRule::Optional);
        assert_eq!(t.key_rule(&Method::POST, "/elsewhere"), KeyRule::Ignored);
    }

    #[test]
    fn a_more_specific_rule_listed_after_a_general_one_wins() {
        let t = table(&[
            (&["POST"], "/v1/*", KeyRule::Required),
            (&["POST"], "/v1/orders/{id}", KeyRule::Optional),
            (&["POST"], "/v1/orders/search", KeyRule::Ignored),
        ]);
        assert_eq!(t.key_rule(&Method::POST, "/v1/carts"), KeyRule::Required);
        assert_eq!(t.key_rule(&Method::POST, "/v1/orders/7"), KeyRule::Optional);
        assert_eq!(
            t.key_rule(&Method::POST, "/v1/orders/search"),
            KeyRule::Ignored
        );
    }

    #[test]
    fn a_rule_naming_the_method_wins_over_one_for_every_method() {
        // As in the layer: a method-specific rule overrides a rule for every method.
        let t = table(&[
            (&[], "/v1/orders/search", KeyRule::Ignored),
            (&["POST"], "/v1/*", KeyRule::Required),
        ]);
        assert_eq!(
            t.key_rule(&Method::POST, "/v1/orders/search"),
            KeyRule::Required
        );
        assert_eq!(
            t.key_rule(&Method::GET, "/v1/orders/search"),
            KeyRule::Ignored
        );
    }
}
