//! A budget that owes refuses (docs/gateway.md, "Budgets and spend"), checked
//! against the provider simulator's own bill: Responses calls that offer the
//! hosted web search are billed 8,000 input tokens of search content each,
//! which no gateway can bound before the call, so each bill passes what its
//! call reserved. The budget takes what it can hold; the first bill it cannot
//! hold makes it owe, and every later call is refused until its period ends.
//! The bill passes the budget by less than one call's bill, whether the budget
//! is the tenant's, a runtime key's, the model's or the gateway's, on one
//! memory server and on two servers of one TigerBeetle cluster.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;

use ratelimiter::SystemClock;
use replay::sim::control::SimControl;
use replay::sim::limits::{Accounting, ProviderLimits};
use replay::sim::server::ProviderServer;
use serde_json::{json, Value};
use support::gateway_setup::gateway_addr;
use support::raw::{request, Response};
use support::{temp_dir, BackendConfig, Daemon, ADMIN_TOKEN};

/// The tenant's key, from the environment as the configuration says.
const TENANT_KEY: &str = "gateway-debt-test-key-0123456789";
/// The budget: $0.005, about four calls' bills.
const BUDGET_USD: &str = "0.005";
/// The same, in the simulator's pico-dollars.
const BUDGET_PICO_USD: u128 = 5_000_000_000;
/// Calls sent: far more than the budget pays for.
const CALLS: usize = 12;
/// `gpt-4o-mini`'s list price, USD per million input and output tokens
/// (<https://platform.openai.com/docs/pricing>), for the simulator and the gateway alike.
const PRICE: (f64, f64) = (0.15, 0.6);

/// Where the budget under test is configured.
#[derive(Debug, Clone, Copy)]
enum Scope {
    Tenant,
    Key,
    Model,
    Gateway,
}

/// The simulator billing `gpt-4o-mini` at [`PRICE`], on a free loopback port.
async fn start_billing_sim() -> SocketAddr {
    let price = replay::sim::price::Price::parse(&format!("input:{},output:{}", PRICE.0, PRICE.1)).unwrap();
    let billing = replay::sim::billing::Billing::new([("gpt-4o-mini".to_owned(), price)].into());
    let limits = ProviderLimits {
        rpm: 10_000,
        tpm: 10_000_000,
        window_ms: 60_000,
        concurrency: 64,
        ms_per_output_token: 0,
        accounting: Accounting::Actual,
    };
    let control = SimControl::default().with_billing(billing);
    let provider = ProviderServer::with_control(limits, Arc::new(SystemClock::new()), control);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(Arc::clone(&provider).serve(listener, std::future::pending()));
    addr
}

/// The gateway section with the budget at `scope` (a key's is made through
/// the API, see [`key_with_budget`]).
fn gateway_section(sim: SocketAddr, scope: Scope) -> String {
    std::env::set_var("GATEWAY_DEBT_TEST_KEY", TENANT_KEY);
    let budget = format!("budgets: [{{usd: {BUDGET_USD}, period: day}}]");
    let on = |wanted: Scope| {
        if std::mem::discriminant(&wanted) == std::mem::discriminant(&scope) {
            format!(", {budget}")
        } else {
            String::new()
        }
    };
    let gateway = if matches!(scope, Scope::Gateway) {
        format!("  {budget}\n")
    } else {
        String::new()
    };
    format!(
        "gateway:\n  listen_addr: \"127.0.0.1:0\"\n{gateway}  upstreams:\n    - {{name: sim, kind: openai, base_url: \"http://{sim}\"}}\n  models:\n    - {{name: gpt-4o-mini, upstream: sim, rpm: 1000, tpm: 1000000, max_output_tokens_default: 16, price: {{input: {}, output: {}}}{}}}\n  tenants:\n    - {{name: fin, api_key_env: GATEWAY_DEBT_TEST_KEY{}}}\n",
        PRICE.0,
        PRICE.1,
        on(Scope::Model),
        on(Scope::Tenant),
    )
}

/// A runtime tenant and a key of it with the budget: the key's text.
fn key_with_budget(server: SocketAddr) -> String {
    let tenant = json!({"name": "runtime-fin"});
    let created = request(server, "POST", "/v1/admin/gateway/tenants", Some(ADMIN_TOKEN), tenant.to_string().as_bytes());
    assert_eq!(created.status, 201, "{}", created.text());
    let budget: f64 = BUDGET_USD.parse().unwrap();
    let key = json!({"tenant": "runtime-fin", "budgets": [{"usd": budget, "period": "day"}]});
    let created = request(server, "POST", "/v1/admin/gateway/keys", Some(ADMIN_TOKEN), key.to_string().as_bytes());
    assert_eq!(created.status, 201, "{}", created.text());
    let created: Value = serde_json::from_str(&created.text()).unwrap();
    created["key"].as_str().unwrap().to_owned()
}

