//! The console's budgets panel and spend chart through the real `ratelimiterd`
//! binary in front of the provider simulator (docs/console.md, "Budgets and
//! spend"): `GET /ui/api/budgets` lists each budget in money with its owner,
//! span, spent, reserved and left, and `GET /ui/api/spend` the last days' spend
//! by tenant and by model, both under the console's access rule.

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ratelimiter::price::{billed_micro_usd, list_price, Usage};
use ratelimiter::spend::UtcDay;
use ratelimiter::{Clock, SystemClock};
use serde_json::{json, Value};
use support::gateway_setup::{gateway_addr, start_sim};
use support::raw::request;
use support::{temp_dir, BackendConfig, Daemon, ADMIN_TOKEN};

/// The configured tenant's key (from the environment, as the configuration says).
const TENANT_KEY: &str = "console-budgets-test-key-0123456789";

/// A gateway with $1 a day, a model with $2 an hour (a rolling window) and a
/// tenant with $0.50 a day.
fn gateway_section(sim: SocketAddr) -> String {
    std::env::set_var("CONSOLE_BUDGETS_TEST_KEY", TENANT_KEY);
    format!(
        "gateway:\n  listen_addr: \"127.0.0.1:0\"\n  budgets: [{{usd: 1, period: day}}]\n  upstreams:\n    - {{name: sim, kind: openai, base_url: \"http://{sim}\"}}\n  models:\n    - {{name: gpt-4o-mini, upstream: sim, rpm: 1000, tpm: 1000000, concurrency: 8, max_output_tokens_default: 64, budgets: [{{usd: 2, window_seconds: 3600}}]}}\n  tenants:\n    - {{name: team, api_key_env: CONSOLE_BUDGETS_TEST_KEY, budgets: [{{usd: 0.5, period: day}}]}}\n"
    )
}

/// One chat call; its billed cost from the usage it answers and the list price.
fn chat(gateway: SocketAddr, output_tokens: u64) -> u64 {
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 16, "sim_output_tokens": output_tokens,
        "messages": [{"role": "user", "content": "Hi there"}]});
    let response = request(
        gateway,
        "POST",
        "/v1/chat/completions",
        Some(TENANT_KEY),
        body.to_string().as_bytes(),
    );
    assert_eq!(response.status, 200, "{}", response.text());
    let answer: Value = serde_json::from_str(&response.text()).unwrap();
    let usage = Usage {
        input_tokens: answer["usage"]["prompt_tokens"].as_u64().unwrap(),
        output_tokens: answer["usage"]["completion_tokens"].as_u64().unwrap(),
        ..Usage::default()
    };
    billed_micro_usd(&list_price("openai", "gpt-4o-mini").unwrap().price, &usage)
}

/// A console document, with the admin token.
fn console_get(server: SocketAddr, path: &str) -> Value {
    let response = request(server, "GET", path, Some(ADMIN_TOKEN), b"");
    assert_eq!(response.status, 200, "{path}: {}", response.text());
    serde_json::from_str(&response.text()).unwrap()
}

/// The row of budget `key`.
fn row<'a>(budgets: &'a Value, key: &str) -> &'a Value {
    (budgets["rows"].as_array().unwrap().iter())
        .find(|r| r["key"] == key)
        .unwrap_or_else(|| panic!("no budget {key}: {budgets}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budgets_panel_splits_what_each_budget_holds_and_the_chart_sums_the_days() {
    let sim = start_sim().await;
    let dir = temp_dir("console-budgets");
    let daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", &gateway_section(sim));
    let gateway = gateway_addr(&daemon);
    let billed: u64 = [3, 9, 5].into_iter().map(|tokens| chat(gateway, tokens)).sum();
    assert!(billed > 0);

    // The ledger records each call just after it completes: wait for all three.
    let started = Instant::now();
    let budgets = loop {
        let budgets = console_get(daemon.addr, "/ui/api/budgets");
        if row(&budgets, "gateway:usd:day")["spent_micro_usd"] == billed {
            break budgets;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "spent never {billed}: {budgets}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(budgets["total"], 3, "{budgets}");
    let end_of_day = (UtcDay::of_unix_ms(SystemClock::new().now_unix_ms()).days_since_epoch() as u64 + 1) * 86_400_000;
    for (key, owner, name, budget) in [
        ("gateway:usd:day", "gateway", Value::Null, 1_000_000u64),
        ("tenant:team:usd:day", "tenant", json!("team"), 500_000),
    ] {
        let r = row(&budgets, key);
        assert_eq!((r["owner"].as_str(), &r["owner_name"]), (Some(owner), &name), "{r}");
        assert_eq!(
            (r["span"].as_str(), r["budget_micro_usd"].as_u64()),
            (Some("day"), Some(budget))
        );
        assert_eq!(r["spent_micro_usd"], billed, "{r}");
        assert_eq!(r["reserved_micro_usd"], 0, "nothing in flight: {r}");
        assert_eq!(r["left_micro_usd"], budget - billed, "{r}");
        assert_eq!(r["period_ends_unix_ms"], end_of_day, "{r}");
    }
    // A rolling window's held spend cannot be split by the ledger's days.
    let window = row(&budgets, "model:gpt-4o-mini:usd:window3600");
    assert_eq!(
        (window["owner"].as_str(), window["owner_name"].as_str()),
        (Some("model"), Some("gpt-4o-mini"))
    );
    assert_eq!(
        (window["held_micro_usd"].as_u64(), window["spent_micro_usd"].is_null()),
        (Some(billed), true)
    );
    assert_eq!(window["left_micro_usd"], 2_000_000 - billed);

    let spend = console_get(daemon.addr, "/ui/api/spend");
    let days = spend["days"].as_array().unwrap();
    assert_eq!(days.len(), 14, "{spend}");
    let today = UtcDay::of_unix_ms(SystemClock::new().now_unix_ms()).to_string();
    assert_eq!(days.last().unwrap().as_str(), Some(today.as_str()));
    for (grouping, name) in [("by_tenant", "team"), ("by_model", "gpt-4o-mini")] {
        let series = &spend[grouping].as_array().unwrap()[0];
        assert_eq!(series["name"], name, "{spend}");
        let values = series["micro_usd"].as_array().unwrap();
        assert_eq!((values.len(), &values[13]), (14, &json!(billed)), "{spend}");
        assert!(values[..13].iter().all(|v| v == 0), "{spend}");
    }

    // Under the console's rule: the admin token is needed.
    for path in ["/ui/api/budgets", "/ui/api/spend"] {
        assert_eq!(request(daemon.addr, "GET", path, None, b"").status, 401, "{path}");
    }
}
