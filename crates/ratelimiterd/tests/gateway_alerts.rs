//! Budget alerts of budgets made at runtime, through the real `ratelimiterd`
//! binary in front of the provider simulator (docs/gateway.md, "Budgets and
//! spend", Alerts): a key created through the keys API with a budget and
//! `alert_at` has each fraction its calls cross POSTed to the webhook, as has
//! its tenant's budget once the tenant's `budgets` are replaced; and two
//! servers on one TigerBeetle cluster, both serving calls of one such key, POST
//! exactly one event per crossing between them.

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::{routing, Json, Router};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use ratelimiter::price::{billed_micro_usd, list_price, Usage};
use serde_json::{json, Value};
use support::gateway_setup::{self, client, gateway_addr, start_sim, HttpClient};
use support::{temp_dir, BackendConfig, Daemon, ADMIN_TOKEN};

/// The key's budget: $0.001 a day, in micro-dollars.
const BUDGET_MICRO_USD: u64 = 1_000;
/// Its `alert_at`: crossed at 10, 20 and 40 micro-dollars, a few calls apart.
const FRACTIONS: [f64; 3] = [0.01, 0.02, 0.04];

/// The events the webhook's receiver accepted.
type Received = Arc<Mutex<Vec<Value>>>;

async fn hook(State(received): State<Received>, Json(event): Json<Value>) -> StatusCode {
    received.lock().unwrap().push(event);
    StatusCode::NO_CONTENT
}

/// A webhook receiver on loopback.
async fn start_receiver() -> (SocketAddr, Received) {
    let received = Received::default();
    let app = Router::new()
        .route("/hook", routing::post(hook))
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, received)
}

/// One OpenAI model and the webhook; no tenant in the file: the directory's only.
fn gateway_section(sim: SocketAddr, receiver: SocketAddr) -> String {
    format!(
        "gateway:\n  listen_addr: \"127.0.0.1:0\"\n  upstreams:\n    - {{name: sim, kind: openai, base_url: \"http://{sim}\"}}\n  models:\n    - {{name: gpt-4o-mini, upstream: sim, rpm: 1000, tpm: 1000000, concurrency: 8, max_output_tokens_default: 64}}\n  alerts: {{webhook_url: \"http://{receiver}/hook\"}}\n"
    )
}

/// POSTs `body` to `url` with `bearer`: the status and the body's JSON.
async fn post(client: &HttpClient, url: String, bearer: &str, body: Value) -> (u16, Value) {
    send(client, hyper::Method::POST, url, bearer, body).await
}

/// Sends `body` to `url` with `bearer`: the status and the body's JSON.
async fn send(client: &HttpClient, method: hyper::Method, url: String, bearer: &str, body: Value) -> (u16, Value) {
    let authorization = format!("Bearer {bearer}");
    let answer = gateway_setup::send(client, method, url, &[("authorization", &authorization)], Some(body)).await;
    (answer.status, answer.json())
}

