//! Budget alerts through the gateway (docs/gateway.md, "Budgets and spend"):
//! a tenant's budget with `alert_at` raises one webhook event per fraction its
//! spend crosses, each once, POSTed to a receiver on loopback that fails the first
//! attempt (the event is retried), counted in `/metrics`; a bad `gateway.alerts`
//! is refused naming it.

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::{routing, Json, Router};
use serde_json::{json, Value};
use support::billing::{budget_config, start_billing, BUDGET_TENANT_KEY};
use support::*;

/// What the receiver saw: every attempt, and the events it accepted.
#[derive(Default)]
struct Received {
    attempts: Mutex<u64>,
    events: Mutex<Vec<Value>>,
}

/// Answers 500 to the first attempt, then accepts each event.
async fn hook(State(received): State<Arc<Received>>, Json(event): Json<Value>) -> StatusCode {
    let attempt = {
        let mut attempts = received.attempts.lock().unwrap();
        *attempts += 1;
        *attempts
    };
    if attempt == 1 {
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    received.events.lock().unwrap().push(event);
    StatusCode::NO_CONTENT
}

async fn start_receiver() -> (SocketAddr, Arc<Received>) {
    let received = Arc::new(Received::default());
    let app = Router::new()
        .route("/hook", routing::post(hook))
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, received)
}

/// A gpt-4o call bounded by, and reporting, `completion_tokens` output ($10 per
/// million) and 4 prompt tokens.
async fn spend(client: &HttpClient, gateway: SocketAddr, completion_tokens: u64) {
    let body = json!({"model": "gpt-4o", "max_tokens": completion_tokens, "messages": [{"role": "user", "content": "hi"}],
        "test_usage": {"prompt_tokens": 4, "completion_tokens": completion_tokens, "total_tokens": 4 + completion_tokens}});
    let bearer = format!("Bearer {BUDGET_TENANT_KEY}");
    let response = post_raw(
        client,
        gateway,
        "/v1/chat/completions",
        body.to_string(),
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(response.status(), 200);
    http_body_util::BodyExt::collect(response.into_body()).await.unwrap();
}

/// Waits (bounded) until the receiver holds `count` events.
async fn until_events(received: &Received, count: usize) {
    for _ in 0..1_000 {
        if received.events.lock().unwrap().len() >= count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{count} events never arrived: {:?}", received.events.lock().unwrap());
}

#[tokio::test]
async fn budget_alerts_post_one_event_per_fraction_crossed_retrying_a_failed_attempt() {
    let (provider, _billing) = start_billing().await;
    let (receiver, received) = start_receiver().await;
    let budgets = "[{usd: 1, period: day, alert_at: [0.25, 0.5, 0.8]}]";
    let alerts = format!("alerts: {{webhook_url: \"http://{receiver}/hook\", attempts_max: 3}}\n");
    let config = budget_config(provider, budgets, 0, &alerts);
    let (gateway, metrics) = start_gateway_with_metrics(&config, memory_backend()).await;
    let client = client();
    // $0.30 each (300,010 micro-dollars): 0.25, then 0.5, then 0.8 are crossed.
    spend(&client, gateway, 30_000).await;
    until_events(&received, 1).await;
    spend(&client, gateway, 30_000).await;
    until_events(&received, 2).await;
    spend(&client, gateway, 30_000).await;
    until_events(&received, 3).await;
    // Below the next fraction: nothing more.
    spend(&client, gateway, 10).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let events = received.events.lock().unwrap().clone();
    let fractions: Vec<f64> = events.iter().map(|e| e["fraction"].as_f64().unwrap()).collect();
    assert_eq!(fractions, [0.25, 0.5, 0.8], "{events:?}");
    assert_eq!(*received.attempts.lock().unwrap(), 4, "the first event retried once");
    let first = &events[0];
    assert_eq!(first["type"], "budget_alert");
    assert_eq!(first["budget"], "tenant:fin:usd:day");
    assert_eq!(first["tenant"], "fin");
    assert_eq!(first["period"], "day");
    assert_eq!(first["spent_micro_usd"], 300_010);
    assert_eq!(first["budget_micro_usd"], 1_000_000);
    assert_eq!(events[2]["spent_micro_usd"], 900_030);
    let mut text = String::new();
    metrics.render(&mut text);
    assert!(
        text.contains("ratelimiterd_gateway_budget_alerts_delivered_total 3\n"),
        "{text}"
    );
    assert!(
        text.contains("ratelimiterd_gateway_budget_alerts_dropped_total 0\n"),
        "{text}"
    );
}

#[test]
fn a_webhook_url_that_is_not_http_is_refused_naming_the_field() {
    let provider: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let alerts = "alerts: {webhook_url: \"file:///etc/passwd\"}\n";
    let config = budget_config(provider, "[{usd: 1, period: day}]", 0, alerts);
    let error = config.validate().unwrap_err().to_string();
    assert!(error.starts_with("gateway.alerts.webhook_url:"), "{error}");
}
