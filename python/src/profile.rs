//! Provider profiles (docs/provider-profiles.md): the library's definitions and
//! reservation rules for a provider's published limits, so Python never re-derives
//! a provider's enforcement.

use pyo3::prelude::*;
use ratelimiter::profile::{llm_profile as build_profile, LlmProfile, ProfileCall, Published};

use crate::errors;

/// One `(key, amount)` pair as Python receives it.
type Pair = (String, u64);

fn profile(py: Python<'_>, provider: &str, model: &str, published_json: &str) -> PyResult<LlmProfile> {
    let published: Published =
        serde_json::from_str(published_json).map_err(|e| errors::invalid(py, "limits", e.to_string()))?;
    build_profile(provider, model, &published).map_err(|e| errors::invalid(py, "provider/model/limits", e.to_string()))
}

fn call<'a>(prompt: &'a str, max_tokens: u64, prompt_tokens: Option<u64>) -> ProfileCall<'a> {
    ProfileCall {
        prompt,
        prompt_tokens,
        cache_read_tokens: 0,
        max_output_tokens: max_tokens,
        best_of: 1,
    }
}

/// The definitions of `provider`'s profile for `model` from its published limits
/// (a JSON object: `rpm`, `tpm`, `input_tpm`, `output_tpm`, `rpd`, `concurrency`,
/// `largest_request_tokens`, `quantum_seconds`), as a JSON array.
#[pyfunction]
pub fn llm_profile(py: Python<'_>, provider: &str, model: &str, published_json: &str) -> PyResult<String> {
    let profile = profile(py, provider, model, published_json)?;
    Ok(serde_json::to_string(&profile.definitions).expect("definitions serialize"))
}

/// What one call reserves under the profile.
#[pyfunction]
#[pyo3(signature = (provider, model, published_json, prompt, max_tokens, *, prompt_tokens=None))]
pub fn profile_requirements(
    py: Python<'_>,
    provider: &str,
    model: &str,
    published_json: &str,
    prompt: &str,
    max_tokens: u64,
    prompt_tokens: Option<u64>,
) -> PyResult<Vec<Pair>> {
    let profile = profile(py, provider, model, published_json)?;
    let requirements = profile.rules.requirements(&call(prompt, max_tokens, prompt_tokens));
    Ok(requirements
        .into_iter()
        .map(|r| (r.key.to_string(), r.amount))
        .collect())
}

/// What one call that used `used_tokens` (prompt plus output) completes with under the profile.
#[pyfunction]
#[pyo3(signature = (provider, model, published_json, prompt, max_tokens, used_tokens, *, prompt_tokens=None))]
// Each argument is a Python argument; a struct would not be one.
#[allow(clippy::too_many_arguments)]
pub fn profile_actuals(
    py: Python<'_>,
    provider: &str,
    model: &str,
    published_json: &str,
    prompt: &str,
    max_tokens: u64,
    used_tokens: u64,
    prompt_tokens: Option<u64>,
) -> PyResult<Vec<Pair>> {
    let profile = profile(py, provider, model, published_json)?;
    let actuals = (profile.rules).actuals_from_total(&call(prompt, max_tokens, prompt_tokens), used_tokens);
    Ok(actuals
        .into_iter()
        .map(|a| (a.key.to_string(), a.actual_amount))
        .collect())
}
