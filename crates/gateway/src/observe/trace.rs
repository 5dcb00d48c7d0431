//! The trace of each gateway call (docs/observability.md): a SERVER span for the
//! client's request, continuing its W3C `traceparent`, carrying the limiter's
//! decision; a CLIENT span per try on a deployment, with the OpenTelemetry
//! GenAI attributes, whose context the upstream request carries.
//!
//! Every span and attribute name is written once, here. The gateway holds a
//! [`Telemetry`] only when the server exports traces: without one, a call
//! carries no [`CallTrace`] and nothing of this module runs or allocates.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use opentelemetry::global::BoxedTracer;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Array, Context, KeyValue, StringValue, Value};

use super::genai_metrics::GenAiMetrics;
use crate::config::UpstreamKind;
use crate::wire::call::Endpoint;
use crate::wire::content::{input_messages, output_messages};
use crate::wire::response_facts::ResponseFacts;
use crate::wire::usage::Usage;

/// The version of the OpenTelemetry semantic conventions the names follow
/// (HTTP spans, GenAI client spans), exported as the tracer's schema URL.
pub const SEMCONV_SCHEMA_URL: &str = "https://opentelemetry.io/schemas/1.37.0";

/// HTTP conventions: the request's method.
pub const HTTP_REQUEST_METHOD: &str = "http.request.method";
/// HTTP conventions: the route matched (the gateway's endpoint path).
pub const HTTP_ROUTE: &str = "http.route";
/// HTTP conventions: the request's path.
pub const URL_PATH: &str = "url.path";
/// HTTP conventions: the status the client got (SERVER) or the provider sent (CLIENT).
pub const HTTP_RESPONSE_STATUS_CODE: &str = "http.response.status_code";
/// The class of a failure: the HTTP status, or `timeout` and the like.
pub const ERROR_TYPE: &str = "error.type";
/// The provider's host.
pub const SERVER_ADDRESS: &str = "server.address";
/// The provider's port.
pub const SERVER_PORT: &str = "server.port";

/// GenAI conventions: `chat` or `embeddings`.
pub const GEN_AI_OPERATION_NAME: &str = "gen_ai.operation.name";
/// GenAI conventions: who serves the model (`openai`, `anthropic`, `azure.ai.openai`, ...).
pub const GEN_AI_PROVIDER_NAME: &str = "gen_ai.provider.name";
/// GenAI conventions: the model as sent to the deployment.
pub const GEN_AI_REQUEST_MODEL: &str = "gen_ai.request.model";
/// GenAI conventions: the response's id, as the provider gave it.
pub const GEN_AI_RESPONSE_ID: &str = "gen_ai.response.id";
/// GenAI conventions: the model that served the answer, as the provider names it.
pub const GEN_AI_RESPONSE_MODEL: &str = "gen_ai.response.model";
/// GenAI conventions: why each choice finished, one per choice.
pub const GEN_AI_RESPONSE_FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
/// GenAI conventions (after v1.37): a stream's first bytes, in seconds after the try was sent.
pub const GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: &str = "gen_ai.response.time_to_first_chunk";
/// GenAI conventions: the request's messages (only on the operator's opt-in).
pub const GEN_AI_INPUT_MESSAGES: &str = "gen_ai.input.messages";
/// GenAI conventions: the answer's messages (only on the operator's opt-in).
pub const GEN_AI_OUTPUT_MESSAGES: &str = "gen_ai.output.messages";
/// GenAI conventions: the output bound sent.
pub const GEN_AI_REQUEST_MAX_TOKENS: &str = "gen_ai.request.max_tokens";
/// GenAI conventions: whether the answer is asked as a stream.
pub const GEN_AI_REQUEST_STREAM: &str = "gen_ai.request.stream";
/// GenAI conventions: every input token, cached ones included.
pub const GEN_AI_USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
/// GenAI conventions: the output tokens.
pub const GEN_AI_USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
/// GenAI conventions: the input tokens read from the provider's cache.
pub const GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: &str = "gen_ai.usage.cache_read.input_tokens";
/// GenAI conventions: the input tokens written to the provider's cache.
pub const GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS: &str = "gen_ai.usage.cache_creation.input_tokens";

