//! The keyed exchange's HTTP/1.1 client: one buffered request written and one buffered
//! response read on a kept-alive connection, in the calling task.
//!
//! A keyed request is buffered before it is forwarded and its answer is buffered before
//! anyone hears it, so it needs no connection task, request channel or body stream: the
//! head and body go out in one write from the readied headers (no copy of the map), and
//! the response is parsed where it lands (its header values and body share the read
//! buffer).
//!
//! Owns request framing, response framing (RFC 9112 §6.3: no body for HEAD, 1xx, 204 and
//! 304; chunked; Content-Length; else until close) and whether a connection can be used
//! again. It must not stream and must not retry: any failure after the first byte was
//! written is the caller's uncertain result.

use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_LENGTH};
use http::{Method, StatusCode};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use crate::hop::{connection_names, is_hop_by_hop, strip_hop_by_hop};
use crate::upstream::Captured;

/// The most a response head (status line, headers) may take.
const MAX_HEAD: usize = 64 * 1024;
/// The most header fields a response may carry.
const MAX_HEADERS: usize = 128;
/// Bodies up to this size are copied behind the head and written once.
const ONE_WRITE: usize = 16 * 1024;
/// What one read asks the socket for.
const READ_CHUNK: usize = 8 * 1024;

/// A connection to the upstream, plain or TLS.
pub(crate) enum Stream {
    Tcp(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// What a request carries besides its headers.
pub(crate) struct Head<'a> {
    pub method: &'a Method,
    /// The upstream's path prefix (`""` or `/api`), put before `path_and_query`.
    pub prefix: &'a str,
    pub path_and_query: &'a str,
    pub host: &'a HeaderValue,
}

/// Why an exchange has no complete response.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Failed {
    /// The response is larger than the limit; the upstream did answer.
    TooLarge,
    /// The connection broke or the response could not be read: the request may have
    /// taken effect.
    Broken(String),
}

/// A kept-alive connection, what it has read past the last response, and buffers kept
/// for the next exchange.
pub(crate) struct Conn {
    stream: Stream,
    buf: BytesMut,
    /// The request being written.
    out: Vec<u8>,
    /// Where each response field sits in its head.
    places: Vec<(HeaderName, usize, usize)>,
}

/// How a response body is delimited.
enum Framing {
    None,
    Length(usize),
    Chunked,
    UntilClose,
}

impl Conn {
    pub fn new(stream: Stream) -> Self {
        Self {
            stream,
            buf: BytesMut::new(),
            out: Vec::new(),
            places: Vec::new(),
        }
    }

    /// Whether an idle connection can carry a request: the peer has neither closed it
    /// nor sent anything unasked. Checked without waiting.
    pub fn is_idle_open(&mut self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        let mut cx = Context::from_waker(Waker::noop());
        let mut byte = [0u8; 1];
        let mut read = ReadBuf::new(&mut byte);
        // Pending: nothing to read, still open. TLS records with no data (a session
        // ticket) are taken in and also leave it pending.
        matches!(
            Pin::new(&mut self.stream).poll_read(&mut cx, &mut read),
            Poll::Pending
        )
    }

    /// Sends the request and reads its response, bodies up to `max_body` bytes. Returns
    /// the response (hop-by-hop fields removed) and whether the connection can be used
    /// again.
    pub async fn exchange(
        &mut self,
        head: &Head<'_>,
        headers: &HeaderMap,
        set: &[(HeaderName, HeaderValue)],
        body: &Bytes,
        max_body: usize,
    ) -> Result<(Captured, bool), Failed> {
        let head_request = *head.method == Method::HEAD;
        if let Err(failed) = self.write_request(head, headers, set, body).await {
            // An upstream may answer (413, 401) and close before it read the whole body:
            // an answer already here is its word; without one the result is uncertain.
            return match self.read_response(head_request, max_body).await {
                Ok((captured, _)) => Ok((captured, false)),
                Err(_) => Err(failed),
            };
        }
        self.read_response(head_request, max_body).await
    }

