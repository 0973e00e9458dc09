//! The OpenAPI 3.1 description served at `/openapi.json`: this service's routes, with
//! the idempotency layer's parameter, headers and problems merged in by
//! `idem_http::openapi::merge_into` from the same configuration the layer runs with.
//!
//! Only produces JSON; it must not serve it (that is [`crate::api`]).

use idem_http::IdempotencyConfig;
use serde_json::{json, Value};

fn problem(description: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
    })
}

fn order_response(description: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Order"}}}
    })
}

/// The spec, with the idempotency layer's parts merged in for `config`.
pub fn spec(config: &IdempotencyConfig, legacy: bool) -> Value {
    let order_id =
        json!({"name": "order_id", "in": "path", "required": true, "schema": {"type": "string"}});
    let mut spec = json!({
        "openapi": "3.1.0",
        "info": {
            "title": "idem ticketing orders",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "The reference ticketing service: one business intent takes effect \
                once. Authenticate with `Authorization: Bearer API_KEY`; POSTs need an \
                `Idempotency-Key` fixed by the client before the first send."
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/orders": {
                "post": {
                    "summary": "Create an order (order, hold and order.created in one transaction with the key's record)",
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NewOrder"}}}},
                    "responses": {
                        "201": order_response("Created; a replay carries the same body and Idempotent-Replayed: true"),
                        "400": problem("Malformed JSON"),
                        "404": problem("Unknown route"),
                        "409": problem("Sold out"),
                        "422": problem("Unknown show, quantity out of range, invalid fields, or key reused")
                    }
                },
                "get": {
                    "summary": "List the tenant's orders",
                    "parameters": [
                        {"name": "user_id", "in": "query", "schema": {"type": "string"}},
                        {"name": "show_id", "in": "query", "schema": {"type": "string"}},
                        {"name": "client_session", "in": "query", "schema": {"type": "string"}},
                        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 1000}}
                    ],
                    "responses": {"200": {"description": "Orders, oldest first",
                        "content": {"application/json": {"schema": {"type": "object", "properties": {"orders": {"type": "array", "items": {"$ref": "#/components/schemas/Order"}}}}}}}}
                }
            },
            "/v1/orders/{order_id}": {
                "get": {
                    "summary": "An order with its payments, hold, ticket, messages, active freezes and history",
                    "parameters": [order_id.clone()],
                    "responses": {"200": order_response("The order"), "404": problem("No such order for this tenant")}
                }
            },
            "/v1/orders/{order_id}/pay": {
                "post": {
                    "summary": "Pay (charge under pay:{order_id}, then confirm); concurrent pays make one charge",
                    "parameters": [order_id.clone()],
                    "responses": {
                        "200": order_response("Paid (now or before)"),
                        "202": order_response("Queued: payment-confirm is frozen for this order; it runs on unfreeze"),
                        "404": problem("No such order for this tenant"),
                        "409": problem("The order cannot be paid from its status"),
                        "503": problem("Another request holds the order; retry with the same key")
                    }
                }
            },
            "/v1/orders/{order_id}/cancel": {
                "post": {
                    "summary": "Cancel (refunding under refund:{order_id} when paid); the hold is released by the chain",
                    "parameters": [order_id],
                    "responses": {
                        "200": order_response("Cancelled (now or before)"),
                        "404": problem("No such order for this tenant"),
                        "409": problem("A ticketed order cannot be cancelled")
                    }
                }
            },
            "/v1/idempotency-keys/{key}": {
                "get": {
                    "summary": "The key's state and result reference for this tenant (the gateway's state query)",
                    "parameters": [{"name": "key", "in": "path", "required": true, "schema": {"type": "string"}}],
                    "responses": {"200": {"description": "The record's state"}, "404": problem("No record for this key")}
                }
            },
            "/v1/admin/freezes": {
                "get": {"summary": "Active freezes and their history (admin token)", "responses": {"200": {"description": "Freezes"}}},
                "post": {
                    "summary": "Freeze payment-confirm, ticketing and/or inventory-release for user:U, show:S or all (admin token)",
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/FreezeRequest"}}}},
                    "responses": {"201": {"description": "Frozen"}, "200": {"description": "Already frozen"}}
                }
            },
            "/v1/admin/unfreeze": {
                "post": {
                    "summary": "End freezes; the queued work resumes (admin token)",
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/FreezeRequest"}}}},
                    "responses": {"200": {"description": "Unfrozen"}}
                }
            },
            "/v1/admin/shows/{tenant}/{show_id}": {
                "put": {
                    "summary": "Create a show for a tenant if missing (admin token)",
                    "parameters": [
                        {"name": "tenant", "in": "path", "required": true, "schema": {"type": "string"}},
                        {"name": "show_id", "in": "path", "required": true, "schema": {"type": "string"}}
                    ],
                    "responses": {"201": {"description": "Created"}, "200": {"description": "Existed"}}
                }
            },
            "/metrics": {"get": {"summary": "Prometheus metrics (the admin token; or without credentials on --metrics-listen)", "responses": {"200": {"description": "OpenMetrics text"}, "401": {"description": "Admin token required"}, "403": {"description": "The admin API is disabled"}}}},
            "/healthz": {"get": {"summary": "Liveness and database reachability", "security": [], "responses": {"200": {"description": "ok"}, "503": {"description": "The database does not answer"}}}},
            "/livez": {"get": {"summary": "Liveness: the process serves HTTP", "security": [], "responses": {"200": {"description": "alive"}}}},
            "/readyz": {"get": {"summary": "Readiness: database reachable, schemas current, not shutting down", "security": [], "responses": {"200": {"description": "ready"}, "503": {"description": "not ready, with the reason"}}}},
            "/openapi.json": {"get": {"summary": "This document", "security": [], "responses": {"200": {"description": "OpenAPI 3.1"}}}}
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "NewOrder": {
                    "type": "object",
                    "required": ["user_id", "show_id", "quantity"],
                    "properties": {
                        "user_id": {"type": "string"},
                        "show_id": {"type": "string"},
                        "quantity": {"type": "integer", "minimum": 1},
                        "client_session": {"type": ["string", "null"]}
                    }
                },
                "Order": {
                    "type": "object",
                    "required": ["order_id", "status", "user_id", "show_id", "quantity"],
                    "properties": {
                        "order_id": {"type": "string"},
                        "status": {"type": "string", "enum": ["pending_payment", "paid", "ticketed", "cancelled", "refund_pending", "refunded"]},
                        "user_id": {"type": "string"},
                        "show_id": {"type": "string"},
                        "quantity": {"type": "integer"},
                        "amount_cents": {"type": "integer"},
                        "client_session": {"type": ["string", "null"]},
                        "idempotency_key": {"type": ["string", "null"]},
                        "hold": {"type": ["object", "null"]},
                        "payments": {"type": "array"},
                        "ticket": {"type": "object"},
                        "messages": {"type": "array"},
                        "frozen": {"type": "array"},
                        "transitions": {"type": "array"}
                    }
                },
                "FreezeRequest": {
                    "type": "object",
                    "required": ["scope", "what"],
                    "properties": {
                        "scope": {"type": "string", "examples": ["user:U-7318", "show:S-204", "all"]},
                        "what": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string", "enum": ["payment-confirm", "ticketing", "inventory-release"]}}]},
                        "tenant": {"type": ["string", "null"]},
                        "reason": {"type": ["string", "null"]},
                        "actor": {"type": ["string", "null"]}
                    }
                }
            }
        }
    });
    if legacy {
        spec["paths"]["/v1/legacy/orders"] = json!({
            "post": {
                "summary": "The pre-idem behaviour (demo only): no key, a new order per arrival",
                "responses": {"201": order_response("Created")}
            }
        });
    }
    idem_http::openapi::merge_into(&mut spec, config);
    spec
}
