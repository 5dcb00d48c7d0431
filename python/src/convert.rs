//! Arguments from Python into the library's validated types. Every failure
//! names the argument: a wrong type is a `TypeError` subclass, a wrong value a
//! `ValueError` subclass.

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::prelude::*;
use pyo3::types::{PyInt, PySequence, PyString};
use ratelimiter::id::LeaseId;
use ratelimiter::wire::{Actual, CompleteRequest, Requirement, ReserveRequest, REQUIREMENTS_MAX};
use ratelimiter::LimitKey;

use crate::errors;

/// A fresh lease id (a ULID), for callers that need one before they reserve,
/// such as a job that records it first.
#[pyfunction]
pub fn new_lease_id() -> String {
    LeaseId::generate().to_string()
}

/// Runs `work` with the GIL released, catching a panic so that it reaches
/// Python as an `InternalError` instead of unwinding into the interpreter.
pub fn detached<T: Send>(py: Python<'_>, work: impl FnOnce() -> T + Send) -> PyResult<T> {
    py.detach(|| catch_unwind(AssertUnwindSafe(work)))
        .map_err(|payload| errors::panicked(py, &*payload))
}

/// The lease id of a call: the caller's (parsed) or a new one.
pub fn lease_id(py: Python<'_>, value: Option<&Bound<'_, PyAny>>) -> PyResult<LeaseId> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(LeaseId::generate());
    };
    let text = value
        .cast::<PyString>()
        .map_err(|_| errors::wrong_type(py, "lease_id", "a str (a ULID) or None", value))?;
    LeaseId::parse(&text.to_cow()?).map_err(|e| errors::invalid(py, "lease_id", e.to_string()))
}

/// An optional job id, a `str` or `None`.
pub fn job_id(py: Python<'_>, value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<String>> {
    match value.filter(|v| !v.is_none()) {
        None => Ok(None),
        Some(v) => match v.cast::<PyString>() {
            Ok(s) => Ok(Some(s.to_cow()?.into_owned())),
            Err(_) => Err(errors::wrong_type(py, "job_id", "a str or None", v)),
        },
    }
}

/// A limit key from `value`, named `field` in errors.
pub fn key(py: Python<'_>, field: &str, value: &Bound<'_, PyAny>) -> PyResult<LimitKey> {
    let text = value
        .cast::<PyString>()
        .map_err(|_| errors::wrong_type(py, field, "a str", value))?;
    LimitKey::new(text.to_cow()?.into_owned()).map_err(|e| errors::invalid(py, field, e.to_string()))
}

/// A non-negative integer below 2^64, named `field` in errors.
pub fn amount(py: Python<'_>, field: &str, value: &Bound<'_, PyAny>) -> PyResult<u64> {
    if !value.is_instance_of::<PyInt>() || value.is_instance_of::<pyo3::types::PyBool>() {
        return Err(errors::wrong_type(py, field, "an int", value));
    }
    value
        .extract::<u64>()
        .map_err(|_| errors::invalid(py, field, format!("{field} must be 0..=2**64-1, got {value}")))
}

/// Reads `(key, amount)` pairs: tuples, lists or named tuples such as
/// `Requirement` and `Actual`.
fn pairs(py: Python<'_>, field: &str, value: &Bound<'_, PyAny>) -> PyResult<Vec<(LimitKey, u64)>> {
    let items = value
        .cast::<PySequence>()
        .map_err(|_| errors::wrong_type(py, field, "a sequence of (key, amount) pairs", value))?;
    let length = items.len()?;
    if length > REQUIREMENTS_MAX {
        return Err(errors::invalid(
            py,
            field,
            format!("{field} must hold at most {REQUIREMENTS_MAX} entries, got {length}"),
        ));
    }
    let mut out = Vec::with_capacity(length);
    for index in 0..length {
        let item = items.get_item(index)?;
        let name = format!("{field}[{index}]");
        let pair = item
            .cast::<PySequence>()
            .ok()
            .filter(|p| !p.is_instance_of::<PyString>() && p.len().ok() == Some(2))
            .ok_or_else(|| errors::wrong_type(py, &name, "a (key, amount) pair", &item))?;
        let key = key(py, &format!("{name}.key"), &pair.get_item(0)?)?;
        let amount = amount(py, &format!("{name}.amount"), &pair.get_item(1)?)?;
        out.push((key, amount));
    }
    Ok(out)
}

/// A validated reserve request.
pub fn reserve_request(
    py: Python<'_>,
    requirements: &Bound<'_, PyAny>,
    lease_id: LeaseId,
    job_id: Option<String>,
) -> PyResult<ReserveRequest> {
    let requirements = pairs(py, "requirements", requirements)?
        .into_iter()
        .map(|(key, amount)| Requirement { key, amount })
        .collect();
    ReserveRequest::new(lease_id, job_id, requirements).map_err(|e| errors::invalid(py, "requirements", e.0))
}

/// A validated complete request; `actuals` may be `None` (no reconciliation).
pub fn complete_request(
    py: Python<'_>,
    actuals: Option<&Bound<'_, PyAny>>,
    lease_id: LeaseId,
    job_id: Option<String>,
) -> PyResult<CompleteRequest> {
    let actuals = match actuals.filter(|a| !a.is_none()) {
        None => Vec::new(),
        Some(a) => pairs(py, "actuals", a)?
            .into_iter()
            .map(|(key, actual_amount)| Actual { key, actual_amount })
            .collect(),
    };
    CompleteRequest::new(lease_id, job_id, actuals).map_err(|e| errors::invalid(py, "actuals", e.0))
}

/// The lease and the request of a Complete call, from its Python arguments:
/// a lease id is required here (a Complete names the lease it ends), unlike a
/// reserve's, which is generated when absent.
pub fn complete_call(
    py: Python<'_>,
    lease: &Bound<'_, PyAny>,
    actuals: Option<&Bound<'_, PyAny>>,
    job: Option<&Bound<'_, PyAny>>,
) -> PyResult<(LeaseId, CompleteRequest)> {
    if lease.is_none() {
        return Err(errors::wrong_type(py, "lease_id", "a str (a ULID)", lease));
    }
    let lease = lease_id(py, Some(lease))?;
    let request = complete_request(py, actuals, lease, job_id(py, job)?)?;
    Ok((lease, request))
}