/// The value of the counter `name` in `server`'s `/metrics`.
async fn counter(client: &HttpClient, server: SocketAddr, name: &str) -> u64 {
    let request = hyper::Request::get(format!("http://{server}/metrics"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let text = String::from_utf8(response.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    (text.lines())
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

const RAISED: &str = "ratelimiterd_gateway_budget_alerts_raised_total";
const SKIPPED: &str = "ratelimiterd_gateway_budget_alerts_duplicates_skipped_total";

/// A tenant of the directory and a key of it with a daily budget that sets
/// `alert_at`, made through the admin API of `server`: the key's text.
async fn key_with_budget(client: &HttpClient, server: SocketAddr, tenant: &str) -> String {
    let url = |path: &str| format!("http://{server}{path}");
    let (status, body) = post(
        client,
        url("/v1/admin/gateway/tenants"),
        ADMIN_TOKEN,
        json!({"name": tenant}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let budget = json!({"usd": BUDGET_MICRO_USD as f64 / 1e6, "period": "day", "alert_at": FRACTIONS});
    let (status, body) = post(
        client,
        url("/v1/admin/gateway/keys"),
        ADMIN_TOKEN,
        json!({"tenant": tenant, "budgets": [budget]}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    body["key"].as_str().unwrap().to_owned()
}

/// One chat call with `key`; asserts a 200 and returns what it was billed.
async fn chat(client: &HttpClient, gateway: SocketAddr, key: &str) -> u64 {
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 16, "sim_output_tokens": 12,
        "messages": [{"role": "user", "content": "Hi there"}]});
    let (status, answer) = post(client, format!("http://{gateway}/v1/chat/completions"), key, body).await;
    assert_eq!(status, 200, "{answer}");
    let usage = Usage {
        input_tokens: answer["usage"]["prompt_tokens"].as_u64().unwrap(),
        output_tokens: answer["usage"]["completion_tokens"].as_u64().unwrap(),
        ..Usage::default()
    };
    billed_micro_usd(&list_price("openai", "gpt-4o-mini").unwrap().price, &usage)
}

/// The fractions a spend of `spent_micro_usd` has crossed.
fn crossed(spent_micro_usd: u64) -> Vec<f64> {
    (FRACTIONS.iter().copied())
        .filter(|f| spent_micro_usd as f64 >= (f * BUDGET_MICRO_USD as f64).ceil())
        .collect()
}

/// Waits (bounded) until `received` holds `count` events, then a while more
/// for any duplicate; returns their fractions in the order they came.
async fn settled_fractions(received: &Received, count: usize) -> Vec<f64> {
    let started = Instant::now();
    while received.lock().unwrap().len() < count {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{count} events never arrived: {:?}",
            received.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let events = received.lock().unwrap().clone();
    for event in &events {
        assert_eq!(event["type"], "budget_alert", "{event}");
        assert_eq!(event["budget_micro_usd"], BUDGET_MICRO_USD, "{event}");
        assert_eq!(event["period"], "day", "{event}");
    }
    events.iter().map(|e| e["fraction"].as_f64().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_made_through_the_keys_api_posts_each_fraction_its_calls_cross() {
    let (sim, (receiver, received)) = (start_sim().await, start_receiver().await);
    let dir = temp_dir("gateway-alerts-key");
    let daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", &gateway_section(sim, receiver));
    let (gateway, client) = (gateway_addr(&daemon), client());
    let key = key_with_budget(&client, daemon.addr, "alerted-team").await;
    let mut spent = 0;
    while crossed(spent).len() < FRACTIONS.len() {
        spent += chat(&client, gateway, &key).await;
        assert!(
            spent < BUDGET_MICRO_USD / 10,
            "the calls cost more than expected: {spent}"
        );
    }
    let fractions = settled_fractions(&received, FRACTIONS.len()).await;
    assert_eq!(fractions, FRACTIONS, "each fraction once, lowest first");
    let event = received.lock().unwrap()[0].clone();
    assert_eq!(event["tenant"], "alerted-team", "{event}");
    assert!(event["budget"].as_str().unwrap().starts_with("key:"), "{event}");
    assert_eq!(counter(&client, daemon.addr, RAISED).await, 3);
    assert_eq!(counter(&client, daemon.addr, SKIPPED).await, 0);
    // The tenant's budgets replaced at runtime: its new budget is watched from its next call.
    let budget = json!({"usd": BUDGET_MICRO_USD as f64 / 1e6, "period": "day", "alert_at": [FRACTIONS[0]]});
    let url = format!("http://{}/v1/admin/gateway/tenants/alerted-team", daemon.addr);
    let (status, body) = send(
        &client,
        hyper::Method::PATCH,
        url,
        ADMIN_TOKEN,
        json!({"budgets": [budget]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let mut tenant_spent = 0;
    while crossed(tenant_spent).is_empty() {
        tenant_spent += chat(&client, gateway, &key).await;
    }
    assert_eq!(
        settled_fractions(&received, FRACTIONS.len() + 1).await.len(),
        FRACTIONS.len() + 1
    );
    let event = received.lock().unwrap().last().unwrap().clone();
    assert_eq!(
        (&event["budget"], &event["fraction"]),
        (&json!("tenant:alerted-team:usd:day"), &json!(FRACTIONS[0])),
        "{event}"
    );
}

#[cfg(feature = "tigerbeetle")]
mod fleet {
    use super::*;
    use ratelimiter::tigerbeetle::LocalCluster;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_servers_on_one_cluster_post_one_event_per_crossing() {
        let cluster = LocalCluster::start().expect("starting a local TigerBeetle");
        let (sim, (receiver, received)) = (start_sim().await, start_receiver().await);
        let backend = BackendConfig::TigerBeetle {
            addresses: cluster.address(),
            settings: "  sessions: 2\n  request_timeout_ms: 2000\n",
        };
        let (dir_a, dir_b) = (temp_dir("gateway-alerts-fleet-a"), temp_dir("gateway-alerts-fleet-b"));
        let a = Daemon::start_on(&dir_a, backend, "", &gateway_section(sim, receiver));
        let b = Daemon::start_on(&dir_b, backend, "", &gateway_section(sim, receiver));
        let client = client();
        let key = key_with_budget(&client, a.addr, "fleet-team").await;
        let gateways = [gateway_addr(&a), gateway_addr(&b)];
        // Calls alternate between the servers, each after the last one's
        // alerts had time to be read: every crossing is then seen by both.
        let mut spent = 0;
        for call in 0.. {
            spent += chat(&client, gateways[call % 2], &key).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            if crossed(spent).len() == FRACTIONS.len() && call % 2 == 1 {
                break;
            }
            assert!(
                spent < BUDGET_MICRO_USD / 10,
                "the calls cost more than expected: {spent}"
            );
        }
        // One more call on each server: both read the budget past every fraction.
        for gateway in gateways {
            chat(&client, gateway, &key).await;
        }
        let mut fractions = settled_fractions(&received, FRACTIONS.len()).await;
        fractions.sort_by(f64::total_cmp);
        assert_eq!(fractions, FRACTIONS, "one event per crossing, whichever server saw it");
        // Each server sees each crossing (its last call read the budget past
        // them all): one alerted it, the other skipped it.
        let started = Instant::now();
        let (raised, skipped) = loop {
            let mut sums = (0, 0);
            for server in [a.addr, b.addr] {
                sums.0 += counter(&client, server, RAISED).await;
                sums.1 += counter(&client, server, SKIPPED).await;
            }
            if sums.0 + sums.1 >= 6 || started.elapsed() > Duration::from_secs(10) {
                break sums;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!((raised, skipped), (3, 3));
    }
}
