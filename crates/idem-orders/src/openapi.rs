//! The OpenAPI 3.1 description served at `/openapi.json`, generated from the handlers'
//! `#[utoipa::path]` attributes and the request and response types (`ToSchema`), with the
//! idempotency layer's parameter, headers and problems merged in by
//! `idem_http::openapi::merge_into` from the same configuration the layer runs with —
//! on the routes the layer serves only.
//!
//! Only produces JSON; it must not serve it (that is [`crate::api`]).

use idem_http::IdempotencyConfig;
use serde_json::{json, Value};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

pub use crate::api::doc::{AdminRefusals, BodyRefusals, Problem, TenantRefusals};

struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        for (name, what) in [
            ("bearer", "A tenant's API key"),
            ("admin", "The admin token"),
        ] {
            components.add_security_scheme(
                name,
                SecurityScheme::Http(
                    HttpBuilder::new()
                        .scheme(HttpAuthScheme::Bearer)
                        .description(Some(what))
                        .build(),
                ),
            );
        }
    }
}

/// The tenant API: the routes behind the idempotency layer.
#[derive(OpenApi)]
#[openapi(
    paths(
        crate::api::orders::create_order,
        crate::api::orders::list_orders,
        crate::api::orders::get_order,
        crate::api::orders::pay_order,
        crate::api::orders::cancel_order,
        crate::api::keys::key_state,
    ),
    components(schemas(Problem, crate::views::OrderView, crate::views::OrderList, crate::service::NewOrder)),
    modifiers(&Security)
)]
struct TenantApi;

/// The demo's legacy route (behind the layer too, with no key rule).
#[derive(OpenApi)]
#[openapi(paths(crate::api::orders::legacy_create_order))]
struct LegacyApi;

/// The admin API and the public endpoints: not behind the layer.
#[derive(OpenApi)]
#[openapi(
    paths(
        crate::api::admin::list_freezes,
        crate::api::admin::post_freeze,
        crate::api::admin::post_unfreeze,
        crate::api::admin::put_show,
        crate::api::metrics::metrics,
        crate::api::public::healthz,
        crate::api::public::livez,
        crate::api::public::readyz,
        crate::api::public::openapi,
    ),
    components(schemas(
        crate::api::admin::FreezeBody,
        crate::api::admin::WhatList,
        crate::api::admin::ShowBody
    ))
)]
struct OtherApi;

fn to_json(api: utoipa::openapi::OpenApi) -> Value {
    serde_json::to_value(api).unwrap_or_else(|_| json!({}))
}

/// The spec, with the idempotency layer's parts merged in for `config`.
pub fn spec(config: &IdempotencyConfig, legacy: bool) -> Value {
    let mut spec = to_json(TenantApi::openapi());
    if legacy {
        idem_http::openapi::merge_documents(&mut spec, &to_json(LegacyApi::openapi()));
    }
    // Only the layer's routes get its parameter and problems.
    idem_http::openapi::merge_into(&mut spec, config);
    idem_http::openapi::merge_documents(&mut spec, &to_json(OtherApi::openapi()));
    spec["openapi"] = json!("3.1.0");
    spec["info"] = json!({
        "title": "idem ticketing orders",
        "version": env!("CARGO_PKG_VERSION"),
        "description": "The reference ticketing service: one business intent takes effect \
            once. Authenticate with `Authorization: Bearer API_KEY`; POSTs need an \
            `Idempotency-Key` fixed by the client before the first send."
    });
    spec
}
