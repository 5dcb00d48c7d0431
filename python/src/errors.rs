//! Errors raised into Python. The classes live in `llm_ratelimiter/errors.py`,
//! so they can inherit from both the package's base class and `ValueError` or
//! `TypeError`; this module builds instances of them.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use ratelimiter::id::LeaseId;
use ratelimiter::LimiterError;

/// The Python module that defines the exception classes.
const ERRORS_MODULE: &str = "llm_ratelimiter.errors";

/// Builds `llm_ratelimiter.errors.<class>(message, **fields)`. Falls back to a
/// `RuntimeError` if the module cannot be imported, so an error is never lost.
fn build(py: Python<'_>, class: &str, message: String, fields: &[(&str, Py<PyAny>)]) -> PyErr {
    let built = (|| -> PyResult<PyErr> {
        let cls = py.import(ERRORS_MODULE)?.getattr(class)?;
        let kwargs = PyDict::new(py);
        for (name, value) in fields {
            kwargs.set_item(*name, value.bind(py))?;
        }
        Ok(PyErr::from_value(cls.call((message.clone(),), Some(&kwargs))?))
    })();
    built.unwrap_or_else(|e| PyRuntimeError::new_err(format!("{message} (and {ERRORS_MODULE}: {e})")))
}

/// A `ValueError` subclass naming the argument that is wrong.
pub fn invalid(py: Python<'_>, field: &str, message: impl Into<String>) -> PyErr {
    let field_value = field.into_pyobject(py).expect("str converts").into_any().unbind();
    build(py, "InvalidArgumentError", message.into(), &[("field", field_value)])
}

/// A `TypeError` subclass naming the argument whose type is wrong.
pub fn wrong_type(py: Python<'_>, field: &str, expected: &str, got: &Bound<'_, PyAny>) -> PyErr {
    let type_name = got
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_owned());
    let field_value = field.into_pyobject(py).expect("str converts").into_any().unbind();
    build(
        py,
        "ArgumentTypeError",
        format!("{field} must be {expected}, got {type_name}"),
        &[("field", field_value)],
    )
}

/// A Rust panic caught at the boundary: an ordinary exception, never an abort.
pub fn panicked(py: Python<'_>, payload: &(dyn std::any::Any + Send)) -> PyErr {
    let detail = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned());
    build(
        py,
        "InternalError",
        format!("internal error in the Rust limiter: {detail}"),
        &[],
    )
}

/// A `LimiterUnavailableError`: nothing was reserved for sure or the outcome
/// is unknown, and the same lease id is what makes the retry safe.
fn retry_same_lease(py: Python<'_>, message: String, lease_id: Option<LeaseId>, retry_after_ms: u64) -> PyErr {
    let retry = retry_after_ms
        .into_pyobject(py)
        .expect("int converts")
        .into_any()
        .unbind();
    let lease = match lease_id {
        Some(id) => id
            .to_string()
            .into_pyobject(py)
            .expect("str converts")
            .into_any()
            .unbind(),
        None => py.None(),
    };
    build(
        py,
        "LimiterUnavailableError",
        message,
        &[("lease_id", lease), ("retry_after_ms", retry)],
    )
}

/// Maps a limiter's operating error to its exception. `lease_id` is the lease
/// the call was about, carried by retryable errors so the caller retries it.
pub fn limiter_error(py: Python<'_>, error: LimiterError, lease_id: Option<LeaseId>) -> PyErr {
    let text = |value: String| value.into_pyobject(py).expect("str converts").into_any().unbind();
    match error {
        LimiterError::UnknownKey(key) => build(
            py,
            "UnknownLimitKeyError",
            format!("unknown_limit_key: {key}"),
            &[("key", text(key.to_string()))],
        ),
        LimiterError::InvalidRequest(message) => build(
            py,
            "InvalidArgumentError",
            format!("invalid_request: {message}"),
            &[("field", text("request".to_owned()))],
        ),
        LimiterError::Conflict(message) => build(py, "LimitConflictError", format!("conflict: {message}"), &[]),
        // Nothing was reserved and the lease id is not burnt: like an
        // unavailable backend, the same lease id is retried after the hint.
        LimiterError::TooManyLeases {
            retry_after_ms,
            message,
        } => retry_same_lease(
            py,
            format!("too_many_leases: {message}; retry with the same lease id"),
            lease_id,
            retry_after_ms,
        ),
        LimiterError::Unavailable { retry_after_ms } => retry_same_lease(
            py,
            "backend_unavailable: the outcome is unknown; retry with the same lease id".to_owned(),
            lease_id,
            retry_after_ms,
        ),
        LimiterError::Backend(message) => build(py, "BackendError", format!("backend_error: {message}"), &[]),
    }
}
