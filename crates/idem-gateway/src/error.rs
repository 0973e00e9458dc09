//! Errors of starting and running the gateway. Per-request failures never surface here:
//! they become problem responses (see [`crate::problem`]).

/// Why the gateway could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    /// The configuration is invalid.
    #[error("configuration: {0}")]
    Config(String),
    /// The listen address could not be bound.
    #[error("listen on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}
