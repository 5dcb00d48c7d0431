//! Learning from a provider's answer (docs/provider-profiles.md, "Learning from the
//! headers"): the library reads the rate-limit headers, compares them with the
//! definitions, and pauses a model's keys after a 429. Python passes the headers
//! as `(name, value)` pairs and reads JSON back.

use pyo3::prelude::*;
use ratelimiter::pause::{Pause, PauseError, Paused};
use ratelimiter::provider_headers::{below_configured, read_headers, ProviderHeaders, HEADERS_MAX};
use ratelimiter::{LimitDefinition, LimitKey};
use serde_json::json;

use crate::errors;
use crate::runtime::shared;

/// The headers as the library reads them, bounded like the library's reader.
fn read(headers: &[(String, String)]) -> ProviderHeaders {
    read_headers(headers.iter().take(HEADERS_MAX).map(|(n, v)| (n.as_str(), v.as_str())))
}

/// What a response's rate-limit headers say, as a JSON object: `limits` (each with
/// `dimension`, `limit`, `remaining`, `reset_ms`, null when not sent),
/// `retry_after_ms`, and `pause_ms`, the pause a 429 with these headers asks for.
#[pyfunction]
pub fn read_provider_headers(headers: Vec<(String, String)>) -> String {
    let read = read(&headers);
    let limits: Vec<serde_json::Value> = (read.limits.iter())
        .map(|l| json!({"dimension": l.dimension, "limit": l.limit, "remaining": l.remaining, "reset_ms": l.reset_ms}))
        .collect();
    let pause_ms = Pause::after_429(&read).duration_ms();
    json!({"limits": limits, "retry_after_ms": read.retry_after_ms, "pause_ms": pause_ms}).to_string()
}

/// The definitions (a JSON array) of `provider`'s `model` configured above the limits
/// the headers report, compared per minute, as a JSON array of `key`,
/// `configured_per_minute` and `provider_limit`.
#[pyfunction]
pub fn limits_above_provider(
    py: Python<'_>,
    headers: Vec<(String, String)>,
    provider: &str,
    model: &str,
    definitions_json: &str,
) -> PyResult<String> {
    let definitions: Vec<LimitDefinition> =
        serde_json::from_str(definitions_json).map_err(|e| errors::invalid(py, "definitions", e.to_string()))?;
    let mismatches = below_configured(&read(&headers), provider, model, &definitions);
    let rows: Vec<serde_json::Value> = (mismatches.iter())
        .map(|m| json!({"key": m.key, "configured_per_minute": m.configured_per_minute, "provider_limit": m.provider_limit}))
        .collect();
    Ok(serde_json::Value::Array(rows).to_string())
}

/// The pause of `duration_ms` over `keys`, checked: a bad duration or key list is an
/// `InvalidArgumentError` and nothing is held.
pub fn pause_of(py: Python<'_>, keys: &[Bound<'_, PyAny>], duration_ms: u64) -> PyResult<(Pause, Vec<LimitKey>)> {
    let pause = Pause::new(duration_ms).map_err(|e| errors::invalid(py, "duration_ms", e.to_string()))?;
    let keys = (keys.iter())
        .map(|key| crate::convert::key(py, "keys", key))
        .collect::<PyResult<Vec<_>>>()?;
    Ok((pause, keys))
}

/// Runs a pause that holds to its end on the shared runtime, or raises what made
/// it fail (nothing is held then).
pub fn run_in_background(py: Python<'_>, held: Result<Paused, PauseError>) -> PyResult<()> {
    match held {
        Ok(paused) => {
            shared().spawn(paused.run());
            Ok(())
        }
        Err(PauseError::Invalid(message)) => Err(errors::invalid(py, "keys", message)),
        Err(PauseError::Limiter(error)) => Err(errors::limiter_error(py, error, None)),
    }
}
