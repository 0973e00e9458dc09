//! Who is calling: API key → tenant (and principal), from the configuration.
//!
//! The tenant never comes from a header the client sets: it comes from the API key, and
//! the gateway removes any client-sent tenant header before forwarding. This module does
//! no I/O.

use std::collections::HashMap;

use http::header::{HeaderMap, HeaderName, AUTHORIZATION};
use idem_core::{Principal, TenantId};

use crate::config::AuthConfig;

/// The tenant of a gateway configured without API keys.
pub const DEFAULT_TENANT: &str = "default";
/// The principal of callers without an API key.
pub const ANONYMOUS: &str = "anonymous";

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub tenant: TenantId,
    pub principal: Principal,
}

/// What the request's credentials say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// No API key was sent.
    Anonymous,
    Known(Identity),
    /// An API key was sent and is not configured (or is malformed).
    Unknown,
}

/// The compiled API key table.
#[derive(Debug, Clone)]
pub struct ApiKeys {
    header: HeaderName,
    bearer: bool,
    keys: HashMap<String, Identity>,
    strip: bool,
    pub require_on_passthrough: bool,
    anonymous: Option<Identity>,
}

impl ApiKeys {
    pub fn new(config: &AuthConfig) -> Self {
        let header = HeaderName::from_bytes(config.header.to_ascii_lowercase().as_bytes())
            .unwrap_or(HeaderName::from_static("x-api-key"));
        Self {
            bearer: header == AUTHORIZATION,
            header,
            keys: config
                .api_keys
                .iter()
                .map(|(k, e)| {
                    (
                        k.clone(),
                        Identity {
                            tenant: e.tenant().clone(),
                            principal: e.principal(),
                        },
                    )
                })
                .collect(),
            strip: config.strip_api_key,
            require_on_passthrough: config.require_on_passthrough,
            anonymous: config
                .anonymous_tenant
                .clone()
                .or_else(|| {
                    config
                        .api_keys
                        .is_empty()
                        .then(|| TenantId::new(DEFAULT_TENANT).expect("valid tenant"))
                })
                .map(|tenant| Identity {
                    tenant,
                    principal: Principal::new(ANONYMOUS).expect("valid principal"),
                }),
        }
    }

    /// The identity of callers without an API key, if they have one (see
    /// [`AuthConfig::anonymous_tenant`]).
    pub fn anonymous(&self) -> Option<&Identity> {
        self.anonymous.as_ref()
    }

    pub fn identify(&self, headers: &HeaderMap) -> Caller {
        let mut values = headers.get_all(&self.header).iter();
        let Some(value) = values.next() else {
            return Caller::Anonymous;
        };
        if values.next().is_some() {
            return Caller::Unknown;
        }
        let Ok(text) = value.to_str() else {
            return Caller::Unknown;
        };
        let key = if self.bearer {
            match text.split_once(' ') {
                Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
                _ => return Caller::Unknown,
            }
        } else {
            text.trim()
        };
        match self.keys.get(key) {
            Some(id) => Caller::Known(id.clone()),
            None => Caller::Unknown,
        }
    }

    /// Whether `name` is the credential header that [`ApiKeys::strip`] removes.
    pub fn is_credential(&self, name: &HeaderName) -> bool {
        self.strip && *name == self.header
    }

    /// Removes the credential before forwarding, when configured to.
    pub fn strip(&self, headers: &mut HeaderMap) {
        if self.strip {
            headers.remove(&self.header);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ApiKeyEntry;
    use http::HeaderValue;

    fn table(header: &str) -> ApiKeys {
        let mut c = AuthConfig {
            header: header.into(),
            ..AuthConfig::default()
        };
        c.api_keys.insert(
            "k1".into(),
            ApiKeyEntry::Tenant(TenantId::new("t1").unwrap()),
        );
        ApiKeys::new(&c)
    }

    fn check(t: &ApiKeys, name: &str, values: &[&str], want: Option<Option<&str>>) {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        let got = match t.identify(&h) {
            Caller::Anonymous => None,
            Caller::Known(id) => Some(Some(id.tenant.as_str().to_string())),
            Caller::Unknown => Some(None),
        };
        assert_eq!(
            got,
            want.map(|o| o.map(str::to_string)),
            "{name}: {values:?}"
        );
    }

    #[test]
    fn api_key_header() {
        let t = table("X-Api-Key");
        check(&t, "x-api-key", &["k1"], Some(Some("t1")));
        check(&t, "x-api-key", &["nope"], Some(None));
        check(&t, "x-api-key", &["k1", "k1"], Some(None));
        check(&t, "x-api-key", &[], None);
    }

    #[test]
    fn anonymous_callers() {
        // No keys at all: single tenant.
        let open = ApiKeys::new(&AuthConfig::default());
        assert_eq!(open.anonymous().unwrap().tenant.as_str(), DEFAULT_TENANT);
        // Keys configured: anonymous only when asked for.
        assert!(table("x-api-key").anonymous().is_none());
        let mut c = AuthConfig::default();
        c.api_keys.insert(
            "k1".into(),
            ApiKeyEntry::Tenant(TenantId::new("t1").unwrap()),
        );
        c.anonymous_tenant = Some(TenantId::new("public").unwrap());
        assert_eq!(
            ApiKeys::new(&c).anonymous().unwrap().tenant.as_str(),
            "public"
        );
    }

    #[test]
    fn bearer() {
        let t = table("authorization");
        check(&t, "authorization", &["Bearer k1"], Some(Some("t1")));
        check(&t, "authorization", &["bearer  k1"], Some(Some("t1")));
        check(&t, "authorization", &["Basic k1"], Some(None));
        check(&t, "authorization", &["k1"], Some(None));
    }
}
