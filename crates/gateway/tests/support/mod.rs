//! A provider for the gateway's tests (OpenAI chat and Anthropic messages, with
//! usage and streams), a gateway in front of it on a real socket, and a client.

#![allow(dead_code)]

pub mod billing;
pub mod provider_sim;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing;
use axum::{Json, Router};
use bytes::Bytes;
use gateway::{Gateway, GatewayConfig};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use ratelimiter::{Backend, Clock, LimitKey, MemoryBackend, MemoryConfig, SystemClock};
use serde_json::{json, Value};
use tokio::sync::Semaphore;

/// What the provider reports for every OpenAI chat call.
pub const OPENAI_USAGE: (u64, u64) = (11, 7);
/// What the provider reports for every Anthropic call: input, cache creation,
/// cache read, output.
pub const ANTHROPIC_USAGE: (u64, u64, u64, u64) = (20, 5, 100, 9);
/// The tenant key the tests present.
pub const TENANT_KEY: &str = "gateway-test-key-acme-0123456789";
/// The key of a tenant with a daily budget of 300 tokens.
pub const TINY_TENANT_KEY: &str = "gateway-test-key-tiny-0123456789";

/// The provider's state: a gate that slow streams wait on, and what it saw.
pub struct Provider {
    /// Permits that let a `-slow` model's stream finish.
    pub gate: Semaphore,
    /// Calls received.
    pub calls: AtomicU64,
    /// Of them, calls received under Azure's `/openai` base path.
    pub azure_calls: AtomicU64,
    /// The last request body received.
    pub last_body: std::sync::Mutex<Option<Value>>,
}

impl Default for Provider {
    fn default() -> Self {
        Self {
            gate: Semaphore::new(0),
            calls: AtomicU64::new(0),
            azure_calls: AtomicU64::new(0),
            last_body: std::sync::Mutex::new(None),
        }
    }
}

fn sse(events: Vec<String>) -> Response {
    let mut response = Response::new(Body::from(events.concat()));
    response
        .headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    response
}

async fn chat(State(provider): State<Arc<Provider>>, Json(body): Json<Value>) -> Response {
    provider.calls.fetch_add(1, Ordering::SeqCst);
    *provider.last_body.lock().unwrap() = Some(body.clone());
    let model = body["model"].as_str().unwrap_or("").to_owned();
    if model.ends_with("-429") {
        let mut response = (
            StatusCode::TOO_MANY_REQUESTS,
            Json(json!({"error": {"message": "Rate limit reached", "type": "requests", "param": null, "code": "rate_limit_exceeded"}})),
        )
            .into_response();
        response.headers_mut().insert("retry-after-ms", "800".parse().unwrap());
        response
            .headers_mut()
            .insert("x-ratelimit-limit-requests", "3".parse().unwrap());
        return response;
    }
    let (prompt, completion) = OPENAI_USAGE;
    let usage = json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion});
    if body["stream"] != json!(true) {
        return Json(json!({"id": "c1", "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            "usage": usage}))
        .into_response();
    }
    let chunk = |content: &str| {
        format!(
            "data: {}\n\n",
            json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": content}}], "usage": null})
        )
    };
    let mut tail = vec![chunk(" there")];
    if body["stream_options"]["include_usage"] == json!(true) {
        tail.push(format!(
            "data: {}\n\n",
            json!({"object": "chat.completion.chunk", "choices": [], "usage": usage})
        ));
    }
    tail.push("data: [DONE]\n\n".to_owned());
    if !model.ends_with("-slow") {
        let mut events = vec![chunk("hi")];
        events.extend(tail);
        return sse(events);
    }
    // A slow stream: the first chunk now, the rest once the test opens the gate.
    let first = futures_util::stream::once(async move { Ok::<_, std::io::Error>(Bytes::from(chunk("hi"))) });
    let rest = futures_util::stream::once(async move {
        provider.gate.acquire().await.unwrap().forget();
        Ok::<_, std::io::Error>(Bytes::from(tail.concat()))
    });
    let mut response = Response::new(Body::from_stream(futures_util::StreamExt::chain(first, rest)));
    response
        .headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    response
}

async fn messages(State(provider): State<Arc<Provider>>, headers: HeaderMap, Json(body): Json<Value>) -> Response {
    provider.calls.fetch_add(1, Ordering::SeqCst);
    assert_eq!(headers["x-api-key"], "upstream-anthropic-key");
    let (input, creation, read, output) = ANTHROPIC_USAGE;
    if body["stream"] != json!(true) {
        return Json(json!({"id": "m1", "type": "message", "role": "assistant",
            "content": [{"type": "text", "text": "hi"}],
            "usage": {"input_tokens": input, "cache_creation_input_tokens": creation,
                      "cache_read_input_tokens": read, "output_tokens": output}}))
        .into_response();
    }
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    sse(vec![
        event(
            "message_start",
            json!({"type": "message_start", "message": {"usage": {"input_tokens": input,
            "cache_creation_input_tokens": creation, "cache_read_input_tokens": read, "output_tokens": 1}}}),
        ),
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "delta": {"type": "text_delta", "text": "hi"}}),
        ),
        event(
            "message_delta",
            json!({"type": "message_delta", "usage": {"output_tokens": output - 3}}),
        ),
        event(
            "message_delta",
            json!({"type": "message_delta", "usage": {"output_tokens": output}}),
        ),
        event("message_stop", json!({"type": "message_stop"})),
    ])
}

