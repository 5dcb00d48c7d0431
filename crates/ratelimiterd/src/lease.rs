//! `POST /v1/reserve` and `POST /v1/complete` (docs/http-api.md, "POST /v1/reserve" and
//! "POST /v1/complete"): the hot path. Every log line of a request runs inside a span
//! carrying its lease id at debug level only: a lease id lets whoever reads it
//! complete the lease, so it stays out of the logs an operator ships at INFO.
//! When the server exports traces, each call has an OpenTelemetry SERVER span
//! too ([`crate::telemetry::api_trace`]), which never carries the lease id.

use std::time::Instant;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use ratelimiter::{CompleteRequest, CompleteResponse, LimiterError, ReserveOutcome, ReserveRequest, ReserveResponse};
use tracing::Instrument;

use crate::auth::Caller;
use crate::body::JsonBody;
use crate::error::ApiError;
use crate::state::AppState;
use crate::telemetry::api_trace::ApiSpan;

/// Reserves every requirement or none: 200 for allowed and denied alike.
pub async fn reserve(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    JsonBody(request): JsonBody<ReserveRequest>,
) -> Response {
    let keys = || request.requirements().iter().map(|r| &r.key);
    let traced = (state.api_tracer()).map(|tracer| tracer.start(&headers, "/v1/reserve", keys()));
    if let Err(key) = in_scope(caller.as_ref(), keys()) {
        return answered(traced.as_ref(), ApiError::Forbidden(key.clone()).into_response());
    }
    let span = tracing::debug_span!("reserve", lease_id = %request.lease_id(), job_id = request.job_id());
    let request = match caller {
        Some(Extension(Caller { owner: Some(owner), .. })) => {
            let lease_id = owner.lease_id(request.lease_id());
            request.with_lease_id(lease_id).with_owner(Some(owner))
        }
        _ => request,
    };
    let started = Instant::now();
    let response = async {
        match state.backend().reserve(&request).await {
            Ok(outcome) => {
                state.metrics().record_outcome(&request, &outcome);
                if let Some(span) = &traced {
                    span.decided(&outcome);
                }
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
    answered(traced.as_ref(), response)
}

/// `response`, its status told to the call's span when it is traced.
fn answered(span: Option<&ApiSpan>, response: Response) -> Response {
    if let Some(span) = span {
        span.responded(response.status());
    }
    response
}

/// Releases the lease's holds and reconciles its rolling limits: `{"ok":true}`
/// for every well-formed request, an unknown or completed lease included.
pub async fn complete(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    JsonBody(request): JsonBody<CompleteRequest>,
) -> Response {
    let keys = || request.actuals().iter().map(|a| &a.key);
    let traced = (state.api_tracer()).map(|tracer| tracer.start(&headers, "/v1/complete", keys()));
    if let Err(key) = in_scope(caller.as_ref(), keys()) {
        return answered(traced.as_ref(), ApiError::Forbidden(key.clone()).into_response());
    }
    let span = tracing::debug_span!("complete", lease_id = %request.lease_id(), job_id = request.job_id());
    // In the owner's namespace: another scope's lease id names no lease here,
    // so it is answered as an unknown one.
    let request = match caller.as_ref().and_then(|Extension(c)| c.owner.as_ref()) {
        Some(owner) => {
            let lease_id = owner.lease_id(request.lease_id());
            request.with_lease_id(lease_id)
        }
        None => request,
    };
    let started = Instant::now();
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
    answered(traced.as_ref(), response)
}

/// `Err` with the first key outside the token's scope (no caller: the route is
/// unguarded, every key).
fn in_scope<'a>(
    caller: Option<&Extension<Caller>>,
    keys: impl IntoIterator<Item = &'a ratelimiter::LimitKey>,
) -> Result<(), &'a ratelimiter::LimitKey> {
    caller.map_or(Ok(()), |Extension(caller)| caller.scope.check(keys))
}
