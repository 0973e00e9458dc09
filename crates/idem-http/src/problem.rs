//! Problem answers (the cases, their type URIs and wire form are
//! [`idem_core::problem`]'s, re-exported here) as responses of this crate's body type.

use http::Response;
pub use idem_core::problem::*;

use crate::body::{full, Body};

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
