//! The gateway served by the real `ratelimiterd` binary, in front of the provider
//! simulator (`replay::sim::server`): its limits are ordinary registry
//! definitions the admin API shows and changes, its calls are reconciled to the
//! simulator's usage, its metrics are in `/metrics`; and, with TigerBeetle, two
//! servers on one cluster are gateways that share one limit.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use replay::sim::limits::ProviderLimits;
use replay::sim::server::ProviderServer;
use serde_json::{json, Value};
use support::gateway_setup::{client, gateway_addr, send, sim_limits, start_sim_with, Answer, HttpClient};
use support::{temp_dir, BackendConfig, Daemon, ADMIN_TOKEN, WAIT_MAX};

/// The tenant's gateway key (from the environment, as the configuration says).
const TENANT_KEY: &str = "gateway-fleet-test-key-0123456789";
/// How often a poll asks again.
const POLL: Duration = Duration::from_millis(20);

/// The simulator on a free loopback port; `ms_per_output_token` paces streams.
async fn start_paced_sim(concurrency: u64, ms_per_output_token: u64) -> (SocketAddr, Arc<ProviderServer>) {
    start_sim_with(ProviderLimits {
        concurrency,
        ms_per_output_token,
        ..sim_limits()
    })
    .await
}

/// The `gateway:` section in front of the simulator at `sim`.
fn gateway_section(sim: SocketAddr, concurrency: u64) -> String {
    std::env::set_var("GATEWAY_FLEET_TEST_KEY", TENANT_KEY);
    format!(
        "gateway:\n  listen_addr: \"127.0.0.1:0\"\n  upstreams:\n    - {{name: sim, kind: openai, base_url: \"http://{sim}\"}}\n    - {{name: simanthropic, kind: anthropic, base_url: \"http://{sim}\"}}\n  models:\n    - {{name: gpt-4o-mini, upstream: sim, rpm: 1000, tpm: 1000000, concurrency: {concurrency}, max_output_tokens_default: 256}}\n    - {{name: claude-sonnet-4-5, upstream: simanthropic, rpm: 1000, input_tpm: 100000, output_tpm: 100000, concurrency: 8, max_output_tokens_default: 256}}\n  tenants:\n    - {{name: acme, api_key_env: GATEWAY_FLEET_TEST_KEY, daily_tokens: 1000000}}\n"
    )
}

async fn chat(client: &HttpClient, gateway: SocketAddr, body: Value) -> Answer {
    let bearer = format!("Bearer {TENANT_KEY}");
    let url = format!("http://{gateway}/v1/chat/completions");
    send(
        client,
        hyper::Method::POST,
        url,
        &[("authorization", &bearer)],
        Some(body),
    )
    .await
}

async fn admin_report(client: &HttpClient, server: SocketAddr, key: &str) -> Value {
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let url = format!("http://{server}/v1/admin/limits/{key}");
    let answer = send(client, hyper::Method::GET, url, &[("authorization", &bearer)], None).await;
    assert_eq!(answer.status, 200, "{key}: {}", answer.body);
    serde_json::from_str(&answer.body).unwrap()
}

/// Polls (bounded) until `key` holds `expected` on `server`.
async fn eventually_in_use(client: &HttpClient, server: SocketAddr, key: &str, expected: u64) {
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        let report = admin_report(client, server, key).await;
        if report["in_use"] == json!(expected) {
            return;
        }
        assert!(Instant::now() < deadline, "{key}: {report} never held {expected}");
        tokio::time::sleep(POLL).await;
    }
}

fn usage_total(answer: &Answer) -> u64 {
    let body: Value = serde_json::from_str(&answer.body).unwrap();
    body["usage"]["total_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no usage in {body}"))
}

