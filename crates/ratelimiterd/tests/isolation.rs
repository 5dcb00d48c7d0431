//! Isolation between the server's clients, through the router without a socket:
//! one token's flood of reserves is refused beyond its share of the lease table
//! and evicts nobody's lease; a scoped token can neither complete another
//! scope's lease nor tell whether its id is live; a server without tokens
//! answers no web page of another origin (docs/http-api.md, "Scoped client
//! tokens", "Requests from browsers"; docs/memory-backend.md, "Shares of the
//! lease table").

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
use support::{temp_dir, TempDir};
use tower::ServiceExt;

const ADMIN: &str = "isolation-admin-token-0123456789";
const TOKEN_A: &str = "isolation-token-a-0123456789";
const TOKEN_B: &str = "isolation-token-b-0123456789";

struct Server {
    router: Router,
    _dir: TempDir,
}

/// A request to send: method, path, headers, body.
struct Call<'a> {
    method: Method,
    path: &'a str,
    headers: Vec<(header::HeaderName, String)>,
    body: Option<String>,
}

impl<'a> Call<'a> {
    fn new(method: Method, path: &'a str) -> Self {
        Self {
            method,
            path,
            headers: Vec::new(),
            body: None,
        }
    }

    fn token(self, token: &str) -> Self {
        self.header(header::AUTHORIZATION, &format!("Bearer {token}"))
    }

    fn header(mut self, name: header::HeaderName, value: &str) -> Self {
        self.headers.push((name, value.to_owned()));
        self
    }

    /// A JSON body, declared as real clients declare it.
    fn json(self, body: &Value) -> Self {
        let text = body.to_string();
        self.header(header::CONTENT_TYPE, "application/json").raw_body(text)
    }

    fn raw_body(mut self, text: String) -> Self {
        self = self.header(header::CONTENT_LENGTH, &text.len().to_string());
        self.body = Some(text);
        self
    }
}

impl Server {
    fn new(name: &str, yaml: &str) -> Self {
        let dir = temp_dir(name);
        let registry_path = dir.join("limits.json");
        let text = format!("registry:\n  path: {}\n{yaml}", registry_path.display());
        let config = Config::parse(&text, std::path::Path::new("test.yaml")).unwrap();
        let clock = FakeClock::new(1_700_000_000_000);
        let backend = Arc::new(MemoryBackend::new(
            Arc::new(clock),
            ratelimiterd::backend::memory_config(&config),
        ));
        let state = AppState::new(
            ratelimiterd::backend::SelectedBackend::of(backend),
            Some(Registry::open(&registry_path).unwrap()),
            &config,
        );
        Self {
            router: app(state),
            _dir: dir,
        }
    }

    async fn send(&self, call: Call<'_>) -> (StatusCode, Value) {
        let mut request = Request::builder().method(call.method).uri(call.path);
        for (name, value) in call.headers {
            request = request.header(name, value);
        }
        let body = call.body.map(Body::from).unwrap_or_else(Body::empty);
        let response = self.router.clone().oneshot(request.body(body).unwrap()).await.unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    async fn define(&self, definition: Value) {
        let call = Call::new(Method::PUT, "/v1/admin/limits")
            .token(ADMIN)
            .json(&definition);
        assert_eq!(self.send(call).await.0, StatusCode::OK);
    }

    async fn in_use(&self, key: &str) -> u64 {
        let path = format!("/v1/admin/limits/{key}");
        let (_, report) = self.send(Call::new(Method::GET, &path).token(ADMIN)).await;
        report["in_use"].as_u64().expect("a report")
    }

    async fn reserve(&self, token: &str, lease: &str, key: &str) -> (StatusCode, Value) {
        let body = json!({"lease_id": lease, "requirements": [{"key": key, "amount": 1}]});
        self.send(Call::new(Method::POST, "/v1/reserve").token(token).json(&body))
            .await
    }

    async fn complete(&self, token: &str, lease: &str, actuals: Value) -> (StatusCode, Value) {
        let body = json!({"lease_id": lease, "actuals": actuals});
        self.send(Call::new(Method::POST, "/v1/complete").token(token).json(&body))
            .await
    }
}

fn lease() -> String {
    LeaseId::generate().to_string()
}

fn concurrency(key: &str) -> Value {
    json!({"key": key, "kind": "concurrency", "capacity": 1000, "timeout_seconds": 600})
}

fn rolling(key: &str, capacity: u64) -> Value {
    json!({"key": key, "kind": "rolling", "capacity": capacity, "window_seconds": 60})
}

#[tokio::test]
async fn a_token_flooding_reserves_gets_429_and_another_tokens_lease_completes() {
    let yaml = format!(
        "server:\n  admin_token: {ADMIN}\n  client_tokens: [{TOKEN_A}, {TOKEN_B}]\nmemory:\n  leases_max: 40\n"
    );
    let server = Server::new("isolation-flood", &yaml);
    server.define(concurrency("model:concurrency")).await;
    let victim = lease();
    assert_eq!(
        server.reserve(TOKEN_B, &victim, "model:concurrency").await.0,
        StatusCode::OK
    );
    // A's share is 25 % of 40: its 11th lease is refused, and so are the rest.
    for n in 0..100 {
        let (status, body) = server.reserve(TOKEN_A, &lease(), "model:concurrency").await;
        if n < 10 {
            assert_eq!((status, &body["allowed"]), (StatusCode::OK, &json!(true)), "{n}");
            continue;
        }
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{n}: {body}");
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .starts_with("too_many_leases: client_tokens[0] holds 10"),
            "{body}"
        );
        assert_eq!(body["retry_after_ms"], 1000);
    }
    assert_eq!(server.in_use("model:concurrency").await, 11);
    // B is served, and its first lease, never evicted, frees its slot at Complete.
    assert_eq!(
        server.reserve(TOKEN_B, &lease(), "model:concurrency").await.0,
        StatusCode::OK
    );
    assert_eq!(server.complete(TOKEN_B, &victim, json!([])).await.0, StatusCode::OK);
    assert_eq!(server.in_use("model:concurrency").await, 11);
}

