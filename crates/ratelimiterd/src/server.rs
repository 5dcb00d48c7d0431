//! Startup and serving: build the backend, open the registry, re-apply every
//! persisted state, listen, run the decrease task, and shut down gracefully.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ratelimiter::registry::{Registry, RegistryError};
use tokio::net::TcpListener;

use crate::app::app;
use crate::config::Config;
use crate::shutdown::Shutdown;
use crate::snapshots::MemorySnapshots;
use crate::state::AppState;
use crate::telemetry::export::Exporting;
use crate::{backend, connections, decrease};

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The backend could not be built.
    #[error("backend: {0}")]
    Backend(String),
    /// The registry file is unreadable or invalid (the message names the file and entry).
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// A persisted state could not be applied to the backend at startup.
    #[error("registry {path}: re-applying the persisted limits failed: {message}")]
    Restore {
        /// The registry file.
        path: PathBuf,
        /// The backend's error.
        message: String,
    },
    /// The memory snapshot could not be restored (the message names the file
    /// and what the operator can do).
    #[error("{0}")]
    Snapshot(String),
    /// The gateway's tenants and keys could not be read (the message names
    /// the file and line, or the cluster's error).
    #[error("{0}")]
    Directory(String),
    /// The gateway could not start (a key missing from the environment, a limit
    /// the backend refused).
    #[error("gateway: {0}")]
    Gateway(String),
    /// The OpenTelemetry export could not start (an entry or variable named).
    #[error("{0}")]
    Telemetry(String),
    /// The listen address could not be bound, or serving failed.
    #[error("listen {addr}: {source}")]
    Io {
        /// The address.
        addr: SocketAddr,
        /// The operating system's error.
        source: std::io::Error,
    },
}

/// How [`serve`] runs besides the router.
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// How often pending decreases are checked.
    pub decrease_check_interval: Duration,
    /// How long in-flight requests get after shutdown fires.
    pub shutdown_grace: Duration,
    /// The most connections open at once.
    pub connections_max: usize,
    /// How often the memory backend's state is saved; `None`: only at the stop.
    pub snapshot_interval: Option<Duration>,
    /// How long the limiter's clients may take to send headers and to read answers.
    pub timeouts: connections::ClientTimeouts,
}

impl ServeOptions {
    /// The options of a configuration.
    pub fn from_config(config: &Config) -> Self {
        Self {
            decrease_check_interval: Duration::from_millis(config.decrease.check_interval_ms),
            shutdown_grace: Duration::from_millis(config.server.shutdown_grace_ms),
            connections_max: config.server.connections_max,
            snapshot_interval: (config.memory.snapshot_interval_ms > 0)
                .then(|| Duration::from_millis(config.memory.snapshot_interval_ms)),
            timeouts: connections::ClientTimeouts::of_server(
                config.server.client_header_timeout_ms,
                config.server.client_write_timeout_ms,
            ),
        }
    }
}

/// Builds the server's state from `config`: the backend, the registry, every
/// persisted state applied to the backend, the directory of tenants and keys
/// with the limits derived from it, then (memory backend) the live state of
/// the last snapshot, then the definitions of the `profiles:` entries. On TigerBeetle the cluster keeps the
/// definitions: the registry file is not used, except that limits of a file
/// written by a server of the same data directory before are moved into the
/// cluster once.
pub async fn start(config: &Config) -> Result<AppState, ServerError> {
    let state = restore(config).await?;
    let started = std::time::Instant::now();
    state
        .open_directory(config, Arc::new(ratelimiter::SystemClock::new()))
        .await
        .map_err(ServerError::Directory)?;
    if let Some(directory) = state.directory() {
        let (tenants, keys) = directory.sizes();
        tracing::info!(
            tenants,
            keys,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "gateway tenants and keys read"
        );
    }
    // A tenant written by a server stopped before it defined the tenant's limits.
    let defined = crate::tenant_limits::define_missing_at_start(&state)
        .await
        .map_err(|e| ServerError::Directory(format!("defining the API tenants' limits: {e}")))?;
    if defined > 0 {
        tracing::info!(defined, "gateway: missing tenant limits defined at start");
    }
    define_key_limits(&state).await?;
    // The memory backend's live state comes after the limits it refers to
    // (the keys' own, derived from the directory, included).
    if let Some(snapshots) = state.snapshots() {
        snapshots
            .restore_at_start(config.memory.damaged_snapshot)
            .map_err(ServerError::Snapshot)?;
    }
    if config.gateway.is_some() {
        state.open_spend(config).map_err(ServerError::Gateway)?;
    }
    for entry in &config.profiles {
        let profile = entry.profile().expect("profiles are validated at load");
        for definition in profile.definitions {
            state
                .admin()
                .define(definition)
                .await
                .map_err(|e| ServerError::Restore {
                    path: config.registry.path.clone(),
                    message: format!("profile {}/{}: {e}", entry.provider, entry.model),
                })?;
        }
    }
    Ok(state)
}

