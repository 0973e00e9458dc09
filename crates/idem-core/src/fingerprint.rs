//! Request fingerprints: SHA-256 over method, concrete path, canonical query, principal,
//! chosen headers and the canonical body.
//!
//! The path and query are the resource a key is bound to: the same key on
//! `/v1/orders/O2/pay` after `/v1/orders/O1/pay` is another request, never a replay.
//! [`canonical_path`] and [`canonical_query`] are the one definition of "the same target"
//! that the HTTP layer and the gateway share.
//!
//! JSON bodies are canonicalised in the manner of RFC 8785 (JCS): members sorted by the
//! UTF-16 code units of their names, no whitespace, strings unescaped and written again
//! the one JCS way (`"\u0041"` is `"A"`). So member order, whitespace and string escapes
//! never change a fingerprint. Unlike JCS, numbers keep their exact text: nothing goes
//! through a 64-bit float, so `9007199254740993` and `9007199254740992` (a 64-bit id one
//! apart) are two requests, and `1e400` or `123456789012345678901234567890.5` hash as
//! sent. Two spellings of one value (`1.0` and `1`, `1e2` and `100`, `-0` and `0`) are
//! two fingerprints too: a retry sends the same bytes, and no rewriting can then merge
//! texts a service reads differently. Configured fields (client timestamps, say) can be
//! left out.
//!
//! An object that names a member twice (`{"q":1,"q":5}`, at any depth, escapes decoded)
//! is refused ([`BodyError::DuplicateMember`]): services differ on which one counts, so
//! no fingerprint could stand for what is executed.
//!
//! Bodies that are not JSON are hashed as bytes: those declared with another media type,
//! and those that do not parse (not UTF-8, not the RFC 8259 grammar, nested deeper than
//! 128), even when declared JSON; the service then answers those itself.

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// A SHA-256 request digest.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    pub fn from_hex(s: &str) -> Result<Self, FingerprintError> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).map_err(|_| FingerprintError::BadHex)?;
        Ok(Self(out))
    }

    /// Digest of arbitrary bytes, for callers that fingerprint something other than a
    /// request (a message id, a CLI drill payload).
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.to_hex())
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl From<Fingerprint> for String {
    fn from(value: Fingerprint) -> String {
        value.to_hex()
    }
}

impl TryFrom<String> for Fingerprint {
    type Error = FingerprintError;
    fn try_from(value: String) -> Result<Self, FingerprintError> {
        Self::from_hex(&value)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FingerprintError {
    #[error("fingerprint is not 64 hex digits")]
    BadHex,
}

/// Why a request body cannot be fingerprinted; the request is refused, not executed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BodyError {
    /// An object in the JSON body names one member twice; `pointer` (RFC 6901, names
    /// decoded) leads to it. It holds the client's text, so it may be long.
    #[error(
        "the JSON body names the member {} more than once in one object; services differ \
         on which one counts, so send each member once",
        short(pointer)
    )]
    DuplicateMember { pointer: String },
}

/// At most 64 characters of `s`, for a message: member names may be long.
fn short(s: &str) -> String {
    match s.char_indices().nth(64) {
        Some((end, _)) => format!("{:?}…", &s[..end]),
        None => format!("{s:?}"),
    }
}

/// The parts of a request that make up its identity.
#[derive(Debug, Clone, Copy)]
pub struct RequestParts<'a> {
    pub method: &'a str,
    /// The concrete request path (`/v1/orders/O1/pay`), never a route template: the
    /// template would let one key cover every resource behind it.
    pub path: &'a str,
    /// The raw query string, without the `?`; `None` when there is none.
    pub query: Option<&'a str>,
    pub principal: &'a str,
    /// Content type; bodies declared JSON (or that parse as JSON when none is given) are
    /// canonicalised.
    pub content_type: Option<&'a str>,
    pub body: &'a [u8],
    /// All request headers; only the configured ones are hashed.
    pub headers: &'a [(&'a str, &'a str)],
}

/// How fingerprints are computed: which headers count and which JSON fields do not.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Fingerprinter {
    /// Header names (case-insensitive) whose values are part of the fingerprint.
    pub headers: Vec<String>,
    /// JSON fields left out, as dotted paths from the root (`client_ts`, `meta.sent_at`).
    pub omit_fields: Vec<String>,
}

