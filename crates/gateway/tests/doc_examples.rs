//! Every gateway configuration the documentation shows is started: each
//! `gateway:` section of a YAML block (or a shell heredoc) in README.md and
//! docs/gateway.md is validated, started in front of the provider simulator
//! (its listener and upstream addresses moved to loopback, its key variables
//! set, a Vertex AI upstream's key file one the simulator trusts), and called
//! once per model, so an example that no longer starts, or a
//! field it shows that the gateway refuses, fails here.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;

use ratelimiter::SystemClock;
use replay::provider::{Accounting, ProviderLimits};
use replay::provider_server::ProviderServer;
use replay::sim::vertex_auth::VertexAuth;
use replay::sim_control::SimControl;
use serde_json::{json, Value};
use support::*;

/// The documents whose examples are started, relative to this crate.
const DOCUMENTS: [&str; 2] = ["../../README.md", "../../docs/gateway.md"];

/// The YAML texts of a Markdown document: its `yaml` blocks, and the heredocs
/// (`<<'YAML'` ... `YAML`) of its shell blocks.
fn yaml_texts(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut lines = markdown.lines();
    while let Some(line) = lines.next() {
        let end = match line.trim_start() {
            "```yaml" => "```",
            l if l.contains("<<'YAML'") => "YAML",
            _ => continue,
        };
        let block: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != end).collect();
        out.push(block.join("\n"));
    }
    out
}

/// Every `gateway:` section the documents show, with where it came from.
fn examples() -> Vec<(String, serde_yaml::Value)> {
    let mut out = Vec::new();
    for document in DOCUMENTS {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(document);
        let markdown = std::fs::read_to_string(&path).unwrap();
        for (i, text) in yaml_texts(&markdown).into_iter().enumerate() {
            let Ok(value) = serde_yaml::from_str::<serde_yaml::Value>(&text) else {
                panic!("{document} block {i} is not YAML:\n{text}");
            };
            if let Some(section) = value.get("gateway") {
                out.push((format!("{document} block {i}"), section.clone()));
            }
        }
    }
    out
}

