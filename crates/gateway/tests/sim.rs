//! The gateway in front of the provider simulator (`replay::provider_server`, in
//! process): every endpoint reconciled to the simulator's own usage, count_tokens
//! forwarded without a reservation, the Claude estimate never below the
//! simulator's count, 64 concurrent streams never past the concurrency limit,
//! and a pool's failover after sending charged on the tenant's budget as billed.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::BodyExt;
use ratelimiter::SystemClock;
use replay::provider::{Accounting, ProviderLimits};
use replay::provider_server::ProviderServer;
use replay::sim_control::SimControl;
use serde_json::{json, Value};
use support::*;

async fn start_sim(ms_per_output_token: u64) -> SocketAddr {
    let limits = ProviderLimits {
        rpm: 100_000,
        tpm: 100_000_000,
        window_ms: 60_000,
        concurrency: 1_000,
        ms_per_output_token,
        accounting: Accounting::Actual,
    };
    let provider = ProviderServer::with_control(limits, Arc::new(SystemClock::new()), SimControl::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(Arc::clone(&provider).serve(listener, std::future::pending()));
    addr
}

fn sim_config(sim: SocketAddr, concurrency: u64, max_wait_ms: u64) -> gateway::GatewayConfig {
    std::env::set_var("GATEWAY_SIM_ACME_KEY", TENANT_KEY);
    let yaml = format!(
        "listen_addr: \"127.0.0.1:0\"\nupstream_timeout_ms: 1000\nupstreams:\n  - {{name: sim, kind: openai, base_url: \"http://{sim}\"}}\n  - {{name: simclaude, kind: anthropic, base_url: \"http://{sim}\"}}\nmodels:\n  - {{name: gpt-4o-mini, upstream: sim, rpm: 10000, tpm: 10000000, concurrency: {concurrency}, max_output_tokens_default: 64, max_wait_ms: {max_wait_ms}}}\n  - {{name: text-embedding-3-small, upstream: sim, tpm: 1000000, max_output_tokens_default: 1}}\n  - {{name: claude-sonnet-4-5, upstream: simclaude, input_tpm: 1000000, output_tpm: 1000000, concurrency: 16, max_output_tokens_default: 64}}\ntenants:\n  - {{name: acme, api_key_env: GATEWAY_SIM_ACME_KEY, daily_tokens: 100000000}}\n"
    );
    serde_yaml::from_str(&yaml).unwrap()
}

async fn sim_stats(sim: SocketAddr) -> Value {
    let response = client()
        .request(
            hyper::Request::get(format!("http://{sim}/sim/stats"))
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap()
}

#[tokio::test]
async fn embeddings_and_responses_are_reconciled_to_the_simulators_usage() {
    let sim = start_sim(0).await;
    let backend = memory_backend();
    let gateway = start_gateway(&sim_config(sim, 8, 0), backend.clone()).await;
    let client = client();
    let (status, _, body) = post(
        &client,
        gateway,
        "/v1/embeddings",
        json!({"model": "text-embedding-3-small", "input": ["hello world", "the cat sat on the mat"]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let used = serde_json::from_str::<Value>(&body).unwrap()["usage"]["prompt_tokens"]
        .as_u64()
        .unwrap();
    eventually_in_use(&backend, "global:llm:sim:text-embedding-3-small:tpm", used).await;

    let mut total = 0;
    for stream in [false, true] {
        let request = json!({"model": "gpt-4o-mini", "input": "Write one line.", "max_output_tokens": 20,
            "stream": stream, "sim_output_tokens": 12});
        let (status, _, body) = post(&client, gateway, "/v1/responses", request).await;
        assert_eq!(status, 200, "{body}");
        let usage = if stream {
            let done = body
                .split("\n\n")
                .find(|e| e.contains("response.completed"))
                .expect("completed event");
            let data: Value = serde_json::from_str(done.split("data: ").nth(1).unwrap()).unwrap();
            data["response"]["usage"].clone()
        } else {
            serde_json::from_str::<Value>(&body).unwrap()["usage"].clone()
        };
        total += usage["input_tokens"].as_u64().unwrap() + usage["output_tokens"].as_u64().unwrap();
    }
    eventually_in_use(&backend, "global:llm:sim:gpt-4o-mini:tpm", total).await;
    eventually_in_use(&backend, "global:llm:sim:gpt-4o-mini:concurrency", 0).await;
}

#[tokio::test]
async fn count_tokens_is_forwarded_without_a_reservation_and_the_claude_estimate_is_never_below_it() {
    let sim = start_sim(0).await;
    let backend = memory_backend();
    let (gateway, metrics) = start_gateway_with_metrics(&sim_config(sim, 8, 0), backend.clone()).await;
    let client = client();
    let texts = [
        "Hello",
        "The quick brown fox jumps over the lazy dog.",
        "日本語のテキスト、そして emoji 🎉",
        "fn main() { println!(\"{}\", 40 + 2); }",
    ];
    for text in texts {
        let body = json!({"model": "claude-sonnet-4-5", "system": "Be brief.",
            "messages": [{"role": "user", "content": text}]});
        let headers = [("x-api-key", TENANT_KEY), ("anthropic-version", "2023-06-01")];
        let response = post_raw(
            &client,
            gateway,
            "/v1/messages/count_tokens",
            body.to_string(),
            &headers,
        )
        .await;
        assert_eq!(response.status(), 200);
        let counted: Value = serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
        let provider_count = counted["input_tokens"].as_u64().unwrap();
        let estimate = gateway::counting::tokens::Counter::new(
            gateway::config::Encoding::Bytes,
            gateway::counting::model_table::lookup("claude-sonnet-4-5"),
        )
        .anthropic_messages(&body)
        .total();
        assert!(
            estimate >= provider_count,
            "{text:?}: estimate {estimate} < provider {provider_count}"
        );
    }
    assert_eq!(
        in_use(&backend, "global:llm:simclaude:claude-sonnet-4-5:input_tpm").await,
        0
    );
    let mut text = String::new();
    metrics.render(&mut text);
    assert!(!text.contains("admitted_total{"), "count_tokens is not limited: {text}");
    // A message call through the same gateway is limited, and shows in the metrics.
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]});
    let headers = [("x-api-key", TENANT_KEY), ("anthropic-version", "2023-06-01")];
    let response = post_raw(&client, gateway, "/v1/messages", body.to_string(), &headers).await;
    assert_eq!(response.status(), 200);
    response.into_body().collect().await.unwrap();
    let mut text = String::new();
    metrics.render(&mut text);
    assert!(
        text.contains("admitted_total{model=\"claude-sonnet-4-5\",tenant=\"acme\"} 1"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_streams_never_exceed_the_concurrency_limit() {
    // Each stream lasts 8 tokens x 5 ms; 64 of them through 8 slots, waiting their turn.
    let sim = start_sim(5).await;
    let backend = memory_backend();
    let gateway = start_gateway(&sim_config(sim, 8, 60_000), backend.clone()).await;
    let client = client();
    let calls: Vec<_> = (0..64)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let request = json!({"model": "gpt-4o-mini", "stream": true, "max_tokens": 8, "sim_output_tokens": 8,
                    "messages": [{"role": "user", "content": format!("call {i}")}]});
                post(&client, gateway, "/v1/chat/completions", request).await
            })
        })
        .collect();
    let mut used = 0;
    for call in calls {
        let (status, _, body) = call.await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
        assert!(!body.contains("\"usage\":{"), "the client did not ask for usage");
        used += 1;
    }
    assert_eq!(used, 64);
    let stats = sim_stats(sim).await;
    let peak = stats["in_flight_max"].as_u64().unwrap();
    assert!(
        (1..=8).contains(&peak),
        "the provider saw {peak} calls at once: {stats}"
    );
    eventually_in_use(&backend, "global:llm:sim:gpt-4o-mini:concurrency", 0).await;
}

async fn arm_fault(sim: SocketAddr, fault: Value) {
    let response = client()
        .request(
            hyper::Request::post(format!("http://{sim}/sim/faults"))
                .header("content-type", "application/json")
                .body(http_body_util::Full::new(bytes::Bytes::from(fault.to_string())))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), 204);
}

