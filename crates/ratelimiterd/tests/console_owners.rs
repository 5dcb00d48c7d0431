//! Whose each limit is in the console's state, through the real `ratelimiterd`
//! binary (docs/console.md, "The state endpoint"): a budget's limit row says
//! it is money, with its period and where it is changed; the tenants table
//! keeps a tenant's daily tokens and its budgets apart; and a revoked or
//! expired key's own limits are marked retired and counted in no card, while
//! the limits a rotated key hands to its successor still count (the budgets
//! panel marks a revoked key's budget the same way).

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ratelimiter::LeaseId;
use serde_json::{json, Value};
use support::raw::{ok, request};
use support::{temp_dir, BackendConfig, Daemon, ADMIN_TOKEN, CLIENT_TOKEN};

/// The configured tenants' keys (from the environment, as the configuration says).
const SEARCH_KEY: &str = "console-owners-search-key-0123456789";
const ACME_KEY: &str = "console-owners-acme-key-0123456789ab";

/// A gateway whose upstream is never called: `search` with $40 a day and no
/// daily tokens, `acme` with daily tokens and no budget.
fn gateway_section() -> String {
    std::env::set_var("CONSOLE_OWNERS_SEARCH_KEY", SEARCH_KEY);
    std::env::set_var("CONSOLE_OWNERS_ACME_KEY", ACME_KEY);
    "gateway:\n  listen_addr: \"127.0.0.1:0\"\n  upstreams:\n    - {name: openai, kind: openai, base_url: \"http://127.0.0.1:9\"}\n  models:\n    - {name: gpt-4o-mini, upstream: openai, rpm: 1000, tpm: 1000000, max_output_tokens_default: 64}\n  tenants:\n    - {name: search, api_key_env: CONSOLE_OWNERS_SEARCH_KEY, budgets: [{usd: 40, period: day}]}\n    - {name: acme, api_key_env: CONSOLE_OWNERS_ACME_KEY, daily_tokens: 5000}\n".to_owned()
}

/// The console's state with every limit in one page.
fn state(server: SocketAddr) -> Value {
    let answer = request(server, "GET", "/ui/api/state?count=500", Some(ADMIN_TOKEN), b"");
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer.json()
}

fn limit_row<'a>(state: &'a Value, key: &str) -> &'a Value {
    (state["limits"]["rows"].as_array().unwrap().iter())
        .find(|r| r["key"] == key)
        .unwrap_or_else(|| panic!("no limit {key}: {}", state["limits"]))
}

fn tenant_row<'a>(state: &'a Value, name: &str) -> &'a Value {
    (state["tenants"]["rows"].as_array().unwrap().iter())
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no tenant {name}: {}", state["tenants"]))
}

/// A key of webteam with `rpm` 2 (and `extra` fields), its rpm limit filled: its id.
fn full_key(server: SocketAddr, extra: Value) -> String {
    let mut spec = json!({"tenant": "webteam", "rpm": 2});
    spec.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    let made = request(
        server,
        "POST",
        "/v1/admin/gateway/keys",
        Some(ADMIN_TOKEN),
        spec.to_string().as_bytes(),
    );
    assert_eq!(made.status, 201, "{}", made.text());
    let id = made.json()["id"].as_str().unwrap().to_owned();
    let reserve = json!({"lease_id": LeaseId::generate().to_string(),
        "requirements": [{"key": format!("key:{id}:llm:rpm"), "amount": 2}]});
    let granted = ok(server, "POST", "/v1/reserve", CLIENT_TOKEN, &reserve).json();
    assert_eq!(granted["allowed"], true, "{granted}");
    id
}

