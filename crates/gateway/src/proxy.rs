//! The proxy service: authenticate, read and count, reserve (waiting in the
//! model's fair queue when denied), forward, stream back, reconcile
//! (docs/gateway.md).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use futures_util::stream::{self, Stream};
use http_body_util::BodyExt;
use ratelimiter::{
    Backend, CompleteRequest, Denial, LeaseId, LimitDefinition, Limiter, Requirement, ReserveOutcome, ReserveRequest,
};

use crate::auth::{find_tenant, presented_key, TenantKey};
use crate::call::{model_name, parse_object, Call, Endpoint};
use crate::class_metrics::ClassCounters;
use crate::classes::Classes;
use crate::config::{GatewayConfig, ModelConfig, UpstreamKind};
use crate::error::{ErrorKind, Format, GatewayError, Shaped};
use crate::lease::{reserve_guarded, CallLease, CallLog, OnDeployment, Reservation, Settle};
use crate::limits::{self, TenantKeys};
use crate::metrics::{CallCounters, GatewayMetrics, ModelMetrics, NO_TENANT};
use crate::pool::{Deployment, Grant, Need, Pool};
use crate::queue::{denial_key, ModelQueue, Refusal};
use crate::tenant_caps::{HoldingBody, TenantCaps};
use crate::tokens::Counter;
use crate::upstream::{response_headers, Upstream, UpstreamClient, UpstreamError};
use crate::usage::{EventAction, Usage};
use crate::{anthropic, cooldown, openai, passthrough, sse};

/// The largest answer read whole from an upstream (`count_tokens`' small answers;
/// every other answer is passed on as it arrives).
pub const RESPONSE_BYTES_MAX: usize = 64 * 1024 * 1024;
/// The queue index of calls without a tenant (a gateway without keys).
const NO_TENANT_INDEX: usize = usize::MAX;

/// One served model.
pub struct ModelEntry {
    /// Its configuration.
    pub config: ModelConfig,
    /// The wire format of its deployments (one per pool).
    kind: UpstreamKind,
    /// The name, shared by every call's log line.
    name: Arc<str>,
    /// Its deployments (one for a model of the single-deployment form).
    pool: Arc<Pool>,
    /// Counts its calls before a deployment is chosen: by the name clients send
    /// (every deployment of a pool serves that model).
    counter: Counter,
    /// The (model, tenant) counters, indexed by tenant, the last for calls
    /// without one: found per call by index, not by a label lookup; each made
    /// (and shown in the metrics) at its pair's first call.
    counters: Vec<OnceLock<Arc<CallCounters>>>,
    queue: Arc<ModelQueue>,
    metrics: Arc<ModelMetrics>,
    /// The (model, class) counters, indexed by class; each made (and shown in the
    /// metrics) at its pair's first call, like the (model, tenant) ones.
    class_counters: Vec<OnceLock<Arc<ClassCounters>>>,
}

struct TenantEntry {
    name: Arc<str>,
    keys: Arc<TenantKeys>,
    /// The tenant's class (an index into the gateway's classes).
    class: usize,
}

