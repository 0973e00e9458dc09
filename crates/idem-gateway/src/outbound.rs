//! Headers bound for the upstream: what a client's request loses (hop-by-hop fields,
//! client-sent identity headers, the gateway's token, the configured credential, and
//! forwarding fields from untrusted peers) and what the gateway sets (the caller's
//! tenant and principal, its request id, trace context, `X-Forwarded-*`).
//!
//! Owns [`Peer`] and [`Outbound`]. It must not send anything: the pass-through
//! ([`crate::service`]) and the keyed forward ([`crate::forward`]) do.

use std::net::SocketAddr;
use std::sync::Arc;

use http::header::{HeaderMap, HeaderName, HeaderValue, FORWARDED, HOST};
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
    pub fn prepare(self, ctx: &Ctx, tenant: &TenantId, principal: &Principal) -> HeaderMap {
        let Self {
            mut headers,
            peer,
            request_id,
        } = self;
        ctx.prepare_headers(
            &mut headers,
            Some((tenant, principal)),
            &peer,
            request_id.as_deref(),
        );
        headers
    }
}

impl Ctx {
    /// Readies client headers for the upstream: hop-by-hop fields, client-sent identity
    /// headers and (configured) the API key go; the gateway's identity headers for
    /// `caller` (its window tenant and principal) come in.
    pub(crate) fn prepare_headers(
        &self,
        headers: &mut HeaderMap,
        caller: Option<(&TenantId, &Principal)>,
        peer: &Peer,
        request_id: Option<&str>,
    ) {
        // Forwarding headers are believed only from a configured proxy.
        let trusted = self.proxies.trusts(peer.ip);
        crate::hop::strip_hop_by_hop_and(headers, |n| {
            *n == self.tenant_header
                || *n == self.principal_header
                || *n == GATEWAY_TOKEN
                || self.auth.is_credential(n)
                || (!trusted && is_forwarding(n))
        });
        // Room for the fields set below at once: hyper sizes a parsed map to fit.
        headers.reserve(6);
        // The upstream gets its own authority as Host (set when it is chosen); the
        // client's goes along as X-Forwarded-Host (a trusted proxy's own stays).
        if let Some(host) = headers.remove(HOST) {
            if !headers.contains_key(X_FORWARDED_HOST) {
                headers.insert(X_FORWARDED_HOST, host);
            }
        }
        if let Some(id) = request_id.and_then(|id| HeaderValue::from_str(id).ok()) {
            headers.insert(X_REQUEST_ID, id);
        }
        // W3C trace context: the upstream call is a child of the caller's span, or the
        // first span of a new trace. A malformed traceparent is replaced, not passed on.
        let span = uuid::Uuid::new_v4().as_bytes()[..8]
            .try_into()
            .unwrap_or([1; 8]);
        let next = match headers
            .get(&TRACEPARENT)
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
        if let Ok(v) = HeaderValue::from_bytes(&next.to_bytes()) {
            headers.insert(TRACEPARENT, v);
        }
        // A proxy may add its own line instead of extending one: every line counts,
        // in order.
        let prior: Vec<&str> = headers
            .get_all(&X_FORWARDED_FOR)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        if prior.is_empty() {
            headers.insert(X_FORWARDED_FOR, peer.xff.clone());
        } else {
            let chain = format!("{}, {}", prior.join(", "), peer.ip);
            match HeaderValue::from_str(&chain) {
                Ok(v) => {
                    headers.insert(X_FORWARDED_FOR, v);
                }
                Err(_) => {
                    headers.insert(X_FORWARDED_FOR, peer.xff.clone());
                }
            }
        }
        if let Some((tenant, principal)) = caller {
            if let Ok(v) = HeaderValue::from_str(tenant.as_str()) {
                headers.insert(self.tenant_header.clone(), v);
            }
            if let Ok(v) = HeaderValue::from_str(principal.as_str()) {
                headers.insert(self.principal_header.clone(), v);
            }
        }
        if let Some(token) = &self.token {
            headers.insert(GATEWAY_TOKEN, token.clone());
        }
    }
}

/// A field that says where a request came from: believed only from trusted proxies.
fn is_forwarding(name: &HeaderName) -> bool {
    let n = name.as_str();
    n.starts_with("x-forwarded-") || n == FORWARDED.as_str() || n == "x-real-ip"
}
