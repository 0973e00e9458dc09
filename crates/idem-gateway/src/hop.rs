//! Hop-by-hop headers (RFC 9110 §7.6.1): what a proxy must not forward.
//!
//! Removes `Connection`, every header `Connection` names, and the fields that are
//! hop-by-hop by definition (`Keep-Alive`, `Proxy-Connection`, `TE`, `Transfer-Encoding`,
//! `Upgrade`, `Trailer`, `Proxy-Authenticate`, `Proxy-Authorization`). Message framing
//! is re-done by the outgoing connection. Owns nothing else.

use http::header::{HeaderMap, HeaderName, CONNECTION};

/// The fields `Connection` names (hop-by-hop for this message only); names that are not
/// header names are skipped.
pub fn connection_names(headers: &HeaderMap) -> impl Iterator<Item = HeaderName> + '_ {
    headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
}

/// Strips hop-by-hop fields from `headers` in place.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    strip_hop_by_hop_and(headers, |_| false);
}

/// Strips hop-by-hop fields and every field `also` picks from `headers` in place.
pub fn strip_hop_by_hop_and(headers: &mut HeaderMap, also: impl Fn(&HeaderName) -> bool) {
    // One pass over the few fields present finds what to remove: most messages carry
    // none, and hashing each name that might be there to remove it costs more.
    let mut gone: Vec<HeaderName> = headers
        .keys()
        .filter(|n| is_hop_by_hop(n) || also(n))
        .cloned()
        .collect();
    if gone.contains(&CONNECTION) {
        gone.extend(connection_names(headers));
    }
    for name in gone {
        headers.remove(name);
    }
}

/// Whether a header name is hop-by-hop by definition (used when storing responses).
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    // Compared as text: building the nine names to compare with costs more than this.
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "te"
            | "transfer-encoding"
            | "upgrade"
            | "trailer"
            | "proxy-authenticate"
            | "proxy-authorization"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{PROXY_AUTHORIZATION, TE, TRANSFER_ENCODING, UPGRADE};
    use http::HeaderValue;

    #[test]
    fn a_message_without_hop_by_hop_fields_is_left_as_it_is() {
        let mut h = HeaderMap::new();
        h.insert("x-kept", HeaderValue::from_static("1"));
        h.insert("content-length", HeaderValue::from_static("3"));
        let before = h.clone();
        strip_hop_by_hop(&mut h);
        assert_eq!(h, before);
        // One hop-by-hop field among them is still found and removed.
        h.insert(TE, HeaderValue::from_static("trailers"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h, before);
    }

    #[test]
    fn removes_listed_and_defined_fields() {
        let mut h = HeaderMap::new();
        h.insert(
            CONNECTION,
            HeaderValue::from_static("keep-alive, X-Secret ,close"),
        );
        h.insert("x-secret", HeaderValue::from_static("s"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(TE, HeaderValue::from_static("trailers"));
        h.insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        h.insert(UPGRADE, HeaderValue::from_static("websocket"));
        h.insert("proxy-connection", HeaderValue::from_static("keep-alive"));
        h.insert(PROXY_AUTHORIZATION, HeaderValue::from_static("Basic x"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        h.insert("content-length", HeaderValue::from_static("3"));
        strip_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, vec!["content-length", "x-kept"]);
    }

    #[test]
    fn every_defined_field_and_only_those_is_hop_by_hop() {
        for name in [
            "connection",
            "keep-alive",
            "proxy-connection",
            "te",
            "transfer-encoding",
            "upgrade",
            "trailer",
            "proxy-authenticate",
            "proxy-authorization",
        ] {
            assert!(is_hop_by_hop(&HeaderName::from_static(name)), "{name}");
        }
        for name in [
            "content-length",
            "authorization",
            "x-connection",
            "tee",
            "trailers",
        ] {
            assert!(!is_hop_by_hop(&HeaderName::from_static(name)), "{name}");
        }
    }
}