    async fn write_request(
        &mut self,
        head: &Head<'_>,
        headers: &HeaderMap,
        set: &[(HeaderName, HeaderValue)],
        body: &Bytes,
    ) -> Result<(), Failed> {
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        out.reserve(256 + headers.len() * 48 + body.len().min(ONE_WRITE));
        encode_head(&mut out, head, headers, set, body.len());
        let one = body.len() <= ONE_WRITE;
        if one {
            out.extend_from_slice(body);
        }
        let broken = |e: std::io::Error| Failed::Broken(format!("writing the request: {e}"));
        let written = self.stream.write_all(&out).await;
        // Kept for the next request unless a large body grew it.
        if out.capacity() <= 4 * ONE_WRITE {
            self.out = out;
        }
        written.map_err(broken)?;
        if !one {
            self.stream.write_all(body).await.map_err(broken)?;
        }
        // TLS holds records back until flushed.
        self.stream.flush().await.map_err(broken)
    }

    /// Reads more into the buffer; `Ok(false)` at the end of the stream.
    async fn fill(&mut self) -> Result<bool, Failed> {
        if self.buf.capacity() - self.buf.len() < READ_CHUNK / 2 {
            self.buf.reserve(READ_CHUNK);
        }
        match self.stream.read_buf(&mut self.buf).await {
            Ok(0) => Ok(false),
            Ok(_) => Ok(true),
            Err(e) => Err(Failed::Broken(format!("reading the response: {e}"))),
        }
    }

    /// Reads until at least `n` bytes are buffered.
    async fn fill_to(&mut self, n: usize) -> Result<(), Failed> {
        if self.buf.capacity() < n {
            self.buf.reserve(n - self.buf.len());
        }
        while self.buf.len() < n {
            if !self.fill().await? {
                return Err(broken("the connection closed inside the response body"));
            }
        }
        Ok(())
    }

    async fn read_response(
        &mut self,
        head_request: bool,
        max_body: usize,
    ) -> Result<(Captured, bool), Failed> {
        let (status, mut headers, http11) = loop {
            match parse_head(&mut self.buf, &mut self.places)? {
                Some((status, _, _)) if status.is_informational() => {
                    if status == StatusCode::SWITCHING_PROTOCOLS {
                        return Err(broken("the upstream switched protocols"));
                    }
                }
                Some(parsed) => break parsed,
                None => {
                    if self.buf.len() > MAX_HEAD {
                        return Err(broken("the response head is too large"));
                    }
                    if !self.fill().await? {
                        return Err(broken(if self.buf.is_empty() {
                            "the connection closed before a response"
                        } else {
                            "the connection closed inside the response head"
                        }));
                    }
                }
            }
        };
        // `Connection: close` ends the connection after this response.
        let mut reusable = http11 && !connection_names(&headers).any(|n| n == "close");
        let coded = headers.contains_key(http::header::TRANSFER_ENCODING);
        let framing = framing(head_request, status, http11, coded, &headers)?;
        // A length beside a transfer coding is not the body's (RFC 9112 §6.3): it is
        // dropped, and a connection framed two ways is not used again.
        if coded && headers.remove(CONTENT_LENGTH).is_some() {
            reusable = false;
        }
        let body = match framing {
            Framing::None => Bytes::new(),
            Framing::Length(n) if n > max_body => return Err(Failed::TooLarge),
            Framing::Length(n) => {
                self.fill_to(n).await?;
                self.buf.split_to(n).freeze()
            }
            Framing::Chunked => self.read_chunked(max_body).await?,
            Framing::UntilClose => {
                reusable = false;
                while self.fill().await? {
                    if self.buf.len() > max_body {
                        return Err(Failed::TooLarge);
                    }
                }
                self.buf.split().freeze()
            }
        };
        // Bytes nobody asked for mean the two ends disagree on framing.
        reusable &= self.buf.is_empty();
        strip_hop_by_hop(&mut headers);
        Ok((
            Captured {
                status,
                headers,
                body,
            },
            reusable,
        ))
    }

