//! Transactional mode: the handler finishes the claim in its own database transaction,
//! so the business write and the idempotency record commit together.
//!
//! Every execution under a claim carries a [`TransactionalClaim`] in its request
//! extensions. A handler writing to the same database takes it, writes its rows and
//! `finish_in_tx` in one transaction, commits, and then tells the claim with
//! [`TransactionalClaim::finished_in_transaction`]. The layer then does not finish the
//! record again. A handler that ignores the claim changes nothing: the layer finishes
//! the record from the response as usual.
//!
//! On a route configured with [`ClaimMode::InTransaction`](crate::ClaimMode) nothing is
//! claimed before the handler runs: the handler claims
//! ([`deferred_request`](TransactionalClaim::deferred_request), the store's `claim_in_tx`)
//! as the first write of its transaction, reports the token with
//! [`claimed`](TransactionalClaim::claimed) — or the store's other answer with
//! [`answered`](TransactionalClaim::answered), returning at once — and finishes and
//! commits as above: one commit for the record and the rows.
//!
//! ```
//! use axum::extract::State;
//! use axum::http::{header::CONTENT_TYPE, HeaderMap, HeaderValue, StatusCode};
//! use axum::response::IntoResponse;
//! use axum::Extension;
//! use idem_http::TransactionalClaim;
//! use idem_sqlite::SqliteStore;
//! # use axum::{body::Body, http::Request, routing::post, Router};
//! # use idem_core::{Principal, TenantId};
//! # use idem_http::{BearerTokens, IdempotencyLayer, Identity};
//! # use tower::ServiceExt;
//! # struct AppError;
//! # impl<E: std::error::Error> From<E> for AppError {
//! #     fn from(_: E) -> Self { AppError }
//! # }
//! # impl IntoResponse for AppError {
//! #     fn into_response(self) -> axum::response::Response {
//! #         StatusCode::INTERNAL_SERVER_ERROR.into_response()
//! #     }
//! # }
//!
//! async fn create_order(
//!     State(store): State<SqliteStore>,
//!     Extension(claim): Extension<TransactionalClaim>,
//! ) -> Result<impl IntoResponse, AppError> {
//!     let mut tx = store.begin().await?;
//!     let inserted = sqlx::query("INSERT INTO orders (item) VALUES ('book')")
//!         .execute(&mut *tx)
//!         .await?;
//!     let body = format!(r#"{{"order":{}}}"#, inserted.last_insert_rowid()).into_bytes();
//!     let json = HeaderValue::from_static("application/json");
//!     let headers = HeaderMap::from_iter([(CONTENT_TYPE, json)]);
//!     let finish = claim.finish_for(StatusCode::CREATED, &headers, &body);
//!     let record = store.finish_in_tx(&mut tx, claim.token(), finish).await?;
//!     tx.commit().await?;
//!     // Only after the commit: had it failed, the layer finishes the record itself.
//!     claim.finished_in_transaction(record);
//!     Ok((StatusCode::CREATED, headers, body))
//! }
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let store = SqliteStore::open_path(dir.path().join("idem.db")).await?;
//! # sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)")
//! #     .execute(store.pool())
//! #     .await?;
//! # let alice = Identity::new(TenantId::new("t1")?, Principal::new("alice")?);
//! # let auth = BearerTokens::new().with("secret-token", alice);
//! let app = Router::new()
//!     .route("/orders", post(create_order))
//!     .with_state(store.clone())
//!     .layer(IdempotencyLayer::new(store.clone(), auth));
//! # let request = || {
//! #     Request::post("/orders")
//! #         .header("authorization", "Bearer secret-token")
//! #         .header("idempotency-key", "order-1")
//! #         .body(Body::empty())
//! # };
//! # let first = app.clone().oneshot(request()?).await?;
//! # assert_eq!(first.status(), StatusCode::CREATED);
//! # let second = app.oneshot(request()?).await?;
//! # assert_eq!(second.headers()["idempotent-replayed"], "true");
//! // Sent twice: one order row, committed with the record that replays it.
//! let orders: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders")
//!     .fetch_one(store.pool())
//!     .await?;
//! assert_eq!(orders, 1);
//! # Ok(()) }
//! ```
//!
//! This module owns the handle only; it must not start or commit transactions.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use http::{HeaderMap, StatusCode};
use idem_core::{Claim, ClaimRequest, ClaimToken, Finish, Record};