/// The limiter: the call's tenant (`_none` without one).
pub const RATELIMITER_TENANT: &str = "ratelimiter.tenant";
/// The limiter: the id of the directory key the call came with (never the key).
pub const RATELIMITER_KEY_ID: &str = "ratelimiter.key_id";
/// The limiter: the call's class.
pub const RATELIMITER_CLASS: &str = "ratelimiter.class";
/// The limiter: the deployment that served the call (its last try).
pub const RATELIMITER_DEPLOYMENT: &str = "ratelimiter.deployment";
/// The limiter: `admitted` at once, `queued` then admitted, or `denied`.
pub const RATELIMITER_DECISION: &str = "ratelimiter.decision";
/// The limiter: how long the call waited in its model's queue, in milliseconds.
pub const RATELIMITER_QUEUE_WAIT_MS: &str = "ratelimiter.queue.wait_ms";
/// The limiter: the key of the limit that denied the call.
pub const RATELIMITER_DENIED_BY: &str = "ratelimiter.denied_by";
/// The limiter: the retry hint of a denial, in milliseconds.
pub const RATELIMITER_RETRY_AFTER_MS: &str = "ratelimiter.retry_after_ms";
/// The limiter: the tokens reserved (input and output bound).
pub const RATELIMITER_TOKENS_RESERVED: &str = "ratelimiter.tokens.reserved";
/// The limiter: the tokens the limits were reconciled to.
pub const RATELIMITER_TOKENS_USED: &str = "ratelimiter.tokens.used";
/// The limiter: the call's worst case in dollars at the deployment's price,
/// what its budgets in money reserve.
pub const RATELIMITER_USD_RESERVED: &str = "ratelimiter.usd.reserved";
/// The limiter: the call's cost in dollars, at the deployment's price.
pub const RATELIMITER_USD_BILLED: &str = "ratelimiter.usd.billed";

/// [`RATELIMITER_DECISION`]'s values.
pub const DECISION_ADMITTED: &str = "admitted";
/// See [`DECISION_ADMITTED`].
pub const DECISION_QUEUED: &str = "queued";
/// See [`DECISION_ADMITTED`].
pub const DECISION_DENIED: &str = "denied";

/// What the gateway exports traces with: the server's tracer and the W3C
/// trace-context propagator, both made by the server's telemetry setup.
pub struct Telemetry {
    tracer: BoxedTracer,
    propagator: Box<dyn TextMapPropagator + Send + Sync>,
    /// The metrics' instruments, when the server exports metrics.
    metrics: Option<GenAiMetrics>,
    /// Whether the messages are recorded (the operator's opt-in).
    capture_content: bool,
}

impl Telemetry {
    /// Spans made by `tracer`, contexts read from and written to headers by `propagator`.
    pub fn new(tracer: BoxedTracer, propagator: Box<dyn TextMapPropagator + Send + Sync>) -> Self {
        Self {
            tracer,
            propagator,
            metrics: None,
            capture_content: false,
        }
    }

    /// This telemetry recording each try's messages too, as
    /// `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true` asks.
    pub fn with_message_content(self) -> Self {
        Self {
            capture_content: true,
            ..self
        }
    }

    /// This telemetry recording each call's metrics with `metrics` too.
    pub fn with_metrics(self, metrics: GenAiMetrics) -> Self {
        Self {
            metrics: Some(metrics),
            ..self
        }
    }

    /// The SERVER span of a call to `endpoint`, a child of the client's
    /// `traceparent` when it sent one.
    pub fn start_call(self: &Arc<Self>, headers: &HeaderMap, endpoint: Endpoint) -> CallTrace {
        let parent = self.propagator.extract(&HeaderExtractor(headers));
        let route = endpoint.path();
        let span = self
            .tracer
            .span_builder(format!("POST {route}"))
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new(HTTP_REQUEST_METHOD, "POST"),
                KeyValue::new(HTTP_ROUTE, route),
                KeyValue::new(URL_PATH, route),
            ])
            .start_with_context(&self.tracer, &parent);
        CallTrace(Arc::new(CallSpan {
            telemetry: self.clone(),
            cx: parent.with_span(span),
            facts: Mutex::new(LimiterFacts::default()),
            started: Instant::now(),
            operation: operation_name(endpoint),
        }))
    }
}

