//! The spans as the SDK ends them: each fact once, on the span it belongs
//! to, with its parent, whatever order the call learned them in.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use opentelemetry::trace::{SpanKind, Status, TracerProvider};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider, Span, SpanData, SpanProcessor};

use super::*;

/// The client's trace: its id, and the span the call's SERVER span continues.
const TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";
const PARENT_ID: &str = "b7ad6b7169203331";

/// Every span ended, as the SDK hands them to an exporter.
#[derive(Debug, Clone, Default)]
struct Ended(Arc<Mutex<Vec<SpanData>>>);

impl SpanProcessor for Ended {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        self.0.lock().unwrap().push(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

impl Ended {
    fn of_kind(&self, kind: SpanKind) -> Vec<SpanData> {
        let spans = self.0.lock().unwrap();
        spans.iter().filter(|s| s.span_kind == kind).cloned().collect()
    }
}

/// Telemetry sampling as the server's default (`parentbased_always_on`), its spans to `ended`.
fn telemetry(ended: &Ended) -> Arc<Telemetry> {
    let provider = SdkTracerProvider::builder()
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)))
        .with_span_processor(ended.clone())
        .build();
    let tracer = provider.tracer("test");
    Arc::new(Telemetry::new(Some(tracer), Box::new(TraceContextPropagator::new())))
}

fn client_headers(flags: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let traceparent = format!("00-{TRACE_ID}-{PARENT_ID}-{flags}");
    headers.insert("traceparent", HeaderValue::from_str(&traceparent).unwrap());
    headers.insert("tracestate", HeaderValue::from_static("vendor=x"));
    headers
}

/// The headers `attempt` sends upstream.
fn sent_upstream(attempt: &TryTrace) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Some(trace_headers) = attempt.trace_headers() {
        trace_headers.write_into(&mut headers);
    }
    headers
}

fn target(model: &str) -> TryTarget<'_> {
    TryTarget {
        endpoint: Endpoint::ChatCompletions,
        kind: UpstreamKind::Openai,
        upstream: "openai",
        base_url: "https://api.openai.com/v1",
        model,
        max_tokens: Some(64),
        stream: false,
        request: b"{}",
    }
}

fn served(deployment: &str) -> Served {
    Served {
        deployment: Arc::from(deployment),
        reserved_tokens: 100,
        used_tokens: Some(40),
        reserved_micro_usd: None,
        billed_micro_usd: None,
    }
}

/// The value of `key`, asserting it is there once.
fn once<'a>(span: &'a SpanData, key: &str) -> &'a Value {
    let mut found = span.attributes.iter().filter(|kv| kv.key.as_str() == key);
    let value = &found
        .next()
        .unwrap_or_else(|| panic!("{} has no {key}", span.name))
        .value;
    assert!(found.next().is_none(), "{} has {key} twice", span.name);
    value
}

fn has_no_attribute_twice(span: &SpanData) {
    for KeyValue { key, .. } in &span.attributes {
        once(span, key.as_str());
    }
}

