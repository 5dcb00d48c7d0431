//! The operator's console without a browser (docs/console.md): the page's files
//! compiled in and served offline with a strict policy, who may read the state
//! endpoint, and what it answers: limits with usage, history, next release,
//! sorting and paging; the gateway's models and tenants; no key material.
//! The browser itself is tested by scripts/browser-test.sh.

mod support;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use ratelimiter::memory::MemoryBackend;
use ratelimiter::registry::Registry;
use ratelimiter::{FakeClock, LeaseId};
use ratelimiterd::{app, AppState, Config};
use serde_json::{json, Value};
use support::{temp_dir, Daemon, TempDir};
use tower::ServiceExt;

const ADMIN_TOKEN: &str = "console-admin-token-0123456789";
const TENANT_KEY: &str = "console-tenant-key-0123456789abcdef";
const UPSTREAM_KEY: &str = "sk-console-upstream-0123456789abcdef";
const START_UNIX_MS: u64 = 1_700_000_000_000;

struct Harness {
    router: Router,
    clock: FakeClock,
    state: AppState,
    _dir: TempDir,
}

fn harness(name: &str, yaml: &str) -> Harness {
    let dir = temp_dir(name);
    let registry_path = dir.join("limits.json");
    let text = format!("registry:\n  path: {}\n{yaml}", registry_path.display());
    let config = Config::parse(&text, std::path::Path::new("test.yaml")).unwrap();
    let clock = FakeClock::new(START_UNIX_MS);
    let backend = Arc::new(MemoryBackend::new(
        Arc::new(clock.clone()),
        ratelimiterd::backend::memory_config(&config),
    ));
    let state = AppState::new(
        ratelimiterd::backend::SelectedBackend::of(backend),
        Some(Registry::open(&registry_path).unwrap()),
        &config,
    );
    if let Some(section) = &config.gateway {
        let gateway = gateway::Gateway::new(section, state.backend().clone()).unwrap();
        state.set_gateway(Arc::new(gateway));
    }
    Harness {
        router: app(state.clone()),
        clock,
        state,
        _dir: dir,
    }
}

fn with_token() -> String {
    format!("server:\n  admin_token: {ADMIN_TOKEN}\n")
}

struct Answer {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    text: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("{e}: {}", self.text))
    }
}

impl Harness {
    async fn send(&self, method: Method, path: &str, body: Option<Value>, token: Option<&str>) -> Answer {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let body = body.map(|b| Body::from(b.to_string())).unwrap_or_else(Body::empty);
        let response = self.router.clone().oneshot(request.body(body).unwrap()).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 26).await.unwrap();
        Answer {
            status,
            headers,
            text: String::from_utf8_lossy(&bytes).into_owned(),
        }
    }

    async fn read(&self, query: &str) -> Value {
        let answer = self
            .send(Method::GET, &format!("/ui/api/state{query}"), None, Some(ADMIN_TOKEN))
            .await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
        answer.json()
    }

    async fn define(&self, key: &str, capacity: u64) {
        let definition =
            json!({"key": key, "kind": "rolling", "capacity": capacity, "window_seconds": 60, "unit": "requests"});
        let answer = self
            .send(Method::PUT, "/v1/admin/limits", Some(definition), Some(ADMIN_TOKEN))
            .await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    }

    async fn reserve(&self, key: &str, amount: u64) {
        let body =
            json!({"lease_id": LeaseId::generate().to_string(), "requirements": [{"key": key, "amount": amount}]});
        let answer = self
            .send(Method::POST, "/v1/reserve", Some(body), Some(ADMIN_TOKEN))
            .await;
        assert_eq!(answer.json()["allowed"], true, "{}", answer.text);
    }
}

fn row<'a>(state: &'a Value, key: &str) -> &'a Value {
    (state["limits"]["rows"].as_array().unwrap().iter())
        .find(|r| r["key"] == key)
        .unwrap_or_else(|| panic!("no row {key} in {}", state["limits"]))
}