/// The gateway: configuration resolved, upstream keys read, the limiter to reserve on.
pub struct Gateway {
    backend: Arc<dyn Backend>,
    limiter: Arc<dyn Limiter>,
    models: HashMap<String, Arc<ModelEntry>>,
    model_names: Vec<String>,
    upstreams: Vec<Upstream>,
    tenants: Vec<TenantEntry>,
    /// The priority classes; one without headroom when none are configured.
    classes: Arc<Classes>,
    tenant_keys: Vec<TenantKey>,
    /// The tenant label of calls without one, shared by their log lines.
    no_tenant: Arc<str>,
    client: UpstreamClient,
    metrics: Arc<GatewayMetrics>,
    body_bytes_max: usize,
    /// How long a client has to send its whole body.
    body_timeout: Duration,
    /// Per tenant (by index, the last for calls without one): calls open and waiting.
    caps: Vec<Arc<TenantCaps>>,
    definitions: Vec<LimitDefinition>,
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
        config.validate().map_err(|e| e.to_string())?;
        let upstreams = config
            .upstreams
            .iter()
            .cloned()
            .map(Upstream::new)
            .collect::<Result<Vec<_>, _>>()?;
        let metrics = Arc::new(GatewayMetrics::default());
        let definitions = limits::definitions(config);
        let tenant_keys = crate::auth::read_tenant_keys(&config.tenants)?;
        if config.allow_anonymous {
            tracing::warn!(gateway_addr = %config.listen_addr,
                "gateway: allow_anonymous is set: anyone who reaches the listener may call, without a key");
        }
        let caps = (config.tenants.iter())
            .map(|t| {
                let entry = format!("gateway.tenants[{}]", t.name);
                TenantCaps::new(entry, t.connections_max(config), t.queued_max(config))
            })
            .chain([TenantCaps::new(
                "gateway".to_owned(),
                config.tenant_connections_max,
                config.tenant_queued_max,
            )])
            .map(Arc::new)
            .collect();
        let classes = Arc::new(Classes::new(&config.classes));
        let tenants: Vec<TenantEntry> = (config.tenants.iter())
            .map(|tenant| TenantEntry {
                name: Arc::from(tenant.name.as_str()),
                keys: Arc::new(TenantKeys::new(tenant)),
                class: classes.of_tenant(tenant.class.as_deref()),
            })
            .collect();
        let mut models = HashMap::new();
        for model in &config.models {
            let pool = Arc::new(Pool::of(model, &upstreams, &definitions, &metrics));
            let kind = upstreams[pool.deployments[0].upstream].config.kind;
            let counter = Counter::for_model(kind, model);
            for deployment in &pool.deployments {
                for (field, tokens, limit) in counter.bounds_above_limits(&deployment.config) {
                    tracing::warn!(model = %model.name, upstream = %deployment.label, field, tokens, limit,
                        "gateway: calls counted at this bound can never be admitted on this deployment; set the model's field to what its calls send");
                }
            }
            // The vocabulary loads on first use: at startup, not on a client's first call.
            counter.text("warm");
            let entry = ModelEntry {
                config: model.clone(),
                kind,
                name: Arc::from(model.name.as_str()),
                pool,
                counter,
                counters: tenants
                    .iter()
                    .map(|_| OnceLock::new())
                    .chain([OnceLock::new()])
                    .collect(),
                queue: Arc::new(ModelQueue::new(classes.work_classes())),
                metrics: metrics.model(&model.name),
                class_counters: classes.work_classes().iter().map(|_| OnceLock::new()).collect(),
            };
            models.insert(model.name.clone(), Arc::new(entry));
        }
        Ok(Self {
            limiter: Arc::new(BackendLimiter(backend.clone())),
            backend,
            models,
            model_names: config.models.iter().map(|m| m.name.clone()).collect(),
            upstreams,
            tenants,
            tenant_keys,
            classes,
            no_tenant: Arc::from(NO_TENANT),
            client,
            metrics,
            body_bytes_max: config.body_bytes_max,
            body_timeout: Duration::from_millis(config.client_body_timeout_ms),
            caps,
            definitions,
        })
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
        self.classes.ceilings_over(definition)
    }

    /// The gateway's metrics, rendered by the server's `/metrics`.
    pub fn metrics(&self) -> &Arc<GatewayMetrics> {
        &self.metrics
    }

    /// Each model's live state, in configuration order, for the operator's console.
    pub fn status(&self) -> Vec<crate::status::ModelStatus> {
        (self.model_names.iter())
            .map(|name| {
                let model = &self.models[name];
                let deployments = &model.pool.deployments;
                let single = model.config.deployments.is_empty();
                crate::status::ModelStatus {
                    name: name.clone(),
                    upstream: if single {
                        deployments[0].label.to_string()
                    } else {
                        let labels: Vec<&str> = deployments.iter().map(|d| d.label.as_ref()).collect();
                        labels.join(", ")
                    },
                    paused_ms_left: if single {
                        deployments[0].stats.cooldown.left_ms()
                    } else {
                        None
                    },
                    queue_len: model.queue.waiting(),
                    deployments: if single { Vec::new() } else { model.pool.status() },
                }
            })
            .collect()
    }

    /// Each priority class, highest first, with its tenants and what waits in it
    /// per model now, for the operator's console.
    pub fn class_status(&self) -> Vec<crate::status::ClassStatus> {
        let queues: Vec<(&String, Vec<usize>)> = (self.model_names.iter())
            .map(|name| (name, self.models[name].queue.waiting_by_class()))
            .collect();
        (0..self.classes.work_classes().len())
            .map(|class| crate::status::ClassStatus {
                name: self.classes.name(class).to_owned(),
                share: self.classes.work_classes()[class].share(),
                headroom_ppm: self.classes.headroom_ppm(class),
                ceiling_ppm: crate::classes::HEADROOM_PPM_ONE - self.classes.above_ppm(class),
                tenants: (self.tenants.iter())
                    .filter(|t| t.class == class)
                    .map(|t| t.name.to_string())
                    .collect(),
                queue_len: (queues.iter())
                    .map(|(name, by_class)| ((*name).clone(), by_class[class]))
                    .collect(),
            })
            .collect()
    }

    fn authenticate(&self, headers: &HeaderMap) -> Result<Option<usize>, GatewayError> {
        if self.tenant_keys.is_empty() {
            return Ok(None);
        }
        let unauthorized = |m: &str| GatewayError::new(ErrorKind::Authentication, m);
        let key = presented_key(headers).ok_or_else(|| {
            unauthorized("You didn't provide an API key: send it as `Authorization: Bearer <key>` or `x-api-key`.")
        })?;
        find_tenant(&self.tenant_keys, key)
            .map(Some)
            .ok_or_else(|| unauthorized("Incorrect API key provided."))
    }

    fn model_for(&self, endpoint: Endpoint, name: &str) -> Result<&Arc<ModelEntry>, GatewayError> {
        let model = self
            .models
            .get(name)
            .ok_or_else(|| GatewayError::model_not_found(name))?;
        let fits = match endpoint.format() {
            Format::OpenAi => model.kind.is_openai(),
            Format::Anthropic => model.kind == UpstreamKind::Anthropic,
        };
        if fits {
            Ok(model)
        } else {
            Err(GatewayError::model_not_found(name))
        }
    }
}

/// The gateway's router: the provider endpoints, and 404 in the provider's shape
/// for everything else.
pub fn router(gateway: Arc<Gateway>) -> Router {
    let endpoint = |e: Endpoint| {
        move |State(g): State<Arc<Gateway>>, headers: HeaderMap, body: Body| async move { handle(g, e, headers, body).await }
    };
    Router::new()
        .route("/v1/chat/completions", post(endpoint(Endpoint::ChatCompletions)))
        .route("/v1/embeddings", post(endpoint(Endpoint::Embeddings)))
        .route("/v1/responses", post(endpoint(Endpoint::Responses)))
        .route("/v1/messages", post(endpoint(Endpoint::Messages)))
        .route("/v1/messages/count_tokens", post(endpoint(Endpoint::CountTokens)))
        .route("/v1/models", get(list_models))
        .fallback(not_found)
        .with_state(gateway)
}