#[tokio::test]
async fn the_gateway_serves_beside_the_limiter_api_on_the_same_backend() {
    let (sim, _) = start_paced_sim(64, 0).await;
    let dir = temp_dir("gateway-memory");
    let daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", &gateway_section(sim, 4));
    let gateway = gateway_addr(&daemon);
    let client = client();
    let tpm = "global:llm:sim:gpt-4o-mini:tpm";
    // The configuration's limits are ordinary definitions.
    let report = admin_report(&client, daemon.addr, tpm).await;
    assert_eq!(report["capacity"], 1_000_000, "{report}");
    let body =
        json!({"model": "gpt-4o-mini", "max_tokens": 30, "messages": [{"role": "user", "content": "Hello there"}]});
    let first = chat(&client, gateway, body.clone()).await;
    assert_eq!(first.status, 200, "{}", first.body);
    // The provider's rate-limit headers are passed through.
    assert!(
        first.headers.contains_key("x-ratelimit-remaining-requests"),
        "{:?}",
        first.headers
    );
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let second = chat(&client, gateway, streamed).await;
    assert_eq!(second.status, 200, "{}", second.body);
    let usage_line = second
        .body
        .split("\n\n")
        .find(|e| e.contains("\"total_tokens\""))
        .expect("usage chunk");
    let streamed_usage: Value = serde_json::from_str(usage_line.trim_start_matches("data: ")).unwrap();
    let total = usage_total(&first) + streamed_usage["usage"]["total_tokens"].as_u64().unwrap();
    // Reconciled to the simulator's usage, to the token, on the model and the tenant.
    eventually_in_use(&client, daemon.addr, tpm, total).await;
    eventually_in_use(&client, daemon.addr, "tenant:acme:llm:daily_tokens", total).await;
    eventually_in_use(&client, daemon.addr, "global:llm:sim:gpt-4o-mini:concurrency", 0).await;
    // Anthropic, streamed: input and output on their own limits.
    let anthropic = send(
        &client,
        hyper::Method::POST,
        format!("http://{gateway}/v1/messages"),
        &[("x-api-key", TENANT_KEY), ("anthropic-version", "2023-06-01")],
        Some(json!({"model": "claude-sonnet-4-5", "max_tokens": 16, "stream": true,
            "messages": [{"role": "user", "content": "Hello there, Claude"}]})),
    )
    .await;
    assert_eq!(anthropic.status, 200, "{}", anthropic.body);
    let start = anthropic
        .body
        .split("\n\n")
        .find(|e| e.contains("message_start"))
        .unwrap();
    let start: Value = serde_json::from_str(start.split("data: ").nth(1).unwrap()).unwrap();
    let input = start["message"]["usage"]["input_tokens"].as_u64().unwrap();
    eventually_in_use(
        &client,
        daemon.addr,
        "global:llm:simanthropic:claude-sonnet-4-5:input_tpm",
        input,
    )
    .await;
    // The server's metrics include the gateway's.
    let metrics = send(
        &client,
        hyper::Method::GET,
        format!("http://{}/metrics", daemon.addr),
        &[],
        None,
    )
    .await;
    assert!(
        metrics
            .body
            .contains("ratelimiterd_gateway_admitted_total{model=\"gpt-4o-mini\",tenant=\"acme\"} 2"),
        "{}",
        metrics.body
    );
    // The provider's remaining capacity, from its rate-limit headers.
    assert!(
        metrics
            .body
            .contains("ratelimiterd_gateway_provider_remaining_requests{model=\"gpt-4o-mini\"}"),
        "{}",
        metrics.body
    );
    // A change through the admin API applies to the gateway's next call.
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let put = send(
        &client,
        hyper::Method::PUT,
        format!("http://{}/v1/admin/limits", daemon.addr),
        &[("authorization", &bearer)],
        Some(
            json!({"key": "global:llm:sim:gpt-4o-mini:rpm", "kind": "rolling", "capacity": 2000, "window_seconds": 60}),
        ),
    )
    .await;
    assert_eq!(put.status, 200, "{}", put.body);
    let report = admin_report(&client, daemon.addr, "global:llm:sim:gpt-4o-mini:rpm").await;
    assert_eq!(report["capacity"], 2000);
}

/// The key of the interactive tenant of [`classes_section`]; the batch tenant is acme.
const WEB_KEY: &str = "gateway-fleet-test-web-0123456789";
/// The batch class's ceiling over [`classes_section`]'s rpm.
const BATCH_RPM_CEILING: &str = "class:batch:global:llm:sim:gpt-4o-mini:rpm";

