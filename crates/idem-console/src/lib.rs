//! idem-console: the operator console of any idem SQL store, at `/console/`.
//!
//! # What this crate owns
//! - Access: the login with the admin token (checked in constant time before anything
//!   else; failures throttled per client address and in all), sessions (an HttpOnly,
//!   SameSite=Strict cookie; the database keeps only its SHA-256, the expiry and the
//!   session's CSRF token), the CSRF and cross-site checks of every form, the headers of
//!   every answer (a content security policy that allows no script), and the audit of
//!   every action — `access`, over its own tables (`tables`).
//! - The pages that need only the store: overview, search by key and by result
//!   reference, the key inspector, leases with their evidence, audit (`pages/`),
//!   rendered with maud (`view/`): every value escaped, markup checked at compile time.
//! - The seams a host fills: [`ArrivalTimeline`] for the arrival timeline,
//!   [`ConsoleExtension`] and a `Router<Console>` of its own pages.
//!
//! # What it must not do
//! - Read or write another crate's tables: records come through [`idem_core::Inspect`]
//!   and the store traits, arrivals through [`ArrivalTimeline`].
//! - Change a record, a lease or a ledger: its only writes are sessions and the audit.

mod access;
mod error;
mod ext;
mod login;
pub mod pages;
mod rates;
mod session;
mod tables;
mod timeline;
pub mod view;

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use axum::extract::DefaultBodyLimit;
use axum::http::HeaderMap;
use axum::routing::{get, post};
use axum::Router;
use idem_core::{ArchiveLookup, IdempotencyStore, Inspect, LeaseStore};
use idem_http::IdempotencyMetrics;
use idem_sql::SqlStore;

pub use access::{
    audit, bad_request, failed, html_response, ok_page, reason, redirect, Form, Operator, Params,
    MAX_REASON,
};
pub use error::ConsoleError;
pub use ext::{ConsoleExtension, SearchKind};
pub use rates::sample_rates;
pub use session::{COOKIE_NAME, SESSION_TTL};
pub use tables::{migrate, AuditRow};
pub use timeline::{ArrivalRow, ArrivalTimeline, ArrivedKey, KeyArrivals, StoreTimeline};
pub use view::NavEntry;

/// The largest form body the console reads (a few fields; nobody needs more).
pub const MAX_FORM: usize = 64 * 1024;

/// Whose address a request comes from, for the login throttle and its audit.
pub trait ClientAddress: Send + Sync + 'static {
    fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr;
}

/// Every peer is the client (no trusted proxy).
pub struct PeerIsClient;

impl ClientAddress for PeerIsClient {
    fn client(&self, peer: IpAddr, _headers: &HeaderMap) -> IpAddr {
        peer.to_canonical()
    }
}

/// How the console is served.
#[derive(Clone)]
pub struct ConsoleOptions {
    /// The cookie gets `Secure` (the server speaks HTTPS, or a proxy in front does).
    pub secure_cookie: bool,
    /// Whose `X-Forwarded-For` names the client of a login.
    pub client_address: Arc<dyn ClientAddress>,
    /// The command that serves the console, for the login and disabled pages
    /// (`idem serve`, `idem console`).
    pub command: &'static str,
}

impl Default for ConsoleOptions {
    fn default() -> Self {
        Self {
            secure_cookie: false,
            client_address: Arc::new(PeerIsClient),
            command: "idem serve",
        }
    }
}

/// The console's state: the store's roles, the admin token, the options and the host's
/// extension. Cheap to clone.
#[derive(Clone)]
pub struct Console {
    inner: Arc<Inner>,
}

struct Inner {
    db: SqlStore,
    records: Arc<dyn IdempotencyStore>,
    inspect: Arc<dyn Inspect>,
    leases: Arc<dyn LeaseStore>,
    archive: Arc<dyn ArchiveLookup>,
    timeline: Option<Arc<dyn ArrivalTimeline>>,
    admin_token: Option<Arc<str>>,
    options: ConsoleOptions,
    rates: Option<rates::Rates>,
    extension: Option<Arc<dyn ConsoleExtension>>,
    failures: Mutex<login::Failures>,
}

