//! The gateway under hostile and careless clients and upstreams: headers that
//! must not cross, upstream credentials refused, bodies trickled, tenants over
//! their caps, calls abandoned at every step (no lease lost), a 100 MB answer
//! passed through, and Anthropic's token counting on the tenant's rpm.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing;
use axum::{Json, Router};
use bytes::Bytes;
use http_body_util::BodyExt;
use ratelimiter::{Backend, CompleteRequest, LimitKey, LimitReport, LimitState, Limiter, LimiterError};
use ratelimiter::{ReserveOutcome, ReserveRequest};
use serde_json::{json, Value};
use support::{client, eventually_in_use, in_use, memory_backend, post_raw, serve_gateway, HttpClient};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

/// Keys of the tenants (each test starts its own gateway).
const ACME: &str = "hostile-test-key-acme-0123456789";
const OTHER: &str = "hostile-test-key-other-0123456789";
const QUEUER: &str = "hostile-test-key-queuer-0123456789";
/// The size of the big embeddings answer.
const BIG_ANSWER_BYTES: usize = 100 * 1024 * 1024;
/// What the provider reports for every call.
const USAGE: (u64, u64) = (7, 3);

/// The provider: records what it received, answers with headers no client should
/// see, holds `-hold` calls until the test opens the gate.
struct Provider {
    headers: Mutex<Vec<HeaderMap>>,
    calls: AtomicU64,
    gate: Semaphore,
}

impl Default for Provider {
    fn default() -> Self {
        Self {
            headers: Mutex::new(Vec::new()),
            calls: AtomicU64::new(0),
            gate: Semaphore::new(0),
        }
    }
}

fn usage() -> Value {
    json!({"prompt_tokens": USAGE.0, "completion_tokens": USAGE.1, "total_tokens": USAGE.0 + USAGE.1})
}

async fn chat(State(provider): State<Arc<Provider>>, headers: HeaderMap, Json(body): Json<Value>) -> Response {
    provider.calls.fetch_add(1, Ordering::SeqCst);
    provider.headers.lock().unwrap().push(headers);
    let model = body["model"].as_str().unwrap_or("").to_owned();
    if let Some(status) = model.strip_prefix("gpt-refused-") {
        let status = StatusCode::from_u16(status.parse().unwrap()).unwrap();
        let error = json!({"error": {"message": "Incorrect API key provided: sk-proj-abc***************xyz9", "type": "invalid_request_error", "code": "invalid_api_key"}});
        return (status, Json(error)).into_response();
    }
    if model.ends_with("-hold") {
        provider.gate.acquire().await.unwrap().forget();
    }
    if body["stream"] == json!(true) {
        return held_stream(provider);
    }
    let mut response = Json(json!({"id": "c1", "object": "chat.completion", "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": usage()}))
    .into_response();
    for (name, value) in [
        ("set-cookie", "__cf_bm=secret; path=/"),
        ("openai-organization", "org-the-gateways-own"),
        ("openai-project", "proj-the-gateways-own"),
        ("x-request-id", "req_123"),
        ("x-ratelimit-remaining-requests", "499"),
        ("x-private", "named in Connection"),
        ("connection", "x-private"),
        ("keep-alive", "timeout=5"),
    ] {
        response.headers_mut().append(name, value.parse().unwrap());
    }
    response
}

/// A stream whose first event comes at once and the rest once the gate opens.
fn held_stream(provider: Arc<Provider>) -> Response {
    let first = futures_util::stream::once(async {
        Ok::<_, std::io::Error>(Bytes::from_static(
            b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n",
        ))
    });
    let rest = futures_util::stream::once(async move {
        provider.gate.acquire().await.unwrap().forget();
        let usage = format!("data: {}\n\ndata: [DONE]\n\n", json!({"choices": [], "usage": usage()}));
        Ok::<_, std::io::Error>(Bytes::from(usage))
    });
    let mut response = Response::new(Body::from_stream(futures_util::StreamExt::chain(first, rest)));
    response
        .headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    response
}