/// A `gateway:` section with two classes (interactive keeps 20 % of each model
/// limit as headroom), acme in batch and web in interactive, on a model of `rpm`.
fn classes_section(sim: SocketAddr, rpm: u64) -> String {
    std::env::set_var("GATEWAY_FLEET_TEST_KEY", TENANT_KEY);
    std::env::set_var("GATEWAY_FLEET_TEST_WEB_KEY", WEB_KEY);
    format!(
        "gateway:\n  listen_addr: \"127.0.0.1:0\"\n  upstreams:\n    - {{name: sim, kind: openai, base_url: \"http://{sim}\"}}\n  models:\n    - {{name: gpt-4o-mini, upstream: sim, rpm: {rpm}, tpm: 1000000, concurrency: 8}}\n  classes:\n    - {{name: interactive, share: 4, headroom: 0.2}}\n    - {{name: batch}}\n  tenants:\n    - {{name: acme, api_key_env: GATEWAY_FLEET_TEST_KEY, class: batch}}\n    - {{name: web, api_key_env: GATEWAY_FLEET_TEST_WEB_KEY, class: interactive}}\n"
    )
}

/// A short chat call with `key`.
async fn chat_with(client: &HttpClient, gateway: SocketAddr, key: &str) -> Answer {
    let bearer = format!("Bearer {key}");
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 5, "sim_output_tokens": 5,
        "messages": [{"role": "user", "content": "Hi"}]});
    let url = format!("http://{gateway}/v1/chat/completions");
    send(
        client,
        hyper::Method::POST,
        url,
        &[("authorization", &bearer)],
        Some(body),
    )
    .await
}

/// PUTs `definition` through the admin API.
async fn admin_put(client: &HttpClient, server: SocketAddr, definition: Value) -> Answer {
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let url = format!("http://{server}/v1/admin/limits");
    send(
        client,
        hyper::Method::PUT,
        url,
        &[("authorization", &bearer)],
        Some(definition),
    )
    .await
}

#[tokio::test]
async fn class_ceilings_follow_an_admin_change_of_their_model_limit() {
    let (sim, _) = start_paced_sim(64, 0).await;
    let dir = temp_dir("gateway-classes");
    let daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", &classes_section(sim, 1000));
    let gateway = gateway_addr(&daemon);
    let client = client();
    assert_eq!(
        admin_report(&client, daemon.addr, BATCH_RPM_CEILING).await["capacity"],
        800
    );
    let rpm = |capacity: u64| json!({"key": "global:llm:sim:gpt-4o-mini:rpm", "kind": "rolling", "capacity": capacity, "window_seconds": 60});
    let put = admin_put(&client, daemon.addr, rpm(2000)).await;
    assert_eq!(put.status, 200, "{}", put.body);
    assert_eq!(
        admin_report(&client, daemon.addr, BATCH_RPM_CEILING).await["capacity"],
        1600
    );
    // A capacity whose ceiling would hold nothing is refused, and changes nothing.
    let slot = json!({"key": "global:llm:sim:gpt-4o-mini:concurrency", "kind": "concurrency", "capacity": 1, "timeout_seconds": 660});
    let refused = admin_put(&client, daemon.addr, slot).await;
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert!(refused.body.contains("batch"), "{}", refused.body);
    let concurrency = admin_report(&client, daemon.addr, "global:llm:sim:gpt-4o-mini:concurrency").await;
    assert_eq!(concurrency["capacity"], 8, "{concurrency}");
    // The admin API shows the calls per model and class.
    assert_eq!(chat_with(&client, gateway, TENANT_KEY).await.status, 200);
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let url = format!("http://{}/v1/admin/gateway/classes", daemon.addr);
    let classes = send(&client, hyper::Method::GET, url, &[("authorization", &bearer)], None).await;
    assert_eq!(classes.status, 200, "{}", classes.body);
    let classes: Value = serde_json::from_str(&classes.body).unwrap();
    assert_eq!(classes[0]["class"], "batch", "{classes}");
    assert_eq!(classes[0]["admitted"], 1, "{classes}");
}