fn keys(state: &Value) -> Vec<String> {
    (state["limits"]["rows"].as_array().unwrap().iter())
        .map(|r| r["key"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn the_page_and_its_files_are_served_offline_with_a_strict_policy() {
    let h = harness("console-files", &with_token());
    for (path, content_type) in [
        ("/ui", "text/html"),
        ("/ui/", "text/html"),
        ("/ui/shared.js", "text/javascript"),
        ("/ui/console.js", "text/javascript"),
        ("/ui/keys.js", "text/javascript"),
        ("/ui/console.css", "text/css"),
        ("/ui/favicon.svg", "image/svg+xml"),
    ] {
        let answer = h.send(Method::GET, path, None, None).await;
        assert_eq!(answer.status, StatusCode::OK, "{path}");
        let served = answer.headers[header::CONTENT_TYPE].to_str().unwrap();
        assert!(served.starts_with(content_type), "{path}: {served}");
        let policy = answer.headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        assert!(
            policy.contains("default-src 'none'") && policy.contains("connect-src 'self'"),
            "{policy}"
        );
        assert_eq!(answer.headers[header::X_FRAME_OPTIONS], "DENY");
        // Offline: nothing is fetched from another origin (the SVG namespace is a name, not a fetch).
        let outside = answer.text.replace("http://www.w3.org/2000/svg", "");
        assert!(
            !outside.contains("http://") && !outside.contains("https://"),
            "{path} loads from elsewhere"
        );
    }
    let page = h.send(Method::GET, "/ui", None, None).await.text;
    assert!(page.contains("src=\"/ui/console.js\"") && page.contains("href=\"/ui/console.css\""));
    let (shared, console) = (page.find("src=\"/ui/shared.js\""), page.find("src=\"/ui/console.js\""));
    assert!(
        shared.is_some_and(|s| console.is_some_and(|c| s < c)),
        "the shared helpers load first"
    );
    assert!(page.contains("src=\"/ui/keys.js\"") && page.contains("id=\"keys-panel\""));
    assert!(!page.contains("<script>"), "no inline script: the policy forbids it");
}

#[tokio::test]
async fn the_state_needs_the_admin_token_when_one_is_configured() {
    let h = harness("console-token", &with_token());
    for token in [None, Some("not-the-admin-token-at-all"), Some("")] {
        let answer = h.send(Method::GET, "/ui/api/state", None, token).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{token:?}");
        assert_eq!(answer.json()["error"], "unauthorized");
    }
    let answer = h.send(Method::GET, "/ui/api/state", None, Some(ADMIN_TOKEN)).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.headers[header::CACHE_CONTROL], "no-store");
}

#[tokio::test]
async fn without_a_token_the_console_is_served_on_loopback_only() {
    let local = harness("console-loopback", "server:\n  listen_addr: \"127.0.0.1:8080\"\n");
    assert_eq!(
        local.send(Method::GET, "/ui/api/state", None, None).await.status,
        StatusCode::OK
    );
    let open = harness("console-open", "server:\n  listen_addr: \":8080\"\n");
    for path in ["/ui", "/ui/console.js", "/ui/api/state"] {
        let answer = open.send(Method::GET, path, None, None).await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{path}");
        assert!(
            answer.json()["error"].as_str().unwrap().contains("console is off"),
            "{}",
            answer.text
        );
    }
    let guarded = harness(
        "console-guarded",
        &format!("server:\n  listen_addr: \":8080\"\n  admin_token: {ADMIN_TOKEN}\n"),
    );
    assert_eq!(
        guarded
            .send(Method::GET, "/ui/api/state", None, Some(ADMIN_TOKEN))
            .await
            .status,
        StatusCode::OK
    );
}

#[test]
fn a_console_left_off_says_why_in_the_log() {
    let dir = temp_dir("console-off-log");
    let config = dir.join("config.yaml");
    let text = format!(
        "server:\n  listen_addr: \"0.0.0.0:0\"\nregistry:\n  path: {}\n",
        dir.join("limits.json").display()
    );
    std::fs::write(&config, text).unwrap();
    let daemon = Daemon::start_with(&config).unwrap();
    let logs = daemon.logs().join("\n");
    assert!(logs.contains("the console at /ui is off"), "{logs}");
}

#[tokio::test]
async fn limits_show_usage_release_history_and_sort_and_page_on_the_server() {
    let h = harness("console-limits", &with_token());
    for (i, capacity) in [10, 20, 40, 80, 160].into_iter().enumerate() {
        h.define(&format!("team:{i}:rpm"), capacity).await;
    }
    h.reserve("team:0:rpm", 9).await;
    h.reserve("team:3:rpm", 8).await;
    h.state
        .console()
        .history()
        .record_limits(&h.state.backend().limit_reports().await.unwrap(), START_UNIX_MS);
    h.clock.advance_ms(10_000);

    let state = h.read("").await;
    assert_eq!(state["backend"]["kind"], "memory");
    assert_eq!(state["backend"]["healthy"], true);
    assert_eq!(state["limits"]["total"], 5);
    assert_eq!(
        keys(&state)[..2],
        ["team:0:rpm", "team:3:rpm"],
        "the fullest first by default"
    );
    let full = row(&state, "team:0:rpm");
    assert_eq!(
        (full["in_use"].as_u64(), full["capacity"].as_u64()),
        (Some(9), Some(10))
    );
    assert_eq!(full["utilization_bp"], 9_000);
    assert_eq!(full["unit"], "requests");
    // The hold ends a window (60 s) plus the default margin after the grant; 10 s have passed.
    let release = full["next_release_ms"].as_u64().unwrap();
    assert!((50_000..=50_500).contains(&release), "{release}");
    assert_eq!(full["history"], json!([9_000]), "the sample taken before the read");
    assert_eq!(
        row(&state, "team:1:rpm")["next_release_ms"],
        Value::Null,
        "nothing held"
    );
    assert_eq!(state["limits"]["summary"]["above_80_percent"], 1);

    let state = h.read("?sort=capacity&order=asc&offset=1&count=2").await;
    assert_eq!(keys(&state), ["team:1:rpm", "team:2:rpm"]);
    assert_eq!(
        (state["limits"]["matched"].as_u64(), state["limits"]["offset"].as_u64()),
        (Some(5), Some(1))
    );
    let state = h.read("?q=TEAM:3").await;
    assert_eq!(keys(&state), ["team:3:rpm"]);
    assert_eq!(state["limits"]["matched"], 1);
    let bad = h
        .send(Method::GET, "/ui/api/state?count=9999", None, Some(ADMIN_TOKEN))
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.json()["error"].as_str().unwrap().contains("count"), "{}", bad.text);
}

/// The classes panel's data: each class as configured with its tenants, its
/// calls per second per model and in all, its wait p99, and its ceiling keys' use.
#[tokio::test]
async fn the_classes_are_shown_with_their_tenants_rates_and_ceilings() {
    std::env::set_var("CONSOLE_TEST_BATCH_KEY", "batch-tenant-key-0123456789abcdef");
    let yaml = gateway_yaml().replace(
        "  tenants:\n    - {name: acme, api_key_env: CONSOLE_TEST_TENANT_KEY, daily_tokens: 5000}\n",
        "  classes:\n    - {name: interactive, share: 4, headroom: 0.2}\n    - {name: batch, share: 1}\n  tenants:\n    - {name: acme, api_key_env: CONSOLE_TEST_TENANT_KEY, daily_tokens: 5000, class: interactive}\n    - {name: etl, api_key_env: CONSOLE_TEST_BATCH_KEY}\n",
    );
    assert!(yaml.contains("classes:"), "the configuration has classes");
    let h = harness("console-classes", &yaml);
    let gateway = h.state.gateway().unwrap().clone();
    // The server defines the gateway's limits and their ceilings at startup; here, by hand.
    for definition in gateway.definitions() {
        h.state.admin().define(definition.clone()).await.unwrap();
        for ceiling in gateway.ceilings_over(definition).unwrap() {
            h.state.admin().define(ceiling).await.unwrap();
        }
    }
    let ceiling = "class:batch:global:llm:openai:gpt-4o-mini:rpm";
    h.reserve(ceiling, 20).await;
    let metrics = h.state.gateway_metrics().unwrap();
    let batch = metrics.classes.pair("gpt-4o-mini", "batch");
    let sample = |at_unix_ms| ratelimiterd::console::history::GatewaySample {
        at_unix_ms,
        calls: metrics.call_totals(),
        queue_waits: Vec::new(),
        classes: metrics.classes.totals(),
    };
    let history = h.state.console().history();
    history.record_gateway(sample(START_UNIX_MS));
    batch.admitted.fetch_add(10, std::sync::atomic::Ordering::Relaxed);
    batch.denied.fetch_add(5, std::sync::atomic::Ordering::Relaxed);
    batch.queued.fetch_add(2, std::sync::atomic::Ordering::Relaxed);
    batch.queue_wait.observe(std::time::Duration::from_millis(40));
    batch.queue_wait.observe(std::time::Duration::from_millis(40));
    history.record_gateway(sample(START_UNIX_MS + 5_000));
    history.record_limits(&h.state.backend().limit_reports().await.unwrap(), START_UNIX_MS + 5_000);

    let state = h
        .send(Method::GET, "/ui/api/state", None, Some(ADMIN_TOKEN))
        .await
        .json();
    let classes = state["classes"]["classes"].as_array().unwrap();
    let names: Vec<&str> = classes.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["interactive", "batch"], "highest first");
    let (interactive, batch) = (&classes[0], &classes[1]);
    assert_eq!(
        (
            interactive["share"].as_u64(),
            interactive["headroom_ppm"].as_u64(),
            interactive["ceiling_ppm"].as_u64()
        ),
        (Some(4), Some(200_000), Some(1_000_000))
    );
    assert_eq!(interactive["tenants"], json!(["acme"]));
    assert_eq!(interactive["ceilings"], json!([]), "the top class has no ceiling");
    assert_eq!(batch["ceiling_ppm"], 800_000);
    assert_eq!(
        batch["tenants"],
        json!(["etl"]),
        "a tenant that names no class is in the lowest"
    );
    assert_eq!(batch["admitted_per_s"], 2.0, "10 calls in 5 s");
    assert_eq!(batch["denied_per_s"], 1.0);
    assert_eq!(batch["queued_per_s"], 0.4);
    assert_eq!(batch["admitted_history"], json!([10]), "one second of admissions kept");
    let wait = batch["wait_p99_ms"].as_f64().expect("two waits");
    assert!((40.0..=100.0).contains(&wait), "the waits' p99 bucket bound: {wait}");
    let mini = (batch["models"].as_array().unwrap().iter())
        .find(|m| m["model"] == "gpt-4o-mini")
        .unwrap();
    assert_eq!(
        (mini["admitted_per_s"].as_f64(), mini["queue_len"].as_u64()),
        (Some(2.0), Some(0))
    );
    let top = &batch["ceilings"][0];
    assert_eq!(top["key"], ceiling, "the fullest ceiling first");
    assert_eq!((top["capacity"].as_u64(), top["in_use"].as_u64()), (Some(80), Some(20)));
    assert_eq!(top["utilization_bp"], 2_500);
    assert_eq!(top["history"], json!([2_500]));
    assert_eq!(
        batch["ceilings_total"].as_u64(),
        Some(3),
        "rpm and tpm of gpt-4o-mini, rpm of gpt-4o"
    );
    let tenants = state["tenants"]["rows"].as_array().unwrap();
    let acme = tenants.iter().find(|t| t["name"] == "acme").unwrap();
    assert_eq!(acme["class"], "interactive");
}

