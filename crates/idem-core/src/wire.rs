//! The wire names of the HTTP contract and the parsing of `Idempotency-Key`, shared by
//! the server-side layer and the gateway.
//!
//! Owns the header names, reading the key in both forms clients send, the client's
//! request id, and the HTTP-date text of `Idempotency-Expires`. It must not decide what
//! a missing or invalid key means for a route: that is [`KeyRule`] in the caller's
//! configuration.

use http::header::{HeaderMap, HeaderName};
use serde::{Deserialize, Serialize};

use crate::key::{IdempotencyKey, KeyError};

/// What a route does with `Idempotency-Key`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyRule {
    /// No key: 400. With a key the request is idempotent.
    #[default]
    Required,
    /// With a key the request is idempotent; without one it passes straight through.
    Optional,
    /// Nothing is done on this route, key or not (reads, health checks).
    #[serde(rename = "none", alias = "ignored")]
    Ignored,
}

/// A route pattern: literal segments, `{name}` (exactly one non-empty segment) and a
/// final `*` or `{*name}` (any rest, including nothing). Matched against the concrete
/// path, so a rule written with a router's template applies to every resource under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    segments: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Param,
    Rest,
}

impl PathPattern {
    pub fn parse(pattern: &str) -> Result<Self, String> {
        let bad = |why: &str| Err(format!("path pattern {pattern:?}: {why}"));
        let Some(rest) = pattern.strip_prefix('/') else {
            return bad("must start with /");
        };
        let parts: Vec<&str> = if rest.is_empty() {
            Vec::new()
        } else {
            rest.split('/').collect()
        };
        let mut segments = Vec::with_capacity(parts.len());
        for (i, part) in parts.iter().enumerate() {
            let is_rest =
                *part == "*" || (part.starts_with("{*") && part.ends_with('}') && part.len() > 3);
            if is_rest {
                if i + 1 != parts.len() {
                    return bad("* must be the last segment");
                }
                segments.push(Segment::Rest);
            } else if part.starts_with('{') && part.ends_with('}') && part.len() > 2 {
                segments.push(Segment::Param);
            } else if part.contains(['{', '}', '*']) {
                return bad("segments are literal, {name} or a final *");
            } else {
                segments.push(Segment::Literal((*part).to_string()));
            }
        }
        Ok(Self { segments })
    }

    /// How specific the pattern is, for choosing among several that match one path:
    /// more literal segments first, then more segments, then no final rest.
    pub fn specificity(&self) -> (usize, usize, bool) {
        let literals = self
            .segments
            .iter()
            .filter(|s| matches!(s, Segment::Literal(_)))
            .count();
        let rest = matches!(self.segments.last(), Some(Segment::Rest));
        (literals, self.segments.len(), !rest)
    }

    /// Whether `path` (without the query) matches. A trailing slash is a segment of its
    /// own, as in most routers: `/a/` does not match `/a`.
    pub fn matches(&self, path: &str) -> bool {
        let Some(rest) = path.strip_prefix('/') else {
            return false;
        };
        let mut parts = (!rest.is_empty())
            .then(|| rest.split('/'))
            .into_iter()
            .flatten();
        for seg in &self.segments {
            match seg {
                Segment::Rest => return true,
                Segment::Literal(lit) => match parts.next() {
                    Some(p) if p == lit => {}
                    _ => return false,
                },
                Segment::Param => match parts.next() {
                    Some(p) if !p.is_empty() => {}
                    _ => return false,
                },
            }
        }
        parts.next().is_none()
    }
}

/// Request header carrying the key (IETF draft-ietf-httpapi-idempotency-key-header).
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// `Idempotent-Replayed: true` on every replayed response.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// When the stored result stops being replayed: an RFC 9110 HTTP-date (IMF-fixdate,
/// `Sun, 06 Nov 1994 08:49:37 GMT`), counted from the record's completion plus the
/// configured retention. Sent on every terminal response, first execution and replays.
pub const IDEMPOTENCY_EXPIRES: HeaderName = HeaderName::from_static("idempotency-expires");
/// `Idempotent-Reconstructed: true` on a replay whose stored response was dropped by the
/// retention sweeper and rebuilt from the result reference by the application.
pub const IDEMPOTENT_RECONSTRUCTED: HeaderName =
    HeaderName::from_static("idempotent-reconstructed");
