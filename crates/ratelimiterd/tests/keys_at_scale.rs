//! The gateway's keys at scale (docs/gateway.md, "Tenants and keys"): a key's
//! budgets changed by its PATCH (and the CLI's `keys update`, the real
//! binary), a budget in money never defined by `PUT /v1/admin/limits`, keys
//! forgotten after `directory.key_retention_days`, and a key's own limits kept
//! out of the registry file yet defined again at every start, before the
//! memory snapshot gives them back what they held.

mod support;

use std::process::{Command, Output};

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};
use support::admin_harness::{harness_with, Harness};
use support::raw::{self, request};
use support::{temp_dir, BackendConfig, Daemon, ADMIN_TOKEN, BIN, CLIENT_TOKEN};

const TOKEN: &str = "admin-token-0123456789abcdef";
const KEYS: &str = "/v1/admin/gateway/keys";
const TENANTS: &str = "/v1/admin/gateway/tenants";
/// A day, in ms.
const DAY_MS: u64 = 86_400_000;

async fn harness(name: &str, sections: &str) -> Harness {
    let server = format!("  admin_token: {TOKEN}\n");
    harness_with(name, &server, sections, Some(TOKEN)).await
}

fn error(body: &Value) -> &str {
    body["error"].as_str().unwrap_or_else(|| panic!("no error in {body}"))
}

