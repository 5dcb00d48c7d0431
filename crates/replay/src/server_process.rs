//! A `ratelimiterd` the replay starts for itself: memory backend (or a given
//! TigerBeetle cluster), loopback port, registry in a temporary directory;
//! stopped and cleaned up when dropped.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use ratelimiter::httpclient::{HttpClient, HttpClientConfig};
use ratelimiter::LimitDefinition;
use tokio::process::{Child, Command};

/// How long the server may take to answer after it started, in ms.
pub const STARTUP_MS_MAX: u64 = 20_000;
/// How often readiness is probed while it starts, in ms.
pub const STARTUP_PROBE_MS: u64 = 50;

/// A running `ratelimiterd` child process.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
    url: String,
    dir: PathBuf,
}

/// Where the `ratelimiterd` binary is: `explicit`, else beside this binary, else on PATH.
pub fn locate_binary(explicit: Option<&Path>) -> PathBuf {
    if let Some(path) = explicit {
        return path.to_owned();
    }
    let sibling = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("ratelimiterd")))
        .filter(|path| path.is_file());
    sibling.unwrap_or_else(|| PathBuf::from("ratelimiterd"))
}

impl ServerProcess {
    /// Starts `binary` on a free loopback port and waits until it answers. With
    /// `tigerbeetle_addresses` its backend is that cluster, else memory.
    pub async fn start(binary: &Path, tigerbeetle_addresses: Option<&str>) -> Result<Self, String> {
        let port = free_port().await?;
        let dir = std::env::temp_dir().join(format!("replay-ratelimiterd-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let config = config_yaml(port, &dir.join("limits.json"), tigerbeetle_addresses);
        let config_path = dir.join("config.yaml");
        std::fs::write(&config_path, config).map_err(|e| format!("{}: {e}", config_path.display()))?;
        let log_path = dir.join("ratelimiterd.log");
        let log = std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
        let child = Command::new(binary)
            .arg("--config")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
        let mut server = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            dir,
        };
        server.wait_ready().await?;
        Ok(server)
    }

    /// The server's base URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    async fn wait_ready(&mut self) -> Result<(), String> {
        let client = client(&self.url)?;
        for _ in 0..STARTUP_MS_MAX / STARTUP_PROBE_MS {
            if let Ok(Some(status)) = self.child.try_wait() {
                let log = std::fs::read_to_string(self.dir.join("ratelimiterd.log")).unwrap_or_default();
                return Err(format!("ratelimiterd exited with {status}: {log}"));
            }
            if client.limits().await.is_ok() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(STARTUP_PROBE_MS)).await;
        }
        Err(format!("ratelimiterd did not answer within {STARTUP_MS_MAX} ms"))
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The server's configuration: memory backend, or the TigerBeetle cluster at
/// `tigerbeetle_addresses` (comma-separated).
fn config_yaml(port: u16, registry: &Path, tigerbeetle_addresses: Option<&str>) -> String {
    let backend = if tigerbeetle_addresses.is_some() {
        "tigerbeetle"
    } else {
        "memory"
    };
    let mut config = format!(
        "server:\n  listen_addr: \"127.0.0.1:{port}\"\n  backend: {backend}\nregistry:\n  path: \"{}\"\nlog:\n  level: warn\n",
        registry.display()
    );
    if let Some(addresses) = tigerbeetle_addresses {
        let quoted: Vec<String> = addresses.split(',').map(|a| format!("\"{}\"", a.trim())).collect();
        config.push_str(&format!(
            "tigerbeetle:\n  cluster_id: \"0\"\n  addresses: [{}]\n",
            quoted.join(", ")
        ));
    }
    config
}

/// A client of the server at `url`.
pub fn client(url: &str) -> Result<HttpClient, String> {
    HttpClient::new(HttpClientConfig::new(url)).map_err(|e| format!("client for {url}: {e}"))
}

/// Defines `definitions` on the server at `url`.
pub async fn define_limits(url: &str, definitions: &[LimitDefinition]) -> Result<(), String> {
    let client = client(url)?;
    for definition in definitions {
        client
            .put_limit(definition)
            .await
            .map_err(|e| format!("defining {} on {url}: {e}", definition.key()))?;
    }
    Ok(())
}

/// A loopback port free right now (the OS picks it; the server binds it next).
async fn free_port() -> Result<u16, String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("no free port: {e}"))?;
    Ok(listener.local_addr().map_err(|e| e.to_string())?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_names_the_backend_and_every_cluster_address() {
        let registry = Path::new("/tmp/r/limits.json");
        let memory = config_yaml(7000, registry, None);
        assert!(memory.contains("  backend: memory\n"), "{memory}");
        assert!(!memory.contains("tigerbeetle"), "{memory}");
        let tigerbeetle = config_yaml(7000, registry, Some("127.0.0.1:3000, 127.0.0.1:3001"));
        assert!(tigerbeetle.contains("  backend: tigerbeetle\n"), "{tigerbeetle}");
        assert!(
            tigerbeetle.ends_with(
                "tigerbeetle:\n  cluster_id: \"0\"\n  addresses: [\"127.0.0.1:3000\", \"127.0.0.1:3001\"]\n"
            ),
            "{tigerbeetle}"
        );
    }
}
