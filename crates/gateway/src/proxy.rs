//! The proxy service: authenticate, read and count, reserve (waiting in the
//! model's fair queue when denied), forward, stream back, reconcile
//! (docs/gateway.md).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
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
use ratelimiter::{Backend, Denial, LeaseId, LimitDefinition, Limiter, Requirement, ReserveOutcome, ReserveRequest};

use crate::auth::{find_tenant, presented_key, TenantKey};
use crate::call::{model_name, parse_object, Call, Endpoint};
use crate::class_metrics::ClassCounters;
use crate::classes::Classes;
use crate::config::{GatewayConfig, ModelConfig, UpstreamKind};
use crate::error::{ErrorKind, Format, GatewayError, Shaped};
use crate::lease::{CallLease, CallLog, Settle};
use crate::limits::{self, ModelKeys, TenantKeys};
use crate::metrics::{CallCounters, GatewayMetrics, ModelMetrics, NO_TENANT};
use crate::queue::{denial_key, ModelQueue, Refusal};
use crate::tokens::Counter;
use crate::upstream::{response_headers, Upstream, UpstreamClient, UpstreamError};
use crate::usage::{EventAction, Usage};
use crate::{anthropic, cooldown, openai, sse};

/// The largest non-stream answer read from an upstream (it is parsed for usage).
pub const RESPONSE_BYTES_MAX: usize = 64 * 1024 * 1024;
/// The queue index of calls without a tenant (a gateway without keys).
const NO_TENANT_INDEX: usize = usize::MAX;

/// One served model.
pub struct ModelEntry {
    /// Its configuration.
    pub config: ModelConfig,
    /// Its upstream (index into the gateway's upstreams).
    upstream: usize,
    kind: UpstreamKind,
    /// The name, shared by every call's log line.
    name: Arc<str>,
    keys: Arc<ModelKeys>,
    counter: Counter,
    /// The (model, tenant) counters, indexed by tenant, the last for calls
    /// without one: found per call by index, not by a label lookup; each made
    /// (and shown in the metrics) at its pair's first call.
    counters: Vec<OnceLock<Arc<CallCounters>>>,
    queue: Arc<ModelQueue>,
    metrics: Arc<ModelMetrics>,
    /// The (model, class) counters, indexed by class.
    class_counters: Vec<Arc<ClassCounters>>,
    warned_above_provider: AtomicBool,
    cooldown: cooldown::Cooldown,
    /// The model's own definitions, compared with the provider's headers.
    definitions: Vec<LimitDefinition>,
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
    tenant_keys: Vec<TenantKey>,
    /// The priority classes; one without headroom when none are configured.
    classes: Arc<Classes>,
    /// The tenant label of calls without one, shared by their log lines.
    no_tenant: Arc<str>,
    client: UpstreamClient,
    metrics: Arc<GatewayMetrics>,
    body_bytes_max: usize,
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
        let classes = Arc::new(Classes::new(&config.classes));
        let mut tenants = Vec::new();
        let mut tenant_keys = Vec::new();
        for tenant in &config.tenants {
            let key = std::env::var(&tenant.api_key_env).map_err(|_| {
                format!(
                    "gateway tenant {}: environment variable {} is not set",
                    tenant.name, tenant.api_key_env
                )
            })?;
            if key.len() < crate::config::TENANT_KEY_BYTES_MIN {
                return Err(format!(
                    "gateway tenant {}: the key in {} is shorter than {} bytes",
                    tenant.name,
                    tenant.api_key_env,
                    crate::config::TENANT_KEY_BYTES_MIN
                ));
            }
            tenant_keys.push(TenantKey::new(&key));
            tenants.push(TenantEntry {
                name: Arc::from(tenant.name.as_str()),
                keys: Arc::new(TenantKeys::new(tenant)),
                class: classes.of_tenant(tenant.class.as_deref()),
            });
        }
        let mut models = HashMap::new();
        for model in &config.models {
            let upstream = upstreams
                .iter()
                .position(|u| u.config.name == model.upstream)
                .expect("validated");
            let kind = upstreams[upstream].config.kind;
            let counter = Counter::for_model(kind, model);
            for (field, tokens, limit) in counter.bounds_above_limits(model) {
                tracing::warn!(model = %model.name, field, tokens, limit,
                    "gateway: calls counted at this bound can never be admitted; set the model's field to what its calls send");
            }
            // The vocabulary loads on first use: at startup, not on a client's first call.
            counter.text("warm");
            let entry = ModelEntry {
                config: model.clone(),
                upstream,
                kind,
                name: Arc::from(model.name.as_str()),
                keys: Arc::new(ModelKeys::new(&model.upstream, model)),
                counter,
                counters: tenants
                    .iter()
                    .map(|_| OnceLock::new())
                    .chain([OnceLock::new()])
                    .collect(),
                queue: Arc::new(ModelQueue::new(classes.work_classes())),
                metrics: metrics.model(&model.name),
                class_counters: (0..classes.work_classes().len())
                    .map(|class| metrics.classes.pair(&model.name, classes.name(class)))
                    .collect(),
                warned_above_provider: AtomicBool::new(false),
                cooldown: cooldown::Cooldown::default(),
                definitions: (definitions.iter())
                    .filter(|d| {
                        d.key()
                            .as_str()
                            .starts_with(&format!("global:llm:{}:{}:", model.upstream, model.name))
                    })
                    .cloned()
                    .collect(),
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
            definitions,
        })
    }

    /// The limit definitions the configuration implies; the server defines them
    /// in its registry at startup, where the admin API shows and changes them.
    pub fn definitions(&self) -> &[LimitDefinition] {
        &self.definitions
    }

    /// The gateway's metrics, rendered by the server's `/metrics`.
    pub fn metrics(&self) -> &Arc<GatewayMetrics> {
        &self.metrics
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
        (name, &gateway.upstreams[model.upstream].config.name)
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
    match serve(gateway, endpoint, headers, body).await {
        Ok(response) => response,
        Err(error) => Shaped(endpoint.format(), error).into_response(),
    }
}

