//! Pools (docs/gateway.md, "Pools"): one model served by several deployments, each a
//! provider simulator of its own (`replay::provider_server`, in process) with its own
//! limits and armed faults, on the memory backend: each routing mode, spillover by
//! priority, failover on 429, 500, no connection and a timeout (stream and not,
//! before the first byte) and none after it, the breaker, the rewrite of `model`,
//! the tenant charged once, and the 429 and 400 of a pool.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use gateway::proxy::upstream::UpstreamClient;
use http_body_util::BodyExt;
use ratelimiter::{Backend, FakeClock, SystemClock};
use replay::provider::{Accounting, ProviderLimits};
use replay::provider_server::ProviderServer;
use replay::sim_control::SimControl;
use serde_json::{json, Value};
use support::*;

/// The tokens one test call asks for: a prompt of 2 (the simulator's count) and
/// 4 written, of a bound of 16.
const OUTPUT_BOUND: u64 = 16;

/// A simulator serving `gpt-4o` and `gpt-4o-ptu` only, on a free loopback port.
async fn start_deployment(ms_per_output_token: u64) -> SocketAddr {
    let limits = ProviderLimits {
        rpm: 100_000,
        tpm: 100_000_000,
        window_ms: 60_000,
        concurrency: 1_000,
        ms_per_output_token,
        accounting: Accounting::Actual,
    };
    let control = SimControl::new(vec!["gpt-4o".into(), "gpt-4o-ptu".into()], None);
    let provider = ProviderServer::with_control(limits, Arc::new(SystemClock::new()), control);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(Arc::clone(&provider).serve(listener, std::future::pending()));
    addr
}

/// A gateway whose upstreams `d0`, `d1`, ... are `sims`, serving `models` (YAML
/// list items), with tenant acme, on a fresh memory backend.
async fn pool_gateway(
    sims: &[SocketAddr],
    timeout_ms: u64,
    models: &str,
) -> (SocketAddr, Arc<dyn Backend>, Arc<gateway::metrics::GatewayMetrics>) {
    let config = pool_config(sims, timeout_ms, models);
    let backend = memory_backend();
    let (gateway, metrics) = start_gateway_with_metrics(&config, backend.clone()).await;
    (gateway, backend, metrics)
}

/// [`pool_gateway`] on a fake clock, returned: its breakers and pauses move only
/// when the test advances it (the backend keeps the system clock).
async fn pool_gateway_on_fake_clock(
    sims: &[SocketAddr],
    models: &str,
) -> (SocketAddr, Arc<gateway::metrics::GatewayMetrics>, Arc<FakeClock>) {
    let timeout_ms = 5_000;
    let config = pool_config(sims, timeout_ms, models);
    let backend = memory_backend();
    let fake = Arc::new(FakeClock::new(1_000_000));
    let client = UpstreamClient::new(Duration::from_millis(timeout_ms));
    let gateway = gateway::Gateway::with_clock(&config, backend.clone(), client, fake.clone()).unwrap();
    let (gateway, metrics) = serve_gateway(gateway, backend).await;
    (gateway, metrics, fake)
}

/// The configuration of [`pool_gateway`].
fn pool_config(sims: &[SocketAddr], timeout_ms: u64, models: &str) -> gateway::GatewayConfig {
    std::env::set_var("GATEWAY_POOL_ACME_KEY", TENANT_KEY);
    let upstreams: String = (sims.iter().enumerate())
        .map(|(i, addr)| format!("  - {{name: d{i}, kind: openai-compatible, base_url: \"http://{addr}\"}}\n"))
        .collect();
    let yaml = format!(
        "listen_addr: \"127.0.0.1:0\"\nupstream_timeout_ms: {timeout_ms}\nupstreams:\n{upstreams}models:\n{models}tenants:\n  - {{name: acme, api_key_env: GATEWAY_POOL_ACME_KEY, daily_tokens: 1000000}}\n"
    );
    serde_yaml::from_str(&yaml).unwrap()
}