/// The limiter's part of a call, gathered as its phases go and written on the
/// SERVER span once, when it ends: a failover or a wait changes a fact, and
/// an attribute set twice would be exported twice.
#[derive(Default)]
struct LimiterFacts {
    /// The model the client asked for, for the metrics' attributes.
    model: Option<String>,
    decision: Option<&'static str>,
    queue_wait_ms: Option<u64>,
    denied: Option<(String, Option<u64>)>,
    /// What the last try reserved and was reconciled to.
    served: Option<Served>,
    /// The caller's tenant, for the metrics when the operator opted in.
    tenant: Option<String>,
    /// The last try's provider, for the call's server metrics.
    provider: Option<String>,
    /// When the call's stream sent its first chunk.
    first_chunk_at: Option<Instant>,
    /// The last try's output tokens, as the provider reported them.
    output_tokens: Option<u64>,
    /// The status the client got.
    status: Option<u16>,
}

/// What one try reserved and was reconciled to, for the call's SERVER span.
pub struct Served {
    /// The deployment tried.
    pub deployment: Arc<str>,
    /// The tokens reserved: the input count and the output bound.
    pub reserved_tokens: u64,
    /// The tokens the limits were reconciled to; `None` while the reservation is kept.
    pub used_tokens: Option<u64>,
    /// The try's worst case in micro-dollars, when a price is known.
    pub reserved_micro_usd: Option<u64>,
    /// The try's cost in micro-dollars, when a price is known.
    pub billed_micro_usd: Option<u64>,
}

impl LimiterFacts {
    /// The facts as the SERVER span's attributes.
    fn attributes(&self) -> Vec<KeyValue> {
        let mut attributes = Vec::new();
        if let Some(decision) = self.decision {
            attributes.push(KeyValue::new(RATELIMITER_DECISION, decision));
            let wait_ms = self.queue_wait_ms.unwrap_or(0);
            attributes.push(KeyValue::new(RATELIMITER_QUEUE_WAIT_MS, wait_ms as i64));
        }
        if let Some((key, retry_after_ms)) = &self.denied {
            attributes.push(KeyValue::new(RATELIMITER_DENIED_BY, key.clone()));
            if let Some(ms) = retry_after_ms {
                attributes.push(KeyValue::new(RATELIMITER_RETRY_AFTER_MS, *ms as i64));
            }
        }
        if let Some(served) = &self.served {
            attributes.push(KeyValue::new(RATELIMITER_DEPLOYMENT, served.deployment.to_string()));
            attributes.push(KeyValue::new(
                RATELIMITER_TOKENS_RESERVED,
                served.reserved_tokens as i64,
            ));
            if let Some(tokens) = served.used_tokens {
                attributes.push(KeyValue::new(RATELIMITER_TOKENS_USED, tokens as i64));
            }
            if let Some(micro) = served.reserved_micro_usd {
                attributes.push(KeyValue::new(RATELIMITER_USD_RESERVED, micro as f64 / 1e6));
            }
            if let Some(micro) = served.billed_micro_usd {
                attributes.push(KeyValue::new(RATELIMITER_USD_BILLED, micro as f64 / 1e6));
            }
        }
        attributes
    }
}

/// A call's SERVER span and its limiter facts; the span ends when the last of
/// the call's phases lets it go (the answer's last byte, or the handler's return).
struct CallSpan {
    telemetry: Arc<Telemetry>,
    cx: Context,
    facts: Mutex<LimiterFacts>,
    /// When the call came, for `gen_ai.server.request.duration`.
    started: Instant,
    /// The call's `gen_ai.operation.name`.
    operation: &'static str,
}