/// Chat completions under Azure OpenAI's v1 base path, counted apart.
async fn azure_chat(state: State<Arc<Provider>>, body: Json<Value>) -> Response {
    state.azure_calls.fetch_add(1, Ordering::SeqCst);
    chat(state, body).await
}

/// The provider's routes.
pub fn provider_router(provider: Arc<Provider>) -> Router {
    Router::new()
        .route("/v1/chat/completions", routing::post(chat))
        // Azure OpenAI's v1 API: the OpenAI paths under the resource's `/openai`.
        .route("/openai/v1/chat/completions", routing::post(azure_chat))
        .route("/v1/messages", routing::post(messages))
        .with_state(provider)
}

/// Starts the provider on a free loopback port.
pub async fn start_provider() -> (SocketAddr, Arc<Provider>) {
    let provider = Arc::new(Provider::default());
    let app = provider_router(provider.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, provider)
}

/// A gateway configuration in front of `provider`: `gpt-4o-mini` (and its `-slow`
/// and `-429` twins) with concurrency 1, and `claude-test` with split token limits.
pub fn config(provider: SocketAddr, max_wait_ms: u64) -> GatewayConfig {
    std::env::set_var("GATEWAY_TEST_ACME_KEY", TENANT_KEY);
    std::env::set_var("GATEWAY_TEST_ANTHROPIC_KEY", "upstream-anthropic-key");
    std::env::set_var("GATEWAY_TEST_TINY_KEY", TINY_TENANT_KEY);
    let model = |name: &str| {
        format!(
            "  - {{name: {name}, upstream: openai, rpm: 3, tpm: 10000, concurrency: 1, max_output_tokens_default: 100, max_wait_ms: {max_wait_ms}}}\n"
        )
    };
    let yaml = format!(
        "listen_addr: \"127.0.0.1:0\"\nbody_bytes_max: 4096\nupstreams:\n  - {{name: openai, kind: openai, base_url: \"http://{provider}\"}}\n  - {{name: anthropic, kind: anthropic, base_url: \"http://{provider}\", api_key_env: GATEWAY_TEST_ANTHROPIC_KEY}}\n  - {{name: nowhere, kind: openai, base_url: \"http://127.0.0.1:9\"}}\nmodels:\n{}{}{}  - {{name: claude-test, upstream: anthropic, input_tpm: 5000, output_tpm: 2000, concurrency: 4, max_output_tokens_default: 100}}\n  - {{name: claude-old, upstream: anthropic, input_tpm: 5000, output_tpm: 2000, max_output_tokens_default: 100, count_cache_reads: true}}\n  - {{name: gpt-4o-gone, upstream: nowhere, tpm: 10000, concurrency: 1, max_output_tokens_default: 100}}\ntenants:\n  - {{name: acme, api_key_env: GATEWAY_TEST_ACME_KEY, daily_tokens: 1000000}}\n  - {{name: tiny, api_key_env: GATEWAY_TEST_TINY_KEY, daily_tokens: 300}}\n",
        model("gpt-4o-mini"),
        model("gpt-4o-mini-slow"),
        model("gpt-4o-mini-429"),
    );
    serde_yaml::from_str(&yaml).unwrap()
}