async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, GatewayError> {
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
    match http_body_util::Limited::new(body, limit).collect().await {
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
    headers: HeaderMap,
    body: Body,
) -> Result<Response, GatewayError> {
    let started = Instant::now();
    let tenant = gateway.authenticate(&headers)?;
    // Calls without a tenant (a gateway without keys) run in the top class.
    let tenant_class = tenant.map_or(0, |i| gateway.tenants[i].class);
    let class = gateway.classes.of_request(tenant_class, &headers)?;
    let bytes = read_body(&headers, body, gateway.body_bytes_max).await?;
    let object = parse_object(&bytes)?;
    let model = gateway.model_for(endpoint, model_name(&object)?)?.clone();
    let upstream = &gateway.upstreams[model.upstream];
    if endpoint == Endpoint::CountTokens {
        // Counting costs the provider nothing and is limited apart by it: forwarded as is.
        let response = gateway
            .client
            .send(upstream, Method::POST, endpoint.path(), &headers, bytes)
            .await
            .map_err(upstream_error)?;
        let (parts, body) = response.into_parts();
        let body = read_upstream_body(body, gateway.client.timeout()).await?;
        return Ok(answer(parts.status, parts.headers, Body::from(body)));
    }
    let mut call = match endpoint.format() {
        Format::OpenAi => openai::read_call(endpoint, object, &model.counter, bytes)?,
        Format::Anthropic => anthropic::read_call(object, &model.counter, bytes)?,
    };
    call.input_tokens = limits::prompt_charge(&model.keys, call.input_tokens, call.prompt_characters);
    let tenant_entry = tenant.map(|i| &gateway.tenants[i]);
    let slot = &model.counters[tenant.unwrap_or(gateway.tenants.len())];
    let counters = (slot.get_or_init(|| {
        let label = tenant_entry.map_or(NO_TENANT, |t| t.name.as_ref());
        gateway.metrics.calls(&model.config.name, label)
    }))
    .clone();
    let mut requirements = limits::requirements(
        &model.keys,
        tenant_entry.map(|t| t.keys.as_ref()),
        call.input_tokens,
        call.output_tokens,
    );
    gateway.classes.add_ceilings(class, &mut requirements);
    let class_counters = &model.class_counters[class];
    let admission = Admission {
        tenant,
        class,
        class_counters,
    };
    let lease_id = admit(&gateway, &model, &admission, requirements, &call, &counters).await?;
    counters.admitted.fetch_add(1, Ordering::Relaxed);
    class_counters.admitted.fetch_add(1, Ordering::Relaxed);
    counters
        .tokens_reserved
        .fetch_add(call.input_tokens.saturating_add(call.output_tokens), Ordering::Relaxed);
    let lease = CallLease {
        limiter: gateway.limiter.clone(),
        lease_id,
        model_keys: model.keys.clone(),
        tenant_keys: tenant_entry.map(|t| t.keys.clone()),
        queue: model.queue.clone(),
        counters,
        settle: Settle::KeepReserved,
        count_cache_reads: model.config.count_cache_reads,
        calibration: (model.counter.calibrator.clone()).zip(call.calibration_sample),
        ceilings: (gateway.classes.clone(), class),
        log: CallLog {
            endpoint: endpoint.label(),
            model: model.name.clone(),
            tenant: tenant_entry.map_or_else(|| gateway.no_tenant.clone(), |t| t.name.clone()),
            reserved: (call.input_tokens, call.output_tokens),
            status: 0,
            stream: call.stream,
        },
        started,
    };
    forward(&gateway, &model, endpoint, &headers, call, lease).await
}

/// Reserves `requirements` all or nothing: at once when nobody waits on the model
/// and the limits allow it, else in the model's queue up to `max_wait_ms`.
async fn admit(
    gateway: &Gateway,
    model: &Arc<ModelEntry>,
    admission: &Admission<'_>,
    requirements: Vec<Requirement>,
    call: &Call,
    counters: &CallCounters,
) -> Result<Option<LeaseId>, GatewayError> {
    let result = admit_in_class(gateway, model, admission, requirements, call, counters).await;
    if let Err(GatewayError {
        kind: ErrorKind::RateLimited { .. },
        ..
    }) = &result
    {
        admission.class_counters.denied.fetch_add(1, Ordering::Relaxed);
    }
    result
}

/// Who a call is admitted for: its tenant, its class and the class's counters.
struct Admission<'a> {
    tenant: Option<usize>,
    class: usize,
    class_counters: &'a ClassCounters,
}

