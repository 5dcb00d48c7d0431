//! One Claude model over three providers (docs/gateway.md, "Google Vertex AI"
//! and "Amazon Bedrock"): Vertex AI, Bedrock and Anthropic's API in one pool,
//! each on the simulator in its own wire envelope and credentials. Throttling
//! on one provider, in its own shape (Vertex's `RESOURCE_EXHAUSTED`, Bedrock's
//! `ThrottlingException`), moves the calls to the others with no error the
//! client sees, streamed or not.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::BodyExt;
use replay::provider_server::ProviderServer;
use replay::sim_control::SimControl;
use serde_json::json;
use support::provider_sim::{arm_fault, start_roomy_sim, trust_vertex_test_key, vertex_key_file, VERTEX_TEST_KEY};
use support::*;

/// The one model's id at each provider.
const VERTEX_ID: &str = "claude-sonnet-4-5@20250929";
const BEDROCK_ID: &str = "us.anthropic.claude-sonnet-4-5-20250929-v1:0";
const ANTHROPIC_ID: &str = "claude-sonnet-4-5";

async fn start_sim() -> (SocketAddr, Arc<ProviderServer>) {
    let models = [VERTEX_ID, BEDROCK_ID, ANTHROPIC_ID].map(str::to_owned).to_vec();
    start_roomy_sim(SimControl::new(models, None), |provider| {
        trust_vertex_test_key(provider, 3_600)
    })
    .await
}

/// The gateway: model `claude` over Vertex first, then Bedrock, then Anthropic
/// (priorities 0, 1, 2).
async fn start_gateway_for(sim: SocketAddr, key_file: &std::path::Path) -> SocketAddr {
    std::env::set_var("GATEWAY_THREE_ACME_KEY", TENANT_KEY);
    // Bedrock signs with the environment's keys; this simulator does not check them.
    std::env::set_var("AWS_ACCESS_KEY_ID", "AKIDTHREEPROVIDERS01");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "three-providers-secret");
    let deployment = |upstream: &str, model: &str, priority: u32| {
        format!("      - {{upstream: {upstream}, model: \"{model}\", priority: {priority}, rpm: 10000, input_tpm: 1000000, output_tpm: 1000000}}\n")
    };
    let yaml = format!(
        "listen_addr: \"127.0.0.1:0\"\nupstream_timeout_ms: 5000\nupstreams:\n\
         \x20 - {{name: vertex, kind: vertex, project: acme-ml, region: global, base_url: \"http://{sim}\", credentials_file: \"{}\"}}\n\
         \x20 - {{name: bedrock, kind: bedrock, region: us-east-1, base_url: \"http://{sim}\"}}\n\
         \x20 - {{name: anthropic, kind: anthropic, base_url: \"http://{sim}\"}}\n\
         models:\n  - name: claude\n    deployments:\n{}{}{}\
         tenants:\n  - {{name: acme, api_key_env: GATEWAY_THREE_ACME_KEY, daily_tokens: 100000000}}\n",
        key_file.display(),
        deployment("vertex", VERTEX_ID, 0),
        deployment("bedrock", BEDROCK_ID, 1),
        deployment("anthropic", ANTHROPIC_ID, 2),
    );
    start_gateway(&serde_yaml::from_str(&yaml).unwrap(), memory_backend()).await
}

/// A Claude call with the anthropic SDK's headers: the status, the deployment
/// that served, and the body.
async fn call(gateway: SocketAddr, stream: bool) -> (u16, String, String) {
    let body = json!({"model": "claude", "max_tokens": 20, "stream": stream, "sim_output_tokens": 3,
        "messages": [{"role": "user", "content": "Hello"}]});
    let headers = [("x-api-key", TENANT_KEY), ("anthropic-version", "2023-06-01")];
    let response = post_raw(&client(), gateway, "/v1/messages", body.to_string(), &headers).await;
    let (parts, body) = response.into_parts();
    let served =
        (parts.headers.get("x-ratelimit-deployment")).map_or(String::new(), |d| d.to_str().unwrap().to_owned());
    let body = String::from_utf8(body.collect().await.unwrap().to_bytes().to_vec()).unwrap();
    (parts.status.as_u16(), served, body)
}

/// Six calls, streamed and not: each served, the deployments that served them.
async fn six_calls(gateway: SocketAddr) -> Vec<String> {
    let mut served = Vec::new();
    for stream in [false, true, false, true, false, true] {
        let (status, deployment, body) = call(gateway, stream).await;
        assert_eq!(status, 200, "{deployment}: {body}");
        if stream {
            assert!(body.contains("event: message_stop"), "{deployment}: {body}");
        }
        served.push(deployment);
    }
    served
}

#[tokio::test]
async fn throttling_on_one_provider_moves_the_calls_to_the_others_with_no_client_error() {
    let (sim, provider) = start_sim().await;
    let key_file = vertex_key_file("three-providers", sim, VERTEX_TEST_KEY);
    let gateway = start_gateway_for(sim, &key_file).await;

    assert!(
        six_calls(gateway).await.iter().all(|d| d == "vertex"),
        "the first deployment serves"
    );
    // Vertex's Claude quota in the region is spent: RESOURCE_EXHAUSTED.
    arm_fault(
        sim,
        json!({"mode": "status", "status": 429, "for_ms": 60000, "model": VERTEX_ID}),
    )
    .await;
    let served = six_calls(gateway).await;
    assert!(served.iter().all(|d| d == "bedrock"), "{served:?}");
    // Bedrock throttles in its own shape while Vertex is paused or back (its pause
    // lasts a second, Vertex sending no hint): no call is served by Bedrock.
    arm_fault(
        sim,
        json!({"mode": "status", "status": 429, "for_ms": 60000, "model": BEDROCK_ID}),
    )
    .await;
    let served = six_calls(gateway).await;
    assert!(served.iter().all(|d| d == "vertex" || d == "anthropic"), "{served:?}");
    assert_eq!(provider.vertex_auth().refused_tokens(), 0);
    assert_eq!(provider.vertex_auth().issued(), 1, "one token for every Vertex call");
    std::fs::remove_dir_all(key_file.parent().unwrap()).unwrap();
}
