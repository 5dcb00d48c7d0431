//! The simulator's bill over real HTTP (`GET /sim/billing`): every call billed at
//! the configured prices from the usage it answered (OpenAI's chat, Responses and
//! embeddings, Anthropic's messages with cache writes and reads), streamed or not;
//! models without a price counted apart; and the random output draw within each
//! call's bound.

use std::collections::BTreeMap;
use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use ratelimiter::SystemClock;
use replay::sim::billing::Billing;
use replay::sim::control::{SimControl, MODELS_DEFAULT};
use replay::sim::limits::{Accounting, ProviderLimits};
use replay::sim::price::Price;
use replay::sim::server::ProviderServer;
use serde_json::{json, Value};
use tokio::net::TcpListener;

struct Sim {
    base: String,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Sim {
    async fn start(control: SimControl) -> Sim {
        let limits = ProviderLimits {
            rpm: 100_000,
            tpm: 100_000_000,
            window_ms: 60_000,
            concurrency: 64,
            ms_per_output_token: 0,
            accounting: Accounting::Actual,
        };
        let provider = ProviderServer::with_control(limits, Arc::new(SystemClock::new()), control);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(provider.serve(listener, std::future::pending()));
        let client = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        Sim { base, client }
    }

    async fn send(&self, method: Method, path: &str, body: &Value) -> (u16, String) {
        let body = if body.is_null() {
            Bytes::new()
        } else {
            Bytes::from(body.to_string())
        };
        let request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(Full::new(body))
            .unwrap();
        let response = self.client.request(request).await.unwrap();
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    async fn post(&self, path: &str, body: Value) -> String {
        let (status, body) = self.send(Method::POST, path, &body).await;
        assert_eq!(status, 200, "{body}");
        body
    }

    async fn bill(&self) -> Value {
        serde_json::from_str(&self.send(Method::GET, "/sim/billing", &Value::Null).await.1).unwrap()
    }
}

/// The last event's `usage` in a streamed body (the usage chunk, `response.completed`).
fn last_usage(body: &str) -> Value {
    (body.lines())
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|e| {
            e.get("usage")
                .or_else(|| e.get("response").and_then(|r| r.get("usage")))
                .cloned()
        })
        .rfind(|u| !u.is_null())
        .unwrap_or_else(|| panic!("no usage in {body}"))
}

/// Prices in micro-USD per million tokens, as the test computes the bill itself.
const GPT_INPUT: u128 = 150_000;
const GPT_OUTPUT: u128 = 600_000;
const CLAUDE_INPUT: u128 = 3_000_000;
const CLAUDE_OUTPUT: u128 = 15_000_000;
const CLAUDE_CACHE_READ: u128 = 300_000;
const CLAUDE_CACHE_WRITE: u128 = 3_750_000;

fn priced_control() -> SimControl {
    let prices = BTreeMap::from([
        (
            "gpt-4o-mini".to_owned(),
            Price::parse("input:0.15,output:0.60").unwrap(),
        ),
        (
            "claude-sonnet-4-5".to_owned(),
            Price::parse("input:3,output:15,cache_read:0.30,cache_write:3.75").unwrap(),
        ),
    ]);
    let models = MODELS_DEFAULT.iter().map(|m| (*m).to_owned()).collect();
    SimControl::new(models, None).with_billing(Billing::new(prices))
}

fn n(value: &Value) -> u128 {
    u128::from(value.as_u64().unwrap_or_else(|| panic!("not a count: {value}")))
}

#[tokio::test]
async fn billing_sums_every_call_at_its_models_prices_from_the_usage_it_answered() {
    let sim = Sim::start(priced_control()).await;
    let messages = json!([{"role": "user", "content": "the cat sat off her red mat"}]);
    let mut expected: u128 = 0;
    let chat = sim
        .post(
            "/v1/chat/completions",
            json!({"model": "gpt-4o-mini", "max_tokens": 9, "sim_output_tokens": 5, "messages": messages}),
        )
        .await;
    let usage = serde_json::from_str::<Value>(&chat).unwrap()["usage"].clone();
    expected += n(&usage["prompt_tokens"]) * GPT_INPUT + n(&usage["completion_tokens"]) * GPT_OUTPUT;
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 7, "stream": true,
        "stream_options": {"include_usage": true}, "messages": messages});
    let usage = last_usage(&sim.post("/v1/chat/completions", body).await);
    assert_eq!(usage["completion_tokens"], 7, "the bound without sim_output_tokens");
    expected += n(&usage["prompt_tokens"]) * GPT_INPUT + n(&usage["completion_tokens"]) * GPT_OUTPUT;
    let body = json!({"model": "gpt-4o-mini", "max_output_tokens": 4, "stream": true, "input": "the cat sat"});
    let usage = last_usage(&sim.post("/v1/responses", body).await);
    expected += n(&usage["input_tokens"]) * GPT_INPUT + n(&usage["output_tokens"]) * GPT_OUTPUT;
    let embedded = sim
        .post(
            "/v1/embeddings",
            json!({"model": "gpt-4o-mini", "input": ["the cat sat", "off"]}),
        )
        .await;
    let usage = serde_json::from_str::<Value>(&embedded).unwrap()["usage"].clone();
    expected += n(&usage["prompt_tokens"]) * GPT_INPUT;
    // Anthropic: a cached system prefix of 1,100 tokens, written then read.
    let system = json!([{"type": "text", "text": "the ".repeat(1_100), "cache_control": {"type": "ephemeral"}}]);
    let mut written_and_read = [0, 0];
    for _ in 0..2 {
        let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 20, "sim_output_tokens": 6,
            "system": system, "messages": messages});
        let message: Value = serde_json::from_str(&sim.post("/v1/messages", body).await).unwrap();
        let usage = &message["usage"];
        written_and_read[0] += n(&usage["cache_creation_input_tokens"]);
        written_and_read[1] += n(&usage["cache_read_input_tokens"]);
        expected += n(&usage["input_tokens"]) * CLAUDE_INPUT
            + n(&usage["cache_creation_input_tokens"]) * CLAUDE_CACHE_WRITE
            + n(&usage["cache_read_input_tokens"]) * CLAUDE_CACHE_READ
            + n(&usage["output_tokens"]) * CLAUDE_OUTPUT;
    }
    assert_eq!(
        written_and_read,
        [1_100, 1_100],
        "the prefix is written once, then read"
    );
    // A model without a price is served and counted apart, billed nothing.
    sim.post(
        "/v1/chat/completions",
        json!({"model": "gpt-4o", "max_tokens": 3, "messages": messages}),
    )
    .await;
    let bill = sim.bill().await;
    assert_eq!(bill["total"]["pico_usd"], expected.to_string(), "{bill}");
    assert_eq!(bill["total"]["calls"], 6);
    assert_eq!(bill["models"]["claude-sonnet-4-5"]["calls"], 2);
    assert_eq!(
        bill["models"]["claude-sonnet-4-5"]["tokens"]["cache_write_tokens"],
        1_100
    );
    assert_eq!(bill["unpriced_calls"], 1);
    let usd = bill["total_usd"].as_f64().unwrap();
    assert!((usd - expected as f64 / 1e12).abs() < 1e-12, "{usd}");
    let (status, _) = sim.send(Method::DELETE, "/sim/billing", &Value::Null).await;
    assert_eq!(status, 204);
    assert_eq!(sim.bill().await["total"]["calls"], 0);
}

