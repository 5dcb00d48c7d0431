//! The trace of each gateway call (docs/observability.md): a SERVER span for the
//! client's request, continuing its W3C `traceparent`, carrying the limiter's
//! decision; a CLIENT span per try on a deployment, with the OpenTelemetry
//! GenAI attributes, whose context the upstream request carries.
//!
//! Every span and attribute name is written once, in [`super::semconv`]. The
//! gateway holds a [`Telemetry`] only when the server exports traces: without
//! one, a call carries no [`CallTrace`] and nothing of this module runs or allocates.
//!
//! On a call's path, each span is held here rather than in a `Context`, whose
//! span takes a lock per attribute: what a span learns is gathered as the call
//! goes and written once, when the span ends. Names are static where they are
//! one of a few, and a value used more than once (the model, the provider, the
//! tenant) is made once and shared.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderName, StatusCode};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanBuilder, SpanContext, SpanKind, Status, TraceContextExt};
use opentelemetry::{Array, Context, KeyValue, StringValue, Value};
use opentelemetry_sdk::trace::SdkTracer;

pub use super::call_facts::Served;
use super::call_facts::{status_error_type, LimiterFacts, SERVER_SPAN_ATTRIBUTES_MAX};
use super::genai_metrics::{GenAiMetrics, MetricAttributes};
pub use super::semconv::*;
use super::span_handle::SpanHandle;
pub use super::trace_context::{HeaderExtractor, TraceHeaders};
use crate::config::UpstreamKind;
use crate::wire::call::Endpoint;
use crate::wire::content::{input_messages, output_messages};
use crate::wire::response_facts::ResponseFacts;
use crate::wire::usage::Usage;

/// The most attributes a CLIENT span carries: 8 at its start (operation,
/// provider, model, stream, output bound, messages, host, port), the status,
/// 6 of the answer (`error.type`, first chunk, id, model, messages, finish
/// reasons) and 4 of usage. Its attributes' vector is made this long at once,
/// so that the span never grows it.
const CLIENT_SPAN_ATTRIBUTES_MAX: usize = 19;

/// What the gateway exports traces with: the server's tracer and the W3C
/// trace-context propagator, both made by the server's telemetry setup.
pub struct Telemetry {
    /// `None` when traces are not exported: the client's context still goes upstream.
    tracer: Option<SdkTracer>,
    /// Reads the client's context; the tries' own are written as the W3C
    /// propagator writes them ([`super::trace_context`]).
    propagator: Box<dyn TextMapPropagator + Send + Sync>,
    /// The headers the propagator reads: a request with none of them (most
    /// calls) continues the current context without the propagator's parse.
    propagated: Vec<HeaderName>,
    /// The metrics' instruments, when the server exports metrics.
    metrics: Option<GenAiMetrics>,
    /// Whether the messages are recorded (the operator's opt-in).
    capture_content: bool,
}

