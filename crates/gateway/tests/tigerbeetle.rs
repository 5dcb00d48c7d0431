//! The gateway on the TigerBeetle backend (a real cluster started by the library's
//! harness): the same reservation, reconciliation and release rules as on memory.

#![cfg(feature = "tigerbeetle")]

mod support;

use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use ratelimiter::retry::{Jitter, RetryAdvisor, RetryPolicy};
use ratelimiter::tigerbeetle::{BackendOptions, ConfigFields, LocalCluster, TigerBeetleBackend, TigerBeetleConfig};
use ratelimiter::{Backend, SystemClock};
use serde_json::json;
use support::*;

/// How long the cluster may take to answer its first request.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

async fn tigerbeetle_backend(cluster: &LocalCluster) -> Arc<dyn Backend> {
    let config = TigerBeetleConfig::new(ConfigFields {
        addresses: vec![cluster.address().to_owned()],
        sessions: 2,
        request_timeout_ms: 20_000,
        ..ConfigFields::default()
    })
    .unwrap();
    let options = BackendOptions {
        retry: RetryAdvisor::new(RetryPolicy::default(), 1024, Jitter::seeded(7)),
        decrease_retry_ms: 10_000,
        window_margin_ms: 0,
        clock: Arc::new(SystemClock::new()),
    };
    let backend = TigerBeetleBackend::connect(&config, options, std::future::pending()).unwrap();
    let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
    while backend.health().await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "cluster not ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Arc::new(backend)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_are_reserved_reconciled_and_released_on_tigerbeetle() {
    let cluster = LocalCluster::start().expect("starting a local TigerBeetle");
    let backend = tigerbeetle_backend(&cluster).await;
    let (provider, state) = start_provider().await;
    let gateway = start_gateway(&config(provider, 0), backend.clone()).await;
    let client = client();
    let total = OPENAI_USAGE.0 + OPENAI_USAGE.1;
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 50});
    let (status, _, text) = post(&client, gateway, "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{text}");
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, _, text) = post(&client, gateway, "/v1/chat/completions", streamed).await;
    assert_eq!(status, 200, "{text}");
    assert!(!text.contains("prompt_tokens"));
    eventually_in_use(&backend, "global:llm:openai:gpt-4o-mini:tpm", 2 * total).await;
    eventually_in_use(&backend, "tenant:acme:llm:daily_tokens", 2 * total).await;
    eventually_in_use(&backend, "global:llm:openai:gpt-4o-mini:concurrency", 0).await;

    // One slot: an open stream holds it, a second call is a 429, and a client that
    // leaves frees it at once while its tokens stay reserved.
    let bearer = format!("Bearer {TENANT_KEY}");
    let slow = json!({"model": "gpt-4o-mini-slow", "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": 50, "stream": true});
    let mut open = post_raw(
        &client,
        gateway,
        "/v1/chat/completions",
        slow.to_string(),
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(open.status(), 200);
    open.body_mut().frame().await.unwrap().unwrap();
    let (status, headers, _) = post(&client, gateway, "/v1/chat/completions", slow.clone()).await;
    assert_eq!(status, 429);
    assert_eq!(headers["x-ratelimit-limit-concurrency"], "1");
    let tpm = "global:llm:openai:gpt-4o-mini-slow:tpm";
    let reserved = in_use(&backend, tpm).await;
    assert!(reserved > 50, "{reserved}");
    drop(open);
    drop(client);
    eventually_in_use(&backend, "global:llm:openai:gpt-4o-mini-slow:concurrency", 0).await;
    assert_eq!(in_use(&backend, tpm).await, reserved);
    state.gate.add_permits(8);
}

/// An Anthropic-profiled model reserves on the profile's buckets on TigerBeetle too:
/// the take, the refill and the Complete's refund are transfers on the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_profiled_model_reserves_on_buckets_on_tigerbeetle() {
    let cluster = LocalCluster::start().expect("starting a local TigerBeetle");
    let backend = tigerbeetle_backend(&cluster).await;
    anthropic_buckets_give_unused_output_back(backend).await;
}

/// Classes on TigerBeetle: the ceilings are ordinary limits on the cluster, reserved
/// in the same linked request as the model's keys, so a lower class never takes the
/// headroom there either (docs/gateway.md, "Classes").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lower_class_never_takes_the_headroom_on_tigerbeetle() {
    let cluster = LocalCluster::start().expect("starting a local TigerBeetle");
    let backend = tigerbeetle_backend(&cluster).await;
    batch_never_takes_the_interactive_headroom(backend).await;
}

/// A budget in money shared by two servers on one cluster: every call reserves
/// its worst case on the cluster's budget key in its all-or-nothing request, so
/// concurrent calls through both servers never hold more than the budget, and
/// each is charged its billed cost at completion (docs/gateway.md, "Budgets and
/// spend").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_shared_by_two_servers_is_never_overspent_on_tigerbeetle() {
    use support::billing::{budget_config, start_billing, BUDGET_TENANT_KEY};
    const CALLS: usize = 12;
    const BUDGET: &str = "tenant:fin:usd:month";
    let cluster = LocalCluster::start().expect("starting a local TigerBeetle");
    let (provider, billing) = start_billing().await;
    // $0.001 a month at $1 a million tokens: 1,000 micro-dollars, one a token.
    let mut config = budget_config(provider, "[{usd: 0.001, period: month}]", 0, "");
    config.models[0].price = Some(serde_json::from_value(json!({"input": 1, "output": 1})).unwrap());
    let backends = [tigerbeetle_backend(&cluster).await, tigerbeetle_backend(&cluster).await];
    let gateways = [
        start_gateway(&config, backends[0].clone()).await,
        start_gateway(&config, backends[1].clone()).await,
    ];
    // Each call's worst case is its prompt and 300 output tokens: three fit, a fourth never.
    let body = json!({"model": "gpt-4o", "max_tokens": 300, "messages": [{"role": "user", "content": "Hi."}],
        "test_hold": true, "test_usage": {"prompt_tokens": 10, "completion_tokens": 5}});
    let calls: Vec<_> = (0..CALLS)
        .map(|i| {
            let (gateway, body) = (gateways[i % 2], body.to_string());
            tokio::spawn(async move {
                let bearer = format!("Bearer {BUDGET_TENANT_KEY}");
                let response = post_raw(
                    &client(),
                    gateway,
                    "/v1/chat/completions",
                    body,
                    &[("authorization", &bearer)],
                )
                .await;
                response.status().as_u16()
            })
        })
        .collect();
    // Every call is either held at the provider or answered.
    for _ in 0..1_000 {
        let answered = calls.iter().filter(|c| c.is_finished()).count();
        if answered + billing.held.load(std::sync::atomic::Ordering::SeqCst) as usize == CALLS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let held = in_use(&backends[1], BUDGET).await;
    assert!(held <= 1_000, "the budget holds {held} of 1,000");
    let admitted = billing.held.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(admitted, 3, "three worst cases fit the budget, across both servers");
    billing.release(CALLS);
    let mut statuses = Vec::new();
    for call in calls {
        statuses.push(call.await.unwrap());
    }
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 3, "{statuses:?}");
    assert!(statuses.iter().all(|s| *s == 200 || *s == 429), "{statuses:?}");
    assert_eq!(billing.held_max.load(std::sync::atomic::Ordering::SeqCst), 3);
    // Each served call is charged its 15 billed micro-dollars, seen from either server.
    eventually_in_use(&backends[0], BUDGET, 3 * 15).await;
}