use crate::pipeline::TooLarge;
use crate::replay::Capture;

/// The claim a handler is executing under, for finishing it in its own transaction.
#[derive(Debug, Clone)]
pub struct TransactionalClaim {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The layer's claim; on a [`ClaimMode::InTransaction`](crate::ClaimMode) route a
    /// provisional token until the handler claims.
    token: ClaimToken,
    /// Set on an in-transaction route: what the handler must claim in its transaction.
    deferred: Option<ClaimRequest>,
    /// The token the handler's own claim returned.
    claimed: OnceLock<ClaimToken>,
    /// The handler's claim did not proceed: the layer answers with this instead.
    answer: Mutex<Option<Claim>>,
    capture: Arc<Capture>,
    finished: Mutex<Option<Record>>,
}

impl TransactionalClaim {
    pub(crate) fn new(token: ClaimToken, capture: Arc<Capture>) -> Self {
        Self::build(token, None, capture)
    }

    /// For an in-transaction route: nothing is claimed yet.
    pub(crate) fn deferred(req: ClaimRequest, capture: Arc<Capture>) -> Self {
        let provisional = ClaimToken::of(&req, 0, 0, 0, idem_core::ClaimKind::Fresh);
        Self::build(provisional, Some(req), capture)
    }

    fn build(token: ClaimToken, deferred: Option<ClaimRequest>, capture: Arc<Capture>) -> Self {
        Self {
            inner: Arc::new(Inner {
                token,
                deferred,
                claimed: OnceLock::new(),
                answer: Mutex::new(None),
                capture,
                finished: Mutex::new(None),
            }),
        }
    }

    /// On a [`ClaimMode::InTransaction`](crate::ClaimMode) route: the claim the handler
    /// must make inside its business transaction (`claim_in_tx`), before its writes.
    /// Then [`claimed`](Self::claimed) with the token if it proceeded, or
    /// [`answered`](Self::answered) with the store's answer and return at once (rolling
    /// back). `None` when the layer already claimed.
    pub fn deferred_request(&self) -> Option<&ClaimRequest> {
        self.inner.deferred.as_ref()
    }

    /// The handler's claim in its transaction proceeded with `token`.
    pub fn claimed(&self, token: ClaimToken) {
        let _ = self.inner.claimed.set(token);
    }

    /// The handler's claim did not proceed (replay, in progress, mismatch): the layer
    /// answers with it, whatever the handler returns.
    pub fn answered(&self, claim: Claim) {
        *self
            .inner
            .answer
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(claim);
    }

    /// The token to pass to the store's `finish_in_tx`.
    pub fn token(&self) -> &ClaimToken {
        self.inner.claimed.get().unwrap_or(&self.inner.token)
    }

    /// How to finish the record for a response the handler is about to return: the same
    /// stored form, header selection and outcome policy the layer itself uses, so a
    /// replay is indistinguishable from one the layer finished.
    pub fn finish_for(&self, status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Finish {
        let capture = &self.inner.capture;
        let fits = body.len() <= capture.max_stored_body;
        crate::pipeline::ending(capture.classify(status), fits, TooLarge::OmitBody, |keep| {
            capture.stored_result(status, headers, keep.then_some(body))
        })
    }

    /// Tells the layer the record was finished and committed by the handler; call it
    /// after the commit succeeded, with the record `finish_in_tx` returned.
    pub fn finished_in_transaction(&self, record: Record) {
        *self
            .inner
            .finished
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(record);
    }

    /// The record the handler finished, if it did.
    pub(crate) fn take_finished(&self) -> Option<Record> {
        self.inner
            .finished
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// The store's answer to the handler's claim, if it did not proceed.
    pub(crate) fn take_answer(&self) -> Option<Claim> {
        self.inner
            .answer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}