#[tokio::test]
async fn upstream_failures_are_answered_in_the_providers_shape_and_free_the_slot() {
    let sim = start_sim(1).await;
    let backend = memory_backend();
    let gateway = start_gateway(&sim_config(sim, 8, 0), backend.clone()).await;
    let client = client();
    let concurrency = "global:llm:sim:gpt-4o-mini:concurrency";
    let tpm = "global:llm:sim:gpt-4o-mini:tpm";
    let chat = |stream: bool| {
        json!({"model": "gpt-4o-mini", "max_tokens": 20, "sim_output_tokens": 20, "stream": stream,
            "messages": [{"role": "user", "content": "Hello"}]})
    };
    // A hung upstream: a 504 after the upstream timeout; the tokens stay reserved.
    arm_fault(sim, json!({"mode": "hang", "count": 1})).await;
    let (status, _, body) = post(&client, gateway, "/v1/chat/completions", chat(false)).await;
    assert_eq!(status, 504, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"]["type"],
        "server_error"
    );
    eventually_in_use(&backend, concurrency, 0).await;
    let kept = in_use(&backend, tpm).await;
    assert!(kept >= 20, "prompt and output bound kept: {kept}");
    // A 500 from the provider is passed through; the tokens stay reserved.
    arm_fault(sim, json!({"mode": "status", "status": 500, "count": 1})).await;
    let (status, _, _) = post(&client, gateway, "/v1/chat/completions", chat(false)).await;
    assert_eq!(status, 500);
    eventually_in_use(&backend, concurrency, 0).await;
    assert_eq!(in_use(&backend, tpm).await, 2 * kept);
    // A stream cut mid-way: the client's stream fails too, the slot is freed.
    arm_fault(sim, json!({"mode": "drop", "after_events": 2, "count": 1})).await;
    let bearer = format!("Bearer {TENANT_KEY}");
    let response = post_raw(
        &client,
        gateway,
        "/v1/chat/completions",
        chat(true).to_string(),
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(response.status(), 200);
    assert!(
        response.into_body().collect().await.is_err(),
        "the cut reaches the client"
    );
    eventually_in_use(&backend, concurrency, 0).await;
    assert_eq!(in_use(&backend, tpm).await, 3 * kept);
    // Anthropic's shape for its own endpoint.
    arm_fault(sim, json!({"mode": "hang", "count": 1})).await;
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]});
    let headers = [("x-api-key", TENANT_KEY), ("anthropic-version", "2023-06-01")];
    let response = post_raw(&client, gateway, "/v1/messages", body.to_string(), &headers).await;
    assert_eq!(response.status(), 504);
    let error: Value = serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(error["error"]["type"], "timeout_error", "{error}");
}

