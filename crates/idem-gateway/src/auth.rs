//! Who is calling: API key → tenant (and principal), or, without API keys, a keyed hash
//! of the caller's own credential headers.
//!
//! The tenant never comes from a header the client sets: it comes from the API key, and
//! the gateway removes any client-sent tenant header before forwarding. Without API keys
//! the principal is `caller-<HMAC-SHA-256 of the credential headers>` under a
//! per-deployment secret, so a stored result is only replayed to the caller that sent
//! the same credential, and the raw credential is never stored, logged or counted. API
//! keys are looked up by their SHA-256 digest, so the lookup's timing says nothing about
//! how close a guess came. This module does no I/O besides reading the secret's file.

use std::collections::HashMap;

use hmac::{Hmac, KeyInit, Mac};
use http::header::{HeaderMap, HeaderName, AUTHORIZATION};
use idem_core::{Principal, TenantId};
use sha2::{Digest, Sha256};

use crate::config::AuthConfig;
pub use crate::config::ANONYMOUS;
use crate::error::GatewayError;

/// The tenant of a gateway configured without API keys.
pub const DEFAULT_TENANT: &str = "default";
/// Environment variable read for the principal secret when the file names none.
pub const PRINCIPAL_SECRET_ENV: &str = "IDEM_GATEWAY_PRINCIPAL_SECRET";

/// An authenticated caller (the vocabulary's own type).
pub use idem_core::Identity;

/// What the request's credentials say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// No credential was sent.
    Anonymous,
    Known(Identity),
    /// An API key was sent and is not configured (or is malformed).
    Unknown,
}

/// One part of a caller's credential.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    /// Every value of a header.
    Header(HeaderName),
    /// One cookie of the `Cookie` header (`cookie:NAME`), so shared or rotating cookies
    /// (consent, load-balancer affinity) do not decide who the caller is.
    Cookie(String),
}

impl Part {
    fn parse(spec: &str) -> Result<Self, GatewayError> {
        match spec.split_once(':') {
            Some((h, name)) if h.eq_ignore_ascii_case("cookie") => {
                let name = name.trim();
                if name.is_empty()
                    || !name
                        .bytes()
                        .all(|b| b.is_ascii_graphic() && b != b'=' && b != b';')
                {
                    return Err(GatewayError::Config(format!(
                        "auth.credential_headers: bad cookie name in {spec:?}"
                    )));
                }
                Ok(Part::Cookie(name.to_string()))
            }
            _ => header_name(spec).map(Part::Header),
        }
    }

    /// Calls `each` with the values this part finds in the request, in order; blank
    /// ones are no credential. No copy of them is made.
    fn for_each_value<'a>(&self, headers: &'a HeaderMap, mut each: impl FnMut(&'a [u8])) {
        match self {
            Part::Header(name) => headers
                .get_all(name)
                .iter()
                .map(|v| v.as_bytes())
                .filter(|v| !blank(v, has_scheme(name)))
                .for_each(each),
            Part::Cookie(wanted) => {
                for v in headers.get_all(http::header::COOKIE) {
                    for pair in v.as_bytes().split(|b| *b == b';') {
                        let pair = pair.trim_ascii();
                        let Some(eq) = pair.iter().position(|b| *b == b'=') else {
                            continue;
                        };
                        let value = &pair[eq + 1..];
                        if &pair[..eq] == wanted.as_bytes() && !blank(value, false) {
                            each(value);
                        }
                    }
                }
            }
        }
    }

    /// Whether this part reads the whole of `name` (a `cookie:NAME` part reads only
    /// one cookie of `Cookie`).
    fn covers(&self, name: &HeaderName) -> bool {
        matches!(self, Part::Header(h) if h == name)
    }

    fn label(&self) -> String {
        match self {
            Part::Header(h) => h.as_str().to_string(),
            Part::Cookie(c) => format!("cookie:{c}"),
        }
    }
}

/// Whether a credential value carries nothing: empty, blank, or (in an
/// `Authorization`-style header, `scheme`) an authentication scheme without its
/// credentials (`Bearer`, `Basic `). Such a value names no caller, so it must not make
/// a partition every such caller shares.
fn blank(value: &[u8], scheme: bool) -> bool {
    let v = value.trim_ascii();
    v.is_empty()
        || scheme
            && [
                &b"bearer"[..],
                b"basic",
                b"token",
                b"digest",
                b"negotiate",
                b"apikey",
            ]
            .iter()
            .any(|s| v.eq_ignore_ascii_case(s))
}

