//! The LLM helper: the library's requirements and actuals for one model call,
//! so Python never assembles keys or computes the token bound itself.

use pyo3::prelude::*;
use ratelimiter::llm::{build_llm_actuals, build_llm_requirements, LlmCall};

use crate::errors;

/// One `(key, amount)` pair as Python receives it.
type Pair = (String, u64);

fn call<'a>(
    provider: &'a str,
    model: &'a str,
    tenant_id: &'a str,
    prompt: &'a str,
    max_tokens: u64,
    prompt_tokens: Option<u64>,
    daily_budget: bool,
) -> LlmCall<'a> {
    LlmCall {
        tenant_id,
        provider,
        model,
        prompt,
        max_output_tokens: max_tokens,
        prompt_tokens,
        want_daily_budget: daily_budget,
    }
}

/// The requirements of one call: rpm 1, tpm the token upper bound (the
/// caller's prompt count, else one per prompt byte, plus `max_tokens`),
/// concurrency 1, and the tenant's daily tokens when `daily_budget`.
#[pyfunction]
#[pyo3(signature = (provider, model, tenant_id, prompt, max_tokens, *, prompt_tokens=None, daily_budget=false))]
// Each argument is a Python keyword argument; a struct would not be one.
#[allow(clippy::too_many_arguments)]
pub fn llm_requirements(
    py: Python<'_>,
    provider: &str,
    model: &str,
    tenant_id: &str,
    prompt: &str,
    max_tokens: u64,
    prompt_tokens: Option<u64>,
    daily_budget: bool,
) -> PyResult<Vec<Pair>> {
    let call = call(
        provider,
        model,
        tenant_id,
        prompt,
        max_tokens,
        prompt_tokens,
        daily_budget,
    );
    let requirements =
        build_llm_requirements(&call).map_err(|e| errors::invalid(py, "provider/model/tenant_id", e.to_string()))?;
    Ok(requirements
        .into_iter()
        .map(|r| (r.key.to_string(), r.amount))
        .collect())
}

/// The actuals of one call that used `used_tokens`: its token limits (tpm and,
/// with `daily_budget`, the tenant's budget) reconciled to that figure.
#[pyfunction]
#[pyo3(signature = (provider, model, tenant_id, used_tokens, *, daily_budget=false))]
pub fn llm_actuals(
    py: Python<'_>,
    provider: &str,
    model: &str,
    tenant_id: &str,
    used_tokens: u64,
    daily_budget: bool,
) -> PyResult<Vec<Pair>> {
    let call = call(provider, model, tenant_id, "", 0, None, daily_budget);
    let actuals = build_llm_actuals(&call, used_tokens)
        .map_err(|e| errors::invalid(py, "provider/model/tenant_id", e.to_string()))?;
    Ok(actuals
        .into_iter()
        .map(|a| (a.key.to_string(), a.actual_amount))
        .collect())
}
