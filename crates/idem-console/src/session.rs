//! The console session's tokens: how they are made, the cookie that carries one, how
//! long a session lasts, and the digests the database keeps instead (of the cookie, and
//! of the admin token the session was opened with).
//!
//! Owns those names and digests. It must not open, check or end a session: that is
//! `login`'s and `access`'.

use std::time::Duration;

use axum::http::header::COOKIE;
use axum::http::HeaderMap;
use sha2::{Digest, Sha256};

/// The session cookie's name.
pub const COOKIE_NAME: &str = "idem_console";
/// How long a console session lasts after login.
pub const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);

/// SHA-256, in hex: what the database keeps of a session cookie.
pub(crate) fn digest_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// What a session keeps of the admin token it was opened with: a session opened with a
/// token that has since been replaced is no session.
pub(crate) fn token_digest(admin: &str) -> String {
    digest_hex(&format!("idem-console-session:{admin}"))
}

/// A fresh random token (a session cookie, a CSRF token): 256 bits, in hex.
pub(crate) fn random_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// The session cookie a request carries, if it is one this console could have set.
pub(crate) fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE_NAME)
        .map(|(_, value)| value.to_owned())
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
}
