//! The gateway in front of the simulator's Vertex AI (in process): a service
//! account's tokens of a few seconds renewed while calls flow and none sent
//! expired; Claude through `rawPredict` and `streamRawPredict`, Gemini through
//! the OpenAI-compatible endpoint, each reconciled to the usage answered; a
//! `RESOURCE_EXHAUSTED` 429 moving the call to the pool's other region; a bad
//! key file refused at start.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use replay::provider_server::ProviderServer;
use replay::sim_control::SimControl;
use serde_json::{json, Value};
use support::provider_sim::{arm_fault, start_roomy_sim, trust_vertex_test_key, vertex_key_file, VERTEX_TEST_KEY};
use support::*;

const CLAUDE: &str = "claude-sonnet-4-5@20250929";
const GEMINI: &str = "google/gemini-2.5-flash";
/// The tokens' lifetime: a few seconds, so that the test sees several renewals,
/// and enough that a token's last twentieth (250 ms, which the gateway keeps
/// unused) covers a call's way to the simulator on a loaded machine.
const TOKEN_LIFETIME_S: u64 = 5;
/// How long calls flow in the renewal test: three lifetimes.
const FLOW_MS: u64 = 3 * TOKEN_LIFETIME_S * 1_000;

/// The simulator, trusting the test key, its tokens lasting `lifetime_s`.
async fn start_vertex_sim(lifetime_s: u64) -> (SocketAddr, Arc<ProviderServer>) {
    let control = SimControl::new(vec![CLAUDE.to_owned(), GEMINI.to_owned()], None);
    start_roomy_sim(control, |provider| trust_vertex_test_key(provider, lifetime_s)).await
}

/// Two Vertex upstreams (two regions of one project) on the simulator, the
/// Claude model over both, Gemini on the first.
fn vertex_config(sim: SocketAddr, key_file: &std::path::Path) -> gateway::GatewayConfig {
    std::env::set_var("GATEWAY_VERTEX_ACME_KEY", TENANT_KEY);
    let upstream = |name: &str, region: &str| {
        format!(
            "  - {{name: {name}, kind: vertex, project: acme-ml, region: {region}, base_url: \"http://{sim}\", credentials_file: \"{}\"}}\n",
            key_file.display()
        )
    };
    let claude = |upstream: &str| {
        format!("{{upstream: {upstream}, model: \"{CLAUDE}\", rpm: 10000, input_tpm: 10000000, output_tpm: 1000000, concurrency: 64}}")
    };
    let yaml = format!(
        "listen_addr: \"127.0.0.1:0\"\nupstreams:\n{}{}models:\n  - {{name: claude-sonnet-4-5, max_output_tokens_default: 64, deployments: [{}, {}]}}\n  - {{name: gemini-2.5-flash, max_output_tokens_default: 64, deployments: [{{upstream: vertex-east, model: \"{GEMINI}\", rpm: 10000, tpm: 10000000, concurrency: 64}}]}}\ntenants:\n  - {{name: acme, api_key_env: GATEWAY_VERTEX_ACME_KEY, daily_tokens: 100000000}}\n",
        upstream("vertex-east", "us-east5"),
        upstream("vertex-eu", "europe-west1"),
        claude("vertex-east"),
        claude("vertex-eu"),
    );
    serde_yaml::from_str(&yaml).unwrap()
}

