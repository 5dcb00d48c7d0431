//! What an operator meets around the gateway's tenants, run on the real
//! `ratelimiterd` binary (docs/gateway.md, "Tenants and keys"): a tenant name
//! both in the YAML and made through the admin API is refused, at the API and
//! at a start, with how to resolve it, and never turns the API tenant's keys
//! into revoked ones.

mod support;

use std::net::SocketAddr;

use serde_json::{json, Value};
use support::gateway_setup::{client, gateway_addr, send, start_sim, HttpClient};
use support::{temp_dir, write_config_on, BackendConfig, Daemon, ADMIN_TOKEN};

/// The configured tenant's key variable and key.
const YAML_KEY_ENV: &str = "GATEWAY_OPERATOR_TEST_KEY";
const YAML_KEY: &str = "gateway-operator-test-yaml-key-0123456789";

/// A gateway serving one model of the simulator, with the YAML tenants `tenants`.
fn gateway_section(sim: SocketAddr, tenants: &[&str]) -> String {
    std::env::set_var(YAML_KEY_ENV, YAML_KEY);
    let mut section = format!(
        "gateway:\n  listen_addr: \"127.0.0.1:0\"\n  upstreams:\n    - {{name: sim, kind: openai, base_url: \"http://{sim}\"}}\n  models:\n    - {{name: gpt-4o-mini, upstream: sim, rpm: 1000, tpm: 1000000, concurrency: 8, max_output_tokens_default: 64}}\n  tenants:\n    - {{name: yaml-team, api_key_env: {YAML_KEY_ENV}}}\n"
    );
    for name in tenants {
        // Each extra tenant's key is the YAML tenant's with its name added.
        let env = format!("GATEWAY_OPERATOR_TEST_KEY_{}", name.to_uppercase());
        std::env::set_var(&env, format!("{YAML_KEY}-{name}"));
        section.push_str(&format!("    - {{name: {name}, api_key_env: {env}, rpm: 100}}\n"));
    }
    section
}

/// An admin call on `server`; asserts its status, returns its JSON.
async fn admin(
    client: &HttpClient,
    server: SocketAddr,
    method: hyper::Method,
    path: &str,
    body: Option<Value>,
    status: u16,
) -> Value {
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let url = format!("http://{server}{path}");
    let answer = send(client, method, url, &[("authorization", &bearer)], body).await;
    assert_eq!(answer.status, status, "{path}: {}", answer.body);
    answer.json()
}

/// The status of a short chat call with `key` through the gateway at `gateway`.
async fn chat_status(client: &HttpClient, gateway: SocketAddr, key: &str) -> u16 {
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 5, "sim_output_tokens": 5,
        "messages": [{"role": "user", "content": "Hi"}]});
    let bearer = format!("Bearer {key}");
    let url = format!("http://{gateway}/v1/chat/completions");
    let answer = send(
        client,
        hyper::Method::POST,
        url,
        &[("authorization", &bearer)],
        Some(body),
    )
    .await;
    answer.status
}

/// A tenant name the YAML has cannot be made through the API (409 naming the
/// file), and a YAML entry added later for a tenant made through the API stops
/// the start with the way out; without the entry, the API tenant's key still
/// works and is listed active (never revoked by nobody).
#[tokio::test]
async fn a_tenant_name_in_both_the_yaml_and_the_api_is_refused_and_its_keys_stay_working() {
    let sim = start_sim().await;
    let dir = temp_dir("gateway-operator-clash");
    let mut daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", &gateway_section(sim, &[]));
    let client = client();
    let post = hyper::Method::POST;
    let tenants = "/v1/admin/gateway/tenants";
    let refused = admin(
        &client,
        daemon.addr,
        post.clone(),
        tenants,
        Some(json!({"name": "yaml-team"})),
        409,
    )
    .await;
    let text = refused.to_string();
    assert!(
        text.contains("yaml-team") && text.contains("configuration file"),
        "{text}"
    );

    admin(
        &client,
        daemon.addr,
        post.clone(),
        tenants,
        Some(json!({"name": "dup"})),
        201,
    )
    .await;
    let keys = "/v1/admin/gateway/keys";
    let created = admin(&client, daemon.addr, post, keys, Some(json!({"tenant": "dup"})), 201).await;
    let (id, key) = (created["id"].as_str().unwrap(), created["key"].as_str().unwrap());
    assert_eq!(chat_status(&client, gateway_addr(&daemon), key).await, 200);
    daemon.terminate();

    // The same name added to the YAML: the start is refused, naming the tenant and the way out.
    let clashing = write_config_on(&dir, BackendConfig::Memory, "", &gateway_section(sim, &["dup"]));
    let logs = match Daemon::start_with(&clashing) {
        Ok(_) => panic!("a start with the tenant dup in the YAML and made through the API must be refused"),
        Err(logs) => logs,
    };
    assert!(logs.contains("tenant dup is defined both"), "{logs}");
    assert!(logs.contains("ratelimiterd tenants delete dup"), "{logs}");

    // Without the entry, the API tenant and its key are as they were.
    let config = write_config_on(&dir, BackendConfig::Memory, "", &gateway_section(sim, &[]));
    let daemon = Daemon::start_with(&config).unwrap_or_else(|logs| panic!("did not start:\n{logs}"));
    let shown = admin(
        &client,
        daemon.addr,
        hyper::Method::GET,
        &format!("{keys}/{id}"),
        None,
        200,
    )
    .await;
    assert_eq!(shown["status"], "active", "{shown}");
    assert!(shown["revoked_at"].is_null(), "{shown}");
    assert_eq!(chat_status(&client, gateway_addr(&daemon), key).await, 200);
}