/// Anthropic's SDKs send `anthropic-version` on every call: the shape of answers
/// to paths that belong to neither provider follows it.
fn format_of(headers: &HeaderMap) -> Format {
    if headers.contains_key("anthropic-version") {
        Format::Anthropic
    } else {
        Format::OpenAi
    }
}

async fn not_found(method: Method, uri: axum::http::Uri, headers: HeaderMap) -> Response {
    let error = GatewayError::new(
        ErrorKind::RouteNotFound,
        format!("Invalid URL ({method} {})", uri.path()),
    );
    error.into_response(format_of(&headers))
}

async fn list_models(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    let format = format_of(&headers);
    if let Err(e) = gateway.authenticate(&headers) {
        return e.into_response(format);
    }
    let entries = gateway.model_names.iter().map(|name| {
        let model = &gateway.models[name];
        (name, model.pool.deployments[0].label.as_ref())
    });
    let body = match format {
        Format::OpenAi => {
            let data: Vec<_> = entries
                .map(|(id, owner)| serde_json::json!({"id": id, "object": "model", "created": 0, "owned_by": owner}))
                .collect();
            serde_json::json!({"object": "list", "data": data})
        }
        Format::Anthropic => {
            let data: Vec<_> = entries
                .map(|(id, _)| serde_json::json!({"id": id, "type": "model", "display_name": id, "created_at": "1970-01-01T00:00:00Z"}))
                .collect();
            let first = data.first().and_then(|m| m["id"].as_str().map(str::to_owned));
            let last = data.last().and_then(|m| m["id"].as_str().map(str::to_owned));
            serde_json::json!({"data": data, "has_more": false, "first_id": first, "last_id": last})
        }
    };
    Json(body).into_response()
}

async fn handle(gateway: Arc<Gateway>, endpoint: Endpoint, headers: HeaderMap, body: Body) -> Response {
    let opened = gateway.authenticate(&headers).and_then(|tenant| {
        let held = gateway.caps[tenant.unwrap_or(gateway.tenants.len())].open()?;
        Ok((tenant, held))
    });
    let (tenant, held) = match opened {
        Ok(opened) => opened,
        Err(error) => return Shaped(endpoint.format(), error).into_response(),
    };
    let response = match serve(gateway, endpoint, tenant, headers, body).await {
        Ok(response) => response,
        Err(error) => Shaped(endpoint.format(), error).into_response(),
    };
    // The call stays open, on its tenant's cap, until its answer's last byte.
    response.map(|body| HoldingBody::wrap(body, held))
}

/// The request's whole body, within `limit` bytes and `timeout` from its first
/// byte to its last (a client trickling its body holds a connection and a tenant
/// slot no longer than that).
async fn read_body(headers: &HeaderMap, body: Body, limit: usize, timeout: Duration) -> Result<Bytes, GatewayError> {
    let too_large = || {
        GatewayError::new(
            ErrorKind::TooLarge,
            format!("The request body is larger than {limit} bytes."),
        )
    };
    let declared = headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let collect = http_body_util::Limited::new(body, limit).collect();
    let Ok(collected) = ready_or_timeout(collect, timeout).await else {
        return Err(GatewayError::new(
            ErrorKind::ClientTimeout,
            format!("The request body did not arrive within {} ms.", timeout.as_millis()),
        ));
    };
    match collected {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => Err(too_large()),
        Err(e) => Err(GatewayError::invalid(format!(
            "The request body could not be read: {e}"
        ))),
    }
}

async fn serve(
    gateway: Arc<Gateway>,
    endpoint: Endpoint,
    tenant: Option<usize>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, GatewayError> {
    let started = Instant::now();
    // Calls without a tenant (an anonymous gateway) run in the top class.
    let tenant_class = tenant.map_or(0, |i| gateway.tenants[i].class);
    let class = gateway.classes.of_request(tenant_class, &headers)?;
    let bytes = read_body(&headers, body, gateway.body_bytes_max, gateway.body_timeout).await?;
    let object = parse_object(&bytes)?;
    let model = gateway.model_for(endpoint, model_name(&object)?)?.clone();
    if endpoint == Endpoint::CountTokens {
        // Sent to a pool's first deployment.
        return count_tokens(&gateway, &model.pool.deployments[0], tenant, &headers, bytes).await;
    }
    let call = match endpoint.format() {
        Format::OpenAi => openai::read_call(endpoint, object, &model.counter, bytes)?,
        Format::Anthropic => anthropic::read_call(object, &model.counter, bytes)?,
    };
    let tenant_entry = tenant.map(|i| &gateway.tenants[i]);
    let slot = &model.counters[tenant.unwrap_or(gateway.tenants.len())];
    let counters = (slot.get_or_init(|| {
        let label = tenant_entry.map_or(NO_TENANT, |t| t.name.as_ref());
        gateway.metrics.calls(&model.config.name, label)
    }))
    .clone();
    let mut need = Need {
        tenant: tenant_entry.map(|t| t.keys.clone()),
        input_tokens: call.input_tokens,
        prompt_characters: call.prompt_characters,
        output_tokens: call.output_tokens,
        tried: 0,
        class,
        classes: gateway.classes.clone(),
    };
    let class_counters = class_counters(&gateway, &model, class);
    // Each deployment of the pool is tried at most once (docs/gateway.md, "Pools").
    loop {
        let grant = match admit(&gateway, &model, tenant, &need, &call, &counters).await {
            Ok(grant) => grant,
            Err(error) => {
                if matches!(error.kind, ErrorKind::RateLimited { .. }) {
                    class_counters.denied.fetch_add(1, Ordering::Relaxed);
                }
                return Err(error);
            }
        };
        if need.tried == 0 {
            class_counters.admitted.fetch_add(1, Ordering::Relaxed);
            counters.admitted.fetch_add(1, Ordering::Relaxed);
            counters
                .tokens_reserved
                .fetch_add(grant.reserved.0.saturating_add(grant.reserved.1), Ordering::Relaxed);
        }
        need.tried |= 1 << grant.deployment;
        let index = grant.deployment;
        // The grant's guard hands its lease to the call's guard here, with no
        // await between: this try's lease is owned from grant to complete.
        let lease = call_lease(
            &gateway,
            &model,
            tenant_entry,
            grant,
            endpoint,
            (&call, class),
            &counters,
            started,
        );
        let last = !model.pool.can_fail_over(need.tried);
        if let Forwarded::Answer(response) =
            forward(&gateway, &model, index, endpoint, &headers, &call, lease, last).await?
        {
            return Ok(response);
        }
    }
}

/// The (model, class) counters of `class`, made at the pair's first call.
fn class_counters<'a>(gateway: &Gateway, model: &'a ModelEntry, class: usize) -> &'a Arc<ClassCounters> {
    model.class_counters[class]
        .get_or_init(|| (gateway.metrics.classes).pair(&model.config.name, gateway.classes.name(class)))
}