#[test]
fn a_failed_over_call_writes_each_fact_once_on_its_span() {
    let ended = Ended::default();
    let call = telemetry(&ended).start_call(&client_headers("01"), Endpoint::ChatCompletions);
    call.caller(("acme", Some("key-1")), "interactive", "gpt-4o-mini");
    call.admitted();
    let first = call.start_try(target("gpt-4o-mini-east"));
    let sent = sent_upstream(&first);
    first.answered(StatusCode::SERVICE_UNAVAILABLE);
    first.ended(None, served("east"));
    let second = call.start_try(target("gpt-4o-mini-west"));
    second.answered(StatusCode::OK);
    second.responded(ResponseFacts {
        id: Some("chatcmpl-1".into()),
        finish_reasons: vec!["stop".into()],
        ..ResponseFacts::default()
    });
    let usage = Usage {
        input_tokens: 12,
        output_tokens: 5,
        ..Usage::default()
    };
    second.ended(Some(usage), served("west"));
    call.responded(StatusCode::OK);
    drop((first, second, call));

    let [server] = <[SpanData; 1]>::try_from(ended.of_kind(SpanKind::Server)).unwrap();
    assert_eq!(server.name, "POST /v1/chat/completions");
    assert_eq!(server.span_context.trace_id().to_string(), TRACE_ID);
    assert_eq!(server.parent_span_id.to_string(), PARENT_ID);
    has_no_attribute_twice(&server);
    assert_eq!(once(&server, RATELIMITER_TENANT).as_str(), "acme");
    assert_eq!(once(&server, RATELIMITER_KEY_ID).as_str(), "key-1");
    assert_eq!(once(&server, RATELIMITER_CLASS).as_str(), "interactive");
    assert_eq!(once(&server, RATELIMITER_DECISION).as_str(), DECISION_ADMITTED);
    assert_eq!(once(&server, RATELIMITER_DEPLOYMENT).as_str(), "west", "the last try's");
    assert_eq!(*once(&server, HTTP_RESPONSE_STATUS_CODE), Value::I64(200));
    assert_eq!(server.status, Status::Unset);

    let [east, west] = <[SpanData; 2]>::try_from(ended.of_kind(SpanKind::Client)).unwrap();
    for span in [&east, &west] {
        has_no_attribute_twice(span);
        assert_eq!(span.parent_span_id, server.span_context.span_id());
        assert!(!span.parent_span_is_remote);
        assert_eq!(*once(span, GEN_AI_REQUEST_MAX_TOKENS), Value::I64(64));
    }
    assert_eq!(east.name, "chat gpt-4o-mini-east");
    let traceparent = format!("00-{TRACE_ID}-{}-01", east.span_context.span_id());
    assert_eq!(sent["traceparent"], traceparent.as_str());
    assert_eq!(sent["tracestate"], "vendor=x");
    assert_eq!(once(&east, ERROR_TYPE).as_str(), "503");
    assert_eq!(east.status, Status::error(""));
    assert_eq!(once(&west, GEN_AI_RESPONSE_ID).as_str(), "chatcmpl-1");
    assert_eq!(once(&west, GEN_AI_USAGE_OUTPUT_TOKENS), &Value::I64(5));
    assert!(west.attributes.iter().all(|kv| kv.key.as_str() != ERROR_TYPE));
    assert_eq!(west.status, Status::Unset);
}

#[test]
fn a_try_dropped_before_its_end_still_says_its_status() {
    let ended = Ended::default();
    let call = telemetry(&ended).start_call(&client_headers("01"), Endpoint::Messages);
    let attempt = call.start_try(target("claude"));
    attempt.answered(StatusCode::BAD_GATEWAY);
    drop(attempt);
    let [client] = <[SpanData; 1]>::try_from(ended.of_kind(SpanKind::Client)).unwrap();
    assert_eq!(*once(&client, HTTP_RESPONSE_STATUS_CODE), Value::I64(502));
    assert_eq!(client.status, Status::error(""));
    call.responded(StatusCode::BAD_GATEWAY);
    drop(call);
    let [server] = <[SpanData; 1]>::try_from(ended.of_kind(SpanKind::Server)).unwrap();
    assert_eq!(server.name, "POST /v1/messages");
    assert_eq!(once(&server, ERROR_TYPE).as_str(), "502");
    assert_eq!(server.status, Status::error(""));
}

#[test]
fn a_trace_the_client_did_not_sample_is_not_recorded_and_stays_so_upstream() {
    let ended = Ended::default();
    let call = telemetry(&ended).start_call(&client_headers("00"), Endpoint::Embeddings);
    call.caller(("acme", None), "batch", "text-embedding-3-small");
    call.denied("model:text-embedding-3-small", Some(1000));
    let attempt = call.start_try(target("text-embedding-3-small"));
    let sent = sent_upstream(&attempt);
    assert!(sent["traceparent"].to_str().unwrap().ends_with("-00"));
    attempt.ended(None, served("east"));
    drop((attempt, call));
    assert!(ended.0.lock().unwrap().is_empty());
}

#[test]
fn without_a_tracer_the_clients_context_goes_upstream_as_it_came() {
    // Metrics exported, traces not: nothing is recorded, the client's trace continues.
    let telemetry = Arc::new(Telemetry::new(None, Box::new(TraceContextPropagator::new())));
    let call = telemetry.start_call(&client_headers("01"), Endpoint::ChatCompletions);
    let attempt = call.start_try(target("gpt-4o-mini"));
    assert!(!attempt.recording);
    let sent = sent_upstream(&attempt);
    assert_eq!(sent["traceparent"], format!("00-{TRACE_ID}-{PARENT_ID}-01").as_str());
    assert_eq!(sent["tracestate"], "vendor=x");
    attempt.ended(None, served("east"));
    // A call without a context sends none.
    let bare = telemetry.start_call(&HeaderMap::new(), Endpoint::ChatCompletions);
    assert!(sent_upstream(&bare.start_try(target("gpt-4o-mini"))).is_empty());
}
