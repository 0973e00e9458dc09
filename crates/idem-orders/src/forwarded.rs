//! Whose `X-Forwarded-For` the service believes: the client address behind the
//! configured reverse proxies (`--trusted-proxies`), for the console's login throttle
//! and its audit.
//!
//! A client can write any `X-Forwarded-For` it likes, so the chain is read only when
//! the peer is a trusted proxy, and only from the right, past the trusted hops: the
//! first untrusted address is the client (each trusted proxy appended the address it
//! saw; what lies left of an untrusted one was written by that client). The same
//! address rule as the gateway's `trusted_proxies`. This module decides; it does no I/O.

use std::net::{IpAddr, SocketAddr};

use axum::http::HeaderMap;
pub use idem_net::ipnet::IpNet;

/// The configured reverse proxies; none by default (every peer is the client).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    pub fn new(blocks: Vec<IpNet>) -> Self {
        Self(blocks)
    }

    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|n| n.contains(ip))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The client's address: the peer's, or, when the peer is a trusted proxy, the
    /// rightmost address of `X-Forwarded-For` (every header line, in order) that is not
    /// a trusted proxy. A chain of trusted hops only ends at its leftmost address; an
    /// entry that is not an address ends the walk at the hop that appended it.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let mut client = peer.to_canonical();
        if !self.trusts(client) {
            return client;
        }
        let hops: Vec<&str> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect();
        for hop in hops.iter().rev() {
            let Some(ip) = parse_hop(hop) else {
                break;
            };
            client = ip;
            if !self.trusts(ip) {
                break;
            }
        }
        client
    }
}

/// `1.2.3.4`, `2001:db8::1`, or with a port (`1.2.3.4:5678`, `[2001:db8::1]:5678`).
fn parse_hop(hop: &str) -> Option<IpAddr> {
    hop.parse::<IpAddr>()
        .ok()
        .or_else(|| hop.parse::<SocketAddr>().ok().map(|s| s.ip()))
        .map(|ip| ip.to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_client_is_the_rightmost_untrusted_hop() {
        let proxies = TrustedProxies::new(vec![net("127.0.0.1"), net("10.0.0.0/8")]);
        let client = |peer: &str, lines: &[&str]| {
            let mut h = HeaderMap::new();
            for l in lines {
                h.append("x-forwarded-for", l.parse().unwrap());
            }
            proxies.client(peer.parse().unwrap(), &h).to_string()
        };
        // An untrusted peer's header is not read.
        assert_eq!(client("192.0.2.9", &["198.51.100.1"]), "192.0.2.9");
        assert_eq!(client("127.0.0.1", &[]), "127.0.0.1");
        assert_eq!(client("127.0.0.1", &["198.51.100.1"]), "198.51.100.1");
        // A client's forged entries lie left of its own address.
        assert_eq!(
            client("127.0.0.1", &["1.1.1.1, 198.51.100.1", "10.0.0.3"]),
            "198.51.100.1"
        );
        assert_eq!(client("127.0.0.1", &["10.0.0.4, 10.0.0.3"]), "10.0.0.4");
        assert_eq!(client("127.0.0.1", &["[2001:db8::1]:443"]), "2001:db8::1");
        assert_eq!(client("127.0.0.1", &["1.1.1.1, junk"]), "127.0.0.1");
        assert_eq!(
            client("::ffff:127.0.0.1", &["198.51.100.7"]),
            "198.51.100.7"
        );
        let none = TrustedProxies::default();
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "198.51.100.1".parse().unwrap());
        assert_eq!(
            none.client("127.0.0.1".parse().unwrap(), &h).to_string(),
            "127.0.0.1"
        );
    }
}
