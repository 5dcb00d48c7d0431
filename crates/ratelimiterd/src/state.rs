//! What every handler shares: the backend, the admin side, metrics, auth and the
//! request limits. Cheap to clone (one `Arc`).

use std::sync::Arc;
use std::time::Duration;

use ratelimiter::admin::Admin;
use ratelimiter::directory::{Directory, DirectoryStore};
use ratelimiter::metrics::BackendMetrics;
use ratelimiter::registry::Registry;
use ratelimiter::spend::{spend_path, SpendBook, SpendLedger};
use ratelimiter::Backend;
use tokio::sync::Semaphore;

use crate::auth::Auth;
use crate::backend::SelectedBackend;
use crate::config::Config;
use crate::console::Console;
use crate::directory_setup::GatewayScope;
use crate::metrics::Metrics;
use crate::snapshots::MemorySnapshots;

/// The state behind every route.
#[derive(Clone)]
pub struct AppState {
    shared: Arc<Shared>,
}

/// A handle on the state that does not keep it alive: what the gateway, which
/// the state holds, keeps to reach back into the server.
#[derive(Clone)]
pub struct WeakAppState(std::sync::Weak<Shared>);

impl WeakAppState {
    /// The state, while the server runs.
    pub fn upgrade(&self) -> Option<AppState> {
        self.0.upgrade().map(|shared| AppState { shared })
    }
}

struct Shared {
    backend: Arc<dyn Backend>,
    backend_metrics: Arc<dyn BackendMetrics>,
    snapshots: Option<Arc<MemorySnapshots>>,
    admin: Admin,
    metrics: Arc<Metrics>,
    auth: Arc<Auth>,
    permits: Arc<Semaphore>,
    body_bytes_max: usize,
    request_timeout: Duration,
    echo_route: bool,
    gateway_metrics: std::sync::OnceLock<Arc<gateway::metrics::GatewayMetrics>>,
    gateway: std::sync::OnceLock<Arc<gateway::Gateway>>,
    /// The tracer of the limiter's API, when the server exports traces.
    api_tracer: std::sync::OnceLock<Arc<crate::telemetry::api_trace::ApiTracer>>,
    /// Where the gateway's prices are read again, with a gateway started from a file.
    price_reload: std::sync::OnceLock<Arc<crate::price_reload::PriceReload>>,
    console: Arc<Console>,
    /// The store of the gateway's tenants and keys the backend keeps (the
    /// cluster), until [`AppState::open_directory`] opens it.
    directory_store: std::sync::Mutex<Option<Arc<dyn DirectoryStore>>>,
    directory: std::sync::OnceLock<Arc<Directory>>,
    gateway_scope: GatewayScope,
    /// Where the gateway shares the stored ids it hands to tenants with the fleet.
    handed_ids: Option<Arc<dyn ratelimiter::handed_ids::HandedIdStore>>,
    /// Where the gateway claims each budget alert with the fleet.
    alert_claims: Option<Arc<dyn ratelimiter::alert_claims::AlertClaims>>,
    /// The book of the gateway's spend the backend keeps (the cluster), until
    /// [`AppState::open_spend`] opens the server's.
    spend_book: std::sync::Mutex<Option<Arc<dyn SpendBook>>>,
    spend: std::sync::OnceLock<Arc<dyn SpendBook>>,
}

impl AppState {
    /// The one constructor: the state of a validated configuration, the backend
    /// chosen at startup (with its metrics) and the opened registry (`None`
    /// for a backend that keeps the definitions itself).
    pub fn new(selected: SelectedBackend, registry: Option<Registry>, config: &Config) -> Self {
        let server = &config.server;
        Self {
            shared: Arc::new(Shared {
                admin: Admin::new(selected.backend.clone(), registry),
                backend: selected.backend,
                backend_metrics: selected.metrics,
                snapshots: selected.snapshots,
                metrics: Arc::new(Metrics::default()),
                auth: Arc::new(
                    Auth::from_config(server.admin_token.as_deref(), &server.client_tokens)
                        .with_allowed_hosts(&server.allowed_hosts),
                ),
                permits: Arc::new(Semaphore::new(server.concurrent_requests_max)),
                body_bytes_max: server.body_bytes_max,
                request_timeout: Duration::from_millis(server.request_timeout_ms),
                echo_route: server.echo_route,
                gateway_metrics: std::sync::OnceLock::new(),
                gateway: std::sync::OnceLock::new(),
                api_tracer: std::sync::OnceLock::new(),
                price_reload: std::sync::OnceLock::new(),
                console: Arc::new(Console::new(config)),
                directory_store: std::sync::Mutex::new(selected.directory_store),
                directory: std::sync::OnceLock::new(),
                gateway_scope: GatewayScope::of(config),
                handed_ids: selected.handed_ids,
                alert_claims: selected.alert_claims,
                spend_book: std::sync::Mutex::new(selected.spend_book),
                spend: std::sync::OnceLock::new(),
            }),
        }
    }

