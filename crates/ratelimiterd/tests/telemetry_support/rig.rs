//! The gateway side of the telemetry tests: the server started on a gateway
//! section with one tenant and the export variables, a traced call to it, and
//! upstream stubs answering each provider's shape (whole and streamed) or an
//! error, recording the headers each try is sent with.

// Each test file uses its own share of these helpers.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};

use crate::support::gateway_setup::{send, Answer, HttpClient};
use crate::support::{write_config_on, BackendConfig, Daemon};

/// The tenant's key, passed to the server in its environment.
pub const KEY: &str = "telemetry-test-key-0123456789abcdef";
/// The variable the configuration reads the tenant's key from.
pub const KEY_ENV: &str = "TELEMETRY_TEST_KEY";

/// Starts the server on `sections` with `env` (the tenant's key added).
pub fn start_server(dir: &std::path::Path, sections: &str, env: &[(&str, &str)]) -> Daemon {
    let config = write_config_on(dir, BackendConfig::Memory, "", sections);
    let mut all: Vec<(&str, &std::ffi::OsStr)> = vec![(KEY_ENV, KEY.as_ref())];
    all.extend(env.iter().map(|(k, v)| (*k, std::ffi::OsStr::new(*v))));
    Daemon::start_with_env(&config, &all).unwrap_or_else(|logs| panic!("ratelimiterd did not start:\n{logs}"))
}

/// The export variables of a receiver at `receiver`, spans and metrics sent every 50 ms.
pub fn export_env(receiver: SocketAddr) -> Vec<(&'static str, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{receiver}")),
        ("OTEL_BSP_SCHEDULE_DELAY", "50".to_owned()),
        ("OTEL_METRIC_EXPORT_INTERVAL", "100".to_owned()),
    ]
}

/// `pairs` as the `(&str, &str)` list [`start_server`] takes.
pub fn as_env<'a>(pairs: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    pairs.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// A traceparent of a fresh trace numbered `n`, sampled: its trace id and the header.
pub fn traceparent(n: u8) -> (String, String) {
    let trace_id = format!("{:032x}", 0x2000_u128 + u128::from(n));
    (trace_id.clone(), format!("00-{trace_id}-00f067aa0ba902b7-01"))
}

/// A call to `path` of the gateway at `gateway` with `body`, in trace `n`;
/// returns the trace id and the answer.
pub async fn call(client: &HttpClient, gateway: SocketAddr, (path, body): (&str, Value), n: u8) -> (String, Answer) {
    let (trace_id, parent) = traceparent(n);
    let bearer = format!("Bearer {KEY}");
    let headers = [
        ("authorization", bearer.as_str()),
        ("anthropic-version", "2023-06-01"),
        ("traceparent", parent.as_str()),
    ];
    let answer = send(
        client,
        hyper::Method::POST,
        format!("http://{gateway}{path}"),
        &headers,
        Some(body),
    )
    .await;
    (trace_id, answer)
}

/// The body of an answer of each shape, the request `body` saying whether a
/// stream was asked; an error answer (`status` not 200) in the provider's error shape.
fn shaped(path: &str, body: &Value, status: StatusCode) -> Response {
    let stream = body["stream"] == json!(true);
    let sse = |events: String| ([("content-type", "text/event-stream")], events).into_response();
    match (path, stream) {
        (_, _) if !status.is_success() && path == "messages" => {
            let error = json!({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}});
            (status, axum::Json(error)).into_response()
        }
        (_, _) if !status.is_success() => {
            let error = json!({"error": {"message": "bad", "type": "invalid_request_error", "code": null}});
            (status, axum::Json(error)).into_response()
        }
        ("chat", false) => axum::Json(json!({"id": "chatcmpl-1", "object": "chat.completion",
            "model": "gpt-4o-mini-2024-07-18", "choices": [{"index": 0, "message": {"role": "assistant",
            "content": "hi"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 12, "completion_tokens": 5,
            "total_tokens": 17}}))
        .into_response(),
        ("chat", true) => {
            let first = json!({"id": "chatcmpl-2", "model": "gpt-4o-mini-2024-07-18",
                "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": null}]});
            let last = json!({"id": "chatcmpl-2", "model": "gpt-4o-mini-2024-07-18",
                "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]});
            let usage = json!({"id": "chatcmpl-2", "choices": [],
                "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}});
            sse(format!(
                "data: {first}\n\ndata: {last}\n\ndata: {usage}\n\ndata: [DONE]\n\n"
            ))
        }
        ("responses", _) => axum::Json(json!({"id": "resp_1", "object": "response", "status": "completed",
            "model": "gpt-4o-mini-2024-07-18", "output": [{"type": "message", "status": "completed",
            "content": [{"type": "output_text", "text": "hi"}]}],
            "usage": {"input_tokens": 12, "output_tokens": 5, "total_tokens": 17}}))
        .into_response(),
        ("messages", false) => axum::Json(json!({"id": "msg_1", "type": "message", "role": "assistant",
            "model": "claude-x-20250101", "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 12, "output_tokens": 5}}))
        .into_response(),
        _ => {
            let start = json!({"type": "message_start", "message": {"id": "msg_2", "model": "claude-x-20250101",
                "usage": {"input_tokens": 12, "output_tokens": 1}}});
            let delta = json!({"type": "message_delta", "delta": {"stop_reason": "max_tokens"},
                "usage": {"output_tokens": 5}});
            let text =
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}});
            sse(format!("event: message_start\ndata: {start}\n\nevent: content_block_delta\ndata: {text}\n\nevent: message_delta\ndata: {delta}\n\nevent: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n"))
        }
    }
}

/// An upstream answering chat, responses and messages in their shapes with
/// `status` after `delay`, recording each request's headers.
pub async fn start_shapes(status: StatusCode, delay: Duration) -> (SocketAddr, Arc<Mutex<Vec<HeaderMap>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let route = |path: &'static str| {
        let recorded = seen.clone();
        post(move |headers: HeaderMap, request: Bytes| {
            recorded.lock().unwrap().push(headers);
            let body: Value = serde_json::from_slice(&request).unwrap_or(Value::Null);
            async move {
                tokio::time::sleep(delay).await;
                shaped(path, &body, status)
            }
        })
    };
    let router = Router::new()
        .route("/v1/chat/completions", route("chat"))
        .route("/v1/responses", route("responses"))
        .route("/v1/messages", route("messages"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    (addr, seen)
}
