//! The gateway's prices changed at runtime through the real `ratelimiterd`
//! binary in front of the provider simulator (docs/gateway.md, "Prices"): the
//! configuration file's `price:` fields read again by
//! `POST /v1/admin/gateway/prices/reload` and by SIGHUP apply to calls admitted
//! after, while a call admitted before is billed at the price it was reserved
//! at; a file refused (a bad price, a deployment left unpriced under budgets)
//! answers 400 naming the field and changes nothing; any other difference is
//! reported as needing a restart and not applied.

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use ratelimiter::price::{billed_micro_usd, ModelPrice, Usage};
use replay::sim::limits::ProviderLimits;
use serde_json::{json, Value};
use support::gateway_setup::{client, gateway_addr, send, sim_limits, start_sim, start_sim_with, HttpClient};
use support::{temp_dir, write_config_on, BackendConfig, Daemon, ADMIN_TOKEN};

/// The old price, then the new one (USD per million tokens).
const OLD_PRICE: &str = "{input: 1, output: 2}";
const NEW_PRICE: &str = "{input: 100, output: 200}";
/// The tenant's key (from the environment, as the configuration says).
const TENANT_KEY: &str = "gateway-prices-test-key-0123456789";
/// How long a test waits for the server to show what it waits for.
const POLL_MAX: Duration = Duration::from_secs(10);

/// A gateway with a daily budget, a model priced `price` and a self-hosted
/// model priced `local_price` (`None`: no price, which the budget refuses).
fn gateway_section(sim: SocketAddr, price: &str, rpm: u64, local_price: Option<&str>) -> String {
    let local = local_price.map_or(String::new(), |p| format!(", price: {p}"));
    std::env::set_var("GATEWAY_PRICES_TEST_KEY", TENANT_KEY);
    format!(
        "gateway:\n  listen_addr: \"127.0.0.1:0\"\n  tenants: [{{name: team, api_key_env: GATEWAY_PRICES_TEST_KEY}}]\n  budgets: [{{usd: 100, period: day}}]\n  upstreams:\n    - {{name: sim, kind: openai, base_url: \"http://{sim}\"}}\n    - {{name: local, kind: openai-compatible, base_url: \"http://{sim}\"}}\n  models:\n    - {{name: gpt-4o-mini, upstream: sim, rpm: {rpm}, tpm: 1000000, concurrency: 8, max_output_tokens_default: 64, price: {price}}}\n    - {{name: llama-local, upstream: local, rpm: 1000, tpm: 1000000, max_output_tokens_default: 64{local}}}\n"
    )
}

/// Rewrites the configuration of `dir` with `section`, as an operator edits it.
fn rewrite(dir: &Path, section: &str) {
    write_config_on(dir, BackendConfig::Memory, "", section);
}

/// An admin call of `method` on `path`: status and JSON body.
async fn admin(client: &HttpClient, server: SocketAddr, method: hyper::Method, path: &str) -> (u16, Value) {
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let url = format!("http://{server}{path}");
    let answer = send(client, method, url, &[("authorization", &bearer)], None).await;
    (answer.status, answer.json())
}

/// The price in force of `model`, as `GET /v1/admin/gateway/prices` shows it, and the digest.
async fn price_in_force(client: &HttpClient, server: SocketAddr, model: &str) -> (Value, String) {
    let (status, body) = admin(client, server, hyper::Method::GET, "/v1/admin/gateway/prices").await;
    assert_eq!(status, 200, "{body}");
    let row = (body["prices"].as_array().unwrap().iter())
        .find(|r| r["model"] == model)
        .unwrap_or_else(|| panic!("{body}"));
    (row["price"].clone(), body["prices_digest"].as_str().unwrap().to_owned())
}

/// A chat call of gpt-4o-mini writing `output_tokens`: its answer.
async fn chat(client: &HttpClient, gateway: SocketAddr, output_tokens: u64) -> Value {
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 32, "sim_output_tokens": output_tokens,
        "messages": [{"role": "user", "content": "Hi there"}]});
    let url = format!("http://{gateway}/v1/chat/completions");
    let bearer = format!("Bearer {TENANT_KEY}");
    let answer = send(
        client,
        hyper::Method::POST,
        url,
        &[("authorization", &bearer)],
        Some(body),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.json()
}

