//! Budgets in money through the gateway (docs/gateway.md, "Budgets and spend"):
//! each format's worst case reserved and billed cost reconciled, the
//! deployment's price in a pool, a spent period refused for good until its
//! boundary, a budget only full of calls in flight waited for, a $0 budget.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use gateway::proxy::upstream::UpstreamClient;
use http_body_util::BodyExt;
use ratelimiter::{Backend, FakeClock, MemoryBackend, MemoryConfig, Period};
use serde_json::{json, Value};
use support::billing::{budget_config, start_billing, Billing, BUDGET_TENANT_KEY};
use support::*;

/// The tenant's monthly budget key in [`budget_config`].
const MONTH: &str = "tenant:fin:usd:month";
/// The tenant's token limit: during a call it holds the prompt charge plus the output bound.
const DAILY_TOKENS: &str = "tenant:fin:llm:daily_tokens";

/// POSTs `body` to `path` as the budget tests' tenant (both SDKs' headers).
async fn call(
    client: &HttpClient,
    gateway: std::net::SocketAddr,
    path: &str,
    body: &Value,
) -> (StatusCode, axum::http::HeaderMap, String) {
    let bearer = format!("Bearer {BUDGET_TENANT_KEY}");
    let headers = [
        ("authorization", bearer.as_str()),
        ("x-api-key", BUDGET_TENANT_KEY),
        ("anthropic-version", "2023-06-01"),
    ];
    let response = post_raw(client, gateway, path, body.to_string(), &headers).await;
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, String::from_utf8(bytes.to_vec()).unwrap())
}

/// `tokens × micro-dollars per million`, summed and rounded up once.
fn cost(terms: &[(u64, u64)]) -> u64 {
    let scaled: u64 = terms.iter().map(|(tokens, price)| tokens * price).sum();
    scaled.div_ceil(1_000_000)
}

/// One call of each format: what it sends, the usage the provider reports,
/// its prices (the dearest prompt price, the output price) and its billed cost.
struct Case {
    path: &'static str,
    body: Value,
    output_bound: u64,
    prices: (u64, u64),
    billed: u64,
}

fn cases() -> Vec<Case> {
    // gpt-4o: $2.50 input, $1.25 cached, $10 output; the dearest prompt price is the input's.
    let gpt = (2_500_000, 10_000_000);
    // claude: $3 input, $0.30 reads, $3.75 and $6 writes, $15 output; the dearest prompt price is the 1-hour write.
    let claude = (6_000_000, 15_000_000);
    let image = "https://example.com/cat.png";
    // A prompt of more tokens than any usage below reports: a bill within the call's bound.
    let long = "word ".repeat(1_500);
    vec![
        // Chat: 1,000 prompt tokens, 800 of them cached; 300 output, 200 of them reasoning.
        Case {
            path: "/v1/chat/completions",
            body: json!({"model": "gpt-4o", "max_tokens": 300, "messages": [{"role": "user", "content": long}],
                "test_usage": {"prompt_tokens": 1000, "completion_tokens": 300, "total_tokens": 1300,
                    "prompt_tokens_details": {"cached_tokens": 800}, "completion_tokens_details": {"reasoning_tokens": 200}}}),
            output_bound: 300,
            prices: gpt,
            billed: cost(&[(200, 2_500_000), (800, 1_250_000), (300, 10_000_000)]),
        },
        // Chat with an image by URL: reserved at the model's image_tokens, billed as input.
        Case {
            path: "/v1/chat/completions",
            body: json!({"model": "gpt-4o", "max_tokens": 10, "messages": [{"role": "user", "content": [
                    {"type": "text", "text": long}, {"type": "image_url", "image_url": {"url": image}}]}],
                "test_usage": {"prompt_tokens": 1200, "completion_tokens": 10}}),
            output_bound: 10,
            prices: gpt,
            billed: cost(&[(1_200, 2_500_000), (10, 10_000_000)]),
        },
        // Responses: 1,000 input tokens, 600 cached; 200 output, 150 of them reasoning.
        Case {
            path: "/v1/responses",
            body: json!({"model": "gpt-4o", "max_output_tokens": 200, "input": long, "store": false,
                "test_usage": {"input_tokens": 1000, "output_tokens": 200, "total_tokens": 1200,
                    "input_tokens_details": {"cached_tokens": 600}, "output_tokens_details": {"reasoning_tokens": 150}}}),
            output_bound: 200,
            prices: gpt,
            billed: cost(&[(400, 2_500_000), (600, 1_250_000), (200, 10_000_000)]),
        },
        // Anthropic: 100 input, 2,000 written for 5 minutes and 1,000 for an hour,
        // 6,000 read, 500 output (thinking within it).
        Case {
            path: "/v1/messages",
            body: json!({"model": "claude", "max_tokens": 500, "messages": [{"role": "user", "content": long}],
                "test_usage": {"input_tokens": 100, "cache_creation_input_tokens": 3000,
                    "cache_creation": {"ephemeral_5m_input_tokens": 2000, "ephemeral_1h_input_tokens": 1000},
                    "cache_read_input_tokens": 6000, "output_tokens": 500}}),
            output_bound: 500,
            prices: claude,
            billed: cost(&[
                (100, 3_000_000),
                (2_000, 3_750_000),
                (1_000, 6_000_000),
                (6_000, 300_000),
                (500, 15_000_000),
            ]),
        },
    ]
}

