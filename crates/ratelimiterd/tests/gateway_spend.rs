//! The gateway's spend ledger through the real `ratelimiterd` binary in front of
//! the provider simulator (docs/gateway.md, "The spend ledger"): every completed
//! call is recorded with its tenant, key, model, deployment, tokens and billed
//! cost; `GET /v1/admin/gateway/spend` reports it grouped, in JSON and CSV, with
//! today as the default and a 400 naming each bad parameter; `ratelimiterd
//! spend` prints the same; `/metrics` counts it by tenant, model and
//! deployment; a memory server killed with SIGKILL keeps it; and, on
//! TigerBeetle, two servers of one cluster report the same fleet-wide sums.

mod support;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use ratelimiter::price::{billed_micro_usd, list_price, Usage};
use ratelimiter::spend::UtcDay;
use ratelimiter::{Clock, SystemClock};
use serde_json::{json, Value};
use support::gateway_setup::{client, gateway_addr, send, start_sim, Answer, HttpClient};
use support::{temp_dir, BackendConfig, Daemon, ADMIN_TOKEN};

const BIN: &str = env!("CARGO_BIN_EXE_ratelimiterd");
/// The configured tenant's key (from the environment, as the configuration says).
const YAML_KEY: &str = "gateway-spend-test-yaml-key-0123456789";
/// The report's path.
const SPEND: &str = "/v1/admin/gateway/spend";

/// An OpenAI model, an Anthropic model and a self-hosted model without a list
/// price (an OpenAI-compatible server, whose rates the table cannot know), with
/// one configured tenant.
fn gateway_section(sim: SocketAddr) -> String {
    std::env::set_var("GATEWAY_SPEND_TEST_KEY", YAML_KEY);
    format!(
        "gateway:\n  listen_addr: \"127.0.0.1:0\"\n  upstreams:\n    - {{name: sim, kind: openai, base_url: \"http://{sim}\"}}\n    - {{name: simanthropic, kind: anthropic, base_url: \"http://{sim}\"}}\n    - {{name: local, kind: openai-compatible, base_url: \"http://{sim}\"}}\n  models:\n    - {{name: gpt-4o-mini, upstream: sim, rpm: 1000, tpm: 1000000, concurrency: 8, max_output_tokens_default: 64}}\n    - {{name: claude-sonnet-4-5, upstream: simanthropic, rpm: 1000, input_tpm: 100000, output_tpm: 100000, concurrency: 8, max_output_tokens_default: 64}}\n    - {{name: llama-local, max_output_tokens_default: 64, deployments: [{{upstream: local, model: gpt-4o-mini, rpm: 1000, tpm: 1000000, concurrency: 8}}]}}\n  tenants:\n    - {{name: yaml-team, api_key_env: GATEWAY_SPEND_TEST_KEY}}\n"
    )
}

/// An admin GET of `path` on `server`: status and body.
async fn admin_get(client: &HttpClient, server: SocketAddr, path: &str) -> (u16, String) {
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let answer = send(
        client,
        hyper::Method::GET,
        format!("http://{server}{path}"),
        &[("authorization", &bearer)],
        None,
    )
    .await;
    (answer.status, answer.body)
}

