//! Every input counted at least as the provider counts it, and not much more,
//! against the provider simulator that counts images and the prompt cache as
//! the providers document (`replay::sim_vision`, `replay::sim_cache`): images
//! by the model's rule from the image's own header, Claude prompts by the
//! calibrated byte bound, and budgets charged what is billed.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;

use base64::Engine;
use gateway::metrics::GatewayMetrics;
use ratelimiter::SystemClock;
use replay::provider::{Accounting, ProviderLimits};
use replay::provider_server::ProviderServer;
use replay::sim_control::SimControl;
use serde_json::{json, Value};
use support::*;

const MODELS: [&str; 4] = ["gpt-4o-mini", "gpt-4o", "gpt-4.1-mini", "claude-sonnet-4-5"];

async fn start_sim() -> SocketAddr {
    let limits = ProviderLimits {
        rpm: 100_000,
        tpm: 100_000_000,
        window_ms: 60_000,
        concurrency: 1_000,
        ms_per_output_token: 0,
        accounting: Accounting::Actual,
    };
    let control = SimControl::new(MODELS.iter().map(|m| (*m).to_owned()).collect(), None);
    let provider = ProviderServer::with_control(limits, Arc::new(SystemClock::new()), control);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(Arc::clone(&provider).serve(listener, std::future::pending()));
    addr
}

/// Every model of [`MODELS`] at `tpm` (input_tpm for Claude), one tenant.
fn config(sim: SocketAddr, tpm: u64) -> gateway::GatewayConfig {
    std::env::set_var("GATEWAY_COUNTING_ACME_KEY", TENANT_KEY);
    let yaml = format!(
        "listen_addr: \"127.0.0.1:0\"\nupstreams:\n  - {{name: sim, kind: openai, base_url: \"http://{sim}\"}}\n  - {{name: simclaude, kind: anthropic, base_url: \"http://{sim}\"}}\nmodels:\n  - {{name: gpt-4o-mini, upstream: sim, tpm: {tpm}}}\n  - {{name: gpt-4o, upstream: sim, tpm: {tpm}}}\n  - {{name: gpt-4.1-mini, upstream: sim, tpm: {tpm}}}\n  - {{name: claude-sonnet-4-5, upstream: simclaude, input_tpm: {tpm}, output_tpm: 1000000}}\ntenants:\n  - {{name: acme, api_key_env: GATEWAY_COUNTING_ACME_KEY, daily_tokens: 100000000}}\n"
    );
    serde_yaml::from_str(&yaml).unwrap()
}

/// A PNG's first bytes, as far as its size: all the gateway and the simulator read.
fn png_base64(width: u32, height: u32) -> String {
    let mut bytes = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
    bytes.extend(width.to_be_bytes());
    bytes.extend(height.to_be_bytes());
    bytes.extend([8, 6, 0, 0, 0, 0, 0, 0, 0]);
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn reserved_total(metrics: &GatewayMetrics, model: &str) -> u64 {
    let mut text = String::new();
    metrics.render(&mut text);
    let prefix = format!("ratelimiterd_gateway_tokens_reserved_total{{model=\"{model}\",tenant=\"acme\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0, |n| n.trim().parse().unwrap())
}

async fn anthropic(client: &HttpClient, gateway: SocketAddr, body: &Value) -> Value {
    let headers = [("x-api-key", TENANT_KEY), ("anthropic-version", "2023-06-01")];
    let response = post_raw(client, gateway, "/v1/messages", body.to_string(), &headers).await;
    let status = response.status();
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    let answer: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(status, 200, "{answer}");
    answer
}

#[tokio::test]
async fn an_image_is_reserved_by_its_models_rule_never_below_the_providers_count() {
    let sim = start_sim().await;
    let backend = memory_backend();
    let (gateway, metrics) = start_gateway_with_metrics(&config(sim, 10_000_000), backend.clone()).await;
    let client = client();
    let url = format!("data:image/png;base64,{}", png_base64(1024, 1024));
    // (model, the image's tokens by OpenAI's table)
    for (model, image) in [("gpt-4o", 765), ("gpt-4o-mini", 25_501), ("gpt-4.1-mini", 1_659)] {
        let body = json!({"model": model, "max_tokens": 10, "sim_output_tokens": 10, "messages": [{"role": "user",
            "content": [{"type": "text", "text": "What is in it?"}, {"type": "image_url", "image_url": {"url": url}}]}]});
        let before = reserved_total(&metrics, model);
        let (status, _, answer) = post(&client, gateway, "/v1/chat/completions", body).await;
        assert_eq!(status, 200, "{answer}");
        let provider = serde_json::from_str::<Value>(&answer).unwrap()["usage"]["prompt_tokens"]
            .as_u64()
            .unwrap();
        let reserved = reserved_total(&metrics, model) - before - 10;
        assert!(provider >= image, "{model}: the simulator bills the image: {provider}");
        assert!(
            reserved >= provider,
            "{model}: reserved {reserved} < provider's {provider}"
        );
        assert!(
            reserved <= provider + 20,
            "{model}: reserved {reserved}, provider {provider}"
        );
    }
    // A model whose limit is below the image's cost cannot take it: the image
    // is what it costs, not the 1,600 of an unknown size.
    let small = start_gateway(&config(sim, 20_000), memory_backend()).await;
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 10, "messages": [{"role": "user",
        "content": [{"type": "image_url", "image_url": {"url": url}}]}]});
    let (status, _, answer) = post(&client, small, "/v1/chat/completions", body).await;
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("can never be admitted"), "{answer}");
}

