//! Stored responses and conversations isolated per tenant through the real
//! `ratelimiterd` binary's gateway in front of the provider simulator
//! (docs/gateway.md, "Stored responses"): a tenant continues the responses and
//! conversations handed to it, and another tenant's, or an unknown one, is
//! refused with the same answer; on TigerBeetle, a fleet's servers agree: an id
//! handed by one server is accepted at once on the other for its tenant, and
//! refused on every server for another tenant.

mod support;

use std::net::SocketAddr;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::{json, Value};
use support::gateway_setup::{client, gateway_addr, start_sim, HttpClient};
use support::{temp_dir, BackendConfig, Daemon, ADMIN_TOKEN};

/// The two tenants' keys (from the environment, as the configuration says).
const ACME_KEY: &str = "stored-responses-test-acme-key-0123456789";
const BETA_KEY: &str = "stored-responses-test-beta-key-0123456789";

/// A gateway serving one OpenAI model to two tenants.
fn gateway_section(sim: SocketAddr) -> String {
    std::env::set_var("STORED_RESPONSES_ACME_KEY", ACME_KEY);
    std::env::set_var("STORED_RESPONSES_BETA_KEY", BETA_KEY);
    format!(
        "gateway:\n  listen_addr: \"127.0.0.1:0\"\n  upstreams:\n    - {{name: sim, kind: openai, base_url: \"http://{sim}\"}}\n  models:\n    - {{name: gpt-4o-mini, upstream: sim, rpm: 1000, tpm: 1000000, concurrency: 8, max_output_tokens_default: 64}}\n  tenants:\n    - {{name: acme, api_key_env: STORED_RESPONSES_ACME_KEY}}\n    - {{name: beta, api_key_env: STORED_RESPONSES_BETA_KEY}}\n"
    )
}

/// A POST of `body` to `path` on `gateway` with `key`: the status and the raw body.
async fn post(client: &HttpClient, gateway: SocketAddr, path: &str, key: &str, body: Value) -> (u16, Bytes) {
    let request = hyper::Request::builder()
        .method(hyper::Method::POST)
        .uri(format!("http://{gateway}{path}"))
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {key}"))
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status().as_u16();
    (status, response.into_body().collect().await.unwrap().to_bytes())
}

