//! Keys made through the admin API, served by the real `ratelimiterd` binary's
//! gateway in front of the provider simulator (docs/gateway.md, "Tenants and
//! keys"): a key authenticates as its tenant, its own limits are reserved
//! with the tenant's and the model's, a model outside its scope is a 403 with
//! nothing reserved, `/v1/models` lists its scope, a revoked, expired or
//! unknown key is a 401, a rotated key works through its grace only; and, on
//! TigerBeetle, two servers of one cluster agree on a key within a second.

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::Bytes;
use serde_json::{json, Value};
use support::gateway_setup::{admin, client, gateway_addr, send, start_sim, Answer, HttpClient};
use support::{temp_dir, BackendConfig, Daemon, ADMIN_TOKEN};

/// The configured tenant's key (from the environment, as the configuration says).
const YAML_KEY: &str = "gateway-keys-test-yaml-key-0123456789";

/// A gateway serving one OpenAI and one Anthropic model, with one configured tenant.
fn gateway_section(sim: SocketAddr) -> String {
    std::env::set_var("GATEWAY_KEYS_TEST_KEY", YAML_KEY);
    format!(
        "gateway:\n  listen_addr: \"127.0.0.1:0\"\n  upstreams:\n    - {{name: sim, kind: openai, base_url: \"http://{sim}\"}}\n    - {{name: simanthropic, kind: anthropic, base_url: \"http://{sim}\"}}\n  models:\n    - {{name: gpt-4o-mini, upstream: sim, rpm: 1000, tpm: 1000000, concurrency: 8, max_output_tokens_default: 64}}\n    - {{name: claude-sonnet-4-5, upstream: simanthropic, rpm: 1000, input_tpm: 100000, output_tpm: 100000, concurrency: 8, max_output_tokens_default: 64}}\n  tenants:\n    - {{name: yaml-team, api_key_env: GATEWAY_KEYS_TEST_KEY}}\n"
    )
}

/// A key made through the admin API: `(id, key)`.
async fn create_key(client: &HttpClient, server: SocketAddr, spec: Value) -> (String, String) {
    let created = admin(
        client,
        server,
        hyper::Method::POST,
        "/v1/admin/gateway/keys",
        Some(spec),
        201,
    )
    .await;
    (
        created["id"].as_str().unwrap().to_owned(),
        created["key"].as_str().unwrap().to_owned(),
    )
}

/// What `key` holds now on `server`.
async fn in_use(client: &HttpClient, server: SocketAddr, key: &str) -> u64 {
    let report = admin(
        client,
        server,
        hyper::Method::GET,
        &format!("/v1/admin/limits/{key}"),
        None,
        200,
    )
    .await;
    report["in_use"].as_u64().unwrap()
}

