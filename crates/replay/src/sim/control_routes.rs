//! The simulator's control routes (not provider API): `GET /sim/stats`,
//! `DELETE /sim/stats` (resets the peak and the call counters, not the ledger),
//! `POST /sim/faults` (arms a fault), `DELETE /sim/faults` (disarms),
//! `GET /sim/billing` (the bill of every call served), `DELETE /sim/billing`.
//! docs/provider-sim.md describes them.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::sim::billing::BillReport;
use crate::sim::errors::{error, Wire};
use crate::sim::faults::{
    ArmedFault, FaultMode, FaultRequest, FAULT_AFTER_EVENTS_MAX, FAULT_COUNT_MAX, FAULT_FOR_MS_MAX,
    FAULT_RETRY_AFTER_MS_MAX,
};
use crate::sim::server::ProviderServer;

/// `GET /sim/stats`: the ledger's counts and calls in flight, and the simulator's
/// calls in flight with their peak.
pub async fn stats(State(provider): State<Arc<ProviderServer>>) -> Json<serde_json::Value> {
    let control = &provider.control;
    let ledger = provider.ledger.lock().expect("ledger lock");
    Json(serde_json::json!({
        "counts": ledger.counts(),
        "in_flight": ledger.in_flight(),
        "in_flight_calls": control.in_flight_calls(),
        "in_flight_max": control.in_flight_max(),
        "calls": control.calls(),
        "faults_injected": control.faults_injected(),
    }))
}

/// `DELETE /sim/stats`: the peak starts again from the calls in flight now, the
/// call counters from 0 (the ledger keeps its window: limits are not reset).
pub async fn reset_stats(State(provider): State<Arc<ProviderServer>>) -> StatusCode {
    provider.control.reset_stats();
    StatusCode::NO_CONTENT
}

/// `GET /sim/billing`: the bill of every call admitted since the start or the
/// last `DELETE /sim/billing`, per model and in total ([`crate::sim::billing::BillReport`]).
pub async fn billing(State(provider): State<Arc<ProviderServer>>) -> Json<BillReport> {
    Json(provider.control.billing.report())
}

/// `DELETE /sim/billing`: the bill starts again from nothing.
pub async fn reset_billing(State(provider): State<Arc<ProviderServer>>) -> StatusCode {
    provider.control.billing.reset();
    StatusCode::NO_CONTENT
}

/// `POST /sim/faults`: arms a fault for the next `count` model calls, or for
/// every call during `for_ms`.
pub async fn arm_fault(State(provider): State<Arc<ProviderServer>>, body: Bytes) -> Response {
    let request: FaultRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => return error(Wire::Openai, StatusCode::BAD_REQUEST, format!("bad fault: {e}")),
    };
    let valid = match request.mode {
        FaultMode::Status { status, retry_after_ms } => {
            (400..=599).contains(&status) && retry_after_ms <= FAULT_RETRY_AFTER_MS_MAX
        }
        FaultMode::Hang => true,
        FaultMode::Drop { after_events } => after_events <= FAULT_AFTER_EVENTS_MAX,
    };
    let count = match (request.count, request.for_ms) {
        (Some(count), _) => count,
        (None, Some(_)) => FAULT_COUNT_MAX,
        (None, None) => 0,
    };
    let for_ms_valid = request.for_ms.is_none_or(|ms| (1..=FAULT_FOR_MS_MAX).contains(&ms));
    if !valid || !for_ms_valid || !(1..=FAULT_COUNT_MAX).contains(&count) {
        let message = format!(
            "a fault needs count 1..={FAULT_COUNT_MAX} (or for_ms 1..={FAULT_FOR_MS_MAX}), a status 400..=599, retry_after_ms <= {FAULT_RETRY_AFTER_MS_MAX}, after_events <= {FAULT_AFTER_EVENTS_MAX}"
        );
        return error(Wire::Openai, StatusCode::BAD_REQUEST, message);
    }
    provider.control.arm(Some(ArmedFault {
        mode: request.mode,
        left: count,
        until: (request.for_ms).map(|ms| std::time::Instant::now() + Duration::from_millis(ms)),
        model: request.model,
    }));
    StatusCode::NO_CONTENT.into_response()
}

/// `DELETE /sim/faults`: disarms.
pub async fn disarm_fault(State(provider): State<Arc<ProviderServer>>) -> StatusCode {
    provider.control.arm(None);
    StatusCode::NO_CONTENT
}