/// The guard of `grant`'s lease: the call owns it from now on.
#[allow(clippy::too_many_arguments)]
fn call_lease(
    gateway: &Gateway,
    model: &Arc<ModelEntry>,
    tenant: Option<&TenantEntry>,
    grant: Grant,
    endpoint: Endpoint,
    (call, call_class): (&Call, usize),
    counters: &Arc<CallCounters>,
    started: Instant,
) -> CallLease {
    let index = grant.deployment;
    let (reserved, pass) = (grant.reserved, grant.pass);
    let deployment = &model.pool.deployments[index];
    CallLease {
        limiter: gateway.limiter.clone(),
        lease_id: grant.take(),
        model_keys: deployment.keys.clone(),
        tenant_keys: tenant.map(|t| t.keys.clone()),
        queue: model.queue.clone(),
        counters: counters.clone(),
        settle: Settle::KeepReserved,
        count_cache_reads: deployment.config.limits.count_cache_reads,
        calibration: (model.counter.calibrator.clone()).zip(call.calibration_sample),
        ceilings: (gateway.classes.clone(), call_class),
        log: CallLog {
            endpoint: endpoint.label(),
            model: model.name.clone(),
            tenant: tenant.map_or_else(|| gateway.no_tenant.clone(), |t| t.name.clone()),
            reserved,
            status: 0,
            stream: call.stream,
        },
        started,
        finished: false,
        deployment: Some(OnDeployment {
            pool: model.pool.clone(),
            index,
            pass,
            recorded: false,
        }),
        tenant_released: false,
    }
}

/// Anthropic's token counting: free at the provider and limited apart by it, so
/// no model limit is reserved; the call is counted on its tenant's `rpm`, so a
/// tenant cannot flood the upstream through it.
async fn count_tokens(
    gateway: &Gateway,
    deployment: &Deployment,
    tenant: Option<usize>,
    headers: &HeaderMap,
    bytes: Bytes,
) -> Result<Response, GatewayError> {
    let upstream = &gateway.upstreams[deployment.upstream];
    if let Some(key) = tenant.and_then(|i| gateway.tenants[i].keys.rpm.clone()) {
        let request = ReserveRequest::new(LeaseId::generate(), None, vec![Requirement { key, amount: 1 }])
            .map_err(|e| GatewayError::invalid(e.0))?;
        let lease_id = match reserve_guarded(&gateway.limiter, request, None).await {
            Ok(Reservation::Allowed(reserved)) => reserved.take(),
            Ok(Reservation::Denied(denial)) => return Err(rate_limited(gateway, &denial, false, None).await),
            Err(e) => return Err(backend_error(e)),
        };
        // The request stays counted for its minute; no slot is held during the call.
        let complete = CompleteRequest::new(lease_id, None, Vec::new()).map_err(|e| GatewayError::invalid(e.0))?;
        if let Err(e) = gateway.limiter.complete(&complete).await {
            tracing::warn!(%lease_id, error = %e, "gateway: complete failed; the hold ends by its window");
        }
    }
    let response = (gateway.client)
        .send(
            upstream,
            Method::POST,
            Endpoint::CountTokens.path(),
            headers,
            deployment.body(&bytes),
        )
        .await
        .map_err(upstream_error)?;
    let (parts, body) = response.into_parts();
    if let Some(error) = credentials_refused(upstream, parts.status) {
        return Err(error);
    }
    let body = read_upstream_body(body, gateway.client.timeout()).await?;
    Ok(answer(parts.status, parts.headers, Body::from(body)))
}

