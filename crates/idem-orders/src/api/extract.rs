//! Reading a request's parts into values: a JSON body (400 when malformed, 422 when
//! the fields are wrong), and the problems for a path or query that does not parse.
//!
//! Only parses; must not authenticate (that is [`super::auth`]) or act.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::error::ApiError;

pub(super) fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => ApiError::invalid_body(&e),
        _ => ApiError::malformed_json(&e),
    })
}

pub(super) fn path_error(e: PathRejection) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid-path",
        "Invalid path",
        e.body_text(),
    )
}

pub(super) fn query_error(e: QueryRejection) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid-query",
        "Invalid query",
        e.body_text(),
    )
}