impl CallSpan {
    /// The call's metrics: its decision and, as a server, its duration and a
    /// stream's time to first token and per output token.
    fn record_metrics(&self, metrics: &GenAiMetrics, facts: &LimiterFacts) {
        let model = KeyValue::new(GEN_AI_REQUEST_MODEL, facts.model.clone().unwrap_or_default());
        let tenant = facts.tenant.as_deref().and_then(|t| metrics.tenant_attribute(t));
        if let Some(decision) = facts.decision {
            let mut attributes = vec![KeyValue::new(RATELIMITER_DECISION, decision), model.clone()];
            attributes.extend(tenant.clone());
            metrics.decided(&attributes);
        }
        let mut attributes = vec![KeyValue::new(GEN_AI_OPERATION_NAME, self.operation), model];
        if let Some(provider) = &facts.provider {
            attributes.push(KeyValue::new(GEN_AI_PROVIDER_NAME, provider.clone()));
        }
        if let Some(status) = facts.status.filter(|s| *s >= 400) {
            attributes.push(KeyValue::new(ERROR_TYPE, status.to_string()));
        }
        attributes.extend(tenant);
        let stream = (facts.first_chunk_at).map(|at| (at.duration_since(self.started), facts.output_tokens));
        metrics.call_ended(&attributes, self.started.elapsed(), stream);
    }
}

impl Drop for CallSpan {
    fn drop(&mut self) {
        let facts = self.facts.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        let facts = std::mem::take(facts);
        if let Some(metrics) = &self.telemetry.metrics {
            self.record_metrics(metrics, &facts);
        }
        let span = self.cx.span();
        span.set_attributes(facts.attributes());
        span.end();
    }
}

/// The SERVER span of one call, shared by its phases.
#[derive(Clone)]
pub struct CallTrace(Arc<CallSpan>);