fn gateway_yaml() -> String {
    std::env::set_var("CONSOLE_TEST_TENANT_KEY", TENANT_KEY);
    std::env::set_var("CONSOLE_TEST_UPSTREAM_KEY", UPSTREAM_KEY);
    format!(
        "{}gateway:\n  listen_addr: \"127.0.0.1:0\"\n  upstreams:\n    - {{name: openai, kind: openai, base_url: \"http://127.0.0.1:9\", api_key_env: CONSOLE_TEST_UPSTREAM_KEY}}\n  models:\n    - {{name: gpt-4o-mini, upstream: openai, rpm: 100, tpm: 10000, max_output_tokens_default: 64}}\n    - {{name: gpt-4o, upstream: openai, rpm: 50, max_output_tokens_default: 64}}\n  tenants:\n    - {{name: acme, api_key_env: CONSOLE_TEST_TENANT_KEY, daily_tokens: 5000}}\n",
        with_token()
    )
}

#[tokio::test]
async fn the_gateway_and_tenants_are_shown_without_key_material() {
    let h = harness("console-gateway", &gateway_yaml());
    for key in [
        "global:llm:openai:gpt-4o-mini:rpm",
        "global:llm:openai:gpt-4o-mini:tpm",
        "global:llm:openai:gpt-4o:rpm",
    ] {
        // The gateway's limits are defined at startup by the server; here, by hand.
        let definition = h
            .state
            .gateway()
            .unwrap()
            .definitions()
            .iter()
            .find(|d| d.key().as_str() == key)
            .unwrap()
            .clone();
        h.state.admin().define(definition).await.unwrap();
    }
    let budget = h
        .state
        .gateway()
        .unwrap()
        .definitions()
        .iter()
        .find(|d| d.key().as_str().starts_with("tenant:acme"))
        .unwrap()
        .clone();
    h.state.admin().define(budget.clone()).await.unwrap();
    h.reserve(budget.key().as_str(), 1_250).await;
    let metrics = h.state.gateway_metrics().unwrap();
    let counters = metrics.calls("gpt-4o-mini", "acme");
    counters.admitted.fetch_add(3, std::sync::atomic::Ordering::Relaxed);
    let sample = |at_unix_ms| ratelimiterd::console::history::GatewaySample {
        at_unix_ms,
        calls: metrics.call_totals(),
        queue_waits: Vec::new(),
        classes: metrics.classes.totals(),
    };
    h.state.console().history().record_gateway(sample(START_UNIX_MS));
    counters.admitted.fetch_add(10, std::sync::atomic::Ordering::Relaxed);
    counters
        .tokens_used
        .fetch_add(600, std::sync::atomic::Ordering::Relaxed);
    h.state
        .console()
        .history()
        .record_gateway(sample(START_UNIX_MS + 5_000));

    let answer = h.send(Method::GET, "/ui/api/state", None, Some(ADMIN_TOKEN)).await;
    for secret in [ADMIN_TOKEN, TENANT_KEY, UPSTREAM_KEY] {
        assert!(!answer.text.contains(secret), "key material in the state");
    }
    let state = answer.json();
    let models = state["gateway"]["models"].as_array().unwrap();
    assert_eq!(models.len(), 2);
    let mini = &models[0];
    assert_eq!(
        (mini["name"].as_str(), mini["upstream"].as_str()),
        (Some("gpt-4o-mini"), Some("openai"))
    );
    assert_eq!(
        (mini["paused"].as_bool(), mini["queue_len"].as_u64()),
        (Some(false), Some(0))
    );
    assert_eq!(mini["admitted_per_s"], 2.0, "10 calls in 5 s");
    assert_eq!(mini["tokens_per_min"], 7_200.0, "600 tokens in 5 s");
    assert_eq!(models[1]["admitted_per_s"], 0.0);
    let tenants = state["tenants"]["rows"].as_array().unwrap();
    assert_eq!(tenants.len(), 1);
    assert_eq!(tenants[0]["name"], "acme");
    assert_eq!(tenants[0]["daily_tokens"]["used"], 1_250);
    assert_eq!(tenants[0]["daily_tokens"]["remaining"], 3_750);
    assert_eq!(
        tenants[0]["budgets"],
        json!([]),
        "acme has daily tokens, no budget in money"
    );
    assert_eq!(tenants[0]["calls_per_min"], 120.0);
}

