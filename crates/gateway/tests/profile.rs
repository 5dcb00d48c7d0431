//! A model with `profile: openai` in front of the provider simulator enforcing
//! OpenAI's quantized limits (`ProviderServer::set_profile`, in process): a burst
//! the same model without a profile pushes into one quantized second, and meets
//! the provider's 429s, is spread by the profile's one-second sub-window and meets none.
//! A model with `profile: anthropic` reserves on the profile's `bucket` limits.
//!
//! The bursts run on a fake clock shared by the gateway's backend and the
//! simulator, which moves only when the test moves it: a loaded machine may take
//! any time to deliver a burst, and it still falls in one quantized second.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimiter::profile::SUB_WINDOW_MARGIN_PER_MILLE;
use ratelimiter::FakeClock;
use replay::provider_server::ProviderServer;
use replay::sim_profile::ProfileName;

use serde_json::json;
use support::*;
use tokio::task::JoinHandle;

/// The published requests per minute ([`SIM_RPM`]): OpenAI enforces them as 10 a second.
const RPM: u64 = SIM_RPM;
/// OpenAI's quantum, the simulator's default for its `openai` profile.
const QUANTUM_MS: u64 = 1_000;
/// What one quantized second admits.
const QUOTA: u64 = RPM * QUANTUM_MS / 60_000;
/// The burst: two quantized seconds' worth.
const BURST: u64 = 2 * QUOTA;
/// Where the fake clock starts: on a whole second, so that the first quantized
/// second holds a whole [`QUOTA`].
const START_UNIX_MS: u64 = 1_800_000_000_000;
/// How long the test waits, in real time, for the gateway to pass a second's
/// share on: ample for a loaded machine, and only reached when the gateway holds
/// back calls it should let through.
const PASS_ON_WAIT_MS_MAX: u64 = 20_000;

async fn start_openai_sim() -> (SocketAddr, Arc<ProviderServer>) {
    start_sim(ProfileName::Openai).await
}

fn config(sim: SocketAddr, profile: &str) -> gateway::GatewayConfig {
    let yaml = format!(
        "listen_addr: \"127.0.0.1:0\"\nallow_anonymous: true\nupstreams:\n  - {{name: sim, kind: openai, base_url: \"http://{sim}\"}}\nmodels:\n  - {{name: gpt-4o-mini, upstream: sim, rpm: {RPM}, tpm: 10000000, max_output_tokens_default: 16, max_wait_ms: 30000{profile}}}\n"
    );
    serde_yaml::from_str(&yaml).unwrap()
}

/// The simulator and a gateway with `profile` in front of it, both on a fake
/// clock that stands still until the test moves it.
async fn start_on_fake_clock(profile: &str) -> (SocketAddr, Arc<ProviderServer>, FakeClock) {
    let clock = FakeClock::new(START_UNIX_MS);
    let (sim, provider) = start_sim_on(ProfileName::Openai, Arc::new(clock.clone())).await;
    let backend = memory_backend_on(Arc::new(clock.clone()));
    let gateway = start_gateway(&config(sim, profile), backend).await;
    (gateway, provider, clock)
}

/// Sends the burst at once; each call answers its client's status.
fn send_burst(gateway: SocketAddr) -> Vec<JoinHandle<u16>> {
    let client = client();
    (0..BURST)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let request = json!({"model": "gpt-4o-mini", "max_tokens": 16, "sim_output_tokens": 4,
                    "messages": [{"role": "user", "content": format!("call {i}")}]});
                post(&client, gateway, "/v1/chat/completions", request).await.0.as_u16()
            })
        })
        .collect()
}

async fn statuses(calls: Vec<JoinHandle<u16>>) -> Vec<u16> {
    let mut statuses = Vec::new();
    for call in calls {
        statuses.push(call.await.unwrap());
    }
    statuses
}

/// Waits (bounded in real time) until the provider has answered `calls` calls.
async fn until_provider_answered(provider: &ProviderServer, calls: u64) {
    let deadline = Instant::now() + Duration::from_millis(PASS_ON_WAIT_MS_MAX);
    loop {
        let counts = provider.counts();
        if counts.admitted + counts.throttled >= calls {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the provider answered {counts:?}, {calls} expected"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_profiled_model_meets_no_quantized_429_where_an_unprofiled_one_does() {
    // Without a profile, 600 RPM lets the whole burst through in one second: the
    // provider admits its quota of it and refuses the rest.
    let (gateway, provider, _clock) = start_on_fake_clock("").await;
    let unprofiled = statuses(send_burst(gateway)).await;
    let counts = provider.counts();
    assert_eq!(
        (counts.admitted, counts.throttled),
        (QUOTA, BURST - QUOTA),
        "{unprofiled:?}"
    );
    // With the profile, a quota a second: the gateway holds the rest of the burst
    // until the clock leaves the sub-window (and its margin) of the first share.
    let (gateway, provider, clock) = start_on_fake_clock(", profile: openai").await;
    let calls = send_burst(gateway);
    let margin_ms = QUANTUM_MS * SUB_WINDOW_MARGIN_PER_MILLE / 1_000;
    for second in 1..BURST / QUOTA {
        until_provider_answered(&provider, second * QUOTA).await;
        clock.advance_ms(QUANTUM_MS + margin_ms + 1);
    }
    let profiled = statuses(calls).await;
    assert_eq!(provider.counts().throttled, 0, "provider 429s: {profiled:?}");
    assert!(profiled.iter().all(|&s| s == 200), "{profiled:?}");
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
