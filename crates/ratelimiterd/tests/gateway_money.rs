//! Budgets in money against the provider simulator's own bill, through the
//! real `ratelimiterd` binary, on one memory server and on two servers of one
//! TigerBeetle cluster (docs/gateway.md, "Budgets and spend"):
//!
//! - a budget that owes refuses: Responses calls that offer the hosted web
//!   search are billed 8,000 input tokens of search content each, which no
//!   gateway can bound before the call. The budget takes what it can hold; the
//!   first bill it cannot hold makes it owe, and every later call is refused
//!   until its period ends, so the bill passes the budget by less than one
//!   call's bill, whether the budget is the tenant's, a runtime key's, the
//!   model's or the gateway's;
//! - the bound reserved is the bound sent: calls that name no output bound are
//!   sent the one they reserved, so the bill never passes the budget;
//! - a try sent is a try charged: a pool's failover after the first deployment
//!   received the call keeps that try on the budget, which holds at least what
//!   both deployments billed.

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

/// The simulator billing `gpt-4o-mini` at [`PRICE`], on a free loopback port,
/// answering at once.
async fn start_billing_sim() -> SocketAddr {
    start_billing_sim_slowed(0).await
}

/// The same, answering after `ms_per_output_token` per output token.
async fn start_billing_sim_slowed(ms_per_output_token: u64) -> SocketAddr {
    let price = replay::sim::price::Price::parse(&format!("input:{},output:{}", PRICE.0, PRICE.1)).unwrap();
    let billing = replay::sim::billing::Billing::new([("gpt-4o-mini".to_owned(), price)].into());
    let limits = ProviderLimits {
        rpm: 10_000,
        tpm: 10_000_000,
        window_ms: 60_000,
        concurrency: 64,
        ms_per_output_token,
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
    let created = request(
        server,
        "POST",
        "/v1/admin/gateway/tenants",
        Some(ADMIN_TOKEN),
        tenant.to_string().as_bytes(),
    );
    assert_eq!(created.status, 201, "{}", created.text());
    let budget: f64 = BUDGET_USD.parse().unwrap();
    let key = json!({"tenant": "runtime-fin", "budgets": [{"usd": budget, "period": "day"}]});
    let created = request(
        server,
        "POST",
        "/v1/admin/gateway/keys",
        Some(ADMIN_TOKEN),
        key.to_string().as_bytes(),
    );
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
    assert_eq!(
        refusal.header("x-ratelimit-remaining-usd"),
        Some("0.000000"),
        "{scope:?}: {text}"
    );
    assert!(
        text.contains(":usd:day") && text.contains("It resets at"),
        "{scope:?}: {text}"
    );
}

/// The budget's row in the console agrees with admission: nothing left, owing.
fn console_says_owing(server: SocketAddr, scope: Scope) {
    let response = request(server, "GET", "/ui/api/budgets", Some(ADMIN_TOKEN), b"");
    assert_eq!(response.status, 200, "{}", response.text());
    let budgets: Value = serde_json::from_str(&response.text()).unwrap();
    let rows = budgets["rows"].as_array().unwrap();
    let row = rows
        .iter()
        .find(|r| r["owing"] == true)
        .unwrap_or_else(|| panic!("{scope:?}: {budgets}"));
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

/// Two servers of one fresh TigerBeetle cluster with the gateway `section`.
#[cfg(feature = "tigerbeetle")]
struct Fleet {
    servers: [Daemon; 2],
    _dirs: [support::TempDir; 2],
    _cluster: ratelimiter::tigerbeetle::LocalCluster,
}

#[cfg(feature = "tigerbeetle")]
impl Fleet {
    fn start(name: &str, section: &str) -> Self {
        let cluster = ratelimiter::tigerbeetle::LocalCluster::start().expect("starting a local TigerBeetle");
        let backend = BackendConfig::TigerBeetle {
            addresses: cluster.address(),
            settings: "  sessions: 2\n  request_timeout_ms: 2000\n",
        };
        let dirs = [temp_dir(&format!("{name}-a")), temp_dir(&format!("{name}-b"))];
        let servers = [0, 1].map(|i| Daemon::start_on(&dirs[i], backend, "", section));
        Self {
            servers,
            _dirs: dirs,
            _cluster: cluster,
        }
    }

    /// Both servers' gateway addresses.
    fn gateways(&self) -> [SocketAddr; 2] {
        [gateway_addr(&self.servers[0]), gateway_addr(&self.servers[1])]
    }
}

#[cfg(feature = "tigerbeetle")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_that_owes_refuses_on_every_server_of_a_fleet() {
    let sim = start_billing_sim().await;
    let fleet = Fleet::start("gateway-money-owes", &gateway_section(sim, Scope::Tenant));
    calls_stop_once_the_budget_owes(sim, &fleet.gateways(), TENANT_KEY, Scope::Tenant);
    for server in &fleet.servers {
        console_says_owing(server.addr, Scope::Tenant);
    }
}

/// The output bound the model reserves for a call that names none.
const DEFAULT_BOUND_TOKENS: u64 = 64;
/// The budget of the bound and failover tests: $0.0005, a dozen bounded calls'
/// worst cases.
const SMALL_BUDGET_USD: &str = "0.0005";
/// The same, in pico-dollars.
const SMALL_BUDGET_PICO_USD: u128 = 500_000_000;

/// A gateway whose tenant has the budget, with `models` and `upstreams` as
/// given (YAML flow entries, indented for the section) and `extra` lines.
fn section_with(upstreams: &str, models: &str, extra: &str) -> String {
    std::env::set_var("GATEWAY_DEBT_TEST_KEY", TENANT_KEY);
    format!(
        "gateway:\n  listen_addr: \"127.0.0.1:0\"\n{extra}  upstreams:\n{upstreams}  models:\n{models}  tenants:\n    - {{name: fin, api_key_env: GATEWAY_DEBT_TEST_KEY, budgets: [{{usd: {SMALL_BUDGET_USD}, period: day}}]}}\n"
    )
}

/// A chat or Responses call that names no output bound, in turn.
fn unbounded_call(gateway: SocketAddr, round: usize) -> Response {
    let (path, body) = if round % 2 == 0 {
        (
            "/v1/chat/completions",
            json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Write a long story."}]}),
        )
    } else {
        (
            "/v1/responses",
            json!({"model": "gpt-4o-mini", "input": "Write a long story."}),
        )
    };
    request(gateway, "POST", path, Some(TENANT_KEY), body.to_string().as_bytes())
}

/// Calls that name no bound, through each of `gateways` in turn: each is sent
/// the bound it reserved, and the bill stays within the budget.
fn unbounded_calls_stay_within_the_budget(sim: SocketAddr, gateways: &[SocketAddr]) {
    let (mut served, mut refused) = (0, 0);
    for round in 0..CALLS * 2 {
        let answer = unbounded_call(gateways[round % gateways.len()], round);
        if answer.status == 429 {
            refused += 1;
            continue;
        }
        assert_eq!(answer.status, 200, "{}", answer.text());
        served += 1;
        let usage = &serde_json::from_str::<Value>(&answer.text()).unwrap()["usage"];
        let output = usage["completion_tokens"].as_u64().or(usage["output_tokens"].as_u64());
        assert_eq!(
            output,
            Some(DEFAULT_BOUND_TOKENS),
            "the bound reserved is the bound sent: {usage}"
        );
    }
    let billed = sim_bill(sim);
    assert!(
        billed <= SMALL_BUDGET_PICO_USD,
        "billed {billed} pico-dollars on a budget of {SMALL_BUDGET_PICO_USD}"
    );
    assert!(served >= 2 && refused > 0, "served {served}, refused {refused}");
}

/// The upstream timeout of the failover tests: far below the slow simulator's
/// answer (64 tokens at [`SLOW_MS_PER_TOKEN`] each).
const FAILOVER_TIMEOUT_MS: u64 = 200;
/// The slow simulator's time per output token.
const SLOW_MS_PER_TOKEN: u64 = 20;

/// The tenant's budget in micro-dollars, as the admin API reports it on `server`.
fn budget_in_use(server: SocketAddr) -> u64 {
    let path = "/v1/admin/limits/tenant:fin:usd:day";
    let report = request(server, "GET", path, Some(ADMIN_TOKEN), b"");
    assert_eq!(report.status, 200, "{}", report.text());
    serde_json::from_str::<Value>(&report.text()).unwrap()["in_use"]
        .as_u64()
        .unwrap()
}

/// Calls through each of `gateways` in turn to a pool whose first deployment
/// (`slow`) bills each call when it receives it and answers too late: every
/// call fails over to `fast`, which bills it again. Both tries stay on the
/// budget, which holds at least the two bills, and the calls stop before the
/// bills pass it.
fn failed_over_tries_stay_charged(slow: SocketAddr, fast: SocketAddr, gateways: &[SocketAddr], admin: SocketAddr) {
    let (mut served, mut refused) = (0, 0);
    for round in 0..CALLS * 2 {
        let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Write a long story."}]});
        let gateway = gateways[round % gateways.len()];
        let answer = request(
            gateway,
            "POST",
            "/v1/chat/completions",
            Some(TENANT_KEY),
            body.to_string().as_bytes(),
        );
        match answer.status {
            429 => refused += 1,
            200 => served += 1,
            other => panic!("{other}: {}", answer.text()),
        }
    }
    let (first, second) = (sim_bill(slow), sim_bill(fast));
    assert!(first > 0 && second > 0, "both deployments billed: {first}, {second}");
    assert!(served > 0 && refused > 0, "served {served}, refused {refused}");
    let charged = u128::from(budget_in_use(admin)) * 1_000_000;
    assert!(
        charged >= first + second,
        "the budget holds {charged} pico-dollars, the simulators billed {first} + {second}"
    );
    assert!(
        first + second <= SMALL_BUDGET_PICO_USD,
        "billed {first} + {second} pico-dollars on a budget of {SMALL_BUDGET_PICO_USD}"
    );
}

/// The model of [`failed_over_tries_stay_charged`]: the slow deployment first.
fn failover_section(slow: SocketAddr, fast: SocketAddr) -> String {
    let upstreams = format!(
        "    - {{name: slow, kind: openai, base_url: \"http://{slow}\"}}\n    - {{name: fast, kind: openai, base_url: \"http://{fast}\"}}\n"
    );
    let models = format!(
        "    - {{name: gpt-4o-mini, routing: ordered, max_output_tokens_default: {DEFAULT_BOUND_TOKENS}, price: {{input: {}, output: {}}}, breaker: {{failures: 1000}}, deployments: [{{upstream: slow}}, {{upstream: fast, priority: 1}}]}}\n",
        PRICE.0, PRICE.1
    );
    section_with(
        &upstreams,
        &models,
        &format!("  upstream_timeout_ms: {FAILOVER_TIMEOUT_MS}\n"),
    )
}

/// The model of [`unbounded_calls_stay_within_the_budget`].
fn unbounded_section(sim: SocketAddr) -> String {
    let upstreams = format!("    - {{name: sim, kind: openai, base_url: \"http://{sim}\"}}\n");
    let models = format!(
        "    - {{name: gpt-4o-mini, upstream: sim, tpm: 10000000, max_output_tokens_default: {DEFAULT_BOUND_TOKENS}, price: {{input: {}, output: {}}}}}\n",
        PRICE.0, PRICE.1
    );
    section_with(&upstreams, &models, "")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bound_sent_and_a_failed_over_try_keep_the_bill_within_the_budget_on_memory() {
    let sim = start_billing_sim().await;
    let dir = temp_dir("gateway-money-bound");
    let daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", &unbounded_section(sim));
    unbounded_calls_stay_within_the_budget(sim, &[gateway_addr(&daemon)]);
    let (slow, fast) = (
        start_billing_sim_slowed(SLOW_MS_PER_TOKEN).await,
        start_billing_sim().await,
    );
    let dir = temp_dir("gateway-money-failover");
    let daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", &failover_section(slow, fast));
    failed_over_tries_stay_charged(slow, fast, &[gateway_addr(&daemon)], daemon.addr);
}

#[cfg(feature = "tigerbeetle")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bound_sent_and_a_failed_over_try_keep_the_bill_within_the_budget_on_a_fleet() {
    let sim = start_billing_sim().await;
    let fleet = Fleet::start("gateway-money-bound", &unbounded_section(sim));
    unbounded_calls_stay_within_the_budget(sim, &fleet.gateways());
    drop(fleet);
    // Another cluster, so the tenant's budget starts from nothing.
    let (slow, fast) = (
        start_billing_sim_slowed(SLOW_MS_PER_TOKEN).await,
        start_billing_sim().await,
    );
    let fleet = Fleet::start("gateway-money-failover", &failover_section(slow, fast));
    failed_over_tries_stay_charged(slow, fast, &fleet.gateways(), fleet.servers[1].addr);
}