/// [`admit`] without the class's denial count.
async fn admit_in_class(
    gateway: &Gateway,
    model: &Arc<ModelEntry>,
    admission: &Admission<'_>,
    requirements: Vec<Requirement>,
    call: &Call,
    counters: &CallCounters,
) -> Result<Option<LeaseId>, GatewayError> {
    let tenant = admission.tenant;
    if requirements.is_empty() {
        return Ok(None);
    }
    let budget_key = tenant.and_then(|i| gateway.tenants[i].keys.daily_tokens.clone());
    let is_budget = |denial: &Denial| {
        budget_key
            .as_ref()
            .is_some_and(|k| denial_key(denial) == Some(k.as_str()))
    };
    if !model.queue.is_busy(admission.class) {
        let lease_id = LeaseId::generate();
        let request =
            ReserveRequest::new(lease_id, None, requirements.clone()).map_err(|e| GatewayError::invalid(e.0))?;
        match gateway.limiter.reserve(&request).await {
            Ok(ReserveOutcome::Allowed { .. }) => return Ok(Some(lease_id)),
            Ok(ReserveOutcome::Denied(denial)) => {
                if denial.is_permanent() || is_budget(&denial) || model.config.max_wait_ms == 0 {
                    let budget = is_budget(&denial);
                    return Err(refuse(gateway, model, denial, budget, call, counters).await);
                }
            }
            Err(e) => return Err(backend_error(e)),
        }
    }
    counters.queued.fetch_add(1, Ordering::Relaxed);
    admission.class_counters.queued.fetch_add(1, Ordering::Relaxed);
    let waited = Instant::now();
    let receiver = match model.queue.enqueue(
        &gateway.limiter,
        tenant.unwrap_or(NO_TENANT_INDEX),
        admission.class,
        requirements,
    ) {
        Ok(receiver) => receiver,
        Err(_) => {
            let denial = model.queue.last_denial().unwrap_or(Denial::InsufficientCapacity {
                key: model
                    .keys
                    .rpm
                    .clone()
                    .or(model.keys.concurrency.clone())
                    .unwrap_or_else(|| ratelimiter::LimitKey::new("queue").expect("valid")),
                retry_after_ms: crate::queue::PUMP_SLEEP_MAX_MS,
            });
            let budget = is_budget(&denial);
            return Err(refuse(gateway, model, denial, budget, call, counters).await);
        }
    };
    let outcome = tokio::time::timeout(Duration::from_millis(model.config.max_wait_ms), receiver).await;
    model.metrics.queue_wait.observe(waited.elapsed());
    admission.class_counters.queue_wait.observe(waited.elapsed());
    match outcome {
        Ok(Ok(Ok(lease_id))) => Ok(Some(lease_id)),
        Ok(Ok(Err(Refusal::Denied(denial)))) => {
            let budget = is_budget(&denial);
            Err(refuse(gateway, model, denial, budget, call, counters).await)
        }
        Ok(Ok(Err(Refusal::Backend(e)))) => Err(backend_error(e)),
        Ok(Ok(Err(Refusal::QueueFull))) | Ok(Err(_)) => {
            Err(GatewayError::new(ErrorKind::Internal, "The queue failed."))
        }
        Err(_) => {
            let denial = model.queue.last_denial().unwrap_or(Denial::InsufficientCapacity {
                key: ratelimiter::LimitKey::new("queue").expect("valid"),
                retry_after_ms: crate::queue::PUMP_SLEEP_MAX_MS,
            });
            let budget = is_budget(&denial);
            Err(refuse(gateway, model, denial, budget, call, counters).await)
        }
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
    // During this server's cooldown of the model, the provider's own time is the hint.
    let cooling = cooldown::key(&model.keys).is_some_and(|k| denial_key(&denial) == Some(k.as_str()));
    let cap_ms = if cooling { model.cooldown.left_ms() } else { None };
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

/// Sends the call upstream and answers the client; the lease completes when the
/// answer (or the stream) ends.
async fn forward(
    gateway: &Arc<Gateway>,
    model: &Arc<ModelEntry>,
    endpoint: Endpoint,
    headers: &HeaderMap,
    call: Call,
    mut lease: CallLease,
) -> Result<Response, GatewayError> {
    let upstream = &gateway.upstreams[model.upstream];
    let sent = Instant::now();
    let result = gateway
        .client
        .send(
            upstream,
            Method::POST,
            endpoint.path(),
            headers,
            call.upstream_body.clone(),
        )
        .await;
    model.metrics.upstream_latency.observe(sent.elapsed());
    let response = match result {
        Ok(response) => response,
        Err(error) => {
            if matches!(error, UpstreamError::Unreachable(_)) {
                lease.settle = Settle::Refused;
            }
            let error = upstream_error(error);
            lease.log.status = error.status().as_u16();
            return Err(error);
        }
    };
    let (parts, body) = response.into_parts();
    observe_provider_limits(model, &parts.headers);
    lease.log.status = parts.status.as_u16();
    if parts.status == StatusCode::TOO_MANY_REQUESTS {
        lease.counters.provider_429.fetch_add(1, Ordering::Relaxed);
        cooldown::start(gateway.backend.clone(), &model.keys, &parts.headers, &model.cooldown);
    }
    if parts.status.is_client_error() {
        // The provider refused the call before any work (docs/gateway.md, "Reconciling").
        lease.settle = Settle::Refused;
    }
    let is_event_stream = parts
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if parts.status.is_success() && call.stream && is_event_stream {
        let stream = event_stream(body, endpoint, call.drop_usage_chunk, lease, gateway.client.timeout());
        return Ok(answer(parts.status, parts.headers, Body::from_stream(stream)));
    }
    let bytes = read_upstream_body(body, gateway.client.timeout()).await?;
    if parts.status.is_success() {
        // Only the usage is read: the rest of the answer passes through unparsed.
        let usage = match endpoint.format() {
            Format::OpenAi => openai::usage_of_body(endpoint, &bytes),
            Format::Anthropic => anthropic::usage_of_body(&bytes),
        };
        if let Some(usage) = usage {
            lease.settle = Settle::Usage(usage);
        }
    }
    drop(lease);
    Ok(answer(parts.status, parts.headers, Body::from(bytes)))
}

/// Reads the provider's rate-limit headers (by the library's
/// `ratelimiter::provider_headers`) into the model's gauges, and warns once when the
/// configured limit is above the provider's.
fn observe_provider_limits(model: &ModelEntry, headers: &HeaderMap) {
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
    let configured_tokens = model.config.tpm.or(model.config.input_tpm);
    let above = if model.keys.profile.is_some() {
        // A profile's sub-windows are compared per minute by the library.
        let upstream = &model.config.upstream;
        !ratelimiter::provider_headers::below_configured(&read, upstream, &model.config.name, &model.definitions)
            .is_empty()
    } else {
        matches!((model.config.rpm, limit_requests), (Some(ours), Some(theirs)) if ours > theirs)
            || matches!((configured_tokens, limit_tokens), (Some(ours), Some(theirs)) if ours > theirs)
    };
    if above && !model.warned_above_provider.swap(true, Ordering::Relaxed) {
        tracing::warn!(model = %model.config.name, ?limit_requests, ?limit_tokens,
            configured_rpm = ?model.config.rpm, configured_tokens = ?configured_tokens,
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
            let frame = match tokio::time::timeout(state.idle_timeout, state.body.frame()).await {
                Ok(frame) => frame,
                Err(_) => {
                    state.ended = true;
                    let error = std::io::Error::new(std::io::ErrorKind::TimedOut, "upstream stream stalled");
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
