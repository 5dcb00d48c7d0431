//! `llm_ratelimiter._native`: the Rust half of the Python package `llm-ratelimiter-rs`.
//!
//! Every limiting decision is the `ratelimiter` library's: this crate only
//! converts arguments, releases the GIL while Rust works, and maps outcomes and
//! errors to Python. The Python half (`python/llm_ratelimiter/`) adds the typed
//! API, the asyncio scheduler and the context managers around these classes.

#![warn(missing_docs)]

mod convert;
mod errors;
mod headers;
mod llm;
mod memory;
mod outcome;
mod profile;
mod remote;
mod runtime;

use pyo3::prelude::*;

/// The module: the two limiters, the outcome types and the LLM helpers.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<memory::MemoryLimiter>()?;
    m.add_class::<remote::RemoteLimiter>()?;
    m.add_class::<outcome::Reservation>()?;
    m.add_class::<outcome::Denial>()?;
    m.add_function(wrap_pyfunction!(llm::llm_requirements, m)?)?;
    m.add_function(wrap_pyfunction!(llm::llm_actuals, m)?)?;
    m.add_function(wrap_pyfunction!(convert::new_lease_id, m)?)?;
    m.add_function(wrap_pyfunction!(profile::llm_profile, m)?)?;
    m.add_function(wrap_pyfunction!(profile::profile_requirements, m)?)?;
    m.add_function(wrap_pyfunction!(profile::profile_actuals, m)?)?;
    m.add_function(wrap_pyfunction!(headers::read_provider_headers, m)?)?;
    m.add_function(wrap_pyfunction!(headers::limits_above_provider, m)?)?;
    m.add("REQUIREMENTS_MAX", ratelimiter::wire::REQUIREMENTS_MAX)?;
    m.add("PAUSE_MS_MAX", ratelimiter::pause::PAUSE_MS_MAX)?;
    Ok(())
}