impl Fingerprinter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_headers<I: IntoIterator<Item = S>, S: Into<String>>(mut self, names: I) -> Self {
        self.headers = names
            .into_iter()
            .map(|n| n.into().to_ascii_lowercase())
            .collect();
        self
    }

    pub fn omit_fields<I: IntoIterator<Item = S>, S: Into<String>>(mut self, paths: I) -> Self {
        self.omit_fields = paths.into_iter().map(Into::into).collect();
        self
    }

    /// The request's fingerprint, or why its body is refused. Callers answering requests
    /// use this one and refuse the request on an error.
    pub fn try_fingerprint(&self, req: &RequestParts<'_>) -> Result<Fingerprint, BodyError> {
        let canonical = self.canonical_json(req.content_type, req.body)?;
        Ok(self.digest(req, canonical.as_deref()))
    }

    /// The request's fingerprint. A body [`Fingerprinter::try_fingerprint`] refuses is
    /// hashed as bytes here, which never equals another text's digest.
    pub fn fingerprint(&self, req: &RequestParts<'_>) -> Fingerprint {
        let canonical = self
            .canonical_json(req.content_type, req.body)
            .unwrap_or(None);
        self.digest(req, canonical.as_deref())
    }

    fn digest(&self, req: &RequestParts<'_>, canonical: Option<&str>) -> Fingerprint {
        let mut h = Sha256::new();
        // Length-prefixed fields: no two different requests share an encoding.
        let mut field = |tag: &[u8], bytes: &[u8]| {
            h.update(tag);
            h.update((bytes.len() as u64).to_be_bytes());
            h.update(bytes);
        };
        // v2: the concrete path and canonical query replaced the route template, so a
        // v1 digest never equals a v2 one. Exact numbers kept v2: bodies whose numbers
        // JCS already wrote as sent keep their digest, so their retries still replay.
        field(b"v2", b"idem-fingerprint");
        // The common forms are hashed as they are, without a copy: an uppercase method,
        // a path already canonical, no query.
        let method = if req.method.bytes().any(|b| b.is_ascii_lowercase()) {
            std::borrow::Cow::Owned(req.method.to_ascii_uppercase())
        } else {
            std::borrow::Cow::Borrowed(req.method)
        };
        field(b"m", method.as_bytes());
        let already_canonical =
            !req.path.is_empty() && req.path.bytes().all(|b| is_unreserved(b) || is_reserved(b));
        if already_canonical {
            field(b"u", req.path.as_bytes());
        } else {
            field(b"u", canonical_path(req.path).as_bytes());
        }
        match req.query {
            None | Some("") => field(b"q", b""),
            query => field(b"q", canonical_query(query).as_bytes()),
        }
        field(b"p", req.principal.as_bytes());
        let mut chosen: Vec<(String, &str)> = req
            .headers
            .iter()
            .map(|(n, v)| (n.to_ascii_lowercase(), *v))
            .filter(|(n, _)| self.headers.iter().any(|c| c == n))
            .collect();
        chosen.sort();
        for (n, v) in &chosen {
            field(b"hn", n.as_bytes());
            field(b"hv", v.trim().as_bytes());
        }
        match canonical {
            Some(canonical) => field(b"bj", canonical.as_bytes()),
            None => field(b"bb", req.body),
        }
        Fingerprint(h.finalize().into())
    }

    /// The canonical form of a JSON body with omitted fields removed; `Ok(None)` when the
    /// body is hashed as bytes: empty, declared with a media type that is not JSON, or
    /// not JSON at all. A body without a content type that parses as JSON is JSON.
    pub fn canonical_json(
        &self,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Result<Option<String>, BodyError> {
        let declared_json = content_type.map(is_json_media_type);
        if declared_json == Some(false) || body.is_empty() {
            return Ok(None);
        }
        if self.omit_fields.is_empty() {
            return canonical_text(body, &[]);
        }
        let paths: Vec<Vec<&str>> = self
            .omit_fields
            .iter()
            .map(|p| p.split('.').collect())
            .collect();
        let omit: Vec<&[&str]> = paths.iter().map(Vec::as_slice).collect();
        canonical_text(body, &omit)
    }
}

/// The path with its percent-encoding normalised (RFC 3986 §6.2.2): escapes of unreserved
/// characters decoded (`%41` → `A`), other escapes in uppercase hex (`%2f` → `%2F`),
/// characters that may not appear unescaped escaped, and a stray `%` as `%25`.
/// Reserved characters keep their form either way: `/` and `%2F` are different paths.
/// An empty path is `/`.
pub fn canonical_path(path: &str) -> String {
    if path.is_empty() {
        return "/".to_owned();
    }
    let mut out = String::with_capacity(path.len());
    normalise_escapes(path, &mut out);
    out
}