#[tokio::test]
async fn a_scoped_token_cannot_complete_or_probe_another_scopes_lease() {
    std::env::set_var("ISOLATION_TEST_SCOPE_A", TOKEN_A);
    std::env::set_var("ISOLATION_TEST_SCOPE_B", TOKEN_B);
    let yaml = format!(
        "server:\n  admin_token: {ADMIN}\n  client_tokens:\n    - {{token_env: ISOLATION_TEST_SCOPE_A, key_prefixes: [\"svc:a:\"]}}\n    - {{token_env: ISOLATION_TEST_SCOPE_B, key_prefixes: [\"svc:b:\"]}}\n"
    );
    let server = Server::new("isolation-scopes", &yaml);
    server.define(concurrency("svc:a:concurrency")).await;
    server.define(rolling("svc:a:tpm", 1000)).await;
    server.define(rolling("svc:b:rpm", 1000)).await;
    let a_lease = lease();
    let body = json!({"lease_id": a_lease, "requirements": [
        {"key": "svc:a:concurrency", "amount": 1}, {"key": "svc:a:tpm", "amount": 100}]});
    let call = Call::new(Method::POST, "/v1/reserve").token(TOKEN_A).json(&body);
    assert_eq!(server.send(call).await.0, StatusCode::OK);

    // B knows A's lease id: completing it is answered as for an unknown id and frees nothing.
    let unknown = lease();
    for id in [&a_lease, &unknown] {
        assert_eq!(
            server.complete(TOKEN_B, id, json!([])).await,
            (StatusCode::OK, json!({"ok": true}))
        );
        // An actual on one of B's own keys: the same answer for a live and an unknown id.
        let actuals = json!([{"key": "svc:b:rpm", "actual_amount": 1}]);
        assert_eq!(
            server.complete(TOKEN_B, id, actuals).await,
            (StatusCode::OK, json!({"ok": true})),
            "{id}"
        );
        // A reserve with the id: decided as for a fresh id, not a 409.
        let (status, answer) = server.reserve(TOKEN_B, id, "svc:b:rpm").await;
        assert_eq!((status, &answer["allowed"]), (StatusCode::OK, &json!(true)), "{answer}");
    }
    assert_eq!(server.in_use("svc:a:concurrency").await, 1, "A's lease stands");
    // A completes its own lease as before.
    let actuals = json!([{"key": "svc:a:tpm", "actual_amount": 10}]);
    assert_eq!(server.complete(TOKEN_A, &a_lease, actuals).await.0, StatusCode::OK);
    assert_eq!(server.in_use("svc:a:concurrency").await, 0);
    assert_eq!(server.in_use("svc:a:tpm").await, 10);
}

