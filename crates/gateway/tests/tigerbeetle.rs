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
