//! The router tests' server without a socket (tests/router.rs and
//! tests/router_admin.rs): `app()` on the memory backend with a fake clock and a
//! registry file of its own, and the bodies those tests send.
//!
//! Each of the two binaries uses a part of this module, so unused items are allowed here.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use ratelimiter::memory::MemoryBackend;
use ratelimiter::registry::Registry;
use ratelimiter::{FakeClock, LeaseId};
use ratelimiterd::{app, AppState, Config};
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::support::{temp_dir, TempDir};

pub const ADMIN_TOKEN: &str = "admin-token-0123456789abcdef";
pub const CLIENT_TOKEN: &str = "client-token-0123456789abcdef";

/// A server under test: its router, clock, state and registry file.
pub struct Harness {
    pub router: Router,
    pub clock: FakeClock,
    pub state: AppState,
    pub registry_path: PathBuf,
    /// The registry's directory, deleted when the harness is dropped.
    _dir: TempDir,
}

/// A harness whose configuration adds `yaml` (top-level blocks) to its registry.
pub fn harness_with(name: &str, yaml: &str) -> Harness {
    let dir = temp_dir(name);
    let registry_path = dir.join("limits.json");
    let text = format!("registry:\n  path: {}\n{yaml}", registry_path.display());
    let config = Config::parse(&text, std::path::Path::new("test.yaml")).unwrap();
    let clock = FakeClock::new(1_700_000_000_000);
    let backend = Arc::new(MemoryBackend::new(
        Arc::new(clock.clone()),
        ratelimiterd::backend::memory_config(&config),
    ));
    let registry = Registry::open(&registry_path).unwrap();
    let state = AppState::new(
        ratelimiterd::backend::SelectedBackend::of(backend),
        Some(registry),
        &config,
    );
    Harness {
        router: app(state.clone()),
        clock,
        state,
        registry_path,
        _dir: dir,
    }
}

/// A harness on the default configuration.
pub fn harness(name: &str) -> Harness {
    harness_with(name, "")
}

impl Harness {
    /// One request, its answer as JSON (or as a JSON string when it is not JSON).
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<String>,
        token: Option<&str>,
    ) -> (StatusCode, Value) {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let body = body.map(Body::from).unwrap_or_else(Body::empty);
        let response = self.router.clone().oneshot(request.body(body).unwrap()).await.unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 24).await.unwrap();
        let value =
            serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
        (status, value)
    }

    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.send(Method::POST, path, Some(body.to_string()), None).await
    }

    pub async fn put_limit(&self, definition: Value) -> (StatusCode, Value) {
        self.send(Method::PUT, "/v1/admin/limits", Some(definition.to_string()), None)
            .await
    }

    pub async fn reserve(&self, lease: &str, requirements: Value) -> (StatusCode, Value) {
        self.post("/v1/reserve", json!({"lease_id": lease, "requirements": requirements}))
            .await
    }
}

/// A fresh lease id, as text.
pub fn lease() -> String {
    LeaseId::generate().to_string()
}

/// A rolling limit's definition of `capacity` requests a minute.
pub fn rolling(key: &str, capacity: u64) -> Value {
    json!({"key": key, "kind": "rolling", "capacity": capacity, "window_seconds": 60,
           "timeout_seconds": 0, "unit": "requests", "description": "test"})
}

/// A concurrency limit's definition, its holds timing out after 300 s.
pub fn concurrency(key: &str, capacity: u64) -> Value {
    json!({"key": key, "kind": "concurrency", "capacity": capacity, "window_seconds": 0, "timeout_seconds": 300})
}

/// The `error` text of an answer, empty when it has none.
pub fn error_code(body: &Value) -> &str {
    body["error"].as_str().unwrap_or("")
}