/// One Responses call offering the web search, through `gateway` with `key`.
fn searching_call(gateway: SocketAddr, key: &str) -> Response {
    let body = json!({"model": "gpt-4o-mini", "input": "What changed in the news today?",
        "tools": [{"type": "web_search"}]});
    request(gateway, "POST", "/v1/responses", Some(key), body.to_string().as_bytes())
}

/// What the simulator billed since it started, in pico-dollars.
fn sim_bill(sim: SocketAddr) -> u128 {
    let response = request(sim, "GET", "/sim/billing", None, b"");
    assert_eq!(response.status, 200, "{}", response.text());
    let bill: Value = serde_json::from_str(&response.text()).unwrap();
    bill["total"]["pico_usd"].as_str().unwrap().parse().unwrap()
}

/// Sends [`CALLS`] searching calls, in turn through each of `gateways`, and
/// checks the simulator's bill, the refusals and what the budget says of itself.
fn calls_stop_once_the_budget_owes(sim: SocketAddr, gateways: &[SocketAddr], key: &str, scope: Scope) {
    let (mut served, mut last_refusal) = (0u128, None);
    for i in 0..CALLS {
        let answer = searching_call(gateways[i % gateways.len()], key);
        match answer.status {
            200 => {
                assert!(last_refusal.is_none(), "{scope:?}: a call served after a refusal");
                served += 1;
                let body: Value = serde_json::from_str(&answer.text()).unwrap();
                assert_eq!(body["output"][0]["type"], "web_search_call", "{body}");
            }
            429 => last_refusal = Some(answer),
            other => panic!("{scope:?}: {other}: {}", answer.text()),
        }
    }
    let billed = sim_bill(sim);
    let refusal = last_refusal.unwrap_or_else(|| panic!("{scope:?}: all {CALLS} calls served, {billed} billed"));
    assert!(served >= 2, "{scope:?}: the budget paid for {served} calls");
    let one_call = billed / served;
    assert!(
        billed <= BUDGET_PICO_USD + one_call,
        "{scope:?}: billed {billed} pico-dollars on a budget of {BUDGET_PICO_USD}, one call {one_call}"
    );
    let text = refusal.text();
    assert_eq!(refusal.header("x-should-retry"), Some("false"), "{scope:?}: {text}");
    assert_eq!(refusal.header("x-ratelimit-remaining-usd"), Some("0.000000"), "{scope:?}: {text}");
    assert!(text.contains(":usd:day") && text.contains("It resets at"), "{scope:?}: {text}");
}

/// The budget's row in the console agrees with admission: nothing left, owing.
fn console_says_owing(server: SocketAddr, scope: Scope) {
    let response = request(server, "GET", "/ui/api/budgets", Some(ADMIN_TOKEN), b"");
    assert_eq!(response.status, 200, "{}", response.text());
    let budgets: Value = serde_json::from_str(&response.text()).unwrap();
    let rows = budgets["rows"].as_array().unwrap();
    let row = rows.iter().find(|r| r["owing"] == true).unwrap_or_else(|| panic!("{scope:?}: {budgets}"));
    assert_eq!(row["left_micro_usd"], 0, "{scope:?}: {row}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_that_owes_refuses_on_memory_in_every_scope() {
    for scope in [Scope::Tenant, Scope::Key, Scope::Model, Scope::Gateway] {
        let sim = start_billing_sim().await;
        let dir = temp_dir("gateway-debt-memory");
        let daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", &gateway_section(sim, scope));
        let key = match scope {
            Scope::Key => key_with_budget(daemon.addr),
            _ => TENANT_KEY.to_owned(),
        };
        calls_stop_once_the_budget_owes(sim, &[gateway_addr(&daemon)], &key, scope);
        console_says_owing(daemon.addr, scope);
    }
}

#[cfg(feature = "tigerbeetle")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_that_owes_refuses_on_every_server_of_a_fleet() {
    let cluster = ratelimiter::tigerbeetle::LocalCluster::start().expect("starting a local TigerBeetle");
    let backend = BackendConfig::TigerBeetle {
        addresses: cluster.address(),
        settings: "  sessions: 2\n  request_timeout_ms: 2000\n",
    };
    let sim = start_billing_sim().await;
    let (dir_a, dir_b) = (temp_dir("gateway-debt-fleet-a"), temp_dir("gateway-debt-fleet-b"));
    let a = Daemon::start_on(&dir_a, backend, "", &gateway_section(sim, Scope::Tenant));
    let b = Daemon::start_on(&dir_b, backend, "", &gateway_section(sim, Scope::Tenant));
    let gateways = [gateway_addr(&a), gateway_addr(&b)];
    calls_stop_once_the_budget_owes(sim, &gateways, TENANT_KEY, Scope::Tenant);
    console_says_owing(a.addr, Scope::Tenant);
    console_says_owing(b.addr, Scope::Tenant);
}
