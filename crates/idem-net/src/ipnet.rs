//! Address blocks (`10.0.0.0/8`, `::1`) for deciding which peers are trusted proxies.
//! Parsing and membership only; whose headers to believe is each server's policy.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// An address block: an address and a prefix length. An IPv4-mapped IPv6 block
/// (`::ffff:10.0.0.0/104`) is the IPv4 block it maps, so both spellings agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl FromStr for IpNet {
    type Err = String;

    /// `10.0.0.0/8`, `::1/128`, or a bare address (one host).
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not an address or CIDR block (10.0.0.0/8, ::1)");
        let s = s.trim();
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (
                a.parse::<IpAddr>().map_err(|_| bad())?,
                Some(p.parse::<u8>().map_err(|_| bad())?),
            ),
            None => (s.parse::<IpAddr>().map_err(|_| bad())?, None),
        };
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(max);
        if prefix > max {
            return Err(bad());
        }
        Ok(match addr {
            IpAddr::V6(v6) if prefix >= 96 => match v6.to_ipv4_mapped() {
                Some(v4) => Self {
                    addr: IpAddr::V4(v4),
                    prefix: prefix - 96,
                },
                None => Self { addr, prefix },
            },
            _ => Self { addr, prefix },
        })
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl IpNet {
    /// Whether `ip` lies in the block; an IPv4 peer seen through a dual-stack socket
    /// (`::ffff:a.b.c.d`) is that IPv4 address.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn check(net: &str, ip: &str, inside: bool) {
        let n: IpNet = net.parse().unwrap_or_else(|e| panic!("{e}"));
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
        check("::ffff:10.0.0.0/104", "10.9.9.9", true);
        check("::ffff:10.0.0.0/104", "11.0.0.1", false);
        check("::ffff:10.0.0.1", "::ffff:10.0.0.1", true);
        check("::/0", "2001:db8::1", true);
        for bad in ["", "10.0.0.0/33", "::/129", "host", "10.0.0.0/x"] {
            assert!(bad.parse::<IpNet>().is_err(), "{bad}");
        }
    }
}
