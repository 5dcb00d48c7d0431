//! A batch of finished spans written straight into the bytes of an OTLP
//! `ExportTraceServiceRequest` (opentelemetry-proto's `trace_service.proto`,
//! `trace.proto`, `common.proto`, `resource.proto`, v1).
//!
//! Why not the OTLP crate's own conversion: it first copies every span into
//! the generated message structs (a `String` per attribute key and value, a
//! `Vec` per span and attribute list) and only then encodes them; at a span
//! per call and per try, with some thirty attributes each, that copy cost more
//! CPU than making the spans (BENCHMARKS.md, "What tracing costs a call").
//! Here each field is written once, into one buffer reused batch after batch.
//! The bytes decode to exactly the message that conversion builds (a test
//! holds them equal), so a collector cannot tell the two apart.

use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{SpanContext, SpanKind, Status};
use opentelemetry::{Array, InstrumentationScope, KeyValue, Value};
use opentelemetry_sdk::trace::SpanData;
use opentelemetry_sdk::Resource;

/// Protobuf wire type of a varint field.
const VARINT: u8 = 0;
/// Protobuf wire type of an 8-byte field.
const FIXED64: u8 = 1;
/// Protobuf wire type of a length-delimited field (bytes, string, message).
const LEN: u8 = 2;
/// Protobuf wire type of a 4-byte field.
const FIXED32: u8 = 5;

/// `SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK`: the flags say whether the parent is remote.
const FLAG_HAS_IS_REMOTE: u32 = 0x100;
/// `SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK`: the parent is remote.
const FLAG_IS_REMOTE: u32 = 0x200;

/// The service's resource, encoded once: it heads every request.
#[derive(Debug, Clone, Default)]
pub struct EncodedResource {
    /// The `Resource` message's fields.
    message: Vec<u8>,
    /// `ResourceSpans.schema_url`.
    schema_url: String,
}

impl EncodedResource {
    /// `resource`'s attributes and schema URL, as every request sends them.
    pub fn new(resource: &Resource) -> Self {
        let mut message = Vec::new();
        for (key, value) in resource.iter() {
            key_value(&mut message, 1, key.as_str(), value);
        }
        let schema_url = resource.schema_url().unwrap_or_default().to_owned();
        Self { message, schema_url }
    }
}

/// Writes into `out` (cleared first) the request exporting `batch`, under
/// `resource`, its spans grouped by instrumentation scope in the order each
/// scope first appears. `scratch` is working room kept between batches.
pub fn encode_request(batch: &[SpanData], resource: &EncodedResource, scratch: &mut Vec<u8>, out: &mut Vec<u8>) {
    out.clear();
    scratch.clear();
    // The scopes, each with where its spans lie in `scratch`: nearly always one scope.
    let mut scopes: Vec<(&InstrumentationScope, Vec<(usize, usize)>)> = Vec::new();
    for span in batch {
        let start = scratch.len();
        span_message(scratch, span);
        let place = (start, scratch.len());
        match scopes
            .iter_mut()
            .find(|(scope, _)| **scope == span.instrumentation_scope)
        {
            Some((_, places)) => places.push(place),
            None => scopes.push((&span.instrumentation_scope, vec![place])),
        }
    }
    // The scopes' own fields, so that every length is known before its
    // message is written: a batch's spans are copied once, never moved up.
    let scopes: Vec<ScopeParts> = (scopes.into_iter())
        .map(|(scope, places)| ScopeParts::new(scope, places))
        .collect();
    let resource_field = field_len(resource.message.len());
    let scopes_len: usize = scopes.iter().map(|parts| field_len(parts.len())).sum();
    let schema_len = match resource.schema_url.len() {
        0 => 0,
        len => field_len(len),
    };
    let resource_spans_len = resource_field + scopes_len + schema_len;
    out.reserve(field_len(resource_spans_len));
    // ExportTraceServiceRequest.resource_spans (1): one ResourceSpans.
    tag(out, 1, LEN);
    varint(out, resource_spans_len as u64);
    length_delimited(out, 1, &resource.message);
    for parts in &scopes {
        tag(out, 2, LEN);
        varint(out, parts.len() as u64);
        out.extend_from_slice(&parts.head);
        for &(start, end) in &parts.places {
            length_delimited(out, 2, &scratch[start..end]);
        }
        out.extend_from_slice(&parts.tail);
    }
    string(out, 3, &resource.schema_url);
}