/// The query in canonical form: split on `&`, empty pairs dropped, each `name=value`
/// normalised like [`canonical_path`], then sorted by name. The sort is stable, so
/// repeated names keep their order (`x=1&x=2` is a list an application can read in
/// order). `None` and `""` are both the empty query.
///
/// `+` is kept as a literal `+`, equal to neither `%20` nor `%2B`: form decoding reads it
/// as a space, RFC 3986 as a plus, and keeping it apart from both never gives two
/// requests an application could tell apart the same fingerprint.
pub fn canonical_query(query: Option<&str>) -> String {
    let mut pairs: Vec<(String, usize)> = query
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let mut out = String::with_capacity(pair.len());
            normalise_escapes(pair, &mut out);
            // `=` is reserved, so normalising never moves the first one.
            let name_len = out.find('=').unwrap_or(out.len());
            (out, name_len)
        })
        .collect();
    pairs.sort_by(|(a, an), (b, bn)| a[..*an].cmp(&b[..*bn]));
    let mut out = String::new();
    for (i, (pair, _)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        out.push_str(pair);
    }
    out
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// RFC 3986 gen-delims and sub-delims: their escaped and literal forms may differ in
/// meaning, so neither is turned into the other.
fn is_reserved(b: u8) -> bool {
    matches!(
        b,
        b':' | b'/'
            | b'?'
            | b'#'
            | b'['
            | b']'
            | b'@'
            | b'!'
            | b'$'
            | b'&'
            | b'\''
            | b'('
            | b')'
            | b'*'
            | b'+'
            | b','
            | b';'
            | b'='
    )
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn push_escaped(b: u8, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(HEX[usize::from(b >> 4)] as char);
    out.push(HEX[usize::from(b & 0xf)] as char);
}

fn normalise_escapes(s: &str, out: &mut String) {
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let escaped = bytes
                .get(i + 1)
                .and_then(|h| hex_value(*h))
                .zip(bytes.get(i + 2).and_then(|l| hex_value(*l)));
            if let Some((hi, lo)) = escaped {
                let decoded = hi << 4 | lo;
                if is_unreserved(decoded) {
                    out.push(decoded as char);
                } else {
                    push_escaped(decoded, out);
                }
                i += 3;
                continue;
            }
            // Not an escape: the literal `%` it stands for.
            push_escaped(b'%', out);
        } else if is_unreserved(b) || is_reserved(b) {
            out.push(b as char);
        } else {
            push_escaped(b, out);
        }
        i += 1;
    }
}

fn is_json_media_type(ct: &str) -> bool {
    let essence = ct.split(';').next().unwrap_or("").trim();
    let suffix = essence
        .len()
        .checked_sub(5)
        .and_then(|at| essence.get(at..));
    essence.eq_ignore_ascii_case("application/json")
        || suffix.is_some_and(|s| s.eq_ignore_ascii_case("+json"))
}

/// The canonical JSON text of `json` (see the module docs), or `Ok(None)` when it is not
/// JSON: not UTF-8, not the RFC 8259 grammar, or nested deeper than 128 arrays and objects.
pub fn canonicalize(json: &[u8]) -> Result<Option<String>, BodyError> {
    canonical_text(json, &[])
}

fn canonical_text(json: &[u8], omit: &[&[&str]]) -> Result<Option<String>, BodyError> {
    let Ok(text) = std::str::from_utf8(json) else {
        return Ok(None);
    };
    let mut parser = Parser {
        text,
        bytes: text.as_bytes(),
        pos: 0,
        depth: 0,
        path: Vec::new(),
        duplicate: None,
    };
    let mut out = String::with_capacity(text.len());
    let parsed = parser
        .whitespace()
        .and_then(|()| parser.value(&mut out, omit))
        .and_then(|()| parser.whitespace());
    if parsed.is_err() || parser.pos != parser.bytes.len() {
        return Ok(None);
    }
    // Refused only once the whole text is known to be JSON: invalid text stays bytes.
    match parser.duplicate {
        Some(pointer) => Err(BodyError::DuplicateMember { pointer }),
        None => Ok(Some(out)),
    }
}

/// How deep arrays and objects may nest (serde_json's limit): deeper text is not JSON here.
const MAX_DEPTH: usize = 128;

/// The text is not JSON.
struct Invalid;

/// A step from a container to one of its values, for naming where a duplicate is.
enum Step<'a> {
    /// A member name as written, escapes and all: decoded only for an error.
    Member(&'a str),
    Index(usize),
}

