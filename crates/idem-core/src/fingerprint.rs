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
        field(b"m", req.method.to_ascii_uppercase().as_bytes());
        field(b"u", canonical_path(req.path).as_bytes());
        field(b"q", canonical_query(req.query).as_bytes());
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
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json" || essence.ends_with("+json")
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
mod tests {
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
}

/// The published test vectors (docs/fingerprint-vectors.json) for clients in other
/// languages that compute the fingerprint themselves (docs/SQL-API.md). The file is
/// generated from this implementation and checked against it both ways, so it cannot
/// drift: set `IDEM_WRITE_FINGERPRINT_VECTORS=1` to rewrite it after a deliberate change.
#[cfg(test)]
mod vectors {
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
                body:
                    br#"{"b":[1.0,1e2,-0,9007199254740993],"a":{"\u0041":"x\/y","t":"\u00e9\n"}}"#,
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
            Err(e @ BodyError::DuplicateMember { .. }) => {
                (None, json!({ "refused": e.to_string() }))
            }
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
}