/// The own limits of every key of the directory, from their records
/// (`key_limits.rs`): on the memory backend, where the registry file does not
/// hold them, all of them at every start.
async fn define_key_limits(state: &AppState) -> Result<(), ServerError> {
    let Some(directory) = state.directory().filter(|d| d.sizes().1 > 0) else {
        return Ok(());
    };
    let started = std::time::Instant::now();
    let defined = crate::key_limits::define_at_start(state, directory)
        .await
        .map_err(|e| ServerError::Directory(format!("defining the gateway keys' own limits: {e}")))?;
    tracing::info!(
        missing = defined.missing,
        budgets_redefined = defined.budgets_redefined,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "gateway keys' own limits defined"
    );
    Ok(())
}

/// [`start`] before the directory is read and the `profiles:` entries are
/// defined (and, on the memory backend, before its snapshot is restored).
async fn restore(config: &Config) -> Result<AppState, ServerError> {
    let backend = backend::build(config).await.map_err(ServerError::Backend)?;
    let restore_error = |e: ratelimiter::admin::AdminError| ServerError::Restore {
        path: config.registry.path.clone(),
        message: e.to_string(),
    };
    if !backend.backend.keeps_definitions() {
        let state = AppState::new(backend, Some(Registry::open(&config.registry.path)?), config);
        let restored = state.admin().restore().await.map_err(restore_error)?;
        tracing::info!(restored, registry = %config.registry.path.display(), "limits restored");
        return Ok(state);
    }
    let state = AppState::new(backend, None, config);
    let defined = state.admin().restore().await.map_err(restore_error)?;
    tracing::info!(defined, "limits read from the cluster");
    if config.registry.path.exists() {
        let states = Registry::open(&config.registry.path)?.states().cloned().collect();
        let imported = state.admin().import(states).await.map_err(restore_error)?;
        if imported > 0 {
            tracing::info!(imported, registry = %config.registry.path.display(),
                "limits of the registry file moved into the cluster, which keeps them from now on");
        }
    }
    Ok(state)
}

/// Runs the server of `config` until `shutdown` completes; with a `gateway:`
/// section, the gateway too, on its own listener, on the same backend.
pub async fn run(config: Config, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), ServerError> {
    let state = start(&config).await?;
    let addr = config.listen_addr();
    let listener = connections::listen(addr).map_err(|source| ServerError::Io { addr, source })?;
    // A backend shared by a fleet lists this server by its host and bound address.
    let bound = listener.local_addr().unwrap_or(addr).to_string();
    if let Err(e) = state.backend().name_server(&crate::backend::host_name(), &bound) {
        tracing::warn!(error = %e, "this server could not be named to the backend; the fleet will not list it");
    }
    let options = ServeOptions::from_config(&config);
    let shutdown = Shutdown::new(shutdown);
    // The limiter's API and the gateway's calls are traced once an endpoint is set.
    let resolved = (config.telemetry.resolve(&|name| std::env::var(name).ok())).map_err(ServerError::Telemetry)?;
    let exporting = match resolved {
        Some(resolved) => {
            Some(Exporting::start(&resolved, state.metrics().otel_dropped.clone()).map_err(ServerError::Telemetry)?)
        }
        None => None,
    };
    if let Some(tracer) = exporting.as_ref().and_then(Exporting::api_tracer) {
        state.set_api_tracer(Arc::new(tracer));
    }
    let telemetry = exporting.as_ref().map(|e| e.gateway.clone());
    let gateway = match &config.gateway {
        Some(section) => Some(start_gateway(section, &state, (options, telemetry), shutdown.clone()).await?),
        None => None,
    };
    let reload = (state.gateway()).and_then(|g| crate::price_reload::PriceReload::of(&config, g.clone()));
    let hangup = match reload.map(Arc::new) {
        Some(reload) => {
            let listening = reload.reload_on_hangup();
            state.set_price_reload(reload);
            listening
        }
        None if config.gateway.is_some() => {
            crate::signals::nothing_to_reload_on_hangup("the configuration was not read from a file")
        }
        None => crate::signals::nothing_to_reload_on_hangup("no gateway section: no prices"),
    };
    hangup.map_err(|source| ServerError::Io { addr, source })?;
    let result = serve(listener, state, options, shutdown.wait())
        .await
        .map_err(|source| ServerError::Io { addr, source });
    if let Some(gateway) = gateway {
        let _ = gateway.await;
    }
    if let Some(exporting) = exporting {
        exporting.shutdown().await;
    }
    result
}

