//! Headers bound for the upstream: what a client's request loses (hop-by-hop fields,
//! client-sent identity headers, the gateway's token, the configured credential, and
//! forwarding fields from untrusted peers) and what the gateway sets (the caller's
//! tenant and principal, its request id, trace context, `X-Forwarded-*`).
//!
//! Owns [`Peer`] and [`Outbound`]. It must not send anything: the pass-through
//! ([`crate::service`]) and the keyed forward ([`crate::forward`]) do.

use std::net::SocketAddr;
use std::sync::Arc;

use http::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, FORWARDED, HOST};
use idem_core::wire::{TraceParent, TRACEPARENT};
use idem_core::{Principal, TenantId};

use crate::ctx::{Ctx, GATEWAY_TOKEN, X_REQUEST_ID};

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// The client end of a connection, computed once per connection.
pub(crate) struct Peer {
    pub ip: std::net::IpAddr,
    /// The `X-Forwarded-For` value when the client sent none.
    pub xff: HeaderValue,
}

impl Peer {
    pub fn new(addr: SocketAddr) -> Self {
        let ip = addr.ip();
        Self {
            ip,
            xff: HeaderValue::from_str(&ip.to_string()).expect("an IP is a header value"),
        }
    }
}

/// A request's headers readied for the upstream: the client's, stripped of what the
/// upstream must not get, and the fields the gateway sets, kept apart so the keyed
/// exchange writes both without merging them into one map.
pub(crate) struct Readied {
    pub headers: HeaderMap,
    /// Names absent from `headers`: each is set once, after the client's fields.
    pub set: Vec<(HeaderName, HeaderValue)>,
}

impl Readied {
    /// The values of `name`, the client's then the gateway's.
    pub fn get_all<'a>(&'a self, name: &'a HeaderName) -> impl Iterator<Item = &'a HeaderValue> {
        self.headers.get_all(name).iter().chain(
            self.set
                .iter()
                .filter(move |(n, _)| n == name)
                .map(|(_, v)| v),
        )
    }

    /// One map, for a client that sends a `HeaderMap`.
    pub fn into_map(self) -> HeaderMap {
        let Self { mut headers, set } = self;
        headers.reserve(set.len());
        for (name, value) in set {
            headers.append(name, value);
        }
        headers
    }
}

/// A keyed request's client headers with what readying them needs, kept as they came
/// until the request is sent: an answer from the window never pays for the rewrite.
/// The request id is captured here because a flight may finish in a task of its own.
pub(crate) struct Outbound {
    headers: HeaderMap,
    peer: Arc<Peer>,
    request_id: Option<Arc<str>>,
}

impl Outbound {
    pub fn new(headers: HeaderMap, peer: Arc<Peer>, request_id: Option<Arc<str>>) -> Self {
        Self {
            headers,
            peer,
            request_id,
        }
    }

    /// The headers to send on behalf of `tenant` and `principal`.
    pub fn prepare(self, ctx: &Ctx, tenant: &TenantId, principal: &Principal) -> Readied {
        let Self {
            headers,
            peer,
            request_id,
        } = self;
        ctx.ready_headers(
            headers,
            Some((tenant, principal)),
            &peer,
            request_id.as_deref(),
        )
    }
}

impl Ctx {
    /// Readies client headers for the upstream: hop-by-hop fields, client-sent identity
    /// headers and (configured) the API key go; the gateway's identity headers for
    /// `caller` (its window tenant and principal), request id, trace context and
    /// forwarding fields come in, replacing any the client sent.
    pub(crate) fn ready_headers(
        &self,
        mut headers: HeaderMap,
        caller: Option<(&TenantId, &Principal)>,
        peer: &Peer,
        request_id: Option<&str>,
    ) -> Readied {
        // Forwarding headers are believed only from a configured proxy.
        let trusted = self.proxies.trusts(peer.ip);
        // Fields the client's `Connection` names go with it, unread (rarely any).
        let named: Vec<HeaderName> = if headers.contains_key(CONNECTION) {
            crate::hop::connection_names(&headers).collect()
        } else {
            Vec::new()
        };
        let read = |name: &HeaderName| {
            if named.contains(name) {
                None
            } else {
                Some(headers.get_all(name).iter())
            }
        };
        // The upstream gets its own authority as Host (written when it is chosen); the
        // client's goes along as X-Forwarded-Host (a trusted proxy's own stays).
        let host = read(&HOST).and_then(|mut v| v.next()).cloned();
        let keeps_forwarded_host =
            trusted && read(&X_FORWARDED_HOST).is_some_and(|mut v| v.next().is_some());
        // W3C trace context: the upstream call is a child of the caller's span, or the
        // first span of a new trace. A malformed traceparent is replaced, not passed on.
        let span = uuid::Uuid::new_v4().as_bytes()[..8]
            .try_into()
            .unwrap_or([1; 8]);
        let trace = match read(&TRACEPARENT)
            .and_then(|mut v| v.next())
            .and_then(|v| v.to_str().ok())
            .and_then(TraceParent::parse)
        {
            Some(parent) => parent.child(span),
            None => TraceParent {
                trace_id: *uuid::Uuid::new_v4().as_bytes(),
                parent_id: span,
                flags: 0,
            },
        };
        // A proxy may add its own line instead of extending one: every line counts,
        // in order.
        let prior: Vec<&str> = trusted
            .then(|| read(&X_FORWARDED_FOR))
            .flatten()
            .into_iter()
            .flatten()
            .filter_map(|v| v.to_str().ok())
            .collect();
        let forwarded_for = (!prior.is_empty())
            .then(|| HeaderValue::from_str(&format!("{}, {}", prior.join(", "), peer.ip)).ok())
            .flatten();
        // One scan removes what must not go upstream and the fields set below, which
        // replace the client's.
        crate::hop::strip_hop_by_hop_and(&mut headers, |n| {
            *n == self.tenant_header
                || *n == self.principal_header
                || *n == GATEWAY_TOKEN
                || self.auth.is_credential(n)
                || (!trusted && is_forwarding(n))
                || *n == HOST
                || *n == X_REQUEST_ID
                || *n == TRACEPARENT
                || *n == X_FORWARDED_FOR
        });
        let mut set = Vec::with_capacity(7);
        if let Some(host) = host.filter(|_| !keeps_forwarded_host) {
            set.push((X_FORWARDED_HOST, host));
        }
        if let Some(id) = request_id.and_then(|id| HeaderValue::from_str(id).ok()) {
            set.push((X_REQUEST_ID, id));
        }
        if let Ok(v) = HeaderValue::from_bytes(&trace.to_bytes()) {
            set.push((TRACEPARENT, v));
        }
        set.push((
            X_FORWARDED_FOR,
            forwarded_for.unwrap_or_else(|| peer.xff.clone()),
        ));
        if let Some((tenant, principal)) = caller {
            if let Ok(v) = HeaderValue::from_str(tenant.as_str()) {
                set.push((self.tenant_header.clone(), v));
            }
            if let Ok(v) = HeaderValue::from_str(principal.as_str()) {
                set.push((self.principal_header.clone(), v));
            }
        }
        if let Some(token) = &self.token {
            set.push((GATEWAY_TOKEN, token.clone()));
        }
        Readied { headers, set }
    }
}

/// A field that says where a request came from: believed only from trusted proxies.
fn is_forwarding(name: &HeaderName) -> bool {
    let n = name.as_str();
    n.starts_with("x-forwarded-") || n == FORWARDED.as_str() || n == "x-real-ip"
}
