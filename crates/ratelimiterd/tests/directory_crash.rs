//! The gateway's keys on the memory backend survive a SIGKILL: a key whose
//! creation was answered 201 is there after a kill the very next instant,
//! with its tenant, its hash (the key still authenticates) and its own limit;
//! a key revoked and answered stays revoked. The real binary, killed with
//! SIGKILL right after each answer. A tenant written by a server stopped
//! before it defined the tenant's limits gets them at the next start, and
//! from the gateway before the tenant's first call.

mod support;

use std::sync::Arc;

use std::net::SocketAddr;

use axum::body::Body;
use ratelimiter::directory::{journal_path, Directory, FileStore, KeyLimits, KeySpec, Refusal, TenantFields};
use ratelimiter::SystemClock;
use serde_json::{json, Value};
use support::gateway_setup::{gateway_addr, start_sim};
use support::raw::request;
use support::{temp_dir, BackendConfig, Daemon, ADMIN_TOKEN};
use tower::ServiceExt;

/// Kill rounds: each creates a key, revokes the previous round's, and is killed at once.
const ROUNDS: usize = 5;

fn send(daemon: &Daemon, method: &str, path: &str, body: Value) -> (u16, Value) {
    let body = if body.is_null() {
        Vec::new()
    } else {
        body.to_string().into_bytes()
    };
    let answer = request(daemon.addr, method, path, Some(ADMIN_TOKEN), &body);
    (answer.status, answer.json())
}

#[tokio::test]
async fn keys_answered_201_survive_a_sigkill_the_next_instant() {
    let dir = temp_dir("directory-crash");
    let mut created: Vec<(String, String)> = Vec::new();
    for round in 0..ROUNDS {
        let mut daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", "");
        if round == 0 {
            let (status, answer) = send(&daemon, "POST", "/v1/admin/gateway/tenants", json!({"name": "acme"}));
            assert_eq!(status, 201, "{answer}");
        } else {
            // What the previous round was answered is all there.
            let (id, _) = created.last().unwrap();
            let (status, key) = send(&daemon, "GET", &format!("/v1/admin/gateway/keys/{id}"), Value::Null);
            assert_eq!(
                (status, key["status"].clone()),
                (200, json!("active")),
                "round {round}: {key}"
            );
            let (status, limit) = send(
                &daemon,
                "GET",
                &format!("/v1/admin/limits/key:{id}:llm:rpm"),
                Value::Null,
            );
            assert_eq!(
                (status, limit["capacity"].clone()),
                (200, json!(5)),
                "round {round}: {limit}"
            );
            let (status, revoked) = send(&daemon, "DELETE", &format!("/v1/admin/gateway/keys/{id}"), Value::Null);
            assert_eq!(status, 200, "{revoked}");
        }
        let (status, answer) = send(
            &daemon,
            "POST",
            "/v1/admin/gateway/keys",
            json!({"tenant": "acme", "rpm": 5}),
        );
        assert_eq!(status, 201, "{answer}");
        daemon.kill9();
        created.push((
            answer["id"].as_str().unwrap().to_owned(),
            answer["key"].as_str().unwrap().to_owned(),
        ));
    }
    // The file read as the next start reads it: every key there, the last one working.
    let store = Arc::new(FileStore::open(journal_path(&dir.join("limits.json"))).unwrap());
    let directory = Directory::open(store, Arc::new(SystemClock::new()), Vec::new())
        .await
        .unwrap();
    let (last, earlier) = created.split_last().unwrap();
    assert_eq!(directory.authenticate(&last.1).await.unwrap().key.id, last.0);
    for (id, key) in earlier {
        assert_eq!(directory.authenticate(key).await.unwrap_err(), Refusal::Revoked, "{id}");
    }
}

/// A gateway with no tenant in its file: its tenants are the API's.
fn gateway_section(sim: SocketAddr) -> String {
    format!(
        "gateway:\n  listen_addr: \"127.0.0.1:0\"\n  upstreams:\n    - {{name: sim, kind: openai, base_url: \"http://{sim}\"}}\n  models:\n    - {{name: gpt-4o-mini, upstream: sim, rpm: 1000, tpm: 1000000, max_output_tokens_default: 64}}\n"
    )
}

fn chat_body() -> Vec<u8> {
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 5, "sim_output_tokens": 5,
        "messages": [{"role": "user", "content": "Hi"}]});
    body.to_string().into_bytes()
}

/// What a stop between a tenant's write and its limits' definition leaves: the
/// tenant `name` (rpm 7, 50,000 tokens a day) in the directory's file, no limit.
async fn write_tenant_without_limits(registry: &std::path::Path, name: &str) -> Directory {
    let store = Arc::new(FileStore::open(journal_path(registry)).unwrap());
    let directory = Directory::open(store, Arc::new(SystemClock::new()), Vec::new())
        .await
        .unwrap();
    let fields = TenantFields {
        rpm: Some(7),
        daily_tokens: Some(50_000),
        ..TenantFields::default()
    };
    directory.create_tenant(name, fields).await.unwrap();
    directory
}

