//! The shutdown signal of the long-running commands (`serve`, `gateway`): SIGINT or
//! SIGTERM, whichever comes first, so an orchestrator's stop drains like Ctrl-C does.

use std::future::Future;

use idem_core::StoreError;

/// Installs the SIGTERM and SIGINT handlers now (call it before binding, so a signal
/// sent as soon as the server listens drains instead of killing the process) and
/// resolves on the first of them.
pub fn shutdown() -> Result<impl Future<Output = ()> + Send + 'static, StoreError> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let install = |kind| {
            signal(kind).map_err(|e| StoreError::Unavailable(format!("signal handler: {e}")))
        };
        let mut term = install(SignalKind::terminate())?;
        let mut int = install(SignalKind::interrupt())?;
        Ok(async move {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM received"),
                _ = int.recv() => tracing::info!("SIGINT received"),
            }
        })
    }
    #[cfg(not(unix))]
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}
