//! Who is calling: the tenant and principal a record is scoped to and bound to.
//!
//! The application supplies authentication through [`Authenticate`]; the layer only asks
//! it. This module must never read the tenant from a header a client can set freely:
//! tenant and principal come from credentials the application verified.

use std::collections::HashMap;

use async_trait::async_trait;
use http::header::{HeaderValue, AUTHORIZATION};
use http::request::Parts;
use idem_core::{Principal, TenantId};

/// The authenticated caller. The layer also puts it into the request's extensions, so
/// handlers can read it with `Extension<Identity>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    pub tenant: TenantId,
    pub principal: Principal,
}

impl Identity {
    pub fn new(tenant: TenantId, principal: Principal) -> Self {
        Self { tenant, principal }
    }
}

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
#[derive(Debug, Clone, Default)]
pub struct BearerTokens {
    tokens: HashMap<String, Identity>,
}

impl BearerTokens {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with(mut self, token: impl Into<String>, identity: Identity) -> Self {
        self.tokens.insert(token.into(), identity);
        self
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
        self.tokens.get(token).cloned().ok_or(Unauthenticated {
            detail: "the bearer token is not recognised".into(),
            challenge,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(auth: Option<&str>) -> Parts {
        let mut b = http::Request::builder().header("x-tenant", "t2");
        if let Some(a) = auth {
            b = b.header(AUTHORIZATION, a);
        }
        b.body(()).unwrap().into_parts().0
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
    }
}