/// A tenant's budget in money is a limit like any other: the admin API shows it
/// in micro-dollars; a configured tenant's changes through `PUT
/// /v1/admin/limits` as long as it keeps the span its key names, and owes as
/// every budget does (docs/gateway.md, "Budgets and spend").
#[tokio::test]
async fn a_budget_in_money_is_shown_by_the_admin_api_and_keeps_its_span() {
    let (sim, _) = start_paced_sim(64, 0).await;
    std::env::set_var("GATEWAY_FLEET_TEST_KEY", TENANT_KEY);
    let section = format!(
        "gateway:\n  listen_addr: \"127.0.0.1:0\"\n  upstreams:\n    - {{name: sim, kind: openai, base_url: \"http://{sim}\"}}\n  models:\n    - {{name: gpt-4o-mini, upstream: sim, rpm: 1000, max_output_tokens_default: 256}}\n  tenants:\n    - {{name: acme, api_key_env: GATEWAY_FLEET_TEST_KEY, budgets: [{{usd: 10, period: month}}]}}\n"
    );
    let dir = temp_dir("gateway-budgets");
    let daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", &section);
    let gateway = gateway_addr(&daemon);
    let client = client();
    let key = "tenant:acme:usd:month";
    let report = admin_report(&client, daemon.addr, key).await;
    assert_eq!(
        (report["capacity"].clone(), report["period"].clone()),
        (json!(10_000_000), json!("month"))
    );
    let answer = chat_with(&client, gateway, TENANT_KEY).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(answer.headers.contains_key("x-ratelimit-remaining-usd"));
    // Charged its billed cost at gpt-4o-mini's list price ($0.15 input, $0.60 output), settled for the month.
    let usage: Value = serde_json::from_str::<Value>(&answer.body).unwrap()["usage"].clone();
    let (prompt, completion) = (
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["completion_tokens"].as_u64().unwrap(),
    );
    let billed = (prompt * 150_000 + completion * 600_000).div_ceil(1_000_000);
    eventually_in_use(&client, daemon.addr, key, billed).await;
    // A budget over another span than its key names is refused, the limit unchanged.
    let put = admin_put(
        &client,
        daemon.addr,
        json!({"key": key, "kind": "rolling", "capacity": 1, "window_seconds": 60}),
    )
    .await;
    assert_eq!(put.status, 400, "{}", put.body);
    assert!(put.body.contains("over the span its key names"), "{}", put.body);
    let report = admin_report(&client, daemon.addr, key).await;
    assert_eq!(report["capacity"], json!(10_000_000), "{report}");
    // Over its month, it changes at runtime, and still owes.
    let put = admin_put(
        &client,
        daemon.addr,
        json!({"key": key, "kind": "rolling", "capacity": 20_000_000, "period": "month"}),
    )
    .await;
    assert_eq!(put.status, 200, "{}", put.body);
    let report = admin_report(&client, daemon.addr, key).await;
    assert_eq!(
        (report["capacity"].clone(), report["overage"].clone()),
        (json!(20_000_000), json!("owe"))
    );
    let served = chat_with(&client, gateway, TENANT_KEY).await;
    assert_eq!(served.status, 200, "{}", served.body);
}

#[cfg(feature = "tigerbeetle")]
mod fleet {
    use super::*;
    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;
    use ratelimiter::tigerbeetle::LocalCluster;

