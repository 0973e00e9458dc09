//! The published test vectors (docs/fingerprint-vectors.json) for clients in other
//! languages that compute the fingerprint themselves (docs/SQL-API.md). The file is
//! generated from this implementation and checked against it both ways, so it cannot
//! drift: set `IDEM_WRITE_FINGERPRINT_VECTORS=1` to rewrite it after a deliberate change.

use super::*;
use serde_json::{json, Value};

struct Case {
    name: &'static str,
    method: &'static str,
    path: &'static str,
    query: Option<&'static str>,
    principal: &'static str,
    content_type: Option<&'static str>,
    body: &'static [u8],
    headers: &'static [(&'static str, &'static str)],
    fingerprint_headers: &'static [&'static str],
    omit_fields: &'static [&'static str],
}

const BASE: Case = Case {
    name: "",
    method: "POST",
    path: "/v1/orders",
    query: None,
    principal: "user-7318",
    content_type: Some("application/json"),
    body: br#"{"sku":"S-204","quantity":2}"#,
    headers: &[],
    fingerprint_headers: &[],
    omit_fields: &[],
};

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "json body",
            ..BASE
        },
        Case {
            name: "same json, other member order and whitespace",
            body: b"{ \"quantity\" : 2,\n  \"sku\" : \"S-204\" }",
            ..BASE
        },
        Case {
            name: "nested json, escapes written the one JCS way, exact numbers",
            body: br#"{"b":[1.0,1e2,-0,9007199254740993],"a":{"\u0041":"x\/y","t":"\u00e9\n"}}"#,
            ..BASE
        },
        Case {
            name: "member names sorted by UTF-16 code units",
            body: "{\"\u{e9}\":1,\"z\":2,\"\u{1f600}\":3,\"\u{ff61}\":4}".as_bytes(),
            ..BASE
        },
        Case {
            name: "lower-case method",
            method: "post",
            ..BASE
        },
        Case {
            name: "other principal",
            principal: "user-1",
            ..BASE
        },
        Case {
            name: "concrete path with escapes",
            path: "/v1/orders/%4f1/pay/caf%c3%a9 x",
            ..BASE
        },
        Case {
            name: "empty path",
            path: "",
            ..BASE
        },
        Case {
            name: "query sorted by name, repeats kept in order",
            query: Some("x=2&a=%41&&x=1&q=a+b&r=100%"),
            ..BASE
        },
        Case {
            name: "empty query equals none",
            query: Some(""),
            ..BASE
        },
        Case {
            name: "chosen headers, case-insensitive names, trimmed values",
            headers: &[
                ("X-Currency", " EUR "),
                ("User-Agent", "curl"),
                ("x-region", "eu"),
            ],
            fingerprint_headers: &["x-currency", "X-Region"],
            ..BASE
        },
        Case {
            name: "omitted fields",
            body: br#"{"sku":"S-204","client_ts":123,"meta":{"sent_at":5,"x":1}}"#,
            omit_fields: &["client_ts", "meta.sent_at"],
            ..BASE
        },
        Case {
            name: "json without a content type",
            content_type: None,
            ..BASE
        },
        Case {
            name: "media type with +json and parameters",
            content_type: Some("application/merge-patch+json; charset=utf-8"),
            ..BASE
        },
        Case {
            name: "other media type: bytes",
            content_type: Some("text/plain"),
            ..BASE
        },
        Case {
            name: "invalid json declared json: bytes",
            body: br#"{"sku":"S-204""#,
            ..BASE
        },
        Case {
            name: "not utf-8: bytes",
            body: b"\xff\xfe{}",
            ..BASE
        },
        Case {
            name: "empty body",
            body: b"",
            ..BASE
        },
        Case {
            name: "duplicate member: refused",
            body: br#"{"q":1,"\u0071":5}"#,
            ..BASE
        },
    ]
}