/// Defines the gateway's limits in the registry (where the admin API shows and
/// changes them), binds its listener and serves it until `shutdown`.
pub async fn start_gateway(
    section: &gateway::GatewayConfig,
    state: &AppState,
    (options, telemetry): (ServeOptions, Option<Arc<gateway::observe::trace::Telemetry>>),
    shutdown: Shutdown,
) -> Result<tokio::task::JoinHandle<()>, ServerError> {
    let mut gateway = gateway::Gateway::new(section, state.backend().clone()).map_err(ServerError::Gateway)?;
    if let Some(directory) = state.directory() {
        let limits = crate::tenant_limits::MissingTenantLimits(state.downgrade());
        gateway = (gateway.with_directory(directory.clone())).with_tenant_limits(std::sync::Arc::new(limits));
    }
    if let Some(handed_ids) = state.handed_ids() {
        gateway = gateway.with_handed_ids(handed_ids.clone());
    }
    if let Some(claims) = state.alert_claims() {
        gateway = gateway.with_alert_claims(claims.clone());
    }
    if let Some(book) = state.spend() {
        gateway = gateway.with_spend(book.clone(), Arc::new(ratelimiter::SystemClock::new()));
    }
    if let Some(telemetry) = telemetry {
        gateway = gateway.with_telemetry(telemetry);
    }
    for definition in gateway.definitions() {
        state
            .admin()
            .define(definition.clone())
            .await
            .map_err(|e| ServerError::Gateway(format!("defining {}: {e}", definition.key())))?;
    }
    let gateway = std::sync::Arc::new(gateway);
    state.set_gateway(gateway.clone());
    let addr = crate::config::parse_listen_addr(&section.listen_addr).expect("validated at load");
    let listener = connections::listen(addr).map_err(|source| ServerError::Io { addr, source })?;
    tracing::info!(gateway_addr = %listener.local_addr().unwrap_or(addr), "gateway serving");
    let router = gateway::router(gateway);
    let timeouts = connections::ClientTimeouts {
        header_read: Duration::from_millis(section.client_header_timeout_ms),
        write_stall: Some(Duration::from_millis(section.client_write_timeout_ms)),
    };
    Ok(tokio::spawn(connections::serve_with(
        listener,
        router,
        options.connections_max,
        timeouts,
        shutdown,
        options.shutdown_grace,
    )))
}

/// The stop's snapshot, once no request runs any more: it holds every grant.
/// The periodic task finishes the save it may be making first (they share the
/// temporary file).
async fn save_at_stop(snapshots: &Arc<MemorySnapshots>, periodic: Option<tokio::task::JoinHandle<()>>) {
    if let Some(periodic) = periodic {
        let _ = periodic.await;
    }
    if snapshots.save_in_background().await {
        tracing::info!(snapshot = %snapshots.path().display(), "memory snapshot saved at stop");
    }
}

/// Serves `state` on `listener` until `shutdown` completes, then stops accepting,
/// lets in-flight requests finish for up to the grace period, and returns.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let local = listener.local_addr()?;
    let shutdown = Shutdown::new(shutdown);
    let decreases = tokio::spawn(decrease::run(
        state.clone(),
        options.decrease_check_interval,
        shutdown.clone(),
    ));
    let console = tokio::spawn(crate::console::sampler::sample(state.clone(), shutdown.clone()));
    let snapshots = state.snapshots().cloned();
    let periodic = match (&snapshots, options.snapshot_interval) {
        (Some(snapshots), Some(interval)) => Some(tokio::spawn(snapshots.clone().run(interval, shutdown.clone()))),
        _ => None,
    };
    tracing::info!(addr = %local, "listening");
    connections::serve_with(
        listener,
        app(state),
        options.connections_max,
        options.timeouts,
        shutdown,
        options.shutdown_grace,
    )
    .await;
    // The decrease task stops at its next check of the signal; a change it is
    // making (persist, then apply) is let finish, within the grace period.
    if tokio::time::timeout(options.shutdown_grace, decreases).await.is_err() {
        tracing::warn!("the decrease task did not stop within the grace period");
    }
    console.abort();
    if let Some(snapshots) = snapshots {
        save_at_stop(&snapshots, periodic).await;
    }
    tracing::info!("stopped");
    Ok(())
}
