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

/// 200 when the backend answers within the request timeout, 503 otherwise,
/// with a `reason` in words for the operator: the backend's own account of
/// why (on TigerBeetle: a stalled session, what the network does with its
/// connections), or what the check met.
pub async fn healthz(State(state): State<AppState>) -> Response {
    let timeout = state.request_timeout();
    let result = tokio::time::timeout(timeout, state.backend().health()).await;
    let (retry_after_ms, met) = match result {
        Ok(Ok(())) => return Json(json!({"status": "ok"})).into_response(),
        Ok(Err(error)) => {
            tracing::warn!(%error, "health check failed");
            let retry_after_ms = match error {
                ratelimiter::LimiterError::Unavailable { retry_after_ms } => retry_after_ms,
                _ => HEALTH_TIMEOUT_RETRY_AFTER_MS,
            };
            (retry_after_ms, format!("the backend's health check failed: {error}"))
        }
        Err(_) => (
            HEALTH_TIMEOUT_RETRY_AFTER_MS,
            format!(
                "the backend did not answer its health check within {} ms",
                timeout.as_millis()
            ),
        ),
    };
    let reason = state.backend().unhealthy_reason().unwrap_or(met);
    let mut response = ApiError::Unavailable { retry_after_ms }.into_response();
    let body = json!({
        "error": ApiError::Unavailable { retry_after_ms }.to_string(),
        "retry_after_ms": retry_after_ms,
        "reason": reason,
    });
    *response.body_mut() = axum::body::Body::from(body.to_string());
    response
}

/// Prometheus text exposition: the server's metrics, then the backend's own
/// counters (memory or TigerBeetle).
pub async fn metrics(State(state): State<AppState>) -> Response {
    let mut text = state.metrics().render();
    crate::metrics::render_backend(&mut text, &state.backend_metrics().metrics());
    crate::metrics::render_labeled(&mut text, &state.backend_metrics().labeled_metrics());
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
