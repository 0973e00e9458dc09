//! The HTTP contract's header names and key parsing (defined once in
//! [`idem_core::wire`], re-exported here), plus the request id a server assigns.
//!
//! It must not decide what a missing or invalid key means for a route: that is the
//! configuration's [`KeyRule`].

use std::sync::Arc;

pub use idem_core::wire::*;

/// The id of this request: the client's own (see [`client_request_id`]), else a fresh
/// UUIDv7.
pub fn request_id(headers: &http::HeaderMap) -> Arc<str> {
    client_request_id(headers).map_or_else(new_request_id, Arc::from)
}

/// A fresh request id: a UUIDv7 in simple form, encoded on the stack (a server makes one
/// for every request).
pub fn new_request_id() -> Arc<str> {
    Arc::from(
        &*uuid::Uuid::now_v7()
            .simple()
            .encode_lower(&mut uuid::Uuid::encode_buffer()),
    )
}