/// What `answer` costs at `price` (YAML flow form).
fn billed(price: &str, answer: &Value) -> u64 {
    let price: ModelPrice = serde_yaml::from_str(price).unwrap();
    let usage = Usage {
        input_tokens: answer["usage"]["prompt_tokens"].as_u64().unwrap(),
        output_tokens: answer["usage"]["completion_tokens"].as_u64().unwrap(),
        ..Usage::default()
    };
    billed_micro_usd(&price, &usage)
}

/// Polls (bounded) until `ready` holds of the admin GET of `path`.
async fn until(client: &HttpClient, server: SocketAddr, path: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let started = Instant::now();
    loop {
        let (status, body) = admin(client, server, hyper::Method::GET, path).await;
        if status == 200 && ready(&body) {
            return body;
        }
        assert!(started.elapsed() < POLL_MAX, "never ready: {path}: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_price_bills_calls_admitted_after_it_and_not_one_admitted_before() {
    // Each output token takes 100 ms: a call of 20 tokens is still running
    // when the price changes.
    let (sim, _provider) = start_sim_with(ProviderLimits {
        ms_per_output_token: 100,
        ..sim_limits()
    })
    .await;
    let dir = temp_dir("gateway-prices-reload");
    let daemon = Daemon::start_on(
        &dir,
        BackendConfig::Memory,
        "",
        &gateway_section(sim, OLD_PRICE, 1000, Some(OLD_PRICE)),
    );
    let (gateway, client) = (gateway_addr(&daemon), client());
    let (_, digest_before) = price_in_force(&client, daemon.addr, "gpt-4o-mini").await;

    let slow = tokio::spawn({
        let client = client.clone();
        async move { chat(&client, gateway, 20).await }
    });
    let admitted = |d: &Value| d.as_array().unwrap().iter().any(|d| d["admitted"] == 1);
    until(&client, daemon.addr, "/v1/admin/gateway/deployments", admitted).await;

    rewrite(&dir, &gateway_section(sim, NEW_PRICE, 1000, Some(OLD_PRICE)));
    let (status, reloaded) = admin(
        &client,
        daemon.addr,
        hyper::Method::POST,
        "/v1/admin/gateway/prices/reload",
    )
    .await;
    assert_eq!(status, 200, "{reloaded}");
    let changed = reloaded["changed"].as_array().unwrap();
    assert_eq!(changed.len(), 1, "only gpt-4o-mini's price changed: {reloaded}");
    assert_eq!(
        (changed[0]["model"].as_str(), changed[0]["after"]["input"].as_f64()),
        (Some("gpt-4o-mini"), Some(100.0))
    );
    assert_eq!(reloaded["needs_restart"], json!([]), "{reloaded}");
    let (price, digest_after) = price_in_force(&client, daemon.addr, "gpt-4o-mini").await;
    assert_eq!(price["output"].as_f64(), Some(200.0), "{price}");
    assert_ne!(digest_before, digest_after);
    assert_eq!(reloaded["prices_digest"].as_str(), Some(digest_after.as_str()));

    let fast = chat(&client, gateway, 1).await;
    let slow = slow.await.unwrap();
    let expected = billed(OLD_PRICE, &slow) + billed(NEW_PRICE, &fast);
    assert_ne!(expected, billed(NEW_PRICE, &slow) + billed(NEW_PRICE, &fast));
    let spent = |r: &Value| r["rows"][0]["calls"] == 2;
    let report = until(&client, daemon.addr, "/v1/admin/gateway/spend", spent).await;
    assert_eq!(
        report["rows"][0]["micro_usd"].as_u64(),
        Some(expected),
        "the call admitted before the reload at the old price, the one after at the new: {report}"
    );
    // The budget is reconciled at the same prices: what each call reserved at.
    let (status, budget) = admin(
        &client,
        daemon.addr,
        hyper::Method::GET,
        "/v1/admin/limits/gateway:usd:day",
    )
    .await;
    assert_eq!((status, budget["in_use"].as_u64()), (200, Some(expected)), "{budget}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_file_changes_nothing_and_other_changes_need_a_restart() {
    let sim = start_sim().await;
    let dir = temp_dir("gateway-prices-refused");
    let daemon = Daemon::start_on(
        &dir,
        BackendConfig::Memory,
        "",
        &gateway_section(sim, OLD_PRICE, 1000, Some(OLD_PRICE)),
    );
    let client = client();
    let before = price_in_force(&client, daemon.addr, "gpt-4o-mini").await;
    let reload = "/v1/admin/gateway/prices/reload";
    // A negative price; a new price beside a self-hosted model left without
    // one while a budget is configured.
    let budget = "  budgets: [{usd: 100, period: day}]\n";
    let refused = [
        (
            gateway_section(sim, "{input: -1, output: 2}", 1000, Some(OLD_PRICE)),
            "price.input",
        ),
        (gateway_section(sim, NEW_PRICE, 1000, None), "models[1].price"),
        // The file drops the budget too, but the budget in force stays until a
        // restart: the price it needs cannot be taken away meanwhile.
        (
            gateway_section(sim, NEW_PRICE, 1000, None).replace(budget, ""),
            "models[1].price",
        ),
    ];
    for (section, field) in refused {
        assert!(section.contains(budget) || field != "price.input");
        rewrite(&dir, &section);
        let (status, body) = admin(&client, daemon.addr, hyper::Method::POST, reload).await;
        assert_eq!(status, 400, "{body}");
        assert!(body.to_string().contains(field), "names {field}: {body}");
        assert_eq!(
            price_in_force(&client, daemon.addr, "gpt-4o-mini").await,
            before,
            "nothing changed"
        );
    }
    // A changed limit beside a changed price: the price applies, the limit waits for a restart.
    rewrite(&dir, &gateway_section(sim, NEW_PRICE, 5, Some(OLD_PRICE)));
    let (status, body) = admin(&client, daemon.addr, hyper::Method::POST, reload).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["needs_restart"], json!(["gateway: models[gpt-4o-mini]"]), "{body}");
    assert_eq!(
        price_in_force(&client, daemon.addr, "gpt-4o-mini").await.0["input"].as_f64(),
        Some(100.0)
    );
    let (_, limits) = admin(&client, daemon.addr, hyper::Method::GET, "/v1/admin/limits").await;
    assert!(
        !limits.to_string().contains("\"capacity\":5,"),
        "the rpm of 5 is not applied: {limits}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_prices_and_a_price_is_not_removed_at_runtime() {
    let sim = start_sim().await;
    let dir = temp_dir("gateway-prices-sighup");
    // Without a budget in the file: only the directory's tenants could have one.
    let unbudgeted = |price: &str, local: Option<&str>| {
        gateway_section(sim, price, 1000, local).replace("  budgets: [{usd: 100, period: day}]\n", "")
    };
    let daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", &unbudgeted(OLD_PRICE, Some(OLD_PRICE)));
    let client = client();
    rewrite(&dir, &unbudgeted(NEW_PRICE, Some(OLD_PRICE)));
    let status = std::process::Command::new("kill")
        .args(["-HUP", &daemon.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let new = |body: &Value| {
        (body["prices"].as_array().unwrap().iter()).any(|r| r["model"] == "gpt-4o-mini" && r["price"]["input"] == 100.0)
    };
    until(&client, daemon.addr, "/v1/admin/gateway/prices", new).await;
    // A call checked against the price for a directory budget could go
    // uncounted were it taken away meanwhile: only a restart removes a price.
    rewrite(&dir, &unbudgeted(NEW_PRICE, None));
    let (status, body) = admin(
        &client,
        daemon.addr,
        hyper::Method::POST,
        "/v1/admin/gateway/prices/reload",
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("models[1].price"), "{body}");
    assert!(
        price_in_force(&client, daemon.addr, "llama-local").await.0.is_object(),
        "still priced"
    );
}