/// The call of `case` held at the provider: what its budget and token keys
/// hold above `before` while it is in flight, then after it completed.
async fn held_then_settled(
    setup: (&Arc<Billing>, &Arc<dyn Backend>, std::net::SocketAddr),
    case: &Case,
    keys: &[&str],
) -> (u64, Vec<u64>, Vec<u64>, Option<String>) {
    let (billing, backend, gateway) = setup;
    let mut before = Vec::new();
    for key in keys.iter().chain([&DAILY_TOKENS]) {
        before.push(in_use(backend, key).await);
    }
    let mut body = case.body.clone();
    body["test_hold"] = json!(true);
    let path = case.path;
    let task = tokio::spawn(async move { call(&client(), gateway, path, &body).await });
    billing.until_held(1).await;
    let tokens = in_use(backend, DAILY_TOKENS).await - before[keys.len()];
    let mut held = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        held.push(in_use(backend, key).await - before[i]);
    }
    billing.release(1);
    let (status, headers, text) = task.await.unwrap();
    assert_eq!(status, 200, "{text}");
    let mut settled = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        eventually_in_use(backend, key, before[i] + case.billed).await;
        settled.push(in_use(backend, key).await - before[i]);
    }
    let remaining = headers
        .get("x-ratelimit-remaining-usd")
        .map(|v| v.to_str().unwrap().to_owned());
    (tokens, held, settled, remaining)
}

#[tokio::test]
async fn each_format_reserves_its_worst_case_and_is_charged_what_it_bills() {
    let (provider, billing) = start_billing().await;
    let backend = memory_backend();
    let extra = "budgets: [{usd: 1000, window_seconds: 3600}]\n";
    let config = budget_config(provider, "[{usd: 100, period: month}]", 0, extra);
    let gateway = start_gateway(&config, backend.clone()).await;
    let keys = [MONTH, "gateway:usd:window3600"];
    for case in cases() {
        let (tokens, held, settled, remaining) = held_then_settled((&billing, &backend, gateway), &case, &keys).await;
        // The tenant's token limit holds the prompt charge plus the output bound.
        let prompt = tokens - case.output_bound;
        let worst = cost(&[(prompt, case.prices.0), (case.output_bound, case.prices.1)]);
        assert!(worst > case.billed, "{}: the worst case bounds the bill", case.path);
        assert_eq!(held, [worst, worst], "{}: reserved at the worst case", case.path);
        assert_eq!(
            settled,
            [case.billed, case.billed],
            "{}: charged the billed cost",
            case.path
        );
        assert!(
            remaining.is_some(),
            "{}: the remaining budget is in the answer",
            case.path
        );
    }
    // The header gives what the binding budget (the $100 month) had left after the last reservation.
    let last = &cases()[0];
    let spent = in_use(&backend, MONTH).await;
    let (_, held, _, remaining) = held_then_settled((&billing, &backend, gateway), last, &keys).await;
    let left = 100_000_000 - spent - held[0];
    assert_eq!(
        remaining.unwrap(),
        format!("{}.{:06}", left / 1_000_000, left % 1_000_000)
    );
}

/// The tenant's daily budget key in [`priced_pool`].
const POOL_DAY: &str = "tenant:fin:usd:day";