/// A gateway on `backend`, its limits defined, served on a free loopback port.
pub async fn start_gateway(config: &GatewayConfig, backend: Arc<dyn Backend>) -> SocketAddr {
    start_gateway_with_metrics(config, backend).await.0
}

/// [`start_gateway`], with the gateway's metrics.
pub async fn start_gateway_with_metrics(
    config: &GatewayConfig,
    backend: Arc<dyn Backend>,
) -> (SocketAddr, Arc<gateway::metrics::GatewayMetrics>) {
    serve_gateway(Gateway::new(config, backend.clone()).unwrap(), backend).await
}

/// Defines `gateway`'s limits on `backend` and serves it on a free loopback port.
pub async fn serve_gateway(
    gateway: Gateway,
    backend: Arc<dyn Backend>,
) -> (SocketAddr, Arc<gateway::metrics::GatewayMetrics>) {
    let metrics = gateway.metrics().clone();
    for definition in gateway.definitions() {
        backend.apply_definition(definition).await.unwrap();
    }
    let app = gateway::router(Arc::new(gateway));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, metrics)
}

/// A memory backend on the system clock.
pub fn memory_backend() -> Arc<dyn Backend> {
    memory_backend_on(Arc::new(SystemClock::new()))
}

/// A memory backend on `clock`: a fake clock shared with [`start_sim_on`]'s
/// provider puts the gateway's limits and the provider's on one time.
pub fn memory_backend_on(clock: Arc<dyn Clock>) -> Arc<dyn Backend> {
    Arc::new(MemoryBackend::new(clock, MemoryConfig::default()))
}

/// Units held on `key` now.
pub async fn in_use(backend: &Arc<dyn Backend>, key: &str) -> u64 {
    backend
        .limit_report(&LimitKey::new(key).unwrap())
        .await
        .unwrap()
        .unwrap()
        .in_use
}

