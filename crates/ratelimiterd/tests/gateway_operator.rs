//! What an operator meets around the gateway's tenants, run on the real
//! `ratelimiterd` binary (docs/gateway.md, "Tenants and keys"): a tenant name
//! both in the YAML and made through the admin API is refused, at the API and
//! at a start, with how to resolve it, and never turns the API tenant's keys
//! into revoked ones; budgets in money are set from the command line with
//! their periods, `limits put` refuses a budget's key, and a budget on a
//! tenant or key that may call an unpriced model is a 400 changing nothing.

mod support;

use std::net::SocketAddr;
use std::process::{Command, Output};

use serde_json::{json, Value};
use support::gateway_setup::{admin, client, gateway_addr, send, start_sim, HttpClient};
use support::{temp_dir, write_config_on, BackendConfig, Daemon, ADMIN_TOKEN, BIN};

/// The configured tenant's key variable and key.
const YAML_KEY_ENV: &str = "GATEWAY_OPERATOR_TEST_KEY";
const YAML_KEY: &str = "gateway-operator-test-yaml-key-0123456789";

/// A gateway serving one model of the simulator, with the YAML tenants `tenants`.
fn gateway_section(sim: SocketAddr, tenants: &[&str]) -> String {
    std::env::set_var(YAML_KEY_ENV, YAML_KEY);
    let mut section = format!(
        "gateway:\n  listen_addr: \"127.0.0.1:0\"\n  upstreams:\n    - {{name: sim, kind: openai, base_url: \"http://{sim}\"}}\n  models:\n    - {{name: gpt-4o-mini, upstream: sim, rpm: 1000, tpm: 1000000, concurrency: 8, max_output_tokens_default: 64}}\n  tenants:\n    - {{name: yaml-team, api_key_env: {YAML_KEY_ENV}}}\n"
    );
    for name in tenants {
        // Each extra tenant's key is the YAML tenant's with its name added.
        let env = format!("GATEWAY_OPERATOR_TEST_KEY_{}", name.to_uppercase());
        std::env::set_var(&env, format!("{YAML_KEY}-{name}"));
        section.push_str(&format!("    - {{name: {name}, api_key_env: {env}, rpm: 100}}\n"));
    }
    section
}

/// The status of a short chat call with `key` through the gateway at `gateway`.
async fn chat_status(client: &HttpClient, gateway: SocketAddr, key: &str) -> u16 {
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 5, "sim_output_tokens": 5,
        "messages": [{"role": "user", "content": "Hi"}]});
    let bearer = format!("Bearer {key}");
    let url = format!("http://{gateway}/v1/chat/completions");
    let answer = send(
        client,
        hyper::Method::POST,
        url,
        &[("authorization", &bearer)],
        Some(body),
    )
    .await;
    answer.status
}

/// A tenant name the YAML has cannot be made through the API (409 naming the
/// file), and a YAML entry added later for a tenant made through the API stops
/// the start with the way out; without the entry, the API tenant's key still
/// works and is listed active (never revoked by nobody).
#[tokio::test]
async fn a_tenant_name_in_both_the_yaml_and_the_api_is_refused_and_its_keys_stay_working() {
    let sim = start_sim().await;
    let dir = temp_dir("gateway-operator-clash");
    let mut daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", &gateway_section(sim, &[]));
    let client = client();
    let post = hyper::Method::POST;
    let tenants = "/v1/admin/gateway/tenants";
    let refused = admin(
        &client,
        daemon.addr,
        post.clone(),
        tenants,
        Some(json!({"name": "yaml-team"})),
        409,
    )
    .await;
    let text = refused.to_string();
    assert!(
        text.contains("yaml-team") && text.contains("configuration file"),
        "{text}"
    );

    admin(
        &client,
        daemon.addr,
        post.clone(),
        tenants,
        Some(json!({"name": "dup"})),
        201,
    )
    .await;
    let keys = "/v1/admin/gateway/keys";
    let created = admin(&client, daemon.addr, post, keys, Some(json!({"tenant": "dup"})), 201).await;
    let (id, key) = (created["id"].as_str().unwrap(), created["key"].as_str().unwrap());
    assert_eq!(chat_status(&client, gateway_addr(&daemon), key).await, 200);
    daemon.terminate();

    // The same name added to the YAML: the start is refused, naming the tenant and the way out.
    let clashing = write_config_on(&dir, BackendConfig::Memory, "", &gateway_section(sim, &["dup"]));
    let logs = match Daemon::start_with(&clashing) {
        Ok(_) => panic!("a start with the tenant dup in the YAML and made through the API must be refused"),
        Err(logs) => logs,
    };
    assert!(logs.contains("tenant dup is defined both"), "{logs}");
    assert!(logs.contains("ratelimiterd tenants delete dup"), "{logs}");

    // Without the entry, the API tenant and its key are as they were.
    let config = write_config_on(&dir, BackendConfig::Memory, "", &gateway_section(sim, &[]));
    let daemon = Daemon::start_with(&config).unwrap_or_else(|logs| panic!("did not start:\n{logs}"));
    let shown = admin(
        &client,
        daemon.addr,
        hyper::Method::GET,
        &format!("{keys}/{id}"),
        None,
        200,
    )
    .await;
    assert_eq!(shown["status"], "active", "{shown}");
    assert!(shown["revoked_at"].is_null(), "{shown}");
    assert_eq!(chat_status(&client, gateway_addr(&daemon), key).await, 200);
}