/// Headers whose value starts with an authentication scheme.
fn has_scheme(name: &HeaderName) -> bool {
    *name == AUTHORIZATION || *name == http::header::PROXY_AUTHORIZATION
}

/// The headers that make a caller's identity without API keys, and the headers the
/// upstream authenticates by that a configured list leaves out (to warn about).
fn identity_parts(config: &AuthConfig) -> Result<(Vec<Part>, Vec<String>), GatewayError> {
    let upstream: Vec<HeaderName> = config
        .upstream_credential_headers
        .iter()
        .map(|h| header_name(h))
        .collect::<Result<_, _>>()?;
    let Some(list) = &config.credential_headers else {
        let mut parts = vec![
            Part::Header(AUTHORIZATION),
            Part::Header(http::header::COOKIE),
        ];
        for h in std::iter::once(header_name(&config.header)?).chain(upstream) {
            if !parts.iter().any(|p| p.covers(&h)) {
                parts.push(Part::Header(h));
            }
        }
        return Ok((parts, Vec::new()));
    };
    let parts: Vec<Part> = list
        .iter()
        .map(|h| Part::parse(h))
        .collect::<Result<_, _>>()?;
    let ignored = upstream
        .into_iter()
        .filter(|h| !parts.iter().any(|p| p.covers(h)))
        .map(|h| h.as_str().to_string())
        .collect();
    Ok((parts, ignored))
}

/// Without API keys: callers told apart by their credential headers.
#[derive(Clone)]
struct Credentials {
    parts: Vec<Part>,
    /// Each part's label, length-prefixed as hashed (made once, not per request).
    labels: Vec<Vec<u8>>,
    /// The HMAC keyed with the principal secret, cloned per request: keying it costs
    /// two SHA-256 blocks a clone does not.
    keyed: Hmac<Sha256>,
    tenant: TenantId,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("parts", &self.parts)
            .field("secret", &"***")
            .finish()
    }
}

impl Credentials {
    fn new(parts: Vec<Part>, secret: &[u8], tenant: TenantId) -> Self {
        let labels = parts
            .iter()
            .map(|p| {
                let label = p.label();
                let mut out = (label.len() as u64).to_be_bytes().to_vec();
                out.extend_from_slice(label.as_bytes());
                out
            })
            .collect();
        Self {
            parts,
            labels,
            keyed: Hmac::<Sha256>::new_from_slice(secret).expect("any key length"),
            tenant,
        }
    }

    /// `caller-` and 128 bits of the keyed hash: stable per credential, unguessable
    /// without the secret. Hashed: each part's length-prefixed label, its count of
    /// values, each value length-prefixed.
    fn principal(&self, headers: &HeaderMap) -> Option<Principal> {
        let mut mac = self.keyed.clone();
        let mut any = false;
        for (part, label) in self.parts.iter().zip(&self.labels) {
            mac.update(label);
            // The count comes before the values: count first without copying them.
            let mut count = 0u64;
            part.for_each_value(headers, |_| count += 1);
            any |= count > 0;
            mac.update(&count.to_be_bytes());
            part.for_each_value(headers, |v| {
                mac.update(&(v.len() as u64).to_be_bytes());
                mac.update(v);
            });
        }
        if !any {
            return None;
        }
        let digest = mac.finalize().into_bytes();
        let mut name = String::with_capacity(7 + 32);
        name.push_str("caller-");
        name.push_str(&hex::encode(&digest[..16]));
        Some(Principal::new(name).expect("valid"))
    }
}

/// The compiled API key table.
#[derive(Debug, Clone)]
pub struct ApiKeys {
    header: HeaderName,
    bearer: bool,
    /// SHA-256 of each API key.
    keys: HashMap<[u8; 32], Identity>,
    strip: bool,
    pub require_on_passthrough: bool,
    anonymous: Option<Identity>,
    credentials: Option<Credentials>,
    /// Headers the upstream authenticates by that the configured identity leaves out.
    ignored: Vec<String>,
}

/// A configured header name (any case), or a configuration error naming it.
pub(crate) fn header_name(s: &str) -> Result<HeaderName, GatewayError> {
    HeaderName::from_bytes(s.to_ascii_lowercase().as_bytes())
        .map_err(|_| GatewayError::Config(format!("bad header name {s:?}")))
}