/// A `ScopeSpans` but its spans: the scope's message before them and its
/// schema URL after, with where its spans lie in the batch's scratch.
struct ScopeParts {
    head: Vec<u8>,
    places: Vec<(usize, usize)>,
    spans_len: usize,
    tail: Vec<u8>,
}

impl ScopeParts {
    fn new(scope: &InstrumentationScope, places: Vec<(usize, usize)>) -> Self {
        let mut head = Vec::new();
        nested(&mut head, 1, |out| {
            string(out, 1, scope.name());
            string(out, 2, scope.version().unwrap_or_default());
            for attribute in scope.attributes() {
                key_value(out, 3, attribute.key.as_str(), &attribute.value);
            }
        });
        let mut tail = Vec::new();
        string(&mut tail, 3, scope.schema_url().unwrap_or_default());
        let spans_len = places.iter().map(|(start, end)| field_len(end - start)).sum();
        Self {
            head,
            places,
            spans_len,
            tail,
        }
    }

    /// The `ScopeSpans` message's length.
    fn len(&self) -> usize {
        self.head.len() + self.spans_len + self.tail.len()
    }
}

/// The bytes of a length-delimited field of `len` bytes, its tag one byte.
fn field_len(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

/// The bytes of `value` as a varint.
fn varint_len(value: u64) -> usize {
    let bits = 64 - (value | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// A `Span` message's fields, in field order.
fn span_message(out: &mut Vec<u8>, span: &SpanData) {
    let context = &span.span_context;
    bytes(out, 1, &context.trace_id().to_bytes());
    bytes(out, 2, &context.span_id().to_bytes());
    string(out, 3, &context.trace_state().header());
    if span.parent_span_id != opentelemetry::trace::SpanId::INVALID {
        bytes(out, 4, &span.parent_span_id.to_bytes());
    }
    string(out, 5, &span.name);
    uint(out, 6, kind_number(&span.span_kind));
    fixed64(out, 7, unix_nanos(span.start_time));
    fixed64(out, 8, unix_nanos(span.end_time));
    attributes(out, 9, &span.attributes);
    uint(out, 10, u64::from(span.dropped_attributes_count));
    for event in span.events.iter() {
        nested(out, 11, |out| {
            fixed64(out, 1, unix_nanos(event.timestamp));
            string(out, 2, &event.name);
            attributes(out, 3, &event.attributes);
            uint(out, 4, u64::from(event.dropped_attributes_count));
        });
    }
    uint(out, 12, u64::from(span.events.dropped_count));
    for link in span.links.iter() {
        nested(out, 13, |out| {
            let linked = &link.span_context;
            bytes(out, 1, &linked.trace_id().to_bytes());
            bytes(out, 2, &linked.span_id().to_bytes());
            string(out, 3, &linked.trace_state().header());
            attributes(out, 4, &link.attributes);
            uint(out, 5, u64::from(link.dropped_attributes_count));
            fixed32(out, 6, flags(linked, linked.is_remote()));
        });
    }
    uint(out, 14, u64::from(span.links.dropped_count));
    nested(out, 15, |out| {
        if let Status::Error { description } = &span.status {
            string(out, 2, description);
        }
        uint(out, 3, status_code(&span.status));
    });
    fixed32(out, 16, flags(context, span.parent_span_is_remote));
}

/// `attributes` as repeated `KeyValue`s in `field`.
fn attributes(out: &mut Vec<u8>, field: u32, attributes: &[KeyValue]) {
    for attribute in attributes {
        key_value(out, field, attribute.key.as_str(), &attribute.value);
    }
}

/// A `KeyValue` in `field`.
fn key_value(out: &mut Vec<u8>, field: u32, key: &str, value: &Value) {
    if short_key_value(out, field, key.as_bytes(), value) {
        return;
    }
    nested(out, field, |out| {
        string(out, 1, key);
        nested(out, 2, |out| any_value(out, value));
    });
}

/// A `KeyValue` of a string or an integer whose lengths are all under 128
/// bytes (nearly every attribute), written in four appends with its lengths
/// known beforehand; false, writing nothing, for any other.
fn short_key_value(out: &mut Vec<u8>, field: u32, key: &[u8], value: &Value) -> bool {
    let mut integer = [0u8; 10];
    let (any_tag, value_bytes): (u8, &[u8]) = match value {
        Value::String(s) => (1 << 3 | LEN, s.as_str().as_bytes()),
        Value::I64(i) => {
            let len = put_varint(&mut integer, 0, *i as u64);
            (3 << 3 | VARINT, &integer[..len])
        }
        _ => return false,
    };
    // A string's bytes follow their length; an integer's varint follows its tag.
    let value_len_byte = usize::from(any_tag & 0x7 == LEN);
    let any_len = 1 + value_len_byte + value_bytes.len();
    let key_value_len = 2 + key.len() + 2 + any_len;
    if key.is_empty() || field >= 16 || key_value_len >= 0x80 {
        return false;
    }
    out.reserve(2 + key_value_len);
    out.extend_from_slice(&[
        (field << 3) as u8 | LEN,
        key_value_len as u8,
        1 << 3 | LEN,
        key.len() as u8,
    ]);
    out.extend_from_slice(key);
    let any = [2 << 3 | LEN, any_len as u8, any_tag, value_bytes.len() as u8];
    out.extend_from_slice(&any[..3 + value_len_byte]);
    out.extend_from_slice(value_bytes);
    true
}

/// An `AnyValue`'s one field: set, so written even when it holds its type's default.
fn any_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Bool(b) => always_uint(out, 2, u64::from(*b)),
        Value::I64(i) => always_uint(out, 3, *i as u64),
        Value::F64(f) => {
            tag(out, 4, FIXED64);
            out.extend_from_slice(&f.to_bits().to_le_bytes());
        }
        Value::String(s) => length_delimited(out, 1, s.as_str().as_bytes()),
        Value::Array(array) => nested(out, 5, |out| array_values(out, array)),
        // `Value` is non-exhaustive; the SDK's conversion cannot encode another kind either.
        _ => unreachable!("a value kind this OpenTelemetry release does not have"),
    }
}

/// An `ArrayValue`'s values.
fn array_values(out: &mut Vec<u8>, array: &Array) {
    let each = |out: &mut Vec<u8>, value: Value| nested(out, 1, |out| any_value(out, &value));
    match array {
        Array::Bool(values) => values.iter().for_each(|v| each(out, Value::Bool(*v))),
        Array::I64(values) => values.iter().for_each(|v| each(out, Value::I64(*v))),
        Array::F64(values) => values.iter().for_each(|v| each(out, Value::F64(*v))),
        Array::String(values) => {
            for v in values {
                nested(out, 1, |out| length_delimited(out, 1, v.as_str().as_bytes()));
            }
        }
        _ => unreachable!("an array kind this OpenTelemetry release does not have"),
    }
}

/// A span's flags: its context's trace flags, and whether its parent is remote.
fn flags(context: &SpanContext, remote: bool) -> u32 {
    let mut flags = u32::from(context.trace_flags().to_u8()) | FLAG_HAS_IS_REMOTE;
    if remote {
        flags |= FLAG_IS_REMOTE;
    }
    flags
}

/// `Span.SpanKind`'s number.
fn kind_number(kind: &SpanKind) -> u64 {
    match kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    }
}

