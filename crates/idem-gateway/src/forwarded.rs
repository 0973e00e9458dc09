//! `X-Forwarded-*` policy: whose forwarding headers the gateway believes.
//!
//! A client can write any `X-Forwarded-For` it likes, so the gateway keeps (and appends
//! to) the client-sent chain only when the peer is a configured proxy
//! ([`crate::GatewayConfig::trusted_proxies`]). From any other peer the chain is
//! replaced by the peer's address, and client-sent `X-Forwarded-Host` /
//! `X-Forwarded-Proto` / `Forwarded` are dropped. This module decides; it does no I/O.

use std::net::IpAddr;

/// An address block: an address and a prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    /// `10.0.0.0/8`, `::1/128`, or a bare address (one host).
    pub fn parse(s: &str) -> Option<Self> {
        let (addr, prefix) = match s.trim().split_once('/') {
            Some((a, p)) => (a.parse::<IpAddr>().ok()?, Some(p.parse::<u8>().ok()?)),
            None => (s.trim().parse::<IpAddr>().ok()?, None),
        };
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(max);
        (prefix <= max).then_some(Self { addr, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match (self.addr, ip) {
            // An IPv4 peer seen through a dual-stack socket.
            (IpAddr::V4(_), IpAddr::V6(v6)) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            _ => ip,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// The configured proxies.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    /// Entries were checked by the configuration; an unparsable one is skipped.
    pub fn new(entries: &[String]) -> Self {
        Self(entries.iter().filter_map(|e| IpNet::parse(e)).collect())
    }

    pub fn trusts(&self, peer: IpAddr) -> bool {
        self.0.iter().any(|n| n.contains(peer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(net: &str, ip: &str, inside: bool) {
        let n = IpNet::parse(net).unwrap_or_else(|| panic!("{net} parses"));
        assert_eq!(n.contains(ip.parse().unwrap()), inside, "{ip} in {net}");
    }

    #[test]
    fn blocks() {
        check("10.0.0.0/8", "10.1.2.3", true);
        check("10.0.0.0/8", "11.0.0.1", false);
        check("127.0.0.1", "127.0.0.1", true);
        check("127.0.0.1", "127.0.0.2", false);
        check("0.0.0.0/0", "8.8.8.8", true);
        check("::1", "::1", true);
        check("fd00::/8", "fd12::1", true);
        check("fd00::/8", "fe80::1", false);
        check("127.0.0.0/8", "::ffff:127.0.0.9", true);
        check("::1", "127.0.0.1", false);
        for bad in ["", "10.0.0.0/33", "::/129", "host", "10.0.0.0/x"] {
            assert!(IpNet::parse(bad).is_none(), "{bad}");
        }
    }
}
