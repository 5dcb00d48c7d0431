//! Backend selection: chosen once at startup from `server.backend` and used
//! behind `Arc<dyn Backend>` from then on.

use std::sync::Arc;

use ratelimiter::memory::{MemoryBackend, MemoryConfig};
use ratelimiter::metrics::BackendMetrics;
use ratelimiter::{Backend, SystemClock};

use crate::config::{BackendKind, Config};
use crate::snapshots::{snapshot_path, MemoryMetrics, MemorySnapshots};

/// The backend chosen at startup, and the same backend as the exporter of its
/// own counters.
pub struct SelectedBackend {
    /// Serves every request.
    pub backend: Arc<dyn Backend>,
    /// Appends the backend's counters to `/metrics`.
    pub metrics: Arc<dyn BackendMetrics>,
    /// The memory backend's snapshots; `None` on TigerBeetle, which keeps its
    /// state itself.
    pub snapshots: Option<Arc<MemorySnapshots>>,
    /// Where the gateway's tenants and keys are kept when the backend keeps
    /// them (TigerBeetle's cluster); `None`: a file beside the registry.
    pub directory_store: Option<Arc<dyn ratelimiter::directory::DirectoryStore>>,
    /// Where the gateway's servers share the stored ids they hand to tenants
    /// (TigerBeetle's cluster); `None`: each server remembers its own.
    pub handed_ids: Option<Arc<dyn ratelimiter::handed_ids::HandedIdStore>>,
    /// Where the gateway's servers claim each budget alert, so that one of
    /// them alerts it (the cluster); `None`: one server alerts what it sees.
    pub alert_claims: Option<Arc<dyn ratelimiter::alert_claims::AlertClaims>>,
    /// Where the gateway's spend is kept when the backend keeps it (the
    /// cluster); `None`: a file beside the registry.
    pub spend_book: Option<Arc<dyn ratelimiter::spend::SpendBook>>,
}

impl SelectedBackend {
    /// Serves `backend` and exports its counters; no snapshots (a backend
    /// that keeps its state itself, or a test's).
    pub fn of<B: Backend + BackendMetrics + 'static>(backend: Arc<B>) -> Self {
        Self {
            backend: backend.clone(),
            metrics: backend,
            snapshots: None,
            directory_store: None,
            handed_ids: None,
            alert_claims: None,
            spend_book: None,
        }
    }

    /// The memory backend with its snapshots beside the registry.
    fn memory(backend: MemoryBackend, config: &Config) -> Self {
        let backend = Arc::new(backend);
        let path = snapshot_path(&config.registry.path);
        let snapshots = Arc::new(MemorySnapshots::new(backend.clone(), path));
        Self {
            backend: backend.clone(),
            metrics: Arc::new(MemoryMetrics {
                backend,
                snapshots: snapshots.clone(),
            }),
            snapshots: Some(snapshots),
            directory_store: None,
            handed_ids: None,
            alert_claims: None,
            spend_book: None,
        }
    }
}

/// Builds the configured backend. The error says what to fix.
pub async fn build(config: &Config) -> Result<SelectedBackend, String> {
    match config.server.backend {
        BackendKind::Memory => Ok(SelectedBackend::memory(
            MemoryBackend::new(Arc::new(SystemClock::new()), memory_config(config)),
            config,
        )),
        BackendKind::Tigerbeetle => build_tigerbeetle(config).await,
    }
}

/// The memory backend's settings from the server's configuration.
pub fn memory_config(config: &Config) -> MemoryConfig {
    MemoryConfig {
        retry_policy: config.retry_policy,
        decrease_retry_ms: config.decrease.retry_ms,
        leases_max: config.memory.leases_max,
        lease_share_percent: config.memory.lease_share_percent,
        settled_leases_max: config.memory.settled_leases_max,
        failed_leases_max: config.memory.failed_leases_max,
        window_margin_ms: config.defaults.window_margin_ms,
    }
}

#[cfg(feature = "tigerbeetle")]
async fn build_tigerbeetle(config: &Config) -> Result<SelectedBackend, String> {
    use ratelimiter::retry::{Jitter, RetryAdvisor, TRACKED_KEYS_MAX_DEFAULT};
    use ratelimiter::tigerbeetle::{BackendOptions, TigerBeetleBackend, TigerBeetleConfig};

    let tb = &config.tigerbeetle;
    let settings = TigerBeetleConfig::new(tb.clone()).map_err(|e| e.to_string())?;
    let options = BackendOptions {
        retry: RetryAdvisor::new(config.retry_policy, TRACKED_KEYS_MAX_DEFAULT, Jitter::from_entropy()),
        decrease_retry_ms: config.decrease.retry_ms,
        clock: Arc::new(SystemClock::new()),
        window_margin_ms: config.defaults.window_margin_ms,
    };
    // The submitter stops when the backend is dropped, after the server's
    // shutdown has drained its requests.
    let backend = TigerBeetleBackend::connect(&settings, options, std::future::pending())
        .map_err(|e| format!("tigerbeetle: {e}"))?;
    // The cluster may come up after the server: requests answer 503 until it
    // does, and /healthz says so.
    if let Err(e) = backend.health().await {
        tracing::warn!(addresses = ?tb.addresses, error = %e, "TigerBeetle does not answer yet");
    }
    let backend = Arc::new(backend);
    // Reads the fleet's definitions until the backend is dropped.
    backend.start_definitions_refresh();
    let directory_store = Arc::new(ratelimiter::tigerbeetle::TigerBeetleDirectoryStore::new(
        backend.clone(),
    ));
    let handed_ids = Arc::new(ratelimiter::tigerbeetle::TigerBeetleHandedIds::new(backend.clone()));
    let alert_claims = Arc::new(ratelimiter::tigerbeetle::TigerBeetleAlertClaims::new(backend.clone()));
    let spend_book = Arc::new(ratelimiter::tigerbeetle::TigerBeetleSpendBook::new(backend.clone()));
    tokio::spawn(read_spend_history(spend_book.clone()));
    Ok(SelectedBackend {
        directory_store: Some(directory_store),
        handed_ids: Some(handed_ids),
        alert_claims: Some(alert_claims),
        spend_book: Some(spend_book),
        ..SelectedBackend::of(backend)
    })
}

/// Reads the fleet's spend ledger once at start, retrying while the cluster
/// is away, so the first report does not read the history.
#[cfg(feature = "tigerbeetle")]
async fn read_spend_history(book: Arc<ratelimiter::tigerbeetle::TigerBeetleSpendBook>) {
    /// Between two tries while the cluster does not answer.
    const RETRY: std::time::Duration = std::time::Duration::from_secs(1);
    let started = std::time::Instant::now();
    while let Err(e) = book.read_history().await {
        tracing::warn!(error = %e, "reading the spend ledger failed; retrying");
        tokio::time::sleep(RETRY).await;
    }
    tracing::info!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        "gateway spend ledger read"
    );
}

/// This host's name, as the fleet's servers are listed by (docs/console.md, "Backend").
pub fn host_name() -> String {
    let from_kernel = std::fs::read_to_string("/proc/sys/kernel/hostname").ok();
    (from_kernel.or_else(|| std::env::var("HOSTNAME").ok()))
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

#[cfg(not(feature = "tigerbeetle"))]
async fn build_tigerbeetle(_config: &Config) -> Result<SelectedBackend, String> {
    Err("server.backend \"tigerbeetle\" needs a ratelimiterd built with `--features tigerbeetle`".to_owned())
}