/// On TigerBeetle the console reads the cluster: its kind and health, the fleet's
/// definitions with their usage, the time to a key's next release.
#[cfg(feature = "tigerbeetle")]
#[test]
fn on_tigerbeetle_the_console_reads_the_cluster() {
    use ratelimiter::tigerbeetle::LocalCluster;
    use support::raw::{exchange, request_bytes};
    use support::BackendConfig;

    let cluster = LocalCluster::start().expect("starting a local TigerBeetle");
    let backend = BackendConfig::TigerBeetle {
        addresses: cluster.address(),
        settings: "  sessions: 2\n  request_timeout_ms: 2000\n",
    };
    let dir = temp_dir("console-tigerbeetle");
    let daemon = Daemon::start_on(&dir, backend, "", "");
    let token = Some(support::ADMIN_TOKEN);
    let send = |method: &str, path: &str, token: Option<&str>, body: Value| {
        let body = if body.is_null() {
            Vec::new()
        } else {
            body.to_string().into_bytes()
        };
        exchange(daemon.addr, &request_bytes(method, path, token, &body)).unwrap()
    };
    let definition = json!({"key": "fleet:rpm", "kind": "rolling", "capacity": 10, "window_seconds": 60});
    assert_eq!(send("PUT", "/v1/admin/limits", token, definition).status, 200);
    let lease = LeaseId::generate().to_string();
    let reserve = json!({"lease_id": lease, "requirements": [{"key": "fleet:rpm", "amount": 4}]});
    let granted = send("POST", "/v1/reserve", Some(support::CLIENT_TOKEN), reserve).json();
    assert_eq!(granted["allowed"], true, "{granted}");
    assert_eq!(send("GET", "/ui/api/state", None, Value::Null).status, 401);
    let state = send("GET", "/ui/api/state", token, Value::Null).json();
    assert_eq!(state["backend"]["kind"], "tigerbeetle");
    assert_eq!(state["backend"]["healthy"], true, "{}", state["backend"]);
    assert_eq!(state["backend"]["definitions_kept_by"], "cluster");
    let fleet = row(&state, "fleet:rpm");
    assert_eq!(
        (fleet["in_use"].as_u64(), fleet["utilization_bp"].as_u64()),
        (Some(4), Some(4_000))
    );
    // The next release is read from the cluster's pending transfers: the hold's end,
    // a 60 s window (and no margin beyond the whole second).
    let next = fleet["next_release_ms"].as_u64().expect("a hold's end on TigerBeetle");
    assert!((55_000..=61_000).contains(&next), "next release {next} ms");
}