    #[tokio::test]
    async fn two_servers_on_one_cluster_are_gateways_that_share_one_limit() {
        let cluster = LocalCluster::start().expect("starting a local TigerBeetle");
        // 25 ms per output token: a stream of 4,000 tokens outlasts the test, so
        // the slot it holds is held for as long as the test needs, however slow
        // the machine; the client then leaves to end it.
        let (sim, _) = start_paced_sim(64, 25).await;
        let backend = BackendConfig::TigerBeetle {
            addresses: cluster.address(),
            settings: "  sessions: 2\n  request_timeout_ms: 2000\n",
        };
        let (dir_a, dir_b) = (temp_dir("gateway-fleet-a"), temp_dir("gateway-fleet-b"));
        let a = Daemon::start_on(&dir_a, backend, "", &gateway_section(sim, 1));
        let b = Daemon::start_on(&dir_b, backend, "", &gateway_section(sim, 1));
        let (gateway_a, gateway_b) = (gateway_addr(&a), gateway_addr(&b));
        let client = client();
        let concurrency = "global:llm:sim:gpt-4o-mini:concurrency";
        let tpm = "global:llm:sim:gpt-4o-mini:tpm";
        let long = json!({"model": "gpt-4o-mini", "max_tokens": 4000, "sim_output_tokens": 4000, "stream": true,
            "messages": [{"role": "user", "content": "Tell me a long story"}]});
        let bearer = format!("Bearer {TENANT_KEY}");
        let request = hyper::Request::post(format!("http://{gateway_a}/v1/chat/completions"))
            .header("content-type", "application/json")
            .header("authorization", &bearer)
            .body(Full::new(Bytes::from(long.to_string())))
            .unwrap();
        let mut open = client.request(request).await.unwrap();
        assert_eq!(open.status(), 200);
        open.body_mut().frame().await.unwrap().unwrap();
        // A holds the model's one slot: B refuses, since the limit is the cluster's.
        eventually_in_use(&client, b.addr, concurrency, 1).await;
        let short = json!({"model": "gpt-4o-mini", "max_tokens": 5, "sim_output_tokens": 5,
            "messages": [{"role": "user", "content": "Hi"}]});
        let refused = chat(&client, gateway_b, short.clone()).await;
        assert_eq!(refused.status, 429, "{}", refused.body);
        assert_eq!(refused.headers["x-ratelimit-limit-concurrency"], "1");
        let reserved_by_a = admin_report(&client, b.addr, tpm).await["in_use"].as_u64().unwrap();
        assert!(reserved_by_a >= 4000, "{reserved_by_a}");
        // The client leaves mid-stream: A frees the slot at once and keeps the tokens.
        drop(open);
        eventually_in_use(&client, b.addr, concurrency, 0).await;
        let admitted = chat(&client, gateway_b, short).await;
        assert_eq!(admitted.status, 200, "{}", admitted.body);
        // Seen from either server: A's reservation kept, B's call reconciled.
        let total = reserved_by_a + usage_total(&admitted);
        eventually_in_use(&client, a.addr, tpm, total).await;
        eventually_in_use(&client, a.addr, "tenant:acme:llm:daily_tokens", total).await;
    }

    /// A pool of two deployments, each its own simulator, with rpm 3 and 2.
    fn pool_section(sims: [SocketAddr; 2]) -> String {
        std::env::set_var("GATEWAY_FLEET_TEST_KEY", TENANT_KEY);
        format!(
            "gateway:\n  listen_addr: \"127.0.0.1:0\"\n  upstreams:\n    - {{name: east, kind: openai-compatible, base_url: \"http://{}\"}}\n    - {{name: west, kind: openai-compatible, base_url: \"http://{}\"}}\n  models:\n    - name: gpt-4o\n      max_output_tokens_default: 16\n      deployments:\n        - {{upstream: east, model: gpt-4o-mini, rpm: 3}}\n        - {{upstream: west, rpm: 2}}\n  tenants:\n    - {{name: acme, api_key_env: GATEWAY_FLEET_TEST_KEY, daily_tokens: 1000000}}\n",
            sims[0], sims[1]
        )
    }

