//! The SERVER span of each call to the limiter's API (docs/observability.md,
//! "The limiter's API"): `POST /v1/reserve` and `POST /v1/complete`, a child of
//! the caller's `traceparent` when it sent one, carrying the limit keys, the
//! decision and the retry hint. Made only when the server exports traces: the
//! handlers then hold an [`ApiTracer`], else nothing of this module runs.

use axum::http::{HeaderMap, StatusCode};
use gateway::observe::trace::{
    HeaderExtractor, DECISION_DENIED, ERROR_TYPE, HTTP_REQUEST_METHOD, HTTP_RESPONSE_STATUS_CODE, HTTP_ROUTE,
    RATELIMITER_DECISION, RATELIMITER_DENIED_BY, RATELIMITER_RETRY_AFTER_MS, URL_PATH,
};
use opentelemetry::global::BoxedTracer;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Array, Context, KeyValue, StringValue, Value};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use ratelimiter::{Denial, LimitKey, ReserveOutcome};

/// The limit keys a reserve asks for or a complete reports on.
pub const RATELIMITER_LIMIT_KEYS: &str = "ratelimiter.limit_keys";
/// Why a reserve was denied, as the API's `error` says it (`insufficient_capacity`, ...).
pub const RATELIMITER_DENIAL: &str = "ratelimiter.denial";
/// [`RATELIMITER_DECISION`]'s value for a granted reserve (the API's `allowed`).
pub const DECISION_ALLOWED: &str = "allowed";
/// The most keys listed on a span: a reserve names a handful; a request of
/// thousands would make a span of megabytes.
pub const SPAN_KEYS_MAX: usize = 64;

/// The tracer of the limiter's API and the W3C propagator reading callers' contexts.
pub struct ApiTracer {
    tracer: BoxedTracer,
    propagator: TraceContextPropagator,
}

impl ApiTracer {
    /// Spans made by `tracer`.
    pub fn new(tracer: BoxedTracer) -> Self {
        Self {
            tracer,
            propagator: TraceContextPropagator::new(),
        }
    }

    /// The SERVER span of a call to `route` asking for `keys`, a child of the
    /// caller's `traceparent` when the request has one.
    pub fn start<'a>(
        &self,
        headers: &HeaderMap,
        route: &'static str,
        keys: impl Iterator<Item = &'a LimitKey>,
    ) -> ApiSpan {
        let parent = self.propagator.extract(&HeaderExtractor(headers));
        let keys: Vec<StringValue> = keys
            .take(SPAN_KEYS_MAX)
            .map(|k| StringValue::from(k.to_string()))
            .collect();
        let span = self
            .tracer
            .span_builder(format!("POST {route}"))
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new(HTTP_REQUEST_METHOD, "POST"),
                KeyValue::new(HTTP_ROUTE, route),
                KeyValue::new(URL_PATH, route),
                KeyValue::new(RATELIMITER_LIMIT_KEYS, Value::Array(Array::String(keys))),
            ])
            .start_with_context(&self.tracer, &parent);
        ApiSpan {
            cx: parent.with_span(span),
        }
    }
}

/// One call's span; it ends when dropped, after the answer is made.
pub struct ApiSpan {
    cx: Context,
}

impl ApiSpan {
    /// The reserve's decision: allowed, or denied with the binding key and the retry hint.
    pub fn decided(&self, outcome: &ReserveOutcome) {
        let span = self.cx.span();
        let ReserveOutcome::Denied(denial) = outcome else {
            span.set_attribute(KeyValue::new(RATELIMITER_DECISION, DECISION_ALLOWED));
            return;
        };
        span.set_attribute(KeyValue::new(RATELIMITER_DECISION, DECISION_DENIED));
        let code = denial.error_code();
        let reason = code.split(':').next().unwrap_or_default().to_owned();
        span.set_attribute(KeyValue::new(RATELIMITER_DENIAL, reason));
        if let Denial::InsufficientCapacity { key, .. }
        | Denial::LimitDecreasing { key, .. }
        | Denial::ExceedsCapacity { key } = denial
        {
            span.set_attribute(KeyValue::new(RATELIMITER_DENIED_BY, key.to_string()));
        }
        span.set_attribute(KeyValue::new(
            RATELIMITER_RETRY_AFTER_MS,
            denial.retry_after_ms() as i64,
        ));
    }

    /// The status the caller got; a 5xx marks the span an error.
    pub fn responded(&self, status: StatusCode) {
        let span = self.cx.span();
        span.set_attribute(KeyValue::new(HTTP_RESPONSE_STATUS_CODE, i64::from(status.as_u16())));
        if status.is_server_error() {
            span.set_attribute(KeyValue::new(ERROR_TYPE, status.as_u16().to_string()));
            span.set_status(Status::error(""));
        }
    }
}

impl Drop for ApiSpan {
    fn drop(&mut self) {
        self.cx.span().end();
    }
}