/// A tenant `search` and a key of it with `rpm` 3; the key's id.
async fn tenant_and_key(h: &Harness) -> String {
    let (status, _) = h.send(Method::POST, TENANTS, Some(json!({"name": "search"}))).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, key) = h
        .send(Method::POST, KEYS, Some(json!({"tenant": "search", "rpm": 3})))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{key}");
    key["id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_keys_budgets_change_through_its_patch_and_a_bad_patch_changes_nothing() {
    let h = harness("key-patch", "").await;
    let id = tenant_and_key(&h).await;
    let path = format!("{KEYS}/{id}");
    let budgets = json!([{"usd": 5, "period": "day"}, {"usd": 1.5, "window_seconds": 3600}]);
    let (status, changed) = h.send(Method::PATCH, &path, Some(json!({"budgets": budgets}))).await;
    assert_eq!(status, StatusCode::OK, "{changed}");
    assert_eq!(
        (changed["budgets"][0]["period"].clone(), changed["rpm"].clone()),
        (json!("day"), json!(3))
    );
    let (status, limit) = h
        .send(Method::GET, &format!("/v1/admin/limits/key:{id}:usd:day"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{limit}");
    assert_eq!(
        (&limit["capacity"], &limit["period"]),
        (&json!(5_000_000), &json!("day"))
    );
    let before = h.send(Method::GET, &path, None).await.1;
    for (body, expected) in [
        (
            json!({"budgets": [{"usd": 5, "period": "fortnight"}]}),
            "invalid_request: budgets",
        ),
        (
            json!({"budgets": [{"usd": -1, "period": "day"}]}),
            "invalid_request: budgets",
        ),
        (
            json!({"rpm": 9, "budgets": null}),
            "invalid_request: rpm: set at the key's creation",
        ),
        (json!({}), "invalid_request: budgets: is required"),
        (
            json!({"budgets": null, "owner": 1}),
            "invalid_request: owner: unknown field",
        ),
    ] {
        let (status, answer) = h.send(Method::PATCH, &path, Some(body.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert!(error(&answer).starts_with(expected), "{body}: {answer}");
        assert_eq!(
            h.send(Method::GET, &path, None).await.1,
            before,
            "{body} changed nothing"
        );
    }
    let (status, _) = h
        .send(Method::PATCH, &format!("{KEYS}/NOPE"), Some(json!({"budgets": null})))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, cleared) = h.send(Method::PATCH, &path, Some(json!({"budgets": null}))).await;
    assert_eq!((status, cleared.get("budgets")), (StatusCode::OK, None), "{cleared}");
    h.send(Method::DELETE, &path, None).await;
    let (status, answer) = h.send(Method::PATCH, &path, Some(json!({"budgets": budgets}))).await;
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    assert!(error(&answer).contains("\"revoked\""), "{answer}");
}

#[tokio::test]
async fn the_server_refuses_to_define_a_budget_in_money_through_the_limits_api() {
    let h = harness("budget-put", "").await;
    let id = tenant_and_key(&h).await;
    let rolling = |key: &str| json!({"key": key, "kind": "rolling", "capacity": 1, "window_seconds": 60});
    let budgets = [
        "tenant:search:usd:day".to_owned(),
        format!("key:{id}:usd:window3600"),
        "model:gpt-4o-mini:usd:month".to_owned(),
        "gateway:usd:week".to_owned(),
    ];
    for key in &budgets {
        let (status, answer) = h.send(Method::PUT, "/v1/admin/limits", Some(rolling(key))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{key}: {answer}");
        let message = error(&answer);
        assert!(
            message.contains(key.as_str())
                && message.contains("PATCH /v1/admin/gateway/tenants/<name>")
                && message.contains("--budget USD/PERIOD"),
            "{message}"
        );
        let (status, _) = h.send(Method::GET, &format!("/v1/admin/limits/{key}"), None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{key}: nothing defined");
    }
    // The rate of a tenant named `usd` is no budget.
    let (status, answer) = h
        .send(Method::PUT, "/v1/admin/limits", Some(rolling("tenant:usd:llm:rpm")))
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}

#[tokio::test]
async fn revoked_and_expired_keys_are_listed_until_the_configured_retention_then_forgotten() {
    let h = harness("forget", "directory:\n  key_retention_days: 2\n").await;
    let id = tenant_and_key(&h).await;
    let (_, expiring) = h
        .send(
            Method::POST,
            KEYS,
            Some(json!({"tenant": "search", "expires_in_seconds": 60})),
        )
        .await;
    let expiring = expiring["id"].as_str().unwrap().to_owned();
    let (_, working) = h.send(Method::POST, KEYS, Some(json!({"tenant": "search"}))).await;
    h.send(Method::DELETE, &format!("{KEYS}/{id}"), None).await;
    let directory = h.state.directory().unwrap().clone();
    h.clock.advance_ms(2 * DAY_MS - 1);
    assert_eq!(directory.forget_past_retention().await.unwrap(), 0);
    let (_, listed) = h.send(Method::GET, KEYS, None).await;
    // Ids made in the same millisecond are in no set order: the statuses, sorted.
    let mut statuses: Vec<String> = (listed.as_array().unwrap().iter())
        .map(|k| k["status"].as_str().unwrap().to_owned())
        .collect();
    statuses.sort();
    assert_eq!(statuses, ["active", "expired", "revoked"], "{listed}");
    h.clock.advance_ms(60_001);
    assert_eq!(directory.forget_past_retention().await.unwrap(), 2);
    let (_, listed) = h.send(Method::GET, KEYS, None).await;
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["id"], working["id"]);
    for gone in [&id, &expiring] {
        assert_eq!(
            h.send(Method::GET, &format!("{KEYS}/{gone}"), None).await.0,
            StatusCode::NOT_FOUND
        );
    }
    let metrics = h.send_raw(Method::GET, "/metrics", Vec::new(), None).await.1;
    let metrics = metrics.as_str().unwrap();
    for line in [
        "ratelimiterd_gateway_keys_forgotten_total 2",
        "ratelimiterd_gateway_keys 1",
    ] {
        assert!(metrics.contains(line), "{line} missing from {metrics}");
    }
    let bad = "directory:\n  key_retention_days: 3651\n";
    let error = ratelimiterd::Config::parse(bad, std::path::Path::new("t.yaml")).unwrap_err();
    assert!(error.to_string().contains("directory.key_retention_days"), "{error}");
}

/// The admin API of `daemon`: the status and the answer.
fn admin(daemon: &Daemon, method: &str, path: &str, body: Value) -> (u16, Value) {
    let body = if body.is_null() {
        Vec::new()
    } else {
        body.to_string().into_bytes()
    };
    let answer = request(daemon.addr, method, path, Some(ADMIN_TOKEN), &body);
    (answer.status, answer.json())
}

#[test]
fn a_keys_own_limits_stay_out_of_the_registry_file_and_hold_their_usage_across_a_restart() {
    let dir = temp_dir("key-limits-restart");
    let sections = "memory:\n  snapshot_interval_ms: 0\n";
    let mut daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", sections);
    assert_eq!(admin(&daemon, "POST", TENANTS, json!({"name": "acme"})).0, 201);
    let (status, key) = admin(
        &daemon,
        "POST",
        KEYS,
        json!({"tenant": "acme", "rpm": 5, "concurrency": 2}),
    );
    assert_eq!(status, 201, "{key}");
    let id = key["id"].as_str().unwrap();
    let rpm = format!("key:{id}:llm:rpm");
    let body =
        json!({"lease_id": ratelimiter::LeaseId::generate().to_string(), "requirements": [{"key": rpm, "amount": 2}]});
    assert_eq!(
        raw::ok(daemon.addr, "POST", "/v1/reserve", CLIENT_TOKEN, &body).json()["allowed"],
        true
    );
    let registry = std::fs::read_to_string(dir.join("limits.json")).unwrap_or_default();
    assert!(
        !registry.contains("key:"),
        "a key's creation wrote the registry: {registry}"
    );
    daemon.terminate();
    let daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", sections);
    let (status, limit) = admin(&daemon, "GET", &format!("/v1/admin/limits/{rpm}"), Value::Null);
    assert_eq!(status, 200, "{limit}");
    assert_eq!(
        (&limit["capacity"], &limit["in_use"]),
        (&json!(5), &json!(2)),
        "{limit}"
    );
    let (status, _) = admin(
        &daemon,
        "GET",
        &format!("/v1/admin/limits/key:{id}:llm:concurrency"),
        Value::Null,
    );
    assert_eq!(status, 200);
}

/// Runs a client command of the binary against `daemon` with the admin token.
fn client(daemon: &Daemon, args: &[&str]) -> Output {
    let url = daemon.url();
    let mut all = vec!["--url", url.as_str(), "--token", ADMIN_TOKEN];
    all.extend_from_slice(args);
    Command::new(BIN).args(all).output().expect("run ratelimiterd")
}

#[test]
fn keys_update_sets_and_clears_a_keys_budgets_from_the_command_line() {
    let dir = temp_dir("cli-keys-update");
    let daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", "");
    assert!(client(&daemon, &["tenants", "create", "acme"]).status.success());
    let created = client(&daemon, &["keys", "create", "--tenant", "acme"]);
    let created: Value = serde_json::from_slice(&created.stdout).unwrap();
    let id = created["id"].as_str().unwrap();
    let updated = client(
        &daemon,
        &["keys", "update", id, "--budget", "5/day", "--budget", "2/3600s"],
    );
    assert!(updated.status.success(), "{}", String::from_utf8_lossy(&updated.stderr));
    let printed: Value = serde_json::from_slice(&updated.stdout).unwrap();
    assert_eq!(
        printed["budgets"],
        json!([{"usd": 5.0, "period": "day"}, {"usd": 2.0, "window_seconds": 3600}]),
        "{printed}"
    );
    let (status, limit) = admin(
        &daemon,
        "GET",
        &format!("/v1/admin/limits/key:{id}:usd:window3600"),
        Value::Null,
    );
    assert_eq!((status, &limit["capacity"]), (200, &json!(2_000_000)), "{limit}");
    let refused = client(&daemon, &["keys", "update", id, "--budget", "5/fortnight"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("USD/PERIOD"));
    let cleared = client(&daemon, &["keys", "update", id, "--clear", "budgets"]);
    assert!(cleared.status.success(), "{}", String::from_utf8_lossy(&cleared.stderr));
    let (_, key) = admin(&daemon, "GET", &format!("{KEYS}/{id}"), Value::Null);
    assert_eq!(key.get("budgets"), None, "{key}");
    // `limits put` of the key's budget is refused before anything is sent.
    let put = [
        "limits",
        "put",
        "--key",
        &format!("key:{id}:usd:day"),
        "--kind",
        "rolling",
        "--capacity",
        "1",
        "--window-seconds",
        "60",
    ];
    let refused = client(&daemon, &put);
    assert!(String::from_utf8_lossy(&refused.stderr).contains("keys update ID --budget"));
}