/// On a replayed response whose body was larger than the capture limit: the first
/// response was delivered in full, the replay has the status and headers only.
pub const IDEMPOTENT_BODY_OMITTED: HeaderName = HeaderName::from_static("idempotent-body-omitted");

/// Correlates an answer with the log lines (and the upstream's) of its request.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// W3C trace context (`traceparent`): carried from the caller through the gateway to the
/// service, so one trace shows the whole request.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// A parsed `traceparent` (version `00`): `00-{trace id}-{parent id}-{flags}`, lower-case
/// hex. All-zero ids are invalid, as the W3C recommendation says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub parent_id: [u8; 8],
    pub flags: u8,
}

impl TraceParent {
    pub fn parse(value: &str) -> Option<TraceParent> {
        let mut parts = value.trim().split('-');
        let (version, trace, parent, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        // Version 00 has exactly four fields; ff is forbidden.
        if version != "00" || parts.next().is_some() {
            return None;
        }
        let lower_hex = |s: &str, len: usize| {
            s.len() == len
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        if !lower_hex(trace, 32) || !lower_hex(parent, 16) || !lower_hex(flags, 2) {
            return None;
        }
        let mut t = TraceParent {
            trace_id: [0; 16],
            parent_id: [0; 8],
            flags: 0,
        };
        hex::decode_to_slice(trace, &mut t.trace_id).ok()?;
        hex::decode_to_slice(parent, &mut t.parent_id).ok()?;
        let mut f = [0u8; 1];
        hex::decode_to_slice(flags, &mut f).ok()?;
        t.flags = f[0];
        if t.trace_id == [0; 16] || t.parent_id == [0; 8] {
            return None;
        }
        Some(t)
    }

    /// The same trace, with `span` as the new parent (the next hop's caller).
    pub fn child(&self, span: [u8; 8]) -> TraceParent {
        TraceParent {
            parent_id: span,
            ..*self
        }
    }

    pub fn trace_id_hex(&self) -> String {
        hex::encode(self.trace_id)
    }

    /// The header's text, `00-<32 hex>-<16 hex>-<2 hex>`, written without formatting
    /// machinery (a gateway writes one for every request it forwards).
    pub fn to_bytes(&self) -> [u8; 55] {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = [b'-'; 55];
        out[0] = b'0';
        out[1] = b'0';
        let mut at = 3;
        for (field, end) in [(&self.trace_id[..], 35), (&self.parent_id[..], 52)] {
            for b in field {
                out[at] = HEX[usize::from(b >> 4)];
                out[at + 1] = HEX[usize::from(b & 0xf)];
                at += 2;
            }
            debug_assert_eq!(at, end);
            at += 1;
        }
        out[53] = HEX[usize::from(self.flags >> 4)];
        out[54] = HEX[usize::from(self.flags & 0xf)];
        out
    }
}

impl std::fmt::Display for TraceParent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bytes = self.to_bytes();
        f.write_str(std::str::from_utf8(&bytes).expect("hex digits and dashes"))
    }
}

/// The client's own request id, when it is short and plain enough to log and echo
/// (1 to 64 of `A-Z a-z 0-9 - _ . :`); otherwise the server makes one.
pub fn client_request_id(headers: &http::HeaderMap) -> Option<&str> {
    headers
        .get(&REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| {
            (1..=64).contains(&v.len())
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
        })
}

/// Why a request's `Idempotency-Key` could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyHeaderError {
    #[error("the Idempotency-Key header is missing")]
    Missing,
    #[error("the Idempotency-Key header appears more than once")]
    Repeated,
    #[error("the Idempotency-Key header is not a valid structured-field string: {0}")]
    Malformed(&'static str),
    /// `"k";p=1`: the draft defines no parameters, and ignoring unknown ones would let
    /// two different header values name one key.
    #[error("the Idempotency-Key header has parameters after the string; none are accepted")]
    Parameters,
    #[error(transparent)]
    Invalid(#[from] KeyError),
}

/// Reads the key from a request.
///
/// Accepts the IETF draft's structured-field string (`Idempotency-Key: "k-1"`, with `\"`
/// and `\\` escapes) and the plain token form most clients send in practice
/// (`Idempotency-Key: k-1`). Either way the value must then be a valid
/// [`IdempotencyKey`]: 1 to 255 visible ASCII characters other than `,` and `;`, so a
/// list folded from two header lines (`a,b`) or parameters (`k;p=1`, `"k";p=1`) are
/// refused, as is the header sent more than once.
pub fn read_key(headers: &HeaderMap) -> Result<IdempotencyKey, KeyHeaderError> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let value = values.next().ok_or(KeyHeaderError::Missing)?;
    if values.next().is_some() {
        return Err(KeyHeaderError::Repeated);
    }
    let text = value
        .to_str()
        .map_err(|_| KeyHeaderError::Malformed("the value is not visible ASCII"))?
        .trim_matches([' ', '\t']);
    if text.starts_with('"') {
        Ok(IdempotencyKey::new(parse_sf_string(text)?)?)
    } else {
        Ok(text.parse::<IdempotencyKey>()?)
    }
}