/// A gateway with a list-priced model (`gpt-4o-mini`) and one without a
/// price (`llama`, on an OpenAI-compatible upstream), no budget configured.
fn priced_and_unpriced_section() -> String {
    "gateway:\n  listen_addr: \"127.0.0.1:0\"\n  allow_anonymous: true\n  upstreams:\n    - {name: oai, kind: openai, base_url: \"http://127.0.0.1:9\"}\n    - {name: vllm, kind: openai-compatible, base_url: \"http://127.0.0.1:9\"}\n  models:\n    - {name: gpt-4o-mini, upstream: oai, rpm: 100, tpm: 100000, concurrency: 4, max_output_tokens_default: 64}\n    - {name: llama, upstream: vllm, rpm: 100, tpm: 100000, concurrency: 4, max_output_tokens_default: 64}\n".to_owned()
}

/// Runs the binary's operator command `args` against `daemon` with the admin token.
fn cli(daemon: &Daemon, args: &[&str]) -> Output {
    let output = Command::new(BIN)
        .args(["--url", &daemon.url(), "--token", ADMIN_TOKEN])
        .args(args)
        .output()
        .expect("run ratelimiterd");
    output
}

/// `cli`'s standard output as JSON, asserting success.
fn cli_json(daemon: &Daemon, args: &[&str]) -> Value {
    let output = cli(daemon, args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{args:?}: {stderr}");
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// `cli`'s standard error, asserting failure.
fn cli_refused(daemon: &Daemon, args: &[&str]) -> String {
    let output = cli(daemon, args);
    assert!(!output.status.success(), "{args:?} must fail");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `tenants create|update --budget USD/PERIOD` and `keys create --budget` set
/// budgets with their periods (the tenant's record shows them); a malformed
/// `--budget` sends nothing; `limits put` of a budget's key is refused.
#[tokio::test]
async fn budgets_are_set_from_the_command_line_with_their_periods() {
    let dir = temp_dir("gateway-operator-budgets");
    let daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", &priced_and_unpriced_section());
    let client = client();
    let get = hyper::Method::GET;
    let created = cli_json(
        &daemon,
        &[
            "tenants",
            "create",
            "fin",
            "--model",
            "gpt-4o-mini",
            "--budget",
            "500/month",
            "--budget",
            "40/day",
        ],
    );
    assert_eq!(created["name"], "fin", "{created}");
    let record = admin(
        &client,
        daemon.addr,
        get.clone(),
        "/v1/admin/gateway/tenants/fin",
        None,
        200,
    )
    .await;
    assert_eq!(
        record["budgets"],
        json!([{"usd": 500.0, "period": "month"}, {"usd": 40.0, "period": "day"}]),
        "{record}"
    );
    cli_json(
        &daemon,
        &[
            "tenants",
            "update",
            "fin",
            "--budget",
            "10/week",
            "--budget",
            "1.5/3600s",
        ],
    );
    let record = admin(
        &client,
        daemon.addr,
        get.clone(),
        "/v1/admin/gateway/tenants/fin",
        None,
        200,
    )
    .await;
    assert_eq!(
        record["budgets"],
        json!([{"usd": 10.0, "period": "week"}, {"usd": 1.5, "window_seconds": 3600}]),
        "{record}"
    );
    let week = admin(
        &client,
        daemon.addr,
        get.clone(),
        "/v1/admin/limits/tenant:fin:usd:week",
        None,
        200,
    )
    .await;
    assert_eq!(
        (&week["capacity"], &week["period"]),
        (&json!(10_000_000), &json!("week")),
        "{week}"
    );
    let key = cli_json(&daemon, &["keys", "create", "--tenant", "fin", "--budget", "5/day"]);
    assert_eq!(key["budgets"], json!([{"usd": 5.0, "period": "day"}]), "{key}");

    let refused = cli_refused(&daemon, &["tenants", "create", "other", "--budget", "5/fortnight"]);
    assert!(refused.contains("USD/PERIOD"), "{refused}");
    admin(&client, daemon.addr, get, "/v1/admin/gateway/tenants/other", None, 404).await;
    let put = [
        "limits",
        "put",
        "--key",
        "tenant:fin:usd:week",
        "--kind",
        "rolling",
        "--capacity",
        "1",
    ];
    let refused = cli_refused(&daemon, &[&put[..], &["--window-seconds", "60"]].concat());
    assert!(refused.contains("tenants update NAME --budget"), "{refused}");
}

/// A budget on a tenant or key that may call `llama` (no price) is a 400
/// naming it, on create and on PATCH (the tenant's, the key's, and the CLI's
/// `tenants update` and `keys update`), and the record is unchanged.
#[tokio::test]
async fn a_budget_over_an_unpriced_model_is_refused_and_changes_nothing() {
    let dir = temp_dir("gateway-operator-unpriced");
    let daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", &priced_and_unpriced_section());
    let client = client();
    let (post, patch) = (hyper::Method::POST, hyper::Method::PATCH);
    let tenants = "/v1/admin/gateway/tenants";
    let budgets = json!([{"usd": 5, "period": "day"}]);
    let refused = admin(
        &client,
        daemon.addr,
        post.clone(),
        tenants,
        Some(json!({"name": "a", "budgets": budgets})),
        400,
    )
    .await;
    assert!(refused.to_string().contains("model llama"), "{refused}");
    admin(
        &client,
        daemon.addr,
        post.clone(),
        tenants,
        Some(json!({"name": "open", "rpm": 10})),
        201,
    )
    .await;
    let path = "/v1/admin/gateway/tenants/open";
    let before = admin(&client, daemon.addr, hyper::Method::GET, path, None, 200).await;
    let refused = admin(
        &client,
        daemon.addr,
        patch.clone(),
        path,
        Some(json!({"budgets": budgets})),
        400,
    )
    .await;
    assert!(refused.to_string().contains("model llama"), "{refused}");
    let refused = cli_refused(&daemon, &["tenants", "update", "open", "--budget", "5/day"]);
    assert!(refused.contains("model llama"), "{refused}");
    let after = admin(&client, daemon.addr, hyper::Method::GET, path, None, 200).await;
    assert_eq!(before, after, "a refused PATCH changes nothing");
    let key = json!({"tenant": "open", "budgets": budgets});
    let refused = admin(
        &client,
        daemon.addr,
        post.clone(),
        "/v1/admin/gateway/keys",
        Some(key),
        400,
    )
    .await;
    assert!(refused.to_string().contains("model llama"), "{refused}");
    // A key made without a budget gets none by its PATCH or `keys update` either.
    let bare = json!({"tenant": "open"});
    let bare = admin(
        &client,
        daemon.addr,
        post.clone(),
        "/v1/admin/gateway/keys",
        Some(bare),
        201,
    )
    .await;
    let bare_path = format!("/v1/admin/gateway/keys/{}", bare["id"].as_str().unwrap());
    let refused = admin(
        &client,
        daemon.addr,
        patch.clone(),
        &bare_path,
        Some(json!({"budgets": budgets})),
        400,
    )
    .await;
    assert!(refused.to_string().contains("model llama"), "{refused}");
    let refused = cli_refused(
        &daemon,
        &["keys", "update", bare["id"].as_str().unwrap(), "--budget", "5/day"],
    );
    assert!(refused.contains("model llama"), "{refused}");
    let unchanged = admin(&client, daemon.addr, hyper::Method::GET, &bare_path, None, 200).await;
    assert_eq!(
        unchanged.get("budgets"),
        None,
        "a refused PATCH changes nothing: {unchanged}"
    );
    // Narrowed to priced models, the same budget is taken.
    let narrowed = json!({"models": ["gpt-4o-mini"], "budgets": budgets});
    let shown = admin(&client, daemon.addr, patch.clone(), path, Some(narrowed), 200).await;
    assert_eq!(shown["budgets"][0]["period"], "day", "{shown}");
    // A key with a budget and the tenant's models: widening them to every model is refused too.
    let key = json!({"tenant": "open", "budgets": [{"usd": 1, "period": "day"}]});
    let created = admin(&client, daemon.addr, post, "/v1/admin/gateway/keys", Some(key), 201).await;
    let widened = json!({"models": null, "budgets": null});
    let refused = admin(&client, daemon.addr, patch, path, Some(widened), 400).await;
    let text = refused.to_string();
    assert!(
        text.contains("model llama") && text.contains(created["id"].as_str().unwrap()),
        "{text}"
    );
}
