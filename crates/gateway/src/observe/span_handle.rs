//! A span of a gateway call ([`super::trace`]): the SDK's own span when the
//! server exports traces, else only the context it continues, so that the
//! client's trace still reaches the provider.
//!
//! The SDK's span type is held as it is, not behind the API's boxed span:
//! every attribute set on a boxed span is one dynamic call through two
//! layers, and a call's two spans take some thirty.

use opentelemetry::trace::{Span as _, SpanBuilder, SpanContext, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, Span};

/// One span of a call, recorded or not.
// The recorded span is the large variant and the one of every call when
// traces are exported: boxing it would cost an allocation per span.
#[allow(clippy::large_enum_variant)]
pub enum SpanHandle {
    /// The SDK's span, exported when it ends (if sampled).
    Recorded(Span),
    /// No tracer: the parent's context, passed on as it came.
    Context(SpanContext),
}

impl SpanHandle {
    /// The span `builder` makes under `parent` with `tracer`; without one,
    /// the parent's context (what the API's no-op tracer gives), `builder`
    /// not made at all.
    pub fn start(tracer: Option<&SdkTracer>, builder: impl FnOnce() -> SpanBuilder, parent: &Context) -> Self {
        match tracer {
            Some(tracer) => Self::Recorded(tracer.build_with_context(builder(), parent)),
            None => Self::Context(parent.span().span_context().clone()),
        }
    }

    /// The span's context: its ids and flags, for its children and the request sent upstream.
    pub fn span_context(&self) -> &SpanContext {
        match self {
            Self::Recorded(span) => span.span_context(),
            Self::Context(context) => context,
        }
    }

    /// Whether what is set on the span is kept.
    pub fn is_recording(&self) -> bool {
        match self {
            Self::Recorded(span) => span.is_recording(),
            Self::Context(_) => false,
        }
    }

    /// Sets `attributes` on a recorded span.
    pub fn set_attributes(&mut self, attributes: impl IntoIterator<Item = KeyValue>) {
        if let Self::Recorded(span) = self {
            span.set_attributes(attributes);
        }
    }

    /// Sets one attribute on a recorded span.
    pub fn set_attribute(&mut self, attribute: KeyValue) {
        if let Self::Recorded(span) = self {
            span.set_attribute(attribute);
        }
    }

    /// Sets the span's status.
    pub fn set_status(&mut self, status: Status) {
        if let Self::Recorded(span) = self {
            span.set_status(status);
        }
    }

    /// Ends the span (a recorded one is exported then, if sampled).
    pub fn end(&mut self) {
        if let Self::Recorded(span) = self {
            span.end();
        }
    }
}
