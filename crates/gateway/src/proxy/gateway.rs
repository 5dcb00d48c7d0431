//! The gateway built from its configuration: upstreams and keys read, every
//! model's pool and entry made, the admission shared by every call.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderMap;
use ratelimiter::clock::Clock;
use ratelimiter::origin::OriginPolicy;
use ratelimiter::spend::SpendBook;
use ratelimiter::{Backend, LimitDefinition, Limiter, ReserveOutcome, ReserveRequest, SystemClock};

use super::auth::{find_tenant, presented_key, read_tenant_keys, TenantKey};
use super::key_callers::{incorrect_key, Authorized, KeyCallers, TenantLimits};
use super::response_ids::ResponseIds;
use super::upstream::{Upstream, UpstreamClient};
use crate::admission::spend::SpendSink;
use crate::admission::tenant_caps::TenantCaps;
use crate::admission::{Admission, Caller, ModelEntry};
use crate::config::GatewayConfig;
use crate::limits::{self, Classes, TenantKeys};
use crate::observe::budget_watch::BudgetWatch;
use crate::observe::key_usage::{KeyCall, KeyUsage};
use crate::observe::metrics::GatewayMetrics;
use crate::observe::spend_recorder::SpendRecorder;
use crate::observe::status::{ClassStatus, ModelStatus};
use crate::observe::trace::Telemetry;
use crate::routing::Pool;
use crate::wire::call::Endpoint;
use crate::wire::error::{ErrorKind, GatewayError};

/// The gateway: configuration resolved, upstream keys read, the limiter to reserve on.
pub struct Gateway {
    pub(super) admission: Admission,
    pub(super) models: HashMap<String, Arc<ModelEntry>>,
    pub(super) model_names: Vec<String>,
    pub(super) upstreams: Vec<Upstream>,
    tenant_keys: Vec<TenantKey>,
    /// `allow_anonymous`: a call without a key is the caller without a tenant's.
    /// Without it and without tenants, only the directory's keys may call.
    anonymous: bool,
    /// The keys made through the admin API, when the server keeps a directory.
    key_callers: Option<KeyCallers>,
    /// The gateway's `tenant_connections_max` and `tenant_queued_max`, for the directory's tenants.
    caps_default: (usize, usize),
    pub(super) client: UpstreamClient,
    metrics: Arc<GatewayMetrics>,
    /// Each directory key's calls and tokens today on this server.
    key_usage: Arc<KeyUsage>,
    pub(super) body_bytes_max: usize,
    /// How long a client has to send its whole body.
    pub(super) body_timeout: Duration,
    definitions: Vec<LimitDefinition>,
    /// With `allow_anonymous`, the rule for requests from browsers (`proxy/origin.rs`).
    pub(super) origin: Option<OriginPolicy>,
    /// The response ids handed to each tenant (`proxy/response_ids.rs`).
    pub(super) response_ids: Arc<ResponseIds>,
    /// Where completed calls' spend goes, when the server keeps a spend ledger.
    pub(super) spend: Option<Arc<SpendSink>>,
    /// The budget alerts' watch, shared with admission.
    budget_watch: Arc<BudgetWatch>,
    /// Each call's spans, when the server exports traces; `None`: no span is made.
    pub(super) telemetry: Option<Arc<Telemetry>>,
}

/// A limiter view of a backend (the trait object cannot be upcast on this Rust).
struct BackendLimiter(Arc<dyn Backend>);

#[async_trait::async_trait]
impl Limiter for BackendLimiter {
    async fn reserve(&self, request: &ReserveRequest) -> Result<ReserveOutcome, ratelimiter::LimiterError> {
        self.0.reserve(request).await
    }
    async fn complete(&self, request: &ratelimiter::CompleteRequest) -> Result<(), ratelimiter::LimiterError> {
        self.0.complete(request).await
    }
}

impl Gateway {
    /// The gateway of a validated `config` on `backend`; reads the upstream and
    /// tenant keys from the environment (an unset variable is an error).
    pub fn new(config: &GatewayConfig, backend: Arc<dyn Backend>) -> Result<Self, String> {
        let client = UpstreamClient::new(Duration::from_millis(config.upstream_timeout_ms));
        Self::with_client(config, backend, client)
    }