#[tokio::test]
async fn a_tokenless_server_refuses_foreign_hosts_origins_and_non_json_bodies() {
    let server = Server::new("isolation-origin", "server:\n  allowed_hosts: [limiter.internal]\n");
    server.define(rolling("model:rpm", 500)).await;
    let reserve = |host: &str| {
        let body = json!({"lease_id": lease(), "requirements": [{"key": "model:rpm", "amount": 500}]});
        Call::new(Method::POST, "/v1/reserve")
            .header(header::HOST, host)
            .json(&body)
    };
    // A DNS-rebinding page names its own host: refused, reads and writes alike.
    let (status, body) = server.send(reserve("attacker.example:8080")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["error"].as_str().unwrap().starts_with("forbidden: the host"),
        "{body}"
    );
    for path in ["/ui/api/state", "/v1/admin/limits", "/metrics"] {
        let call = Call::new(Method::GET, path).header(header::HOST, "attacker.example");
        assert_eq!(server.send(call).await.0, StatusCode::FORBIDDEN, "{path}");
    }
    let health = Call::new(Method::GET, "/healthz").header(header::HOST, "balancer-name.example");
    assert_eq!(server.send(health).await.0, StatusCode::OK, "a balancer's check");
    // A cross-origin page's no-cors text/plain post: refused by its origin, and by its type.
    let text_plain = |origin: Option<&str>| {
        let body = json!({"lease_id": lease(), "requirements": [{"key": "model:rpm", "amount": 500}]});
        let mut call = Call::new(Method::POST, "/v1/reserve")
            .header(header::HOST, "127.0.0.1:8080")
            .header(header::CONTENT_TYPE, "text/plain;charset=UTF-8")
            .raw_body(body.to_string());
        if let Some(origin) = origin {
            call = call.header(header::ORIGIN, origin);
        }
        call
    };
    let (status, body) = server.send(text_plain(Some("http://attacker.example"))).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body["error"].as_str().unwrap().contains("web page origin"), "{body}");
    let (status, body) = server.send(text_plain(None)).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{body}");
    assert!(
        body["error"].as_str().unwrap().starts_with("unsupported_media_type"),
        "{body}"
    );
    assert_eq!(server.in_use("model:rpm").await, 0, "nothing reserved");
    // The server's own names, its own origin and JSON are served.
    for host in [
        "127.0.0.1:8080",
        "localhost:8080",
        "[::1]:8080",
        "limiter.internal:8080",
    ] {
        let call = reserve(host).header(header::ORIGIN, &format!("http://{host}"));
        let (status, body) = server.send(call).await;
        assert_eq!(status, StatusCode::OK, "{host}: {body}");
        let done = json!({"lease_id": lease()});
        let complete = Call::new(Method::POST, "/v1/complete")
            .header(header::HOST, host)
            .json(&done);
        assert_eq!(server.send(complete).await.0, StatusCode::OK);
    }
}

#[tokio::test]
async fn with_every_endpoint_behind_a_token_any_host_is_answered_but_not_a_foreign_origin() {
    let yaml = format!("server:\n  admin_token: {ADMIN}\n  client_tokens: [{TOKEN_A}]\n");
    let server = Server::new("isolation-tokens", &yaml);
    server.define(rolling("model:rpm", 5)).await;
    let (status, _) = server
        .send(
            Call::new(Method::GET, "/v1/admin/limits")
                .token(ADMIN)
                .header(header::HOST, "limiter.example.com"),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let call = Call::new(Method::GET, "/v1/admin/limits")
        .token(ADMIN)
        .header(header::HOST, "limiter.example.com")
        .header(header::ORIGIN, "http://attacker.example");
    assert_eq!(server.send(call).await.0, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn an_actual_beyond_a_hundred_times_the_capacity_is_refused_and_changes_nothing() {
    let server = Server::new("isolation-actual", "");
    server.define(rolling("model:tpm", 1000)).await;
    let id = lease();
    let body = json!({"lease_id": id, "requirements": [{"key": "model:tpm", "amount": 100}]});
    let host = |call: Call<'static>| call.header(header::HOST, "127.0.0.1");
    assert_eq!(
        server
            .send(host(Call::new(Method::POST, "/v1/reserve").json(&body)))
            .await
            .0,
        StatusCode::OK
    );
    let huge = json!({"lease_id": id, "actuals": [{"key": "model:tpm", "actual_amount": u64::MAX}]});
    let (status, answer) = server
        .send(host(Call::new(Method::POST, "/v1/complete").json(&huge)))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("100 times its capacity"),
        "{answer}"
    );
    assert_eq!(server.in_use("model:tpm").await, 100, "nothing changed");
    let most = json!({"lease_id": id, "actuals": [{"key": "model:tpm", "actual_amount": 100_000}]});
    let (status, _) = server
        .send(host(Call::new(Method::POST, "/v1/complete").json(&most)))
        .await;
    assert_eq!(status, StatusCode::OK, "100 times the capacity is accepted");
}
