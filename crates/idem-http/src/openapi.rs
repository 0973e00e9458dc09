//! An OpenAPI 3.1 description of what the layer adds to an API: the `Idempotency-Key`
//! parameter, the replay and expiry headers, and the problem responses.
//!
//! [`components`] is a fragment to merge by hand; [`merge_into`] merges it into an
//! application's spec and decorates every operation the configuration makes idempotent.
//! This module only produces JSON; it must not serve it (the application owns its
//! routes) and it never overwrites what the application already described.

use http::Method;
use serde_json::{json, Map, Value};

use crate::config::{IdempotencyConfig, KeyRule};
use crate::problem::{ProblemKind, PROBLEM_JSON};

/// Names under `#/components/responses` and the statuses they describe.
const RESPONSES: [(&str, u16, &[ProblemKind]); 8] = [
    (
        "IdempotencyBadRequest",
        400,
        &[
            ProblemKind::MissingKey,
            ProblemKind::InvalidKey,
            ProblemKind::UnreadableBody,
            ProblemKind::DuplicateJsonMember,
        ],
    ),
    (
        "IdempotencyUnauthenticated",
        401,
        &[ProblemKind::Unauthenticated],
    ),
    (
        "IdempotencyInProgress",
        409,
        &[ProblemKind::RequestInProgress],
    ),
    (
        "IdempotencyRequestTooLarge",
        413,
        &[ProblemKind::RequestTooLarge],
    ),
    ("IdempotencyKeyReused", 422, &[ProblemKind::KeyReused]),
    ("IdempotencyKeyExpired", 410, &[ProblemKind::KeyExpired]),
    (
        "IdempotencyStoreUnavailable",
        503,
        &[ProblemKind::StoreUnavailable],
    ),
    (
        "IdempotencyExecutionTimeout",
        504,
        &[ProblemKind::ExecutionTimeout],
    ),
];

/// The layer's components: `{"components": {"parameters", "headers", "schemas",
/// "responses"}}`.
pub fn components() -> Value {
    let mut responses = Map::new();
    for (name, _, kinds) in RESPONSES {
        let types: Vec<String> = kinds.iter().map(|k| k.type_uri()).collect();
        let title = kinds[0].title();
        let mut headers = Map::new();
        if kinds.iter().any(|k| {
            matches!(
                k,
                ProblemKind::RequestInProgress | ProblemKind::StoreUnavailable
            )
        }) {
            headers.insert(
                "Retry-After".into(),
                json!({"$ref": "#/components/headers/RetryAfter"}),
            );
        }
        responses.insert(
            name.into(),
            json!({
                "description": format!("{title} (problem types: {})", types.join(", ")),
                "headers": headers,
                "content": {
                    PROBLEM_JSON: {
                        "schema": {
                            "allOf": [
                                {"$ref": "#/components/schemas/Problem"},
                                {"properties": {"type": {"enum": types}}}
                            ]
                        }
                    }
                }
            }),
        );
    }
    json!({
        "components": {
            "parameters": {
                "IdempotencyKey": {
                    "name": "Idempotency-Key",
                    "in": "header",
                    "description": "Identity of the intent, fixed by the client before the \
                        first send and reused on every retry. 1 to 255 visible ASCII \
                        characters; plain or as a structured-field string (\"...\").",
                    "required": true,
                    "schema": {"type": "string", "minLength": 1, "maxLength": 257}
                }
            },
            "headers": {
                "IdempotentReplayed": {
                    "description": "`true` when the response is the stored result of an \
                        earlier request with the same key.",
                    "schema": {"type": "string", "enum": ["true"]}
                },
                "IdempotencyExpires": {
                    "description": "When the key's stored result stops being replayed \
                        (RFC 9110 HTTP-date: completion time plus retention).",
                    "schema": {"type": "string"},
                    "example": "Sun, 06 Nov 1994 08:49:37 GMT"
                },
                "IdempotentBodyOmitted": {
                    "description": "`true` on a replay whose original body was too large \
                        to store: status and headers only.",
                    "schema": {"type": "string", "enum": ["true"]}
                },
                "RetryAfter": {
                    "description": "Seconds to wait before retrying with the same key.",
                    "schema": {"type": "integer", "minimum": 1}
                }
            },
            "schemas": {
                "Problem": {
                    "type": "object",
                    "description": "RFC 9457 problem details.",
                    "required": ["type", "title", "status"],
                    "properties": {
                        "type": {"type": "string", "format": "uri"},
                        "title": {"type": "string"},
                        "status": {"type": "integer"},
                        "detail": {"type": "string"}
                    }
                }
            },
            "responses": responses
        }
    })
}

/// Adds `from`'s paths and components to `into` (both OpenAPI 3.x documents), entry by
/// entry: what `into` already defines under the same path or name is left as it is.
pub fn merge_documents(into: &mut Value, from: &Value) {
    let Some(root) = into.as_object_mut() else {
        return;
    };
    if let Some(paths) = from.get("paths").and_then(Value::as_object) {
        if let Some(target) = root
            .entry("paths")
            .or_insert_with(|| json!({}))
            .as_object_mut()
        {
            for (path, item) in paths {
                target.entry(path.clone()).or_insert_with(|| item.clone());
            }
        }
    }
    let Some(ours) = from.get("components").and_then(Value::as_object) else {
        return;
    };
    if let Some(theirs) = root
        .entry("components")
        .or_insert_with(|| json!({}))
        .as_object_mut()
    {
        for (section, entries) in ours {
            let target = theirs.entry(section.clone()).or_insert_with(|| json!({}));
            if let (Some(target), Some(entries)) = (target.as_object_mut(), entries.as_object()) {
                for (name, value) in entries {
                    target.entry(name.clone()).or_insert_with(|| value.clone());
                }
            }
        }
    }
}

