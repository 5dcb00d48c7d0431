//! The W3C trace context of a call (<https://www.w3.org/TR/trace-context/>):
//! read from the client's headers, and written into each try's request.
//!
//! The writer does what the SDK's `TraceContextPropagator::inject_context`
//! does (opentelemetry_sdk 0.33, `propagation/trace_context.rs`): nothing for
//! an invalid context; else `traceparent` as `00-{trace id}-{span id}-{flags}`,
//! only the sampled flag kept, and `tracestate` as the context's trace state
//! says it, empty when it is. It writes the `traceparent` from a fixed buffer
//! under a static name: the propagator formats a `String` and names each
//! header anew, on every try.

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::Extractor;
use opentelemetry::trace::{SpanContext, TraceFlags};

/// The bytes of a version-00 `traceparent`: `00-`, 32 hex digits of the trace
/// id, `-`, 16 of the span id, `-`, 2 of the flags.
pub const TRACEPARENT_LEN: usize = 55;

/// The hex digits, lowercase as the W3C format asks.
const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

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

/// A try's `traceparent` and `tracestate`, made once and written into its
/// request's headers (not a header map of their own, merged into it).
#[derive(Debug, Clone)]
pub struct TraceHeaders {
    traceparent: HeaderValue,
    tracestate: Option<HeaderValue>,
}

impl TraceHeaders {
    /// The headers of `span_context`, as the SDK's W3C propagator writes
    /// them; `None` for an invalid context, which writes nothing.
    pub fn of(span_context: &SpanContext) -> Option<Self> {
        if !span_context.is_valid() {
            return None;
        }
        let traceparent = HeaderValue::from_bytes(&traceparent(span_context)).expect("hex digits and dashes");
        let trace_state = span_context.trace_state().header();
        // The propagator sets the header even empty (an empty value is a valid one).
        let tracestate = if trace_state.is_empty() {
            Some(HeaderValue::from_static(""))
        } else {
            HeaderValue::from_str(&trace_state).ok()
        };
        Some(Self {
            traceparent,
            tracestate,
        })
    }

    /// Writes the headers into `headers`, over any of the same names.
    pub fn write_into(self, headers: &mut HeaderMap) {
        headers.insert(const { HeaderName::from_static("traceparent") }, self.traceparent);
        if let Some(value) = self.tracestate {
            headers.insert(const { HeaderName::from_static("tracestate") }, value);
        }
    }
}

/// The `traceparent` of `span_context`: version 00, the ids in lowercase hex,
/// and of the flags only the sampled one (the others are not version 00's).
fn traceparent(span_context: &SpanContext) -> [u8; TRACEPARENT_LEN] {
    let mut out = [b'-'; TRACEPARENT_LEN];
    out[..2].copy_from_slice(b"00");
    write_hex(&mut out[3..35], &span_context.trace_id().to_bytes());
    write_hex(&mut out[36..52], &span_context.span_id().to_bytes());
    let flags = span_context.trace_flags() & TraceFlags::SAMPLED;
    write_hex(&mut out[53..], &[flags.to_u8()]);
    out
}

/// `bytes` as hex digits into `out`, two per byte.
fn write_hex(out: &mut [u8], bytes: &[u8]) {
    assert_eq!(out.len(), bytes.len() * 2, "two digits per byte");
    for (digits, byte) in out.chunks_exact_mut(2).zip(bytes) {
        digits[0] = HEX_DIGITS[usize::from(byte >> 4)];
        digits[1] = HEX_DIGITS[usize::from(byte & 0x0f)];
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use opentelemetry::propagation::{Injector, TextMapPropagator};
    use opentelemetry::trace::{SpanId, TraceContextExt, TraceId, TraceState};
    use opentelemetry::Context;
    use opentelemetry_sdk::propagation::TraceContextPropagator;

    use super::*;

    /// Writes the SDK propagator's headers as the gateway wrote them before.
    struct HeaderInjector<'a>(&'a mut HeaderMap);

    impl Injector for HeaderInjector<'_> {
        fn set(&mut self, key: &str, value: String) {
            if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(key.as_bytes()), HeaderValue::from_str(&value)) {
                self.0.insert(name, value);
            }
        }
    }

    /// The SDK propagator's headers of `span_context`, and the writer's.
    fn both(span_context: SpanContext) -> (HeaderMap, HeaderMap) {
        let mut sdk = HeaderMap::new();
        let cx = Context::new().with_remote_span_context(span_context.clone());
        TraceContextPropagator::new().inject_context(&cx, &mut HeaderInjector(&mut sdk));
        let mut written = HeaderMap::new();
        if let Some(trace_headers) = TraceHeaders::of(&span_context) {
            trace_headers.write_into(&mut written);
        }
        (sdk, written)
    }

    fn context(flags: u8, trace_state: TraceState) -> SpanContext {
        let trace_id = TraceId::from(0x0af7_6519_16cd_43dd_8448_eb21_1c80_319c);
        let span_id = SpanId::from(0x00f0_67aa_0ba9_02b7);
        SpanContext::new(trace_id, span_id, TraceFlags::new(flags), false, trace_state)
    }

    #[test]
    fn the_headers_are_the_sdk_propagators() {
        let vendor = TraceState::from_str("vendor=x,other=y").unwrap();
        let cases = [
            ("sampled", context(1, TraceState::default())),
            ("not sampled", context(0, TraceState::default())),
            ("with a tracestate", context(1, vendor)),
            ("unknown flags", context(0xff, TraceState::default())),
            ("invalid", SpanContext::empty_context()),
        ];
        for (case, span_context) in cases {
            let (sdk, written) = both(span_context);
            assert_eq!(written, sdk, "{case}");
        }
        let (_, sampled) = both(context(1, TraceState::default()));
        let traceparent = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01";
        assert_eq!(sampled["traceparent"], traceparent);
        assert_eq!(sampled["tracestate"], "");
        let (_, unknown) = both(context(0xff, TraceState::default()));
        assert!(unknown["traceparent"].to_str().unwrap().ends_with("-01"));
        let (_, invalid) = both(SpanContext::empty_context());
        assert!(invalid.is_empty());
    }

    #[test]
    fn every_byte_is_written_as_two_lowercase_digits() {
        let mut out = [0u8; 8];
        write_hex(&mut out, &[0x00, 0x0f, 0xa0, 0xff]);
        assert_eq!(&out, b"000fa0ff");
    }
}
