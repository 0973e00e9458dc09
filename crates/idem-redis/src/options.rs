//! How a [`RedisStore`](crate::RedisStore) is opened, and what answered at the URL.
//!
//! Owns the options, their defaults and the server's self-description (`INFO server`:
//! Redis or Valkey, version, the commands beyond Redis 7's). It must not connect.

use std::time::Duration;

use idem_core::{ClockShift, StoreLimits};
pub use idem_store_kit::FinishedLimits;

/// Default key prefix.
pub const DEFAULT_PREFIX: &str = "idem";
/// Default record expiry: 24 h (Stripe keeps keys at least 24 h; Restate's default).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// Default bound on connection setup.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default bound on one command.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// How to open a [`RedisStore`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RedisOptions {
    /// Prepended to every key (`<prefix>:r:{…}`); must not contain `{` or `}`.
    pub prefix: String,
    /// Record expiry after a record finished (see the module docs, *Expiry*).
    pub retention: Duration,
    pub limits: StoreLimits,
    /// Added to the Redis clock; zero in production.
    pub clock: ClockShift,
    /// Bound on connecting (the whole setup, and each reconnect attempt).
    pub connect_timeout: Duration,
    /// Bound on each command.
    pub response_timeout: Duration,
    /// `CLIENT SETNAME` of this store's connection; `None` picks `idem-<uuid>`.
    /// Letters, digits and `-_.:` only (Redis forbids spaces in client names).
    pub client_name: Option<String>,
    /// Scopes remembered as holding a record (`idem_store_kit::recent`): a claim on one of
    /// them first tries a plain `GET` and answers a replay or a mismatch of a finished
    /// record from it. 0 turns the shortcut off.
    pub recent_capacity: usize,
    /// Finished records kept in this process (`idem_store_kit::finished`): a claim on one
    /// is answered — replay or mismatch, by the same rule — without a round trip, until
    /// the record expires or the entry's time to live ends. The time to live bounds how
    /// long a record removed outside idem (a flush, eviction, a manual `DEL`) can still
    /// be replayed here. [`FinishedLimits::off`] turns it off.
    pub finished: FinishedLimits,
    /// For `rediss://`: the CA (PEM) the server's certificate must chain to, instead of
    /// the system's trust store.
    pub ca_file: Option<std::path::PathBuf>,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.to_string(),
            retention: DEFAULT_RETENTION,
            limits: StoreLimits::default(),
            clock: ClockShift::default(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            client_name: None,
            ca_file: None,
            recent_capacity: idem_store_kit::recent::DEFAULT_RECENT_CAPACITY,
            finished: FinishedLimits::default(),
        }
    }
}

/// What answered at the URL: which server, which version, and the commands idem can use
/// beyond Redis 7's. Read once at connect (`INFO server`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// `redis` or `valkey` (a server that does not say is taken for Redis).
    pub name: String,
    /// The server's own version (`valkey_version` on Valkey, `redis_version` otherwise).
    pub version: (u32, u32, u32),
    /// `SET … IFEQ` (compare-and-set without a script): Valkey ≥ 8.1, Redis ≥ 8.4.
    pub set_ifeq: bool,
    /// `SET … NX GET` (create, or read what is there, in one command): Redis ≥ 7.0 and
    /// every Valkey.
    pub set_nx_get: bool,
}

impl ServerInfo {
    /// Reads the `INFO server` text.
    pub fn parse(info: &str) -> Self {
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        let name = field("server_name").unwrap_or("redis").to_ascii_lowercase();
        let version_text = if name == "valkey" {
            field("valkey_version").or_else(|| field("redis_version"))
        } else {
            field("redis_version")
        };
        let version = version_text.map_or((0, 0, 0), parse_version);
        let (set_ifeq, set_nx_get) = match name.as_str() {
            "valkey" => (version >= (8, 1, 0), true),
            _ => (version >= (8, 4, 0), version >= (7, 0, 0)),
        };
        Self {
            name,
            version,
            set_ifeq,
            set_nx_get,
        }
    }
}

impl std::fmt::Display for ServerInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (a, b, c) = self.version;
        write!(f, "{} {a}.{b}.{c}", self.name)
    }
}

fn parse_version(text: &str) -> (u32, u32, u32) {
    let mut parts = text.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_info_from_info_text() {
        let valkey = ServerInfo::parse(
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.8\r\n",
        );
        assert_eq!(valkey.to_string(), "valkey 8.1.8");
        assert!(valkey.set_ifeq);
        let redis7 = ServerInfo::parse("# Server\r\nredis_version:7.0.15\r\n");
        assert_eq!(redis7.to_string(), "redis 7.0.15");
        assert!(!redis7.set_ifeq);
        assert!(redis7.set_nx_get && valkey.set_nx_get);
        assert!(!ServerInfo::parse("redis_version:6.2.14\r\n").set_nx_get);
        assert!(ServerInfo::parse("redis_version:8.4.0\r\n").set_ifeq);
        assert!(!ServerInfo::parse("server_name:valkey\r\nvalkey_version:8.0.2\r\n").set_ifeq);
    }
}