/// The prompt's characters: the simulator counts a quarter of them (100 tokens),
/// the o200k tokenizer far fewer (one repeated letter packs tightly).
const PACKED_PROMPT_CHARACTERS: usize = 400;
/// A token limit the simulator's count of that prompt alone is above.
const SMALL_TPM: u64 = 100;

#[tokio::test]
async fn usage_above_a_full_window_is_recorded_as_debt() {
    let sim = start_sim(0).await;
    let yaml = format!(
        "listen_addr: \"127.0.0.1:0\"\nallow_anonymous: true\nupstreams:\n  - {{name: sim, kind: openai, base_url: \"http://{sim}\"}}\nmodels:\n  - {{name: gpt-4o-mini, upstream: sim, tpm: {SMALL_TPM}, max_output_tokens_default: 8}}\n"
    );
    let backend = memory_backend();
    let gateway = start_gateway(&serde_yaml::from_str(&yaml).unwrap(), backend.clone()).await;
    let request = json!({"model": "gpt-4o-mini", "max_tokens": 8, "sim_output_tokens": 8,
        "messages": [{"role": "user", "content": "a".repeat(PACKED_PROMPT_CHARACTERS)}]});
    let (status, _, body) = post(&client(), gateway, "/v1/chat/completions", request).await;
    assert_eq!(status, 200, "{body}");
    let usage = &serde_json::from_str::<Value>(&body).unwrap()["usage"];
    let used = usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap();
    assert!(used > SMALL_TPM, "the provider's count {used} must be above the window");
    // The reservation fit; the provider's count did not: what is above the full
    // window is recorded as debt, not dropped.
    let key = ratelimiter::LimitKey::new("global:llm:sim:gpt-4o-mini:tpm").unwrap();
    let mut report = backend.limit_report(&key).await.unwrap().unwrap();
    for _ in 0..200 {
        if report.debt > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        report = backend.limit_report(&key).await.unwrap().unwrap();
    }
    assert_eq!(
        report.in_use + report.debt,
        used,
        "in use {} + debt {}",
        report.in_use,
        report.debt
    );
    assert!(report.debt > 0, "nothing recorded above the window: {report:?}");
}