    /// [`Gateway::new`] with its own upstream client (one that trusts a private CA).
    pub fn with_client(
        config: &GatewayConfig,
        backend: Arc<dyn Backend>,
        client: UpstreamClient,
    ) -> Result<Self, String> {
        Self::with_clock(config, backend, client, Arc::new(SystemClock::new()))
    }

    /// [`Gateway::with_client`] on `clock`: the deployments' load windows, their
    /// breakers and this server's pauses after a provider 429 count on it (the
    /// latency histograms and the call's log measure real time; the socket, body
    /// and queue timeouts run on tokio's timer).
    pub fn with_clock(
        config: &GatewayConfig,
        backend: Arc<dyn Backend>,
        client: UpstreamClient,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, String> {
        config.validate().map_err(|e| e.to_string())?;
        let upstreams = (config.upstreams.iter().cloned())
            .map(Upstream::new)
            .collect::<Result<Vec<_>, _>>()?;
        let metrics = Arc::new(GatewayMetrics::default());
        let definitions = limits::definitions(config);
        let tenant_keys = read_tenant_keys(&config.tenants)?;
        if config.allow_anonymous {
            tracing::warn!(gateway_addr = %config.listen_addr,
                "gateway: allow_anonymous is set: anyone who reaches the listener may call, without a key");
        }
        let classes = Arc::new(Classes::new(&config.classes));
        let callers = callers(config, &classes);
        let mut models = HashMap::new();
        for model in &config.models {
            let usd = limits::model_budget_keys(config, model);
            let pool = Arc::new(Pool::of(model, &config.upstreams, (&definitions, &usd), &clock));
            for deployment in &pool.deployments {
                metrics.add_deployment(deployment.state.clone());
            }
            // The wire format: the first deployment's, which every other one shares.
            let first = &pool.deployments[0];
            let kind = upstreams[first.upstream].config.format_of(&first.config.name);
            let entry = ModelEntry::new(model, (pool, kind), callers.len(), &classes, &metrics);
            warn_bounds_above_limits(&entry);
            // The vocabulary loads on first use: at startup, not on a client's first call.
            entry.counter.text("warm");
            models.insert(model.name.clone(), Arc::new(entry));
        }
        let limiter: Arc<dyn Limiter> = Arc::new(BackendLimiter(backend.clone()));
        let budget_watch = BudgetWatch::of(config, backend.clone(), clock.clone());
        if let Some(webhook) = budget_watch.webhook() {
            let _ = metrics.alert_webhook.set(webhook.counts().clone());
        }
        let _ = metrics.budget_watch.set(budget_watch.clone());
        Ok(Self {
            admission: Admission::new((limiter, backend.clone()), callers, classes, metrics.clone())
                .with_budget_watch(Some(budget_watch.clone())),
            models,
            model_names: config.models.iter().map(|m| m.name.clone()).collect(),
            upstreams,
            tenant_keys,
            anonymous: config.allow_anonymous,
            key_callers: None,
            caps_default: (config.tenant_connections_max, config.tenant_queued_max),
            client,
            metrics,
            key_usage: Arc::new(KeyUsage::new(clock.clone())),
            body_bytes_max: config.body_bytes_max,
            body_timeout: Duration::from_millis(config.client_body_timeout_ms),
            definitions,
            origin: config
                .allow_anonymous
                .then(|| OriginPolicy::new(&config.allowed_hosts, true)),
            response_ids: Arc::new(ResponseIds::default()),
            spend: None,
            budget_watch,
            telemetry: None,
        })
    }

    /// Reads the keys a gateway of `config` reads at start, from the
    /// environment, in the same order and by the same functions, and fails as
    /// the start would (an unset, empty or shared key, naming its variable):
    /// `ratelimiterd check-config` says what `serve` would refuse.
    pub fn check_keys(config: &GatewayConfig) -> Result<(), String> {
        for upstream in &config.upstreams {
            Upstream::new(upstream.clone())?;
        }
        read_tenant_keys(&config.tenants).map(drop)
    }

    /// The limit definitions the configuration implies; the server defines them
    /// in its registry at startup, where the admin API shows and changes them.
    pub fn definitions(&self) -> &[LimitDefinition] {
        &self.definitions
    }

    /// The classes' ceilings over `definition` when it is one of this gateway's
    /// model limits (docs/gateway.md, "Classes"): what an admin change of that limit
    /// must define with it. Empty for any other key; an error when a ceiling would
    /// hold nothing.
    pub fn ceilings_over(&self, definition: &LimitDefinition) -> Result<Vec<LimitDefinition>, String> {
        if !self.definitions.iter().any(|d| d.key() == definition.key()) {
            return Ok(Vec::new());
        }
        self.admission.classes().ceilings_over(definition)
    }

    /// The gateway's metrics, rendered by the server's `/metrics`.
    pub fn metrics(&self) -> &Arc<GatewayMetrics> {
        &self.metrics
    }

    /// Each directory key's calls and tokens today on this server, for the operator's console.
    pub fn key_usage(&self) -> &Arc<KeyUsage> {
        &self.key_usage
    }

    /// The counter a call of directory key `id` adds to.
    pub(super) fn key_call(&self, id: &str) -> KeyCall {
        KeyCall {
            usage: self.key_usage.clone(),
            counter: self.key_usage.counter(id),
        }
    }

    /// Each model's live state, in configuration order, for the operator's console.
    pub fn status(&self) -> Vec<ModelStatus> {
        (self.model_names.iter())
            .map(|name| {
                let model = &self.models[name];
                let single = model.config.deployments.is_empty();
                ModelStatus::of(name, &model.pool, single, model.queue.waiting())
            })
            .collect()
    }

    /// Each priority class, highest first, with its tenants and what waits in it
    /// per model now, for the operator's console.
    pub fn class_status(&self) -> Vec<ClassStatus> {
        let queues: Vec<(&String, Vec<usize>)> = (self.model_names.iter())
            .map(|name| (name, self.models[name].queue.waiting_by_class()))
            .collect();
        let classes = self.admission.classes();
        (0..classes.work_classes().len())
            .map(|class| {
                let tenants = (self.admission.tenants().iter())
                    .filter(|t| t.class == class)
                    .map(|t| t.name.to_string());
                let queue_len = (queues.iter()).map(|(name, by_class)| ((*name).clone(), by_class[class]));
                ClassStatus::of(classes, class, tenants.collect(), queue_len.collect())
            })
            .collect()
    }

    /// This gateway serving the keys of `directory` too (docs/gateway.md,
    /// "Tenants and keys"): a key made through the admin API authenticates as
    /// its tenant, with its own limits and scope of models.
    pub fn with_directory(mut self, directory: Arc<ratelimiter::directory::Directory>) -> Self {
        let first_index = self.admission.no_tenant() + 1;
        self.key_callers = Some(KeyCallers::new(directory, first_index, self.caps_default));
        self
    }

    /// With [`Gateway::with_directory`], each tenant of the directory has its
    /// limits made sure of by `limits` before its first call on this server.
    pub fn with_tenant_limits(mut self, limits: Arc<dyn TenantLimits>) -> Self {
        self.key_callers = self.key_callers.map(|callers| callers.with_tenant_limits(limits));
        self
    }

    /// This gateway sharing the stored ids it hands to tenants with every
    /// server of its fleet through `fleet` (docs/gateway.md, "Stored
    /// responses"): before any call is served.
    pub fn with_handed_ids(mut self, fleet: Arc<dyn ratelimiter::handed_ids::HandedIdStore>) -> Self {
        self.response_ids = Arc::new(ResponseIds::shared(fleet));
        self
    }

    /// This gateway alerting each crossing of a budget's `alert_at` only when
    /// its claim in `claims` is the fleet's first (docs/gateway.md, "Budgets
    /// and spend"): one alert per crossing however many servers see it.
    /// Before any call is served.
    pub fn with_alert_claims(self, claims: Arc<dyn ratelimiter::alert_claims::AlertClaims>) -> Self {
        self.budget_watch.with_claims(claims);
        self
    }

    /// This gateway recording every completed call's spend in `book`
    /// (docs/gateway.md, "The spend ledger"), dated by `clock`; starts the
    /// recorder's task on the current tokio runtime.
    pub fn with_spend(mut self, book: Arc<dyn SpendBook>, clock: Arc<dyn Clock>) -> Self {
        let recorder = SpendRecorder::start(book, self.metrics.spend.clone());
        self.spend = Some(Arc::new(SpendSink::new(recorder, clock)));
        self
    }

    /// This gateway tracing every call with `telemetry` (docs/observability.md).
    pub fn with_telemetry(mut self, telemetry: Arc<Telemetry>) -> Self {
        self.telemetry = Some(telemetry);
        self
    }

    /// The caller `headers` authenticate: a key of the directory, a tenant by
    /// its configured key, or the caller without a tenant when the gateway
    /// allows anonymous calls (a directory key presented to it still counts as
    /// that key's). A gateway with no tenant in its file and no anonymous calls
    /// serves the directory's keys only.
    pub(super) async fn authenticate(&self, headers: &HeaderMap) -> Result<Authorized, GatewayError> {
        let presented = presented_key(headers);
        if let (Some(key), Some(callers)) = (presented, &self.key_callers) {
            if let Some(found) = callers.authorize(key, &self.admission).await? {
                return Ok(found);
            }
        }
        let caller = |index: usize| Authorized {
            caller: self.admission.caller(index).clone(),
            key: None,
        };
        if self.anonymous {
            return Ok(caller(self.admission.no_tenant()));
        }
        let key = presented.ok_or_else(|| {
            GatewayError::new(
                ErrorKind::Authentication,
                "You didn't provide an API key: send it as `Authorization: Bearer <key>` or `x-api-key`.",
            )
        })?;
        find_tenant(&self.tenant_keys, key)
            .map(caller)
            .ok_or_else(incorrect_key)
    }

    /// The model `name` when it is served in `endpoint`'s wire format, and
    /// each of its deployments' upstreams has the endpoint (Bedrock serves
    /// chat, not the Responses API).
    pub(super) fn model_for(&self, endpoint: Endpoint, name: &str) -> Result<&Arc<ModelEntry>, GatewayError> {
        let model = self
            .models
            .get(name)
            .ok_or_else(|| GatewayError::model_not_found(name))?;
        let served = |d: &crate::routing::Deployment| {
            (self.upstreams[d.upstream].path_of(endpoint.path(), &d.config.name, false)).is_some()
        };
        if endpoint.format().is_spoken_by(model.kind) && model.pool.deployments.iter().all(served) {
            Ok(model)
        } else {
            Err(GatewayError::model_not_found(name))
        }
    }
}

/// The gateway's callers: each tenant, then the caller without a tenant (whose
/// caps are the gateway's).
fn callers(config: &GatewayConfig, classes: &Classes) -> Vec<Caller> {
    let tenants = config.tenants.iter().enumerate().map(|(index, tenant)| {
        let entry = format!("gateway.tenants[{}]", tenant.name);
        Caller {
            index,
            name: Arc::from(tenant.name.as_str()),
            // A tenant of the file is its name, across restarts.
            owner: Arc::from(tenant.name.as_str()),
            keys: Some(Arc::new(TenantKeys::new(tenant))),
            class: classes.of_tenant(tenant.class.as_deref()),
            caps: Arc::new(TenantCaps::new(
                entry,
                tenant.connections_max(config),
                tenant.queued_max(config),
            )),
            owner_of_leases: crate::admission::entry::lease_owner_of(&tenant.name),
        }
    });
    let caps = TenantCaps::new(
        "gateway".to_owned(),
        config.tenant_connections_max,
        config.tenant_queued_max,
    );
    let mut callers: Vec<Caller> = tenants.collect();
    callers.push(Caller::no_tenant(callers.len(), caps));
    callers
}

/// Warns of each deployment on which calls counted at a model's bound can
/// never be admitted.
fn warn_bounds_above_limits(model: &ModelEntry) {
    for deployment in &model.pool.deployments {
        for (field, tokens, limit) in model.counter.bounds_above_limits(&deployment.config, model.kind) {
            tracing::warn!(model = %model.config.name, upstream = %deployment.label, field, tokens, limit,
                "gateway: calls counted at this bound can never be admitted on this deployment; set the model's field to what its calls send");
        }
    }
}
