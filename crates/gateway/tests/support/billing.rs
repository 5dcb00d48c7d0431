//! A provider for the budget tests: it answers OpenAI chat, OpenAI Responses and
//! Anthropic messages with the usage the request asks for (`test_usage`), and
//! holds the calls that ask it (`test_hold`) until the test lets them go, so
//! that a reservation can be read while its call is in flight.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{routing, Json, Router};
use serde_json::{json, Value};
use tokio::sync::Semaphore;

/// The provider's state.
pub struct Billing {
    /// Permits that let held calls answer.
    pub gate: Semaphore,
    /// Calls received.
    pub calls: AtomicU64,
    /// Calls being held now.
    pub held: AtomicU64,
    /// The most calls held at once.
    pub held_max: AtomicU64,
}

impl Default for Billing {
    fn default() -> Self {
        Self {
            gate: Semaphore::new(0),
            calls: AtomicU64::new(0),
            held: AtomicU64::new(0),
            held_max: AtomicU64::new(0),
        }
    }
}

impl Billing {
    /// Waits (bounded) until `count` calls are held.
    pub async fn until_held(&self, count: u64) {
        for _ in 0..500 {
            if self.held.load(Ordering::SeqCst) >= count {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{count} calls never held: {}", self.held.load(Ordering::SeqCst));
    }

    /// Lets `count` held calls answer.
    pub fn release(&self, count: usize) {
        self.gate.add_permits(count);
    }
}

/// Counts the call and holds it while the request asks.
async fn receive(billing: &Billing, body: &Value) -> Value {
    billing.calls.fetch_add(1, Ordering::SeqCst);
    if body["test_hold"] == json!(true) {
        let now = billing.held.fetch_add(1, Ordering::SeqCst) + 1;
        billing.held_max.fetch_max(now, Ordering::SeqCst);
        billing.gate.acquire().await.unwrap().forget();
        billing.held.fetch_sub(1, Ordering::SeqCst);
    }
    body["test_usage"].clone()
}

async fn chat(State(billing): State<Arc<Billing>>, Json(body): Json<Value>) -> Response {
    let usage = receive(&billing, &body).await;
    Json(
        json!({"id": "chatcmpl-1", "object": "chat.completion", "model": body["model"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": usage}),
    )
    .into_response()
}

async fn responses(State(billing): State<Arc<Billing>>, Json(body): Json<Value>) -> Response {
    let usage = receive(&billing, &body).await;
    Json(
        json!({"id": "resp_1", "object": "response", "status": "completed", "model": body["model"],
        "output": [], "usage": usage}),
    )
    .into_response()
}

async fn messages(State(billing): State<Arc<Billing>>, Json(body): Json<Value>) -> Response {
    let usage = receive(&billing, &body).await;
    Json(
        json!({"id": "msg_1", "type": "message", "role": "assistant", "model": body["model"],
        "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn", "usage": usage}),
    )
    .into_response()
}

/// Starts the provider on a free loopback port.
pub async fn start_billing() -> (SocketAddr, Arc<Billing>) {
    let billing = Arc::new(Billing::default());
    let app = Router::new()
        .route("/v1/chat/completions", routing::post(chat))
        .route("/v1/responses", routing::post(responses))
        .route("/v1/messages", routing::post(messages))
        .with_state(billing.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, billing)
}

/// The tenant key of the budget tests.
pub const BUDGET_TENANT_KEY: &str = "gateway-test-key-fin-0123456789ab";

/// A gateway configuration in front of `provider`: `gpt-4o` (OpenAI, $2.50
/// input, $1.25 cached, $10 output) and `claude` (Anthropic, Sonnet's price),
/// the tenant `fin` with an unbounded daily token limit (what it holds is the
/// call's token bound) and `tenant_budgets`, and `extra` YAML appended
/// (gateway budgets, more models).
pub fn budget_config(
    provider: SocketAddr,
    tenant_budgets: &str,
    max_wait_ms: u64,
    extra: &str,
) -> gateway::GatewayConfig {
    std::env::set_var("GATEWAY_TEST_FIN_KEY", BUDGET_TENANT_KEY);
    let yaml = format!(
        r#"listen_addr: "127.0.0.1:0"
upstreams:
  - {{name: oai, kind: openai, base_url: "http://{provider}"}}
  - {{name: ant, kind: anthropic, base_url: "http://{provider}"}}
models:
  - name: gpt-4o
    upstream: oai
    max_output_tokens_default: 100
    max_wait_ms: {max_wait_ms}
    image_tokens: 1000
    price: {{input: 2.50, output: 10.00, cache_read: 1.25}}
  - name: claude
    upstream: ant
    max_wait_ms: {max_wait_ms}
    price: {{input: 3, output: 15, cache_read: 0.30, cache_write: 3.75, cache_write_1h: 6}}
tenants:
  - {{name: fin, api_key_env: GATEWAY_TEST_FIN_KEY, daily_tokens: 1000000000, budgets: {tenant_budgets}}}
{extra}"#
    );
    serde_yaml::from_str(&yaml).unwrap()
}