    /// The backend chosen at startup.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.shared.backend
    }
    /// The backend's own counters.
    pub fn backend_metrics(&self) -> &Arc<dyn BackendMetrics> {
        &self.shared.backend_metrics
    }
    /// The memory backend's snapshots, when it is the backend.
    pub fn snapshots(&self) -> Option<&Arc<MemorySnapshots>> {
        self.shared.snapshots.as_ref()
    }
    /// Limit definitions: registry and backend together.
    pub fn admin(&self) -> &Admin {
        &self.shared.admin
    }
    /// The exported metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }
    /// The configured tokens.
    pub fn auth(&self) -> &Arc<Auth> {
        &self.shared.auth
    }
    /// One permit per request in flight; none left means shed.
    pub fn permits(&self) -> &Arc<Semaphore> {
        &self.shared.permits
    }
    /// The largest body read.
    pub fn body_bytes_max(&self) -> usize {
        self.shared.body_bytes_max
    }
    /// How long a request may take.
    pub fn request_timeout(&self) -> Duration {
        self.shared.request_timeout
    }
    /// The gateway's metrics, once a gateway runs beside this server: `/metrics`
    /// renders them with the server's own.
    pub fn gateway_metrics(&self) -> Option<&Arc<gateway::metrics::GatewayMetrics>> {
        self.shared.gateway_metrics.get()
    }
    /// Attaches the gateway's metrics (once; a second call is ignored).
    pub fn set_gateway_metrics(&self, metrics: Arc<gateway::metrics::GatewayMetrics>) {
        let _ = self.shared.gateway_metrics.set(metrics);
    }
    /// The tracer of `/v1/reserve` and `/v1/complete`, when the server exports traces.
    pub fn api_tracer(&self) -> Option<&Arc<crate::telemetry::api_trace::ApiTracer>> {
        self.shared.api_tracer.get()
    }
    /// Attaches the API's tracer (once; a second call is ignored).
    pub fn set_api_tracer(&self, tracer: Arc<crate::telemetry::api_trace::ApiTracer>) {
        let _ = self.shared.api_tracer.set(tracer);
    }
    /// A handle on this state that does not keep it alive.
    pub fn downgrade(&self) -> WeakAppState {
        WeakAppState(Arc::downgrade(&self.shared))
    }
    /// The gateway running beside this server, for the console's view of its models.
    pub fn gateway(&self) -> Option<&Arc<gateway::Gateway>> {
        self.shared.gateway.get()
    }
    /// Where the gateway's prices are read again, once set at start.
    pub fn price_reload(&self) -> Option<&Arc<crate::price_reload::PriceReload>> {
        self.shared.price_reload.get()
    }
    /// Attaches the gateway's price reload (once; a second call is ignored).
    pub fn set_price_reload(&self, reload: Arc<crate::price_reload::PriceReload>) {
        let _ = self.shared.price_reload.set(reload);
    }
    /// Attaches the gateway and its metrics (once; a second call is ignored).
    pub fn set_gateway(&self, gateway: Arc<gateway::Gateway>) {
        self.set_gateway_metrics(gateway.metrics().clone());
        let _ = self.shared.gateway.set(gateway);
    }
    /// The operator's console: its access rule and history.
    pub fn console(&self) -> &Arc<Console> {
        &self.shared.console
    }
    /// Whether `POST /v1/echo` is served.
    pub fn echo_route(&self) -> bool {
        self.shared.echo_route
    }
    /// The gateway's tenants and keys, once [`AppState::open_directory`] opened them.
    pub fn directory(&self) -> Option<&Arc<Directory>> {
        self.shared.directory.get()
    }
    /// Where the gateway shares the stored ids it hands to tenants with the
    /// servers of its fleet (the cluster); `None` on one server.
    pub fn handed_ids(&self) -> Option<&Arc<dyn ratelimiter::handed_ids::HandedIdStore>> {
        self.shared.handed_ids.as_ref()
    }
    /// Where the gateway claims each budget alert with the servers of its
    /// fleet (the cluster), so one of them alerts it; `None` on one server.
    pub fn alert_claims(&self) -> Option<&Arc<dyn ratelimiter::alert_claims::AlertClaims>> {
        self.shared.alert_claims.as_ref()
    }

    /// What the gateway's configuration lets a tenant or key name.
    pub fn gateway_scope(&self) -> &GatewayScope {
        &self.shared.gateway_scope
    }
    /// Opens the gateway's tenants and keys (docs/gateway.md, "Tenants and
    /// keys"): in the backend's store when it keeps one, else in the file
    /// beside `config`'s registry; once (a second call changes nothing).
    pub async fn open_directory(&self, config: &Config, clock: Arc<dyn ratelimiter::Clock>) -> Result<(), String> {
        if self.directory().is_some() {
            return Ok(());
        }
        let store = self.shared.directory_store.lock().expect("directory store lock").take();
        let directory = crate::directory_setup::open(config, store, clock).await?;
        let _ = self.shared.directory.set(directory);
        Ok(())
    }
    /// The gateway's spend ledger, once [`AppState::open_spend`] opened it.
    pub fn spend(&self) -> Option<&Arc<dyn SpendBook>> {
        self.shared.spend.get()
    }
    /// Opens the gateway's spend ledger (docs/gateway.md, "The spend ledger"):
    /// the backend's when it keeps one (the cluster), else the file beside
    /// `config`'s registry, read whole; once (a second call changes nothing).
    pub fn open_spend(&self, config: &Config) -> Result<(), String> {
        if self.spend().is_some() {
            return Ok(());
        }
        let book = match self.shared.spend_book.lock().expect("spend book lock").take() {
            Some(book) => book,
            None => Arc::new(SpendLedger::open(spend_path(&config.registry.path))?) as Arc<dyn SpendBook>,
        };
        let _ = self.shared.spend.set(book);
        Ok(())
    }
}