    #[tokio::test]
    async fn two_servers_on_one_cluster_share_a_pools_deployments() {
        let cluster = LocalCluster::start().expect("starting a local TigerBeetle");
        let ((east, east_sim), (west, west_sim)) = (start_paced_sim(64, 0).await, start_paced_sim(64, 0).await);
        let backend = BackendConfig::TigerBeetle {
            addresses: cluster.address(),
            settings: "  sessions: 2\n  request_timeout_ms: 2000\n",
        };
        let (dir_a, dir_b) = (temp_dir("gateway-pool-a"), temp_dir("gateway-pool-b"));
        let a = Daemon::start_on(&dir_a, backend, "", &pool_section([east, west]));
        let b = Daemon::start_on(&dir_b, backend, "", &pool_section([east, west]));
        let gateways = [gateway_addr(&a), gateway_addr(&b)];
        let client = client();
        let call = json!({"model": "gpt-4o", "max_tokens": 5, "sim_output_tokens": 5,
            "messages": [{"role": "user", "content": "Hi"}]});
        let mut served = Vec::new();
        for i in 0..10 {
            let answer = chat(&client, gateways[i % 2], call.clone()).await;
            match answer.status {
                200 => served.push(answer.headers["x-ratelimit-deployment"].to_str().unwrap().to_owned()),
                429 => {}
                other => panic!("{other}: {}", answer.body),
            }
        }
        // The pool's summed rpm, 3 + 2, whichever server took the call; never past one
        // deployment's own: the reservation on the cluster is the check.
        served.sort();
        assert_eq!(served, ["east", "east", "east", "west", "west"]);
        assert_eq!((east_sim.counts().admitted, west_sim.counts().admitted), (3, 2));
        assert_eq!(east_sim.counts().throttled, 0, "no provider 429");
        eventually_in_use(&client, a.addr, "global:llm:east:gpt-4o-mini:rpm", 3).await;
        eventually_in_use(&client, b.addr, "global:llm:west:gpt-4o:rpm", 2).await;
        // Each server shows its own deployments' counters in the admin API.
        let bearer = format!("Bearer {ADMIN_TOKEN}");
        let mut admitted = 0;
        for server in [a.addr, b.addr] {
            let url = format!("http://{server}/v1/admin/gateway/deployments");
            let answer = send(&client, hyper::Method::GET, url, &[("authorization", &bearer)], None).await;
            assert_eq!(answer.status, 200, "{}", answer.body);
            let deployments: Value = serde_json::from_str(&answer.body).unwrap();
            assert_eq!(deployments[0]["upstream"], "east");
            assert_eq!(deployments[1]["upstream_model"], "gpt-4o");
            admitted += deployments[0]["admitted"].as_u64().unwrap() + deployments[1]["admitted"].as_u64().unwrap();
        }
        assert_eq!(admitted, 5);
    }

    /// Classes on a fleet: the batch tenant calls both servers and together they
    /// admit its ceiling and no more; the interactive tenant then gets the headroom.
    #[tokio::test]
    async fn two_servers_on_one_cluster_keep_the_headroom_of_a_class() {
        let cluster = LocalCluster::start().expect("starting a local TigerBeetle");
        let (sim, _) = start_paced_sim(64, 0).await;
        let backend = BackendConfig::TigerBeetle {
            addresses: cluster.address(),
            settings: "  sessions: 2\n  request_timeout_ms: 2000\n",
        };
        let (dir_a, dir_b) = (temp_dir("gateway-classes-a"), temp_dir("gateway-classes-b"));
        let a = Daemon::start_on(&dir_a, backend, "", &classes_section(sim, 10));
        let b = Daemon::start_on(&dir_b, backend, "", &classes_section(sim, 10));
        let gateways = [gateway_addr(&a), gateway_addr(&b)];
        let client = client();
        let mut batch_admitted = 0;
        for i in 0..12 {
            let answer = chat_with(&client, gateways[i % 2], TENANT_KEY).await;
            match answer.status {
                200 => batch_admitted += 1,
                429 => assert!(answer.body.contains(BATCH_RPM_CEILING), "{}", answer.body),
                other => panic!("batch call answered {other}: {}", answer.body),
            }
        }
        assert_eq!(
            batch_admitted, 8,
            "the fleet admits the batch ceiling, 80 % of 10, and no more"
        );
        for i in 0..2 {
            let answer = chat_with(&client, gateways[i % 2], WEB_KEY).await;
            assert_eq!(answer.status, 200, "the headroom is interactive's: {}", answer.body);
        }
        assert_eq!(chat_with(&client, gateways[0], WEB_KEY).await.status, 429);
    }
}