impl CallTrace {
    /// The facts, whatever a panicking holder left.
    fn facts(&self) -> std::sync::MutexGuard<'_, LimiterFacts> {
        self.0.facts.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Who calls (the tenant, the directory key's id and the class) and the
    /// model it asked for.
    pub fn caller(&self, (tenant, key_id): (&str, Option<&str>), class: &str, model: &str) {
        let mut facts = self.facts();
        facts.model = Some(model.to_owned());
        facts.tenant = Some(tenant.to_owned());
        drop(facts);
        let span = self.0.cx.span();
        span.set_attribute(KeyValue::new(RATELIMITER_TENANT, tenant.to_owned()));
        if let Some(id) = key_id {
            span.set_attribute(KeyValue::new(RATELIMITER_KEY_ID, id.to_owned()));
        }
        span.set_attribute(KeyValue::new(RATELIMITER_CLASS, class.to_owned()));
    }

    /// The call waited `waited` in its model's queue (in all, over its tries).
    pub fn queued(&self, waited: Duration) {
        let wait_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
        let mut facts = self.facts();
        if let Some(metrics) = &self.0.telemetry.metrics {
            let model = facts.model.clone().unwrap_or_default();
            let mut attributes = vec![KeyValue::new(GEN_AI_REQUEST_MODEL, model)];
            attributes.extend(facts.tenant.as_deref().and_then(|t| metrics.tenant_attribute(t)));
            metrics.queued(waited, &attributes);
        }
        facts.queue_wait_ms = Some(facts.queue_wait_ms.unwrap_or(0).saturating_add(wait_ms));
    }

    /// The call was admitted: at once, or after its queue wait.
    pub fn admitted(&self) {
        let mut facts = self.facts();
        facts.decision = Some(match facts.queue_wait_ms {
            Some(_) => DECISION_QUEUED,
            None => DECISION_ADMITTED,
        });
    }

    /// The call was denied by the limit `key`, with `retry_after_ms` as its hint.
    pub fn denied(&self, key: &str, retry_after_ms: Option<u64>) {
        let mut facts = self.facts();
        facts.decision = Some(DECISION_DENIED);
        facts.denied = Some((key.to_owned(), retry_after_ms));
    }

    /// The status the client got; a 5xx marks the span an error, as the HTTP
    /// conventions ask of a SERVER span (a 4xx is the client's).
    pub fn responded(&self, status: StatusCode) {
        self.facts().status = Some(status.as_u16());
        let span = self.0.cx.span();
        span.set_attribute(KeyValue::new(HTTP_RESPONSE_STATUS_CODE, i64::from(status.as_u16())));
        if status.is_server_error() {
            span.set_attribute(KeyValue::new(ERROR_TYPE, status.as_u16().to_string()));
            span.set_status(Status::error(""));
        }
    }

    /// What a try reserved and was reconciled to: the last try's is the call's.
    fn served(&self, served: Served) {
        self.facts().served = Some(served);
    }

    /// The CLIENT span of one try of the call on a deployment.
    pub fn start_try(&self, target: TryTarget<'_>) -> TryTrace {
        let telemetry = &self.0.telemetry;
        let operation = operation_name(target.endpoint);
        let provider = provider_name(target.kind, target.upstream, target.base_url);
        let mut metric_attributes = vec![
            KeyValue::new(GEN_AI_OPERATION_NAME, operation),
            KeyValue::new(GEN_AI_PROVIDER_NAME, provider.clone()),
            KeyValue::new(GEN_AI_REQUEST_MODEL, target.model.to_owned()),
        ];
        let mut attributes = metric_attributes.clone();
        let mut facts = self.facts();
        facts.provider = Some(provider);
        if let Some(metrics) = &telemetry.metrics {
            metric_attributes.extend(facts.tenant.as_deref().and_then(|t| metrics.tenant_attribute(t)));
        }
        drop(facts);
        attributes.push(KeyValue::new(GEN_AI_REQUEST_STREAM, target.stream));
        if let Some(bound) = target.max_tokens {
            attributes.push(KeyValue::new(GEN_AI_REQUEST_MAX_TOKENS, bound as i64));
        }
        if telemetry.capture_content {
            if let Some(messages) = input_messages(target.endpoint, target.request) {
                attributes.push(KeyValue::new(GEN_AI_INPUT_MESSAGES, messages));
            }
        }
        if let Some((host, port)) = host_and_port(target.base_url) {
            attributes.push(KeyValue::new(SERVER_ADDRESS, host.to_owned()));
            attributes.push(KeyValue::new(SERVER_PORT, i64::from(port)));
        }
        let span = (telemetry.tracer)
            .span_builder(format!("{operation} {}", target.model))
            .with_kind(SpanKind::Client)
            .with_attributes(attributes)
            .start_with_context(&telemetry.tracer, &self.0.cx);
        TryTrace {
            call: self.clone(),
            cx: self.0.cx.with_span(span),
            started: Instant::now(),
            metric_attributes,
            error_type: OnceLock::new(),
            response: OnceLock::new(),
            first_chunk: OnceLock::new(),
        }
    }
}

/// What a try is sent to, for its CLIENT span's attributes.
pub struct TryTarget<'a> {
    /// The endpoint called.
    pub endpoint: Endpoint,
    /// The deployment's upstream kind.
    pub kind: UpstreamKind,
    /// The upstream's configured name.
    pub upstream: &'a str,
    /// The upstream's base URL.
    pub base_url: &'a str,
    /// The model as the deployment is sent it.
    pub model: &'a str,
    /// The output bound sent, if any.
    pub max_tokens: Option<u64>,
    /// Whether a stream is asked.
    pub stream: bool,
    /// The client's request body, for its messages when they are recorded.
    pub request: &'a [u8],
}

/// The CLIENT span of one try; it ends when the try's lease completes.
pub struct TryTrace {
    call: CallTrace,
    cx: Context,
    /// When the try was sent, for `gen_ai.client.operation.duration`.
    started: Instant,
    /// The operation, provider and model: the try's metrics' attributes.
    metric_attributes: Vec<KeyValue>,
    /// The try's `error.type`, once it failed: the status or what went wrong
    /// on the connection; the answer's own error type wins over it.
    error_type: OnceLock<String>,
    /// What the answer said of itself, once it ended whole.
    response: OnceLock<ResponseFacts>,
    /// When a stream's first bytes came, after the try was sent.
    first_chunk: OnceLock<Duration>,
}

