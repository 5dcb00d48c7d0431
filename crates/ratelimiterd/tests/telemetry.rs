//! The gateway's traces and metrics over OTLP through the real `ratelimiterd`
//! binary (docs/observability.md), decoded by an OTLP/HTTP receiver in this
//! process; upstream stubs record the `traceparent` each try is sent with. A
//! served call, a queued one, a failover, a denial, a stream, an unsampled
//! caller, export off, the docs' example, the metrics' names, units and
//! attributes, a slow and failing collector, a bad variable in `check-config`.

#[path = "telemetry_support/otlp.rs"]
mod otlp;
#[path = "telemetry_support/rig.rs"]
mod rig;
mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode as SpanStatus;
use otlp::{
    attribute, boolean, hex, int, kind, metric, spans_of, start_receiver, string, Any, Span, SpanKind, SPANS_WAIT,
};
use rig::{start_server, KEY, KEY_ENV};
use serde_json::json;
use support::gateway_setup::{client, gateway_addr, send, Answer, HttpClient};
use support::{temp_dir, write_config_on, BackendConfig};

/// The caller's trace, sampled, and its parent span.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

/// An upstream that records each request's headers and answers `status`
/// (200: a chat completion with its usage, streamed when asked) after `delay`.
async fn start_upstream_after(status: StatusCode, delay: Duration) -> (SocketAddr, Arc<Mutex<Vec<HeaderMap>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let recorded = seen.clone();
    let answer = move |headers: HeaderMap, request: Bytes| {
        recorded.lock().unwrap().push(headers);
        let stream = String::from_utf8_lossy(&request).contains("\"stream\":true");
        let body = json!({
            "id": "chatcmpl-telemetry", "object": "chat.completion", "model": "gpt-4o-mini",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
        });
        async move {
            tokio::time::sleep(delay).await;
            if status.is_success() && stream {
                let usage = json!({"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17});
                let last = json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "model": "gpt-4o-mini",
                    "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}], "usage": usage});
                let events = format!("data: {last}\n\ndata: [DONE]\n\n");
                ([("content-type", "text/event-stream")], events).into_response()
            } else if status.is_success() {
                (status, axum::Json(body)).into_response()
            } else {
                (
                    status,
                    axum::Json(json!({"error": {"message": "down", "type": "server_error"}})),
                )
                    .into_response()
            }
        }
    };
    let router = Router::new().route("/v1/chat/completions", post(answer));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    (addr, seen)
}

/// [`start_upstream_after`] with no delay.
async fn start_upstream(status: StatusCode) -> (SocketAddr, Arc<Mutex<Vec<HeaderMap>>>) {
    start_upstream_after(status, Duration::ZERO).await
}

/// A served model on `good`, a pool whose first deployment (`bad`) fails, and
/// a model of one request a minute that denies at once, a model of one call at
/// a time on `slow` whose calls queue; one tenant.
fn gateway_section(good: SocketAddr, bad: SocketAddr, slow: SocketAddr) -> String {
    format!(
        "gateway:\n  listen_addr: \"127.0.0.1:0\"\n  upstreams:\n    - {{name: good, kind: openai, base_url: \"http://{good}\"}}\n    - {{name: bad, kind: openai, base_url: \"http://{bad}\"}}\n    - {{name: slow, kind: openai, base_url: \"http://{slow}\"}}\n  models:\n    - {{name: gpt-4o-mini, upstream: good, rpm: 1000, tpm: 1000000, concurrency: 8, max_output_tokens_default: 64}}\n    - {{name: pooled, max_output_tokens_default: 64, deployments: [{{upstream: bad, model: gpt-4o, priority: 0, rpm: 1000, tpm: 1000000}}, {{upstream: good, model: gpt-4o, priority: 1, rpm: 1000, tpm: 1000000}}]}}\n    - {{name: tiny, max_wait_ms: 0, max_output_tokens_default: 64, deployments: [{{upstream: good, model: gpt-4.1-mini, rpm: 1}}]}}\n    - {{name: single, max_wait_ms: 10000, max_output_tokens_default: 64, deployments: [{{upstream: slow, model: gpt-4o-mini, concurrency: 1}}]}}\n  tenants:\n    - {{name: team, api_key_env: {KEY_ENV}}}\n"
    )
}

/// A chat call to `model` with `extra` headers.
async fn chat(client: &HttpClient, gateway: SocketAddr, model: &str, extra: &[(&str, &str)]) -> Answer {
    let bearer = format!("Bearer {KEY}");
    let mut headers = vec![("authorization", bearer.as_str())];
    headers.extend_from_slice(extra);
    let body = json!({"model": model, "messages": [{"role": "user", "content": "hello"}]});
    let url = format!("http://{gateway}/v1/chat/completions");
    send(client, hyper::Method::POST, url, &headers, Some(body)).await
}

/// A traceparent of a fresh trace numbered `n`, sampled or not.
fn traceparent(n: u8, sampled: bool) -> (String, String) {
    let trace_id = format!("{:032x}", 0x1000_u128 + u128::from(n));
    let flags = if sampled { "01" } else { "00" };
    (trace_id.clone(), format!("00-{trace_id}-{PARENT_ID}-{flags}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_a_served_call_continues_the_callers_trace() {
    let (receiver, got) = start_receiver().await;
    let (good, good_seen) = start_upstream(StatusCode::OK).await;
    let (bad, _) = start_upstream(StatusCode::SERVICE_UNAVAILABLE).await;
    let dir = temp_dir("telemetry-served");
    let endpoint = format!("http://{receiver}");
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
    ];
    let server = start_server(&dir, &gateway_section(good, bad, good), &env);
    let (client, gateway) = (client(), gateway_addr(&server));
    let parent = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    let answer = chat(
        &client,
        gateway,
        "gpt-4o-mini",
        &[("traceparent", &parent), ("tracestate", "vendor=x")],
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let spans = spans_of(&got, TRACE_ID, 2).await;
    let (service, server_span) = spans
        .iter()
        .find(|(_, s)| kind(s, SpanKind::Server))
        .expect("a SERVER span");
    let (_, client_span) = spans
        .iter()
        .find(|(_, s)| kind(s, SpanKind::Client))
        .expect("a CLIENT span");
    assert_eq!(service, "ratelimiterd");
    assert_eq!(server_span.name, "POST /v1/chat/completions");
    assert_eq!(
        hex(&server_span.parent_span_id),
        PARENT_ID,
        "the caller's span is the parent"
    );
    let attrs = &server_span.attributes;
    assert_eq!(string(attrs, "http.request.method").as_deref(), Some("POST"));
    assert_eq!(string(attrs, "http.route").as_deref(), Some("/v1/chat/completions"));
    assert_eq!(int(attrs, "http.response.status_code"), Some(200));
    assert_eq!(string(attrs, "ratelimiter.tenant").as_deref(), Some("team"));
    assert!(string(attrs, "ratelimiter.class").is_some(), "{attrs:?}");
    assert_eq!(string(attrs, "ratelimiter.decision").as_deref(), Some("admitted"));
    assert_eq!(int(attrs, "ratelimiter.queue.wait_ms"), Some(0));
    assert_eq!(string(attrs, "ratelimiter.deployment").as_deref(), Some("good"));
    assert!(
        int(attrs, "ratelimiter.tokens.reserved").is_some_and(|t| t >= 64),
        "{attrs:?}"
    );
    assert_eq!(int(attrs, "ratelimiter.tokens.used"), Some(17));
    let dollars = |key| match attribute(attrs, key) {
        Some(Any::DoubleValue(usd)) => *usd,
        _ => panic!("{key}: {attrs:?}"),
    };
    let (reserved, billed) = (dollars("ratelimiter.usd.reserved"), dollars("ratelimiter.usd.billed"));
    assert!(
        billed > 0.0 && reserved > billed,
        "reserved {reserved}, billed {billed}"
    );
    assert_eq!(client_span.name, "chat gpt-4o-mini");
    assert_eq!(client_span.parent_span_id, server_span.span_id);
    let attrs = &client_span.attributes;
    assert_eq!(string(attrs, "gen_ai.operation.name").as_deref(), Some("chat"));
    assert_eq!(string(attrs, "gen_ai.provider.name").as_deref(), Some("openai"));
    assert!(attribute(attrs, "gen_ai.system").is_none());
    assert_eq!(string(attrs, "gen_ai.request.model").as_deref(), Some("gpt-4o-mini"));
    assert_eq!(int(attrs, "gen_ai.usage.input_tokens"), Some(12));
    assert_eq!(int(attrs, "gen_ai.usage.output_tokens"), Some(5));
    assert_eq!(string(attrs, "server.address").as_deref(), Some("127.0.0.1"));
    assert_eq!(int(attrs, "server.port"), Some(i64::from(good.port())));
    assert_eq!(int(attrs, "http.response.status_code"), Some(200));
    // The request sent upstream is the CLIENT span's child, with the caller's tracestate.
    let upstream = good_seen.lock().unwrap()[0].clone();
    let sent = format!("00-{TRACE_ID}-{}-01", hex(&client_span.span_id));
    assert_eq!(
        upstream.get("traceparent").and_then(|v| v.to_str().ok()),
        Some(sent.as_str())
    );
    assert_eq!(
        upstream.get("tracestate").and_then(|v| v.to_str().ok()),
        Some("vendor=x")
    );
    // Never the key, in any attribute of any span; no attribute twice.
    let all = got.lock().unwrap().spans.clone();
    for (_, span) in &all {
        let attributes = format!("{:?}", span.attributes);
        // Nor the messages: content is never recorded.
        assert!(!attributes.contains(KEY) && !attributes.contains("hello"), "{span:?}");
        let keys: std::collections::HashSet<&str> = span.attributes.iter().map(|kv| kv.key.as_str()).collect();
        assert_eq!(keys.len(), span.attributes.len(), "{span:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_a_queued_call_says_how_long_it_waited() {
    let (receiver, got) = start_receiver().await;
    let (good, _) = start_upstream(StatusCode::OK).await;
    let (slow, _) = start_upstream_after(StatusCode::OK, Duration::from_millis(400)).await;
    let dir = temp_dir("telemetry-queued");
    let endpoint = format!("http://{receiver}");
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
    ];
    let server = start_server(&dir, &gateway_section(good, good, slow), &env);
    let (client, gateway) = (client(), gateway_addr(&server));
    let ((first, first_parent), (second, second_parent)) = (traceparent(5, true), traceparent(6, true));
    // `single` serves one call at a time: the second waits for the first.
    let first_headers = [("traceparent", first_parent.as_str())];
    let one = chat(&client, gateway, "single", &first_headers);
    let two = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        chat(&client, gateway, "single", &[("traceparent", &second_parent)]).await
    };
    let (one, two) = tokio::join!(one, two);
    assert_eq!((one.status, two.status), (200, 200), "{} {}", one.body, two.body);
    let server_span =
        |spans: Vec<(String, Span)>| spans.into_iter().find(|(_, s)| kind(s, SpanKind::Server)).unwrap().1;
    let at_once = server_span(spans_of(&got, &first, 2).await);
    assert_eq!(
        string(&at_once.attributes, "ratelimiter.decision").as_deref(),
        Some("admitted")
    );
    assert_eq!(int(&at_once.attributes, "ratelimiter.queue.wait_ms"), Some(0));
    let queued = server_span(spans_of(&got, &second, 2).await);
    assert_eq!(
        string(&queued.attributes, "ratelimiter.decision").as_deref(),
        Some("queued")
    );
    let waited = int(&queued.attributes, "ratelimiter.queue.wait_ms").unwrap();
    assert!((100..=5_000).contains(&waited), "waited {waited} ms");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_a_failover_a_denial_and_an_unsampled_caller() {
    let (receiver, got) = start_receiver().await;
    let (good, good_seen) = start_upstream(StatusCode::OK).await;
    let (bad, bad_seen) = start_upstream(StatusCode::SERVICE_UNAVAILABLE).await;
    let dir = temp_dir("telemetry-failover");
    let traces = format!("http://{receiver}/v1/traces");
    let env = [
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", traces.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
    ];
    let server = start_server(&dir, &gateway_section(good, bad, good), &env);
    let (client, gateway) = (client(), gateway_addr(&server));
    // A failover: the first deployment answers 503, the second serves.
    let (failover, parent) = traceparent(1, true);
    assert_eq!(
        chat(&client, gateway, "pooled", &[("traceparent", &parent)])
            .await
            .status,
        200
    );
    let spans = spans_of(&got, &failover, 3).await;
    let tries: Vec<&Span> = (spans.iter().map(|(_, s)| s))
        .filter(|s| kind(s, SpanKind::Client))
        .collect();
    assert_eq!(tries.len(), 2, "{spans:?}");
    let failed = tries
        .iter()
        .find(|s| string(&s.attributes, "error.type").is_some())
        .expect("a failed try");
    assert_eq!(string(&failed.attributes, "error.type").as_deref(), Some("503"));
    assert_eq!(failed.status.as_ref().map(|s| s.code), Some(SpanStatus::Error as i32));
    assert_eq!(int(&failed.attributes, "server.port"), Some(i64::from(bad.port())));
    let served = tries
        .iter()
        .find(|s| string(&s.attributes, "error.type").is_none())
        .expect("a served try");
    assert_eq!(int(&served.attributes, "server.port"), Some(i64::from(good.port())));
    assert_eq!(bad_seen.lock().unwrap().len(), 1);
    let server_span = &spans.iter().find(|(_, s)| kind(s, SpanKind::Server)).unwrap().1;
    assert_eq!(
        string(&server_span.attributes, "ratelimiter.deployment").as_deref(),
        Some("good")
    );
    // A denial: `tiny` admits one request a minute and never waits.
    assert_eq!(chat(&client, gateway, "tiny", &[]).await.status, 200);
    let (denied, parent) = traceparent(2, true);
    let answer = chat(&client, gateway, "tiny", &[("traceparent", &parent)]).await;
    assert_eq!(answer.status, 429, "{}", answer.body);
    let spans = spans_of(&got, &denied, 1).await;
    assert_eq!(spans.len(), 1, "no try: {spans:?}");
    let attrs = &spans[0].1.attributes;
    assert_eq!(string(attrs, "ratelimiter.decision").as_deref(), Some("denied"));
    assert!(
        string(attrs, "ratelimiter.denied_by").is_some_and(|k| k.ends_with(":rpm")),
        "{attrs:?}"
    );
    let hint: i64 = answer.headers["retry-after-ms"].to_str().unwrap().parse().unwrap();
    assert_eq!(int(attrs, "ratelimiter.retry_after_ms"), Some(hint));
    assert_eq!(int(attrs, "http.response.status_code"), Some(429));
    // A caller's unsampled trace: passed on unsampled, and not exported.
    let (unsampled, parent) = traceparent(3, false);
    let before = good_seen.lock().unwrap().len();
    assert_eq!(
        chat(&client, gateway, "gpt-4o-mini", &[("traceparent", &parent)])
            .await
            .status,
        200
    );
    let upstream = good_seen.lock().unwrap()[before].clone();
    let sent = upstream["traceparent"].to_str().unwrap().to_owned();
    assert!(
        sent.starts_with(&format!("00-{unsampled}-")) && sent.ends_with("-00"),
        "{sent}"
    );
    assert_ne!(sent, parent, "the gateway's span is the upstream's parent");
    // A sampled call after it is exported; by then the unsampled one would have been.
    let (after, parent) = traceparent(4, true);
    assert_eq!(
        chat(&client, gateway, "gpt-4o-mini", &[("traceparent", &parent)])
            .await
            .status,
        200
    );
    spans_of(&got, &after, 2).await;
    let leaked = got
        .lock()
        .unwrap()
        .spans
        .iter()
        .any(|(_, s)| hex(&s.trace_id) == unsampled);
    assert!(!leaked, "an unsampled trace was exported");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_nothing_is_exported_or_propagated_when_export_is_off() {
    let (receiver, got) = start_receiver().await;
    let (good, good_seen) = start_upstream(StatusCode::OK).await;
    let dir = temp_dir("telemetry-off");
    let endpoint = format!("http://{receiver}");
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_SDK_DISABLED", "true"),
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
    ];
    let server = start_server(&dir, &gateway_section(good, good, good), &env);
    let (client, gateway) = (client(), gateway_addr(&server));
    let parent = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    assert_eq!(
        chat(&client, gateway, "gpt-4o-mini", &[("traceparent", &parent)])
            .await
            .status,
        200
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        got.lock().unwrap().spans.is_empty(),
        "spans exported with OTEL_SDK_DISABLED=true"
    );
    let upstream = good_seen.lock().unwrap()[0].clone();
    assert!(upstream.get("traceparent").is_none(), "{upstream:?}");
    assert!(!server.logs().iter().any(|l| l.contains("OTLP")), "{:?}", server.logs());
}

/// The `telemetry:` example of docs/observability.md, its endpoint moved to the receiver.
fn docs_example(receiver: SocketAddr) -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/observability.md")).unwrap();
    let block = (doc.split("```yaml\n").nth(1))
        .and_then(|rest| rest.split("```").next())
        .expect("a yaml block");
    assert!(block.starts_with("telemetry:\n"), "{block}");
    block.replace("http://127.0.0.1:4318", &format!("http://{receiver}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_docs_example() {
    let (receiver, got) = start_receiver().await;
    let (good, _) = start_upstream(StatusCode::OK).await;
    let dir = temp_dir("telemetry-docs");
    let sections = format!("{}{}", gateway_section(good, good, good), docs_example(receiver));
    let server = start_server(&dir, &sections, &[("OTEL_BSP_SCHEDULE_DELAY", "50")]);
    let (client, gateway) = (client(), gateway_addr(&server));
    let parent = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    assert_eq!(
        chat(&client, gateway, "gpt-4o-mini", &[("traceparent", &parent)])
            .await
            .status,
        200
    );
    let spans = spans_of(&got, TRACE_ID, 2).await;
    assert!(spans.iter().all(|(service, _)| service == "llm-gateway"), "{spans:?}");
    let names: HashMap<String, i32> = spans.iter().map(|(_, s)| (s.name.clone(), s.kind)).collect();
    assert_eq!(names.get("POST /v1/chat/completions"), Some(&(SpanKind::Server as i32)));
    assert_eq!(names.get("chat gpt-4o-mini"), Some(&(SpanKind::Client as i32)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_metrics_of_tries_and_decisions() {
    let (receiver, got) = start_receiver().await;
    let (good, _) = start_upstream(StatusCode::OK).await;
    let (bad, _) = start_upstream(StatusCode::SERVICE_UNAVAILABLE).await;
    let dir = temp_dir("telemetry-metrics");
    let endpoint = format!("http://{receiver}");
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_METRIC_EXPORT_INTERVAL", "100"),
    ];
    let server = start_server(&dir, &gateway_section(good, bad, good), &env);
    let (client, gateway) = (client(), gateway_addr(&server));
    assert_eq!(chat(&client, gateway, "gpt-4o-mini", &[]).await.status, 200);
    assert_eq!(chat(&client, gateway, "pooled", &[]).await.status, 200);
    assert_eq!(chat(&client, gateway, "tiny", &[]).await.status, 200);
    assert_eq!(chat(&client, gateway, "tiny", &[]).await.status, 429);
    let served = [
        ("gen_ai.request.model", "gpt-4o-mini"),
        ("gen_ai.provider.name", "openai"),
    ];
    let input = [served.as_slice(), &[("gen_ai.token.type", "input")]].concat();
    let (unit, points) = metric(&got, "gen_ai.client.token.usage", &input).await;
    assert_eq!((unit.as_str(), points[0].1, points[0].2), ("{token}", 1, 12.0));
    let output = [served.as_slice(), &[("gen_ai.token.type", "output")]].concat();
    let (_, points) = metric(&got, "gen_ai.client.token.usage", &output).await;
    assert_eq!((points[0].1, points[0].2), (1, 5.0));
    let failed = [("gen_ai.request.model", "gpt-4o"), ("error.type", "503")];
    let (unit, points) = metric(&got, "gen_ai.client.operation.duration", &failed).await;
    assert_eq!((unit.as_str(), points.len(), points[0].1), ("s", 1, 1));
    // Two tries of the pooled call, the second once its answer has ended.
    let started = Instant::now();
    loop {
        let model = [("gen_ai.request.model", "gpt-4o")];
        let (_, tries) = metric(&got, "gen_ai.client.operation.duration", &model).await;
        if tries.iter().map(|(_, count, _)| count).sum::<u64>() == 2 {
            break;
        }
        assert!(started.elapsed() < SPANS_WAIT, "{tries:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let denied = [("ratelimiter.decision", "denied"), ("gen_ai.request.model", "tiny")];
    let (unit, points) = metric(&got, "ratelimiter.gateway.decisions", &denied).await;
    assert_eq!((unit.as_str(), points[0].1), ("{call}", 1));
    let admitted = [("ratelimiter.decision", "admitted"), ("gen_ai.request.model", "tiny")];
    assert_eq!(metric(&got, "ratelimiter.gateway.decisions", &admitted).await.1[0].1, 1);
    // Tenant and key stay off the metrics.
    let all = format!("{:?}", got.lock().unwrap().metrics);
    assert!(!all.contains("ratelimiter.tenant") && !all.contains(KEY), "{all}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_a_collector_that_is_slow_and_failing_delays_no_call() {
    // Every export waits 2 s, then is refused with a 503.
    async fn refuse() -> StatusCode {
        tokio::time::sleep(Duration::from_secs(2)).await;
        StatusCode::SERVICE_UNAVAILABLE
    }
    let router = Router::new()
        .route("/v1/traces", post(refuse))
        .route("/v1/metrics", post(refuse));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let collector = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    let (good, _) = start_upstream(StatusCode::OK).await;
    let dir = temp_dir("telemetry-slow-collector");
    let endpoint = format!("http://{collector}");
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "10"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "10"),
    ];
    let server = start_server(&dir, &gateway_section(good, good, good), &env);
    let (client, gateway) = (client(), gateway_addr(&server));
    let started = Instant::now();
    for _ in 0..20 {
        assert_eq!(chat(&client, gateway, "gpt-4o-mini", &[]).await.status, 200);
    }
    let took = started.elapsed();
    // An export waited on would take 2 s per call; twenty calls take a few ms each.
    assert!(took < Duration::from_secs(5), "20 calls took {took:?}");
}

#[test]
fn telemetry_a_bad_variable_is_named_by_check_config() {
    let dir = temp_dir("telemetry-check");
    let config = write_config_on(&dir, BackendConfig::Memory, "", "");
    let check = |sampler: &str| {
        std::process::Command::new(support::BIN)
            .arg("--config")
            .arg(&config)
            .arg("check-config")
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
            .env("OTEL_TRACES_SAMPLER", sampler)
            .output()
            .expect("run ratelimiterd check-config")
    };
    let refused = check("sometimes");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("OTEL_TRACES_SAMPLER") && stderr.contains("sometimes"),
        "{stderr}"
    );
    let accepted = check("parentbased_traceidratio");
    assert!(
        accepted.status.success(),
        "{}",
        String::from_utf8_lossy(&accepted.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_a_stream_ends_its_client_span_with_its_usage() {
    let (receiver, got) = start_receiver().await;
    let (good, _) = start_upstream(StatusCode::OK).await;
    let dir = temp_dir("telemetry-stream");
    let endpoint = format!("http://{receiver}");
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
    ];
    let server = start_server(&dir, &gateway_section(good, good, good), &env);
    let (trace_id, parent) = traceparent(7, true);
    let (bearer, url) = (
        format!("Bearer {KEY}"),
        format!("http://{}/v1/chat/completions", gateway_addr(&server)),
    );
    let body = json!({"model": "gpt-4o-mini", "stream": true, "messages": [{"role": "user", "content": "hello"}]});
    let headers = [("authorization", bearer.as_str()), ("traceparent", parent.as_str())];
    let answer = send(&client(), hyper::Method::POST, url, &headers, Some(body)).await;
    assert!(
        answer.status == 200 && answer.body.contains("[DONE]"),
        "{}",
        answer.body
    );
    let spans = spans_of(&got, &trace_id, 2).await;
    let client_span = &spans
        .iter()
        .find(|(_, s)| kind(s, SpanKind::Client))
        .expect("a CLIENT span")
        .1;
    assert_eq!(boolean(&client_span.attributes, "gen_ai.request.stream"), Some(true));
    assert_eq!(int(&client_span.attributes, "gen_ai.usage.input_tokens"), Some(12));
    assert_eq!(int(&client_span.attributes, "gen_ai.usage.output_tokens"), Some(5));
    let server_span = &spans
        .iter()
        .find(|(_, s)| kind(s, SpanKind::Server))
        .expect("a SERVER span")
        .1;
    assert_eq!(int(&server_span.attributes, "ratelimiter.tokens.used"), Some(17));
}
