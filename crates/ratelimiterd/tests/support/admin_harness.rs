//! The server's router in process, through `tower::ServiceExt::oneshot` on
//! `app()`, with the memory backend and the directory on a fake clock: the
//! tests of the admin endpoints that need no socket and move time at will.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use ratelimiter::memory::MemoryBackend;
use ratelimiter::registry::Registry;
use ratelimiter::FakeClock;
use ratelimiterd::{app, AppState, Config};
use serde_json::Value;
use tower::ServiceExt;

use super::{temp_dir, TempDir};

/// A server's router on the memory backend and a fake clock, in process.
pub struct Harness {
    /// The whole API.
    pub router: Router,
    /// The backend's and the directory's clock.
    pub clock: FakeClock,
    /// The server's state.
    pub state: AppState,
    /// The token every request carries, if any.
    pub token: Option<&'static str>,
    /// The registry's directory.
    pub dir: TempDir,
}

/// The harness of a server of `server` lines and `sections`, its registry
/// in a temporary directory of `name`.
pub async fn harness_with(name: &str, server: &str, sections: &str, token: Option<&'static str>) -> Harness {
    let dir = temp_dir(name);
    let registry_path = dir.join("limits.json");
    let text = format!(
        "server:\n{server}registry:\n  path: {}\n{sections}",
        registry_path.display()
    );
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
    state.open_directory(&config, Arc::new(clock.clone())).await.unwrap();
    Harness {
        router: app(state.clone()),
        clock,
        state,
        token,
        dir,
    }
}

impl Harness {
    /// Sends `body` with `token`; the status and the answer as JSON (or text).
    pub async fn send_raw(
        &self,
        method: Method,
        path: &str,
        body: Vec<u8>,
        token: Option<&str>,
    ) -> (StatusCode, Value) {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        if !body.is_empty() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        let response = self
            .router
            .clone()
            .oneshot(request.body(Body::from(body)).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 24).await.unwrap();
        let value =
            serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
        (status, value)
    }

    /// Sends `body` (JSON) with the harness's token.
    pub async fn send(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let body = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        self.send_raw(method, path, body, self.token).await
    }
}
