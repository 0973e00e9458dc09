//! `X-Forwarded-*` policy: whose forwarding headers the gateway believes.
//!
//! A client can write any `X-Forwarded-For` it likes, so the gateway keeps (and appends
//! to) the client-sent chain only when the peer is a configured proxy
//! ([`crate::GatewayConfig::trusted_proxies`]). From any other peer the chain is
//! replaced by the peer's address, and client-sent `X-Forwarded-Host` /
//! `X-Forwarded-Proto` / `Forwarded` are dropped. This module decides; it does no I/O.

use std::net::IpAddr;

pub use idem_net::ipnet::IpNet;

/// The configured proxies.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    /// Entries were checked by the configuration; an unparsable one is skipped.
    pub fn new(entries: &[String]) -> Self {
        Self(
            entries
                .iter()
                .filter_map(|e| e.parse::<IpNet>().ok())
                .collect(),
        )
    }

    pub fn trusts(&self, peer: IpAddr) -> bool {
        self.0.iter().any(|n| n.contains(peer))
    }
}