/// The JSON report of `query` on `server`.
async fn report(client: &HttpClient, server: SocketAddr, query: &str) -> Value {
    let (status, body) = admin_get(client, server, &format!("{SPEND}{query}")).await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Polls (bounded) until the report of `server` counts `calls` calls in all.
async fn until_calls(client: &HttpClient, server: SocketAddr, calls: u64) -> Value {
    let started = Instant::now();
    loop {
        let totals = report(client, server, "").await;
        if totals["rows"][0]["calls"].as_u64() == Some(calls) {
            return totals;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never {calls} calls: {totals}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What a completed call was billed, from the usage in its answer and the list price.
fn billed(provider: &str, model: &str, answer: &Value) -> u64 {
    let usage = &answer["usage"];
    let number = |field: &str| usage[field].as_u64().unwrap_or(0);
    let usage = Usage {
        input_tokens: number("prompt_tokens") + number("input_tokens"),
        cache_read_tokens: number("cache_read_input_tokens"),
        output_tokens: number("completion_tokens") + number("output_tokens"),
        ..Usage::default()
    };
    billed_micro_usd(&list_price(provider, model).unwrap().price, &usage)
}

/// A chat call of `model` (OpenAI format) with `key`; asserts a 200 and returns the answer.
async fn chat(client: &HttpClient, gateway: SocketAddr, key: &str, model: &str, output_tokens: u64) -> Value {
    let body = json!({"model": model, "max_tokens": 16, "sim_output_tokens": output_tokens,
        "messages": [{"role": "user", "content": "Hi there"}]});
    let bearer = format!("Bearer {key}");
    let Answer { status, body: text, .. } = send(
        client,
        hyper::Method::POST,
        format!("http://{gateway}/v1/chat/completions"),
        &[("authorization", &bearer)],
        Some(body),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

/// A Messages call (Anthropic format) with `key`; asserts a 200 and returns the answer.
async fn message(client: &HttpClient, gateway: SocketAddr, key: &str) -> Value {
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 16, "sim_output_tokens": 7,
        "messages": [{"role": "user", "content": "Hi there"}]});
    let headers = [("x-api-key", key), ("anthropic-version", "2023-06-01")];
    let Answer { status, body: text, .. } = send(
        client,
        hyper::Method::POST,
        format!("http://{gateway}/v1/messages"),
        &headers,
        Some(body),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

/// A tenant of the directory and a key of it: the key's `(id, text)`.
async fn directory_key(client: &HttpClient, server: SocketAddr, tenant: &str) -> (String, String) {
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let auth = [("authorization", bearer.as_str())];
    let url = |path: &str| format!("http://{server}{path}");
    let Answer { status, body: text, .. } = send(
        client,
        hyper::Method::POST,
        url("/v1/admin/gateway/tenants"),
        &auth,
        Some(json!({"name": tenant})),
    )
    .await;
    assert_eq!(status, 201, "{text}");
    let Answer { status, body: text, .. } = send(
        client,
        hyper::Method::POST,
        url("/v1/admin/gateway/keys"),
        &auth,
        Some(json!({"tenant": tenant})),
    )
    .await;
    assert_eq!(status, 201, "{text}");
    let created: Value = serde_json::from_str(&text).unwrap();
    (
        created["id"].as_str().unwrap().to_owned(),
        created["key"].as_str().unwrap().to_owned(),
    )
}

/// `micro_usd` as the report writes dollars.
fn usd(micro_usd: u64) -> String {
    format!("{}.{:06}", micro_usd / 1_000_000, micro_usd % 1_000_000)
}

fn today() -> String {
    UtcDay::of_unix_ms(SystemClock::new().now_unix_ms()).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_groups_every_call_in_json_and_csv_and_refuses_bad_parameters() {
    let sim = start_sim().await;
    let dir = temp_dir("gateway-spend-report");
    let daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", &gateway_section(sim));
    let (gateway, client) = (gateway_addr(&daemon), client());
    let (key_id, key) = directory_key(&client, daemon.addr, "dir-team").await;
    let mut gpt = 0;
    for output_tokens in [3, 9] {
        gpt += billed(
            "openai",
            "gpt-4o-mini",
            &chat(&client, gateway, YAML_KEY, "gpt-4o-mini", output_tokens).await,
        );
    }
    let sonnet = billed("anthropic", "claude-sonnet-4-5", &message(&client, gateway, &key).await);
    let local = chat(&client, gateway, YAML_KEY, "llama-local", 4).await;
    let totals = until_calls(&client, daemon.addr, 4).await;
    assert_eq!(
        (totals["from"].as_str(), totals["to"].as_str()),
        (Some(today().as_str()), Some(today().as_str())),
        "today by default"
    );
    assert_eq!(totals["rows"][0]["micro_usd"].as_u64(), Some(gpt + sonnet), "{totals}");
    // Dollars as an exact decimal of six places, not a float's rounding.
    let (_, raw) = admin_get(&client, daemon.addr, SPEND).await;
    assert!(raw.contains(&format!("\"usd\":{},", usd(gpt + sonnet))), "{raw}");
    assert_eq!(totals["rows"][0]["unpriced_calls"], 1);
    assert!(gpt > 0 && sonnet > 0);

    let day = today();
    let grouped = report(
        &client,
        daemon.addr,
        &format!("?from={day}&to={day}&group_by=tenant,key,model,deployment,day"),
    )
    .await;
    let local_output = local["usage"]["completion_tokens"].as_u64().unwrap();
    let rows: Vec<Value> = grouped["rows"].as_array().unwrap().clone();
    let row = |tenant: &str, model: &str| {
        rows.iter()
            .find(|r| r["tenant"] == tenant && r["model"] == model)
            .unwrap_or_else(|| panic!("{grouped}"))
            .clone()
    };
    assert_eq!(rows.len(), 3, "{grouped}");
    let dir_row = row("dir-team", "claude-sonnet-4-5");
    assert_eq!(
        (
            dir_row["key"].as_str(),
            dir_row["deployment"].as_str(),
            dir_row["day"].as_str()
        ),
        (Some(key_id.as_str()), Some("simanthropic"), Some(day.as_str()))
    );
    assert_eq!(dir_row["micro_usd"], sonnet);
    let gpt_row = row("yaml-team", "gpt-4o-mini");
    assert_eq!(
        (
            gpt_row["calls"].as_u64(),
            gpt_row["key"].as_str(),
            gpt_row["output_tokens"].as_u64()
        ),
        (Some(2), Some(""), Some(12))
    );
    let local_row = row("yaml-team", "llama-local");
    assert_eq!(
        (
            local_row["micro_usd"].as_u64(),
            local_row["unpriced_calls"].as_u64(),
            local_row["output_tokens"].as_u64()
        ),
        (Some(0), Some(1), Some(local_output))
    );

    let (status, csv) = admin_get(
        &client,
        daemon.addr,
        &format!("{SPEND}?group_by=tenant,model&format=csv"),
    )
    .await;
    assert_eq!(status, 200, "{csv}");
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "tenant,model,calls,input_tokens,cached_tokens,output_tokens,usd,micro_usd,unpriced_calls"
    );
    assert_eq!(lines.len(), 4, "{csv}");
    assert!(
        lines.iter().any(|l| l.starts_with(&format!(
            "yaml-team,gpt-4o-mini,2,{},0,12,{},{gpt},0",
            gpt_row["input_tokens"],
            usd(gpt)
        ))),
        "{csv}"
    );

    for (query, named) in [
        ("?from=2026-02-30", "from: "),
        ("?from=2026-11-29&to=2026-11-28", "to: 2026-11-28 is before from"),
        ("?from=2020-01-01&to=2026-01-01", "a report spans at most 367"),
        ("?group_by=tenant,region", "group_by: unknown field"),
        ("?group_by=day,day", "group_by: day is named twice"),
        ("?format=xml", "format: "),
        ("?since=2026-11-01", "since: unknown parameter"),
        ("?to=2026-11-01&to=2026-11-02", "to: given twice"),
    ] {
        let (status, body) = admin_get(&client, daemon.addr, &format!("{SPEND}{query}")).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert!(body.contains(named), "{query}: {body}");
    }
    let Answer { status, .. } = send(
        &client,
        hyper::Method::GET,
        format!("http://{}{SPEND}", daemon.addr),
        &[],
        None,
    )
    .await;
    assert_eq!(status, 401, "the report is an admin route");

    let Answer {
        status, body: metrics, ..
    } = send(
        &client,
        hyper::Method::GET,
        format!("http://{}/metrics", daemon.addr),
        &[],
        None,
    )
    .await;
    assert_eq!(status, 200);
    let series = format!("ratelimiterd_gateway_spend_micro_usd_total{{tenant=\"yaml-team\",model=\"gpt-4o-mini\",deployment=\"sim\"}} {gpt}\n");
    assert!(metrics.contains(&series), "{metrics}");
    assert!(metrics.contains(&format!("ratelimiterd_gateway_spend_micro_usd_total{{tenant=\"dir-team\",model=\"claude-sonnet-4-5\",deployment=\"simanthropic\"}} {sonnet}\n")));
    assert!(!metrics.contains(&key_id), "keys are not labels");

    // The CLI prints the same report.
    let url = format!("http://{}", daemon.addr);
    let output = Command::new(BIN)
        .args([
            "--url",
            &url,
            "--token",
            ADMIN_TOKEN,
            "spend",
            "--group-by",
            "tenant,model",
            "--format",
            "csv",
        ])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(String::from_utf8_lossy(&output.stdout), csv);
    let output = Command::new(BIN)
        .args([
            "--url",
            &url,
            "--token",
            ADMIN_TOKEN,
            "spend",
            "--from",
            &day,
            "--group-by",
            "tenant,key,model,deployment,day",
        ])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(serde_json::from_slice::<Value>(&output.stdout).unwrap(), grouped);
    let output = Command::new(BIN)
        .args(["--url", &url, "--token", ADMIN_TOKEN, "spend", "--group-by", "region"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("group_by: unknown field"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_server_killed_with_sigkill_keeps_its_spend() {
    let sim = start_sim().await;
    let dir = temp_dir("gateway-spend-kill");
    let mut daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", &gateway_section(sim));
    let (gateway, client) = (gateway_addr(&daemon), client());
    for output_tokens in 1..=5 {
        chat(&client, gateway, YAML_KEY, "gpt-4o-mini", output_tokens).await;
    }
    let query = "?group_by=tenant,model,day";
    until_calls(&client, daemon.addr, 5).await;
    let before = report(&client, daemon.addr, query).await;
    daemon.kill9();
    let daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", &gateway_section(sim));
    assert_eq!(report(&client, daemon.addr, query).await, before);
    assert_eq!(before["rows"][0]["output_tokens"], 15);
}

#[cfg(feature = "tigerbeetle")]
mod fleet {
    use super::*;
    use ratelimiter::tigerbeetle::LocalCluster;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_servers_on_one_cluster_report_the_same_fleet_wide_spend() {
        let cluster = LocalCluster::start().expect("starting a local TigerBeetle");
        let sim = start_sim().await;
        let backend = BackendConfig::TigerBeetle {
            addresses: cluster.address(),
            settings: "  sessions: 2\n  request_timeout_ms: 2000\n",
        };
        let (dir_a, dir_b) = (temp_dir("gateway-spend-fleet-a"), temp_dir("gateway-spend-fleet-b"));
        let a = Daemon::start_on(&dir_a, backend, "", &gateway_section(sim));
        let b = Daemon::start_on(&dir_b, backend, "", &gateway_section(sim));
        let client = client();
        let (_, key) = directory_key(&client, a.addr, "fleet-team").await;
        let mut gpt = 0;
        for (gateway, tokens) in [(gateway_addr(&a), 2), (gateway_addr(&b), 6), (gateway_addr(&b), 8)] {
            gpt += billed(
                "openai",
                "gpt-4o-mini",
                &chat(&client, gateway, YAML_KEY, "gpt-4o-mini", tokens).await,
            );
        }
        let sonnet = billed(
            "anthropic",
            "claude-sonnet-4-5",
            &message(&client, gateway_addr(&a), &key).await,
        );
        let query = "?group_by=tenant,key,model,deployment,day";
        until_calls(&client, a.addr, 4).await;
        until_calls(&client, b.addr, 4).await;
        let (on_a, on_b) = (
            report(&client, a.addr, query).await,
            report(&client, b.addr, query).await,
        );
        assert_eq!(on_a, on_b, "either server reports the fleet's calls");
        let total = report(&client, b.addr, "").await;
        assert_eq!(total["rows"][0]["micro_usd"].as_u64(), Some(gpt + sonnet), "{total}");
        // A server started after the calls reads them from the cluster.
        let dir_c = temp_dir("gateway-spend-fleet-c");
        let c = Daemon::start_on(&dir_c, backend, "", &gateway_section(sim));
        until_calls(&client, c.addr, 4).await;
        assert_eq!(report(&client, c.addr, query).await, on_a);
    }
}