    async fn read_chunked(&mut self, max_body: usize) -> Result<Bytes, Failed> {
        let mut body = BytesMut::new();
        loop {
            let size = loop {
                match httparse::parse_chunk_size(&self.buf) {
                    Ok(httparse::Status::Complete((used, size))) => {
                        self.buf.advance(used);
                        break size;
                    }
                    Ok(httparse::Status::Partial) if self.buf.len() < 1024 => {
                        if !self.fill().await? {
                            return Err(broken("the connection closed inside a chunk size"));
                        }
                    }
                    _ => return Err(broken("a malformed chunk size")),
                }
            };
            if size == 0 {
                break;
            }
            let size = usize::try_from(size).unwrap_or(usize::MAX);
            if size > max_body.saturating_sub(body.len()) {
                return Err(Failed::TooLarge);
            }
            self.fill_to(size + 2).await?;
            if &self.buf[size..size + 2] != b"\r\n" {
                return Err(broken("a chunk without its line end"));
            }
            if body.is_empty() {
                // The first chunk is shared, not copied (most answers have one).
                body = self.buf.split_to(size);
                self.buf.advance(2);
            } else {
                body.extend_from_slice(&self.buf[..size]);
                self.buf.advance(size + 2);
            }
        }
        // Trailer fields, dropped, up to the empty line.
        let mut trailers = 0;
        loop {
            match self.buf.windows(2).position(|w| w == b"\r\n") {
                Some(0) => {
                    self.buf.advance(2);
                    return Ok(body.freeze());
                }
                Some(end) => {
                    trailers += end + 2;
                    self.buf.advance(end + 2);
                }
                None if trailers + self.buf.len() > MAX_HEAD => {
                    return Err(broken("the trailer fields are too large"))
                }
                None => {
                    if !self.fill().await? {
                        return Err(broken("the connection closed inside the trailer fields"));
                    }
                }
            }
        }
    }
}

fn broken(why: &str) -> Failed {
    Failed::Broken(why.to_string())
}