/// `Status.StatusCode`'s number.
fn status_code(status: &Status) -> u64 {
    match status {
        Status::Unset => 0,
        Status::Ok => 1,
        Status::Error { .. } => 2,
    }
}

/// Nanoseconds since the Unix epoch; 0 for a time before it.
fn unix_nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// A message in `field`, its length written before it once `write` is done.
/// One byte is kept for the length, enough for most messages (an attribute);
/// a longer one (a span) moves its bytes up by what its length needs more.
fn nested(out: &mut Vec<u8>, field: u32, write: impl FnOnce(&mut Vec<u8>)) {
    tag(out, field, LEN);
    let len_at = out.len();
    out.push(0);
    write(out);
    let len = out.len() - len_at - 1;
    if len < 0x80 {
        out[len_at] = len as u8;
        return;
    }
    let mut prefix = [0u8; 10];
    let prefix_len = put_varint(&mut prefix, 0, len as u64);
    out.resize(out.len() + prefix_len - 1, 0);
    out.copy_within(len_at + 1..len_at + 1 + len, len_at + prefix_len);
    out[len_at..len_at + prefix_len].copy_from_slice(&prefix[..prefix_len]);
}

/// Bytes in `field`, even empty.
fn length_delimited(out: &mut Vec<u8>, field: u32, value: &[u8]) {
    tag(out, field, LEN);
    varint(out, value.len() as u64);
    out.extend_from_slice(value);
}