/// An embeddings answer of [`BIG_ANSWER_BYTES`], made as it is sent (the
/// provider holds none of it), its usage at the end as OpenAI puts it.
async fn embeddings() -> Response {
    const CHUNK_BYTES: usize = 64 * 1024;
    let head =
        Bytes::from_static(b"{\"object\":\"list\",\"data\":[{\"object\":\"embedding\",\"index\":0,\"embedding\":[0.1");
    let usage = json!({"prompt_tokens": USAGE.0, "total_tokens": USAGE.0});
    let tail = Bytes::from(format!("]}}],\"model\":\"embed-big\",\"usage\":{usage}}}"));
    let middle_bytes = BIG_ANSWER_BYTES - head.len() - tail.len();
    let chunk = Bytes::from(",0.1".repeat(CHUNK_BYTES / 4));
    let (chunks, rest) = (middle_bytes / chunk.len(), middle_bytes % chunk.len());
    let rest = Bytes::from(",0.1".repeat(rest / 4) + &" ".repeat(rest % 4));
    let parts = std::iter::once(head)
        .chain(std::iter::repeat_n(chunk, chunks))
        .chain([rest, tail])
        .map(Ok::<_, std::io::Error>);
    let mut response = Response::new(Body::from_stream(futures_util::stream::iter(parts)));
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    response
}

async fn count_tokens(State(provider): State<Arc<Provider>>) -> Response {
    provider.calls.fetch_add(1, Ordering::SeqCst);
    Json(json!({"input_tokens": 5})).into_response()
}

async fn messages(State(provider): State<Arc<Provider>>, headers: HeaderMap) -> Response {
    provider.calls.fetch_add(1, Ordering::SeqCst);
    provider.headers.lock().unwrap().push(headers);
    Json(
        json!({"id": "m1", "type": "message", "role": "assistant", "content": [{"type": "text", "text": "hi"}],
        "usage": {"input_tokens": USAGE.0, "output_tokens": USAGE.1}}),
    )
    .into_response()
}

async fn start_provider() -> (SocketAddr, Arc<Provider>) {
    let provider = Arc::new(Provider::default());
    let app = Router::new()
        .route("/v1/chat/completions", routing::post(chat))
        .route("/v1/embeddings", routing::post(embeddings))
        .route("/v1/messages", routing::post(messages))
        .route("/v1/messages/count_tokens", routing::post(count_tokens))
        .with_state(provider.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, provider)
}

