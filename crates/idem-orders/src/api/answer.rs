//! Answering a request that wrote business rows: the [`Answer`] (status, JSON body,
//! `Location`) and [`commit`], the one place a business transaction meets its
//! idempotency record — the claim is finished in that transaction, which commits once.
//!
//! Must not decide the answer's content (the handlers do) or business rules.

use axum::http::header::{HeaderValue, CONTENT_TYPE, LOCATION};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use idem_core::StoreError;
use idem_http::TransactionalClaim;
use serde::Serialize;

use super::error::ApiError;
use super::state::AppState;
use crate::error::Error;
use crate::service::Unit;

/// A successful answer to a request: its status, body and `Location`.
pub(super) struct Answer {
    pub(super) status: StatusCode,
    pub(super) body: Vec<u8>,
    location: Option<String>,
}

impl Answer {
    pub(super) fn json(
        status: StatusCode,
        value: &impl Serialize,
        location: Option<String>,
    ) -> Result<Self, ApiError> {
        let body = serde_json::to_vec(value)
            .map_err(|e| ApiError::internal(&Error::Backend(e.to_string())))?;
        Ok(Self {
            status,
            body,
            location,
        })
    }

    pub(super) fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(loc) = self
            .location
            .as_deref()
            .and_then(|l| HeaderValue::from_str(l).ok())
        {
            headers.insert(LOCATION, loc);
        }
        headers
    }

    pub(super) fn into_response(self) -> Response {
        let headers = self.headers();
        (self.status, headers, self.body).into_response()
    }
}

/// Finishes the claim (if the request runs under one) in the business transaction,
/// commits once, then releases the unit's lease and wakes the relay.
pub(super) async fn commit<T>(
    state: &AppState,
    unit: Unit<T>,
    claim: Option<&TransactionalClaim>,
    answer: &Answer,
) -> Result<(), ApiError> {
    let Unit { mut tx, lease, .. } = unit;
    let result = async {
        let record = match claim {
            Some(claim) => {
                let finish = claim.finish_for(answer.status, &answer.headers(), &answer.body);
                match state
                    .db()
                    .finish_in_tx(&mut tx, claim.token(), finish)
                    .await
                {
                    Ok(record) => Some(record),
                    Err(e @ StoreError::Superseded { .. }) => {
                        // The claim moved on (its lease ran out and another request took
                        // it over): this transaction must not commit.
                        tracing::warn!(error = %e, "claim superseded before the commit");
                        return Err(ApiError::new(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "claim-superseded",
                            "This request lost its claim on the key; retry with the same key",
                            "another request took the key over before this one committed; \
                             nothing was written",
                        ));
                    }
                    Err(e) => return Err(ApiError::internal(&e.into())),
                }
            }
            None => None,
        };
        tx.commit().await?;
        if let (Some(claim), Some(record)) = (claim, record) {
            claim.finished_in_transaction(record);
        }
        Ok(())
    }
    .await;
    if let Some(guard) = lease {
        state.orders.release(guard).await;
    }
    if result.is_ok() {
        state.orders.signal_outbox();
    }
    result
}
