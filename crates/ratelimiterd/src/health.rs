//! `GET /healthz` and `GET /metrics`: open without a token, so that load
//! balancers and Prometheus need no secret. Neither reveals limits' usage beyond
//! per-key counters.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::error::ApiError;
use crate::state::AppState;

/// The retry hint of a health check whose backend did not answer in time.
const HEALTH_TIMEOUT_RETRY_AFTER_MS: u64 = 1_000;

/// 200 when the backend answers within the request timeout, 503 otherwise.
pub async fn healthz(State(state): State<AppState>) -> Response {
    let result = tokio::time::timeout(state.request_timeout(), state.backend().health()).await;
    match result {
        Ok(Ok(())) => Json(json!({"status": "ok"})).into_response(),
        Ok(Err(error)) => {
            tracing::warn!(%error, "health check failed");
            let retry_after_ms = match error {
                ratelimiter::LimiterError::Unavailable { retry_after_ms } => retry_after_ms,
                _ => HEALTH_TIMEOUT_RETRY_AFTER_MS,
            };
            ApiError::Unavailable { retry_after_ms }.into_response()
        }
        Err(_) => ApiError::Unavailable {
            retry_after_ms: HEALTH_TIMEOUT_RETRY_AFTER_MS,
        }
        .into_response(),
    }
}

/// Prometheus text exposition: the server's metrics, then the backend's own
/// counters (memory or TigerBeetle).
pub async fn metrics(State(state): State<AppState>) -> Response {
    let mut text = state.metrics().render();
    crate::metrics::render_backend(&mut text, &state.backend_metrics().metrics());
    crate::metrics::render_backend(&mut text, &state.admin().metrics());
    if let Some(directory) = state.directory() {
        crate::metrics::render_backend(&mut text, &directory.metrics());
    }
    if let Some(gateway) = state.gateway_metrics() {
        gateway.render(&mut text);
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        text,
    )
        .into_response()
}