/// Reserves the call all or nothing on one deployment of the model's pool: at
/// once when nobody waits on the model and a deployment has room, else in the
/// model's queue up to `max_wait_ms`.
async fn admit(
    gateway: &Gateway,
    model: &Arc<ModelEntry>,
    tenant: Option<usize>,
    need: &Need,
    call: &Call,
    counters: &CallCounters,
) -> Result<Grant, GatewayError> {
    let budget_key = tenant.and_then(|i| gateway.tenants[i].keys.daily_tokens.clone());
    let is_budget = |denial: &Denial| {
        budget_key
            .as_ref()
            .is_some_and(|k| denial_key(denial) == Some(k.as_str()))
    };
    let max_wait_ms = model.config.max_wait_ms;
    if !model.queue.is_busy(need.class) {
        match model.pool.reserve(&gateway.limiter, &model.queue, need).await {
            Ok(grant) => return Ok(grant),
            Err(Refusal::Denied(denial)) => {
                if denial.is_permanent() || is_budget(&denial) || max_wait_ms == 0 {
                    let budget = is_budget(&denial);
                    return Err(refuse(gateway, model, denial, budget, call, counters).await);
                }
            }
            Err(Refusal::Failing { retry_after_ms }) if retry_after_ms == 0 || max_wait_ms == 0 => {
                return Err(failing(retry_after_ms));
            }
            Err(Refusal::Failing { .. }) => {}
            Err(Refusal::Backend(e)) => return Err(backend_error(e)),
            Err(Refusal::QueueFull) => return Err(GatewayError::new(ErrorKind::Internal, "The queue failed.")),
        }
    }
    // Held while the call waits: one tenant cannot fill the queue for the others.
    let _waiting = gateway.caps[tenant.unwrap_or(gateway.tenants.len())].wait()?;
    counters.queued.fetch_add(1, Ordering::Relaxed);
    let class_counters = class_counters(gateway, model, need.class);
    class_counters.queued.fetch_add(1, Ordering::Relaxed);
    let waited = Instant::now();
    let receiver = match model.queue.enqueue(
        &gateway.limiter,
        &model.pool,
        tenant.unwrap_or(NO_TENANT_INDEX),
        need.clone(),
    ) {
        Ok(receiver) => receiver,
        Err(_) => {
            let denial = queue_denial(gateway, model, tenant);
            let budget = is_budget(&denial);
            return Err(refuse(gateway, model, denial, budget, call, counters).await);
        }
    };
    let outcome = tokio::time::timeout(Duration::from_millis(max_wait_ms), receiver).await;
    model.metrics.queue_wait.observe(waited.elapsed());
    class_counters.queue_wait.observe(waited.elapsed());
    match outcome {
        Ok(Ok(Ok(grant))) => Ok(grant),
        Ok(Ok(Err(Refusal::Denied(denial)))) => {
            let budget = is_budget(&denial);
            Err(refuse(gateway, model, denial, budget, call, counters).await)
        }
        Ok(Ok(Err(Refusal::Backend(e)))) => Err(backend_error(e)),
        Ok(Ok(Err(Refusal::Failing { retry_after_ms }))) => Err(failing(retry_after_ms)),
        Ok(Ok(Err(Refusal::QueueFull))) | Ok(Err(_)) => {
            Err(GatewayError::new(ErrorKind::Internal, "The queue failed."))
        }
        // No denial seen while waiting: only open breakers stood in the way.
        Err(_) if model.queue.last_denial().is_none() => Err(failing(crate::queue::PUMP_SLEEP_MAX_MS)),
        Err(_) => {
            let denial = queue_denial(gateway, model, tenant);
            let budget = is_budget(&denial);
            Err(refuse(gateway, model, denial, budget, call, counters).await)
        }
    }
}

/// The answer when every deployment left is failing (its breaker open) or was
/// tried: a 502 the SDKs retry, with the time to the first half-open.
fn failing(retry_after_ms: u64) -> GatewayError {
    let mut error = GatewayError::new(
        ErrorKind::BadGateway,
        "Every deployment of this model is failing or was tried for this call.",
    );
    if retry_after_ms > 0 {
        error = error
            .with_header("retry-after-ms", retry_after_ms.to_string())
            .with_header("retry-after", retry_after_ms.div_ceil(1000).to_string());
    }
    error
}

/// The denial a call that waited in vain is answered with: the last one the
/// model's queue saw, unless it names another tenant's limit (see [`own_denial`]).
fn queue_denial(gateway: &Gateway, model: &ModelEntry, tenant: Option<usize>) -> Denial {
    let own_prefix = tenant.map(|i| format!("tenant:{}:", gateway.tenants[i].name));
    let keys = &model.pool.deployments[0].keys;
    let fallback = (keys.rpm.clone())
        .or(keys.concurrency.clone())
        .or(keys.tpm.clone())
        .or(keys.input_tpm.clone())
        .unwrap_or_else(|| ratelimiter::LimitKey::new("queue").expect("valid"));
    own_denial(model.queue.last_denial(), own_prefix.as_deref(), fallback)
}

/// `last` when it names the model or the caller's own tenant (keys under
/// `own_prefix`); else a denial on the model's `fallback` key with `last`'s hint:
/// another tenant's limit, figures and usage are that tenant's business.
fn own_denial(last: Option<Denial>, own_prefix: Option<&str>, fallback: ratelimiter::LimitKey) -> Denial {
    let own = |denial: &Denial| {
        let key = denial_key(denial).unwrap_or("");
        !key.starts_with("tenant:") || own_prefix.is_some_and(|p| key.starts_with(p))
    };
    match last {
        Some(denial) if own(&denial) => denial,
        last => Denial::InsufficientCapacity {
            key: fallback,
            retry_after_ms: last.map_or(crate::queue::PUMP_SLEEP_MAX_MS, |d| d.retry_after_ms()),
        },
    }
}