impl TryTrace {
    /// The `traceparent` (and the client's `tracestate`) of this span, for the
    /// request sent upstream; a client's trace marked not sampled stays so.
    pub fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        (self.call.0.telemetry.propagator).inject_context(&self.cx, &mut HeaderInjector(&mut headers));
        headers
    }

    /// The provider answered with `status`; an error status is the try's failure.
    pub fn answered(&self, status: StatusCode) {
        let span = self.cx.span();
        span.set_attribute(KeyValue::new(HTTP_RESPONSE_STATUS_CODE, i64::from(status.as_u16())));
        if status.is_client_error() || status.is_server_error() {
            self.failed(&status.as_u16().to_string());
        }
    }

    /// The try failed: `error_type` is the status or what went wrong on the
    /// connection (`timeout`, ...); an error type the answer gives wins at the end.
    pub fn failed(&self, error_type: &str) {
        if self.error_type.set(error_type.to_owned()).is_ok() {
            self.cx.span().set_status(Status::error(""));
        }
    }

    /// What the answer said of itself (read as it passed, once it ended whole).
    pub fn responded(&self, facts: ResponseFacts) {
        if facts.error_type.is_some() {
            self.cx.span().set_status(Status::error(""));
        }
        let _ = self.response.set(facts);
    }

    /// Whether the answer's text is read for `gen_ai.output.messages`.
    pub fn captures_content(&self) -> bool {
        self.call.0.telemetry.capture_content
    }

    /// The stream's first bytes came now.
    pub fn first_chunk(&self) {
        let _ = self.first_chunk.set(self.started.elapsed());
        self.call.facts().first_chunk_at.get_or_insert_with(Instant::now);
    }

    /// The try's `error.type`: the answer's own error type, else the status
    /// or the connection's failure; `None` when it did not fail.
    fn error_type(&self) -> Option<&str> {
        let answered = self.response.get().and_then(|facts| facts.error_type.as_deref());
        answered.or(self.error_type.get().map(String::as_str))
    }

    /// The answer's facts and the stream's first chunk, as the span's attributes.
    fn response_attributes(&self) -> Vec<KeyValue> {
        let mut attributes = Vec::new();
        if let Some(error_type) = self.error_type() {
            attributes.push(KeyValue::new(ERROR_TYPE, error_type.to_owned()));
        }
        if let Some(first) = self.first_chunk.get() {
            attributes.push(KeyValue::new(GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK, first.as_secs_f64()));
        }
        let Some(facts) = self.response.get() else {
            return attributes;
        };
        if let Some(id) = &facts.id {
            attributes.push(KeyValue::new(GEN_AI_RESPONSE_ID, id.clone()));
        }
        if let Some(model) = &facts.model {
            attributes.push(KeyValue::new(GEN_AI_RESPONSE_MODEL, model.clone()));
        }
        if let Some(texts) = &facts.texts {
            let messages = output_messages(texts, &facts.finish_reasons);
            attributes.push(KeyValue::new(GEN_AI_OUTPUT_MESSAGES, messages));
        }
        if !facts.finish_reasons.is_empty() {
            let reasons = facts
                .finish_reasons
                .iter()
                .map(|r| StringValue::from(r.clone()))
                .collect();
            attributes.push(KeyValue::new(
                GEN_AI_RESPONSE_FINISH_REASONS,
                Value::Array(Array::String(reasons)),
            ));
        }
        attributes
    }

    /// The try ended: the provider's `usage` on the CLIENT span, what the try
    /// reserved and was reconciled to on the call's SERVER span, and the CLIENT span ended.
    pub fn ended(&self, usage: Option<Usage>, served: Served) {
        let span = self.cx.span();
        span.set_attributes(self.response_attributes());
        if let Some(usage) = usage {
            // Every input token, cached ones included, as the conventions count them.
            let input = usage.input_tokens.saturating_add(usage.cache_read_tokens);
            let cache_read = usage.cache_read_tokens.saturating_add(usage.cached_input_tokens);
            let cache_creation = usage.cache_write_tokens.saturating_add(usage.cache_write_1h_tokens);
            span.set_attributes([
                KeyValue::new(GEN_AI_USAGE_INPUT_TOKENS, input as i64),
                KeyValue::new(GEN_AI_USAGE_OUTPUT_TOKENS, usage.output_tokens as i64),
                KeyValue::new(GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, cache_read as i64),
                KeyValue::new(GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS, cache_creation as i64),
            ]);
        }
        if let Some(metrics) = &self.call.0.telemetry.metrics {
            let mut attributes = self.metric_attributes.clone();
            if let Some(error_type) = self.error_type() {
                attributes.push(KeyValue::new(ERROR_TYPE, error_type.to_owned()));
            }
            let tokens = usage.map(|u| (u.input_tokens.saturating_add(u.cache_read_tokens), u.output_tokens));
            metrics.try_ended(&attributes, self.started.elapsed(), tokens);
            if let Some(first) = self.first_chunk.get() {
                metrics.first_chunk(&attributes, *first);
            }
        }
        self.call.facts().output_tokens = usage.map(|u| u.output_tokens);
        self.call.served(served);
        span.end();
    }
}