/// The request head: request line, `Host`, the headers (the client's framing fields
/// left out: this connection frames the body itself), the fields `set` adds (names the
/// headers do not carry), `Content-Length`.
fn encode_head(
    out: &mut Vec<u8>,
    head: &Head<'_>,
    headers: &HeaderMap,
    set: &[(HeaderName, HeaderValue)],
    body_len: usize,
) {
    out.extend_from_slice(head.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(head.prefix.as_bytes());
    out.extend_from_slice(head.path_and_query.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    out.extend_from_slice(head.host.as_bytes());
    out.extend_from_slice(b"\r\n");
    let fields = headers.iter().filter(|(name, _)| {
        !(**name == CONTENT_LENGTH || **name == http::header::HOST || is_hop_by_hop(name))
    });
    for (name, value) in fields.chain(set.iter().map(|(n, v)| (n, v))) {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    // A body, or a method that means one, says its length; GET and HEAD without one
    // say nothing, as clients do.
    if body_len > 0 || !matches!(*head.method, Method::GET | Method::HEAD) {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(itoa_buf(body_len).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Decimal digits of `n` without an allocation.
struct Digits {
    buf: [u8; 20],
    start: usize,
}

impl Digits {
    fn as_bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

fn itoa_buf(mut n: usize) -> Digits {
    let mut d = Digits {
        buf: [0; 20],
        start: 20,
    };
    loop {
        d.start -= 1;
        d.buf[d.start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return d;
        }
    }
}

/// Parses a response head at the start of `buf` and takes it out; `None` while it is
/// incomplete. Header values share the head's bytes.
fn parse_head(
    buf: &mut BytesMut,
    places: &mut Vec<(HeaderName, usize, usize)>,
) -> Result<Option<(StatusCode, HeaderMap, bool)>, Failed> {
    if buf.is_empty() {
        return Ok(None);
    }
    // Left uninitialised: the parser writes the fields it finds.
    let mut fields =
        [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut response,
        buf,
        &mut fields,
    );
    let len = match parsed {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(Failed::Broken(format!("a malformed response head: {e}"))),
    };
    let code = response.code.unwrap_or(0);
    let status = StatusCode::from_u16(code)
        .map_err(|_| Failed::Broken(format!("a response status of {code}")))?;
    let http11 = response.version == Some(1);
    let base = buf.as_ptr() as usize;
    // Where each field sits in the head, so the values can share it once it is split off.
    places.clear();
    for field in response.headers.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes())
            .map_err(|_| Failed::Broken(format!("a response header named {:?}", field.name)))?;
        let start = field.value.as_ptr() as usize - base;
        places.push((name, start, start + field.value.len()));
    }
    let head = buf.split_to(len).freeze();
    let mut headers = HeaderMap::with_capacity(places.len());
    for (name, start, end) in places.drain(..) {
        let value = HeaderValue::from_maybe_shared(head.slice(start..end))
            .map_err(|_| Failed::Broken(format!("a malformed value of {name}")))?;
        headers.append(name, value);
    }
    Ok(Some((status, headers, http11)))
}

/// How the body is delimited (RFC 9112 §6.3).
fn framing(
    head_request: bool,
    status: StatusCode,
    http11: bool,
    coded: bool,
    headers: &HeaderMap,
) -> Result<Framing, Failed> {
    if head_request
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok(Framing::None);
    }
    if coded {
        if !http11 {
            return Err(broken("a transfer coding in an HTTP/1.0 response"));
        }
        let last = headers
            .get_all(http::header::TRANSFER_ENCODING)
            .iter()
            .flat_map(|v| v.as_bytes().split(|b| *b == b','))
            .map(|c| c.trim_ascii())
            .rfind(|c| !c.is_empty());
        // Chunked last frames the body; any other coding (or none named) runs to the close.
        return Ok(match last {
            Some(c) if c.eq_ignore_ascii_case(b"chunked") => Framing::Chunked,
            _ => Framing::UntilClose,
        });
    }
    let mut length: Option<usize> = None;
    for v in headers.get_all(CONTENT_LENGTH) {
        for part in v.as_bytes().split(|b| *b == b',') {
            let n = std::str::from_utf8(part.trim_ascii())
                .ok()
                .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|s| s.parse::<usize>().ok())
                .ok_or_else(|| broken("a malformed Content-Length"))?;
            if length.is_some_and(|l| l != n) {
                return Err(broken("conflicting Content-Length values"));
            }
            length = Some(n);
        }
    }
    Ok(match length {
        Some(0) => Framing::None,
        Some(n) => Framing::Length(n),
        None => Framing::UntilClose,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncBufReadExt;
    use tokio::net::TcpListener;

    /// A server that reads one request head (and `body` bytes) per answer and writes
    /// each answer as given; returns its address and the requests it read.
    async fn server(
        answers: Vec<&'static [u8]>,
        body: usize,
    ) -> (std::net::SocketAddr, tokio::task::JoinHandle<Vec<String>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            let mut s = tokio::io::BufReader::new(s);
            let mut seen = Vec::new();
            for answer in answers {
                let mut head = String::new();
                loop {
                    let mut line = String::new();
                    if s.read_line(&mut line).await.unwrap() == 0 {
                        return seen;
                    }
                    head.push_str(&line);
                    if line == "\r\n" {
                        break;
                    }
                }
                let mut b = vec![0; body];
                s.read_exact(&mut b).await.unwrap();
                head.push_str(&String::from_utf8_lossy(&b));
                seen.push(head);
                s.get_mut().write_all(answer).await.unwrap();
            }
            seen
        });
        (addr, task)
    }

    async fn conn(addr: std::net::SocketAddr) -> Conn {
        Conn::new(Stream::Tcp(TcpStream::connect(addr).await.unwrap()))
    }

    fn head<'a>(method: &'a Method, host: &'a HeaderValue) -> Head<'a> {
        Head {
            method,
            prefix: "/api",
            path_and_query: "/v1/orders?x=1",
            host,
        }
    }

    #[tokio::test]
    async fn writes_one_request_and_reads_a_length_framed_answer() {
        let (addr, seen) = server(
            vec![b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 5\r\nx-a: 1\r\nconnection: keep-alive, x-a\r\n\r\nhello"],
            4,
        )
        .await;
        let mut c = conn(addr).await;
        let mut headers = HeaderMap::new();
        headers.insert("x-b", HeaderValue::from_static("2"));
        headers.insert(CONTENT_LENGTH, HeaderValue::from_static("999"));
        headers.insert(
            http::header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        let host = HeaderValue::from_static("svc:80");
        let (captured, reusable) = c
            .exchange(
                &head(&Method::POST, &host),
                &headers,
                &[(
                    HeaderName::from_static("x-c"),
                    HeaderValue::from_static("3"),
                )],
                &Bytes::from_static(b"abcd"),
                100,
            )
            .await
            .unwrap();
        assert_eq!(captured.status, StatusCode::CREATED);
        assert_eq!(&captured.body[..], b"hello");
        assert!(captured.headers.get("x-a").is_none(), "named by Connection");
        assert!(captured.headers.get(http::header::CONNECTION).is_none());
        assert!(reusable);
        let seen = seen.await.unwrap();
        assert_eq!(
            seen[0],
            "POST /api/v1/orders?x=1 HTTP/1.1\r\nhost: svc:80\r\nx-b: 2\r\nx-c: 3\r\ncontent-length: 4\r\n\r\nabcd"
        );
    }

    /// A GET without headers or body, answers up to 100 bytes.
    async fn get(c: &mut Conn) -> Result<(Captured, bool), Failed> {
        let host = HeaderValue::from_static("h");
        c.exchange(
            &head(&Method::GET, &host),
            &HeaderMap::new(),
            &[],
            &Bytes::new(),
            100,
        )
        .await
    }

    #[tokio::test]
    async fn reads_chunked_answers_and_keeps_the_connection() {
        let (addr, _seen) = server(
            vec![
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nx-trailer: t\r\n\r\n",
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\nwxyz\r\n0\r\n\r\n",
            ],
            0,
        )
        .await;
        let mut c = conn(addr).await;
        for want in [&b"abcde"[..], b"wxyz"] {
            let (captured, reusable) = get(&mut c).await.unwrap();
            assert_eq!(&captured.body[..], want);
            assert!(captured.headers.get("transfer-encoding").is_none());
            assert!(reusable);
        }
    }

    /// Answers framed two ways, closing, or followed by stray bytes are read and their
    /// connection is not used again; a transfer coding in HTTP/1.0 is refused.
    #[tokio::test]
    async fn ambiguous_or_closing_answers_are_not_kept() {
        let cases: [(&'static [u8], &[u8]); 4] = [
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 99\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
                b"ok",
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                b"ok",
            ),
            (b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok", b"ok"),
            (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA", b"ok"),
        ];
        for (answer, body) in cases {
            let (addr, _seen) = server(vec![answer], 0).await;
            let mut c = conn(addr).await;
            let (captured, reusable) = get(&mut c).await.unwrap();
            assert_eq!(&captured.body[..], body);
            assert!(!reusable, "{}", String::from_utf8_lossy(answer));
            assert!(captured
                .headers
                .get(CONTENT_LENGTH)
                .is_none_or(|v| v == "2"));
        }
        let (addr, _seen) = server(
            vec![b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n"],
            0,
        )
        .await;
        let mut c = conn(addr).await;
        assert_eq!(
            get(&mut c).await.map(|_| ()),
            Err(broken("a transfer coding in an HTTP/1.0 response"))
        );
    }

    /// An upstream that answers and closes before reading a large body: its answer
    /// counts, it is not an uncertain result.
    #[tokio::test]
    async fn an_answer_sent_before_the_body_was_read_counts() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut b = [0u8; 1024];
            let _ = s.read(&mut b).await;
            s.write_all(b"HTTP/1.1 413 Content Too Large\r\ncontent-length: 3\r\nconnection: close\r\n\r\nbig")
                .await
                .unwrap();
            // Closing with unread data resets the connection under the writer.
            drop(s);
        });
        let mut c = conn(addr).await;
        let host = HeaderValue::from_static("h");
        let body = Bytes::from(vec![b'x'; 32 << 20]);
        let (captured, reusable) = c
            .exchange(
                &head(&Method::POST, &host),
                &HeaderMap::new(),
                &[],
                &body,
                100,
            )
            .await
            .unwrap();
        assert_eq!(captured.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(!reusable);
    }

    /// Whether an idle connection is found unusable within half a second: what the peer
    /// did arrives on loopback at once, the reactor needs a turn to see it.
    async fn turns_unusable(c: &mut Conn) -> bool {
        for _ in 0..100 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            if !c.is_idle_open() {
                return true;
            }
        }
        false
    }

    #[tokio::test]
    async fn an_idle_connection_with_stray_bytes_is_not_used_again() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut c = conn(addr).await;
        let (mut peer, _) = listener.accept().await.unwrap();
        peer.write_all(b"HTTP/1.1 200 OK\r\n").await.unwrap();
        assert!(turns_unusable(&mut c).await);
    }

    #[tokio::test]
    async fn a_body_until_close_is_read_and_the_connection_not_kept() {
        let (addr, _seen) = server(vec![b"HTTP/1.1 200 OK\r\n\r\nall of it"], 0).await;
        let mut c = conn(addr).await;
        let (captured, reusable) = get(&mut c).await.unwrap();
        assert_eq!(&captured.body[..], b"all of it");
        assert!(!reusable);
    }

    #[tokio::test]
    async fn too_large_and_broken_answers_are_told_apart() {
        let cases: [(&'static [u8], Failed); 5] = [
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 101\r\n\r\n",
                Failed::TooLarge,
            ),
            (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n65\r\n",
                Failed::TooLarge,
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort",
                broken("the connection closed inside the response body"),
            ),
            (b"", broken("the connection closed before a response")),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab",
                broken("conflicting Content-Length values"),
            ),
        ];
        for (answer, want) in cases {
            let (addr, _seen) = server(vec![answer], 0).await;
            let mut c = conn(addr).await;
            let got = get(&mut c).await.map(|_| ());
            assert_eq!(got, Err(want), "{}", String::from_utf8_lossy(answer));
        }
    }

    #[tokio::test]
    async fn an_idle_connection_the_peer_closed_is_not_used_again() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut c = conn(addr).await;
        let (peer, _) = listener.accept().await.unwrap();
        assert!(c.is_idle_open());
        drop(peer);
        assert!(turns_unusable(&mut c).await);
    }

    #[test]
    fn no_body_for_head_204_304_and_empty_requests_say_so_by_method() {
        let h = HeaderMap::new();
        let mut with_length = HeaderMap::new();
        with_length.insert(CONTENT_LENGTH, HeaderValue::from_static("7"));
        assert!(matches!(
            framing(true, StatusCode::OK, true, false, &with_length),
            Ok(Framing::None)
        ));
        for s in [StatusCode::NO_CONTENT, StatusCode::NOT_MODIFIED] {
            assert!(matches!(
                framing(false, s, true, false, &with_length),
                Ok(Framing::None)
            ));
        }
        assert!(matches!(
            framing(false, StatusCode::OK, true, false, &with_length),
            Ok(Framing::Length(7))
        ));
        assert!(matches!(
            framing(false, StatusCode::OK, true, false, &h),
            Ok(Framing::UntilClose)
        ));
        let host = HeaderValue::from_static("h");
        let mut out = Vec::new();
        encode_head(&mut out, &head(&Method::POST, &host), &h, &[], 0);
        assert!(String::from_utf8(out)
            .unwrap()
            .ends_with("content-length: 0\r\n\r\n"));
        let mut out = Vec::new();
        encode_head(&mut out, &head(&Method::GET, &host), &h, &[], 0);
        assert!(!String::from_utf8(out).unwrap().contains("content-length"));
        assert_eq!(itoa_buf(0).as_bytes(), b"0");
        assert_eq!(itoa_buf(1234567).as_bytes(), b"1234567");
    }
}