/// The budget of [`calls_without_a_bound_are_billed_within_the_budget`]: $0.01.
const SMALL_BUDGET_PICO_USD: u128 = 10_000_000_000;

/// The simulator billing `gpt-4o-mini` at $2.50 input and $10 output per
/// million tokens, the price the gateway is configured with, answering after
/// `ms_per_output_token` per output token.
async fn start_billing_sim(ms_per_output_token: u64) -> SocketAddr {
    let price = replay::sim::price::Price::parse("input:2.5,output:10").unwrap();
    let billing = replay::sim::billing::Billing::new([("gpt-4o-mini".to_owned(), price)].into());
    let control = SimControl::default().with_billing(billing);
    let limits = ProviderLimits {
        rpm: 100_000,
        tpm: 100_000_000,
        window_ms: 60_000,
        concurrency: 1_000,
        ms_per_output_token,
        accounting: Accounting::Actual,
    };
    let provider = ProviderServer::with_control(limits, Arc::new(SystemClock::new()), control);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(Arc::clone(&provider).serve(listener, std::future::pending()));
    addr
}

#[tokio::test]
async fn calls_without_a_bound_are_billed_within_the_budget() {
    // The simulator writes its own default (4,096 tokens) to a call that names no
    // bound: the gateway reserves the model's 64 and has to send them.
    let sim = start_billing_sim(0).await;
    std::env::set_var("GATEWAY_SIM_BOUND_KEY", TENANT_KEY);
    let price = "price: {input: 2.5, output: 10}";
    let yaml = format!(
        "listen_addr: \"127.0.0.1:0\"\nupstreams:\n  - {{name: sim, kind: openai, base_url: \"http://{sim}\"}}\n  - {{name: local, kind: openai-compatible, base_url: \"http://{sim}\"}}\nmodels:\n  - {{name: gpt-4o-mini, upstream: sim, tpm: 10000000, max_output_tokens_default: 64, {price}}}\n  - {{name: local-mini, max_output_tokens_default: 64, {price}, deployments: [{{upstream: local, model: gpt-4o-mini, tpm: 10000000}}]}}\ntenants:\n  - {{name: acme, api_key_env: GATEWAY_SIM_BOUND_KEY, budgets: [{{usd: 0.01, period: day}}]}}\n"
    );
    let gateway = start_gateway(&serde_yaml::from_str(&yaml).unwrap(), memory_backend()).await;
    let client = client();
    let messages = json!([{"role": "user", "content": "Write a long story."}]);
    let (mut served, mut refused) = (0, 0);
    for round in 0..30 {
        let (path, body) = match round % 3 {
            0 => (
                "/v1/chat/completions",
                json!({"model": "gpt-4o-mini", "messages": messages}),
            ),
            1 => (
                "/v1/responses",
                json!({"model": "gpt-4o-mini", "input": "Write a long story."}),
            ),
            _ => (
                "/v1/chat/completions",
                json!({"model": "local-mini", "messages": messages}),
            ),
        };
        let (status, _, text) = post(&client, gateway, path, body).await;
        if status == 429 {
            refused += 1;
            continue;
        }
        assert_eq!(status, 200, "{text}");
        served += 1;
        let usage = &serde_json::from_str::<Value>(&text).unwrap()["usage"];
        let output = usage["completion_tokens"].as_u64().or(usage["output_tokens"].as_u64());
        assert_eq!(output, Some(64), "{path}: the bound reserved is the bound sent: {text}");
    }
    let billed = sim_bill(sim).await;
    assert!(
        billed <= SMALL_BUDGET_PICO_USD,
        "billed {billed} pico-dollars on a $0.01 budget"
    );
    assert!(served >= 10 && refused > 0, "served {served}, refused {refused}");
}

