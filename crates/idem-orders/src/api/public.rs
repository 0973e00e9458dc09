//! The public endpoints, answered without credentials: `/healthz`, `/livez`, `/readyz`
//! and `/openapi.json`.
//!
//! Probes only read; they must not change state or need a tenant.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::state::AppState;

#[utoipa::path(
    get,
    path = "/healthz",
    tag = crate::api::doc::TAG,
    summary = "Liveness and database reachability",
    responses(
        (status = 200, description = "ok", body = Object),
        (status = 503, description = "The database does not answer", body = Object)
    ),
    security(())
)]
pub(super) async fn healthz(State(state): State<AppState>) -> Response {
    let ok = match state.db().acquire().await {
        Ok(mut conn) => conn
            .conn()
            .one(crate::db::sql("SELECT 1 AS one"))
            .await
            .is_ok(),
        Err(_) => false,
    };
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        axum::Json(json!({ "status": if ok { "ok" } else { "unavailable" }, "database": state.db().backend() })),
    )
        .into_response()
}

/// `/livez`: the process serves HTTP. Nothing else is checked, so a slow database never
/// gets a live process restarted.
#[utoipa::path(
    get,
    path = "/livez",
    tag = crate::api::doc::TAG,
    summary = "Liveness: the process serves HTTP",
    responses(
        (status = 200, description = "alive", body = Object)
    ),
    security(())
)]
pub(super) async fn livez() -> Response {
    axum::Json(json!({ "status": "alive" })).into_response()
}

/// `/readyz`: 200 only when the database answers, its schemas are the ones this build
/// needs, and no shutdown has begun; otherwise 503 with the check that failed.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = crate::api::doc::TAG,
    summary = "Readiness: database reachable, schemas current, not shutting down",
    responses(
        (status = 200, description = "ready", body = Object),
        (status = 503, description = "not ready, with the reason", body = Object)
    ),
    security(())
)]
pub(super) async fn readyz(State(state): State<AppState>) -> Response {
    let draining = state.draining.load(std::sync::atomic::Ordering::Relaxed);
    let schema = state.db().schema_status().await;
    let (status, body) = readiness(draining, &schema, state.db().backend());
    (status, axum::Json(body)).into_response()
}

fn readiness(
    draining: bool,
    schema: &Result<crate::db::SchemaStatus, crate::error::Error>,
    backend: &str,
) -> (StatusCode, serde_json::Value) {
    let (database, schema_ok, schema_json) = match schema {
        Ok(s) => ("reachable", s.current(), json!(s)),
        Err(_) => ("unreachable", false, serde_json::Value::Null),
    };
    let ready = !draining && database == "reachable" && schema_ok;
    let reason = if draining {
        Some("shutting down")
    } else if database != "reachable" {
        Some("database unreachable")
    } else if !schema_ok {
        Some("schema older than this build needs: run idem migrate")
    } else {
        None
    };
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        json!({
            "status": if ready { "ready" } else { "not_ready" },
            "reason": reason,
            "draining": draining,
            "database": database,
            "backend": backend,
            "schema": schema_json,
        }),
    )
}

#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = crate::api::doc::TAG,
    summary = "This document",
    responses(
        (status = 200, description = "OpenAPI 3.1", body = Object)
    ),
    security(())
)]
pub(super) async fn openapi(State(state): State<AppState>) -> Response {
    axum::Json((*state.openapi).clone()).into_response()
}

#[cfg(test)]
mod readiness_tests {
    use super::*;
    use crate::db::SchemaStatus;

    fn current() -> SchemaStatus {
        SchemaStatus {
            store: 9,
            store_needed: 9,
            ledgers: 1,
            ledgers_needed: 1,
        }
    }

    #[test]
    fn ready_only_when_reachable_current_and_not_draining() {
        let (s, body) = readiness(false, &Ok(current()), "sqlite");
        assert_eq!(
            (s, body["status"].as_str()),
            (StatusCode::OK, Some("ready"))
        );
        let (s, body) = readiness(true, &Ok(current()), "sqlite");
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body["reason"], "shutting down");
        let old = SchemaStatus {
            ledgers: 0,
            ..current()
        };
        let (s, body) = readiness(false, &Ok(old), "sqlite");
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body["reason"].as_str().unwrap().contains("idem migrate"));
        let newer = SchemaStatus {
            store: 10,
            ..current()
        };
        assert_eq!(readiness(false, &Ok(newer), "sqlite").0, StatusCode::OK);
        let down = Err(crate::error::Error::Unavailable("down".into()));
        let (s, body) = readiness(false, &down, "postgres");
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body["database"], "unreachable");
    }
}
