//! The network edge idem's servers share: the accept loop ([`serve`]), TLS material
//! for listeners and clients ([`tls`]) and address blocks for trusted proxies
//! ([`ipnet`]). Owns sockets and handshakes, never what a request means.

pub mod ipnet;
pub mod serve;
pub mod tls;

#[cfg(feature = "testing")]
pub mod testing;