/// The answer to a denial: 400 when the call can never fit, else a 429.
async fn refuse(
    gateway: &Gateway,
    model: &ModelEntry,
    denial: Denial,
    budget: bool,
    call: &Call,
    counters: &CallCounters,
) -> GatewayError {
    if denial.is_permanent() {
        return GatewayError::invalid(format!(
            "This request can never be admitted: it needs {} input and {} output tokens, more than the whole \
             capacity of the limit {}. Shorten the prompt or lower the output bound (max_tokens).",
            call.input_tokens,
            call.output_tokens,
            denial_key(&denial).unwrap_or("?")
        ));
    }
    counters.denied.fetch_add(1, Ordering::Relaxed);
    // During this server's cooldown of a deployment, the provider's own time is the hint.
    let cap_ms = model.pool.cooldown_left_ms(&denial);
    rate_limited(gateway, &denial, budget, cap_ms).await
}

fn backend_error(error: ratelimiter::LimiterError) -> GatewayError {
    tracing::error!(error = %error, "gateway: the backend failed a reserve");
    GatewayError::new(
        ErrorKind::Internal,
        "The rate limiter's backend failed; nothing was sent upstream.",
    )
}

/// A 429 with the retry hints both SDKs read and the binding limit's figures.
async fn rate_limited(gateway: &Gateway, denial: &Denial, budget: bool, cap_ms: Option<u64>) -> GatewayError {
    let retry_after_ms = denial.retry_after_ms().min(cap_ms.unwrap_or(u64::MAX)).max(1);
    let key = denial_key(denial).unwrap_or("");
    let message = if budget {
        format!("The tenant's daily token budget ({key}) is spent; it frees as the day's calls age out.")
    } else {
        format!("Rate limit reached on {key}. Please try again in {retry_after_ms}ms.")
    };
    let mut error = GatewayError::new(ErrorKind::RateLimited { budget }, message)
        .with_header("retry-after-ms", retry_after_ms.to_string())
        .with_header("retry-after", retry_after_ms.div_ceil(1000).to_string());
    if budget {
        error = error.with_header("x-should-retry", "false".to_owned());
    }
    let dimension = match key.rsplit(':').next().unwrap_or("") {
        "rpm" => "requests",
        "input_tpm" => "input-tokens",
        "output_tpm" => "output-tokens",
        "concurrency" => "concurrency",
        _ => "tokens",
    };
    let Ok(key) = ratelimiter::LimitKey::new(key) else {
        return error;
    };
    if let Ok(Some(report)) = gateway.backend.limit_report(&key).await {
        let capacity = report.state.definition().capacity();
        error = error
            .with_header(format!("x-ratelimit-limit-{dimension}"), capacity.to_string())
            .with_header(
                format!("x-ratelimit-remaining-{dimension}"),
                capacity.saturating_sub(report.in_use).to_string(),
            )
            .with_header(format!("x-ratelimit-reset-{dimension}"), format!("{retry_after_ms}ms"));
    }
    error
}

fn upstream_error(error: UpstreamError) -> GatewayError {
    tracing::warn!(error = %error, "gateway: upstream call failed");
    match error {
        UpstreamError::Timeout => {
            GatewayError::new(ErrorKind::Timeout, "The upstream provider did not answer in time.")
        }
        UpstreamError::Unreachable(_) => {
            GatewayError::new(ErrorKind::BadGateway, "The upstream provider could not be reached.")
        }
        UpstreamError::Failed(_) => {
            GatewayError::new(ErrorKind::BadGateway, "The upstream provider's connection failed.")
        }
    }
}

/// The client's answer: the upstream's status and headers (moved, not copied;
/// hop-by-hop ones removed) and `body`.
fn answer(status: StatusCode, upstream_headers: HeaderMap, body: Body) -> Response {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = response_headers(upstream_headers);
    response
}

async fn read_upstream_body(body: hyper::body::Incoming, timeout: Duration) -> Result<Bytes, GatewayError> {
    let collect = http_body_util::Limited::new(body, RESPONSE_BYTES_MAX).collect();
    match ready_or_timeout(collect, timeout).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) => Err(upstream_error(UpstreamError::Failed(e.to_string()))),
        Err(_) => Err(upstream_error(UpstreamError::Timeout)),
    }
}

/// `future` bounded by `timeout`, with no timer for a future that is ready when
/// first polled (a small answer's body arrives with its headers, in the same
/// read): a timer is armed only for one that has to wait.
async fn ready_or_timeout<F: std::future::Future>(
    future: F,
    timeout: Duration,
) -> Result<F::Output, tokio::time::error::Elapsed> {
    let mut future = std::pin::pin!(future);
    if let Some(output) = futures_util::FutureExt::now_or_never(future.as_mut()) {
        return Ok(output);
    }
    tokio::time::timeout(timeout, future).await
}

/// What one try on a deployment came to.
enum Forwarded {
    /// The client's answer.
    Answer(Response),
    /// The deployment failed before any byte reached the client and another
    /// deployment of the pool is left: the call goes on there.
    FailedOver,
}

/// The name of the deployment that served a call, in its answer.
const DEPLOYMENT_HEADER: &str = "x-ratelimit-deployment";

