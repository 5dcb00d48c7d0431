//! Backend selection: chosen once at startup from `server.backend` and used
//! behind `Arc<dyn Backend>` from then on.

use std::sync::Arc;

use ratelimiter::memory::{MemoryBackend, MemoryConfig};
use ratelimiter::{Backend, SystemClock};

use crate::config::{BackendKind, Config};

/// The backend chosen at startup. The memory backend is kept by its type as well,
/// so its counters can be exported as metrics.
pub enum SelectedBackend {
    /// The in-process memory backend.
    Memory(Arc<MemoryBackend>),
    /// Any other backend.
    Other(Arc<dyn Backend>),
}

/// Builds the configured backend. The error says what to fix.
pub async fn build(config: &Config) -> Result<SelectedBackend, String> {
    match config.server.backend {
        BackendKind::Memory => Ok(SelectedBackend::Memory(Arc::new(MemoryBackend::new(
            Arc::new(SystemClock::new()),
            memory_config(config),
        )))),
        BackendKind::Tigerbeetle => build_tigerbeetle(config).await.map(SelectedBackend::Other),
    }
}

/// The memory backend's settings from the server's configuration.
pub fn memory_config(config: &Config) -> MemoryConfig {
    MemoryConfig {
        retry_policy: config.retry_policy,
        decrease_retry_ms: config.decrease.retry_ms,
        leases_max: config.memory.leases_max,
        failed_leases_max: config.memory.failed_leases_max,
    }
}

#[cfg(feature = "tigerbeetle")]
async fn build_tigerbeetle(_config: &Config) -> Result<Arc<dyn Backend>, String> {
    // The TigerBeetle backend (`src/tigerbeetle/`) plugs in here.
    Err("server.backend \"tigerbeetle\": the TigerBeetle backend is not part of this build yet".to_owned())
}

#[cfg(not(feature = "tigerbeetle"))]
async fn build_tigerbeetle(_config: &Config) -> Result<Arc<dyn Backend>, String> {
    Err("server.backend \"tigerbeetle\" needs a ratelimiterd built with `--features tigerbeetle`".to_owned())
}