/// A gateway on a memory backend with `gpt-4o` at $10 a million tokens served by
/// a pool of `deployments` on `upstreams` (YAML flow lists; `{provider}` stands
/// for the billing provider's address), and the tenant `fin` with $5 a day on
/// [`POOL_DAY`]: the pool tests differ only in their deployments.
async fn priced_pool(upstreams: &str, deployments: &str) -> (std::net::SocketAddr, Arc<dyn Backend>) {
    let (provider, _billing) = start_billing().await;
    let backend = memory_backend();
    std::env::set_var("GATEWAY_TEST_FIN_KEY", BUDGET_TENANT_KEY);
    let upstreams = upstreams.replace("{provider}", &provider.to_string());
    let yaml = format!(
        r#"listen_addr: "127.0.0.1:0"
upstreams: {upstreams}
models:
  - {{name: gpt-4o, routing: ordered, price: {{input: 10, output: 10}}, deployments: {deployments}}}
tenants:
  - {{name: fin, api_key_env: GATEWAY_TEST_FIN_KEY, budgets: [{{usd: 5, period: day}}]}}
"#
    );
    let config: gateway::GatewayConfig = serde_yaml::from_str(&yaml).unwrap();
    (start_gateway(&config, backend.clone()).await, backend)
}

#[tokio::test]
async fn a_pool_reserves_at_the_price_of_the_deployment_it_chose() {
    let (gateway, backend) = priced_pool(
        r#"[{name: ptu, kind: openai, base_url: "http://{provider}"}, {name: paygo, kind: openai, base_url: "http://{provider}"}]"#,
        "[{upstream: ptu, rpm: 1, price: {input: 0, output: 0}}, {upstream: paygo, priority: 1}]",
    )
    .await;
    let client = client();
    // The PTU is free: its call reserves nothing on the budget and is charged nothing.
    let (status, headers, text) = call(&client, gateway, "/v1/chat/completions", &chat(100, 100)).await;
    assert_eq!(
        (status.as_u16(), headers["x-ratelimit-deployment"].to_str().unwrap()),
        (200, "ptu"),
        "{text}"
    );
    assert_eq!(in_use(&backend, POOL_DAY).await, 0);
    // Its minute's one request taken, the call spills over to pay-as-you-go at $10 a million.
    let (status, headers, text) = call(&client, gateway, "/v1/chat/completions", &chat(100, 100)).await;
    assert_eq!(
        (status.as_u16(), headers["x-ratelimit-deployment"].to_str().unwrap()),
        (200, "paygo"),
        "{text}"
    );
    eventually_in_use(&backend, POOL_DAY, cost(&[(110, 10_000_000)])).await;
}

#[tokio::test]
async fn a_call_that_fails_over_is_charged_once_by_the_deployment_that_served_it() {
    let (gateway, backend) = priced_pool(
        r#"[{name: gone, kind: openai, base_url: "http://127.0.0.1:9"}, {name: live, kind: openai, base_url: "http://{provider}"}]"#,
        "[{upstream: gone}, {upstream: live, priority: 1}]",
    )
    .await;
    let (status, headers, text) = call(&client(), gateway, "/v1/chat/completions", &chat(100, 100)).await;
    assert_eq!(
        (status.as_u16(), headers["x-ratelimit-deployment"].to_str().unwrap()),
        (200, "live"),
        "{text}"
    );
    // The unreachable deployment's try gave its worst case back: only the served call's bill stays.
    eventually_in_use(&backend, POOL_DAY, cost(&[(110, 10_000_000)])).await;
}

/// A gateway on `clock` (the backend's holds and the periods count on it) with
/// the tenant's budget of $0.001 per `period` and a model at $1 per million
/// tokens: one micro-dollar a token.
async fn gateway_on_clock(period: Period, clock: Arc<FakeClock>) -> (std::net::SocketAddr, Arc<dyn Backend>) {
    let (provider, _billing) = start_billing().await;
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new(clock.clone(), MemoryConfig::default()));
    let budgets = format!("[{{usd: 0.001, period: {period}}}]");
    let mut config = budget_config(provider, &budgets, 0, "");
    config.models[0].price = Some(serde_json::from_value(json!({"input": 1, "output": 1})).unwrap());
    let client = UpstreamClient::new(Duration::from_secs(10));
    let gateway = gateway::Gateway::with_clock(&config, backend.clone(), client, clock).unwrap();
    (serve_gateway(gateway, backend.clone()).await.0, backend)
}

fn chat(max_tokens: u64, completion_tokens: u64) -> Value {
    json!({"model": "gpt-4o", "max_tokens": max_tokens, "messages": [{"role": "user", "content": "Hi."}],
        "test_usage": {"prompt_tokens": 10, "completion_tokens": completion_tokens}})
}

