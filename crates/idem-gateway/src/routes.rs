//! Which requests need a key: method sets plus path patterns, first match wins.
//!
//! Owns pattern syntax and matching. It must not look at headers or bodies.

use http::Method;

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
        self.rules
            .iter()
            .find(|r| (r.methods.is_empty() || r.methods.contains(method)) && r.path.matches(path))
            .map_or(KeyRule::Ignored, |r| r.key)
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

    #[test]
    fn first_rule_wins() {
        let t = RouteTable::compile(&[
            RouteConfig {
                methods: vec!["POST".into()],
                path: "/v1/search".into(),
                key: KeyRule::Ignored,
            },
            RouteConfig {
                methods: vec!["post".into(), "PATCH".into()],
                path: "/v1/*".into(),
                key: KeyRule::Required,
            },
            RouteConfig {
                methods: vec!["*".into()],
                path: "/opt/{x}".into(),
                key: KeyRule::Optional,
            },
        ])
        .unwrap();
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
}
