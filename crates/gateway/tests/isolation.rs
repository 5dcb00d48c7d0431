//! Tenants isolated from one another and from web pages (docs/gateway.md,
//! "Isolation"): one tenant's calls in flight cannot crowd another's out of the
//! backend's lease table; a tenant continues only the stored responses the
//! gateway handed to it; an anonymous gateway answers only its own origin and
//! JSON bodies; a client's model name is echoed cut.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::BodyExt;
use ratelimiter::{Backend, MemoryBackend, MemoryConfig, SystemClock};
use support::*;

/// The lease table of [`lease_share_config`]'s backend, and each tenant's share
/// of it (25 %): two leases.
const LEASES_MAX: usize = 8;
const OWNER_LEASES_MAX: usize = 2;

/// Two tenants on a slow model (its streams end when the test says) with room
/// for many calls.
fn lease_share_config(provider: SocketAddr) -> gateway::GatewayConfig {
    std::env::set_var("GATEWAY_TEST_WEB_KEY", WEB_KEY);
    std::env::set_var("GATEWAY_TEST_ETL_KEY", ETL_KEY);
    let yaml = format!(
        r#"listen_addr: "127.0.0.1:0"
upstreams:
  - {{name: openai, kind: openai, base_url: "http://{provider}"}}
models:
  - {{name: gpt-4o-mini-slow, upstream: openai, rpm: 500, tpm: 1000000, max_output_tokens_default: 50, max_wait_ms: 0}}
tenants:
  - {{name: web, api_key_env: GATEWAY_TEST_WEB_KEY}}
  - {{name: etl, api_key_env: GATEWAY_TEST_ETL_KEY}}
"#
    );
    serde_yaml::from_str(&yaml).unwrap()
}