/// A Claude call through `/v1/messages` with the anthropic SDK's key header.
async fn claude(client: &HttpClient, gateway: SocketAddr, stream: bool) -> (u16, hyper::HeaderMap, String) {
    use http_body_util::BodyExt;
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 20, "stream": stream, "sim_output_tokens": 4,
        "messages": [{"role": "user", "content": "Hello, Claude"}]});
    let headers = [("x-api-key", TENANT_KEY), ("anthropic-version", "2023-06-01")];
    let response = post_raw(client, gateway, "/v1/messages", body.to_string(), &headers).await;
    let (parts, body) = response.into_parts();
    let body = String::from_utf8(body.collect().await.unwrap().to_bytes().to_vec()).unwrap();
    (parts.status.as_u16(), parts.headers, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_of_a_few_seconds_are_renewed_while_calls_flow_and_none_is_sent_expired() {
    let (sim, provider) = start_vertex_sim(TOKEN_LIFETIME_S).await;
    let key = vertex_key_file("renewal", sim, VERTEX_TEST_KEY);
    let backend = memory_backend();
    let gateway = start_gateway(&vertex_config(sim, &key), backend.clone()).await;
    let started = Instant::now();
    let workers: Vec<_> = (0..4)
        .map(|worker| {
            tokio::spawn(async move {
                let client = client();
                let (mut calls, mut gemini_tokens) = (0, 0);
                while started.elapsed() < Duration::from_millis(FLOW_MS) {
                    let stream = (calls + worker) % 2 == 0;
                    let (status, _, body) = claude(&client, gateway, stream).await;
                    assert_eq!(status, 200, "{body}");
                    if stream {
                        assert!(
                            body.starts_with("event: message_start") && body.contains("event: message_stop"),
                            "{body}"
                        );
                    } else {
                        assert_eq!(
                            serde_json::from_str::<Value>(&body).unwrap()["usage"]["output_tokens"],
                            4
                        );
                    }
                    let chat = json!({"model": "gemini-2.5-flash", "max_tokens": 10, "sim_output_tokens": 3,
                        "messages": [{"role": "user", "content": "Hi"}]});
                    let (status, _, body) = post(&client, gateway, "/v1/chat/completions", chat).await;
                    assert_eq!(status, 200, "{body}");
                    gemini_tokens += serde_json::from_str::<Value>(&body).unwrap()["usage"]["total_tokens"]
                        .as_u64()
                        .unwrap();
                    calls += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                (calls, gemini_tokens)
            })
        })
        .collect();
    let (mut calls, mut gemini_tokens) = (0, 0);
    for worker in workers {
        let (worker_calls, worker_tokens) = worker.await.unwrap();
        (calls, gemini_tokens) = (calls + worker_calls, gemini_tokens + worker_tokens);
    }
    let auth = provider.vertex_auth();
    assert!(calls >= 20, "calls flowed: {calls}");
    assert_eq!(auth.refused_tokens(), 0, "no call carried an expired or unknown token");
    // One token to start, one renewal per lifetime after (two upstreams, each its own source).
    let renewals_min = 2 * (FLOW_MS / (TOKEN_LIFETIME_S * 1_000));
    assert!(auth.issued() >= renewals_min, "{} tokens issued", auth.issued());
    assert!(
        auth.issued() <= 2 * (FLOW_MS / 1_000 + 1),
        "no exchange per call: {}",
        auth.issued()
    );
    // Gemini's tokens reconciled to the usage each answer reported.
    eventually_in_use(&backend, &format!("global:llm:vertex-east:{GEMINI}:tpm"), gemini_tokens).await;
    std::fs::remove_dir_all(key.parent().unwrap()).unwrap();
}

#[tokio::test]
async fn a_resource_exhausted_region_moves_the_call_to_the_other_one() {
    let (sim, provider) = start_vertex_sim(3_600).await;
    let key = vertex_key_file("exhausted", sim, VERTEX_TEST_KEY);
    let gateway = start_gateway(&vertex_config(sim, &key), memory_backend()).await;
    let client = client();
    let fault = json!({"mode": "status", "status": 429, "count": 1, "model": CLAUDE});
    arm_fault(sim, fault).await;
    let (status, headers, body) = claude(&client, gateway, false).await;
    assert_eq!(status, 200, "{body}");
    let served = headers["x-ratelimit-deployment"].to_str().unwrap().to_owned();
    // The region that answered RESOURCE_EXHAUSTED is paused: the next call goes to the other too.
    let (status, headers, _) = claude(&client, gateway, true).await;
    assert_eq!(
        (status, headers["x-ratelimit-deployment"].to_str().unwrap()),
        (200, served.as_str())
    );
    let served_buckets: Vec<usize> = ["us-east5", "europe-west1"]
        .iter()
        .map(|region| {
            provider
                .bucket(&format!("acme-ml/{region}/{CLAUDE}"))
                .unwrap()
                .admissions()
                .len()
        })
        .collect();
    assert!(
        served_buckets == [0, 2] || served_buckets == [2, 0],
        "{served_buckets:?}"
    );
    std::fs::remove_dir_all(key.parent().unwrap()).unwrap();
}

#[tokio::test]
async fn a_bad_or_missing_key_file_is_a_start_up_error_naming_the_upstream_and_the_field() {
    let sim: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let key = vertex_key_file(
        "bad-key",
        sim,
        "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n",
    );
    let error = gateway::Gateway::new(&vertex_config(sim, &key), memory_backend())
        .err()
        .unwrap();
    assert!(
        error.starts_with("gateway upstream vertex-east: credentials_file "),
        "{error}"
    );
    assert!(
        error.contains("the field private_key is not") && !error.contains("bm90IGEga2V5"),
        "{error}"
    );
    let missing = key.with_file_name("missing.json");
    let error = gateway::Gateway::new(&vertex_config(sim, &missing), memory_backend())
        .err()
        .unwrap();
    assert!(
        error.contains("vertex-east") && error.contains("missing.json"),
        "{error}"
    );
    std::fs::remove_dir_all(key.parent().unwrap()).unwrap();
}
