//! The network edge idem's servers share: the accept loop ([`serve`]) and TLS material
//! for listeners and clients ([`tls`]). Owns sockets and handshakes, never what a
//! request means.

pub mod serve;
pub mod tls;

#[cfg(feature = "testing")]
pub mod testing;