/// A `bytes` field, left out when empty (proto3's default).
fn bytes(out: &mut Vec<u8>, field: u32, value: &[u8]) {
    if !value.is_empty() {
        length_delimited(out, field, value);
    }
}

/// A `string` field, left out when empty.
fn string(out: &mut Vec<u8>, field: u32, value: &str) {
    bytes(out, field, value.as_bytes());
}

/// A varint field, left out when 0.
fn uint(out: &mut Vec<u8>, field: u32, value: u64) {
    if value != 0 {
        always_uint(out, field, value);
    }
}

/// A varint field, even 0 (a `oneof` member that is set).
fn always_uint(out: &mut Vec<u8>, field: u32, value: u64) {
    tag(out, field, VARINT);
    varint(out, value);
}

/// A `fixed64` field, left out when 0.
fn fixed64(out: &mut Vec<u8>, field: u32, value: u64) {
    if value != 0 {
        tag(out, field, FIXED64);
        out.extend_from_slice(&value.to_le_bytes());
    }
}

/// A `fixed32` field, left out when 0.
fn fixed32(out: &mut Vec<u8>, field: u32, value: u32) {
    if value != 0 {
        tag(out, field, FIXED32);
        out.extend_from_slice(&value.to_le_bytes());
    }
}

/// A field's key: its number and wire type.
fn tag(out: &mut Vec<u8>, field: u32, wire_type: u8) {
    varint(out, u64::from(field << 3 | u32::from(wire_type)));
}

/// `value` as a base-128 varint.
#[inline]
fn varint(out: &mut Vec<u8>, value: u64) {
    // Nearly every varint written (tags, lengths of keys and values) is one byte.
    if value < 0x80 {
        out.push(value as u8);
        return;
    }
    let mut buf = [0u8; 10];
    let len = put_varint(&mut buf, 0, value);
    out.extend_from_slice(&buf[..len]);
}

/// Writes `value` as a varint into `buf` at `at`; returns where it ends.
fn put_varint(buf: &mut [u8], mut at: usize, mut value: u64) -> usize {
    while value >= 0x80 {
        buf[at] = (value as u8) | 0x80;
        value >>= 7;
        at += 1;
    }
    buf[at] = value as u8;
    at + 1
}

#[cfg(test)]
#[path = "span_proto_tests.rs"]
mod tests;