/// Sends the call to deployment `index` of the model's pool and answers the
/// client; the lease completes when the answer (or the stream) ends. A 429, a
/// 5xx, the gateway's credentials refused (401, 403), no connection or a timeout
/// fails over when `last` is false (docs/gateway.md, "Pools").
#[allow(clippy::too_many_arguments)]
async fn forward(
    gateway: &Arc<Gateway>,
    model: &Arc<ModelEntry>,
    index: usize,
    endpoint: Endpoint,
    headers: &HeaderMap,
    call: &Call,
    mut lease: CallLease,
    last: bool,
) -> Result<Forwarded, GatewayError> {
    let deployment = &model.pool.deployments[index];
    let upstream = &gateway.upstreams[deployment.upstream];
    let sent = Instant::now();
    let result = gateway
        .client
        .send(
            upstream,
            Method::POST,
            endpoint.path(),
            headers,
            deployment.body(&call.upstream_body),
        )
        .await;
    model.metrics.upstream_latency.observe(sent.elapsed());
    let response = match result {
        Ok(response) => response,
        Err(error) => {
            record(&mut lease, false);
            if matches!(error, UpstreamError::Unreachable(_)) {
                lease.settle = Settle::Refused;
            }
            let error = upstream_error(error);
            lease.log.status = error.status().as_u16();
            if !last {
                return Ok(fail_over(deployment, lease).await);
            }
            return Err(error.with_header(DEPLOYMENT_HEADER, deployment.label.to_string()));
        }
    };
    let (parts, body) = response.into_parts();
    observe_provider_limits(model, deployment, &parts.headers);
    lease.log.status = parts.status.as_u16();
    if let Some(error) = credentials_refused(upstream, parts.status) {
        // Nothing was served: the provider refused the gateway's key for this
        // deployment, not the call; another deployment's key may hold.
        record(&mut lease, false);
        lease.settle = Settle::Refused;
        lease.log.status = error.status().as_u16();
        if !last {
            return Ok(fail_over(deployment, lease).await);
        }
        return Err(error.with_header(DEPLOYMENT_HEADER, deployment.label.to_string()));
    }
    record(&mut lease, !parts.status.is_server_error());
    if parts.status == StatusCode::TOO_MANY_REQUESTS {
        lease.counters.provider_429.fetch_add(1, Ordering::Relaxed);
        cooldown::start(
            gateway.backend.clone(),
            &deployment.keys,
            &parts.headers,
            &deployment.stats.cooldown,
        );
    }
    if parts.status.is_client_error() {
        // The provider refused the call before any work (docs/gateway.md, "Reconciling").
        lease.settle = Settle::Refused;
    }
    if !last && (parts.status == StatusCode::TOO_MANY_REQUESTS || parts.status.is_server_error()) {
        return Ok(fail_over(deployment, lease).await);
    }
    let is_event_stream = parts
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let mut response = if parts.status.is_success() && call.stream && is_event_stream {
        let stream = event_stream(body, endpoint, call.drop_usage_chunk, lease, gateway.client.timeout());
        answer(parts.status, parts.headers, Body::from_stream(stream))
    } else {
        // Passed on as it arrives; only a success's usage is read, on the way.
        let scan = parts.status.is_success();
        let body = passthrough::body(body, endpoint, scan, lease, gateway.client.timeout()).await;
        answer(parts.status, parts.headers, body)
    };
    if let Ok(value) = axum::http::HeaderValue::from_str(&deployment.label) {
        response.headers_mut().insert(DEPLOYMENT_HEADER, value);
    }
    Ok(Forwarded::Answer(response))
}

/// Records the sent call's outcome on its deployment's breaker.
fn record(lease: &mut CallLease, success: bool) {
    if let Some(on) = &mut lease.deployment {
        on.record(success);
    }
}

/// Ends a failed try: its lease completed now with what the provider counts for a
/// refused call (the settle set by the caller: tokens back after a 429, a refused
/// key or no connection, kept after a 5xx or a timeout) and the tenant's keys
/// given back, since the deployment that serves the call charges them.
async fn fail_over(deployment: &Deployment, mut lease: CallLease) -> Forwarded {
    deployment.stats.failed_over.fetch_add(1, Ordering::Relaxed);
    lease.tenant_released = true;
    lease.finish().await;
    Forwarded::FailedOver
}

/// An upstream 401 or 403 is the provider refusing the gateway's own key (the
/// client's never reaches it): the client gets a 502 saying so, in its
/// provider's shape, and never the provider's body, which may quote the key.
fn credentials_refused(upstream: &Upstream, status: StatusCode) -> Option<GatewayError> {
    if status != StatusCode::UNAUTHORIZED && status != StatusCode::FORBIDDEN {
        return None;
    }
    tracing::error!(upstream = %upstream.config.name, status = status.as_u16(),
        "gateway: the upstream refused the gateway's credentials; check its api_key_env");
    Some(GatewayError::new(
        ErrorKind::BadGateway,
        format!(
            "The upstream provider refused the gateway's upstream credentials ({}); the call was not served. \
             The gateway's operator has to fix the upstream key.",
            status.as_u16()
        ),
    ))
}

/// Reads the provider's rate-limit headers (by the library's
/// `ratelimiter::provider_headers`) into the model's gauges, and warns once when the
/// configured limit is above the provider's.
fn observe_provider_limits(model: &ModelEntry, deployment: &Deployment, headers: &HeaderMap) {
    let read = cooldown::provider_headers(headers);
    let dimension = |name: &str| read.limits.iter().find(|l| l.dimension == name);
    let requests = dimension("rpm");
    let tokens = match model.kind {
        UpstreamKind::Anthropic => dimension("itpm"),
        _ => dimension("tpm"),
    };
    if let Some(value) = requests.and_then(|l| l.remaining) {
        model
            .metrics
            .provider_remaining_requests
            .store(value.saturating_add(1), Ordering::Relaxed);
    }
    if let Some(value) = tokens.and_then(|l| l.remaining) {
        model
            .metrics
            .provider_remaining_tokens
            .store(value.saturating_add(1), Ordering::Relaxed);
    }
    let (limit_requests, limit_tokens) = (requests.and_then(|l| l.limit), tokens.and_then(|l| l.limit));
    let config = &deployment.config;
    let configured_tokens = config.limits.published.tpm.or(config.limits.published.input_tpm);
    let above = if deployment.keys.profile.is_some() {
        // A profile's sub-windows are compared per minute by the library.
        let upstream = &config.upstream;
        !ratelimiter::provider_headers::below_configured(&read, upstream, &config.name, &deployment.definitions)
            .is_empty()
    } else {
        matches!((config.limits.published.rpm, limit_requests), (Some(ours), Some(theirs)) if ours > theirs)
            || matches!((configured_tokens, limit_tokens), (Some(ours), Some(theirs)) if ours > theirs)
    };
    if above && !deployment.warned_above_provider.swap(true, Ordering::Relaxed) {
        tracing::warn!(model = %model.config.name, upstream = %config.upstream, ?limit_requests, ?limit_tokens,
            configured_rpm = ?config.limits.published.rpm, configured_tokens = ?configured_tokens,
            "gateway: the configured limit is above the provider's; expect provider 429s");
    }
}