#[test]
fn budgets_and_daily_tokens_are_told_apart() {
    let dir = temp_dir("console-owners-money");
    let daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", &gateway_section());
    let tenant = json!({"name": "webteam", "budgets": [{"usd": 5, "period": "week"}]});
    let made = request(
        daemon.addr,
        "POST",
        "/v1/admin/gateway/tenants",
        Some(ADMIN_TOKEN),
        tenant.to_string().as_bytes(),
    );
    assert_eq!(made.status, 201, "{}", made.text());
    let state = state(daemon.addr);

    // The limits table: a budget is money, with its period and where it is changed.
    let search = limit_row(&state, "tenant:search:usd:day");
    assert_eq!(
        (search["capacity"].as_u64(), search["period"].as_str()),
        (Some(40_000_000), Some("day"))
    );
    assert_eq!(
        search["budget"],
        json!({"owner": "tenant", "owner_name": "search", "kept_on": "configuration"})
    );
    let webteam = limit_row(&state, "tenant:webteam:usd:week");
    assert_eq!(webteam["period"], "week");
    assert_eq!(webteam["budget"]["kept_on"], "directory", "{webteam}");
    let tokens = limit_row(&state, "tenant:acme:llm:daily_tokens");
    assert_eq!(
        (tokens["budget"].is_null(), tokens["period"].is_null()),
        (true, true),
        "{tokens}"
    );

    // The tenants table: daily tokens are daily tokens, budgets are budgets.
    let search = tenant_row(&state, "search");
    assert!(search["daily_tokens"].is_null(), "search has no daily tokens: {search}");
    assert_eq!(
        search["budgets"],
        json!([{"key": "tenant:search:usd:day", "period": "day", "window_seconds": null,
                "budget_micro_usd": 40_000_000, "used_micro_usd": 0, "left_micro_usd": 40_000_000,
                "owing": false, "utilization_bp": 0}])
    );
    let acme = tenant_row(&state, "acme");
    assert_eq!(
        (
            acme["daily_tokens"]["key"].as_str(),
            acme["daily_tokens"]["capacity"].as_u64()
        ),
        (Some("tenant:acme:llm:daily_tokens"), Some(5_000))
    );
    assert_eq!(acme["budgets"], json!([]), "acme has no budget: {acme}");
}

#[test]
fn a_revoked_or_expired_keys_limits_are_retired_and_counted_in_no_card() {
    let dir = temp_dir("console-owners-retired");
    let daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", &gateway_section());
    let server = daemon.addr;
    let made = request(
        server,
        "POST",
        "/v1/admin/gateway/tenants",
        Some(ADMIN_TOKEN),
        br#"{"name": "webteam"}"#,
    );
    assert_eq!(made.status, 201, "{}", made.text());
    let revoked = full_key(server, json!({"budgets": [{"usd": 1, "period": "day"}]}));
    let (rotated, working) = (full_key(server, json!({})), full_key(server, json!({})));
    let expiring = full_key(server, json!({"expires_in_seconds": 1}));
    let before = state(server);
    assert_eq!(
        before["limits"]["summary"]["full"], 4,
        "{}",
        before["limits"]["summary"]
    );

    let path = format!("/v1/admin/gateway/keys/{revoked}");
    assert_eq!(request(server, "DELETE", &path, Some(ADMIN_TOKEN), b"").status, 200);
    // A rotation hands the key's limits to its successor: they still count.
    let path = format!("/v1/admin/gateway/keys/{rotated}/rotate");
    let rotation = request(server, "POST", &path, Some(ADMIN_TOKEN), br#"{"grace_seconds": 0}"#);
    assert_eq!(rotation.status, 201, "{}", rotation.text());

    let started = Instant::now();
    let after = loop {
        let after = state(server);
        // The revoked key's rpm and budget, the expiring key's rpm once it expired.
        if after["limits"]["summary"]["retired"] == 3 {
            break after;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the expiring key never retired: {}",
            after["limits"]
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let summary = &after["limits"]["summary"];
    assert_eq!(
        (summary["full"].as_u64(), summary["above_80_percent"].as_u64()),
        (Some(2), Some(2)),
        "only the working keys' limits count: {summary}"
    );
    let retired = |id: &str| limit_row(&after, &format!("key:{id}:llm:rpm"))["retired"].clone();
    assert_eq!(retired(&revoked), "revoked");
    assert_eq!(retired(&expiring), "expired");
    assert_eq!(retired(&rotated), Value::Null, "its successor charges it");
    assert_eq!(retired(&working), Value::Null);
    // The budgets panel marks a revoked key's budget too.
    let budgets = request(server, "GET", "/ui/api/budgets", Some(ADMIN_TOKEN), b"").json();
    let budget = (budgets["rows"].as_array().unwrap().iter())
        .find(|r| r["key"] == format!("key:{revoked}:usd:day"))
        .unwrap_or_else(|| panic!("no budget of the revoked key: {budgets}"));
    assert_eq!(budget["retired"], "revoked", "{budget}");
    // Still shown as they are: what they hold until their window rolls.
    assert_eq!(
        limit_row(&after, &format!("key:{revoked}:llm:rpm"))["utilization_bp"],
        10_000
    );
}