#[tokio::test]
async fn random_output_draws_within_each_bound_and_an_asked_count_still_wins() {
    let sim = Sim::start(priced_control().with_random_output(7)).await;
    let messages = json!([{"role": "user", "content": "the cat sat"}]);
    let mut outputs = Vec::new();
    for _ in 0..40 {
        let body = json!({"model": "gpt-4o-mini", "max_tokens": 50, "messages": messages});
        let answer: Value = serde_json::from_str(&sim.post("/v1/chat/completions", body).await).unwrap();
        outputs.push(answer["usage"]["completion_tokens"].as_u64().unwrap());
    }
    assert!(outputs.iter().all(|o| (1..=50).contains(o)), "{outputs:?}");
    let distinct: std::collections::BTreeSet<_> = outputs.iter().collect();
    assert!(distinct.len() > 10, "drawn, not the bound: {outputs:?}");
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 30, "sim_output_tokens": 4, "messages": messages});
    let answer: Value = serde_json::from_str(&sim.post("/v1/messages", body).await).unwrap();
    assert_eq!(answer["usage"]["output_tokens"], 4);
    let bill = sim.bill().await;
    let drawn: u64 = outputs.iter().sum();
    assert_eq!(bill["models"]["gpt-4o-mini"]["tokens"]["output_tokens"], drawn);
}