impl Telemetry {
    /// Spans made by `tracer`, the client's context read from its headers by `propagator`.
    pub fn new(tracer: Option<SdkTracer>, propagator: Box<dyn TextMapPropagator + Send + Sync>) -> Self {
        let propagated = (propagator.fields())
            .filter_map(|field| HeaderName::from_bytes(field.as_bytes()).ok())
            .collect();
        Self {
            tracer,
            propagator,
            propagated,
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
        let parent = if self.propagated.iter().any(|name| headers.contains_key(name)) {
            self.propagator.extract(&HeaderExtractor(headers))
        } else {
            // What the propagator extracts from headers that have none of its fields.
            Context::current()
        };
        let builder = || {
            let route = endpoint.path();
            let mut attributes = Vec::with_capacity(SERVER_SPAN_ATTRIBUTES_MAX);
            attributes.extend([
                KeyValue::new(HTTP_REQUEST_METHOD, "POST"),
                KeyValue::new(HTTP_ROUTE, route),
                KeyValue::new(URL_PATH, route),
            ]);
            SpanBuilder::from_name(server_span_name(endpoint))
                .with_kind(SpanKind::Server)
                .with_attributes(attributes)
        };
        let span = SpanHandle::start(self.tracer.as_ref(), builder, &parent);
        // The tries' parent: the span's context alone, the span staying here.
        let cx = parent.with_remote_span_context(span.span_context().clone());
        CallTrace(Arc::new(CallSpan {
            telemetry: self.clone(),
            recording: span.is_recording(),
            span,
            cx,
            facts: Mutex::new(LimiterFacts::default()),
            started: Instant::now(),
            operation: operation_name(endpoint),
        }))
    }
}

/// A call's SERVER span and its limiter facts; the span ends when the last of
/// the call's phases lets it go (the answer's last byte, or the handler's return).
struct CallSpan {
    telemetry: Arc<Telemetry>,
    /// The SERVER span: only its end writes to it, without a lock.
    span: SpanHandle,
    /// Whether the span records: an unsampled call keeps no facts for it.
    recording: bool,
    /// The span's context, the parent of the tries' CLIENT spans.
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
        let model = KeyValue::new(GEN_AI_REQUEST_MODEL, facts.model_value());
        if let Some(decision) = facts.decision {
            let mut attributes = MetricAttributes::new();
            attributes.push(KeyValue::new(RATELIMITER_DECISION, decision));
            attributes.push(model.clone());
            attributes.push_some(facts.tenant_metric.clone());
            metrics.decided(attributes.as_slice());
        }
        let mut attributes = MetricAttributes::new();
        attributes.push(KeyValue::new(GEN_AI_OPERATION_NAME, self.operation));
        attributes.push(model);
        let provider = facts.provider.clone();
        attributes.push_some(provider.map(|provider| KeyValue::new(GEN_AI_PROVIDER_NAME, provider)));
        let failed = facts.status.filter(|s| s.as_u16() >= 400);
        attributes.push_some(failed.map(|s| KeyValue::new(ERROR_TYPE, status_error_type(s.as_u16()))));
        attributes.push_some(facts.tenant_metric.clone());
        let stream = (facts.first_chunk_at).map(|at| (at.duration_since(self.started), facts.output_tokens));
        metrics.call_ended(attributes.as_slice(), self.started.elapsed(), stream);
    }
}

impl Drop for CallSpan {
    fn drop(&mut self) {
        let facts = self.facts.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        let facts = std::mem::take(facts);
        if let Some(metrics) = &self.telemetry.metrics {
            self.record_metrics(metrics, &facts);
        }
        // A 5xx marks the span an error, as the HTTP conventions ask of a
        // SERVER span (a 4xx is the client's).
        let failed = facts.status.is_some_and(|s| s.is_server_error());
        self.span.set_attributes(facts.into_attributes());
        if failed {
            self.span.set_status(Status::error(""));
        }
        self.span.end();
    }
}

/// The SERVER span of one call, shared by its phases.
#[derive(Clone)]
pub struct CallTrace(Arc<CallSpan>);

