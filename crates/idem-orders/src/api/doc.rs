//! What the handlers' `#[utoipa::path]` attributes share: the operations' tag, the
//! problem body every error is answered with, and the refusal sets that every tenant,
//! admin or body-reading operation may answer. The handlers take these from here;
//! [`crate::openapi`] takes the handlers (and re-exports the public types).

use utoipa::{IntoResponses, ToSchema};

/// The tag of every operation, written out: utoipa's default is the handler's module
/// path, `crate::api` when the document was first published; moving a handler must not
/// change the document.
pub(crate) const TAG: &str = "crate::api";

/// An RFC 9457 problem, as every error of this service is answered
/// (`application/problem+json`).
#[derive(ToSchema)]
#[allow(dead_code)] // describes the wire; `ApiError` writes it
pub struct Problem {
    /// `https://idem.dev/problems/…`.
    r#type: String,
    title: String,
    status: u16,
    detail: Option<String>,
    instance: Option<String>,
    /// The request's id (also in `X-Request-Id`).
    request_id: Option<String>,
}

/// What every tenant operation may answer besides its own outcomes.
#[derive(IntoResponses)]
#[allow(dead_code)] // describes the wire
pub enum TenantRefusals {
    #[response(
        status = 401,
        description = "No or an unknown API key",
        content_type = "application/problem+json"
    )]
    Unauthenticated(Problem),
    #[response(
        status = 503,
        description = "The database does not answer, or the stock left is held by other orders; retry",
        content_type = "application/problem+json"
    )]
    Unavailable(Problem),
}

/// What every admin operation may answer besides its own outcomes.
#[derive(IntoResponses)]
#[allow(dead_code)] // describes the wire
pub enum AdminRefusals {
    #[response(
        status = 401,
        description = "No or a wrong admin token",
        content_type = "application/problem+json"
    )]
    Unauthenticated(Problem),
    #[response(
        status = 403,
        description = "The admin API is disabled (no admin token configured)",
        content_type = "application/problem+json"
    )]
    Disabled(Problem),
    #[response(
        status = 503,
        description = "The database does not answer, or the stock left is held by other orders; retry",
        content_type = "application/problem+json"
    )]
    Unavailable(Problem),
}

/// What every operation that reads a JSON body may answer about the body.
#[derive(IntoResponses)]
#[allow(dead_code)] // describes the wire
pub enum BodyRefusals {
    #[response(
        status = 400,
        description = "Malformed JSON",
        content_type = "application/problem+json"
    )]
    Malformed(Problem),
    #[response(
        status = 408,
        description = "The body did not arrive in time",
        content_type = "application/problem+json"
    )]
    TooSlow(Problem),
    #[response(
        status = 413,
        description = "Body too large",
        content_type = "application/problem+json"
    )]
    TooLarge(Problem),
    #[response(
        status = 415,
        description = "Not application/json",
        content_type = "application/problem+json"
    )]
    NotJson(Problem),
}