/// A Responses call of `key` with `extra` fields: the status and the JSON answer.
async fn respond(client: &HttpClient, gateway: SocketAddr, key: &str, extra: Value) -> (u16, Value) {
    let mut body = json!({"model": "gpt-4o-mini", "input": "Hi", "max_output_tokens": 16, "sim_output_tokens": 3});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    let (status, bytes) = post(client, gateway, "/v1/responses", key, body).await;
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// A streamed Responses call of `key`: the id of its `response.completed` event.
async fn respond_streamed(client: &HttpClient, gateway: SocketAddr, key: &str) -> String {
    let body = json!({"model": "gpt-4o-mini", "input": "Hi", "max_output_tokens": 16,
        "sim_output_tokens": 3, "stream": true});
    let (status, bytes) = post(client, gateway, "/v1/responses", key, body).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    (text.lines())
        .filter_map(|line| line.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .find(|event| event["type"] == "response.completed")
        .and_then(|event| event["response"]["id"].as_str().map(str::to_owned))
        .expect("a completed event with the response's id")
}

/// A new conversation of `key`'s tenant, made through the gateway.
async fn conversation(client: &HttpClient, gateway: SocketAddr, key: &str) -> String {
    let (status, bytes) = post(client, gateway, "/v1/conversations", key, json!({"metadata": {}})).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let created: Value = serde_json::from_slice(&bytes).unwrap();
    created["id"].as_str().unwrap().to_owned()
}

/// Asserts that `key` may continue `previous` on each of `gateways`.
async fn continues(client: &HttpClient, gateways: &[SocketAddr], key: &str, previous: &Value) {
    for &gateway in gateways {
        let (status, body) = respond(client, gateway, key, previous.clone()).await;
        assert_eq!(status, 200, "{gateway} {previous}: {body}");
    }
}

/// Asserts that `key` is refused `previous` on each of `gateways` with the
/// very answer of an unknown id of the same kind (`unknown`), the id aside.
async fn refused(client: &HttpClient, gateways: &[SocketAddr], key: &str, previous: &Value, unknown: &Value) {
    for &gateway in gateways {
        let (status, body) = respond(client, gateway, key, previous.clone()).await;
        let (unknown_status, unknown_body) = respond(client, gateway, key, unknown.clone()).await;
        assert!(status == 400 || status == 404, "{gateway} {previous}: {status} {body}");
        assert_eq!(status, unknown_status, "{body} against {unknown_body}");
        for field in ["type", "code", "param"] {
            assert_eq!(body["error"][field], unknown_body["error"][field], "{field}: {body}");
        }
    }
}

/// Both tenants on `gateways`: each continues its own responses (whole and
/// streamed) and conversations on every gateway, never the other's.
async fn isolated(client: &HttpClient, gateways: &[SocketAddr]) {
    let first = gateways[0];
    let unknown_response = json!({"previous_response_id": "resp_never_handed"});
    let unknown_conversation = json!({"conversation": "conv_never_handed"});
    let (status, answer) = respond(client, first, ACME_KEY, json!({})).await;
    assert_eq!(status, 200, "{answer}");
    let whole = json!({"previous_response_id": answer["id"]});
    let streamed = json!({"previous_response_id": respond_streamed(client, first, ACME_KEY).await});
    let created = conversation(client, first, ACME_KEY).await;
    let by_id = json!({"conversation": created});
    let by_object = json!({"conversation": {"id": created}});
    for previous in [&whole, &streamed, &by_id, &by_object] {
        continues(client, gateways, ACME_KEY, previous).await;
    }
    for (previous, unknown) in [
        (&whole, &unknown_response),
        (&streamed, &unknown_response),
        (&by_id, &unknown_conversation),
        (&by_object, &unknown_conversation),
    ] {
        refused(client, gateways, BETA_KEY, previous, unknown).await;
    }
    // A conversation first seen in an answer is the answering tenant's too;
    // a response id is no conversation id.
    let (status, answer) = respond(client, first, ACME_KEY, by_id.clone()).await;
    assert_eq!((status, &answer["conversation"]["id"]), (200, &json!(created)));
    let as_conversation = json!({"conversation": answer["id"]});
    refused(client, gateways, ACME_KEY, &as_conversation, &unknown_conversation).await;
}

#[tokio::test]
async fn each_tenant_continues_only_its_own_responses_and_conversations() {
    let sim = start_sim().await;
    let dir = temp_dir("gateway-stored-responses");
    let daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", &gateway_section(sim));
    isolated(&client(), &[gateway_addr(&daemon)]).await;
}

/// An admin call of `method` on `path` of `server`: the status and the JSON answer.
async fn admin(
    client: &HttpClient,
    server: SocketAddr,
    method: hyper::Method,
    path: &str,
    body: Value,
) -> (u16, Value) {
    let request = hyper::Request::builder()
        .method(method)
        .uri(format!("http://{server}{path}"))
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// A tenant `name` made through the admin API of `server`, and a key of it: the key's text.
async fn api_tenant_key(client: &HttpClient, server: SocketAddr, name: &str) -> String {
    let (status, body) = admin(
        client,
        server,
        hyper::Method::POST,
        "/v1/admin/gateway/tenants",
        json!({"name": name}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = admin(
        client,
        server,
        hyper::Method::POST,
        "/v1/admin/gateway/keys",
        json!({"tenant": name}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    body["key"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_tenant_made_again_under_its_name_does_not_continue_the_deleted_ones_responses() {
    let sim = start_sim().await;
    let dir = temp_dir("gateway-stored-responses-incarnations");
    let daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", &gateway_section(sim));
    let (client, gateway) = (client(), gateway_addr(&daemon));
    let first = api_tenant_key(&client, daemon.addr, "phoenix").await;
    let (status, answer) = respond(&client, gateway, &first, json!({})).await;
    assert_eq!(status, 200, "{answer}");
    let previous = json!({"previous_response_id": answer["id"]});
    let created = conversation(&client, gateway, &first).await;
    let in_conversation = json!({"conversation": created});
    continues(&client, &[gateway], &first, &previous).await;
    continues(&client, &[gateway], &first, &in_conversation).await;
    let path = "/v1/admin/gateway/tenants/phoenix";
    let (status, body) = admin(&client, daemon.addr, hyper::Method::DELETE, path, Value::Null).await;
    assert_eq!(status, 200, "{body}");
    let second = api_tenant_key(&client, daemon.addr, "phoenix").await;
    let unknown_response = json!({"previous_response_id": "resp_never_handed"});
    refused(&client, &[gateway], &second, &previous, &unknown_response).await;
    let unknown_conversation = json!({"conversation": "conv_never_handed"});
    refused(&client, &[gateway], &second, &in_conversation, &unknown_conversation).await;
    // The new tenant continues its own.
    let (status, answer) = respond(&client, gateway, &second, json!({})).await;
    assert_eq!(status, 200, "{answer}");
    continues(
        &client,
        &[gateway],
        &second,
        &json!({"previous_response_id": answer["id"]}),
    )
    .await;
}

#[cfg(feature = "tigerbeetle")]
mod fleet {
    use super::*;
    use ratelimiter::tigerbeetle::LocalCluster;

    #[tokio::test]
    async fn a_fleet_accepts_an_id_for_its_tenant_on_every_server_and_no_other_tenant() {
        let cluster = LocalCluster::start().expect("starting a local TigerBeetle");
        let sim = start_sim().await;
        let backend = BackendConfig::TigerBeetle {
            addresses: cluster.address(),
            settings: "  sessions: 2\n  request_timeout_ms: 2000\n",
        };
        let (dir_a, dir_b) = (
            temp_dir("stored-responses-fleet-a"),
            temp_dir("stored-responses-fleet-b"),
        );
        let a = Daemon::start_on(&dir_a, backend, "", &gateway_section(sim));
        let b = Daemon::start_on(&dir_b, backend, "", &gateway_section(sim));
        let (gateway_a, gateway_b) = (gateway_addr(&a), gateway_addr(&b));
        // Handed by A, continued at once on B (whose memory never saw them);
        // refused for the other tenant on both.
        isolated(&client(), &[gateway_a, gateway_b]).await;
        // And the other way round, B's memory now warm with A's ids.
        isolated(&client(), &[gateway_b, gateway_a]).await;
    }
}