#[tokio::test]
async fn an_anthropic_budget_counts_cache_reads_and_the_input_limit_does_not() {
    let sim = start_sim().await;
    let backend = memory_backend();
    let gateway = start_gateway(&config(sim, 10_000_000), backend.clone()).await;
    let client = client();
    // A system prompt of 2,000 simulator tokens, marked for the cache.
    let system = replay::prompt::synthesize(2_000);
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 8, "sim_output_tokens": 5,
        "system": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "the cat sat on the mat"}]});
    let (mut billed, mut limited) = (0, 0);
    for call in 0..2 {
        let usage = anthropic(&client, gateway, &body).await["usage"].clone();
        let field = |name: &str| usage[name].as_u64().unwrap();
        let (reads, writes) = (field("cache_read_input_tokens"), field("cache_creation_input_tokens"));
        assert_eq!(
            (reads, writes),
            if call == 0 { (0, 2_000) } else { (2_000, 0) },
            "{usage}"
        );
        billed += field("input_tokens") + writes + reads + field("output_tokens");
        limited += field("input_tokens") + writes;
    }
    eventually_in_use(&backend, "tenant:acme:llm:daily_tokens", billed).await;
    eventually_in_use(&backend, "global:llm:simclaude:claude-sonnet-4-5:input_tpm", limited).await;
    assert_eq!(billed - limited, 2_000 + 10, "the reads and the output");
}

#[tokio::test]
async fn the_claude_estimate_calibrates_to_the_providers_count_and_stays_above_it() {
    let sim = start_sim().await;
    let (gateway, metrics) = start_gateway_with_metrics(&config(sim, 10_000_000), memory_backend()).await;
    let client = client();
    let mut ratios = Vec::new();
    for call in 0..48u64 {
        let text = replay::prompt::synthesize(200 + call * 37);
        let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 4, "sim_output_tokens": 1,
            "messages": [{"role": "user", "content": text}]});
        let before = reserved_total(&metrics, "claude-sonnet-4-5");
        let usage = anthropic(&client, gateway, &body).await["usage"].clone();
        let provider = usage["input_tokens"].as_u64().unwrap();
        let reserved = reserved_total(&metrics, "claude-sonnet-4-5") - before - 4;
        assert!(
            reserved >= provider,
            "call {call}: reserved {reserved} < provider's {provider}"
        );
        ratios.push(reserved as f64 / provider as f64);
    }
    // The byte bound first (four bytes a token here), then the calibrated count.
    assert!(ratios[0] > 3.9, "{ratios:?}");
    let last = *ratios.last().unwrap();
    assert!(last <= 1.3, "after warm-up: {ratios:?}");
}
