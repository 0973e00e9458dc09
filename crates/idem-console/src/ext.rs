//! How a host adds its own pages to the console: navigation entries, search kinds, and
//! sections of the overview and the key page. The host's routes are a
//! `Router<Console>` handed to [`crate::router`]; its handlers use the same
//! [`crate::Operator`] extractor, so they are behind the same login and CSRF rules.
//! This module defines the seams only; it must not know any host.

use async_trait::async_trait;
use idem_core::{IdempotencyKey, Record, TenantId};
use maud::Markup;

use crate::error::ConsoleError;
use crate::view::NavEntry;
use crate::Console;

/// One way to search that a host adds (`by=value`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchKind {
    pub value: &'static str,
    pub label: &'static str,
    /// Whether the search reads one tenant's index (and so needs the tenant).
    pub needs_tenant: bool,
}

/// A host's additions. Every method has a default: a host adds what it needs.
#[async_trait]
pub trait ConsoleExtension: Send + Sync + 'static {
    /// Navigation entries, shown after Search.
    fn nav(&self) -> Vec<NavEntry> {
        Vec::new()
    }

    /// Search kinds, offered after "idempotency key".
    fn search_kinds(&self) -> Vec<SearchKind> {
        Vec::new()
    }

    /// The results of a search by one of [`search_kinds`](Self::search_kinds).
    async fn search(
        &self,
        _console: &Console,
        _by: &str,
        _needle: &str,
        _tenant: Option<&TenantId>,
    ) -> Result<Markup, ConsoleError> {
        Ok(maud::html! {})
    }

    /// A section of the key page, shown under its heading.
    async fn key_section(
        &self,
        _console: &Console,
        _tenant: &TenantId,
        _key: &IdempotencyKey,
        _record: Option<&Record>,
    ) -> Result<Option<Markup>, ConsoleError> {
        Ok(None)
    }

    /// A section at the end of the overview.
    async fn overview_section(&self, _console: &Console) -> Result<Option<Markup>, ConsoleError> {
        Ok(None)
    }
}