/// Opens a streamed call of the slow model with `key`; its lease stays live
/// until the provider's gate lets the stream end.
async fn open_slow(client: &HttpClient, gateway: SocketAddr, key: &str) -> hyper::Response<hyper::body::Incoming> {
    let bearer = format!("Bearer {key}");
    let body = serde_json::json!({"model": "gpt-4o-mini-slow", "stream": true,
        "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 5});
    post_raw(
        client,
        gateway,
        "/v1/chat/completions",
        body.to_string(),
        &[("authorization", &bearer)],
    )
    .await
}

#[tokio::test]
async fn a_tenant_past_its_share_of_the_lease_table_gets_a_clear_429_and_another_is_served() {
    let (provider_addr, provider) = start_provider().await;
    let config = MemoryConfig {
        leases_max: LEASES_MAX,
        lease_share_percent: 25,
        ..MemoryConfig::default()
    };
    assert_eq!(config.owner_leases_max(), OWNER_LEASES_MAX);
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new(Arc::new(SystemClock::new()), config));
    let gateway = start_gateway(&lease_share_config(provider_addr), backend.clone()).await;
    let client = client();
    let mut open = Vec::new();
    for _ in 0..OWNER_LEASES_MAX {
        let response = open_slow(&client, gateway, WEB_KEY).await;
        assert_eq!(response.status(), 200);
        open.push(response);
    }
    // A third call in flight is past the tenant's share: a 429 saying so, nothing reserved.
    let refused = open_slow(&client, gateway, WEB_KEY).await;
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().contains_key("retry-after-ms"));
    let body = String::from_utf8(refused.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    assert!(
        body.contains("gateway tenant web holds 2 live leases") && body.contains("rate_limit_exceeded"),
        "{body}"
    );
    assert_eq!(in_use(&backend, "global:llm:openai:gpt-4o-mini-slow:rpm").await, 2);
    // The other tenant still has its own share.
    for _ in 0..OWNER_LEASES_MAX {
        let response = open_slow(&client, gateway, ETL_KEY).await;
        assert_eq!(response.status(), 200, "the other tenant is not crowded out");
        open.push(response);
    }
    // The first tenant's calls end: its share is free again.
    provider.gate.add_permits(open.len());
    for response in open {
        response.into_body().collect().await.unwrap();
    }
    let mut served = false;
    for _ in 0..100 {
        let response = open_slow(&client, gateway, WEB_KEY).await;
        if response.status() == 200 {
            served = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(served, "the tenant's share frees as its calls complete");
}

/// A gateway open to anonymous callers, answering to `gateway.internal` too.
fn anonymous_config(provider: SocketAddr) -> gateway::GatewayConfig {
    let yaml = format!(
        r#"listen_addr: "127.0.0.1:0"
upstreams:
  - {{name: openai, kind: openai, base_url: "http://{provider}"}}
models:
  - {{name: gpt-4o-mini, upstream: openai, rpm: 500, tpm: 1000000, max_output_tokens_default: 50}}
allow_anonymous: true
allowed_hosts: [gateway.internal]
"#
    );
    serde_yaml::from_str(&yaml).unwrap()
}

/// A chat call's body.
const CHAT_BODY: &str =
    r#"{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 5}"#;

/// Sends `head` (the request line and headers, without the blank line) and a
/// chat body over a raw connection; answers the status and the whole answer.
async fn raw_chat(gateway: SocketAddr, head: &str) -> (u16, String) {
    raw(gateway, head, CHAT_BODY).await
}

/// Sends `head` and `body` over a raw connection; answers the status and the whole answer.
async fn raw(gateway: SocketAddr, head: &str, body: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request = format!(
        "{head}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(gateway).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, answer)
}

#[tokio::test]
async fn an_anonymous_gateway_answers_only_its_own_origin_and_json_bodies() {
    let (provider_addr, provider) = start_provider().await;
    let backend = memory_backend();
    let gateway = start_gateway(&anonymous_config(provider_addr), backend.clone()).await;
    let host = format!("Host: {gateway}");
    let post = "POST /v1/chat/completions HTTP/1.1";
    let json = "Content-Type: application/json";
    // What a web page can send to another origin without a preflight: refused.
    let (status, answer) = raw_chat(gateway, &format!("{post}\r\n{host}\r\nContent-Type: text/plain")).await;
    assert_eq!(status, 415, "{answer}");
    assert!(answer.contains("unsupported_media_type"), "{answer}");
    let (status, answer) = raw_chat(gateway, &format!("{post}\r\n{host}")).await;
    assert_eq!(status, 415, "a body without a content type: {answer}");
    // A page of another origin, with the right content type (after a preflight nobody answers).
    let foreign = format!("{post}\r\n{host}\r\n{json}\r\nOrigin: http://attacker.example");
    let (status, answer) = raw_chat(gateway, &foreign).await;
    assert_eq!(status, 403, "{answer}");
    assert!(
        answer.contains("permission_denied") && answer.contains("attacker.example"),
        "{answer}"
    );
    // A rebinding page names its own host.
    let rebound = format!("{post}\r\nHost: attacker.example:{}\r\n{json}", gateway.port());
    let (status, answer) = raw_chat(gateway, &rebound).await;
    assert_eq!(status, 403, "{answer}");
    assert_eq!(provider.calls.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert_eq!(
        in_use(&backend, "global:llm:openai:gpt-4o-mini:rpm").await,
        0,
        "nothing reserved"
    );
    // The intended callers: an IP address, a configured name, the server's own origin.
    for head in [
        format!("{post}\r\n{host}\r\n{json}"),
        format!("{post}\r\nHost: gateway.internal:{}\r\n{json}", gateway.port()),
        format!("{post}\r\n{host}\r\n{json}; charset=utf-8\r\nOrigin: http://{gateway}"),
    ] {
        let (status, answer) = raw_chat(gateway, &head).await;
        assert_eq!(status, 200, "{head}: {answer}");
    }
    // A GET needs no content type.
    let (status, answer) = raw(gateway, &format!("GET /v1/models HTTP/1.1\r\n{host}"), "").await;
    assert_eq!(status, 200, "{answer}");
}

/// The provider simulator (`replay`), which stores nothing and answers every
/// Responses call with a new `resp_` id.
async fn start_sim() -> SocketAddr {
    use replay::provider::{Accounting, ProviderLimits};
    let limits = ProviderLimits {
        rpm: 100_000,
        tpm: 100_000_000,
        window_ms: 60_000,
        concurrency: 1_000,
        ms_per_output_token: 0,
        accounting: Accounting::Actual,
    };
    let control = replay::sim_control::SimControl::default();
    let provider = replay::provider_server::ProviderServer::with_control(limits, Arc::new(SystemClock::new()), control);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(Arc::clone(&provider).serve(listener, std::future::pending()));
    addr
}

/// POSTs a Responses call with `key`; answers the status and body.
async fn respond(
    client: &HttpClient,
    gateway: SocketAddr,
    key: &str,
    fields: serde_json::Value,
) -> (u16, serde_json::Value) {
    let mut body = serde_json::json!({"model": "gpt-4o-mini", "input": "Write one line.", "max_output_tokens": 20,
        "sim_output_tokens": 12});
    body.as_object_mut()
        .unwrap()
        .extend(fields.as_object().unwrap().clone());
    let bearer = format!("Bearer {key}");
    let response = post_raw(
        client,
        gateway,
        "/v1/responses",
        body.to_string(),
        &[("authorization", &bearer)],
    )
    .await;
    let status = response.status().as_u16();
    let text = String::from_utf8(response.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    let value = match text.split("\n\n").find(|e| e.contains("response.completed")) {
        // A stream: its final event's response.
        Some(done) => {
            serde_json::from_str::<serde_json::Value>(done.split("data: ").nth(1).unwrap()).unwrap()["response"].clone()
        }
        None => serde_json::from_str(&text).unwrap(),
    };
    (status, value)
}

#[tokio::test]
async fn a_tenant_continues_only_the_responses_the_gateway_handed_to_it() {
    let sim = start_sim().await;
    std::env::set_var("GATEWAY_TEST_WEB_KEY", WEB_KEY);
    std::env::set_var("GATEWAY_TEST_ETL_KEY", ETL_KEY);
    let yaml = format!(
        r#"listen_addr: "127.0.0.1:0"
upstreams:
  - {{name: sim, kind: openai, base_url: "http://{sim}"}}
models:
  - {{name: gpt-4o-mini, upstream: sim, rpm: 10000, tpm: 10000000, max_output_tokens_default: 64}}
tenants:
  - {{name: web, api_key_env: GATEWAY_TEST_WEB_KEY}}
  - {{name: etl, api_key_env: GATEWAY_TEST_ETL_KEY}}
"#
    );
    let backend = memory_backend();
    let gateway = start_gateway(&serde_yaml::from_str(&yaml).unwrap(), backend.clone()).await;
    let client = client();
    for stream in [false, true] {
        let (status, first) = respond(&client, gateway, WEB_KEY, serde_json::json!({"stream": stream})).await;
        assert_eq!(status, 200, "{first}");
        let id = first["id"].as_str().unwrap().to_owned();
        assert!(id.starts_with("resp_"), "{first}");
        let follow = serde_json::json!({"previous_response_id": id});
        // Another tenant that learned the id: answered as an unknown id, nothing reserved.
        let rpm = "global:llm:sim:gpt-4o-mini:rpm";
        let before = in_use(&backend, rpm).await;
        let (status, refused) = respond(&client, gateway, ETL_KEY, follow.clone()).await;
        assert_eq!(status, 400, "{refused}");
        assert_eq!(refused["error"]["code"], "previous_response_not_found");
        assert_eq!(refused["error"]["param"], "previous_response_id");
        assert_eq!(
            refused["error"]["message"],
            format!("Previous response with id '{id}' not found.")
        );
        assert_eq!(in_use(&backend, rpm).await, before);
        // The tenant it was handed to continues it.
        let (status, next) = respond(&client, gateway, WEB_KEY, follow).await;
        assert_eq!(status, 200, "stream {stream}: {next}");
    }
    let unknown = serde_json::json!({"previous_response_id": "resp_never_handed_out"});
    let (status, refused) = respond(&client, gateway, WEB_KEY, unknown).await;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (400, Some("previous_response_not_found"))
    );
}

#[tokio::test]
async fn a_huge_model_name_is_echoed_cut() {
    let (provider, _) = start_provider().await;
    let backend = memory_backend();
    let gateway = start_gateway(&anonymous_config(provider), backend).await;
    let name = "m".repeat(500_000);
    let body = serde_json::json!({"model": name, "messages": [{"role": "user", "content": "Hi."}]});
    let response = post_raw(&client(), gateway, "/v1/chat/completions", body.to_string(), &[]).await;
    assert_eq!(response.status(), 404);
    let text = String::from_utf8(response.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    assert!(text.len() < 1_024, "{} bytes echoed", text.len());
    assert!(text.contains("… (500000 bytes)"), "{text}");
}
