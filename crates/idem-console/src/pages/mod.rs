//! The console's own pages, one module each. They read through the store's traits
//! ([`idem_core::Inspect`], records, leases, archive) and the host's
//! [`crate::ArrivalTimeline`]; none writes anything but the audit.

pub mod audit;
pub mod key;
pub mod leases;
pub mod overview;
pub mod search;

use axum::response::Response;
use maud::Markup;

use crate::access::{failed, ok_page, Operator};
use crate::error::ConsoleError;

/// A page whose body may have failed to build.
fn shown(
    op: &Operator,
    title: &str,
    current: &str,
    body: Result<Markup, ConsoleError>,
) -> Response {
    match body {
        Ok(body) => ok_page(op, title, current, body),
        Err(e) => failed(&e),
    }
}
