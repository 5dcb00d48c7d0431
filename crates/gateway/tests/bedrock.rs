//! The gateway in front of the simulator's Bedrock (`replay::sim::bedrock`, in
//! process, every SigV4 signature checked): a wrong secret refused by the
//! simulator and the right one served, streaming and not, each call's limits
//! reconciled to the usage Bedrock reported; a throttle inside the stream (an
//! exception frame) passed on as Anthropic's `error` event; a pool of
//! Anthropic and Bedrock that moves calls off the throttled one.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use replay::provider_server::ProviderServer;
use replay::sim::sigv4::AwsKeys;
use replay::sim_control::SimControl;
use serde_json::{json, Value};
use support::provider_sim::{arm_fault, start_roomy_sim};
use support::*;

/// The Bedrock model served: its id holds `.` and `:`.
const CLAUDE_ID: &str = "us.anthropic.claude-sonnet-4-5-20250929-v1:0";
/// Its limit keys' model part (docs/gateway.md, "Amazon Bedrock").
const CLAUDE_KEY: &str = "us.anthropic.claude-sonnet-4-5-20250929-v1@0";
/// A model of Bedrock's OpenAI-compatible chat.
const OSS_ID: &str = "openai.gpt-oss-120b-1:0";
const ACCESS_KEY_ID: &str = "ASIASIMULATOR0000001";
const SECRET: &str = "simulated/secret+key0000000000000000000";
const SESSION_TOKEN: &str = "simulated-session-token";

/// The process environment is read when a gateway starts: one at a time.
static ENVIRONMENT: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn start_sim() -> SocketAddr {
    start_sim_with(None).await.0
}

/// The simulator, with an STS issuing credentials of `sts_lifetime` when given.
async fn start_sim_with(sts_lifetime: Option<Duration>) -> (SocketAddr, Arc<ProviderServer>) {
    let models = vec![CLAUDE_ID.to_owned(), "claude-sonnet-4-5".to_owned(), OSS_ID.to_owned()];
    let mut control = SimControl::new(models, None).with_aws_keys(AwsKeys {
        access_key_id: ACCESS_KEY_ID.to_owned(),
        secret_access_key: SECRET.to_owned(),
        session_token: Some(SESSION_TOKEN.to_owned()),
    });
    if let Some(lifetime) = sts_lifetime {
        control = control.with_sts(lifetime);
    }
    start_roomy_sim(control, |_| ()).await
}

/// A gateway whose `claude` pool is Bedrock alone, or Anthropic first then
/// Bedrock, both on `sim`, its AWS credentials the secret `secret`.
async fn start(sim: SocketAddr, secret: &str, with_anthropic: bool) -> (SocketAddr, Arc<dyn ratelimiter::Backend>) {
    let _environment = ENVIRONMENT.lock().await;
    start_locked(sim, secret, with_anthropic).await
}

/// [`start`], the environment already held.
async fn start_locked(
    sim: SocketAddr,
    secret: &str,
    with_anthropic: bool,
) -> (SocketAddr, Arc<dyn ratelimiter::Backend>) {
    let limits = "rpm: 10000, input_tpm: 1000000, output_tpm: 1000000";
    start_with_limits(sim, secret, with_anthropic, limits).await
}

