//! Load shedding and the request timeout. A request that finds every permit taken is
//! answered 503 `overloaded` at once, before its body is read, so a burst cannot queue
//! without bound; a request that runs past the timeout is answered 503
//! `backend_unavailable`: its outcome is unknown, and a retry with the same lease id is
//! safe (docs/lease-ids.md, "Rules for callers").

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::state::AppState;

/// The retry hint after a timeout: the backend is slow, so not at once.
pub const TIMEOUT_RETRY_AFTER_MS: u64 = 100;

/// Middleware around every API route.
pub async fn guard(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let Ok(_permit) = state.permits().clone().try_acquire_owned() else {
        state.metrics().record_shed();
        return ApiError::Overloaded.into_response();
    };
    let _in_flight = state.metrics().in_flight();
    match tokio::time::timeout(state.request_timeout(), next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            state.metrics().record_timeout();
            tracing::warn!(
                timeout_ms = state.request_timeout().as_millis() as u64,
                "request timed out"
            );
            ApiError::Unavailable {
                retry_after_ms: TIMEOUT_RETRY_AFTER_MS,
            }
            .into_response()
        }
    }
}
