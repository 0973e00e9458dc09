//! The gateway's error responses. The cases, their type URIs and wire form are the
//! ones of `idem-core` (shared with the server-side layer, so clients see one set of
//! type URIs whichever layer answered); this module only renders them in the gateway's
//! body type. It does not decide when a case applies.

use http::header::{HeaderValue, WWW_AUTHENTICATE};
use http::Response;
pub use idem_core::problem::{Problem, ProblemKind, PROBLEM_JSON, PROBLEM_TYPE_BASE};

use crate::body::{full, Body};

/// The response, naming the request id the log line carries. A 401 challenges for an
/// API key unless the problem names another scheme.
pub fn to_response(problem: &Problem, request_id: Option<&str>) -> Response<Body> {
    let mut response = problem.to_http(request_id);
    if problem.kind == ProblemKind::Unauthenticated && problem.challenge.is_none() {
        response
            .headers_mut()
            .insert(WWW_AUTHENTICATE, HeaderValue::from_static("ApiKey"));
    }
    response.map(full)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{CONTENT_TYPE, RETRY_AFTER};
    use std::time::Duration;

    #[test]
    fn wire_form() {
        let p = Problem::new(ProblemKind::RequestInProgress, "wait")
            .retry_after(Duration::from_millis(1200));
        let r = to_response(&p, None);
        assert_eq!(r.status(), 409);
        assert_eq!(r.headers()[CONTENT_TYPE], PROBLEM_JSON);
        assert_eq!(r.headers()[RETRY_AFTER], "2");
        let r = to_response(&Problem::new(ProblemKind::Unauthenticated, "who"), None);
        assert_eq!(r.headers()[WWW_AUTHENTICATE], "ApiKey");
    }
}
