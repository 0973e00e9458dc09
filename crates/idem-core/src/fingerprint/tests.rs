//! The canonical forms and the digest, case by case.

use super::*;

fn canon(json: &str) -> String {
    canonicalize(json.as_bytes())
        .unwrap()
        .unwrap_or_else(|| panic!("not JSON: {json}"))
}

#[test]
fn jcs_examples() {
    let cases = [
        (
            r#"{"b":1, "a":[true,null,"x"]}"#,
            r#"{"a":[true,null,"x"],"b":1}"#,
        ),
        ("0.000001", "0.000001"),
        ("123456789012345680000", "123456789012345680000"),
        ("100", "100"),
        (r#""\u20ac\n\u0001""#, "\"€\\n\\u0001\""),
        // UTF-16 ordering: U+10000 (surrogates D800..) sorts before U+FB33.
        (
            r#"{"\ufb33":1,"\ud800\udc00":2}"#,
            "{\"\u{10000}\":2,\"\u{fb33}\":1}",
        ),
        (" [ 1 , {} , [ ] , \"\" ] ", r#"[1,{},[],""]"#),
    ];
    for (input, want) in cases {
        assert_eq!(canon(input), want, "{input}");
    }
}

#[test]
fn numbers_keep_their_exact_text() {
    // JCS would write these through a double (1e+21, 1e-7, 0, 4.5, 0.002, 1.5e+300);
    // here each is its own value.
    for n in [
        "1e21",
        "1E-7",
        "-0.0",
        "-0",
        "4.50",
        "2e-3",
        "1.5e300",
        "1.0",
        "1",
        "1e400",
        "-1e-400",
        "123456789012345678901234567890.5",
        "9007199254740993",
        "9007199254740992",
        "18446744073709551617",
        "-9223372036854775809",
    ] {
        assert_eq!(canon(n), n);
        assert_eq!(
            canon(&format!("{{ \"n\" : {n} }}")),
            format!(r#"{{"n":{n}}}"#)
        );
    }
    let fp = Fingerprinter::new();
    let at = |body: &'static str| fp.try_fingerprint(&parts(body.as_bytes(), "u")).unwrap();
    // One past 2^53: a double cannot tell these apart.
    assert_ne!(
        at(r#"{"amount":9007199254740993}"#),
        at(r#"{"amount":9007199254740992}"#)
    );
    assert_ne!(at(r#"{"x":1.0}"#), at(r#"{"x":1}"#));
    assert_ne!(at(r#"{"x":1e2}"#), at(r#"{"x":100}"#));
    assert_eq!(
        at(r#"{"b":[1e400],"a":123456789012345678901234567890.5}"#),
        at("{ \"a\": 123456789012345678901234567890.5, \"b\": [ 1e400 ] }")
    );
}

#[test]
fn strings_are_unescaped_and_escaped_one_way() {
    assert_eq!(canon(r#""\u0041""#), r#""A""#);
    assert_eq!(canon(r#""\/\"\\\b\f\n\r\t""#), r#""/\"\\\b\f\n\r\t""#);
    assert_eq!(
        canon(r#""\u001F\u007f\u00e9\u2028""#),
        "\"\\u001f\u{7f}é\u{2028}\""
    );
    assert_eq!(canon(r#""\uD83D\uDE00""#), "\"😀\"");
    assert_eq!(canon(r#"{"\u0071":"\u00e9"}"#), r#"{"q":"é"}"#);
    let fp = Fingerprinter::new();
    let at = |body: &'static str| fp.try_fingerprint(&parts(body.as_bytes(), "u")).unwrap();
    assert_eq!(at(r#"{"k":"\u0041"}"#), at(r#"{"k":"A"}"#));
    assert_ne!(at(r#"{"k":"a"}"#), at(r#"{"k":"A"}"#));
}

#[test]
fn text_that_is_not_json_is_not_canonicalised() {
    for bad in [
        "",
        " ",
        "{",
        "[1,]",
        r#"{"a":1,}"#,
        r#"{"a" 1}"#,
        "01",
        "1.",
        ".5",
        "+1",
        "1e",
        "-",
        "NaN",
        "tru",
        "nul",
        "[1] 2",
        "\u{feff}{}",
        "\"\t\"",
        r#""\x41""#,
        r#""\u12""#,
        r#""\ud800""#,
        r#""\ud800\u0041""#,
        r#""\udc00""#,
        "// {}",
    ] {
        assert_eq!(canonicalize(bad.as_bytes()), Ok(None), "{bad:?}");
    }
    assert_eq!(canonicalize(b"\"\xff\""), Ok(None), "not UTF-8");
    let deep = |n| format!("{}{}", "[".repeat(n), "]".repeat(n));
    assert!(canonicalize(deep(128).as_bytes()).unwrap().is_some());
    assert_eq!(canonicalize(deep(129).as_bytes()), Ok(None));
    assert_eq!(canonicalize(deep(100_000).as_bytes()), Ok(None));
}

#[test]
fn duplicate_member_names_are_refused_at_any_depth() {
    let dup = |json: &str| match canonicalize(json.as_bytes()) {
        Err(BodyError::DuplicateMember { pointer }) => pointer,
        other => panic!("{json}: {other:?}"),
    };
    assert_eq!(dup(r#"{"q":1,"q":5}"#), "/q");
    assert_eq!(dup(r#"{"q":1,"q":1}"#), "/q");
    assert_eq!(dup(r#"{"q":1,"\u0071":5}"#), "/q", "escapes are decoded");
    assert_eq!(dup(r#"{"a":{"b":[0,{"c":1,"c":2}]}}"#), "/a/b/1/c");
    assert_eq!(dup(r#"[{"x/y~":1,"x/y~":2}]"#), "/0/x~1y~0");
    // Distinct names that sort next to each other are not duplicates.
    assert_eq!(canon(r#"{"q":1,"Q":2,"q ":3}"#), r#"{"Q":2,"q":1,"q ":3}"#);
    // Invalid text stays invalid, duplicate or not: it is hashed as bytes.
    assert_eq!(canonicalize(br#"{"q":1,"q":5"#), Ok(None));
    assert_eq!(canonicalize(br#"{"q":1,"q":5}}"#), Ok(None));

    let fp = Fingerprinter::new().omit_fields(["client_ts"]);
    let refused = fp.try_fingerprint(&parts(br#"{"q":1,"q":5}"#, "u"));
    assert!(
        matches!(&refused, Err(BodyError::DuplicateMember { pointer }) if pointer == "/q"),
        "{refused:?}"
    );
    let message = refused.unwrap_err().to_string();
    assert!(message.contains("\"/q\""), "{message}");
    // An omitted member is read like the rest.
    assert!(fp
        .try_fingerprint(&parts(br#"{"q":1,"client_ts":1,"client_ts":2}"#, "u"))
        .is_err());
    // Without a content type a body that parses as JSON is JSON, and refused too.
    let mut undeclared = parts(br#"{"q":1,"q":5}"#, "u");
    undeclared.content_type = None;
    assert!(fp.try_fingerprint(&undeclared).is_err());
    // Another media type: bytes, whatever they hold.
    let mut text = parts(br#"{"q":1,"q":5}"#, "u");
    text.content_type = Some("text/plain");
    assert!(fp.try_fingerprint(&text).is_ok());
    // The infallible form hashes the refused body as bytes: apart from `{"q":5}`.
    assert_ne!(
        fp.fingerprint(&parts(br#"{"q":1,"q":5}"#, "u")),
        fp.fingerprint(&parts(br#"{"q":5}"#, "u"))
    );
}

#[test]
fn a_long_member_name_is_cut_short_in_the_message() {
    let body = format!(r#"{{"{0}":1,"{0}":2}}"#, "n".repeat(10_000));
    let e = canonicalize(body.as_bytes()).unwrap_err();
    assert!(e.to_string().len() < 300, "{e}");
}

#[test]
fn invalid_json_declared_as_json_is_hashed_as_bytes() {
    let fp = Fingerprinter::new();
    let a = fp.try_fingerprint(&parts(b"{\"a\":1", "u")).unwrap();
    let b = fp.try_fingerprint(&parts(b"{\"a\": 1", "u")).unwrap();
    assert_ne!(a, b, "bytes, not a canonical form");
    assert_eq!(
        fp.canonical_json(Some("application/json"), b"{\"a\":1"),
        Ok(None)
    );
    assert_eq!(
        fp.canonical_json(Some("application/merge-patch+json"), b"{\"b\":1,\"a\":2}"),
        Ok(Some(r#"{"a":2,"b":1}"#.to_owned()))
    );
}

fn parts<'a>(body: &'a [u8], principal: &'a str) -> RequestParts<'a> {
    RequestParts {
        method: "POST",
        path: "/v1/orders",
        query: None,
        principal,
        content_type: Some("application/json"),
        body,
        headers: &[],
    }
}

#[test]
fn key_order_and_whitespace_do_not_matter() {
    let fp = Fingerprinter::new();
    let a = fp.fingerprint(&parts(br#"{"user_id":"U-7318","show_id":"S-204"}"#, "u"));
    let b = fp.fingerprint(&parts(
        b"{ \"show_id\" : \"S-204\",\n \"user_id\":\"U-7318\" }",
        "u",
    ));
    assert_eq!(a, b);
    let c = fp.fingerprint(&parts(br#"{"user_id":"U-7318","show_id":"S-205"}"#, "u"));
    assert_ne!(a, c);
}

#[test]
fn principal_method_target_headers_count() {
    let fp = Fingerprinter::new().with_headers(["X-Currency"]);
    let body = br#"{"q":1}"#;
    let base = fp.fingerprint(&parts(body, "alice"));
    assert_ne!(base, fp.fingerprint(&parts(body, "bob")));
    let mut other = parts(body, "alice");
    other.method = "PUT";
    assert_ne!(base, fp.fingerprint(&other));
    let mut other = parts(body, "alice");
    other.path = "/v1/refunds";
    assert_ne!(base, fp.fingerprint(&other));
    let mut other = parts(body, "alice");
    other.query = Some("dry_run=1");
    assert_ne!(base, fp.fingerprint(&other));
    let h = [("x-currency", "EUR"), ("user-agent", "a")];
    let h2 = [("X-Currency", "EUR"), ("user-agent", "b")];
    let h3 = [("x-currency", "USD")];
    let mut with = parts(body, "alice");
    with.headers = &h;
    let mut with2 = parts(body, "alice");
    with2.headers = &h2;
    let mut with3 = parts(body, "alice");
    with3.headers = &h3;
    assert_eq!(fp.fingerprint(&with), fp.fingerprint(&with2));
    assert_ne!(fp.fingerprint(&with), fp.fingerprint(&with3));
    assert_ne!(fp.fingerprint(&with), base);
}

#[test]
fn omitted_fields_are_ignored() {
    let fp = Fingerprinter::new().omit_fields(["client_ts", "meta.sent_at"]);
    let a = fp.fingerprint(&parts(
        br#"{"q":1,"client_ts":1,"meta":{"sent_at":5,"x":1}}"#,
        "u",
    ));
    let b = fp.fingerprint(&parts(
        br#"{"q":1,"client_ts":2,"meta":{"sent_at":9,"x":1}}"#,
        "u",
    ));
    let c = fp.fingerprint(&parts(
        br#"{"q":1,"client_ts":2,"meta":{"sent_at":9,"x":2}}"#,
        "u",
    ));
    assert_eq!(a, b);
    assert_ne!(a, c);
    // Paths name object members from the root, never array elements or other depths.
    let canonical = |body: &str| {
        fp.canonical_json(Some("application/json"), body.as_bytes())
            .unwrap()
            .unwrap()
    };
    assert_eq!(
        canonical(
            r#"{"meta":{"sent_at":1e400,"x":[{"sent_at":1}]},"client_ts":"t","x":{"client_ts":2}}"#
        ),
        r#"{"meta":{"x":[{"sent_at":1}]},"x":{"client_ts":2}}"#
    );
    assert_eq!(canonical(r#"[{"client_ts":1}]"#), r#"[{"client_ts":1}]"#);
    assert_eq!(canonical(r#"{"meta":5}"#), r#"{"meta":5}"#);
    assert_eq!(canonical(r#"{"client_ts":1}"#), "{}");
}

#[test]
fn non_json_bodies_are_bytes() {
    let fp = Fingerprinter::new();
    let mut a = parts(b"a=1&b=2", "u");
    a.content_type = Some("application/x-www-form-urlencoded");
    let mut b = parts(b"b=2&a=1", "u");
    b.content_type = Some("application/x-www-form-urlencoded");
    assert_ne!(fp.fingerprint(&a), fp.fingerprint(&b));
    // A JSON-looking body declared as text is not canonicalised.
    let mut t1 = parts(br#"{"a":1,"b":2}"#, "u");
    t1.content_type = Some("text/plain");
    let mut t2 = parts(br#"{"b":2,"a":1}"#, "u");
    t2.content_type = Some("text/plain");
    assert_ne!(fp.fingerprint(&t1), fp.fingerprint(&t2));
}

#[test]
fn canonical_paths() {
    fn check(input: &str, expected: &str) {
        assert_eq!(canonical_path(input), expected, "{input:?}");
    }
    check("/v1/orders/O1/pay", "/v1/orders/O1/pay");
    check("", "/");
    check("/", "/");
    // Escaped unreserved characters are the characters.
    check("/v1/orders/%4F1/pay", "/v1/orders/O1/pay");
    check("/%7euser/%2d%2E%5f", "/~user/-._");
    // Other escapes stay escaped, in uppercase hex.
    check("/a%2fb", "/a%2Fb");
    check("/a%2Fb", "/a%2Fb");
    check("/caf%c3%a9", "/caf%C3%A9");
    // Reserved characters are not decoded or encoded: `/` and `%2F` differ.
    check("/a/b", "/a/b");
    check("/a;v=1/b:c@d", "/a;v=1/b:c@d");
    check("/a%3Bv", "/a%3Bv");
    // Characters that may not appear unescaped are escaped.
    check("/a b", "/a%20b");
    check("/café", "/caf%C3%A9");
    check("/a\"b", "/a%22b");
    // A `%` that starts no escape is a literal `%`.
    check("/100%", "/100%25");
    check("/%zz", "/%25zz");
    check("/%4", "/%254");
    check("/%25", "/%25");
}

#[test]
fn canonical_queries() {
    fn check(input: Option<&str>, expected: &str) {
        assert_eq!(canonical_query(input), expected, "{input:?}");
    }
    check(None, "");
    check(Some(""), "");
    check(Some("a=1"), "a=1");
    // Sorted by name; empty pairs dropped.
    check(Some("b=2&a=1"), "a=1&b=2");
    check(Some("&&b=2&&a=1&"), "a=1&b=2");
    check(Some("z&a=&m=3"), "a=&m=3&z");
    // Repeated names keep their order: the application may read a list.
    check(Some("x=2&a=0&x=1"), "a=0&x=2&x=1");
    // Names and values are normalised like paths.
    check(Some("%61=%31"), "a=1");
    check(Some("q=a%2fb"), "q=a%2Fb");
    check(Some("q=caf%c3%a9"), "q=caf%C3%A9");
    check(Some("q=100%"), "q=100%25");
    check(Some("q=a b"), "q=a%20b");
    // Escaped `&` and `=` are data, not separators.
    check(Some("q=a%26b%3dc"), "q=a%26b%3Dc");
    check(Some("q=a=b"), "q=a=b");
    // `+` stays a literal `+`, apart from `%20` and `%2B`.
    check(Some("q=a+b"), "q=a+b");
    check(Some("q=a%20b"), "q=a%20b");
    check(Some("q=a%2bb"), "q=a%2Bb");
    // Sorting uses the normalised name.
    check(Some("b=1&%61=2"), "a=2&b=1");
}

#[test]
fn the_target_is_bound_to_the_fingerprint() {
    let fp = Fingerprinter::new();
    let target = |path, query| {
        fp.fingerprint(&RequestParts {
            path,
            query,
            ..parts(b"{}", "u")
        })
    };
    let o1 = target("/v1/orders/O1/pay", None);
    assert_ne!(o1, target("/v1/orders/O2/pay", None));
    assert_eq!(o1, target("/v1/orders/%4F1/pay", None));
    assert_eq!(o1, target("/v1/orders/O1/pay", Some("")));
    let ab = target("/v1/search", Some("a=1&b=2"));
    assert_eq!(ab, target("/v1/search", Some("b=2&a=1")));
    assert_ne!(ab, target("/v1/search", Some("a=2")));
    assert_ne!(ab, target("/v1/search", None));
    // Length-prefixed fields: moving text between path and query changes the digest.
    assert_ne!(target("/v1/a", Some("b=1")), target("/v1/a%3Fb=1", None));
}

#[test]
fn bodies_whose_numbers_jcs_wrote_as_sent_keep_their_digest() {
    // Pinned from the JCS-number form: such a key recorded before exact numbers
    // still replays after them.
    let fp = Fingerprinter::new();
    let body = br#"{"user_id":"U-7318","show_id":"S-204","quantity":2,"price":19.99}"#;
    assert_eq!(
        fp.try_fingerprint(&parts(body, "u")).unwrap().to_hex(),
        "025536a7148bcfd6997531c68e0c160693a7992b4f4f774d6b68be1056310399"
    );
}

#[test]
fn hex_round_trip() {
    let f = Fingerprint::of_bytes(b"x");
    assert_eq!(Fingerprint::from_hex(&f.to_hex()).unwrap(), f);
    assert!(Fingerprint::from_hex("zz").is_err());
}