/// [`start_locked`] with the Bedrock deployment's own `limits` (YAML flow fields).
async fn start_with_limits(
    sim: SocketAddr,
    secret: &str,
    with_anthropic: bool,
    limits: &str,
) -> (SocketAddr, Arc<dyn ratelimiter::Backend>) {
    std::env::set_var("GATEWAY_BEDROCK_ACME_KEY", TENANT_KEY);
    std::env::set_var("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID);
    std::env::set_var("AWS_SECRET_ACCESS_KEY", secret);
    std::env::set_var("AWS_SESSION_TOKEN", SESSION_TOKEN);
    let anthropic = if with_anthropic {
        "      - {upstream: anthropic, model: claude-sonnet-4-5, rpm: 10000, input_tpm: 1000000, output_tpm: 1000000}\n"
    } else {
        ""
    };
    let yaml = format!(
        "listen_addr: \"127.0.0.1:0\"\nupstream_timeout_ms: 2000\nupstreams:\n  - {{name: anthropic, kind: anthropic, base_url: \"http://{sim}\"}}\n  - {{name: bedrock, kind: bedrock, region: us-east-1, base_url: \"http://{sim}\", forward_headers: [anthropic-beta]}}\nmodels:\n  - name: claude\n    deployments:\n{anthropic}      - {{upstream: bedrock, model: \"{CLAUDE_ID}\", {limits}}}\ntenants:\n  - {{name: acme, api_key_env: GATEWAY_BEDROCK_ACME_KEY, daily_tokens: 100000000}}\n"
    );
    let config: gateway::GatewayConfig = serde_yaml::from_str(&yaml).unwrap();
    config.validate().unwrap();
    let backend = memory_backend();
    (start_gateway(&config, backend.clone()).await, backend)
}

fn messages(stream: bool, output: u64) -> Value {
    json!({"model": "claude", "max_tokens": 64, "stream": stream, "sim_output_tokens": output,
        "messages": [{"role": "user", "content": "Say something brief."}]})
}

async fn call(gateway: SocketAddr, body: &Value) -> (u16, hyper::HeaderMap, String) {
    let headers = [
        ("x-api-key", TENANT_KEY),
        ("anthropic-version", "2023-06-01"),
        ("anthropic-beta", "context-1m-2025-08-07"),
    ];
    let response = post_raw(&client(), gateway, "/v1/messages", body.to_string(), &headers).await;
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (
        parts.status.as_u16(),
        parts.headers,
        String::from_utf8(bytes.to_vec()).unwrap(),
    )
}

fn key(dimension: &str) -> String {
    format!("global:llm:bedrock:{CLAUDE_KEY}:{dimension}")
}

/// The usage of an Anthropic stream's events: `message_start`'s input, the last
/// `message_delta`'s output.
fn stream_usage(body: &str) -> (u64, u64) {
    let data = |name: &str| {
        (body.split("\n\n"))
            .filter(|e| e.starts_with(&format!("event: {name}\n")))
            .filter_map(|e| serde_json::from_str::<Value>(e.split("data: ").nth(1)?).ok())
            .last()
            .unwrap_or_else(|| panic!("no {name} in {body}"))
    };
    let input = data("message_start")["message"]["usage"]["input_tokens"]
        .as_u64()
        .unwrap();
    (input, data("message_delta")["usage"]["output_tokens"].as_u64().unwrap())
}

#[tokio::test]
async fn a_wrong_secret_is_refused_by_the_simulator_and_the_right_one_is_served_and_reconciled() {
    let sim = start_sim().await;
    let (wrong, _) = start(sim, "not-the-secret", false).await;
    let (status, _, body) = call(wrong, &messages(false, 5)).await;
    assert_eq!(status, 502, "the provider refused the signature: {body}");
    assert!(body.contains("refused the gateway's upstream credentials"), "{body}");
    assert!(
        !body.contains("signature"),
        "the provider's own words are not passed on: {body}"
    );

    let (gateway, backend) = start(sim, SECRET, false).await;
    let (status, headers, body) = call(gateway, &messages(false, 7)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(headers["x-ratelimit-deployment"], "bedrock");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["model"], CLAUDE_ID);
    let input = answer["usage"]["input_tokens"].as_u64().unwrap();
    assert_eq!(answer["usage"]["output_tokens"], 7);
    eventually_in_use(&backend, &key("input_tpm"), input).await;
    eventually_in_use(&backend, &key("output_tpm"), 7).await;

    let (status, headers, body) = call(gateway, &messages(true, 9)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(headers["content-type"], "text/event-stream", "re-framed for the client");
    assert!(body.starts_with("event: message_start\ndata: "), "{body}");
    assert!(body.contains("event: message_stop\ndata: "), "{body}");
    assert!(body.contains("amazon-bedrock-invocationMetrics"), "{body}");
    let (stream_input, output) = stream_usage(&body);
    assert_eq!(output, 9);
    eventually_in_use(&backend, &key("input_tpm"), input + stream_input).await;
    eventually_in_use(&backend, &key("output_tpm"), 7 + 9).await;
}

#[tokio::test]
async fn a_throttle_inside_the_stream_reaches_the_client_as_an_anthropic_error_event() {
    let sim = start_sim().await;
    let (gateway, backend) = start(sim, SECRET, false).await;
    arm_fault(sim, json!({"mode": "drop", "after_events": 3, "count": 1})).await;
    let (status, _, body) = call(gateway, &messages(true, 20)).await;
    assert_eq!(status, 200, "the stream had started: {body}");
    let events: Vec<&str> = body.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 4, "three events, then the error: {body}");
    assert!(events[0].starts_with("event: message_start"), "{body}");
    let error: Value = serde_json::from_str(events[3].strip_prefix("event: error\ndata: ").unwrap()).unwrap();
    assert_eq!(error["error"]["type"], "rate_limit_error", "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("throttlingException"),
        "{error}"
    );
    // The call ended without its usage: it keeps what it reserved, and frees its slot.
    eventually_in_use(&backend, &key("output_tpm"), 64).await;
}

#[tokio::test]
async fn bedrock_s_throttling_moves_the_pool_s_calls_to_anthropic_without_a_client_error() {
    let sim = start_sim().await;
    let (gateway, _) = start(sim, SECRET, true).await;
    // Anthropic first: throttled for a while, Bedrock takes the calls.
    arm_fault(
        sim,
        json!({"mode": "status", "status": 429, "for_ms": 60000, "model": "claude-sonnet-4-5"}),
    )
    .await;
    for stream in [false, true, false, true] {
        let (status, headers, body) = call(gateway, &messages(stream, 3)).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(headers["x-ratelimit-deployment"], "bedrock", "{body}");
    }
    // Now Bedrock throttles in its own shape, and Anthropic is back.
    arm_fault(
        sim,
        json!({"mode": "status", "status": 429, "for_ms": 60000, "model": CLAUDE_ID}),
    )
    .await;
    let mut served = Vec::new();
    for stream in [false, true, false, true] {
        let (status, headers, body) = call(gateway, &messages(stream, 3)).await;
        assert_eq!(status, 200, "{body}");
        served.push(headers["x-ratelimit-deployment"].to_str().unwrap().to_owned());
    }
    assert!(served.iter().all(|d| d == "anthropic"), "{served:?}");
}

#[tokio::test]
async fn web_identity_credentials_are_renewed_with_sts_before_they_expire_and_never_sent_expired() {
    let lifetime = Duration::from_millis(1_500);
    let (sim, provider) = start_sim_with(Some(lifetime)).await;
    let token_file = std::env::temp_dir().join(format!("gateway-bedrock-web-identity-{}", std::process::id()));
    std::fs::write(&token_file, "a-web-identity-token\n").unwrap();
    let (gateway, _) = {
        let _environment = ENVIRONMENT.lock().await;
        std::env::set_var("AWS_WEB_IDENTITY_TOKEN_FILE", &token_file);
        std::env::set_var("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/gateway");
        std::env::set_var("AWS_ENDPOINT_URL_STS", format!("http://{sim}"));
        let started = start_locked(sim, "unused: the web identity wins", false).await;
        for var in ["AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_ENDPOINT_URL_STS"] {
            std::env::remove_var(var);
        }
        started
    };
    assert_eq!(provider.sts_issued(), 0, "assumed at the first call, not before");
    // Calls for more than three lifetimes: the simulator refuses an expired
    // key, so every call served proves none was sent expired.
    let started = Instant::now();
    let mut calls = 0;
    while started.elapsed() < lifetime * 3 + lifetime / 2 {
        let (status, _, body) = call(gateway, &messages(calls % 2 == 1, 2)).await;
        assert_eq!(status, 200, "call {calls} after {:?}: {body}", started.elapsed());
        calls += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let issued = provider.sts_issued();
    assert!((4..=calls).contains(&issued), "{issued} credentials for {calls} calls");
    std::fs::remove_file(&token_file).unwrap();
}

#[tokio::test]
async fn the_bedrock_profile_settles_a_call_to_its_input_plus_five_times_its_output() {
    let sim = start_sim().await;
    let (gateway, backend) = {
        let _environment = ENVIRONMENT.lock().await;
        start_with_limits(sim, SECRET, false, "rpm: 1000, tpm: 1000000, profile: bedrock").await
    };
    let (status, _, body) = call(gateway, &messages(false, 7)).await;
    assert_eq!(status, 200, "{body}");
    let input = serde_json::from_str::<Value>(&body).unwrap()["usage"]["input_tokens"]
        .as_u64()
        .unwrap();
    // Bedrock burns Claude's output down at 5x: what the quota was charged.
    eventually_in_use(&backend, &key("tpm"), input + 5 * 7).await;
    eventually_in_use(&backend, &key("rpm"), 1).await;
}

#[tokio::test]
async fn bedrock_s_other_models_speak_openai_s_chat_and_nothing_bedrock_lacks() {
    let sim = start_sim().await;
    let yaml = format!(
        "listen_addr: \"127.0.0.1:0\"\nupstreams:\n  - {{name: bedrock, kind: bedrock, region: us-east-1, base_url: \"http://{sim}\"}}\nmodels:\n  - name: oss\n    max_output_tokens_default: 32\n    deployments:\n      - {{upstream: bedrock, model: \"{OSS_ID}\", rpm: 1000, tpm: 100000}}\ntenants:\n  - {{name: acme, api_key_env: GATEWAY_BEDROCK_ACME_KEY}}\n"
    );
    let config: gateway::GatewayConfig = serde_yaml::from_str(&yaml).unwrap();
    config.validate().unwrap();
    let backend = memory_backend();
    let gateway = {
        let _environment = ENVIRONMENT.lock().await;
        std::env::set_var("GATEWAY_BEDROCK_ACME_KEY", TENANT_KEY);
        std::env::set_var("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID);
        std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET);
        std::env::set_var("AWS_SESSION_TOKEN", SESSION_TOKEN);
        start_gateway(&config, backend.clone()).await
    };
    let chat = json!({"model": "oss", "messages": [{"role": "user", "content": "Hi"}], "sim_output_tokens": 4});
    let (status, _, body) = post(&client(), gateway, "/v1/chat/completions", chat).await;
    assert_eq!(status, 200, "{body}");
    let usage = serde_json::from_str::<Value>(&body).unwrap()["usage"].clone();
    let total = usage["total_tokens"].as_u64().unwrap();
    let tpm = "global:llm:bedrock:openai.gpt-oss-120b-1@0:tpm";
    eventually_in_use(&backend, tpm, total).await;
    let responses = json!({"model": "oss", "input": "Hi"});
    let (status, _, body) = post(&client(), gateway, "/v1/responses", responses).await;
    assert_eq!(status, 404, "Bedrock has no Responses API: {body}");
    eventually_in_use(&backend, tpm, total).await;
}