fn config(provider: SocketAddr) -> gateway::GatewayConfig {
    std::env::set_var("HOSTILE_ACME_KEY", format!("{ACME}\n"));
    std::env::set_var("HOSTILE_OTHER_KEY", OTHER);
    std::env::set_var("HOSTILE_QUEUER_KEY", QUEUER);
    let yaml = format!(
        "listen_addr: \"127.0.0.1:0\"
client_body_timeout_ms: 400
upstreams:
  - {{name: p, kind: openai, base_url: \"http://{provider}\"}}
  - {{name: pa, kind: anthropic, base_url: \"http://{provider}\", forward_headers: [anthropic-beta]}}
models:
  - {{name: gpt-test, upstream: p, rpm: 1000, tpm: 1000000, concurrency: 8, max_output_tokens_default: 100}}
  - {{name: gpt-hold, upstream: p, rpm: 1000, tpm: 1000000, concurrency: 1, max_output_tokens_default: 100, max_wait_ms: 10000}}
  - {{name: gpt-refused-401, upstream: p, tpm: 1000000, max_output_tokens_default: 100}}
  - {{name: gpt-refused-403, upstream: p, tpm: 1000000, max_output_tokens_default: 100}}
  - {{name: embed-big, upstream: p, tpm: 1000000, concurrency: 2, max_output_tokens_default: 1}}
  - {{name: claude-h, upstream: pa, input_tpm: 100000, output_tpm: 100000, max_output_tokens_default: 100}}
tenants:
  - {{name: acme, api_key_env: HOSTILE_ACME_KEY, connections_max: 1}}
  - {{name: other, api_key_env: HOSTILE_OTHER_KEY, rpm: 2}}
  - {{name: queuer, api_key_env: HOSTILE_QUEUER_KEY, queued_max: 1}}
"
    );
    serde_yaml::from_str(&yaml).unwrap()
}

struct Setup {
    provider: Arc<Provider>,
    metrics: Arc<gateway::metrics::GatewayMetrics>,
    backend: Arc<dyn Backend>,
    gateway: SocketAddr,
    client: HttpClient,
}

async fn setup_on(backend: Arc<dyn Backend>) -> Setup {
    let (addr, provider) = start_provider().await;
    let gateway = gateway::Gateway::new(&config(addr), backend.clone()).unwrap();
    let (gateway, metrics) = serve_gateway(gateway, backend.clone()).await;
    Setup {
        provider,
        metrics,
        backend,
        gateway,
        client: client(),
    }
}

async fn setup() -> Setup {
    setup_on(memory_backend()).await
}

fn chat_body(model: &str) -> String {
    json!({"model": model, "max_tokens": 20, "messages": [{"role": "user", "content": "Say hi."}]}).to_string()
}

async fn call(setup: &Setup, key: &str, path: &str, body: String, extra: &[(&str, &str)]) -> (u16, HeaderMap, String) {
    let bearer = format!("Bearer {key}");
    let mut headers = vec![("authorization", bearer.as_str())];
    headers.extend_from_slice(extra);
    let response = post_raw(&setup.client, setup.gateway, path, body, &headers).await;
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (
        parts.status.as_u16(),
        parts.headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

async fn eventually_calls(provider: &Provider, expected: u64) {
    for _ in 0..500 {
        if provider.calls.load(Ordering::SeqCst) >= expected {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the provider never got {expected} calls");
}

/// Waits (bounded) until `expected` calls of `tenant` on `model` have waited in its queue.
async fn eventually_queued(setup: &Setup, model: &str, tenant: &str, expected: u64) {
    let counters = setup.metrics.calls(model, tenant);
    for _ in 0..500 {
        if counters.queued.load(Ordering::SeqCst) >= expected {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{tenant}'s calls on {model} never waited");
}

#[tokio::test]
async fn a_tenant_key_read_with_its_newline_is_trimmed_and_works() {
    let setup = setup().await;
    let (status, _, body) = call(&setup, ACME, "/v1/chat/completions", chat_body("gpt-test"), &[]).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn client_headers_reach_the_upstream_only_when_its_configuration_lists_them() {
    let setup = setup().await;
    let options = [
        ("openai-organization", "org-someone-else"),
        ("openai-project", "proj-someone-else"),
        ("anthropic-beta", "computer-use-2024-10-22"),
        ("cookie", "session=1"),
        ("anthropic-version", "2023-06-01"),
    ];
    let (status, _, body) = call(&setup, ACME, "/v1/chat/completions", chat_body("gpt-test"), &options).await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = call(&setup, OTHER, "/v1/messages", chat_body("claude-h"), &options).await;
    assert_eq!(status, 200, "{body}");
    let seen = setup.provider.headers.lock().unwrap().clone();
    for (i, headers) in seen.iter().enumerate() {
        for name in ["openai-organization", "openai-project", "cookie", "authorization"] {
            assert!(!headers.contains_key(name), "call {i} passed {name}: {headers:?}");
        }
        assert_eq!(headers["anthropic-version"], "2023-06-01");
    }
    assert!(
        !seen[0].contains_key("anthropic-beta"),
        "not listed for the OpenAI upstream"
    );
    assert_eq!(
        seen[1]["anthropic-beta"], "computer-use-2024-10-22",
        "listed for the Anthropic one"
    );
}

#[tokio::test]
async fn only_the_providers_answer_reaches_the_client() {
    let setup = setup().await;
    let (status, headers, _) = call(&setup, ACME, "/v1/chat/completions", chat_body("gpt-test"), &[]).await;
    assert_eq!(status, 200);
    for name in [
        "set-cookie",
        "openai-organization",
        "openai-project",
        "x-private",
        "keep-alive",
    ] {
        assert!(!headers.contains_key(name), "{name} reached the client: {headers:?}");
    }
    assert_eq!(headers["x-request-id"], "req_123");
    assert_eq!(headers["x-ratelimit-remaining-requests"], "499");
}

#[tokio::test]
async fn refused_upstream_credentials_are_a_502_without_the_providers_body() {
    let setup = setup().await;
    for status in [401, 403] {
        let model = format!("gpt-refused-{status}");
        let (got, _, body) = call(&setup, ACME, "/v1/chat/completions", chat_body(&model), &[]).await;
        assert_eq!(got, 502, "{body}");
        let error: Value = serde_json::from_str(&body).unwrap();
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains("upstream credentials"), "{message}");
        assert!(!body.contains("sk-") && !body.contains("Incorrect API key"), "{body}");
        // Nothing was served: the tokens are given back.
        eventually_in_use(&setup.backend, &format!("global:llm:p:{model}:tpm"), 0).await;
    }
}

#[tokio::test]
async fn a_100_mb_answer_reaches_the_client_as_it_arrives_and_is_reconciled() {
    let setup = setup().await;
    let bearer = format!("Bearer {ACME}");
    let body = json!({"model": "embed-big", "input": "hello"}).to_string();
    let response = post_raw(
        &setup.client,
        setup.gateway,
        "/v1/embeddings",
        body,
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let (mut received, mut last) = (0usize, Vec::new());
    while let Some(frame) = body.frame().await {
        let data = frame.unwrap().into_data().unwrap();
        received += data.len();
        last = data.to_vec();
    }
    assert_eq!(received, BIG_ANSWER_BYTES);
    assert!(String::from_utf8_lossy(&last).contains("\"prompt_tokens\":7"));
    // Reconciled to the usage at the answer's very end.
    eventually_in_use(&setup.backend, "global:llm:p:embed-big:tpm", USAGE.0).await;
    eventually_in_use(&setup.backend, "global:llm:p:embed-big:concurrency", 0).await;
}

/// Sends a request's headers and then its body a byte every 100 ms.
async fn trickle(gateway: SocketAddr, key: &str) -> String {
    let body = chat_body("gpt-test");
    let mut stream = tokio::net::TcpStream::connect(gateway).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {key}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    let sending = tokio::spawn(async move {
        for byte in body.bytes() {
            if write.write_all(&[byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let answer = read_answer(&mut read).await;
    sending.abort();
    answer
}

/// One HTTP/1.1 answer with a `content-length`, read off a raw connection.
async fn read_answer(read: &mut (impl tokio::io::AsyncRead + Unpin)) -> String {
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&answer).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_owned())
                })
                .and_then(|v| v.parse::<usize>().ok());
            if length.is_some_and(|n| body.len() >= n) {
                return text;
            }
        }
        match read.read(&mut buf).await {
            Ok(0) | Err(_) => return text,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
}

#[tokio::test]
async fn a_body_sent_a_byte_at_a_time_is_cut_off_before_anything_is_reserved() {
    let setup = setup().await;
    let answer = tokio::time::timeout(Duration::from_secs(30), trickle(setup.gateway, ACME))
        .await
        .expect("the gateway answers before the client finishes");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("did not arrive within 400 ms"), "{answer}");
    assert_eq!(in_use(&setup.backend, "global:llm:p:gpt-test:rpm").await, 0);
    assert_eq!(setup.provider.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_tenant_over_its_open_calls_gets_a_429_naming_the_cap_and_others_are_served() {
    let setup = Arc::new(setup().await);
    let held = {
        let setup = setup.clone();
        tokio::spawn(async move { call(&setup, ACME, "/v1/chat/completions", chat_body("gpt-hold"), &[]).await })
    };
    eventually_calls(&setup.provider, 1).await;
    let (status, headers, body) = call(&setup, ACME, "/v1/chat/completions", chat_body("gpt-test"), &[]).await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("connections_max"), "{body}");
    assert!(headers.contains_key("retry-after-ms"));
    // Another tenant is not held up by it.
    let (status, _, body) = call(&setup, OTHER, "/v1/chat/completions", chat_body("gpt-test"), &[]).await;
    assert_eq!(status, 200, "{body}");
    setup.provider.gate.add_permits(1);
    assert_eq!(held.await.unwrap().0, 200);
    let (status, _, body) = call(&setup, ACME, "/v1/chat/completions", chat_body("gpt-test"), &[]).await;
    assert_eq!(status, 200, "the slot came back: {body}");
}

#[tokio::test]
async fn a_stream_holds_its_tenants_slot_until_its_last_event() {
    let setup = setup().await;
    let bearer = format!("Bearer {ACME}");
    let stream = json!({"model": "gpt-test", "max_tokens": 20, "stream": true,
        "messages": [{"role": "user", "content": "Say hi."}]});
    let mut open = post_raw(
        &setup.client,
        setup.gateway,
        "/v1/chat/completions",
        stream.to_string(),
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(open.status(), 200);
    open.body_mut().frame().await.unwrap().unwrap();
    // The stream's answer has begun: its call is still open.
    let (status, _, body) = call(&setup, ACME, "/v1/chat/completions", chat_body("gpt-test"), &[]).await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("connections_max"), "{body}");
    setup.provider.gate.add_permits(1);
    open.into_body().collect().await.unwrap();
    let (status, _, body) = call(&setup, ACME, "/v1/chat/completions", chat_body("gpt-test"), &[]).await;
    assert_eq!(status, 200, "the slot came back with the stream's end: {body}");
}

#[tokio::test]
async fn a_tenant_over_its_waiting_calls_gets_a_429_naming_the_cap() {
    let setup = Arc::new(setup().await);
    let spawn_hold = |setup: Arc<Setup>| {
        tokio::spawn(async move { call(&setup, QUEUER, "/v1/chat/completions", chat_body("gpt-hold"), &[]).await })
    };
    let first = spawn_hold(setup.clone());
    eventually_calls(&setup.provider, 1).await;
    // The model's one slot is taken: the second call waits.
    let second = spawn_hold(setup.clone());
    eventually_queued(&setup, "gpt-hold", "queuer", 1).await;
    let (status, _, body) = call(&setup, QUEUER, "/v1/chat/completions", chat_body("gpt-hold"), &[]).await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("queued_max"), "{body}");
    setup.provider.gate.add_permits(2);
    assert_eq!(first.await.unwrap().0, 200);
    assert_eq!(second.await.unwrap().0, 200);
}

#[tokio::test]
async fn a_client_gone_while_queued_leaves_nothing_reserved() {
    let setup = Arc::new(setup().await);
    let held = {
        let setup = setup.clone();
        tokio::spawn(async move { call(&setup, OTHER, "/v1/chat/completions", chat_body("gpt-hold"), &[]).await })
    };
    eventually_calls(&setup.provider, 1).await;
    let waiting = {
        let setup = setup.clone();
        tokio::spawn(async move { call(&setup, ACME, "/v1/chat/completions", chat_body("gpt-hold"), &[]).await })
    };
    eventually_queued(&setup, "gpt-hold", "acme", 1).await;
    // The client gives up: its connection closes while the call waits.
    waiting.abort();
    let _ = waiting.await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    setup.provider.gate.add_permits(1);
    assert_eq!(held.await.unwrap().0, 200);
    eventually_in_use(&setup.backend, "global:llm:p:gpt-hold:concurrency", 0).await;
    assert_eq!(
        in_use(&setup.backend, "global:llm:p:gpt-hold:rpm").await,
        1,
        "only the call served"
    );
    assert_eq!(setup.provider.calls.load(Ordering::SeqCst), 1);
}

/// A backend whose reserves land at once but whose answers take a while, as a
/// TigerBeetle round trip does: a handler dropped while it waits must not lose
/// the lease the cluster granted.
struct SlowAnswers {
    inner: Arc<dyn Backend>,
    delay: Duration,
}

#[async_trait::async_trait]
impl Limiter for SlowAnswers {
    async fn reserve(&self, request: &ReserveRequest) -> Result<ReserveOutcome, LimiterError> {
        let (inner, request) = (self.inner.clone(), request.clone());
        let landed = tokio::spawn(async move { inner.reserve(&request).await });
        tokio::time::sleep(self.delay).await;
        landed.await.unwrap()
    }
    async fn complete(&self, request: &CompleteRequest) -> Result<(), LimiterError> {
        self.inner.complete(request).await
    }
}

#[async_trait::async_trait]
impl Backend for SlowAnswers {
    async fn apply_state(&self, state: &LimitState) -> Result<(), LimiterError> {
        self.inner.apply_state(state).await
    }
    async fn limit_report(&self, key: &LimitKey) -> Result<Option<LimitReport>, LimiterError> {
        self.inner.limit_report(key).await
    }
    async fn limit_reports(&self) -> Result<Vec<LimitReport>, LimiterError> {
        self.inner.limit_reports().await
    }
    async fn apply_pending_decreases(&self) -> Result<Vec<LimitState>, LimiterError> {
        self.inner.apply_pending_decreases().await
    }
    async fn health(&self) -> Result<(), LimiterError> {
        self.inner.health().await
    }
}

#[tokio::test]
async fn a_client_gone_while_its_reserve_is_in_flight_leaves_nothing_reserved() {
    let backend: Arc<dyn Backend> = Arc::new(SlowAnswers {
        inner: memory_backend(),
        delay: Duration::from_millis(500),
    });
    let setup = Arc::new(setup_on(backend).await);
    let gone = {
        let setup = setup.clone();
        tokio::spawn(async move { call(&setup, ACME, "/v1/chat/completions", chat_body("gpt-test"), &[]).await })
    };
    let concurrency = "global:llm:p:gpt-test:concurrency";
    // The reserve has landed; its answer is on its way; the client leaves.
    eventually_in_use(&setup.backend, concurrency, 1).await;
    gone.abort();
    let _ = gone.await;
    eventually_in_use(&setup.backend, concurrency, 0).await;
    eventually_in_use(&setup.backend, "global:llm:p:gpt-test:tpm", 0).await;
    assert_eq!(setup.provider.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn count_tokens_needs_a_tenant_key_and_counts_on_its_rpm() {
    let setup = setup().await;
    let body = json!({"model": "claude-h", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let anonymous = post_raw(
        &setup.client,
        setup.gateway,
        "/v1/messages/count_tokens",
        body.clone(),
        &[("anthropic-version", "2023-06-01")],
    )
    .await;
    assert_eq!(anonymous.status(), 401);
    for _ in 0..2 {
        let (status, _, answer) = call(&setup, OTHER, "/v1/messages/count_tokens", body.clone(), &[]).await;
        assert_eq!(status, 200, "{answer}");
    }
    let (status, headers, answer) = call(&setup, OTHER, "/v1/messages/count_tokens", body, &[]).await;
    assert_eq!(status, 429, "{answer}");
    assert!(answer.contains("tenant:other:"), "{answer}");
    assert_eq!(headers["x-ratelimit-limit-requests"], "2");
    assert_eq!(setup.provider.calls.load(Ordering::SeqCst), 2);
}