#[tokio::test]
async fn a_spent_period_refuses_for_good_until_its_boundary() {
    // Saturday 2026-11-28 12:00 UTC; each period's last second before its end.
    let noon = 1_795_867_200_000;
    for period in [Period::Day, Period::Week, Period::Month] {
        let end = period.end_unix_ms(noon);
        let clock = Arc::new(FakeClock::new(end - 1_000));
        let (gateway, backend) = gateway_on_clock(period, clock.clone()).await;
        let client = client();
        let key = format!("tenant:fin:usd:{period}");
        // 900 of the 1,000 micro-dollars spent and settled for the period.
        let (status, _, text) = call(&client, gateway, "/v1/chat/completions", &chat(900, 890)).await;
        assert_eq!(status, 200, "{period}: {text}");
        eventually_in_use(&backend, &key, 900).await;
        // A worst case above the 100 left can never fit before the boundary.
        let (status, headers, text) = call(&client, gateway, "/v1/chat/completions", &chat(200, 5)).await;
        assert_eq!(status, 429, "{period}: {text}");
        assert_eq!(headers["x-should-retry"], "false", "{period}");
        assert!(
            text.contains(&key) && text.contains("before its period ends"),
            "{period}: {text}"
        );
        assert_eq!(headers["x-ratelimit-remaining-usd"], "0.000100", "{period}");
        // At the boundary the period's spend is released: the same call goes.
        clock.advance_ms(1_000);
        let (status, _, text) = call(&client, gateway, "/v1/chat/completions", &chat(200, 5)).await;
        assert_eq!(status, 200, "{period}: {text}");
        eventually_in_use(&backend, &key, 15).await;
    }
}

#[tokio::test]
async fn a_worst_case_above_the_whole_budget_can_never_be_admitted_and_says_so() {
    let clock = Arc::new(FakeClock::new(1_795_867_200_000));
    let (gateway, _backend) = gateway_on_clock(Period::Day, clock).await;
    let client = client();
    // 10 + 2,000 micro-dollars at most, on a budget of 1,000: never, in no period.
    let (status, headers, text) = call(&client, gateway, "/v1/chat/completions", &chat(2_000, 5)).await;
    assert_eq!(status, 400, "{text}");
    assert_eq!(headers["x-should-retry"], "false");
    assert_eq!(headers["x-ratelimit-limit-usd"], "0.001000");
    let error = &serde_json::from_str::<Value>(&text).unwrap()["error"];
    assert_eq!(error["type"], "invalid_request_error", "{text}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("tenant:fin:usd:day") && message.contains("whole budget"),
        "{message}"
    );
    assert!(
        message.contains("max_completion_tokens or max_tokens") && !message.contains("spent"),
        "{message}"
    );
    // The same call within the budget goes.
    let (status, _, text) = call(&client, gateway, "/v1/chat/completions", &chat(900, 5)).await;
    assert_eq!(status, 200, "{text}");
}

#[tokio::test]
async fn a_budget_full_only_of_calls_in_flight_waits_for_them() {
    let (provider, billing) = start_billing().await;
    let backend = memory_backend();
    let mut config = budget_config(provider, "[{usd: 0.001, period: month}]", 10_000, "");
    config.models[0].price = Some(serde_json::from_value(json!({"input": 1, "output": 1})).unwrap());
    let gateway = start_gateway(&config, backend.clone()).await;
    let mut first = chat(900, 20);
    first["test_hold"] = json!(true);
    let held = tokio::spawn(async move { call(&client(), gateway, "/v1/chat/completions", &first).await });
    billing.until_held(1).await;
    // The first call's worst case holds most of the budget, but none of it is settled: the second waits.
    let waiting = tokio::spawn(async move {
        let started = Instant::now();
        let answer = call(&client(), gateway, "/v1/chat/completions", &chat(200, 5)).await;
        (answer, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the second call waits for the first");
    billing.release(1);
    assert_eq!(held.await.unwrap().0, 200);
    let ((status, _, text), waited) = waiting.await.unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    eventually_in_use(&backend, MONTH, 30 + 15).await;
}

#[tokio::test]
async fn a_zero_budget_refuses_every_call_saying_so() {
    let (provider, billing) = start_billing().await;
    let config = budget_config(provider, "[{usd: 0, period: day}]", 0, "");
    let gateway = start_gateway(&config, memory_backend()).await;
    let (status, headers, text) = call(&client(), gateway, "/v1/chat/completions", &chat(10, 1)).await;
    assert_eq!(status, 429, "{text}");
    assert_eq!(headers["x-should-retry"], "false");
    assert!(text.contains("tenant:fin:usd:day is $0"), "{text}");
    assert_eq!(
        billing.calls.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "nothing sent"
    );
}
