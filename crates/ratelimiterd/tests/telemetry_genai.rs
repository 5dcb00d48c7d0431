//! What the gateway's CLIENT spans and GenAI metrics say of an answer, through
//! the real `ratelimiterd` binary and an OTLP/HTTP receiver in this process
//! (docs/observability.md): the response's id, model and finish reasons of each
//! provider's shape, whole and streamed, a stream's time to its first chunk,
//! the provider's own error type, and the server-side GenAI metrics, with the
//! tenant among their attributes only when the operator opts in; message
//! content only on the opt-in, by the variable or the `telemetry:` section;
//! the same over OTLP/gRPC.

#[path = "telemetry_support/otlp.rs"]
mod otlp;
#[path = "telemetry_support/rig.rs"]
mod rig;
mod support;

use std::net::SocketAddr;
use std::time::Duration;

use axum::http::StatusCode;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode as SpanStatus;
use otlp::{attribute, kind, metric, spans_of, start_grpc_receiver, start_receiver, string, Any, Span, SpanKind};
use rig::{as_env, call, export_env, start_server, start_shapes, KEY, KEY_ENV};
use serde_json::json;
use support::gateway_setup::{client, gateway_addr};
use support::temp_dir;

/// Models on `ok` (OpenAI) and `anth` (Anthropic) that answer, and on
/// `broken` (OpenAI, a 400) and `down` (Anthropic, a 529) that fail, each its
/// call's last try.
fn section(ok: SocketAddr, anth: SocketAddr, broken: SocketAddr, down: SocketAddr) -> String {
    format!(
        "gateway:\n  listen_addr: \"127.0.0.1:0\"\n  upstreams:\n    - {{name: ok, kind: openai, base_url: \"http://{ok}\"}}\n    - {{name: anth, kind: anthropic, base_url: \"http://{anth}\"}}\n    - {{name: broken, kind: openai, base_url: \"http://{broken}\"}}\n    - {{name: down, kind: anthropic, base_url: \"http://{down}\"}}\n  models:\n    - {{name: gpt-4o-mini, upstream: ok, rpm: 1000, tpm: 1000000, max_output_tokens_default: 64}}\n    - {{name: claude-sonnet-4-5, upstream: anth, rpm: 1000, input_tpm: 100000, output_tpm: 100000}}\n    - {{name: refused, max_output_tokens_default: 64, deployments: [{{upstream: broken, model: gpt-4o-mini, rpm: 1000}}]}}\n    - {{name: overloaded, deployments: [{{upstream: down, model: claude-sonnet-4-5, rpm: 1000}}]}}\n  tenants:\n    - {{name: team, api_key_env: {KEY_ENV}}}\n"
    )
}

/// The CLIENT span among `spans`.
fn client_span(spans: &[(String, Span)]) -> Span {
    let found = spans.iter().find(|(_, s)| kind(s, SpanKind::Client));
    found.expect("a CLIENT span").1.clone()
}

