//! `POST /v1/reserve` and `POST /v1/complete` (docs/http-api.md, "POST /v1/reserve" and
//! "POST /v1/complete"): the hot path. Every log line of a request runs inside a span
//! carrying its lease id.

use std::time::Instant;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use ratelimiter::{CompleteRequest, CompleteResponse, LimiterError, ReserveOutcome, ReserveRequest, ReserveResponse};
use tracing::Instrument;

use crate::body::JsonBody;
use crate::client_tokens::KeyScope;
use crate::error::ApiError;
use crate::state::AppState;

/// Reserves every requirement or none: 200 for allowed and denied alike.
pub async fn reserve(
    State(state): State<AppState>,
    scope: Option<Extension<KeyScope>>,
    JsonBody(request): JsonBody<ReserveRequest>,
) -> Response {
    if let Err(key) = in_scope(scope.as_ref(), request.requirements().iter().map(|r| &r.key)) {
        return ApiError::Forbidden(key.clone()).into_response();
    }
    let started = Instant::now();
    let span = tracing::info_span!("reserve", lease_id = %request.lease_id(), job_id = request.job_id());
    let response = async {
        match state.backend().reserve(&request).await {
            Ok(outcome) => {
                state.metrics().record_outcome(&request, &outcome);
                if let ReserveOutcome::Denied(denial) = &outcome {
                    tracing::debug!(error = %denial.error_code(), retry_after_ms = denial.retry_after_ms(), "denied");
                } else {
                    tracing::debug!("allowed");
                }
                Json(ReserveResponse::from(&outcome)).into_response()
            }
            Err(error) => {
                if matches!(error, LimiterError::UnknownKey(_)) {
                    state.metrics().record_unknown_key();
                }
                ApiError::from_reserve(error).into_response()
            }
        }
    }
    .instrument(span)
    .await;
    state.metrics().reserve_latency.observe(started.elapsed());
    response
}

/// Releases the lease's holds and reconciles its rolling limits: `{"ok":true}`
/// for every well-formed request, an unknown or completed lease included.
pub async fn complete(
    State(state): State<AppState>,
    scope: Option<Extension<KeyScope>>,
    JsonBody(request): JsonBody<CompleteRequest>,
) -> Response {
    if let Err(key) = in_scope(scope.as_ref(), request.actuals().iter().map(|a| &a.key)) {
        return ApiError::Forbidden(key.clone()).into_response();
    }
    let started = Instant::now();
    let span = tracing::info_span!("complete", lease_id = %request.lease_id(), job_id = request.job_id());
    let response = async {
        match state.backend().complete(&request).await {
            Ok(()) => {
                tracing::debug!(actuals = request.actuals().len(), "completed");
                Json(CompleteResponse { ok: true }).into_response()
            }
            Err(error) => ApiError::from(error).into_response(),
        }
    }
    .instrument(span)
    .await;
    state.metrics().complete_latency.observe(started.elapsed());
    response
}

/// `Err` with the first key outside the token's scope (no scope: the route is
/// open or unguarded, every key).
fn in_scope<'a>(
    scope: Option<&Extension<KeyScope>>,
    keys: impl IntoIterator<Item = &'a ratelimiter::LimitKey>,
) -> Result<(), &'a ratelimiter::LimitKey> {
    scope.map_or(Ok(()), |Extension(scope)| scope.check(keys))
}
