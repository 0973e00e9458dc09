//! Who is calling: the tenant and principal a record is scoped to and bound to.
//!
//! The application supplies authentication through [`Authenticate`]; the layer only asks
//! it. This module must never read the tenant from a header a client can set freely:
//! tenant and principal come from credentials the application verified.

use async_trait::async_trait;
use http::header::{HeaderValue, AUTHORIZATION};
use http::request::Parts;
/// The authenticated caller. The layer also puts it into the request's extensions, so
/// handlers can read it with `Extension<Identity>`.
pub use idem_core::Identity;
use sha2::{Digest, Sha256};

/// Authentication refused: the layer answers 401 and records nothing.
#[derive(Debug, Clone, Default)]
pub struct Unauthenticated {
    /// Shown in the problem's `detail`; do not put secrets here.
    pub detail: String,
    /// Sent as `WWW-Authenticate`.
    pub challenge: Option<HeaderValue>,
}

impl Unauthenticated {
    pub fn new(detail: impl Into<String>) -> Self {
        Self {
            detail: detail.into(),
            challenge: None,
        }
    }
}

/// The application's authentication, as the layer needs it.
///
/// Implementations verify credentials (a session, a JWT, an mTLS identity the server
/// stored in the extensions) and return the tenant and principal they prove.
#[async_trait]
pub trait Authenticate: Send + Sync + 'static {
    async fn authenticate(&self, request: &Parts) -> Result<Identity, Unauthenticated>;
}

/// Static bearer tokens, each standing for one identity: for demos, tests and the
/// embedded single-machine setup. Tokens are secrets; the tenant never comes from a
/// header the client chooses.
///
/// Only SHA-256 digests of the tokens are kept, and a presented token is compared with
/// every one of them in constant time, so neither its content nor its length shows in
/// the answer time.
#[derive(Clone, Default)]
pub struct BearerTokens {
    tokens: Vec<(TokenDigest, Identity)>,
}

type TokenDigest = [u8; 32];

fn digest(secret: &[u8]) -> TokenDigest {
    Sha256::digest(secret).into()
}

fn same_digest(a: &TokenDigest, b: &TokenDigest) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether two secrets are equal, in time independent of their content and length
/// (their digests are compared, not the bytes).
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    same_digest(&digest(a), &digest(b))
}

impl BearerTokens {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `token` for `identity`, refusing a token that already stands for another
    /// identity (one secret must never open two tenants).
    pub fn try_with(
        self,
        token: impl Into<String>,
        identity: Identity,
    ) -> Result<Self, TokenConflict> {
        let token = token.into();
        let d = digest(token.as_bytes());
        if let Some((_, known)) = self
            .tokens
            .iter()
            .find(|(k, id)| same_digest(k, &d) && *id != identity)
        {
            return Err(TokenConflict {
                first: known.clone(),
                second: identity,
            });
        }
        Ok(self.with(token, identity))
    }

    /// Adds `token` for `identity`; a token given again now stands for the new identity
    /// (use [`BearerTokens::try_with`] for configuration read from outside).
    pub fn with(mut self, token: impl Into<String>, identity: Identity) -> Self {
        let d = digest(token.into().as_bytes());
        self.tokens.retain(|(known, _)| !same_digest(known, &d));
        self.tokens.push((d, identity));
        self
    }

    /// How many tokens are configured.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    fn find(&self, token: &str) -> Option<&Identity> {
        let presented = digest(token.as_bytes());
        // Every entry is compared: no early exit on a match.
        let mut found = None;
        for (known, identity) in &self.tokens {
            if same_digest(known, &presented) {
                found = Some(identity);
            }
        }
        found
    }
}

/// One bearer token configured for two identities.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("one token is configured for {} and for {}", first.tenant, second.tenant)]
pub struct TokenConflict {
    pub first: Identity,
    pub second: Identity,
}

impl std::fmt::Debug for BearerTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BearerTokens")
            .field("tokens", &self.tokens.len())
            .finish()
    }
}

#[async_trait]
impl Authenticate for BearerTokens {
    async fn authenticate(&self, request: &Parts) -> Result<Identity, Unauthenticated> {
        let challenge = Some(HeaderValue::from_static("Bearer"));
        let token = request
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, token) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            });
        let Some(token) = token else {
            return Err(Unauthenticated {
                detail: "a bearer token is required".into(),
                challenge,
            });
        };
        self.find(token).cloned().ok_or(Unauthenticated {
            detail: "the bearer token is not recognised".into(),
            challenge,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{Principal, TenantId};

    fn parts(auth: Option<&str>) -> Parts {
        let mut b = http::Request::builder().header("x-tenant", "t2");
        if let Some(a) = auth {
            b = b.header(AUTHORIZATION, a);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn a_token_for_two_identities_is_refused() {
        let id = |t: &str| Identity::new(TenantId::new(t).unwrap(), Principal::new(t).unwrap());
        let auth = BearerTokens::new().try_with("s3cret", id("t1")).unwrap();
        let again = auth.clone().try_with("s3cret", id("t1")).unwrap();
        assert_eq!(again.len(), 1, "the same pair twice is one entry");
        let e = auth.try_with("s3cret", id("t2")).unwrap_err();
        assert_eq!(e.first.tenant.as_str(), "t1");
        assert!(!e.to_string().contains("s3cret"));
    }

    #[tokio::test]
    async fn bearer_tokens() {
        let alice = Identity::new(
            TenantId::new("t1").unwrap(),
            Principal::new("alice").unwrap(),
        );
        let auth = BearerTokens::new().with("s3cret", alice.clone());
        assert_eq!(
            auth.authenticate(&parts(Some("Bearer s3cret")))
                .await
                .unwrap(),
            alice
        );
        assert_eq!(
            auth.authenticate(&parts(Some("bearer s3cret")))
                .await
                .unwrap(),
            alice
        );
        assert!(auth
            .authenticate(&parts(Some("Bearer other")))
            .await
            .is_err());
        assert!(auth
            .authenticate(&parts(Some("Basic s3cret")))
            .await
            .is_err());
        let none = auth.authenticate(&parts(None)).await.unwrap_err();
        assert_eq!(none.challenge.unwrap(), "Bearer");
        assert!(auth
            .authenticate(&parts(Some("Bearer s3cret-and-more")))
            .await
            .is_err());
        assert!(!format!("{auth:?}").contains("s3cret"));
    }

    #[test]
    fn a_token_given_again_is_replaced() {
        let id = |t: &str| Identity::new(TenantId::new(t).unwrap(), Principal::new("p").unwrap());
        let auth = BearerTokens::new()
            .with("tok-1", id("a"))
            .with("tok-1", id("b"));
        assert_eq!(auth.len(), 1);
        assert_eq!(auth.find("tok-1"), Some(&id("b")));
    }

    #[test]
    fn secrets_compare_by_digest() {
        assert!(same_secret(b"admin-secret-token", b"admin-secret-token"));
        assert!(!same_secret(b"admin-secret-token", b"admin-secret-toke"));
        assert!(!same_secret(b"", b"x"));
        assert!(same_secret(b"", b""));
    }
}