fn vector(c: &Case) -> Value {
    let fp = Fingerprinter::new()
        .with_headers(c.fingerprint_headers.iter().copied())
        .omit_fields(c.omit_fields.iter().copied());
    let parts = RequestParts {
        method: c.method,
        path: c.path,
        query: c.query,
        principal: c.principal,
        content_type: c.content_type,
        body: c.body,
        headers: c.headers,
    };
    let body = match std::str::from_utf8(c.body) {
        Ok(text) => json!({ "body": text }),
        Err(_) => json!({ "body_hex": hex::encode(c.body) }),
    };
    let mut input = json!({
        "method": c.method,
        "path": c.path,
        "query": c.query,
        "principal": c.principal,
        "content_type": c.content_type,
        "headers": c.headers,
        "fingerprint_headers": c.fingerprint_headers,
        "omit_fields": c.omit_fields,
    });
    input
        .as_object_mut()
        .unwrap()
        .extend(body.as_object().unwrap().clone());
    let (canonical_body, answer) = match fp.try_fingerprint(&parts) {
        Ok(digest) => (
            fp.canonical_json(c.content_type, c.body).unwrap(),
            json!({ "digest": digest.to_hex() }),
        ),
        Err(e @ BodyError::DuplicateMember { .. }) => (None, json!({ "refused": e.to_string() })),
    };
    let mut out = json!({
        "name": c.name,
        "input": input,
        "canonical": {
            "method": c.method.to_ascii_uppercase(),
            "path": canonical_path(c.path),
            "query": canonical_query(c.query),
            "json_body": canonical_body,
        },
    });
    out.as_object_mut()
        .unwrap()
        .extend(answer.as_object().unwrap().clone());
    out
}

fn generated() -> String {
    let doc = json!({
        "about": "Request fingerprints of idem (crates/idem-core/src/fingerprint.rs), \
                  generated by its tests; docs/SQL-API.md describes the digest. \
                  A vector with `refused` has no fingerprint: the request is refused.",
        "of_bytes": [
            { "input": "", "digest": Fingerprint::of_bytes(b"").to_hex() },
            { "input": "abc", "digest": Fingerprint::of_bytes(b"abc").to_hex() },
        ],
        "vectors": cases().iter().map(vector).collect::<Vec<_>>(),
    });
    serde_json::to_string_pretty(&doc).unwrap() + "\n"
}

fn path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/fingerprint-vectors.json")
}

#[test]
fn the_published_vectors_match_this_implementation() {
    let now = generated();
    if std::env::var_os("IDEM_WRITE_FINGERPRINT_VECTORS").is_some() {
        std::fs::write(path(), &now).expect("write the vectors");
    }
    let file = std::fs::read_to_string(path())
        .expect("docs/fingerprint-vectors.json (IDEM_WRITE_FINGERPRINT_VECTORS=1 writes it)");
    // Every published digest, recomputed from the published input alone.
    let doc: Value = serde_json::from_str(&file).expect("vectors are JSON");
    let vectors = doc["vectors"].as_array().expect("vectors");
    assert_eq!(vectors.len(), cases().len());
    for v in vectors {
        let input = &v["input"];
        let strs = |k: &str| -> Vec<String> {
            input[k]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap().to_owned())
                .collect()
        };
        let body = match input.get("body_hex") {
            Some(h) => hex::decode(h.as_str().unwrap()).unwrap(),
            None => input["body"].as_str().unwrap().as_bytes().to_vec(),
        };
        let headers: Vec<(String, String)> = input["headers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p[0].as_str().unwrap().into(), p[1].as_str().unwrap().into()))
            .collect();
        let header_refs: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        let fp = Fingerprinter::new()
            .with_headers(strs("fingerprint_headers"))
            .omit_fields(strs("omit_fields"));
        let parts = RequestParts {
            method: input["method"].as_str().unwrap(),
            path: input["path"].as_str().unwrap(),
            query: input["query"].as_str(),
            principal: input["principal"].as_str().unwrap(),
            content_type: input["content_type"].as_str(),
            body: &body,
            headers: &header_refs,
        };
        match (fp.try_fingerprint(&parts), v.get("digest")) {
            (Ok(digest), Some(want)) => {
                assert_eq!(digest.to_hex(), want.as_str().unwrap(), "{}", v["name"])
            }
            (Err(_), None) => assert!(v.get("refused").is_some(), "{}", v["name"]),
            (answer, want) => panic!("{}: {answer:?} against {want:?}", v["name"]),
        }
    }
    assert!(
        file == now,
        "docs/fingerprint-vectors.json differs from what this implementation generates; \
         after a deliberate change rerun with IDEM_WRITE_FINGERPRINT_VECTORS=1"
    );
}