/// How a stream's usage is read, per provider.
enum StreamReader {
    OpenAi(openai::StreamUsage),
    Anthropic(anthropic::StreamUsage),
}

impl StreamReader {
    fn on_event(&mut self, event: &[u8]) -> EventAction {
        match self {
            StreamReader::OpenAi(reader) => reader.on_event(event),
            StreamReader::Anthropic(reader) => reader.on_event(event),
        }
    }

    /// The final usage, once the stream ended normally.
    fn final_usage(&self) -> Option<Usage> {
        match self {
            StreamReader::OpenAi(reader) => reader.usage,
            StreamReader::Anthropic(reader) => reader.usage.filter(|_| reader.final_seen),
        }
    }
}

struct StreamState {
    body: hyper::body::Incoming,
    splitter: sse::Splitter,
    reader: StreamReader,
    lease: CallLease,
    idle_timeout: Duration,
    ended: bool,
}

/// The client's stream: each event forwarded the moment it is whole; the usage
/// read on the way; the lease settled when the stream ends, or kept reserved
/// when the client leaves first (the state, and its lease, drop with the body).
fn event_stream(
    body: hyper::body::Incoming,
    endpoint: Endpoint,
    drop_usage_chunk: bool,
    lease: CallLease,
    idle_timeout: Duration,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    let reader = match endpoint.format() {
        Format::OpenAi => StreamReader::OpenAi(openai::StreamUsage::new(endpoint, drop_usage_chunk)),
        Format::Anthropic => StreamReader::Anthropic(anthropic::StreamUsage::default()),
    };
    let state = StreamState {
        body,
        splitter: sse::Splitter::default(),
        reader,
        lease,
        idle_timeout,
        ended: false,
    };
    stream::unfold(state, |mut state| async move {
        if state.ended {
            return None;
        }
        loop {
            let frame =
                match passthrough::next_frame(&mut state.body, state.idle_timeout, "upstream stream stalled").await {
                    Ok(frame) => frame,
                    Err(error) => {
                        state.ended = true;
                        return Some((Err(error), state));
                    }
                };
            match frame {
                None => {
                    state.ended = true;
                    let rest = state.splitter.finish().unwrap_or_default();
                    if let Some(usage) = state.reader.final_usage() {
                        state.lease.settle = Settle::Usage(usage);
                    }
                    // Completed before the client sees the stream end.
                    state.lease.finish().await;
                    return Some((Ok(rest), state));
                }
                Some(Err(e)) => {
                    state.ended = true;
                    return Some((Err(std::io::Error::other(e.to_string())), state));
                }
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else { continue };
                    let events = match state.splitter.push(&data) {
                        Ok(events) => events,
                        Err(e) => {
                            state.ended = true;
                            return Some((Err(std::io::Error::other(e.to_string())), state));
                        }
                    };
                    let mut out = Vec::with_capacity(data.len());
                    for event in events {
                        if state.reader.on_event(&event) == EventAction::Forward {
                            out.extend_from_slice(&event);
                        }
                    }
                    if !out.is_empty() {
                        return Some((Ok(Bytes::from(out)), state));
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimiter::LimitKey;

    fn denied(key: &str) -> Denial {
        Denial::InsufficientCapacity {
            key: LimitKey::new(key).unwrap(),
            retry_after_ms: 700,
        }
    }

    #[test]
    fn a_denial_naming_another_tenant_is_never_shown() {
        let model = LimitKey::new("global:llm:openai:gpt-4o-mini:rpm").unwrap();
        let other = denied("tenant:beta:llm:rpm");
        let shown = own_denial(Some(other.clone()), Some("tenant:acme:"), model.clone());
        assert_eq!(denial_key(&shown), Some(model.as_str()));
        assert_eq!(shown.retry_after_ms(), 700, "the hint is kept");
        // A tenant whose name starts like another's is still another.
        let shown = own_denial(
            Some(denied("tenant:acme2:llm:rpm")),
            Some("tenant:acme:"),
            model.clone(),
        );
        assert_eq!(denial_key(&shown), Some(model.as_str()));
        let own = denied("tenant:acme:llm:rpm");
        assert_eq!(own_denial(Some(own.clone()), Some("tenant:acme:"), model.clone()), own);
        assert_eq!(
            denial_key(&own_denial(Some(other), None, model.clone())),
            Some(model.as_str())
        );
        let on_model = denied("global:llm:openai:gpt-4o-mini:concurrency");
        assert_eq!(own_denial(Some(on_model.clone()), None, model.clone()), on_model);
    }
}