/// The GenAI conventions' `gen_ai.operation.name` of a call to `endpoint`.
fn operation_name(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Embeddings => "embeddings",
        _ => "chat",
    }
}

/// The GenAI conventions' provider name of an upstream: `openai`, `azure.ai.openai`
/// (an `azure` upstream, or an `openai` one on an Azure OpenAI host), `anthropic`,
/// `aws.bedrock`, `gcp.vertex_ai`, else the upstream's configured name
/// (<https://opentelemetry.io/docs/specs/semconv/registry/attributes/gen-ai/>).
fn provider_name(kind: UpstreamKind, upstream: &str, base_url: &str) -> String {
    match kind {
        UpstreamKind::Anthropic => "anthropic".to_owned(),
        UpstreamKind::Azure => "azure.ai.openai".to_owned(),
        UpstreamKind::Openai if host_and_port(base_url).is_some_and(|(h, _)| h.ends_with(".openai.azure.com")) => {
            "azure.ai.openai".to_owned()
        }
        UpstreamKind::Openai => "openai".to_owned(),
        UpstreamKind::OpenaiCompatible => upstream.to_owned(),
        UpstreamKind::Bedrock => "aws.bedrock".to_owned(),
        UpstreamKind::Vertex => "gcp.vertex_ai".to_owned(),
    }
}

/// The host and port of a base URL (`https://host[:port]/...`), the port
/// defaulting to the scheme's.
fn host_and_port(base_url: &str) -> Option<(&str, u16)> {
    let (scheme, rest) = base_url.split_once("://")?;
    let authority = rest.split('/').next()?;
    let default_port = if scheme.eq_ignore_ascii_case("https") { 443 } else { 80 };
    let explicit = authority
        .rsplit_once(':')
        .and_then(|(host, port)| Some((host, port.parse().ok()?)));
    Some(explicit.unwrap_or((authority, default_port)))
}

/// Reads a context from a request's headers: the gateway's calls and the
/// limiter API's (ratelimiterd) take their callers' `traceparent` alike.
pub struct HeaderExtractor<'a>(pub &'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

/// Writes a context into a request's headers.
struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(key.as_bytes()), HeaderValue::from_str(&value)) {
            self.0.insert(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_urls_host_and_port_are_read_with_the_schemes_default() {
        assert_eq!(
            host_and_port("https://api.openai.com/v1"),
            Some(("api.openai.com", 443))
        );
        assert_eq!(host_and_port("http://127.0.0.1:9000"), Some(("127.0.0.1", 9000)));
        assert_eq!(host_and_port("http://sim"), Some(("sim", 80)));
        assert_eq!(host_and_port("no scheme"), None);
        let azure = "https://acme.openai.azure.com/openai";
        assert_eq!(provider_name(UpstreamKind::Openai, "azure", azure), "azure.ai.openai");
        assert_eq!(provider_name(UpstreamKind::Anthropic, "a", "https://x"), "anthropic");
        assert_eq!(provider_name(UpstreamKind::Azure, "az", "https://x"), "azure.ai.openai");
        assert_eq!(provider_name(UpstreamKind::Bedrock, "b", "https://x"), "aws.bedrock");
        assert_eq!(provider_name(UpstreamKind::Vertex, "v", "https://x"), "gcp.vertex_ai");
        assert_eq!(
            provider_name(UpstreamKind::OpenaiCompatible, "vllm", "http://x"),
            "vllm"
        );
    }
}