/// A validating RFC 8259 parser that writes the canonical text as it reads.
struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
    depth: usize,
    path: Vec<Step<'a>>,
    /// JSON Pointer of the first member name seen twice.
    duplicate: Option<String>,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn whitespace(&mut self) -> Result<(), Invalid> {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
        Ok(())
    }

    fn expect(&mut self, b: u8) -> Result<(), Invalid> {
        if self.peek() == Some(b) {
            self.pos += 1;
            Ok(())
        } else {
            Err(Invalid)
        }
    }

    /// One value; `omit` holds the rest of each omitted path that reaches it.
    fn value(&mut self, out: &mut String, omit: &[&[&str]]) -> Result<(), Invalid> {
        match self.peek().ok_or(Invalid)? {
            b'{' => self.object(out, omit),
            b'[' => self.array(out),
            b'"' => {
                let (_, s) = self.string()?;
                push_string(&s, out);
                Ok(())
            }
            b't' => self.literal("true", out),
            b'f' => self.literal("false", out),
            b'n' => self.literal("null", out),
            _ => self.number(out),
        }
    }

    fn literal(&mut self, word: &str, out: &mut String) -> Result<(), Invalid> {
        if self.bytes[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            out.push_str(word);
            Ok(())
        } else {
            Err(Invalid)
        }
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`, written as sent: any
    /// rewriting (through a double, or to a shortest form) would let two texts a service
    /// may read differently share a fingerprint.
    fn number(&mut self, out: &mut String) -> Result<(), Invalid> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(Invalid),
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            self.one_or_more_digits()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            self.one_or_more_digits()?;
        }
        out.push_str(&self.text[start..self.pos]);
        Ok(())
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
    }

    fn one_or_more_digits(&mut self) -> Result<(), Invalid> {
        let start = self.pos;
        self.digits();
        if self.pos == start {
            Err(Invalid)
        } else {
            Ok(())
        }
    }

    /// A string: its text as written (between the quotes) and its value.
    fn string(&mut self) -> Result<(&'a str, Cow<'a, str>), Invalid> {
        self.expect(b'"')?;
        let start = self.pos;
        let mut decoded: Option<String> = None;
        loop {
            let b = self.peek().ok_or(Invalid)?;
            match b {
                b'"' => {
                    let raw = &self.text[start..self.pos];
                    self.pos += 1;
                    let value = decoded.map_or(Cow::Borrowed(raw), Cow::Owned);
                    return Ok((raw, value));
                }
                b'\\' => {
                    let s = decoded.get_or_insert_with(|| self.text[start..self.pos].to_owned());
                    self.pos += 1;
                    let c = match self.peek().ok_or(Invalid)? {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            self.pos += 1;
                            let c = self.unicode_escape()?;
                            s.push(c);
                            continue;
                        }
                        _ => return Err(Invalid),
                    };
                    self.pos += 1;
                    s.push(c);
                }
                0x00..=0x1f => return Err(Invalid),
                _ => {
                    // Whole characters: the text is UTF-8, and `"`, `\` and controls are
                    // ASCII, so a run up to the next one ends on a character boundary.
                    let run = self.bytes[self.pos..]
                        .iter()
                        .position(|b| matches!(b, b'"' | b'\\' | 0x00..=0x1f))
                        .map_or(self.bytes.len(), |n| self.pos + n);
                    if let Some(s) = decoded.as_mut() {
                        s.push_str(&self.text[self.pos..run]);
                    }
                    self.pos = run;
                }
            }
        }
    }

    /// The character of `\uXXXX` (the `\u` read), with its low surrogate if it is a high
    /// one. A lone surrogate is no character: such text is not JSON here, as in serde_json.
    fn unicode_escape(&mut self) -> Result<char, Invalid> {
        let hi = self.hex4()?;
        let code = match hi {
            0xd800..=0xdbff => {
                if !self.bytes[self.pos..].starts_with(b"\\u") {
                    return Err(Invalid);
                }
                self.pos += 2;
                let lo = self.hex4()?;
                if !(0xdc00..=0xdfff).contains(&lo) {
                    return Err(Invalid);
                }
                0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00)
            }
            0xdc00..=0xdfff => return Err(Invalid),
            _ => hi,
        };
        char::from_u32(code).ok_or(Invalid)
    }

    fn hex4(&mut self) -> Result<u32, Invalid> {
        let digits = self.bytes.get(self.pos..self.pos + 4).ok_or(Invalid)?;
        let mut v = 0u32;
        for d in digits {
            v = v << 4 | u32::from(hex_value(*d).ok_or(Invalid)?);
        }
        self.pos += 4;
        Ok(v)
    }

    fn enter(&mut self) -> Result<(), Invalid> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            Err(Invalid)
        } else {
            Ok(())
        }
    }

    fn array(&mut self, out: &mut String) -> Result<(), Invalid> {
        self.expect(b'[')?;
        self.enter()?;
        out.push('[');
        self.whitespace()?;
        if self.peek() == Some(b']') {
            self.pos += 1;
        } else {
            for index in 0.. {
                if index > 0 {
                    out.push(',');
                }
                self.path.push(Step::Index(index));
                // Omitted paths name object members only: they stop at an array.
                self.value(out, &[])?;
                self.path.pop();
                self.whitespace()?;
                match self.peek() {
                    Some(b',') => {
                        self.pos += 1;
                        self.whitespace()?;
                    }
                    Some(b']') => {
                        self.pos += 1;
                        break;
                    }
                    _ => return Err(Invalid),
                }
            }
        }
        out.push(']');
        self.depth -= 1;
        Ok(())
    }

    fn object(&mut self, out: &mut String, omit: &[&[&str]]) -> Result<(), Invalid> {
        self.expect(b'{')?;
        self.enter()?;
        // (name as written, name, canonical value; `None` when the member is omitted)
        let mut members: Vec<(&'a str, Cow<'a, str>, Option<String>)> = Vec::new();
        self.whitespace()?;
        if self.peek() == Some(b'}') {
            self.pos += 1;
        } else {
            loop {
                let (raw, name) = self.string()?;
                self.whitespace()?;
                self.expect(b':')?;
                self.whitespace()?;
                let omitted = omit.iter().any(|p| p.len() == 1 && p[0] == name);
                let below: Vec<&[&str]> = omit
                    .iter()
                    .filter(|p| p.len() > 1 && p[0] == name)
                    .map(|p| &p[1..])
                    .collect();
                let mut value = String::new();
                self.path.push(Step::Member(raw));
                // An omitted value is still read: it must be JSON and is checked for
                // duplicates like the rest.
                self.value(&mut value, &below)?;
                self.path.pop();
                members.push((raw, name, (!omitted).then_some(value)));
                self.whitespace()?;
                match self.peek() {
                    Some(b',') => {
                        self.pos += 1;
                        self.whitespace()?;
                    }
                    Some(b'}') => {
                        self.pos += 1;
                        break;
                    }
                    _ => return Err(Invalid),
                }
            }
        }
        // RFC 8785 §3.2.3: members sorted by the UTF-16 code units of their names.
        members.sort_by(|a, b| a.1.encode_utf16().cmp(b.1.encode_utf16()));
        if self.duplicate.is_none() {
            if let Some(pair) = members.windows(2).find(|w| w[0].1 == w[1].1) {
                self.duplicate = Some(self.pointer(pair[1].0));
            }
        }
        out.push('{');
        let mut first = true;
        for (_, name, value) in &members {
            let Some(value) = value else { continue };
            if !first {
                out.push(',');
            }
            first = false;
            push_string(name, out);
            out.push(':');
            out.push_str(value);
        }
        out.push('}');
        self.depth -= 1;
        Ok(())
    }

    /// RFC 6901 JSON Pointer of member `raw` of the current object.
    fn pointer(&self, raw: &str) -> String {
        let mut pointer = String::new();
        let last = Step::Member(raw);
        for step in self.path.iter().chain(std::iter::once(&last)) {
            pointer.push('/');
            match step {
                Step::Index(i) => pointer.push_str(&i.to_string()),
                Step::Member(raw) => {
                    pointer.push_str(&decode(raw).replace('~', "~0").replace('/', "~1"))
                }
            }
        }
        pointer
    }
}

/// The value of a string already read, given as written between its quotes.
fn decode(raw: &str) -> String {
    let quoted = format!("\"{raw}\"");
    let mut parser = Parser {
        text: &quoted,
        bytes: quoted.as_bytes(),
        pos: 0,
        depth: 0,
        path: Vec::new(),
        duplicate: None,
    };
    parser
        .string()
        .map(|(_, s)| s.into_owned())
        .unwrap_or_default()
}

/// A string as RFC 8785 writes it: `\"`, `\\`, `\b \f \n \r \t`, other controls as
/// lowercase `\u00xx`, everything else as itself.
fn push_string(s: &str, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{0}'..='\u{1f}' => {
                let b = c as u8;
                out.push_str("\\u00");
                out.push(HEX[usize::from(b >> 4)] as char);
                out.push(HEX[usize::from(b & 0xf)] as char);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod vectors;
