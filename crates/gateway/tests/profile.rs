//! A model with `profile: openai` in front of the provider simulator enforcing
//! OpenAI's quantized limits (`ProviderServer::set_profile`, in process): a burst
//! the same model without a profile pushes into one quantized second, and meets
//! the provider's 429s, is spread by the profile's one-second sub-window and meets none.
//! A model with `profile: anthropic` reserves on the profile's `bucket` limits.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;

use replay::provider_server::ProviderServer;
use replay::sim_profile::ProfileName;

use serde_json::json;
use support::*;

/// The published requests per minute ([`SIM_RPM`]): OpenAI enforces them as 10 a second.
const RPM: u64 = SIM_RPM;
/// The burst: two quantized seconds' worth.
const BURST: usize = 20;

async fn start_openai_sim() -> (SocketAddr, Arc<ProviderServer>) {
    start_sim(ProfileName::Openai).await
}

fn config(sim: SocketAddr, profile: &str) -> gateway::GatewayConfig {
    let yaml = format!(
        "listen_addr: \"127.0.0.1:0\"\nallow_anonymous: true\nupstreams:\n  - {{name: sim, kind: openai, base_url: \"http://{sim}\"}}\nmodels:\n  - {{name: gpt-4o-mini, upstream: sim, rpm: {RPM}, tpm: 10000000, max_output_tokens_default: 16, max_wait_ms: 30000{profile}}}\n"
    );
    serde_yaml::from_str(&yaml).unwrap()
}

/// Sends the burst at once; returns the statuses the clients got and the
/// provider's 429s.
async fn burst(profile: &str) -> (Vec<u16>, u64) {
    let (sim, provider) = start_openai_sim().await;
    let gateway = start_gateway(&config(sim, profile), memory_backend()).await;
    let client = client();
    let calls: Vec<_> = (0..BURST)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let request = json!({"model": "gpt-4o-mini", "max_tokens": 16, "sim_output_tokens": 4,
                    "messages": [{"role": "user", "content": format!("call {i}")}]});
                post(&client, gateway, "/v1/chat/completions", request).await.0
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for call in calls {
        statuses.push(call.await.unwrap().as_u16());
    }
    (statuses, provider.counts().throttled)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_profiled_model_meets_no_quantized_429_where_an_unprofiled_one_does() {
    // Without a profile, 600 RPM admits the whole burst in the first second.
    let (_, throttled) = burst("").await;
    assert!(throttled >= 1, "the unprofiled burst should meet OpenAI's quantization");
    // With the profile, 10 a second: every call admitted, none refused upstream.
    let (statuses, throttled) = burst(", profile: openai").await;
    assert_eq!(throttled, 0, "provider 429s: {statuses:?}");
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
}

/// A prompt the tokenizer packs tightly (one repeated letter): few tokens, many
/// characters, so OpenAI's four-characters estimate is above the exact count.
const PACKED_PROMPT_CHARACTERS: usize = 4_000;

#[tokio::test]
async fn an_openai_profiled_model_reserves_at_least_the_character_estimate() {
    let (sim, _provider) = start_openai_sim().await;
    // A minute-long quantum: the token window is a minute, so the kept reservation
    // is still held when the test reads it, however slow the machine.
    let config = config(sim, ", profile: openai, quantum_seconds: 60");
    let backend = memory_backend();
    let gateway = start_gateway(&config, backend.clone()).await;
    let prompt = "a".repeat(PACKED_PROMPT_CHARACTERS);
    let max_tokens = 16;
    let request = json!({"model": "gpt-4o-mini", "max_tokens": max_tokens, "sim_output_tokens": 4,
        "messages": [{"role": "user", "content": prompt}]});
    let (status, _, body) = post(&client(), gateway, "/v1/chat/completions", request).await;
    assert_eq!(status, 200, "{body}");
    let estimate = (PACKED_PROMPT_CHARACTERS as u64).div_ceil(4);
    // OpenAI keeps its admission figure: the reservation stays whole after the call.
    let held = in_use(&backend, "global:llm:sim:gpt-4o-mini:tpm").await;
    assert!(
        held >= estimate + max_tokens,
        "reserved {held}, below OpenAI's character estimate {estimate} + max_tokens {max_tokens}"
    );
}

/// Anthropic's profile makes the gateway reserve on buckets (docs/bucket-limits.md),
/// on the memory backend ([`anthropic_buckets_give_unused_output_back`]; the same
/// check on TigerBeetle is in `tigerbeetle.rs`).
#[tokio::test]
async fn an_anthropic_profiled_model_reserves_on_buckets_and_gives_unused_output_back() {
    anthropic_buckets_give_unused_output_back(memory_backend()).await;
}