/// Merges [`components`] into `spec` (an OpenAPI 3.x document) and, for every operation
/// the configuration makes idempotent, adds the `Idempotency-Key` parameter, the problem
/// responses and the replay headers on its success responses. Anything the application
/// already defined under the same name or status is left as it is.
pub fn merge_into(spec: &mut Value, config: &IdempotencyConfig) {
    merge_documents(spec, &components());
    let Some(root) = spec.as_object_mut() else {
        return;
    };
    let Some(paths) = root.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for (route, item) in paths.iter_mut() {
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        for (method_name, operation) in item.iter_mut() {
            let Ok(method) = method_name.to_ascii_uppercase().parse::<Method>() else {
                continue;
            };
            let required = match config.resolve(&method, route).key {
                KeyRule::Ignored => continue,
                KeyRule::Required => true,
                KeyRule::Optional => false,
            };
            if let Some(operation) = operation.as_object_mut() {
                decorate(operation, required);
            }
        }
    }
}

fn decorate(operation: &mut Map<String, Value>, required: bool) {
    let parameter = if required {
        json!({"$ref": "#/components/parameters/IdempotencyKey"})
    } else {
        let mut p = components()["components"]["parameters"]["IdempotencyKey"].clone();
        p["required"] = json!(false);
        p
    };
    if let Some(params) = operation
        .entry("parameters")
        .or_insert_with(|| json!([]))
        .as_array_mut()
    {
        let present = params.iter().any(|p| {
            p.get("$ref").and_then(Value::as_str) == Some("#/components/parameters/IdempotencyKey")
                || p.get("name").and_then(Value::as_str) == Some("Idempotency-Key")
        });
        if !present {
            params.push(parameter);
        }
    }
    let Some(responses) = operation
        .entry("responses")
        .or_insert_with(|| json!({}))
        .as_object_mut()
    else {
        return;
    };
    for (code, response) in responses.iter_mut() {
        if !code.starts_with('2') {
            continue;
        }
        if let Some(response) = response.as_object_mut() {
            if let Some(headers) = response
                .entry("headers")
                .or_insert_with(|| json!({}))
                .as_object_mut()
            {
                for (name, component) in [
                    ("Idempotent-Replayed", "IdempotentReplayed"),
                    ("Idempotency-Expires", "IdempotencyExpires"),
                ] {
                    headers.entry(name).or_insert_with(
                        || json!({"$ref": format!("#/components/headers/{component}")}),
                    );
                }
            }
        }
    }
    for (name, status, _) in RESPONSES {
        responses
            .entry(status.to_string())
            .or_insert_with(|| json!({"$ref": format!("#/components/responses/{name}")}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RouteRule;

    #[test]
    fn decorates_idempotent_operations_only() {
        let mut spec = json!({
            "openapi": "3.1.0",
            "info": {"title": "orders", "version": "1"},
            "paths": {
                "/v1/orders": {
                    "post": {"responses": {"201": {"description": "created"},
                                           "422": {"description": "ours"}}},
                    "get": {"responses": {"200": {"description": "list"}}}
                },
                "/v1/search": {"post": {"responses": {"200": {"description": "found"}}}}
            },
            "components": {"schemas": {"Problem": {"description": "the app's own"}}}
        });
        let config =
            IdempotencyConfig::default().route(RouteRule::new("/v1/search").key(KeyRule::Optional));
        merge_into(&mut spec, &config);
        let post = &spec["paths"]["/v1/orders"]["post"];
        assert_eq!(
            post["parameters"][0]["$ref"],
            "#/components/parameters/IdempotencyKey"
        );
        assert_eq!(
            post["responses"]["409"]["$ref"],
            "#/components/responses/IdempotencyInProgress"
        );
        assert_eq!(post["responses"]["422"]["description"], "ours", "kept");
        assert_eq!(
            post["responses"]["201"]["headers"]["Idempotent-Replayed"]["$ref"],
            "#/components/headers/IdempotentReplayed"
        );
        let get = &spec["paths"]["/v1/orders"]["get"];
        assert!(get.get("parameters").is_none(), "GET is not decorated");
        let search = &spec["paths"]["/v1/search"]["post"];
        assert_eq!(search["parameters"][0]["required"], false);
        assert_eq!(
            spec["components"]["schemas"]["Problem"]["description"],
            "the app's own"
        );
        assert!(spec["components"]["responses"]["IdempotencyKeyReused"].is_object());
        // Merging twice changes nothing.
        let once = spec.clone();
        merge_into(&mut spec, &config);
        assert_eq!(spec, once);
    }

    #[test]
    fn every_problem_status_is_described() {
        let c = components();
        for kind in ProblemKind::LAYER {
            let described = RESPONSES.iter().any(|(_, status, kinds)| {
                *status == kind.status().as_u16() && kinds.contains(&kind)
            });
            let server_side = kind.status().as_u16() == 500;
            assert!(described || server_side, "{kind:?}");
        }
        assert_eq!(
            c["components"]["parameters"]["IdempotencyKey"]["in"],
            "header"
        );
    }
}