/// The span's `gen_ai.response.finish_reasons`.
fn reasons(span: &Span) -> Vec<String> {
    match attribute(&span.attributes, "gen_ai.response.finish_reasons") {
        Some(Any::ArrayValue(array)) => (array.values.iter())
            .filter_map(|v| match &v.value {
                Some(Any::StringValue(s)) => Some(s.clone()),
                _ => None,
            })
            .collect(),
        other => panic!("finish reasons: {other:?} in {span:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_the_answers_id_model_and_finish_reasons_of_each_shape() {
    let (receiver, got) = start_receiver().await;
    let (ok, _) = start_shapes(StatusCode::OK, Duration::ZERO).await;
    let (anth, _) = start_shapes(StatusCode::OK, Duration::from_millis(30)).await;
    let dir = temp_dir("telemetry-genai-shapes");
    let env = export_env(receiver);
    let server = start_server(&dir, &section(ok, anth, ok, anth), &as_env(&env));
    let (client, gateway) = (client(), gateway_addr(&server));
    let messages = json!([{"role": "user", "content": "hello"}]);
    let calls = [
        (
            "/v1/chat/completions",
            json!({"model": "gpt-4o-mini", "messages": messages}),
            "chatcmpl-1",
            "gpt-4o-mini-2024-07-18",
            "stop",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "gpt-4o-mini", "stream": true, "messages": messages}),
            "chatcmpl-2",
            "gpt-4o-mini-2024-07-18",
            "length",
        ),
        (
            "/v1/responses",
            json!({"model": "gpt-4o-mini", "input": "hello"}),
            "resp_1",
            "gpt-4o-mini-2024-07-18",
            "completed",
        ),
        (
            "/v1/messages",
            json!({"model": "claude-sonnet-4-5", "max_tokens": 16, "messages": messages}),
            "msg_1",
            "claude-x-20250101",
            "end_turn",
        ),
        (
            "/v1/messages",
            json!({"model": "claude-sonnet-4-5", "max_tokens": 16, "stream": true, "messages": messages}),
            "msg_2",
            "claude-x-20250101",
            "max_tokens",
        ),
    ];
    for (n, (path, body, id, model, reason)) in calls.into_iter().enumerate() {
        let stream = body["stream"] == json!(true);
        let (trace_id, answer) = call(&client, gateway, (path, body), n as u8).await;
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
        let span = client_span(&spans_of(&got, &trace_id, 2).await);
        let attrs = &span.attributes;
        assert_eq!(
            string(attrs, "gen_ai.response.id").as_deref(),
            Some(id),
            "{path} {attrs:?}"
        );
        assert_eq!(string(attrs, "gen_ai.response.model").as_deref(), Some(model), "{path}");
        assert_eq!(reasons(&span), [reason], "{path}");
        assert!(attribute(attrs, "error.type").is_none(), "{path} {attrs:?}");
        let first_chunk = match attribute(attrs, "gen_ai.response.time_to_first_chunk") {
            Some(Any::DoubleValue(seconds)) => Some(*seconds),
            _ => None,
        };
        if !stream {
            assert_eq!(first_chunk, None, "{path}: a whole answer has no first chunk");
        } else if path == "/v1/messages" {
            // The Anthropic stub answers after 30 ms.
            assert!(first_chunk.is_some_and(|s| (0.03..5.0).contains(&s)), "{first_chunk:?}");
        } else {
            assert!(first_chunk.is_some_and(|s| s > 0.0 && s < 5.0), "{first_chunk:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_a_failed_try_carries_the_providers_error_type() {
    let (receiver, got) = start_receiver().await;
    let (ok, _) = start_shapes(StatusCode::OK, Duration::ZERO).await;
    let (broken, _) = start_shapes(StatusCode::BAD_REQUEST, Duration::ZERO).await;
    let (down, _) = start_shapes(StatusCode::from_u16(529).unwrap(), Duration::ZERO).await;
    let dir = temp_dir("telemetry-genai-errors");
    let env = export_env(receiver);
    let server = start_server(&dir, &section(ok, ok, broken, down), &as_env(&env));
    let (client, gateway) = (client(), gateway_addr(&server));
    let messages = json!([{"role": "user", "content": "hello"}]);
    let calls = [
        (
            "/v1/chat/completions",
            json!({"model": "refused", "messages": messages}),
            400,
            "invalid_request_error",
        ),
        (
            "/v1/messages",
            json!({"model": "overloaded", "max_tokens": 16, "messages": messages}),
            529,
            "overloaded_error",
        ),
    ];
    for (n, (path, body, status, error_type)) in calls.into_iter().enumerate() {
        let (trace_id, answer) = call(&client, gateway, (path, body), 20 + n as u8).await;
        assert_eq!(answer.status, status, "{}", answer.body);
        let span = client_span(&spans_of(&got, &trace_id, 2).await);
        assert_eq!(
            string(&span.attributes, "error.type").as_deref(),
            Some(error_type),
            "{span:?}"
        );
        let status_code = span.status.as_ref().map(|s| s.code);
        assert_eq!(status_code, Some(SpanStatus::Error as i32), "{span:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_server_metrics_and_the_tenant_only_on_opt_in() {
    let (ok, _) = start_shapes(StatusCode::OK, Duration::from_millis(20)).await;
    let (broken, _) = start_shapes(StatusCode::BAD_REQUEST, Duration::ZERO).await;
    let messages = json!([{"role": "user", "content": "hello"}]);
    for opt_in in [true, false] {
        let (receiver, got) = start_receiver().await;
        let dir = temp_dir("telemetry-genai-metrics");
        let env = export_env(receiver);
        let telemetry = if opt_in {
            "telemetry:\n  metrics_tenant: true\n"
        } else {
            ""
        };
        let sections = format!("{}{telemetry}", section(ok, ok, broken, ok));
        let server = start_server(&dir, &sections, &as_env(&env));
        let (client, gateway) = (client(), gateway_addr(&server));
        let stream = json!({"model": "gpt-4o-mini", "stream": true, "messages": messages});
        let (_, answer) = call(&client, gateway, ("/v1/chat/completions", stream), 40).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        let refused = json!({"model": "refused", "messages": messages});
        let (_, answer) = call(&client, gateway, ("/v1/chat/completions", refused), 41).await;
        assert_eq!(answer.status, 400, "{}", answer.body);
        let served = [
            ("gen_ai.operation.name", "chat"),
            ("gen_ai.provider.name", "openai"),
            ("gen_ai.request.model", "gpt-4o-mini"),
        ];
        for name in [
            "gen_ai.server.request.duration",
            "gen_ai.server.time_to_first_token",
            "gen_ai.server.time_per_output_token",
            "gen_ai.client.operation.time_to_first_chunk",
        ] {
            let (unit, points) = metric(&got, name, &served).await;
            assert_eq!(unit, "s", "{name}");
            let (attributes, count, sum) = &points[0];
            assert!(*count == 1 && *sum > 0.0, "{name}: {points:?}");
            assert!(attribute(attributes, "error.type").is_none(), "{name}: {attributes:?}");
            let tenant = string(attributes, "ratelimiter.tenant");
            assert_eq!(tenant.as_deref(), opt_in.then_some("team"), "{name}: {attributes:?}");
        }
        // The whole answer's first chunk is no stream's: the 20 ms stream's time
        // to first token is the only point.
        let (_, points) = metric(&got, "gen_ai.server.time_to_first_token", &[]).await;
        assert_eq!(points.len(), 1, "{points:?}");
        let failed = [("gen_ai.request.model", "refused"), ("error.type", "400")];
        let (_, points) = metric(&got, "gen_ai.server.request.duration", &failed).await;
        assert_eq!(points[0].1, 1, "{points:?}");
        let decisions = metric(
            &got,
            "ratelimiter.gateway.decisions",
            &[("ratelimiter.decision", "admitted")],
        );
        let (_, points) = decisions.await;
        let tenant = points
            .iter()
            .any(|(a, _, _)| attribute(a, "ratelimiter.tenant").is_some());
        assert_eq!(tenant, opt_in, "{points:?}");
    }
}

/// A way of starting the server: its extra variables, its `telemetry:` section, and
/// whether messages are recorded then.
type Way<'a> = (&'a [(&'static str, String)], &'static str, bool);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_message_content_only_on_opt_in() {
    let (ok, _) = start_shapes(StatusCode::OK, Duration::ZERO).await;
    let messages = json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]);
    let calls = [
        (
            "/v1/chat/completions",
            json!({"model": "gpt-4o-mini", "messages": messages}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "gpt-4o-mini", "stream": true, "messages": messages}),
        ),
        ("/v1/responses", json!({"model": "gpt-4o-mini", "input": "hello"})),
        (
            "/v1/messages",
            json!({"model": "claude-sonnet-4-5", "max_tokens": 16, "stream": true,
            "messages": [{"role": "user", "content": "hello"}]}),
        ),
    ];
    let by_env = [("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true".to_owned())];
    let ways: [Way<'_>; 3] = [
        (&[], "", false),
        (&by_env, "", true),
        (&[], "telemetry:\n  capture_message_content: true\n", true),
    ];
    for (way, (extra_env, telemetry, recorded)) in ways.into_iter().enumerate() {
        let (receiver, got) = start_receiver().await;
        let dir = temp_dir("telemetry-genai-content");
        let mut env = export_env(receiver);
        env.extend(extra_env.iter().cloned());
        let sections = format!("{}{telemetry}", section(ok, ok, ok, ok));
        let server = start_server(&dir, &sections, &as_env(&env));
        let (client, gateway) = (client(), gateway_addr(&server));
        for (n, (path, body)) in calls.iter().enumerate() {
            let (trace_id, answer) = call(&client, gateway, (path, body.clone()), 60 + n as u8).await;
            assert_eq!(answer.status, 200, "{path}: {}", answer.body);
            let spans = spans_of(&got, &trace_id, 2).await;
            let span = client_span(&spans);
            let input = string(&span.attributes, "gen_ai.input.messages");
            let output = string(&span.attributes, "gen_ai.output.messages");
            for (_, span) in &spans {
                let attributes = format!("{:?}", span.attributes);
                assert!(!attributes.contains(KEY) && !attributes.contains("Bearer"), "{span:?}");
                if !recorded {
                    assert!(!attributes.contains("hello"), "way {way}: {span:?}");
                }
            }
            if !recorded {
                assert_eq!((input, output), (None, None), "way {way} {path}");
                continue;
            }
            let input: serde_json::Value = serde_json::from_str(&input.expect("input messages")).unwrap();
            let last = input.as_array().unwrap().last().unwrap().clone();
            assert_eq!(
                last,
                json!({"role": "user", "parts": [{"type": "text", "content": "hello"}]}),
                "{path}"
            );
            let output: serde_json::Value = serde_json::from_str(&output.expect("output messages")).unwrap();
            assert_eq!(output[0]["role"], "assistant", "{path}: {output}");
            assert_eq!(
                output[0]["parts"][0],
                json!({"type": "text", "content": "hi"}),
                "{path}: {output}"
            );
            assert!(output[0]["finish_reason"].is_string(), "{path}: {output}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_spans_and_metrics_over_grpc() {
    let (receiver, got) = start_grpc_receiver().await;
    let (ok, _) = start_shapes(StatusCode::OK, Duration::ZERO).await;
    let dir = temp_dir("telemetry-genai-grpc");
    let mut env = export_env(receiver);
    env.push(("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc".to_owned()));
    let server = start_server(&dir, &section(ok, ok, ok, ok), &as_env(&env));
    let (client, gateway) = (client(), gateway_addr(&server));
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}]});
    let (trace_id, answer) = call(&client, gateway, ("/v1/chat/completions", body), 80).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let span = client_span(&spans_of(&got, &trace_id, 2).await);
    assert_eq!(span.name, "chat gpt-4o-mini");
    assert_eq!(
        string(&span.attributes, "gen_ai.response.id").as_deref(),
        Some("chatcmpl-1")
    );
    let (unit, _) = metric(
        &got,
        "gen_ai.server.request.duration",
        &[("gen_ai.request.model", "gpt-4o-mini")],
    )
    .await;
    assert_eq!(unit, "s");
}