/// RFC 8941 §4.2.5: an sf-string, with nothing after it.
fn parse_sf_string(text: &str) -> Result<String, KeyHeaderError> {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().skip(1);
    loop {
        match chars.next() {
            None => return Err(KeyHeaderError::Malformed("no closing quote")),
            Some('\\') => match chars.next() {
                Some(c @ ('"' | '\\')) => out.push(c),
                _ => return Err(KeyHeaderError::Malformed("bad escape")),
            },
            Some('"') => break,
            Some(c) if (' '..='~').contains(&c) => out.push(c),
            Some(_) => return Err(KeyHeaderError::Malformed("character outside the string")),
        }
    }
    let rest: String = chars.collect();
    if rest.is_empty() {
        Ok(out)
    } else if rest.starts_with(';') {
        Err(KeyHeaderError::Parameters)
    } else {
        Err(KeyHeaderError::Malformed("text after the string"))
    }
}

/// Formats epoch milliseconds as an IMF-fixdate (RFC 9110 §5.6.7).
pub fn http_date(epoch_ms: i64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let secs = epoch_ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let weekday = DAYS[days.rem_euclid(7) as usize];
    let month = MONTHS[(month - 1) as usize];
    if !(0..=9999).contains(&year) {
        return format!(
            "{weekday}, {day:02} {month} {year:04} {:02}:{:02}:{:02} GMT",
            sod / 3600,
            sod % 3600 / 60,
            sod % 60
        );
    }
    // Written digit by digit: every replay carries one, and `format!` costs ten times more.
    let mut out = String::with_capacity(29);
    let digits = |out: &mut String, n: i64, width: u32| {
        for place in (0..width).rev() {
            let digit = (n / 10_i64.pow(place) % 10) as u8;
            out.push(char::from(b'0' + digit));
        }
    };
    out.push_str(weekday);
    out.push_str(", ");
    digits(&mut out, day, 2);
    out.push(' ');
    out.push_str(month);
    out.push(' ');
    digits(&mut out, year, 4);
    out.push(' ');
    digits(&mut out, sod / 3600, 2);
    out.push(':');
    digits(&mut out, sod % 3600 / 60, 2);
    out.push(':');
    digits(&mut out, sod % 60, 2);
    out.push_str(" GMT");
    out
}

