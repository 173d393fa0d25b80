//! The console's one error type.

use std::net::SocketAddr;

/// The console could not serve, or its sampler could not take a sample.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum WebError {
    /// The address is not loopback, and [`Console::allow_remote`](super::Console::allow_remote)
    /// or a [token](super::Console::token) is missing (a console without a token serves
    /// loopback only: anyone reaching it reads everything).
    #[error(
        "refusing to serve the console on non-loopback address {addr} (it needs Console::allow_remote and a token, with TLS in front)"
    )]
    NotLoopback {
        /// The address asked for.
        addr: SocketAddr,
    },
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        source: std::sync::Arc<std::io::Error>,
    },
    /// Serving failed.
    #[error("console server failed: {0}")]
    Io(std::sync::Arc<std::io::Error>),
    /// The console's router was dropped, or its broker shut down.
    #[error("the console was dropped or its broker shut down")]
    Stopped,
    /// The stats could not be read.
    #[error("cannot read the stats: {0}")]
    Read(String),
}

impl WebError {
    /// What kind of failure this is, as the library's errors say it.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(rockq::web::WebError::Stopped.kind(), rockq::ErrorKind::Shutdown);
    /// ```
    pub fn kind(&self) -> crate::error::ErrorKind {
        match self {
            WebError::NotLoopback { .. } => crate::error::ErrorKind::InvalidInput,
            WebError::Bind { .. } | WebError::Io(_) | WebError::Read(_) => crate::error::ErrorKind::Storage,
            WebError::Stopped => crate::error::ErrorKind::Shutdown,
        }
    }
}