async fn start_sim(models: Vec<String>) -> SocketAddr {
    let limits = ProviderLimits {
        rpm: 100_000,
        tpm: 100_000_000,
        window_ms: 60_000,
        concurrency: 1_000,
        ms_per_output_token: 0,
        accounting: Accounting::Actual,
    };
    let control = SimControl::new(models, None);
    let provider = ProviderServer::with_control(limits, Arc::new(SystemClock::new()), control);
    // The service account of the Vertex AI examples ([`vertex_key_file`]).
    let account = json!({"client_email": VERTEX_ACCOUNT, "private_key": VERTEX_TEST_KEY});
    provider.set_vertex_auth(VertexAuth::from_key_file(account.to_string().as_bytes(), 3_600).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(Arc::clone(&provider).serve(listener, std::future::pending()));
    addr
}

/// The test-only key (tests/fixtures/README.md): the key of the Vertex AI
/// examples' service account, which the simulator trusts.
const VERTEX_TEST_KEY: &str = include_str!("../../../tests/fixtures/vertex-test-only-key.pem");
const VERTEX_ACCOUNT: &str = "gateway@acme-ml.iam.gserviceaccount.com";

/// A key file of the examples' service account whose `token_uri` is `sim`'s,
/// in this test's directory.
fn vertex_key_file(sim: SocketAddr) -> String {
    let dir = std::env::temp_dir().join(format!("gateway-doc-examples-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("vertex-{}.json", sim.port()));
    let file = json!({"type": "service_account", "private_key_id": "k1", "private_key": VERTEX_TEST_KEY,
        "client_email": VERTEX_ACCOUNT, "token_uri": format!("http://{sim}/token")});
    std::fs::write(&path, file.to_string()).unwrap();
    path.display().to_string()
}

/// The example moved to loopback: its listener on a free port, its upstreams
/// at the simulator, every key variable it names set; the first tenant's key.
fn localize(mut section: serde_yaml::Value, sim: SocketAddr) -> (gateway::GatewayConfig, Option<String>) {
    section["listen_addr"] = "127.0.0.1:0".into();
    for upstream in section["upstreams"].as_sequence_mut().unwrap() {
        upstream["base_url"] = format!("http://{sim}").into();
        if let Some(variable) = upstream.get("api_key_env").and_then(|v| v.as_str()) {
            std::env::set_var(variable, "upstream-key-unused-by-the-simulator");
        } else if upstream.get("kind").and_then(|v| v.as_str()) == Some("vertex") {
            upstream["credentials_file"] = vertex_key_file(sim).into();
        } else if upstream.get("kind").and_then(|v| v.as_str()) == Some("bedrock") {
            // The environment's AWS keys, which the simulator without keys does not check.
            std::env::set_var("AWS_ACCESS_KEY_ID", "AKIDDOCEXAMPLE");
            std::env::set_var("AWS_SECRET_ACCESS_KEY", "doc-example-secret");
        }
    }
    let mut first_key = None;
    let tenants = section.get_mut("tenants").and_then(|t| t.as_sequence_mut());
    for (i, tenant) in tenants.into_iter().flatten().enumerate() {
        let variable = tenant["api_key_env"].as_str().unwrap().to_owned();
        let key = format!("doc-example-tenant-key-{i}-0123456789");
        std::env::set_var(&variable, &key);
        first_key.get_or_insert(key);
    }
    (serde_yaml::from_value(section).unwrap(), first_key)
}

#[tokio::test]
async fn every_documented_gateway_configuration_starts_and_serves_its_models() {
    let examples = examples();
    for document in DOCUMENTS {
        assert!(
            examples.iter().any(|(place, _)| place.starts_with(document)),
            "{document} shows no gateway configuration: the extraction is broken"
        );
    }
    for (place, section) in examples {
        let parsed: gateway::GatewayConfig = serde_yaml::from_value(section.clone())
            .unwrap_or_else(|e| panic!("{place}: the example does not parse: {e}"));
        parsed
            .validate()
            .unwrap_or_else(|e| panic!("{place}: the example is refused: {e}"));
        // A pool's deployments may send other names upstream: the simulator serves them too.
        let models: Vec<String> = (parsed.models.iter())
            .flat_map(|m| gateway::config::resolve(m).into_iter().map(|d| d.model.name))
            .collect();
        let sim = start_sim(models).await;
        let (config, key) = localize(section, sim);
        let gateway = start_gateway(&config, memory_backend()).await;
        let client = client();
        for model in &config.models {
            let first = &gateway::config::resolve(model)[0].model;
            let upstream = config.upstreams.iter().find(|u| u.name == first.upstream).unwrap();
            let (path, body) = match upstream.format_of(&first.name) {
                gateway::config::UpstreamKind::Anthropic => (
                    "/v1/messages",
                    json!({"model": model.name, "max_tokens": 8, "messages": [{"role": "user", "content": "Hello"}]}),
                ),
                _ => (
                    "/v1/chat/completions",
                    json!({"model": model.name, "max_tokens": 8, "messages": [{"role": "user", "content": "Hello"}]}),
                ),
            };
            let mut headers = vec![("anthropic-version", "2023-06-01".to_owned())];
            if let Some(key) = &key {
                headers.push(("x-api-key", key.clone()));
            }
            let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
            let response = post_raw(&client, gateway, path, body.to_string(), &headers).await;
            let status = response.status();
            let body = http_body_util::BodyExt::collect(response.into_body())
                .await
                .unwrap()
                .to_bytes();
            let answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            assert_eq!(status, 200, "{place}: {}: {answer}", model.name);
        }
    }
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!("gateway-doc-examples-{}", std::process::id())));
}

#[test]
fn yaml_blocks_and_heredocs_are_both_found() {
    let markdown = "text\n```yaml\na: 1\n```\n```sh\ncat > f <<'YAML'\nb: 2\nYAML\nrun\n```\n";
    assert_eq!(yaml_texts(markdown), ["a: 1", "b: 2"]);
}
