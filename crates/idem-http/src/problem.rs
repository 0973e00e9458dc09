//! Problem answers (the cases, their type URIs and wire form are
//! [`idem_core::problem`]'s, re-exported here) as responses of this crate's body type.

use http::Response;
pub use idem_core::problem::*;

use crate::body::{full, Body, BoxError};

/// Turns a problem into a response.
pub trait ProblemResponse {
    /// The answer, naming `request_id` in the body when given.
    fn response_for(&self, request_id: Option<&str>) -> Response<Body>;

    fn response(&self) -> Response<Body> {
        self.response_for(None)
    }
}

impl ProblemResponse for Problem {
    fn response_for(&self, request_id: Option<&str>) -> Response<Body> {
        self.to_http(request_id).map(full)
    }
}

/// The answer when the inner service returns an error instead of a response.
pub(crate) fn inner_failed(e: BoxError) -> Response<Body> {
    tracing::error!(error = %e, "the inner service failed");
    Problem::new(ProblemKind::ExecutionFailed, "the request failed").response()
}
