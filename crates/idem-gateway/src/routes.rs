//! Which requests need a key: method sets plus path patterns, first match wins.
//!
//! Owns pattern syntax and matching. It must not look at headers or bodies.

use http::Method;
use serde::{Deserialize, Serialize};

use crate::config::RouteConfig;
use crate::error::GatewayError;

/// What a route does with `Idempotency-Key`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyRule {
    /// No key → 400; with a key the request is coalesced and windowed.
    #[default]
    Required,
    /// With a key the request is coalesced; without one it streams through.
    Optional,
    /// Streams through untouched, key or not.
    None,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    /// `{name}`: exactly one non-empty segment.
    Param,
    /// A final `*`: any rest, including nothing.
    Rest,
}

/// A compiled path pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    segments: Vec<Segment>,
}

impl PathPattern {
    pub fn parse(pattern: &str) -> Result<Self, GatewayError> {
        let bad = |why: &str| {
            Err(GatewayError::Config(format!(
                "path pattern {pattern:?}: {why}"
            )))
        };
        let Some(rest) = pattern.strip_prefix('/') else {
            return bad("must start with /");
        };
        let mut segments = Vec::new();
        let parts: Vec<&str> = if rest.is_empty() {
            Vec::new()
        } else {
            rest.split('/').collect()
        };
        for (i, part) in parts.iter().enumerate() {
            if *part == "*" {
                if i + 1 != parts.len() {
                    return bad("* must be the last segment");
                }
                segments.push(Segment::Rest);
            } else if part.starts_with('{') && part.ends_with('}') && part.len() > 2 {
                segments.push(Segment::Param);
            } else if part.contains(['{', '}', '*']) {
                return bad("segments are literal, {name} or a final *");
            } else {
                segments.push(Segment::Literal((*part).to_string()));
            }
        }
        Ok(Self { segments })
    }

    /// Whether `path` (without the query) matches. A trailing slash is a segment of its
    /// own, as in most routers: `/a/` does not match `/a`.
    pub fn matches(&self, path: &str) -> bool {
        let Some(rest) = path.strip_prefix('/') else {
            return false;
        };
        let mut parts = if rest.is_empty() {
            None
        } else {
            Some(rest.split('/'))
        }
        .into_iter()
        .flatten();
        for seg in &self.segments {
            match seg {
                Segment::Rest => return true,
                Segment::Literal(lit) => match parts.next() {
                    Some(p) if p == lit => {}
                    _ => return false,
                },
                Segment::Param => match parts.next() {
                    Some(p) if !p.is_empty() => {}
                    _ => return false,
                },
            }
        }
        parts.next().is_none()
    }
}

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
                path: PathPattern::parse(&r.path)?,
                key: r.key,
            });
        }
        Ok(Self { rules })
    }

    /// The rule for a request; `KeyRule::None` when no rule matches.
    pub fn key_rule(&self, method: &Method, path: &str) -> KeyRule {
        self.rules
            .iter()
            .find(|r| (r.methods.is_empty() || r.methods.contains(method)) && r.path.matches(path))
            .map_or(KeyRule::None, |r| r.key)
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
                key: KeyRule::None,
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
        assert_eq!(t.key_rule(&Method::POST, "/v1/search"), KeyRule::None);
        assert_eq!(t.key_rule(&Method::POST, "/v1/orders"), KeyRule::Required);
        assert_eq!(
            t.key_rule(&Method::PATCH, "/v1/orders/1"),
            KeyRule::Required
        );
        assert_eq!(t.key_rule(&Method::GET, "/v1/orders"), KeyRule::None);
        assert_eq!(t.key_rule(&Method::DELETE, "/opt/1"), KeyRule::Optional);
        assert_eq!(t.key_rule(&Method::POST, "/elsewhere"), KeyRule::None);
    }
}