/// A short OpenAI chat call of `model` with `key` as the bearer.
async fn chat(client: &HttpClient, gateway: SocketAddr, key: &str, model: &str) -> Answer {
    let body = json!({"model": model, "max_tokens": 5, "sim_output_tokens": 5,
        "messages": [{"role": "user", "content": "Hi"}]});
    let bearer = format!("Bearer {key}");
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

/// A short Anthropic Messages call of `model` with `key` as `x-api-key`.
async fn message(client: &HttpClient, gateway: SocketAddr, key: &str, model: &str) -> Answer {
    let body = json!({"model": model, "max_tokens": 5, "sim_output_tokens": 5,
        "messages": [{"role": "user", "content": "Hi"}]});
    let headers = [("x-api-key", key), ("anthropic-version", "2023-06-01")];
    send(
        client,
        hyper::Method::POST,
        format!("http://{gateway}/v1/messages"),
        &headers,
        Some(body),
    )
    .await
}

/// The model ids `/v1/models` lists to `key`.
async fn models(client: &HttpClient, gateway: SocketAddr, key: &str) -> Vec<String> {
    let bearer = format!("Bearer {key}");
    let answer = send(
        client,
        hyper::Method::GET,
        format!("http://{gateway}/v1/models"),
        &[("authorization", &bearer)],
        None,
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    (answer.json()["data"].as_array().unwrap().iter())
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Tenants and keys of the admin API take the configuration's `budgets`: each
/// is defined as its limit in micro-dollars when the record is made, reserved
/// with the call's other limits and charged its billed cost; a bad budget is a
/// 400 naming the field (docs/gateway.md, "Budgets and spend").
#[tokio::test]
async fn tenants_and_keys_of_the_admin_api_take_budgets_in_money() {
    let sim = start_sim().await;
    let dir = temp_dir("gateway-keys-budgets");
    let daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", &gateway_section(sim));
    let (gateway, server) = (gateway_addr(&daemon), daemon.addr);
    let client = client();
    let post = hyper::Method::POST;
    let bad = json!({"name": "broke", "budgets": [{"usd": -5, "period": "month"}]});
    let refused = admin(
        &client,
        server,
        post.clone(),
        "/v1/admin/gateway/tenants",
        Some(bad),
        400,
    )
    .await;
    assert!(refused.to_string().contains("budgets[0].usd"), "{refused}");
    let tenant = json!({"name": "fin", "budgets": [{"usd": 100, "period": "month"}]});
    let shown = admin(
        &client,
        server,
        post.clone(),
        "/v1/admin/gateway/tenants",
        Some(tenant),
        201,
    )
    .await;
    assert_eq!(shown["budgets"][0]["period"], "month", "{shown}");
    let (id, key) = create_key(
        &client,
        server,
        json!({"tenant": "fin", "budgets": [{"usd": 1, "period": "day"}]}),
    )
    .await;
    let answer = chat(&client, gateway, &key, "gpt-4o-mini").await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    // gpt-4o-mini's list price: $0.15 input, $0.60 output a million tokens.
    let body = answer.json();
    let usage = &body["usage"];
    let prompt = usage["prompt_tokens"].as_u64().unwrap();
    let completion = usage["completion_tokens"].as_u64().unwrap();
    let billed = (prompt * 150_000 + completion * 600_000).div_ceil(1_000_000);
    let (tenant_key, own_key) = ("tenant:fin:usd:month".to_owned(), format!("key:{id}:usd:day"));
    for _ in 0..200 {
        if in_use(&client, server, &own_key).await == billed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(in_use(&client, server, &tenant_key).await, billed);
    assert_eq!(in_use(&client, server, &own_key).await, billed);

    // A key served once without a budget of its own, then given one by its
    // PATCH: its next call is charged on it (the gateway makes the key's
    // caller again when its record changes).
    let (late_id, late) = create_key(&client, server, json!({"tenant": "fin"})).await;
    assert_eq!(chat(&client, gateway, &late, "gpt-4o-mini").await.status, 200);
    let budgets = json!({"budgets": [{"usd": 1, "period": "day"}]});
    let path = format!("/v1/admin/gateway/keys/{late_id}");
    admin(&client, server, hyper::Method::PATCH, &path, Some(budgets), 200).await;
    let late_key = format!("key:{late_id}:usd:day");
    let mut charged = 0;
    for _ in 0..200 {
        let answer = chat(&client, gateway, &late, "gpt-4o-mini").await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        charged = in_use(&client, server, &late_key).await;
        if charged > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(charged > 0, "the budget given by the PATCH is charged");
}

#[tokio::test]
async fn keys_made_through_the_admin_api_are_served_with_their_limits_and_scope() {
    let sim = start_sim().await;
    let dir = temp_dir("gateway-keys");
    let daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", &gateway_section(sim));
    let (gateway, server) = (gateway_addr(&daemon), daemon.addr);
    let client = client();
    let tenant = json!({"name": "team", "rpm": 100, "models": ["gpt-4o-mini", "claude-sonnet-4-5"]});
    admin(
        &client,
        server,
        hyper::Method::POST,
        "/v1/admin/gateway/tenants",
        Some(tenant),
        201,
    )
    .await;
    let (limited_id, limited) = create_key(
        &client,
        server,
        json!({"tenant": "team", "rpm": 3, "models": ["gpt-4o-mini"]}),
    )
    .await;
    let (_, other) = create_key(&client, server, json!({"tenant": "team"})).await;

    // The fourth call of a key with rpm 3 is a 429 naming the key's own limit;
    // another key of the same tenant still passes.
    for i in 0..3 {
        let answer = chat(&client, gateway, &limited, "gpt-4o-mini").await;
        assert_eq!(answer.status, 200, "call {i}: {}", answer.body);
    }
    let refused = chat(&client, gateway, &limited, "gpt-4o-mini").await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    let refusal = refused.json();
    let message_text = refusal["error"]["message"].as_str().unwrap();
    assert!(
        message_text.contains(&format!("key:{limited_id}:llm:rpm")),
        "{message_text}"
    );
    assert_eq!(chat(&client, gateway, &other, "gpt-4o-mini").await.status, 200);
    // The tenant made through the API is charged as a configured one: 3 + 1 calls.
    assert_eq!(in_use(&client, server, "tenant:team:llm:rpm").await, 4);
    assert_eq!(in_use(&client, server, &format!("key:{limited_id}:llm:rpm")).await, 3);

    // A model outside the key's scope: 403 in the provider's shape, nothing reserved.
    let model_rpm = "global:llm:simanthropic:claude-sonnet-4-5:rpm";
    let before = (
        in_use(&client, server, model_rpm).await,
        in_use(&client, server, "tenant:team:llm:rpm").await,
    );
    let forbidden = message(&client, gateway, &limited, "claude-sonnet-4-5").await;
    assert_eq!(forbidden.status, 403, "{}", forbidden.body);
    assert_eq!(forbidden.json()["type"], "error", "{}", forbidden.body);
    assert_eq!(
        forbidden.json()["error"]["type"],
        "permission_error",
        "{}",
        forbidden.body
    );
    let after = (
        in_use(&client, server, model_rpm).await,
        in_use(&client, server, "tenant:team:llm:rpm").await,
    );
    assert_eq!(before, after, "a call outside the scope reserves nothing");
    let (_, claude_only) = create_key(
        &client,
        server,
        json!({"tenant": "team", "models": ["claude-sonnet-4-5"]}),
    )
    .await;
    let forbidden = chat(&client, gateway, &claude_only, "gpt-4o-mini").await;
    assert_eq!(forbidden.status, 403, "{}", forbidden.body);
    assert_eq!(
        forbidden.json()["error"]["code"],
        "permission_denied",
        "{}",
        forbidden.body
    );
    assert_eq!(
        message(&client, gateway, &claude_only, "claude-sonnet-4-5")
            .await
            .status,
        200
    );

    // `/v1/models` lists what each key may use.
    assert_eq!(models(&client, gateway, &limited).await, ["gpt-4o-mini"]);
    assert_eq!(
        models(&client, gateway, &other).await,
        ["gpt-4o-mini", "claude-sonnet-4-5"]
    );
    assert_eq!(
        models(&client, gateway, YAML_KEY).await,
        ["gpt-4o-mini", "claude-sonnet-4-5"]
    );

    // A key of the configured tenant works beside the tenant's own key.
    let (_, of_yaml) = create_key(&client, server, json!({"tenant": "yaml-team"})).await;
    assert_eq!(chat(&client, gateway, &of_yaml, "gpt-4o-mini").await.status, 200);
    assert_eq!(chat(&client, gateway, YAML_KEY, "gpt-4o-mini").await.status, 200);

    // Revoked, unknown: 401 in the provider's shape.
    let (revoked_id, revoked) = create_key(&client, server, json!({"tenant": "team"})).await;
    assert_eq!(chat(&client, gateway, &revoked, "gpt-4o-mini").await.status, 200);
    admin(
        &client,
        server,
        hyper::Method::DELETE,
        &format!("/v1/admin/gateway/keys/{revoked_id}"),
        None,
        200,
    )
    .await;
    let refused = chat(&client, gateway, &revoked, "gpt-4o-mini").await;
    assert_eq!(refused.status, 401, "{}", refused.body);
    assert_eq!(refused.json()["error"]["code"], "invalid_api_key", "{}", refused.body);
    let refused = message(&client, gateway, &revoked, "claude-sonnet-4-5").await;
    assert_eq!(
        (refused.status, &refused.json()["error"]["type"]),
        (401, &json!("authentication_error"))
    );
    let unknown = format!("{}x", &other[..other.len() - 1]);
    assert_eq!(chat(&client, gateway, &unknown, "gpt-4o-mini").await.status, 401);

    // Rotated: the old key works through its grace, then is refused; an
    // expired key says so.
    let (old_id, old) = create_key(&client, server, json!({"tenant": "team"})).await;
    let (_, expiring) = create_key(&client, server, json!({"tenant": "team", "expires_in_seconds": 2})).await;
    let path = format!("/v1/admin/gateway/keys/{old_id}/rotate");
    let rotated = admin(
        &client,
        server,
        hyper::Method::POST,
        &path,
        Some(json!({"grace_seconds": 2})),
        201,
    )
    .await;
    let new = rotated["key"].as_str().unwrap().to_owned();
    let rotated_at = Instant::now();
    assert_eq!(chat(&client, gateway, &old, "gpt-4o-mini").await.status, 200);
    assert_eq!(chat(&client, gateway, &new, "gpt-4o-mini").await.status, 200);
    assert_eq!(chat(&client, gateway, &expiring, "gpt-4o-mini").await.status, 200);
    tokio::time::sleep(Duration::from_millis(2_100).saturating_sub(rotated_at.elapsed())).await;
    assert_eq!(chat(&client, gateway, &old, "gpt-4o-mini").await.status, 401);
    assert_eq!(chat(&client, gateway, &new, "gpt-4o-mini").await.status, 200);
    let expired = chat(&client, gateway, &expiring, "gpt-4o-mini").await;
    assert_eq!(expired.status, 401, "{}", expired.body);
    assert!(
        expired.json()["error"]["message"].as_str().unwrap().contains("expired"),
        "{}",
        expired.body
    );

    // No key text in the server's log.
    let logs = daemon.logs().join("\n");
    for key in [&limited, &other, &revoked, &old, &new] {
        assert!(!logs.contains(key.as_str()), "a key was logged");
    }
}

/// A gateway serving the same models with no tenant in its file: only keys made
/// through the admin API may call.
fn api_only_gateway_section(sim: SocketAddr) -> String {
    let section = gateway_section(sim);
    section[..section.find("  tenants:").unwrap()].to_owned()
}

#[tokio::test]
async fn a_gateway_with_no_tenant_in_its_file_serves_the_keys_of_the_api_only() {
    let sim = start_sim().await;
    let dir = temp_dir("gateway-keys-api-only");
    let daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", &api_only_gateway_section(sim));
    let (gateway, server) = (gateway_addr(&daemon), daemon.addr);
    let client = client();
    // No key, or a key nobody made: 401, not an anonymous call.
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}]});
    let url = format!("http://{gateway}/v1/chat/completions");
    let keyless = send(&client, hyper::Method::POST, url, &[], Some(body)).await;
    assert_eq!(keyless.status, 401, "{}", keyless.body);
    assert_eq!(chat(&client, gateway, YAML_KEY, "gpt-4o-mini").await.status, 401);
    let tenant = json!({"name": "api-team", "rpm": 10});
    let path = "/v1/admin/gateway/tenants";
    admin(&client, server, hyper::Method::POST, path, Some(tenant), 201).await;
    let (_, key) = create_key(&client, server, json!({"tenant": "api-team"})).await;
    let answer = chat(&client, gateway, &key, "gpt-4o-mini").await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(in_use(&client, server, "tenant:api-team:llm:rpm").await, 1);
}

#[tokio::test]
async fn the_consoles_keys_panel_lists_tenants_and_keys_with_their_calls_today() {
    let sim = start_sim().await;
    let dir = temp_dir("gateway-keys-console");
    let daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", &gateway_section(sim));
    let (gateway, server) = (gateway_addr(&daemon), daemon.addr);
    let client = client();
    let tenant = json!({"name": "team", "class": null, "rpm": 100, "models": ["gpt-4o-mini"]});
    let path = "/v1/admin/gateway/tenants";
    admin(&client, server, hyper::Method::POST, path, Some(tenant), 201).await;
    let (plain_id, plain) = create_key(&client, server, json!({"tenant": "team", "name": "plain"})).await;
    let spec = json!({"tenant": "team", "name": "budgeted", "daily_tokens": 100000});
    let (budgeted_id, budgeted) = create_key(&client, server, spec).await;
    for key in [&plain, &plain, &budgeted] {
        assert_eq!(chat(&client, gateway, key, "gpt-4o-mini").await.status, 200);
    }
    // The panel's read needs the admin token, as the console's state does.
    let url = format!("http://{server}/ui/api/directory");
    assert_eq!(
        send(&client, hyper::Method::GET, url.clone(), &[], None).await.status,
        401
    );
    let panel = admin(&client, server, hyper::Method::GET, "/ui/api/directory", None, 200).await;
    let text = panel.to_string();
    assert!(
        !text.contains(&plain) && !text.contains(&budgeted),
        "no key's text: {text}"
    );
    let tenants: Vec<(String, String)> = (panel["tenants"]["rows"].as_array().unwrap().iter())
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_owned(),
                t["source"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        tenants.contains(&("yaml-team".to_owned(), "config".to_owned())),
        "{tenants:?}"
    );
    assert!(tenants.contains(&("team".to_owned(), "api".to_owned())), "{tenants:?}");
    let rows = panel["keys"]["rows"].as_array().unwrap();
    // Newest first.
    assert_eq!(
        (rows[0]["id"].as_str(), rows[1]["id"].as_str()),
        (Some(budgeted_id.as_str()), Some(plain_id.as_str()))
    );
    let hint = &rows[1]["hint"].as_str().unwrap()[3..];
    assert!(plain.ends_with(hint), "the hint is the key's last characters: {hint}");
    // This server's count since midnight UTC for a key without its own daily limit.
    assert_eq!(
        (rows[1]["calls_today"].as_u64(), rows[1]["tokens_today_from"].as_str()),
        (Some(2), Some("server"))
    );
    assert!(rows[1]["tokens_today"].as_u64().unwrap() > 0, "{}", rows[1]);
    // The fleet's rolling day for a key with one: what its limit holds.
    let used = in_use(&client, server, &format!("key:{budgeted_id}:llm:daily_tokens")).await;
    assert_eq!(rows[0]["calls_today"].as_u64(), Some(1));
    assert_eq!(
        (rows[0]["tokens_today"].as_u64(), rows[0]["tokens_today_from"].as_str()),
        (Some(used), Some("fleet_daily_limit"))
    );
    let other = admin(
        &client,
        server,
        hyper::Method::GET,
        "/ui/api/directory?tenant=yaml-team",
        None,
        200,
    )
    .await;
    assert_eq!(other["keys"]["matched"], 0, "{other}");
    admin(
        &client,
        server,
        hyper::Method::GET,
        "/ui/api/directory?count=0",
        None,
        400,
    )
    .await;
    // A key is minted from a JSON body only, sent by the server's own pages only.
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let keys_url = format!("http://{server}/v1/admin/gateway/keys");
    let mut request = hyper::Request::post(keys_url.clone()).header("authorization", &bearer);
    request = request.header("content-type", "text/plain");
    let body = Full::new(Bytes::from(json!({"tenant": "team"}).to_string()));
    let plain_text = client.request(request.body(body).unwrap()).await.unwrap();
    assert_eq!(plain_text.status(), 415);
    let headers = [("authorization", bearer.as_str()), ("origin", "http://evil.example")];
    let foreign = send(
        &client,
        hyper::Method::POST,
        keys_url,
        &headers,
        Some(json!({"tenant": "team"})),
    )
    .await;
    assert_eq!(foreign.status, 403, "{}", foreign.body);
    let keys = admin(&client, server, hyper::Method::GET, "/v1/admin/gateway/keys", None, 200).await;
    assert_eq!(keys.as_array().unwrap().len(), 2, "no key was minted: {keys}");
}

#[cfg(feature = "tigerbeetle")]
mod fleet {
    use super::*;
    use ratelimiter::tigerbeetle::LocalCluster;

    /// Keys created and revoked on A and checked on B, for the agreement's figures.
    const AGREEMENT_ROUNDS: usize = 50;
    /// The fleet's promise: a key created or revoked on one server is served or
    /// refused by every other within a second (docs/gateway.md, "The fleet's
    /// guarantee").
    const AGREEMENT_MAX: Duration = Duration::from_secs(1);

    /// What one wait for a status saw: when the first call that answered it
    /// was sent, and the longest step between two sends. A change reached the
    /// server at some time between the last wrong answer's send and the right
    /// one's, so a step is the wait's resolution: on a loaded machine one call
    /// can take longer than the whole agreement, and it is the poll that is
    /// slow, not the fleet.
    struct Waited {
        sent_after: Duration,
        step_max: Duration,
    }

    impl Waited {
        /// Whether the change reached the server within `bound`, as far as the
        /// polls can tell.
        fn within(&self, bound: Duration) -> bool {
            self.sent_after < bound + self.step_max
        }
    }

    /// Polls (bounded) until a call with `key` on `gateway` answers `status`.
    async fn until_status(client: &HttpClient, gateway: SocketAddr, key: &str, status: u16) -> Waited {
        let started = Instant::now();
        let mut step_max = Duration::ZERO;
        loop {
            let sent_after = started.elapsed();
            let answer = chat(client, gateway, key, "gpt-4o-mini").await;
            if answer.status == status {
                return Waited { sent_after, step_max };
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "never {status}: {}",
                answer.body
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
            step_max = step_max.max(started.elapsed() - sent_after);
        }
    }

    #[tokio::test]
    async fn a_key_created_or_revoked_on_one_server_is_served_or_refused_by_the_other() {
        let cluster = LocalCluster::start().expect("starting a local TigerBeetle");
        let sim = start_sim().await;
        let backend = BackendConfig::TigerBeetle {
            addresses: cluster.address(),
            settings: "  sessions: 2\n  request_timeout_ms: 2000\n",
        };
        let (dir_a, dir_b) = (temp_dir("gateway-keys-fleet-a"), temp_dir("gateway-keys-fleet-b"));
        let a = Daemon::start_on(&dir_a, backend, "", &gateway_section(sim));
        let b = Daemon::start_on(&dir_b, backend, "", &gateway_section(sim));
        let gateway_b = gateway_addr(&b);
        let client = client();
        let tenant = json!({"name": "fleet-team", "rpm": 100});
        admin(
            &client,
            a.addr,
            hyper::Method::POST,
            "/v1/admin/gateway/tenants",
            Some(tenant),
            201,
        )
        .await;
        let (id, key) = create_key(&client, a.addr, json!({"tenant": "fleet-team", "rpm": 50})).await;
        // Created on A, served by B at its first call (B reads the cluster for a key it does not know).
        let answer = chat(&client, gateway_b, &key, "gpt-4o-mini").await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        // The tenant's and the key's limits are the cluster's: A sees B's call.
        assert_eq!(in_use(&client, a.addr, "tenant:fleet-team:llm:rpm").await, 1);
        assert_eq!(in_use(&client, a.addr, &format!("key:{id}:llm:rpm")).await, 1);
        // Revoked on A: refused by B within a second.
        admin(
            &client,
            a.addr,
            hyper::Method::DELETE,
            &format!("/v1/admin/gateway/keys/{id}"),
            None,
            200,
        )
        .await;
        let waited = until_status(&client, gateway_b, &key, 401).await;
        assert!(
            waited.within(AGREEMENT_MAX),
            "B refused the revoked key in a call sent after {:?} (polls {:?} apart at most)",
            waited.sent_after,
            waited.step_max
        );
        // Fifty of each, for the figures (BENCHMARKS.md, "Gateway keys").
        // On a tenant without limits: the polls are many calls.
        let open = json!({"name": "fleet-open"});
        admin(
            &client,
            a.addr,
            hyper::Method::POST,
            "/v1/admin/gateway/tenants",
            Some(open),
            201,
        )
        .await;
        let (mut created, mut revoked) = (Vec::new(), Vec::new());
        for _ in 0..AGREEMENT_ROUNDS {
            let (id, key) = create_key(&client, a.addr, json!({"tenant": "fleet-open"})).await;
            created.push(until_status(&client, gateway_b, &key, 200).await);
            admin(
                &client,
                a.addr,
                hyper::Method::DELETE,
                &format!("/v1/admin/gateway/keys/{id}"),
                None,
                200,
            )
            .await;
            revoked.push(until_status(&client, gateway_b, &key, 401).await);
        }
        for (what, waits) in [
            ("created on A, served by B", created),
            ("revoked on A, refused by B", revoked),
        ] {
            let mut times: Vec<Duration> = waits.iter().map(|w| w.sent_after).collect();
            times.sort();
            let at = |p: f64| times[((times.len() as f64 * p) as usize).min(times.len() - 1)];
            eprintln!(
                "{what}: p50 {:?}, p99 {:?}, max {:?} over {}",
                at(0.5),
                at(0.99),
                times[times.len() - 1],
                times.len()
            );
            for waited in &waits {
                assert!(
                    waited.within(AGREEMENT_MAX),
                    "{what}: sent after {:?} (polls {:?} apart at most)",
                    waited.sent_after,
                    waited.step_max
                );
            }
        }
    }
}