impl CallTrace {
    /// The facts, whatever a panicking holder left.
    fn facts(&self) -> MutexGuard<'_, LimiterFacts> {
        self.0.facts.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Who calls (the tenant, the directory key's id and the class) and the
    /// model it asked for.
    pub fn caller(&self, (tenant, key_id): (&str, Option<&str>), class: &str, model: &str) {
        let call = &*self.0;
        // Made before the lock: the span's values only when it records, the
        // metrics' only when they are exported.
        let spanned = call.recording.then(|| {
            let key_id = key_id.map(|id| StringValue::from(id.to_owned()));
            (
                StringValue::from(tenant.to_owned()),
                key_id,
                StringValue::from(class.to_owned()),
            )
        });
        let metered = (call.telemetry.metrics.as_ref()).map(|metrics| {
            let model = StringValue::from(Arc::<str>::from(model));
            (model, metrics.tenant_attribute(tenant))
        });
        let mut facts = self.facts();
        if let Some((tenant, key_id, class)) = spanned {
            (facts.tenant, facts.key_id, facts.class) = (Some(tenant), key_id, Some(class));
        }
        if let Some((model, tenant)) = metered {
            (facts.model, facts.tenant_metric) = (Some(model), tenant);
        }
    }

    /// The call waited `waited` in its model's queue (in all, over its tries).
    pub fn queued(&self, waited: Duration) {
        let wait_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
        let mut facts = self.facts();
        facts.queue_wait_ms = Some(facts.queue_wait_ms.unwrap_or(0).saturating_add(wait_ms));
        let Some(metrics) = &self.0.telemetry.metrics else {
            return;
        };
        let mut attributes = MetricAttributes::new();
        attributes.push(KeyValue::new(GEN_AI_REQUEST_MODEL, facts.model_value()));
        attributes.push_some(facts.tenant_metric.clone());
        drop(facts);
        metrics.queued(waited, attributes.as_slice());
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
        let key = self.0.recording.then(|| StringValue::from(key.to_owned()));
        let mut facts = self.facts();
        facts.decision = Some(DECISION_DENIED);
        facts.denied = Some((key, retry_after_ms));
    }

    /// The status the client got, written on the span when it ends.
    pub fn responded(&self, status: StatusCode) {
        self.facts().status = Some(status);
    }

    /// The CLIENT span of one try of the call on a deployment.
    pub fn start_try(&self, target: TryTarget<'_>) -> TryTrace {
        let telemetry = &self.0.telemetry;
        let operation = operation_name(target.endpoint);
        let server = host_and_port(target.base_url);
        let provider = provider_name(target.kind, target.upstream, server.map(|(host, _)| host));
        let model = StringValue::from(Arc::<str>::from(target.model));
        let builder = || {
            let mut attributes = Vec::with_capacity(CLIENT_SPAN_ATTRIBUTES_MAX);
            attributes.extend([
                KeyValue::new(GEN_AI_OPERATION_NAME, operation),
                KeyValue::new(GEN_AI_PROVIDER_NAME, provider.clone()),
                KeyValue::new(GEN_AI_REQUEST_MODEL, model.clone()),
                KeyValue::new(GEN_AI_REQUEST_STREAM, target.stream),
            ]);
            if let Some(bound) = target.max_tokens {
                attributes.push(KeyValue::new(GEN_AI_REQUEST_MAX_TOKENS, bound as i64));
            }
            if telemetry.capture_content {
                if let Some(messages) = input_messages(target.endpoint, target.request) {
                    attributes.push(KeyValue::new(GEN_AI_INPUT_MESSAGES, messages));
                }
            }
            if let Some((host, port)) = server {
                attributes.push(KeyValue::new(SERVER_ADDRESS, host.to_owned()));
                attributes.push(KeyValue::new(SERVER_PORT, i64::from(port)));
            }
            SpanBuilder::from_name(client_span_name(operation, target.model))
                .with_kind(SpanKind::Client)
                .with_attributes(attributes)
        };
        let span = SpanHandle::start(telemetry.tracer.as_ref(), builder, &self.0.cx);
        TryTrace {
            call: self.clone(),
            span_context: span.span_context().clone(),
            recording: span.is_recording(),
            state: Mutex::new(TryState {
                span: Some(span),
                response: None,
            }),
            started: Instant::now(),
            operation,
            provider,
            model,
            status: OnceLock::new(),
            errored: AtomicBool::new(false),
            error_type: OnceLock::new(),
            first_chunk_at: OnceLock::new(),
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
    /// The span's context, for the request's `traceparent`.
    span_context: SpanContext,
    /// Whether the span records: an unsampled try builds no attributes at its end.
    recording: bool,
    /// The span until the try ends, and what the answer said of itself.
    state: Mutex<TryState>,
    /// When the try was sent, for `gen_ai.client.operation.duration`.
    started: Instant,
    /// The operation, the provider and the model: the try's metrics' attributes.
    operation: &'static str,
    provider: StringValue,
    model: StringValue,
    /// The status the provider answered with.
    status: OnceLock<StatusCode>,
    /// Whether the try failed: the span's status is an error.
    errored: AtomicBool,
    /// The try's `error.type`, once it failed: the status or what went wrong
    /// on the connection; the answer's own error type wins over it.
    error_type: OnceLock<StringValue>,
    /// When a stream's first bytes came.
    first_chunk_at: OnceLock<Instant>,
}

/// What a try's end takes: its span and the answer's facts.
#[derive(Default)]
struct TryState {
    span: Option<SpanHandle>,
    response: Option<ResponseFacts>,
}

impl TryTrace {
    /// The `traceparent` (and the client's `tracestate`) of this span, to be
    /// written into the request sent upstream; a client's trace marked not
    /// sampled stays so. `None` when there is no context to pass on.
    pub fn trace_headers(&self) -> Option<TraceHeaders> {
        TraceHeaders::of(&self.span_context)
    }

    /// The provider answered with `status`; an error status is the try's failure.
    pub fn answered(&self, status: StatusCode) {
        let _ = self.status.set(status);
        if status.is_client_error() || status.is_server_error() {
            self.failed_as(|| status_error_type(status.as_u16()));
        }
    }

    /// The try failed: `error_type` is the status or what went wrong on the
    /// connection (`timeout`, ...); an error type the answer gives wins at the end.
    pub fn failed(&self, error_type: &str) {
        self.failed_as(|| StringValue::from(Arc::<str>::from(error_type)));
    }

    /// The try failed as `error_type` says, unless it already had.
    fn failed_as(&self, error_type: impl FnOnce() -> StringValue) {
        if self.error_type.get().is_none() && self.error_type.set(error_type()).is_ok() {
            self.errored.store(true, Ordering::Relaxed);
        }
    }

    /// What the answer said of itself (read as it passed, once it ended whole).
    pub fn responded(&self, facts: ResponseFacts) {
        if facts.error_type.is_some() {
            self.errored.store(true, Ordering::Relaxed);
        }
        self.state().response.get_or_insert(facts);
    }

    /// Whether the answer's text is read for `gen_ai.output.messages`.
    pub fn captures_content(&self) -> bool {
        self.call.0.telemetry.capture_content
    }

    /// The stream's first bytes came now.
    pub fn first_chunk(&self) {
        let _ = self.first_chunk_at.set(Instant::now());
    }

    /// The state, whatever a panicking holder left.
    fn state(&self) -> MutexGuard<'_, TryState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The try ended: the provider's `usage` on the CLIENT span, what the try
    /// reserved and was reconciled to on the call's SERVER span, and the CLIENT span ended.
    pub fn ended(&self, usage: Option<Usage>, served: Served) {
        let TryState { span, response } = std::mem::take(&mut *self.state());
        // The answer's own error type, else the status or the connection's failure.
        let answered = response.as_ref().and_then(|facts| facts.error_type.as_deref());
        let error_type = answered
            .map(|e| StringValue::from(Arc::<str>::from(e)))
            .or_else(|| self.error_type.get().cloned());
        let first_chunk = self.first_chunk_at.get().map(|at| at.duration_since(self.started));
        let tenant = {
            let mut facts = self.call.facts();
            facts.output_tokens = usage.map(|u| u.output_tokens);
            facts.served = Some(served);
            facts.provider = Some(self.provider.clone());
            if let Some(at) = self.first_chunk_at.get() {
                facts.first_chunk_at.get_or_insert(*at);
            }
            facts.tenant_metric.clone()
        };
        if let Some(metrics) = &self.call.0.telemetry.metrics {
            let mut attributes = MetricAttributes::new();
            attributes.push(KeyValue::new(GEN_AI_OPERATION_NAME, self.operation));
            attributes.push(KeyValue::new(GEN_AI_PROVIDER_NAME, self.provider.clone()));
            attributes.push(KeyValue::new(GEN_AI_REQUEST_MODEL, self.model.clone()));
            attributes.push_some(tenant);
            attributes.push_some(error_type.clone().map(|e| KeyValue::new(ERROR_TYPE, e)));
            let tokens = usage.map(|u| (u.input_tokens.saturating_add(u.cache_read_tokens), u.output_tokens));
            metrics.try_ended(&mut attributes, (self.started.elapsed(), first_chunk), tokens);
        }
        let Some(mut span) = span else {
            return;
        };
        if self.recording {
            span.set_attributes(self.end_attributes(error_type, response, usage, first_chunk));
        }
        if self.errored.load(Ordering::Relaxed) {
            span.set_status(Status::error(""));
        }
        span.end();
    }

    /// The status, the answer's facts, the stream's first chunk and the
    /// provider's usage, as the span's attributes at its end.
    fn end_attributes(
        &self,
        error_type: Option<StringValue>,
        response: Option<ResponseFacts>,
        usage: Option<Usage>,
        first_chunk: Option<Duration>,
    ) -> impl Iterator<Item = KeyValue> {
        let (id, model, messages, reasons) = match response {
            Some(facts) => {
                let messages = (facts.texts.as_deref()).map(|texts| output_messages(texts, &facts.finish_reasons));
                let reasons = (!facts.finish_reasons.is_empty())
                    .then(|| Array::String(facts.finish_reasons.into_iter().map(StringValue::from).collect()));
                (facts.id, facts.model, messages, reasons)
            }
            None => (None, None, None, None),
        };
        let answer = [
            (self.status.get()).map(|s| KeyValue::new(HTTP_RESPONSE_STATUS_CODE, i64::from(s.as_u16()))),
            error_type.map(|e| KeyValue::new(ERROR_TYPE, e)),
            first_chunk.map(|first| KeyValue::new(GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK, first.as_secs_f64())),
            id.map(|id| KeyValue::new(GEN_AI_RESPONSE_ID, id)),
            model.map(|model| KeyValue::new(GEN_AI_RESPONSE_MODEL, model)),
            messages.map(|messages| KeyValue::new(GEN_AI_OUTPUT_MESSAGES, messages)),
            reasons.map(|reasons| KeyValue::new(GEN_AI_RESPONSE_FINISH_REASONS, Value::Array(reasons))),
        ];
        let usage = usage.map(|usage| {
            // Every input token, cached ones included, as the conventions count them.
            let input = usage.input_tokens.saturating_add(usage.cache_read_tokens);
            let cache_read = usage.cache_read_tokens.saturating_add(usage.cached_input_tokens);
            let cache_creation = usage.cache_write_tokens.saturating_add(usage.cache_write_1h_tokens);
            [
                KeyValue::new(GEN_AI_USAGE_INPUT_TOKENS, input as i64),
                KeyValue::new(GEN_AI_USAGE_OUTPUT_TOKENS, usage.output_tokens as i64),
                KeyValue::new(GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, cache_read as i64),
                KeyValue::new(GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS, cache_creation as i64),
            ]
        });
        answer.into_iter().flatten().chain(usage.into_iter().flatten())
    }
}

impl Drop for TryTrace {
    /// A try dropped before it ended (its lease always ends it) still tells
    /// its span its status, and the call its provider, as the span ends on drop.
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(span) = state.span.as_mut() else {
            return;
        };
        if let Some(status) = self.status.get() {
            span.set_attribute(KeyValue::new(HTTP_RESPONSE_STATUS_CODE, i64::from(status.as_u16())));
        }
        if self.errored.load(Ordering::Relaxed) {
            span.set_status(Status::error(""));
        }
        self.call.facts().provider = Some(self.provider.clone());
    }
}

/// The SERVER span's name, `POST {route}` (the HTTP conventions' `{method}
/// {http.route}`), one static name per endpoint.
fn server_span_name(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::ChatCompletions => "POST /v1/chat/completions",
        Endpoint::Embeddings => "POST /v1/embeddings",
        Endpoint::Responses => "POST /v1/responses",
        Endpoint::Messages => "POST /v1/messages",
        Endpoint::CountTokens => "POST /v1/messages/count_tokens",
    }
}

/// A CLIENT span's name, `{gen_ai.operation.name} {gen_ai.request.model}` as
/// the GenAI conventions name it, made in one allocation.
fn client_span_name(operation: &str, model: &str) -> String {
    let mut name = String::with_capacity(operation.len() + 1 + model.len());
    name.push_str(operation);
    name.push(' ');
    name.push_str(model);
    name
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
/// Static but for the last, made once per try and shared by its span and
/// metrics; `host` is the upstream's base URL's.
fn provider_name(kind: UpstreamKind, upstream: &str, host: Option<&str>) -> StringValue {
    match kind {
        UpstreamKind::Anthropic => "anthropic".into(),
        UpstreamKind::Azure => "azure.ai.openai".into(),
        UpstreamKind::Openai if host.is_some_and(|h| h.ends_with(".openai.azure.com")) => "azure.ai.openai".into(),
        UpstreamKind::Openai => "openai".into(),
        UpstreamKind::OpenaiCompatible => StringValue::from(Arc::<str>::from(upstream)),
        UpstreamKind::Bedrock => "aws.bedrock".into(),
        UpstreamKind::Vertex => "gcp.vertex_ai".into(),
    }
}

/// The host and port of a base URL (`https://host[:port]/...`), the port
/// defaulting to the scheme's.
fn host_and_port(base_url: &str) -> Option<(&str, u16)> {
    // Byte searches: a `str` pattern's searcher costs more than the rest of a try's span.
    let colon = base_url.bytes().position(|b| b == b':')?;
    let (scheme, rest) = (&base_url[..colon], base_url[colon + 1..].strip_prefix("//")?);
    let authority = &rest[..rest.bytes().position(|b| b == b'/').unwrap_or(rest.len())];
    let default_port = if scheme.eq_ignore_ascii_case("https") { 443 } else { 80 };
    let explicit = authority
        .rsplit_once(':')
        .and_then(|(host, port)| Some((host, port.parse().ok()?)));
    Some(explicit.unwrap_or((authority, default_port)))
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
        let provider = |kind, upstream, base_url| {
            let host = host_and_port(base_url).map(|(host, _)| host);
            provider_name(kind, upstream, host).as_str().to_owned()
        };
        assert_eq!(host_and_port("http:/x"), None);
        assert_eq!(host_and_port("https://h:8443"), Some(("h", 8443)));
        assert_eq!(provider(UpstreamKind::Openai, "azure", azure), "azure.ai.openai");
        assert_eq!(provider(UpstreamKind::Openai, "o", "https://api.openai.com"), "openai");
        assert_eq!(provider(UpstreamKind::Anthropic, "a", "https://x"), "anthropic");
        assert_eq!(provider(UpstreamKind::Azure, "az", "https://x"), "azure.ai.openai");
        assert_eq!(provider(UpstreamKind::Bedrock, "b", "https://x"), "aws.bedrock");
        assert_eq!(provider(UpstreamKind::Vertex, "v", "https://x"), "gcp.vertex_ai");
        assert_eq!(provider(UpstreamKind::OpenaiCompatible, "vllm", "http://x"), "vllm");
    }

    #[test]
    fn the_span_names_are_the_conventions() {
        let endpoints = [
            Endpoint::ChatCompletions,
            Endpoint::Embeddings,
            Endpoint::Responses,
            Endpoint::Messages,
            Endpoint::CountTokens,
        ];
        for endpoint in endpoints {
            assert_eq!(server_span_name(endpoint), format!("POST {}", endpoint.path()));
        }
        let name = client_span_name("chat", "gpt-4o-mini");
        assert_eq!(name, "chat gpt-4o-mini");
        assert_eq!(name.capacity(), name.len(), "one allocation, of the name's length");
    }
}

#[cfg(test)]
#[path = "trace_tests.rs"]
mod span_tests;