/// The principal secret: the file's value, its file, the environment, or (only for a
/// window no other instance shares) a random one.
fn load_principal_secret(
    config: &AuthConfig,
    shared_window: bool,
) -> Result<Vec<u8>, GatewayError> {
    let given = match (&config.principal_secret, &config.principal_secret_file) {
        (Some(s), _) => Some(s.clone()),
        (None, Some(path)) => Some({
            if crate::config::readable_by_others(path) {
                tracing::warn!(file = %path.display(), "auth.principal_secret_file is readable by other users; chmod 600 it");
            }
            std::fs::read_to_string(path)
                .map_err(|e| {
                    GatewayError::Config(format!(
                        "auth.principal_secret_file {}: {e}",
                        path.display()
                    ))
                })?
                .trim_end_matches(['\r', '\n'])
                .to_string()
        }),
        (None, None) => std::env::var(PRINCIPAL_SECRET_ENV).ok(),
    };
    match given {
        Some(s) if s.len() < 16 => Err(GatewayError::Config(
            "the principal secret must be at least 16 bytes".into(),
        )),
        Some(s) => Ok(s.into_bytes()),
        None if shared_window => Err(GatewayError::Config(format!(
            "gateways sharing a window without API keys must share a principal secret: set \
             auth.principal_secret_file (or {PRINCIPAL_SECRET_ENV})"
        ))),
        None => {
            let mut secret = Vec::with_capacity(32);
            secret.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
            secret.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
            Ok(secret)
        }
    }
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

impl ApiKeys {
    /// Compiles the table. `shared_window`: other instances read the same records, so a
    /// random principal secret would not do.
    pub fn new(config: &AuthConfig, shared_window: bool) -> Result<Self, GatewayError> {
        let header = header_name(&config.header)?;
        let mut ignored = Vec::new();
        let credentials = if config.api_keys.is_empty() {
            let (parts, left_out) = identity_parts(config)?;
            ignored = left_out;
            Some(Credentials::new(
                parts,
                &load_principal_secret(config, shared_window)?,
                TenantId::new(DEFAULT_TENANT).expect("valid tenant"),
            ))
        } else {
            None
        };
        Ok(Self {
            bearer: header == AUTHORIZATION,
            header,
            keys: config
                .api_keys
                .iter()
                .map(|(k, e)| {
                    (
                        digest(k),
                        Identity {
                            tenant: e.tenant().clone(),
                            principal: e.principal(),
                        },
                    )
                })
                .collect(),
            // Without API keys the header is not the gateway's credential: leave it be.
            strip: config.strip_api_key && !config.api_keys.is_empty(),
            require_on_passthrough: config.require_on_passthrough,
            anonymous: config.anonymous_tenant.clone().map(|tenant| Identity {
                tenant,
                principal: Principal::new(ANONYMOUS).expect("valid principal"),
            }),
            credentials,
            ignored,
        })
    }

    /// Headers the upstream authenticates callers by that the configured caller
    /// identity (`auth.credential_headers`) leaves out: two callers differing only in
    /// one of them share stored results. Start-up warns about each.
    pub fn ignored_upstream_credentials(&self) -> &[String] {
        &self.ignored
    }

    /// The identity of callers without any credential, if anonymous access is
    /// configured (see [`AuthConfig::anonymous_tenant`]).
    pub fn anonymous(&self) -> Option<&Identity> {
        self.anonymous.as_ref()
    }

    pub fn identify(&self, headers: &HeaderMap) -> Caller {
        if let Some(c) = &self.credentials {
            return match c.principal(headers) {
                Some(principal) => Caller::Known(Identity {
                    tenant: c.tenant.clone(),
                    principal,
                }),
                None => Caller::Anonymous,
            };
        }
        let mut values = headers.get_all(&self.header).iter();
        let Some(value) = values.next() else {
            return Caller::Anonymous;
        };
        if values.next().is_some() {
            return Caller::Unknown;
        }
        if blank(value.as_bytes(), self.bearer) {
            return Caller::Anonymous;
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
        match self.keys.get(&digest(key)) {
            Some(id) => Caller::Known(id.clone()),
            None => Caller::Unknown,
        }
    }

    /// The tenant a key's window record is kept under. With API keys, the key's
    /// tenant. Without them every caller is tenant `default` upstream, but each caller's
    /// keys live apart in the window (two callers may well pick the same business
    /// key): the partition is the caller's principal.
    pub fn window_tenant(&self, identity: &Identity) -> TenantId {
        if self.credentials.is_some() && identity.principal.as_str() != ANONYMOUS {
            TenantId::new(identity.principal.as_str()).expect("a principal is a valid tenant id")
        } else {
            identity.tenant.clone()
        }
    }

    /// Whether `name` is the credential header the gateway removes before forwarding
    /// (when configured to strip it).
    pub fn is_credential(&self, name: &HeaderName) -> bool {
        self.strip && *name == self.header
    }

    /// Whether `name` carries who the caller is (the API key header or a credential
    /// header): such a field must reach the upstream and the state query unchanged.
    pub fn identifies(&self, name: &HeaderName) -> bool {
        *name == self.header
            || self.credentials.as_ref().is_some_and(|c| {
                c.parts.iter().any(|p| match p {
                    Part::Header(h) => h == name,
                    Part::Cookie(_) => name == http::header::COOKIE,
                })
            })
    }

    /// The credential headers a state query repeats to authenticate as the caller:
    /// those forwarded upstream (a stripped API key is the gateway's, not the
    /// upstream's).
    pub fn forwarded_credentials(&self) -> Vec<HeaderName> {
        let mut out: Vec<HeaderName> = match &self.credentials {
            Some(c) => {
                let mut out = Vec::new();
                for p in &c.parts {
                    let h = match p {
                        Part::Header(h) => h.clone(),
                        Part::Cookie(_) => http::header::COOKIE,
                    };
                    if !out.contains(&h) {
                        out.push(h);
                    }
                }
                out
            }
            None => vec![AUTHORIZATION, http::header::COOKIE],
        };
        if self.strip {
            out.retain(|h| *h != self.header);
        }
        out
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
        ApiKeys::new(&c, false).unwrap()
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
        // No keys: callers without a credential are anonymous, and have no identity
        // unless anonymous access is configured.
        let open = ApiKeys::new(&AuthConfig::default(), false).unwrap();
        assert_eq!(open.identify(&HeaderMap::new()), Caller::Anonymous);
        assert!(open.anonymous().is_none());
        assert!(table("x-api-key").anonymous().is_none());
        let mut c = AuthConfig::default();
        c.api_keys.insert(
            "k1".into(),
            ApiKeyEntry::Tenant(TenantId::new("t1").unwrap()),
        );
        c.anonymous_tenant = Some(TenantId::new("public").unwrap());
        assert_eq!(
            ApiKeys::new(&c, false)
                .unwrap()
                .anonymous()
                .unwrap()
                .tenant
                .as_str(),
            "public"
        );
    }

    fn principal_of(t: &ApiKeys, headers: &[(&str, &str)]) -> Option<String> {
        let mut h = HeaderMap::new();
        for (n, v) in headers {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        match t.identify(&h) {
            Caller::Known(id) => {
                assert_eq!(id.tenant.as_str(), DEFAULT_TENANT);
                Some(id.principal.as_str().to_string())
            }
            Caller::Anonymous => None,
            Caller::Unknown => panic!("no API keys: nothing is unknown"),
        }
    }

    #[test]
    fn credential_headers_make_the_principal() {
        let mut c = AuthConfig {
            principal_secret: Some("0123456789abcdef-secret".into()),
            ..AuthConfig::default()
        };
        let t = ApiKeys::new(&c, true).unwrap();
        let alice = principal_of(&t, &[("authorization", "Bearer alice-token")]).unwrap();
        assert!(alice.starts_with("caller-") && alice.len() == 39, "{alice}");
        assert!(!alice.contains("alice"), "the raw credential never shows");
        assert_eq!(
            principal_of(&t, &[("Authorization", "Bearer alice-token")]).as_deref(),
            Some(alice.as_str()),
            "stable"
        );
        let bob = principal_of(&t, &[("authorization", "Bearer bob-token")]).unwrap();
        assert_ne!(alice, bob);
        let cookie = principal_of(&t, &[("cookie", "sid=1")]).unwrap();
        let both = principal_of(
            &t,
            &[("authorization", "Bearer alice-token"), ("cookie", "sid=1")],
        );
        assert_ne!(Some(cookie.clone()), both);
        assert_ne!(Some(alice.clone()), both);
        assert_eq!(principal_of(&t, &[("x-other", "1")]), None);
        // Another deployment's secret: other principals for the same credential.
        c.principal_secret = Some("another-secret-of-16".into());
        let other = ApiKeys::new(&c, true).unwrap();
        assert_ne!(
            principal_of(&other, &[("authorization", "Bearer alice-token")]).unwrap(),
            alice
        );
        // A shared window needs a shared secret.
        assert!(ApiKeys::new(&AuthConfig::default(), true).is_err());
        // Two single gateways pick their own random secrets.
        let a = ApiKeys::new(&AuthConfig::default(), false).unwrap();
        let b = ApiKeys::new(&AuthConfig::default(), false).unwrap();
        assert_ne!(
            principal_of(&a, &[("cookie", "sid=1")]),
            principal_of(&b, &[("cookie", "sid=1")])
        );
    }

    #[test]
    fn a_named_cookie_is_the_credential() {
        let c = AuthConfig {
            principal_secret: Some("0123456789abcdef-secret".into()),
            credential_headers: Some(vec!["authorization".into(), "cookie:sid".into()]),
            ..AuthConfig::default()
        };
        let t = ApiKeys::new(&c, true).unwrap();
        let one = principal_of(&t, &[("cookie", "lb=1; sid=abc; consent=yes")]).unwrap();
        assert_eq!(
            principal_of(&t, &[("cookie", "consent=no;sid=abc"), ("cookie", "lb=2")]).as_deref(),
            Some(one.as_str()),
            "other cookies do not count"
        );
        assert_ne!(
            principal_of(&t, &[("cookie", "sid=abd")]).as_deref(),
            Some(one.as_str())
        );
        assert_eq!(
            principal_of(&t, &[("cookie", "consent=yes")]),
            None,
            "no sid, no caller"
        );
        for bad in ["cookie:", "cookie:a=b", "bad header"] {
            let c = AuthConfig {
                credential_headers: Some(vec![bad.into()]),
                ..AuthConfig::default()
            };
            assert!(ApiKeys::new(&c, false).is_err(), "{bad}");
        }
    }

    #[test]
    fn blank_credentials_are_absent() {
        let c = AuthConfig {
            principal_secret: Some("0123456789abcdef-secret".into()),
            ..AuthConfig::default()
        };
        let t = ApiKeys::new(&c, true).unwrap();
        for blank in [
            vec![("authorization", "")],
            vec![("authorization", "   ")],
            vec![("authorization", "Bearer")],
            vec![("authorization", "Bearer "), ("cookie", " ")],
            vec![("x-api-key", "")],
        ] {
            assert_eq!(principal_of(&t, &blank), None, "{blank:?}");
        }
        // A blank value beside a real one does not change who the caller is.
        assert_eq!(
            principal_of(&t, &[("authorization", ""), ("x-api-key", "alice")]),
            principal_of(&t, &[("x-api-key", "alice")])
        );
        // With API keys, a blank key is no key.
        let keyed = table("authorization");
        check(&keyed, "authorization", &["Bearer "], None);
        check(&keyed, "authorization", &[""], None);
        check(&table("x-api-key"), "x-api-key", &[" "], None);
    }

    #[test]
    fn the_api_key_header_and_the_upstreams_credentials_make_the_caller_by_default() {
        let c = AuthConfig {
            principal_secret: Some("0123456789abcdef-secret".into()),
            upstream_credential_headers: vec!["X-Session".into()],
            ..AuthConfig::default()
        };
        let t = ApiKeys::new(&c, true).unwrap();
        assert!(t.ignored_upstream_credentials().is_empty());
        let consent = ("cookie", "consent=yes");
        let a = principal_of(&t, &[consent, ("x-api-key", "a")]);
        let b = principal_of(&t, &[consent, ("x-api-key", "b")]);
        assert_ne!(
            a, b,
            "callers differing in the API key header are two callers"
        );
        let s1 = principal_of(&t, &[consent, ("x-session", "s1")]);
        let s2 = principal_of(&t, &[consent, ("x-session", "s2")]);
        assert_ne!(
            s1, s2,
            "callers differing in the upstream's credential are two"
        );
        // A configured identity that leaves the upstream's credential out is told.
        let narrow = AuthConfig {
            credential_headers: Some(vec!["cookie:sid".into()]),
            ..c
        };
        let t = ApiKeys::new(&narrow, true).unwrap();
        assert_eq!(t.ignored_upstream_credentials(), ["x-session"]);
    }

    #[test]
    fn secret_from_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "file-secret-0123456789\n").unwrap();
        let from_file = AuthConfig {
            principal_secret_file: Some(path.clone()),
            ..AuthConfig::default()
        };
        let inline = AuthConfig {
            principal_secret: Some("file-secret-0123456789".into()),
            ..AuthConfig::default()
        };
        let h = [("authorization", "Bearer x")];
        assert_eq!(
            principal_of(&ApiKeys::new(&from_file, true).unwrap(), &h),
            principal_of(&ApiKeys::new(&inline, true).unwrap(), &h)
        );
        std::fs::write(&path, "short").unwrap();
        assert!(ApiKeys::new(&from_file, true).is_err());
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
