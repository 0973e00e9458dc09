//! Who is calling: a tenant ([`Caller`], from the API key) or the operator (the admin
//! token, [`require_admin`]), and the 401/403 problems when neither is shown.
//!
//! Tenants come from authentication only, never from a header or body the client
//! chooses. This module must not read bodies or decide what a caller may do beyond
//! being who it says.

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use idem_http::problem::{Problem, ProblemKind, ProblemResponse};
use idem_http::{Identity, Unauthenticated};

use super::error::ApiError;
use super::state::AppState;

/// The authenticated caller: from the idempotency layer when it ran (POSTs), otherwise
/// from the same authentication.
pub(crate) struct Caller(Identity);

impl FromRequestParts<AppState> for Caller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        if let Some(identity) = parts.extensions.get::<Identity>() {
            return Ok(Caller(identity.clone()));
        }
        match state.auth.authenticate(parts).await {
            Ok(identity) => Ok(Caller(identity)),
            Err(refused) => Err(unauthenticated(refused)),
        }
    }
}

impl Caller {
    pub(super) fn tenant(&self) -> &str {
        self.0.tenant.as_str()
    }
}

/// The admin token: 403 when none is configured, 401 when it is missing or wrong.
pub(super) fn require_admin(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(expected) = &state.admin_token else {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "admin-disabled",
            "The admin API is disabled",
            "start the server with --admin-token",
        ));
    };
    let presented = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    match presented {
        // Digests compared in constant time: neither content nor length leaks.
        Some(token) if idem_http::auth::same_secret(token.as_bytes(), expected.as_bytes()) => {
            Ok(())
        }
        _ => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "admin-unauthenticated",
            "Admin token required",
            "send Authorization: Bearer ADMIN_TOKEN",
        )),
    }
}

/// The layer's own 401, with the authenticator's challenge.
pub(super) fn unauthenticated(refused: Unauthenticated) -> Response {
    Problem::new(ProblemKind::Unauthenticated, refused.detail)
        .challenge(refused.challenge)
        .response()
        .into_response()
}
