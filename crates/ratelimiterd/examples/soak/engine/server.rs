//! The server under soak, in this process: `ratelimiterd`'s own startup
//! (`start`, then `serve`) on a free loopback port, with the backend its
//! configuration names. Against a server elsewhere the soak takes a URL instead.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ratelimiterd::{Config, ServeOptions};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::workload::Endpoints;

/// The admin token of an in-process server.
pub const ADMIN_TOKEN: &str = "soak-admin-token-0123456789";
/// The client token of an in-process server.
pub const CLIENT_TOKEN: &str = "soak-client-token-0123456789";
/// How often an in-process server carries out pending decreases: often, so the
/// soak sees many decreases through.
const DECREASE_CHECK_INTERVAL_MS: u64 = 200;

/// A server running in this process until dropped or stopped.
pub struct InProcess {
    /// Where to reach it.
    pub endpoints: Endpoints,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl InProcess {
    /// Stops it: graceful shutdown, bounded by the configured grace.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

/// The configuration of an in-process server: `config_file` when given (its
/// tokens and listen address are replaced), else the memory backend; the
/// registry in `dir` either way.
pub fn config(config_file: Option<&Path>, dir: &Path) -> Result<Config, String> {
    let mut config = match config_file {
        Some(path) => Config::load(path).map_err(|e| e.to_string())?,
        None => Config::defaults(),
    };
    config.server.listen_addr = "127.0.0.1:0".to_owned();
    config.server.admin_token = Some(ADMIN_TOKEN.to_owned());
    config.server.client_tokens = vec![CLIENT_TOKEN.to_owned().into()];
    config.registry.path = dir.join("limits.json");
    config.decrease.check_interval_ms = DECREASE_CHECK_INTERVAL_MS;
    Ok(config)
}

/// Starts `config`'s server on a free loopback port.
pub async fn start(config: &Config) -> Result<InProcess, String> {
    let state = ratelimiterd::start(config).await.map_err(|e| e.to_string())?;
    let listener = TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let (stop, stopped) = oneshot::channel::<()>();
    let options = ServeOptions {
        shutdown_grace: Duration::from_secs(5),
        ..ServeOptions::from_config(config)
    };
    let task = tokio::spawn(ratelimiterd::serve(listener, state, options, async move {
        let _ = stopped.await;
    }));
    Ok(InProcess {
        endpoints: Endpoints {
            url: format!("http://{addr}"),
            admin_token: Some(ADMIN_TOKEN.to_owned()),
            client_token: Some(CLIENT_TOKEN.to_owned()),
        },
        stop: Some(stop),
        task: Some(task),
    })
}

/// A fresh directory for an in-process server's registry.
pub fn temp_dir(prefix: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ratelimiterd-soak-{}-{prefix}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temporary directory");
    dir
}
