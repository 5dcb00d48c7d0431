//! The limit definitions and rules a provider's published limits give for a
//! model (docs/provider-profiles.md).

use crate::model::definition::LimitDefinition;
use crate::model::key::LimitKey;

use super::error::ProfileError;
use super::figures::{
    AZURE_QUANTUM_SECONDS, AZURE_RPM_PER_1000_TPM, CONCURRENCY_TIMEOUT_SECONDS, DAY_SECONDS,
    LARGEST_REQUEST_TOKENS_DEFAULT, MINUTE_SECONDS, OPENAI_QUANTUM_SECONDS, SUB_WINDOWS_SECONDS,
    SUB_WINDOW_MARGIN_PER_MILLE,
};
use super::provider::Provider;
use super::published::Published;
use super::rules::{LlmProfile, ProfileRules};

/// The profile of `provider` (`openai`, `azure`, `anthropic`, `gemini`, `bedrock`)
/// for `model` from its published limits, keyed `global:llm:<provider>:<model>:...`.
pub fn llm_profile(provider: &str, model: &str, published: &Published) -> Result<LlmProfile, ProfileError> {
    llm_profile_keyed(provider, provider, model, published)
}

/// [`llm_profile`] with `key_provider` as the provider part of the keys
/// (`global:llm:<key_provider>:<model>:...`): the gateway keys a model by the name of
/// the upstream serving it, and the profile only chooses the rules (two Azure
/// deployments, or an OpenAI-compatible server run with OpenAI's rules, each keep
/// their own limits).
pub fn llm_profile_keyed(
    provider: &str,
    key_provider: &str,
    model: &str,
    published: &Published,
) -> Result<LlmProfile, ProfileError> {
    let provider: Provider = provider.parse()?;
    let key = |dimension: &str| LimitKey::llm_dimension(key_provider, model, dimension);
    let need = |value: Option<u64>, name: &str| match value {
        Some(v) if v >= 1 => Ok(v),
        Some(_) => Err(ProfileError::Invalid(format!("{name} must be at least 1"))),
        None => Err(ProfileError::Invalid(format!(
            "{} publishes {name}: it is required",
            provider.as_str()
        ))),
    };
    let largest = published
        .largest_request_tokens
        .unwrap_or(LARGEST_REQUEST_TOKENS_DEFAULT)
        .max(1);
    let (requests, tokens) = (key("rpm")?, key("tpm")?);
    let mut rules = ProfileRules {
        provider,
        key_provider: key_provider.to_owned(),
        model: model.to_owned(),
        requests: requests.clone(),
        tokens: tokens.clone(),
        output_tokens: None,
        daily_requests: None,
        concurrency: None,
    };
    let mut definitions = Vec::new();
    match provider {
        Provider::Openai | Provider::Azure => {
            let tpm = need(published.tpm, "tpm")?;
            let rpm = match (provider, published.rpm) {
                (Provider::Azure, None) => (tpm / 1_000 * AZURE_RPM_PER_1000_TPM).max(1),
                (_, rpm) => need(rpm, "rpm")?,
            };
            let default_quantum = if provider == Provider::Openai {
                OPENAI_QUANTUM_SECONDS
            } else {
                AZURE_QUANTUM_SECONDS
            };
            let quantum = published.quantum_seconds.unwrap_or(default_quantum);
            if !(1..=MINUTE_SECONDS).contains(&quantum) {
                return Err(ProfileError::Invalid(format!(
                    "quantum_seconds must be 1..={MINUTE_SECONDS}"
                )));
            }
            definitions.push(sub_window(requests, rpm, quantum, 1)?);
            definitions.push(if provider == Provider::Openai {
                sub_window(tokens, tpm, quantum, largest)?
            } else {
                minute(tokens, tpm)?
            });
        }
        Provider::Anthropic => {
            let output = key("otpm")?;
            rules.tokens = key("itpm")?;
            definitions.push(minute_bucket(requests, need(published.rpm, "rpm")?)?);
            definitions.push(minute_bucket(
                rules.tokens.clone(),
                need(published.input_tpm, "input_tpm")?,
            )?);
            definitions.push(minute_bucket(
                output.clone(),
                need(published.output_tpm, "output_tpm")?,
            )?);
            rules.output_tokens = Some(output);
        }
        Provider::Gemini | Provider::Bedrock => {
            definitions.push(minute(requests, need(published.rpm, "rpm")?)?);
            definitions.push(minute(tokens, need(published.tpm, "tpm")?)?);
            if let (Provider::Gemini, Some(rpd)) = (provider, published.rpd) {
                let daily = key("rpd")?;
                definitions.push(LimitDefinition::rolling(
                    daily.clone(),
                    need(Some(rpd), "rpd")?,
                    DAY_SECONDS,
                )?);
                rules.daily_requests = Some(daily);
            }
        }
    }
    if let Some(concurrency) = published.concurrency {
        let held = key("concurrency")?;
        let capacity = need(Some(concurrency), "concurrency")?;
        definitions.push(LimitDefinition::concurrency(
            held.clone(),
            capacity,
            CONCURRENCY_TIMEOUT_SECONDS,
        )?);
        rules.concurrency = Some(held);
    }
    Ok(LlmProfile { definitions, rules })
}

/// A per-minute limit as the provider publishes it.
fn minute(key: LimitKey, capacity: u64) -> Result<LimitDefinition, ProfileError> {
    Ok(LimitDefinition::rolling(key, capacity, MINUTE_SECONDS)?)
}

/// A per-minute limit the provider enforces as a token bucket of that size
/// refilled over the minute: Anthropic "uses the token bucket algorithm ... your
/// capacity is continuously replenished up to your maximum limit, rather than being
/// reset at fixed intervals" (<https://docs.anthropic.com/en/api/rate-limits>). A
/// rolling minute of the same size is never refused either, but it charges a call's
/// unused `max_tokens` for every instant the call is in flight where the bucket takes
/// it once, and it gives up the full bucket's head start: it leaves the provider's
/// capacity idle (docs/bucket-limits.md; BENCHMARKS.md, "Provider profiles").
fn minute_bucket(key: LimitKey, capacity: u64) -> Result<LimitDefinition, ProfileError> {
    Ok(LimitDefinition::bucket(key, capacity, MINUTE_SECONDS)?)
}

/// A per-minute limit of `per_minute` enforced over the shortest sub-window of at
/// least `quantum_seconds` whose share holds `largest` (a minute when none does).
fn sub_window(
    key: LimitKey,
    per_minute: u64,
    quantum_seconds: u64,
    largest: u64,
) -> Result<LimitDefinition, ProfileError> {
    let (window_seconds, capacity) = (SUB_WINDOWS_SECONDS.into_iter())
        .filter(|&s| s >= quantum_seconds)
        .map(|s| (s, per_minute.saturating_mul(s) / MINUTE_SECONDS))
        .find(|&(_, share)| share >= largest)
        .unwrap_or((MINUTE_SECONDS, per_minute));
    let definition = LimitDefinition::rolling(key, capacity, window_seconds)?;
    if window_seconds == MINUTE_SECONDS {
        return Ok(definition);
    }
    let margin_ms = window_seconds * SUB_WINDOW_MARGIN_PER_MILLE;
    Ok(definition.with_window_margin_ms(Some(margin_ms))?)
}