/// What the simulator at `sim` billed since it started, in pico-dollars.
async fn sim_bill(sim: SocketAddr) -> u128 {
    sim_bill_report(sim).await["total"]["pico_usd"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// The tokens the simulator at `sim` billed since it started, input and output.
async fn sim_billed_tokens(sim: SocketAddr) -> u64 {
    let tokens = &sim_bill_report(sim).await["total"]["tokens"];
    tokens["input_tokens"].as_u64().unwrap() + tokens["output_tokens"].as_u64().unwrap()
}

/// The simulator's bill report (`GET /sim/billing`).
async fn sim_bill_report(sim: SocketAddr) -> Value {
    let request = hyper::Request::get(format!("http://{sim}/sim/billing"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let response = client().request(request).await.unwrap();
    serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap()
}

/// The upstream timeout of [`a_try_that_fails_over_after_sending_stays_charged`]:
/// far below the slow simulator's answer (64 tokens at 20 ms each).
const FAILOVER_TIMEOUT_MS: u64 = 200;
/// The slow simulator's time per output token.
const SLOW_MS_PER_TOKEN: u64 = 20;
/// The slow deployment's breaker never opens in the test: every call tries it first.
const BREAKER_FAILURES: u32 = 1_000;

#[tokio::test]
async fn a_try_that_fails_over_after_sending_stays_charged() {
    // The first deployment bills each call when it receives it, then answers too
    // late: the gateway fails over to the second, which bills the call again.
    let (slow, fast) = (start_billing_sim(SLOW_MS_PER_TOKEN).await, start_billing_sim(0).await);
    std::env::set_var("GATEWAY_SIM_FAILOVER_KEY", TENANT_KEY);
    let yaml = format!(
        "listen_addr: \"127.0.0.1:0\"\nupstream_timeout_ms: {FAILOVER_TIMEOUT_MS}\nupstreams:\n  - {{name: slow, kind: openai, base_url: \"http://{slow}\"}}\n  - {{name: fast, kind: openai, base_url: \"http://{fast}\"}}\nmodels:\n  - {{name: gpt-4o-mini, routing: ordered, max_output_tokens_default: 64, price: {{input: 2.5, output: 10}}, breaker: {{failures: {BREAKER_FAILURES}}}, deployments: [{{upstream: slow}}, {{upstream: fast, priority: 1}}]}}\ntenants:\n  - {{name: acme, api_key_env: GATEWAY_SIM_FAILOVER_KEY, daily_tokens: 10000000, budgets: [{{usd: 0.01, period: day}}]}}\n"
    );
    let backend = memory_backend();
    let gateway = start_gateway(&serde_yaml::from_str(&yaml).unwrap(), backend.clone()).await;
    let client = client();
    let (mut served, mut refused) = (0, 0);
    for _ in 0..30 {
        let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Write a long story."}]});
        let (status, _, text) = post(&client, gateway, "/v1/chat/completions", body).await;
        match status.as_u16() {
            429 => refused += 1,
            200 => served += 1,
            other => panic!("{other}: {text}"),
        }
    }
    let (first, second) = (sim_bill(slow).await, sim_bill(fast).await);
    assert!(first > 0 && second > 0, "both deployments billed: {first}, {second}");
    assert!(served > 0 && refused > 0, "served {served}, refused {refused}");
    // Every try sent stays on the tenant's budget: it holds at least the bill,
    // and the calls stop before the bill passes the budget.
    let charged = u128::from(in_use(&backend, "tenant:acme:usd:day").await) * 1_000_000;
    assert!(
        charged >= first + second,
        "the budget holds {charged} pico-dollars, the simulators billed {first} + {second}"
    );
    assert!(
        first + second <= SMALL_BUDGET_PICO_USD,
        "billed {first} + {second} pico-dollars on a $0.01 budget"
    );
    // The same on the tenant's daily tokens: both tries' tokens stay counted.
    let tokens = sim_billed_tokens(slow).await + sim_billed_tokens(fast).await;
    let counted = in_use(&backend, "tenant:acme:llm:daily_tokens").await;
    assert!(
        counted >= tokens,
        "daily tokens hold {counted}, the simulators billed {tokens}"
    );
}
