//! The operator console of `idem serve`: the store's console (`idem_console`: login,
//! sessions, CSRF, audit, overview, search by key and result reference, the key
//! inspector, leases) with this service's pages added — reconciliation, freeze
//! switches, search by order, user and show, the order on the key page, the active
//! freezes on the overview — and the arrival timeline read from [`ArrivalLog`].
//!
//! Owns those additions and the adapters (timeline, client address). Pages change state
//! only through the service's own paths (`freeze`, `reconcile`) and are audited; this
//! module must not write ledgers itself.

mod freezes;
mod orders;
mod reconcile;

use std::net::IpAddr;
use std::sync::Arc;

use async_trait::async_trait;
use axum::http::HeaderMap;
use axum::routing::{get, post};
use axum::{Extension, Router};
use idem_console::{
    ArrivalTimeline, ClientAddress, Console, ConsoleError, ConsoleExtension, ConsoleOptions,
    ConsoleParts, NavEntry, SearchKind, StoreTimeline,
};
use idem_core::{IdempotencyKey, Record, TenantId};
use idem_http::IdempotencyMetrics;
use maud::Markup;

use crate::db::Database;
use crate::error::Error;
use crate::forwarded::TrustedProxies;
use crate::metrics::OrdersMetrics;
use idem_sql::ArrivalLog;

pub use idem_console::{COOKIE_NAME, SESSION_TTL};

/// A service error as the console's: unavailable stays unavailable.
pub(crate) fn console_error(e: Error) -> ConsoleError {
    if e.is_unavailable() {
        ConsoleError::unavailable(e.to_string())
    } else {
        ConsoleError::backend(e.to_string())
    }
}

/// What the service's pages share.
pub(crate) struct OrdersConsole {
    pub(crate) db: Database,
    pub(crate) metrics: OrdersMetrics,
}

/// How the console is built for `idem serve`.
pub(crate) struct ConsoleConfig {
    pub(crate) admin_token: Option<String>,
    pub(crate) arrivals: Option<ArrivalLog>,
    pub(crate) metrics: IdempotencyMetrics,
    pub(crate) secure_cookie: bool,
    pub(crate) proxies: TrustedProxies,
}

/// The console of this service's database, its tables migrated.
pub(crate) async fn build(
    db: &Database,
    metrics: &OrdersMetrics,
    config: ConsoleConfig,
) -> Result<Console, Error> {
    idem_console::migrate(db.store())
        .await
        .map_err(|e| Error::Backend(e.to_string()))?;
    let timeline: Arc<dyn ArrivalTimeline> =
        Arc::new(StoreTimeline::new(db.store().clone(), config.arrivals));
    Ok(Console::new(ConsoleParts {
        db: db.store().clone(),
        admin_token: config.admin_token,
        options: ConsoleOptions {
            secure_cookie: config.secure_cookie,
            client_address: Arc::new(config.proxies),
            command: "idem serve",
        },
        timeline: Some(timeline),
        metrics: Some(config.metrics),
        extension: Some(Arc::new(OrdersConsole {
            db: db.clone(),
            metrics: metrics.clone(),
        })),
    }))
}

/// The console's routes with this service's pages, every path under `/console`.
pub(crate) fn router(console: Console, db: &Database, metrics: &OrdersMetrics) -> Router {
    let shared = Arc::new(OrdersConsole {
        db: db.clone(),
        metrics: metrics.clone(),
    });
    let pages = Router::new()
        .route(
            "/console/reconcile",
            get(reconcile::page).post(reconcile::apply),
        )
        .route("/console/freezes", get(freezes::page).post(freezes::freeze))
        .route("/console/freezes/unfreeze", post(freezes::unfreeze))
        .layer(Extension(shared));
    idem_console::router(console, Some(pages))
}

impl ClientAddress for TrustedProxies {
    fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        TrustedProxies::client(self, peer, headers)
    }
}

#[async_trait]
impl ConsoleExtension for OrdersConsole {
    fn nav(&self) -> Vec<NavEntry> {
        vec![
            NavEntry {
                label: "Reconcile",
                href: "/console/reconcile",
            },
            NavEntry {
                label: "Freezes",
                href: "/console/freezes",
            },
        ]
    }

    fn search_kinds(&self) -> Vec<SearchKind> {
        orders::SEARCH_KINDS.to_vec()
    }

    async fn search(
        &self,
        console: &Console,
        by: &str,
        needle: &str,
        tenant: Option<&TenantId>,
    ) -> Result<Markup, ConsoleError> {
        orders::search(self, console, by, needle, tenant)
            .await
            .map_err(console_error)
    }

    async fn key_section(
        &self,
        _console: &Console,
        tenant: &TenantId,
        key: &IdempotencyKey,
        record: Option<&Record>,
    ) -> Result<Option<Markup>, ConsoleError> {
        orders::key_order(&self.db, tenant, key, record)
            .await
            .map_err(console_error)
    }

    async fn overview_section(&self, _console: &Console) -> Result<Option<Markup>, ConsoleError> {
        freezes::overview(&self.db)
            .await
            .map(Some)
            .map_err(console_error)
    }
}