fn call(stream: bool) -> Value {
    json!({"model": "gpt-4o", "max_tokens": OUTPUT_BOUND, "sim_output_tokens": 4, "stream": stream,
        "messages": [{"role": "user", "content": "the cat sat "}]})
}

async fn arm(sim: SocketAddr, fault: Value) {
    let request = hyper::Request::post(format!("http://{sim}/sim/faults"))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(fault.to_string())))
        .unwrap();
    let response = client().request(request).await.unwrap();
    assert_eq!(response.status(), 204);
}

/// Model calls the simulator at `sim` received.
async fn sim_calls(sim: SocketAddr) -> u64 {
    let request = hyper::Request::get(format!("http://{sim}/sim/stats"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let response = client().request(request).await.unwrap();
    let stats: Value = serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    stats["calls"].as_u64().unwrap()
}

async fn rpm_in_use(backend: &Arc<dyn Backend>, upstream: &str, model: &str) -> u64 {
    in_use(backend, &format!("global:llm:{upstream}:{model}:rpm")).await
}

/// `deployments:` of two with `rpm` each, the second `d1` at `priority`.
fn two(routing: &str, rpm: u64, priority: u32, extra: &str) -> String {
    format!(
        "  - name: gpt-4o\n    routing: {routing}\n    max_output_tokens_default: 16\n{extra}    deployments:\n      - {{upstream: d0, model: gpt-4o-ptu, rpm: {rpm}, tpm: 100000}}\n      - {{upstream: d1, priority: {priority}, rpm: {rpm}, tpm: 100000}}\n"
    )
}

#[tokio::test]
async fn capacity_routing_fills_the_deployments_evenly_and_ordered_fills_the_first() {
    let sims = [start_deployment(0).await, start_deployment(0).await];
    for (routing, expected) in [("capacity", (2, 2)), ("ordered", (4, 0))] {
        let (gateway, backend, _) = pool_gateway(&sims, 5_000, &two(routing, 4, 0, "")).await;
        for _ in 0..4 {
            let (status, _, body) = post(&client(), gateway, "/v1/chat/completions", call(false)).await;
            assert_eq!(status, 200, "{body}");
        }
        let got = (
            rpm_in_use(&backend, "d0", "gpt-4o-ptu").await,
            rpm_in_use(&backend, "d1", "gpt-4o").await,
        );
        assert_eq!(got, expected, "{routing}");
    }
}

#[tokio::test]
async fn weighted_routing_splits_by_weight() {
    let sims = [start_deployment(0).await, start_deployment(0).await];
    let models = "  - name: gpt-4o\n    routing: weighted\n    max_output_tokens_default: 16\n    deployments:\n      - {upstream: d0, model: gpt-4o-ptu, weight: 3, rpm: 100}\n      - {upstream: d1, weight: 1, rpm: 100}\n";
    let (gateway, backend, _) = pool_gateway(&sims, 5_000, models).await;
    for _ in 0..8 {
        let (status, _, body) = post(&client(), gateway, "/v1/chat/completions", call(false)).await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(rpm_in_use(&backend, "d0", "gpt-4o-ptu").await, 6);
    assert_eq!(rpm_in_use(&backend, "d1", "gpt-4o").await, 2);
}

#[tokio::test]
async fn a_higher_priority_is_used_only_once_the_lower_is_full_and_then_the_pool_answers_429() {
    let sims = [start_deployment(0).await, start_deployment(0).await];
    // The spillover deployment listed first: the order is by priority, not by listing.
    let models = "  - name: gpt-4o\n    max_output_tokens_default: 16\n    deployments:\n      - {upstream: d1, priority: 1, rpm: 2}\n      - {upstream: d0, model: gpt-4o-ptu, rpm: 2}\n";
    let (gateway, backend, _) = pool_gateway(&sims, 5_000, models).await;
    let mut served = Vec::new();
    for _ in 0..4 {
        let (status, headers, body) = post(&client(), gateway, "/v1/chat/completions", call(false)).await;
        assert_eq!(status, 200, "{body}");
        served.push(headers["x-ratelimit-deployment"].to_str().unwrap().to_owned());
    }
    assert_eq!(served, ["d0", "d0", "d1", "d1"], "spillover: d1 only once d0 is full");
    // The whole pool is full: the 429 of today, with the earliest hint of the pool.
    let (status, headers, body) = post(&client(), gateway, "/v1/chat/completions", call(false)).await;
    assert_eq!(status, 429, "{body}");
    let hint: u64 = headers["retry-after-ms"].to_str().unwrap().parse().unwrap();
    assert!(hint > 50_000 && hint <= 61_000, "the minute's window: {hint}");
    assert_eq!(rpm_in_use(&backend, "d0", "gpt-4o-ptu").await, 2);
}

#[tokio::test]
async fn a_call_too_big_for_one_deployment_goes_to_one_it_fits_and_one_it_fits_nowhere_is_400() {
    let sims = [start_deployment(0).await, start_deployment(0).await];
    let models = "  - name: gpt-4o\n    routing: ordered\n    max_output_tokens_default: 16\n    deployments:\n      - {upstream: d0, model: gpt-4o-ptu, tpm: 100}\n      - {upstream: d1, tpm: 1000}\n";
    let (gateway, _, _) = pool_gateway(&sims, 5_000, models).await;
    let mut big = call(false);
    big["max_tokens"] = json!(500);
    let (status, headers, body) = post(&client(), gateway, "/v1/chat/completions", big.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(headers["x-ratelimit-deployment"], "d1");
    big["max_tokens"] = json!(5_000);
    let (status, _, body) = post(&client(), gateway, "/v1/chat/completions", big).await;
    assert_eq!(status, 400, "fits no deployment even empty: {body}");
}

#[tokio::test]
async fn the_model_is_rewritten_for_each_deployment_and_the_answer_keeps_the_upstreams() {
    // The simulators serve `gpt-4o-ptu` only for d0: without the rewrite d0 answers 404.
    let sims = [start_deployment(0).await, start_deployment(0).await];
    let (gateway, backend, _) = pool_gateway(&sims, 5_000, &two("ordered", 10, 0, "")).await;
    let (status, headers, body) = post(&client(), gateway, "/v1/chat/completions", call(false)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(headers["x-ratelimit-deployment"], "d0");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["model"], "gpt-4o-ptu", "the upstream's answer, unchanged");
    let used = answer["usage"]["total_tokens"].as_u64().unwrap();
    eventually_in_use(&backend, "global:llm:d0:gpt-4o-ptu:tpm", used).await;
}

/// Fails d0 with `fault` (or no connection at all when `None`), then checks that
/// the call (stream or not) is served by d1, d0's lease settled by `d0_tokens_kept`,
/// and the tenant's daily tokens charged d1's call, plus d0's worst case when d0
/// was sent the call (a try sent is a try charged).
async fn fails_over(fault: Option<Value>, stream: bool, d0_tokens_kept: bool, timeout_ms: u64) {
    let live = [start_deployment(0).await, start_deployment(0).await];
    let sims = match fault {
        // A port nobody listens on: the connection is refused.
        None => [SocketAddr::from(([127, 0, 0, 1], 9)), live[1]],
        Some(_) => live,
    };
    if let Some(fault) = &fault {
        arm(sims[0], fault.clone()).await;
    }
    let (gateway, backend, metrics) = pool_gateway(&sims, timeout_ms, &two("ordered", 10, 0, "")).await;
    let (status, headers, body) = post(&client(), gateway, "/v1/chat/completions", call(stream)).await;
    assert_eq!(status, 200, "{fault:?}: {body}");
    assert_eq!(headers["x-ratelimit-deployment"], "d1");
    if stream {
        assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    }
    assert_eq!(sim_calls(sims[1]).await, 1);
    let served = OUTPUT_BOUND + 3; // d1's reservation before its usage is known
    let d0_tpm = in_use(&backend, "global:llm:d0:gpt-4o-ptu:tpm").await;
    if d0_tokens_kept {
        assert!(d0_tpm >= served - 1, "a 5xx or a timeout keeps d0's tokens: {d0_tpm}");
    } else {
        assert_eq!(d0_tpm, 0, "a refused call gives d0's tokens back");
    }
    assert_eq!(
        rpm_in_use(&backend, "d0", "gpt-4o-ptu").await.min(1),
        1,
        "the request stays on d0's rpm"
    );
    // The tenant is charged d1's call, and d0's worst case when d0 had the call.
    let d1_tpm = {
        let mut tokens = 0;
        for _ in 0..200 {
            tokens = in_use(&backend, "global:llm:d1:gpt-4o:tpm").await;
            if tokens < served {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokens
    };
    eventually_in_use(&backend, "tenant:acme:llm:daily_tokens", d1_tpm + d0_tpm).await;
    let deployments = metrics.deployments_json();
    assert_eq!(deployments[0]["failed_over"], 1, "{deployments}");
    assert_eq!(deployments[1]["admitted"], 1, "{deployments}");
}

#[tokio::test]
async fn a_429_fails_over_non_stream_and_stream() {
    let fault = json!({"mode": "status", "status": 429, "retry_after_ms": 5000, "count": 1});
    fails_over(Some(fault.clone()), false, false, 5_000).await;
    fails_over(Some(fault), true, false, 5_000).await;
}

#[tokio::test]
async fn a_500_fails_over_non_stream_and_stream() {
    let fault = json!({"mode": "status", "status": 500, "count": 1});
    fails_over(Some(fault.clone()), false, true, 5_000).await;
    fails_over(Some(fault), true, true, 5_000).await;
}

#[tokio::test]
async fn a_refused_connection_fails_over() {
    fails_over(None, false, false, 5_000).await;
    fails_over(None, true, false, 5_000).await;
}

#[tokio::test]
async fn a_timeout_fails_over_non_stream_and_stream() {
    let fault = json!({"mode": "hang", "count": 1});
    fails_over(Some(fault.clone()), false, true, 500).await;
    fails_over(Some(fault), true, true, 500).await;
}

#[tokio::test]
async fn a_paused_deployment_gets_no_call_until_its_pause_ends() {
    let sims = [start_deployment(0).await, start_deployment(0).await];
    arm(
        sims[0],
        json!({"mode": "status", "status": 429, "retry_after_ms": 60000, "count": 1}),
    )
    .await;
    let (gateway, _, metrics) = pool_gateway(&sims, 5_000, &two("ordered", 10, 0, "")).await;
    for _ in 0..4 {
        let (status, headers, body) = post(&client(), gateway, "/v1/chat/completions", call(false)).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(headers["x-ratelimit-deployment"], "d1");
    }
    assert_eq!(sim_calls(sims[0]).await, 1, "only the call that got the 429");
    let deployments = metrics.deployments_json();
    assert!(
        deployments[0]["paused_until_unix_ms"].as_u64().is_some(),
        "{deployments}"
    );
}

#[tokio::test]
async fn no_failover_after_the_first_byte_reached_the_client() {
    // d0 writes a token per 50 ms: its answer's head and first events leave before the cut.
    let sims = [start_deployment(50).await, start_deployment(0).await];
    arm(sims[0], json!({"mode": "drop", "after_events": 2, "count": 1})).await;
    let (gateway, _, _) = pool_gateway(&sims, 5_000, &two("ordered", 10, 0, "")).await;
    let response = open(&client(), gateway, &call(true)).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-ratelimit-deployment"], "d0");
    let body = response.into_body().collect().await;
    if let Ok(body) = body {
        let text = String::from_utf8_lossy(&body.to_bytes()).into_owned();
        assert!(!text.contains("[DONE]"), "the stream was cut: {text}");
    }
    assert_eq!(sim_calls(sims[1]).await, 0, "the client had bytes: never retried");
}

#[tokio::test]
async fn every_deployment_failing_answers_the_last_error_each_tried_once() {
    let sims = [start_deployment(0).await, start_deployment(0).await];
    arm(sims[0], json!({"mode": "status", "status": 500, "count": 1})).await;
    arm(sims[1], json!({"mode": "status", "status": 503, "count": 1})).await;
    let (gateway, _, _) = pool_gateway(&sims, 5_000, &two("ordered", 10, 0, "")).await;
    let (status, headers, body) = post(&client(), gateway, "/v1/chat/completions", call(false)).await;
    assert_eq!(status, 503, "the last deployment's answer: {body}");
    assert_eq!(headers["x-ratelimit-deployment"], "d1");
    assert_eq!((sim_calls(sims[0]).await, sim_calls(sims[1]).await), (1, 1));
}

#[tokio::test]
async fn the_breaker_opens_after_failures_in_a_row_then_half_opens_on_the_gateways_clock_and_a_probe_closes_it() {
    let sims = [start_deployment(0).await, start_deployment(0).await];
    arm(sims[0], json!({"mode": "status", "status": 500, "count": 2})).await;
    // Open for a minute: on the wall clock it would stay open for the whole test.
    let breaker = "    breaker: {failures: 2, open_ms: 60000}\n";
    let (gateway, metrics, clock) = pool_gateway_on_fake_clock(&sims, &two("ordered", 100, 0, breaker)).await;
    for _ in 0..4 {
        let (status, _, body) = post(&client(), gateway, "/v1/chat/completions", call(false)).await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(
        sim_calls(sims[0]).await,
        2,
        "open after two failures: no call while open"
    );
    assert_eq!(metrics.deployments_json()[0]["breaker"], "open");
    let mut text = String::new();
    metrics.render(&mut text);
    assert!(
        text.contains("ratelimiterd_gateway_deployment_breaker_open{model=\"gpt-4o\",upstream=\"d0\",upstream_model=\"gpt-4o-ptu\"} 1"),
        "{text}"
    );
    clock.advance_ms(59_999);
    let (status, headers, _) = post(&client(), gateway, "/v1/chat/completions", call(false)).await;
    assert_eq!(
        (status.as_u16(), headers["x-ratelimit-deployment"].to_str().unwrap()),
        (200, "d1"),
        "a ms before its time the breaker is still open"
    );
    assert_eq!(metrics.deployments_json()[0]["breaker"], "open");
    clock.advance_ms(1);
    assert_eq!(metrics.deployments_json()[0]["breaker"], "half_open");
    // The probe (the fault is spent) succeeds and closes the breaker.
    let (status, headers, _) = post(&client(), gateway, "/v1/chat/completions", call(false)).await;
    assert_eq!(
        (status.as_u16(), headers["x-ratelimit-deployment"].to_str().unwrap()),
        (200, "d0")
    );
    assert_eq!(metrics.deployments_json()[0]["breaker"], "closed");
    assert_eq!(
        sim_calls(sims[0]).await,
        3,
        "the probe was the one call sent while not closed"
    );
}

#[tokio::test]
async fn a_waiting_call_is_admitted_by_capacity_freed_on_any_deployment() {
    // 150 ms per output token: each call holds its deployment's one slot ~0.6 s.
    let sims = [start_deployment(150).await, start_deployment(150).await];
    let models = "  - name: gpt-4o\n    max_output_tokens_default: 16\n    max_wait_ms: 10000\n    deployments:\n      - {upstream: d0, model: gpt-4o-ptu, concurrency: 1}\n      - {upstream: d1, concurrency: 1}\n";
    let (gateway, _, metrics) = pool_gateway(&sims, 5_000, models).await;
    let calls = (0..3).map(|_| async move { post(&client(), gateway, "/v1/chat/completions", call(false)).await });
    let answers = futures_util::future::join_all(calls).await;
    for (status, _, body) in &answers {
        assert_eq!(*status, 200, "{body}");
    }
    let deployments = metrics.deployments_json();
    let admitted = deployments[0]["admitted"].as_u64().unwrap() + deployments[1]["admitted"].as_u64().unwrap();
    assert_eq!(admitted, 3, "{deployments}");
}

#[tokio::test]
async fn with_every_breaker_open_a_call_gets_a_502_with_the_time_to_the_first_probe() {
    let sims = [start_deployment(0).await, start_deployment(0).await];
    for sim in sims {
        arm(sim, json!({"mode": "status", "status": 500, "count": 1})).await;
    }
    let breaker = "    breaker: {failures: 1, open_ms: 20000}\n";
    let (gateway, metrics, clock) = pool_gateway_on_fake_clock(&sims, &two("ordered", 100, 0, breaker)).await;
    let (status, _, body) = post(&client(), gateway, "/v1/chat/completions", call(false)).await;
    assert_eq!(status, 500, "the last deployment's error: {body}");
    let deployments = metrics.deployments_json();
    assert_eq!(
        (deployments[0]["breaker"].as_str(), deployments[1]["breaker"].as_str()),
        (Some("open"), Some("open"))
    );
    let (status, headers, body) = post(&client(), gateway, "/v1/chat/completions", call(false)).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(headers["retry-after-ms"], "20000", "the whole open time: {body}");
    clock.advance_ms(5_000);
    let (status, headers, body) = post(&client(), gateway, "/v1/chat/completions", call(false)).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(
        headers["retry-after-ms"], "15000",
        "counted down on the gateway's clock"
    );
    assert_eq!(
        (sim_calls(sims[0]).await, sim_calls(sims[1]).await),
        (1, 1),
        "no call while open"
    );
}

#[tokio::test]
async fn refused_credentials_fail_over_count_on_the_breaker_and_the_last_is_a_502() {
    let sims = [start_deployment(0).await, start_deployment(0).await];
    arm(sims[0], json!({"mode": "status", "status": 401, "count": 1})).await;
    let breaker = "    breaker: {failures: 1, open_ms: 20000}\n";
    let (gateway, backend, metrics) = pool_gateway(&sims, 5_000, &two("ordered", 100, 0, breaker)).await;
    let (status, headers, body) = post(&client(), gateway, "/v1/chat/completions", call(false)).await;
    assert_eq!(status, 200, "d0's key refused: the call goes on to d1: {body}");
    assert_eq!(headers["x-ratelimit-deployment"], "d1");
    let deployments = metrics.deployments_json();
    assert_eq!(deployments[0]["failed_over"], 1, "{deployments}");
    assert_eq!(
        deployments[0]["breaker"], "open",
        "a refused key is that deployment's failure: {deployments}"
    );
    assert_eq!(
        in_use(&backend, "global:llm:d0:gpt-4o-ptu:tpm").await,
        0,
        "nothing was served: d0's tokens back"
    );
    // d1's key refused too, d0's breaker open: no deployment left, the 502 of a refused key.
    arm(sims[1], json!({"mode": "status", "status": 403, "count": 1})).await;
    let (status, headers, body) = post(&client(), gateway, "/v1/chat/completions", call(false)).await;
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("refused the gateway's upstream credentials"), "{body}");
    assert_eq!(headers["x-ratelimit-deployment"], "d1");
    assert_eq!((sim_calls(sims[0]).await, sim_calls(sims[1]).await), (1, 2));
}

#[tokio::test]
async fn the_console_status_lists_a_pools_deployments_with_share_pause_and_breaker() {
    let sims = [start_deployment(0).await, start_deployment(0).await];
    arm(
        sims[0],
        json!({"mode": "status", "status": 429, "retry_after_ms": 60000, "count": 1}),
    )
    .await;
    std::env::set_var("GATEWAY_POOL_ACME_KEY", TENANT_KEY);
    let upstreams: String = (sims.iter().enumerate())
        .map(|(i, addr)| format!("  - {{name: d{i}, kind: openai-compatible, base_url: \"http://{addr}\"}}\n"))
        .collect();
    let models = two("ordered", 10, 0, "");
    let yaml = format!(
        "listen_addr: \"127.0.0.1:0\"\nupstreams:\n{upstreams}models:\n{models}  - {{name: solo, upstream: d1, rpm: 5, max_output_tokens_default: 16}}\ntenants:\n  - {{name: acme, api_key_env: GATEWAY_POOL_ACME_KEY}}\n"
    );
    let config: gateway::GatewayConfig = serde_yaml::from_str(&yaml).unwrap();
    let backend = memory_backend();
    let shared = Arc::new(gateway::Gateway::new(&config, backend.clone()).unwrap());
    for definition in shared.definitions() {
        backend.apply_definition(definition).await.unwrap();
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = gateway::router(shared.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    for _ in 0..3 {
        let (status, _, body) = post(&client(), addr, "/v1/chat/completions", call(false)).await;
        assert_eq!(status, 200, "{body}");
    }
    let status = shared.status();
    let pool = &status[0];
    assert_eq!((pool.name.as_str(), pool.upstream.as_str()), ("gpt-4o", "d0, d1"));
    let names: Vec<&str> = pool.deployments.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["d0/gpt-4o-ptu", "d1/gpt-4o"]);
    // d0 took the first call (its 429 paused it), d1 the three served.
    assert_eq!(pool.deployments[0].share, Some(0.25));
    assert_eq!(pool.deployments[1].share, Some(0.75));
    assert!(pool.deployments[0].paused_ms_left.is_some_and(|ms| ms > 50_000));
    assert_eq!(pool.deployments[1].paused_ms_left, None);
    assert_eq!(pool.deployments[1].breaker.as_deref(), Some("closed"));
    assert!(!pool.is_paused(), "d1 still takes calls");
    // A single-deployment model lists none.
    assert_eq!((status[1].upstream.as_str(), status[1].deployments.len()), ("d1", 0));
}

#[tokio::test]
async fn a_probe_whose_client_left_is_given_back_and_the_next_call_probes() {
    let sims = [start_deployment(0).await, start_deployment(0).await];
    arm(sims[0], json!({"mode": "status", "status": 500, "count": 1})).await;
    let breaker = "    breaker: {failures: 1, open_ms: 300}\n";
    let (gateway, metrics, clock) = pool_gateway_on_fake_clock(&sims, &two("ordered", 100, 0, breaker)).await;
    let (status, headers, body) = post(&client(), gateway, "/v1/chat/completions", call(false)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(headers["x-ratelimit-deployment"], "d1");
    assert_eq!(metrics.deployments_json()[0]["breaker"], "open");
    clock.advance_ms(300);
    // The half-open breaker's one probe goes to d0, which hangs; its client leaves.
    arm(sims[0], json!({"mode": "hang", "count": 1})).await;
    let gone = tokio::spawn(async move { post(&client(), gateway, "/v1/chat/completions", call(false)).await });
    for _ in 0..200 {
        if sim_calls(sims[0]).await == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(sim_calls(sims[0]).await, 2, "the probe reached d0");
    gone.abort();
    // Its lease completes, and its probe, never answered, is given back.
    let mut served_by = String::new();
    for _ in 0..100 {
        let (status, headers, body) = post(&client(), gateway, "/v1/chat/completions", call(false)).await;
        assert_eq!(status, 200, "{body}");
        served_by = headers["x-ratelimit-deployment"].to_str().unwrap().to_owned();
        if served_by == "d0" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(served_by, "d0", "the next call probes d0 and is served there");
    assert_eq!(metrics.deployments_json()[0]["breaker"], "closed");
}
