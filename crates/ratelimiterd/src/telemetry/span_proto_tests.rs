//! The encoder's bytes decode to the very message opentelemetry-proto's own
//! conversion builds from the same spans, field for field.

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{Event, Link, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState};
use opentelemetry::{Array, InstrumentationScope, KeyValue, StringValue, Value};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use opentelemetry_sdk::Resource;
use prost::Message;

use super::{encode_request, varint, varint_len, EncodedResource};

/// A scope as the server's tracers have one.
fn scope(name: &'static str) -> InstrumentationScope {
    InstrumentationScope::builder(name)
        .with_version("1.2.3")
        .with_schema_url("https://opentelemetry.io/schemas/1.37.0")
        .with_attributes([KeyValue::new("scope.attr", 7)])
        .build()
}

/// A span of each shape the encoder must get right.
fn span(n: u8, scope: InstrumentationScope) -> SpanData {
    let state = TraceState::from_key_value([("vendor", "v1")]).expect("a valid trace state");
    let context = SpanContext::new(
        TraceId::from_bytes([n; 16]),
        SpanId::from_bytes([n.wrapping_add(1); 8]),
        TraceFlags::SAMPLED,
        false,
        if n % 2 == 0 {
            state.clone()
        } else {
            TraceState::default()
        },
    );
    let linked = SpanContext::new(
        TraceId::from_bytes([9; 16]),
        SpanId::from_bytes([8; 8]),
        TraceFlags::default(),
        true,
        state,
    );
    let start = SystemTime::UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789 + u64::from(n));
    let mut events = SpanEvents::default();
    events
        .events
        .push(Event::new("e", start, vec![KeyValue::new("k", "v")], 1));
    events.dropped_count = 2;
    let mut links = SpanLinks::default();
    links.links.push(Link::new(linked, vec![KeyValue::new("l", 1)], 3));
    links.dropped_count = u32::from(n % 2);
    SpanData {
        span_context: context,
        parent_span_id: if n == 0 {
            SpanId::INVALID
        } else {
            SpanId::from_bytes([3; 8])
        },
        parent_span_is_remote: n % 3 == 1,
        span_kind: [SpanKind::Server, SpanKind::Client, SpanKind::Internal][usize::from(n % 3)].clone(),
        name: Cow::Owned(format!("chat model-{n}")),
        start_time: start,
        end_time: start + Duration::from_millis(12),
        attributes: vec![
            KeyValue::new("s", "text"),
            KeyValue::new("empty", ""),
            KeyValue::new("i", -42_i64),
            KeyValue::new("zero", 0_i64),
            KeyValue::new("f", 0.25),
            KeyValue::new("b", false),
            KeyValue::new(
                "reasons",
                Value::Array(Array::String(vec![StringValue::from("stop"), StringValue::from("")])),
            ),
            KeyValue::new("ints", Value::Array(Array::I64(vec![1, -1, 0]))),
            KeyValue::new("floats", Value::Array(Array::F64(vec![1.5]))),
            KeyValue::new("bools", Value::Array(Array::Bool(vec![true, false]))),
            KeyValue::new("big", i64::MAX),
            KeyValue::new("", "an empty key"),
            KeyValue::new("long", "x".repeat(300)),
            // A `KeyValue` of 127 bytes, the most one length byte holds, and one of 128.
            KeyValue::new("edge", "y".repeat(117)),
            KeyValue::new("edge", "y".repeat(118)),
            KeyValue::new(
                "a key longer than one hundred and twenty-seven bytes, so that its length takes two bytes of varint, as a long value's does",
                true,
            ),
        ],
        dropped_attributes_count: u32::from(n),
        events,
        links,
        status: match n % 3 {
            0 => Status::Unset,
            1 => Status::error("it failed"),
            _ => Status::Ok,
        },
        instrumentation_scope: scope,
    }
}

/// The service's resource with a schema URL.
fn resource() -> Resource {
    Resource::builder_empty()
        .with_service_name("ratelimiterd")
        .with_attributes([KeyValue::new("deployment.environment", "test"), KeyValue::new("n", 3)])
        .with_schema_url([KeyValue::new("x", "y")], "https://opentelemetry.io/schemas/1.37.0")
        .build()
}

/// What opentelemetry-proto's conversion makes of `spans`.
fn reference(spans: Vec<SpanData>, resource: &Resource) -> ExportTraceServiceRequest {
    let resource = ResourceAttributesWithSchema::from(resource);
    ExportTraceServiceRequest {
        resource_spans: group_spans_by_resource_and_scope(spans, &resource),
    }
}

/// What the encoder's bytes decode to.
fn encoded(spans: &[SpanData], resource: &Resource) -> ExportTraceServiceRequest {
    let (mut scratch, mut out) = (Vec::new(), Vec::new());
    encode_request(spans, &EncodedResource::new(resource), &mut scratch, &mut out);
    ExportTraceServiceRequest::decode(out.as_slice()).expect("the bytes are a request")
}

#[test]
fn a_batch_decodes_to_what_the_reference_conversion_builds() {
    let resource = resource();
    let spans: Vec<SpanData> = (0..7).map(|n| span(n, scope("ratelimiterd"))).collect();
    assert_eq!(encoded(&spans, &resource), reference(spans, &resource));
}

#[test]
fn spans_of_two_scopes_are_grouped_by_scope_in_order_of_appearance() {
    let resource = resource();
    let spans = vec![
        span(1, scope("b")),
        span(2, scope("a")),
        span(3, scope("b")),
        span(4, scope("a")),
    ];
    let request = encoded(&spans, &resource);
    assert_eq!(request.resource_spans[0].scope_spans.len(), 2);
    assert_eq!(request, reference(spans, &resource));
}

#[test]
fn the_buffers_are_reused_without_leftovers_of_the_last_batch() {
    let resource = resource();
    let encoded_resource = EncodedResource::new(&resource);
    let (mut scratch, mut out) = (Vec::new(), Vec::new());
    let big: Vec<SpanData> = (0..20).map(|n| span(n, scope("s"))).collect();
    encode_request(&big, &encoded_resource, &mut scratch, &mut out);
    let one = vec![span(5, scope("s"))];
    encode_request(&one, &encoded_resource, &mut scratch, &mut out);
    let request = ExportTraceServiceRequest::decode(out.as_slice()).expect("a request");
    assert_eq!(request, reference(one, &resource));
}

#[test]
fn a_varint_is_seven_bits_a_byte_low_first() {
    for value in [
        0,
        1,
        127,
        128,
        16_383,
        16_384,
        u64::from(u32::MAX),
        u64::MAX - 1,
        u64::MAX,
    ] {
        let mut out = Vec::new();
        varint(&mut out, value);
        // Seven bits a byte, low first, the high bit set on all but the last.
        let decoded = out
            .iter()
            .enumerate()
            .fold(0u64, |v, (i, b)| v | u64::from(b & 0x7f) << (7 * i));
        assert_eq!(decoded, value);
        assert_eq!(
            varint_len(value),
            out.len(),
            "{value}'s length, counted before it is written"
        );
        assert!(out[..out.len() - 1].iter().all(|b| b & 0x80 != 0) && out[out.len() - 1] < 0x80);
    }
}