/// Howard Hinnant's days-to-civil: proleptic Gregorian date of a day count since 1970.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_traceparent_is_written_as_the_format_says() {
        for seed in 0u8..=255 {
            let t = super::TraceParent {
                trace_id: std::array::from_fn(|i| seed.wrapping_mul(31).wrapping_add(i as u8 * 17)),
                parent_id: std::array::from_fn(|i| seed ^ (i as u8 * 29)),
                flags: seed,
            };
            let expected = format!(
                "00-{}-{}-{:02x}",
                hex::encode(t.trace_id),
                hex::encode(t.parent_id),
                t.flags
            );
            assert_eq!(t.to_string(), expected);
            assert_eq!(&t.to_bytes()[..], expected.as_bytes());
        }
    }

    #[test]
    fn traceparent_round_trips_and_refuses_what_the_recommendation_forbids() {
        let v = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let t = TraceParent::parse(v).unwrap();
        assert_eq!(t.to_string(), v);
        assert_eq!(t.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        let c = t.child([1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(
            c.to_string(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0102030405060708-01"
        );
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        ] {
            assert!(TraceParent::parse(bad).is_none(), "{bad:?}");
        }
    }

    use super::*;
    use http::HeaderValue;

    fn check(values: &[&str], want: Result<&str, ()>) {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(IDEMPOTENCY_KEY, HeaderValue::from_str(v).unwrap());
        }
        let got = read_key(&h);
        match want {
            Ok(k) => assert_eq!(got.as_ref().map(|k| k.as_str()), Ok(k), "{values:?}"),
            Err(()) => assert!(got.is_err(), "{values:?} gave {got:?}"),
        }
    }

    #[test]
    fn key_forms() {
        check(&["pay:order-7318"], Ok("pay:order-7318"));
        check(&["  tok  "], Ok("tok"));
        check(&["\"8e03978e-40d5\""], Ok("8e03978e-40d5"));
        check(&["\"a\\\"b\\\\c\""], Ok("a\"b\\c"));
        check(&["\"k\";v=1"], Err(()));
        check(&["\"k\"; v=1"], Err(()));
        check(&["k;v=1"], Err(()));
        check(&["a,b"], Err(()));
        check(&["a, b"], Err(()));
        check(&["\"a\", \"b\""], Err(()));
        check(&["\"a,b\""], Err(()));
        check(&["\"a;b\""], Err(()));
        check(&["a", "a"], Err(()));
        check(&[], Err(()));
        check(&["a", "b"], Err(()));
        check(&["\"unterminated"], Err(()));
        check(&["\"k\"junk"], Err(()));
        check(&["\"has space\""], Err(()));
        check(&["\"\""], Err(()));
        check(&["\"bad\\escape\""], Err(()));
        check(&[&"k".repeat(256)], Err(()));
        assert_eq!(read_key(&HeaderMap::new()), Err(KeyHeaderError::Missing));
        let typed = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(IDEMPOTENCY_KEY, HeaderValue::from_str(v).unwrap());
            read_key(&h)
        };
        assert_eq!(typed("\"k\";v=1"), Err(KeyHeaderError::Parameters));
        assert!(matches!(
            typed("a,b"),
            Err(KeyHeaderError::Invalid(KeyError::ReservedCharacter {
                character: ',',
                position: 1,
                ..
            }))
        ));
    }

    #[test]
    fn patterns() {
        let p = |s: &str| PathPattern::parse(s).unwrap();
        assert!(p("/v1/orders/{id}").matches("/v1/orders/o1"));
        assert!(!p("/v1/orders/{id}").matches("/v1/orders/"));
        assert!(!p("/v1/orders/{id}").matches("/v1/orders/o1/pay"));
        assert!(p("/v1/orders/{id}/pay").matches("/v1/orders/o1/pay"));
        assert!(p("/files/*").matches("/files"));
        assert!(p("/files/{*rest}").matches("/files/a/b"));
        assert!(!p("/a").matches("/a/"));
        assert!(p("/").matches("/"));
        assert!(PathPattern::parse("no-slash").is_err());
        assert!(PathPattern::parse("/*/x").is_err());
        assert!(PathPattern::parse("/a{b}").is_err());
        assert!(p("/v1/orders/search").specificity() > p("/v1/orders/{id}").specificity());
        assert!(p("/v1/orders/{id}").specificity() > p("/v1/orders/*").specificity());
    }

    #[test]
    fn dates() {
        assert_eq!(http_date(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(http_date(784_111_777_000), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(http_date(951_782_400_000), "Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(
            http_date(4_102_444_799_999),
            "Thu, 31 Dec 2099 23:59:59 GMT"
        );
        // The digit-by-digit writer against the formatter, over the years either side of
        // its fallback.
        let formatted = |ms: i64| {
            let secs = ms.div_euclid(1000);
            let (days, sod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
            let (y, m, d) = civil_from_days(days);
            let wd = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][days.rem_euclid(7) as usize];
            let mon = [
                "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
            ][(m - 1) as usize];
            format!(
                "{wd}, {d:02} {mon} {y:04} {:02}:{:02}:{:02} GMT",
                sod / 3600,
                sod % 3600 / 60,
                sod % 60
            )
        };
        let mut ms = -62_200_000_000_000_i64;
        while ms < 253_500_000_000_000 {
            assert_eq!(http_date(ms), formatted(ms), "{ms}");
            ms += 86_399_999_937;
        }
    }
}