/// Waits (bounded) until `key` holds `expected`: completes run in the background.
pub async fn eventually_in_use(backend: &Arc<dyn Backend>, key: &str, expected: u64) {
    for _ in 0..200 {
        if in_use(backend, key).await == expected {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(in_use(backend, key).await, expected, "{key}");
}

/// A plain HTTP client.
pub type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

/// A new client.
pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// POSTs `body` to `path` with the tenant's key in `key_header`.
pub async fn post_raw(
    client: &HttpClient,
    gateway: SocketAddr,
    path: &str,
    body: impl Into<Bytes>,
    headers: &[(&str, &str)],
) -> hyper::Response<hyper::body::Incoming> {
    let mut request =
        hyper::Request::post(format!("http://{gateway}{path}")).header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    client
        .request(request.body(Full::new(body.into())).unwrap())
        .await
        .unwrap()
}

/// POSTs JSON with the OpenAI SDK's bearer key; answers status, headers and body text.
pub async fn post(
    client: &HttpClient,
    gateway: SocketAddr,
    path: &str,
    body: Value,
) -> (StatusCode, HeaderMap, String) {
    let bearer = format!("Bearer {TENANT_KEY}");
    let response = post_raw(client, gateway, path, body.to_string(), &[("authorization", &bearer)]).await;
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, String::from_utf8(bytes.to_vec()).unwrap())
}

/// A provider, a memory backend and a gateway in front of them, with a client.
pub struct Setup {
    /// The provider's state.
    pub provider: Arc<Provider>,
    /// The backend the gateway reserves on.
    pub backend: Arc<dyn Backend>,
    /// The gateway's address.
    pub gateway: SocketAddr,
    /// A client.
    pub client: HttpClient,
}

/// [`Setup`] with the models' `max_wait_ms`.
pub async fn setup(max_wait_ms: u64) -> Setup {
    let (addr, provider) = start_provider().await;
    let backend = memory_backend();
    let gateway = start_gateway(&config(addr, max_wait_ms), backend.clone()).await;
    Setup {
        provider,
        backend,
        gateway,
        client: client(),
    }
}

/// Opens a call with the tenant's bearer key; its body is left to the caller.
pub async fn open(client: &HttpClient, gateway: SocketAddr, body: &Value) -> hyper::Response<hyper::body::Incoming> {
    let bearer = format!("Bearer {TENANT_KEY}");
    post_raw(
        client,
        gateway,
        "/v1/chat/completions",
        body.to_string(),
        &[("authorization", &bearer)],
    )
    .await
}

/// The published requests per minute of [`start_sim`]'s provider.
pub const SIM_RPM: u64 = 600;

/// The provider simulator enforcing `profile`'s rules (`ProviderServer::set_profile`),
/// in process on a real socket, on the system clock.
pub async fn start_sim(
    profile: replay::sim_profile::ProfileName,
) -> (SocketAddr, Arc<replay::provider_server::ProviderServer>) {
    start_sim_on(profile, Arc::new(SystemClock::new())).await
}

/// [`start_sim`] on `clock`: a fake clock that stands still while a burst goes
/// through puts the whole burst in one of the provider's periods, however slowly
/// a loaded machine delivers it.
pub async fn start_sim_on(
    profile: replay::sim_profile::ProfileName,
    clock: Arc<dyn Clock>,
) -> (SocketAddr, Arc<replay::provider_server::ProviderServer>) {
    use replay::provider::{Accounting, ProviderLimits};
    let limits = ProviderLimits {
        rpm: SIM_RPM,
        tpm: 10_000_000,
        window_ms: 60_000,
        concurrency: 1_000,
        ms_per_output_token: 0,
        accounting: Accounting::Openai,
    };
    let provider = replay::provider_server::ProviderServer::with_control(
        limits,
        clock,
        replay::sim_control::SimControl::default(),
    );
    provider.set_profile(replay::sim_profile::SimProfile::with_defaults(profile, &limits));
    (provider_sim::serve_provider(&provider).await, provider)
}

/// Anthropic's profile makes the gateway reserve on buckets (docs/bucket-limits.md)
/// whatever the backend: a call through `/v1/messages` takes `max_tokens` from the
/// `otpm` bucket and its Complete gives back at once what the answer did not use.
pub async fn anthropic_buckets_give_unused_output_back(backend: Arc<dyn Backend>) {
    // 100 output tokens a second of refill: the 2 s this waits at most refill 200,
    // far from the 996 a Complete must give back.
    const OUTPUT_TPM: u64 = 6_000;
    let (sim, provider) = start_sim(replay::sim_profile::ProfileName::Anthropic).await;
    let yaml = format!(
        "listen_addr: \"127.0.0.1:0\"\nallow_anonymous: true\nupstreams:\n  - {{name: sim, kind: anthropic, base_url: \"http://{sim}\"}}\nmodels:\n  - {{name: claude-sonnet-4-5, upstream: sim, rpm: {SIM_RPM}, input_tpm: 1000000, output_tpm: {OUTPUT_TPM}, max_output_tokens_default: 16, max_wait_ms: 30000, profile: anthropic}}\n"
    );
    let config: GatewayConfig = serde_yaml::from_str(&yaml).unwrap();
    let gateway = start_gateway(&config, backend.clone()).await;
    for dimension in ["rpm", "itpm", "otpm"] {
        let key = LimitKey::new(format!("global:llm:sim:claude-sonnet-4-5:{dimension}")).unwrap();
        let report = backend.limit_report(&key).await.unwrap().unwrap();
        assert_eq!(
            report.state.definition().kind(),
            ratelimiter::LimitKind::Bucket,
            "{dimension}"
        );
    }
    let (max_tokens, output_tokens) = (1_000, 4);
    let request = json!({"model": "claude-sonnet-4-5", "max_tokens": max_tokens, "sim_output_tokens": output_tokens,
        "messages": [{"role": "user", "content": "hello"}]});
    let response = post_raw(
        &client(),
        gateway,
        "/v1/messages",
        request.to_string(),
        &[("x-api-key", TENANT_KEY), ("anthropic-version", "2023-06-01")],
    )
    .await;
    assert_eq!(response.status(), 200);
    // The Complete runs as the answer ends: at most the output stays taken (less once
    // a refill second has passed), never the unused `max_tokens`.
    let otpm = "global:llm:sim:claude-sonnet-4-5:otpm";
    for _ in 0..200 {
        if in_use(&backend, otpm).await <= output_tokens {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(in_use(&backend, otpm).await <= output_tokens);
    assert_eq!(provider.counts().throttled, 0);
}

/// The key of the interactive tenant of [`classes_config`].
pub const WEB_KEY: &str = "gateway-test-key-web-0123456789";
/// The key of the batch tenant of [`classes_config`].
pub const ETL_KEY: &str = "gateway-test-key-etl-0123456789";
/// The rpm of [`classes_config`]'s model; 20 % of it is the interactive headroom.
pub const CLASSES_RPM: u64 = 10;
/// [`classes_config`]'s model rpm key and the batch class's ceiling over it.
pub const CLASSES_RPM_KEY: &str = "global:llm:openai:gpt-4o-mini:rpm";
/// See [`CLASSES_RPM_KEY`].
pub const BATCH_CEILING_KEY: &str = "class:batch:global:llm:openai:gpt-4o-mini:rpm";

/// A gateway configuration with two classes (interactive: share 4, headroom 0.2;
/// batch) and a tenant in each, on one model of [`CLASSES_RPM`] requests a minute.
pub fn classes_config(provider: SocketAddr) -> GatewayConfig {
    std::env::set_var("GATEWAY_TEST_WEB_KEY", WEB_KEY);
    std::env::set_var("GATEWAY_TEST_ETL_KEY", ETL_KEY);
    let yaml = format!(
        r#"listen_addr: "127.0.0.1:0"
upstreams:
  - {{name: openai, kind: openai, base_url: "http://{provider}"}}
models:
  - {{name: gpt-4o-mini, upstream: openai, rpm: {CLASSES_RPM}, tpm: 100000, max_output_tokens_default: 50}}
classes:
  - {{name: interactive, share: 4, headroom: 0.2}}
  - {{name: batch, share: 1}}
tenants:
  - {{name: web, api_key_env: GATEWAY_TEST_WEB_KEY, class: interactive}}
  - {{name: etl, api_key_env: GATEWAY_TEST_ETL_KEY, class: batch}}
"#
    );
    serde_yaml::from_str(&yaml).unwrap()
}

/// POSTs a chat call with `key` and extra `headers`; answers the status and body.
pub async fn chat_as(
    client: &HttpClient,
    gateway: SocketAddr,
    key: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, String) {
    let bearer = format!("Bearer {key}");
    let mut all = vec![("authorization", bearer.as_str())];
    all.extend_from_slice(headers);
    let body =
        serde_json::json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 5});
    let response = post_raw(client, gateway, "/v1/chat/completions", body.to_string(), &all).await;
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (parts.status, String::from_utf8(bytes.to_vec()).unwrap())
}

/// Headroom whatever the backend: the batch tenant takes its ceiling, 80 % of the
/// model's rpm, and is refused the rest; the interactive tenant then takes the
/// headroom the batch tenant could not.
pub async fn batch_never_takes_the_interactive_headroom(backend: Arc<dyn Backend>) {
    let (provider, _) = start_provider().await;
    let gateway = start_gateway(&classes_config(provider), backend.clone()).await;
    let client = client();
    let mut batch_ok = 0;
    for _ in 0..CLASSES_RPM {
        let (status, body) = chat_as(&client, gateway, ETL_KEY, &[]).await;
        match status.as_u16() {
            200 => batch_ok += 1,
            429 => assert!(body.contains(BATCH_CEILING_KEY), "{body}"),
            other => panic!("batch call answered {other}: {body}"),
        }
    }
    assert_eq!(batch_ok, CLASSES_RPM * 8 / 10, "batch takes its ceiling and no more");
    assert_eq!(in_use(&backend, BATCH_CEILING_KEY).await, batch_ok);
    for _ in 0..CLASSES_RPM * 2 / 10 {
        let (status, body) = chat_as(&client, gateway, WEB_KEY, &[]).await;
        assert_eq!(status, 200, "the headroom is the interactive tenant's: {body}");
    }
    let (status, _) = chat_as(&client, gateway, WEB_KEY, &[]).await;
    assert_eq!(status, 429, "the model's own limit still binds the top class");
    assert_eq!(in_use(&backend, CLASSES_RPM_KEY).await, CLASSES_RPM);
}
