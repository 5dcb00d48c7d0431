//! The shutdown signal. The server takes shutdown as a future, so tests end it
//! with a channel and the binary with SIGTERM or Ctrl-C; [`Shutdown`] lets every
//! task of the server wait for that one future.

use std::future::Future;

use tokio::sync::watch;

/// A shutdown signal many tasks can wait for. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Shutdown {
    fired: watch::Receiver<bool>,
}

impl Shutdown {
    /// Fires when `trigger` completes.
    pub fn new(trigger: impl Future<Output = ()> + Send + 'static) -> Self {
        let (sender, fired) = watch::channel(false);
        tokio::spawn(async move {
            trigger.await;
            // Nobody waiting is fine: the server may already have stopped.
            let _ = sender.send(true);
        });
        Self { fired }
    }

    /// Resolves once the signal fired (at once if it already has).
    pub async fn wait(mut self) {
        // A dropped sender without a send means the trigger task was cancelled
        // (the runtime is stopping): treat it as shutdown as well.
        let _ = self.fired.wait_for(|fired| *fired).await;
    }
}

/// Resolves on SIGTERM or Ctrl-C (SIGINT).
pub async fn signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut stream) => {
                stream.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("Ctrl-C received, shutting down"),
        () = terminate => tracing::info!("SIGTERM received, shutting down"),
    }
}