#[tokio::test]
async fn a_tenant_written_without_its_limits_gets_them_at_the_next_start() {
    let sim = start_sim().await;
    let dir = temp_dir("directory-crash-tenant-limits");
    drop(write_tenant_without_limits(&dir.join("limits.json"), "acme").await);
    let daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", &gateway_section(sim));
    for (dimension, capacity) in [("rpm", 7), ("daily_tokens", 50_000)] {
        let path = format!("/v1/admin/limits/tenant:acme:llm:{dimension}");
        let (status, limit) = send(&daemon, "GET", &path, Value::Null);
        assert_eq!((status, limit["capacity"].clone()), (200, json!(capacity)), "{limit}");
    }
    let (status, key) = send(&daemon, "POST", "/v1/admin/gateway/keys", json!({"tenant": "acme"}));
    assert_eq!(status, 201, "{key}");
    let gateway = gateway_addr(&daemon);
    // Off the runtime: the simulator answering the gateway runs on it.
    let key = key["key"].as_str().unwrap().to_owned();
    let call = move || request(gateway, "POST", "/v1/chat/completions", Some(&key), &chat_body());
    let answer = tokio::task::spawn_blocking(call).await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.json());
    let (_, limit) = send(&daemon, "GET", "/v1/admin/limits/tenant:acme:llm:rpm", Value::Null);
    assert_eq!(limit["in_use"], 1, "{limit}");
}

#[tokio::test]
async fn the_gateway_defines_a_tenants_missing_limits_before_its_first_call() {
    let sim = start_sim().await;
    let dir = temp_dir("directory-crash-first-call");
    let registry = dir.join("limits.json");
    let text = format!("registry:\n  path: {}\n{}", registry.display(), gateway_section(sim));
    let config = ratelimiterd::Config::parse(&text, std::path::Path::new("test.yaml")).unwrap();
    // The server is running when the tenant appears without its limits (another
    // server of a fleet stopped between the two writes): the start has passed.
    let state = ratelimiterd::server::start(&config).await.unwrap();
    let directory = state.directory().unwrap().clone();
    let tenant = directory.create_tenant(
        "acme",
        TenantFields {
            rpm: Some(7),
            ..TenantFields::default()
        },
    );
    tenant.await.unwrap();
    let spec = KeySpec {
        tenant: "acme".to_owned(),
        name: String::new(),
        models: None,
        expires_in_seconds: None,
        limits: KeyLimits::default(),
    };
    let key = directory.create_key(&spec).await.unwrap().key.text;
    let section = config.gateway.as_ref().unwrap();
    let limits = ratelimiterd::tenant_limits::MissingTenantLimits(state.downgrade());
    let gateway = gateway::Gateway::new(section, state.backend().clone()).unwrap();
    // The model's limits, as the server's gateway start defines them.
    for definition in gateway.definitions() {
        state.admin().define(definition.clone()).await.unwrap();
    }
    let gateway = gateway.with_directory(directory).with_tenant_limits(Arc::new(limits));
    let call = axum::http::Request::post("/v1/chat/completions")
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(Body::from(chat_body()))
        .unwrap();
    let answer = gateway::router(Arc::new(gateway)).oneshot(call).await.unwrap();
    assert_eq!(answer.status(), 200);
    let rpm = ratelimiter::LimitKey::new("tenant:acme:llm:rpm").unwrap();
    let report = state
        .backend()
        .limit_report(&rpm)
        .await
        .unwrap()
        .expect("defined before the call");
    assert_eq!((report.state.definition().capacity(), report.in_use), (7, 1));
}

/// On TigerBeetle the tenant is in the cluster, where every server reads it.
#[cfg(feature = "tigerbeetle")]
mod tigerbeetle {
    use super::*;
    use ratelimiter::tigerbeetle::LocalCluster;

    #[tokio::test]
    async fn on_tigerbeetle_a_tenant_without_its_limits_gets_them_at_the_next_start() {
        let cluster = LocalCluster::start().expect("starting a local TigerBeetle");
        let backend = BackendConfig::TigerBeetle {
            addresses: cluster.address(),
            settings: "  sessions: 2\n  request_timeout_ms: 2000\n",
        };
        // A server writes the tenant into the cluster and is gone before its limits.
        let dir = temp_dir("directory-crash-tb-writer");
        let path = support::write_config_on(&dir, backend, "", "");
        let config = ratelimiterd::Config::load(&path).unwrap();
        let writer = ratelimiterd::server::start(&config).await.unwrap();
        let fields = TenantFields {
            rpm: Some(7),
            ..TenantFields::default()
        };
        writer.directory().unwrap().create_tenant("acme", fields).await.unwrap();
        drop(writer);
        let rpm = "/v1/admin/limits/tenant:acme:llm:rpm";
        for (round, name) in ["directory-crash-tb-a", "directory-crash-tb-b"].into_iter().enumerate() {
            let daemon = Daemon::start_on(&temp_dir(name), backend, "", "");
            let (status, limit) = send(&daemon, "GET", rpm, Value::Null);
            assert_eq!((status, limit["capacity"].clone()), (200, json!(7)), "{limit}");
            // Once defined, the next start defines nothing.
            let defined = (daemon.logs().iter()).any(|l| l.contains("missing tenant limits defined at start"));
            assert_eq!(defined, round == 0, "start {round}");
        }
    }
}