/// What [`Console::new`] is built from.
pub struct ConsoleParts {
    /// The SQL store: its roles, and the home of the console's own tables.
    pub db: SqlStore,
    /// `None`: every page answers 403 "disabled".
    pub admin_token: Option<String>,
    pub options: ConsoleOptions,
    pub timeline: Option<Arc<dyn ArrivalTimeline>>,
    /// The layer's decision counters, for the overview's rates (a host that runs the
    /// layer; a standalone console has none).
    pub metrics: Option<IdempotencyMetrics>,
    pub extension: Option<Arc<dyn ConsoleExtension>>,
}

impl Console {
    /// The console of `parts.db`. Run [`migrate`] on the store first.
    pub fn new(parts: ConsoleParts) -> Self {
        let db = parts.db;
        Self {
            inner: Arc::new(Inner {
                records: db.records(),
                inspect: db.inspect(),
                leases: db.leases(),
                archive: db.archive(),
                db,
                timeline: parts.timeline,
                admin_token: parts.admin_token.map(Arc::from),
                options: parts.options,
                rates: parts.metrics.map(rates::Rates::new),
                extension: parts.extension,
                failures: Mutex::new(login::Failures::default()),
            }),
        }
    }

    pub fn db(&self) -> &SqlStore {
        &self.inner.db
    }

    pub fn records(&self) -> &Arc<dyn IdempotencyStore> {
        &self.inner.records
    }

    pub fn inspect(&self) -> &Arc<dyn Inspect> {
        &self.inner.inspect
    }

    pub fn leases(&self) -> &Arc<dyn LeaseStore> {
        &self.inner.leases
    }

    pub fn archive(&self) -> &Arc<dyn ArchiveLookup> {
        &self.inner.archive
    }

    pub fn timeline(&self) -> Option<&Arc<dyn ArrivalTimeline>> {
        self.inner.timeline.as_ref()
    }

    pub fn enabled(&self) -> bool {
        self.inner.admin_token.is_some()
    }

    fn extension(&self) -> Option<&Arc<dyn ConsoleExtension>> {
        self.inner.extension.as_ref()
    }

    /// The navigation: the console's pages with the host's after Search.
    pub fn nav(&self) -> Vec<NavEntry> {
        let mut nav = vec![
            NavEntry {
                label: "Overview",
                href: "/console/",
            },
            NavEntry {
                label: "Search",
                href: "/console/search",
            },
        ];
        if let Some(ext) = self.extension() {
            nav.extend(ext.nav());
        }
        nav.push(NavEntry {
            label: "Leases",
            href: "/console/leases",
        });
        nav.push(NavEntry {
            label: "Audit",
            href: "/console/audit",
        });
        nav
    }
}

/// The console's routes, every path under `/console` (a host merges them beside its
/// own), with `host`'s pages added behind the same login and headers.
pub fn router(console: Console, host: Option<Router<Console>>) -> Router {
    let mut routes = Router::new()
        .route("/console", get(|| async { redirect("/console/") }))
        .route("/console/", get(pages::overview::page))
        .route("/console/assets/console.css", get(access::stylesheet))
        .route("/console/login", get(login::login_page).post(login::login))
        .route("/console/logout", post(login::logout))
        .route("/console/keys/{tenant}/{*key}", get(pages::key::page))
        .route("/console/search", get(pages::search::page))
        .route("/console/leases", get(pages::leases::list))
        .route("/console/leases/{*name}", get(pages::leases::one))
        .route("/console/audit", get(pages::audit::page));
    if let Some(host) = host {
        routes = routes.merge(host);
    }
    routes
        .route_layer(axum::middleware::from_fn(access::guard))
        .layer(DefaultBodyLimit::max(MAX_FORM))
        .with_state(console)
}
