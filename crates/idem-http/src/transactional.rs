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

use std::sync::{Arc, Mutex, PoisonError};

use http::{HeaderMap, StatusCode};
use idem_core::{ClaimToken, Finish, Record, RecordState};

use crate::replay::Capture;

/// The claim a handler is executing under, for finishing it in its own transaction.
#[derive(Debug, Clone)]
pub struct TransactionalClaim {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    token: ClaimToken,
    capture: Arc<Capture>,
    finished: Mutex<Option<Record>>,
}

impl TransactionalClaim {
    pub(crate) fn new(token: ClaimToken, capture: Arc<Capture>) -> Self {
        Self {
            inner: Arc::new(Inner {
                token,
                capture,
                finished: Mutex::new(None),
            }),
        }
    }

    /// The token to pass to the store's `finish_in_tx`.
    pub fn token(&self) -> &ClaimToken {
        &self.inner.token
    }

    /// How to finish the record for a response the handler is about to return: the same
    /// stored form, header selection and outcome policy the layer itself uses, so a
    /// replay is indistinguishable from one the layer finished.
    pub fn finish_for(&self, status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Finish {
        let capture = &self.inner.capture;
        let state = capture.classify(status);
        let stored_body = (body.len() <= capture.max_stored_body).then_some(body);
        let result = (state != RecordState::FailedRetryable)
            .then(|| capture.stored_result(status, headers, stored_body));
        Finish { state, result }
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
}
