//! Provider profiles (docs/provider-profiles.md): one call, [`llm_profile`], turns a
//! provider's published limits for a model into the limit definitions and the
//! reservation and reconciliation rules ([`ProfileRules`]) that stay inside that
//! provider's enforcement, so that the numbers from the provider's page give no 429.
//!
//! - OpenAI quantizes per-minute limits to shorter periods ("60,000 requests/minute
//!   may be enforced as 1,000 requests/second"): requests and tokens are rolling
//!   limits over a short sub-window holding that period's share (the token
//!   sub-window grows until the model's largest request fits); a call reserves
//!   what OpenAI counts at admission, its prompt estimate plus `max_tokens`, and
//!   keeps it (OpenAI does not give it back when fewer tokens are generated).
//! - Azure OpenAI checks requests over 1 s or 10 s periods and keeps a token count
//!   reset every minute: requests over a 1 s sub-window (inside both), tokens over
//!   the minute; `max_tokens * best_of` is reserved and kept. Without a published
//!   RPM, Azure's 6 RPM per 1,000 TPM.
//! - Anthropic keeps input and output tokens per minute apart, in token buckets:
//!   `rpm`, `itpm` and `otpm` are `bucket` limits of the published size refilled over
//!   a minute (docs/bucket-limits.md); input excludes cache reads; output reserves
//!   `max_tokens` and is reconciled to the output generated, as Anthropic adjusts it.
//! - Gemini: requests and input tokens per minute, and requests per day (a rolling
//!   day: see docs/provider-profiles.md for why no calendar-day limit kind).
//! - Bedrock: output tokens burn the quota down at 5x for recent Claude models:
//!   the reservation is the input plus 5x `max_tokens`, reconciled to input plus 5x output.

use std::str::FromStr;

use crate::model::definition::{DefinitionError, LimitDefinition};
use crate::model::key::{KeyError, LimitKey};
use crate::model::wire::{Actual, Requirement};

/// A minute, the window providers publish their limits over.
pub const MINUTE_SECONDS: u64 = 60;
/// A day, Gemini's requests-per-day window.
pub const DAY_SECONDS: u64 = 86_400;
/// The sub-windows a per-minute limit is cut into: the divisors of a minute, so
/// that the sub-window's share is an exact fraction of the minute.
pub const SUB_WINDOWS_SECONDS: [u64; 12] = [1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60];
/// OpenAI's quantum in its own example (1,000 a second for 60,000 a minute).
pub const OPENAI_QUANTUM_SECONDS: u64 = 1;
/// Azure's shorter of its two request periods ("1 or 10 seconds"): a 1 s share
/// also keeps every 10 s period inside its share.
pub const AZURE_QUANTUM_SECONDS: u64 = 1;
/// Azure's default request limit per 1,000 tokens per minute.
pub const AZURE_RPM_PER_1000_TPM: u64 = 6;
/// Characters per token in OpenAI's admission estimate of a prompt: OpenAI (and
/// Azure) count a request against the token limit at arrival from the prompt's
/// characters, about four to a token (docs/provider-profiles.md, "OpenAI", with
/// its source), so a reservation must never be below a quarter of the characters.
pub const OPENAI_CHARACTERS_PER_TOKEN: u64 = 4;
/// Bedrock's output burndown for Claude 3.7 and later models.
pub const BEDROCK_OUTPUT_BURNDOWN: u64 = 5;
/// The largest request assumed when none is given, in tokens (prompt plus
/// `max_tokens`): the token sub-window is sized so that it fits.
pub const LARGEST_REQUEST_TOKENS_DEFAULT: u64 = 16_384;
/// The margin of a sub-window, per mille of the window (10 ms on 1 s): the time
/// between our grant and the provider's admission, kept small because a
/// sub-window's margin is capacity lost (the backend default of 50 ms would
/// cost 5 % of a 1 s window).
pub const SUB_WINDOW_MARGIN_PER_MILLE: u64 = 10;
/// How long a concurrency hold lives when its caller crashed.
pub const CONCURRENCY_TIMEOUT_SECONDS: u64 = 300;

/// A provider with a profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    /// OpenAI's API.
    Openai,
    /// Azure OpenAI.
    Azure,
    /// Anthropic's API.
    Anthropic,
    /// Google's Gemini API.
    Gemini,
    /// Amazon Bedrock.
    Bedrock,
}

impl Provider {
    /// Every provider with a profile.
    pub const ALL: [Provider; 5] = [
        Provider::Openai,
        Provider::Azure,
        Provider::Anthropic,
        Provider::Gemini,
        Provider::Bedrock,
    ];

    /// The name used in keys and configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Openai => "openai",
            Provider::Azure => "azure",
            Provider::Anthropic => "anthropic",
            Provider::Gemini => "gemini",
            Provider::Bedrock => "bedrock",
        }
    }
}

impl FromStr for Provider {
    type Err = ProfileError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        (Provider::ALL.into_iter())
            .find(|p| p.as_str() == name)
            .ok_or_else(|| ProfileError::UnknownProvider(name.to_owned()))
    }
}

/// Why a profile cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    /// No profile has this name.
    #[error("unknown provider {0:?}: one of openai, azure, anthropic, gemini, bedrock")]
    UnknownProvider(String),
    /// A published figure the provider needs is missing or invalid; the message names it.
    #[error("{0}")]
    Invalid(String),
    /// The provider or model is not a valid key part.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// A definition is out of range.
    #[error(transparent)]
    Definition(#[from] DefinitionError),
}

/// The limits a provider publishes for a model; each provider needs its own
/// (OpenAI, Gemini, Bedrock: `rpm` and `tpm`; Azure: `tpm`, and `rpm` when not 6
/// per 1,000 TPM; Anthropic: `rpm`, `input_tpm` and `output_tpm`; Gemini may add `rpd`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Published {
    /// Requests per minute.
    #[serde(default)]
    pub rpm: Option<u64>,
    /// Tokens per minute.
    #[serde(default)]
    pub tpm: Option<u64>,
    /// Anthropic: input tokens per minute.
    #[serde(default)]
    pub input_tpm: Option<u64>,
    /// Anthropic: output tokens per minute.
    #[serde(default)]
    pub output_tpm: Option<u64>,
    /// Gemini: requests per day.
    #[serde(default)]
    pub rpd: Option<u64>,
    /// Calls in flight, when the caller wants them limited (no provider publishes one).
    #[serde(default)]
    pub concurrency: Option<u64>,
    /// The largest request the model is sent, prompt plus `max_tokens` in tokens:
    /// the token sub-window of a quantizing provider is sized so that it fits
    /// (default [`LARGEST_REQUEST_TOKENS_DEFAULT`]).
    #[serde(default)]
    pub largest_request_tokens: Option<u64>,
    /// OpenAI, Azure: the period the provider quantizes requests to, in seconds,
    /// when known to differ from its documented example.
    #[serde(default)]
    pub quantum_seconds: Option<u64>,
}

/// A provider's limits for one model: the definitions to apply and the rules of
/// what each call reserves and completes with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlmProfile {
    /// The definitions, applied as any other (`Backend::apply_definition`, the admin API).
    pub definitions: Vec<LimitDefinition>,
    /// What each call reserves and reconciles to.
    pub rules: ProfileRules,
}

/// What a call reserves and reconciles to under one provider's profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileRules {
    provider: Provider,
    key_provider: String,
    model: String,
    requests: LimitKey,
    tokens: LimitKey,
    output_tokens: Option<LimitKey>,
    daily_requests: Option<LimitKey>,
    concurrency: Option<LimitKey>,
}

/// One call, as a profile sizes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfileCall<'a> {
    /// The prompt text (OpenAI and Azure estimate from its characters).
    pub prompt: &'a str,
    /// The prompt's count by the provider's tokenizer, when known.
    pub prompt_tokens: Option<u64>,
    /// Of the prompt, tokens the caller expects read from the provider's prompt cache.
    pub cache_read_tokens: u64,
    /// The `max_tokens` bound sent.
    pub max_output_tokens: u64,
    /// Azure's `best_of` (1 when absent).
    pub best_of: u64,
}

/// What the provider reported a call used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProviderUsage {
    /// Input tokens the provider counts (Anthropic: `input_tokens` plus
    /// `cache_creation_input_tokens`, not cache reads).
    pub input_tokens: u64,
    /// Output tokens generated.
    pub output_tokens: u64,
}

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

impl ProfileRules {
    /// The provider.
    pub fn provider(&self) -> Provider {
        self.provider
    }

    /// The provider part of the keys: the provider's name, unless built by
    /// [`llm_profile_keyed`].
    pub fn key_provider(&self) -> &str {
        &self.key_provider
    }

    /// The model.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The request limit's key (the key a caller holds to pause the model).
    pub fn requests_key(&self) -> &LimitKey {
        &self.requests
    }

    /// Every token limit's key (Anthropic: input and output; the others: one):
    /// every job of the model reserves each, and a Complete that reconciles a
    /// call down frees room on each, so a scheduler waiting on any of them must
    /// be woken by it.
    pub fn token_keys(&self) -> Vec<LimitKey> {
        std::iter::once(&self.tokens)
            .chain(self.output_tokens.as_ref())
            .cloned()
            .collect()
    }

    /// The concurrency limit's key, when calls in flight are limited.
    pub fn concurrency_key(&self) -> Option<&LimitKey> {
        self.concurrency.as_ref()
    }

    /// Whether these are the rules of the keys of `provider`'s `model` (the
    /// scheduler picks a job's rules by the provider and model of its keys).
    pub fn applies_to(&self, provider: &str, model: &str) -> bool {
        self.key_provider == provider && self.model == model
    }

    /// The prompt tokens the provider counts at admission: OpenAI and Azure
    /// estimate from characters (about four to a token) and a reservation must not
    /// be smaller than their estimate; the others count the prompt (the caller's
    /// count when given, else one token per byte, which never undercounts).
    pub fn prompt_charge(&self, call: &ProfileCall<'_>) -> u64 {
        match self.provider {
            Provider::Openai | Provider::Azure => {
                let characters = u64::try_from(call.prompt.chars().count()).expect("usize fits u64");
                self.counted_prompt_charge(call.prompt_tokens.unwrap_or(0), characters)
            }
            _ => call
                .prompt_tokens
                .unwrap_or_else(|| crate::provider::llm::estimate_prompt_tokens(call.prompt)),
        }
    }

    /// [`ProfileRules::prompt_charge`] for a caller that counted the prompt itself
    /// (`prompt_tokens`, by the provider's tokenizer) and knows its length in
    /// characters but holds no single prompt text (the gateway, whose prompt is
    /// spread over messages): OpenAI and Azure charge at least their estimate of
    /// [`OPENAI_CHARACTERS_PER_TOKEN`] characters a token, the others the count.
    pub fn counted_prompt_charge(&self, prompt_tokens: u64, prompt_characters: u64) -> u64 {
        match self.provider {
            Provider::Openai | Provider::Azure => {
                (prompt_characters.div_ceil(OPENAI_CHARACTERS_PER_TOKEN)).max(prompt_tokens)
            }
            _ => prompt_tokens,
        }
    }

    /// The token requirements (key, amount) the provider charges `call` at most.
    fn token_amounts(&self, call: &ProfileCall<'_>) -> Vec<(LimitKey, u64)> {
        let prompt = self.prompt_charge(call);
        let bound = call.max_output_tokens;
        match self.provider {
            Provider::Openai => vec![(self.tokens.clone(), prompt.saturating_add(bound))],
            Provider::Azure => vec![(
                self.tokens.clone(),
                prompt.saturating_add(bound.saturating_mul(call.best_of.max(1))),
            )],
            Provider::Anthropic => vec![
                (self.tokens.clone(), prompt.saturating_sub(call.cache_read_tokens)),
                (
                    self.output_tokens.clone().expect("anthropic has an output limit"),
                    bound,
                ),
            ],
            Provider::Gemini => vec![(self.tokens.clone(), prompt)],
            Provider::Bedrock => vec![(
                self.tokens.clone(),
                prompt.saturating_add(bound.saturating_mul(BEDROCK_OUTPUT_BURNDOWN)),
            )],
        }
    }

    /// What `call` reserves: a request on each request limit, the tokens the
    /// provider can charge it at most on each token limit (at least 1 each), and a
    /// concurrency slot when limited.
    pub fn requirements(&self, call: &ProfileCall<'_>) -> Vec<Requirement> {
        let mut requirements = vec![Requirement {
            key: self.requests.clone(),
            amount: 1,
        }];
        for (key, amount) in self.token_amounts(call) {
            requirements.push(Requirement {
                key,
                amount: amount.max(1),
            });
        }
        for key in [&self.daily_requests, &self.concurrency].into_iter().flatten() {
            requirements.push(Requirement {
                key: key.clone(),
                amount: 1,
            });
        }
        requirements
    }

    /// What `call` completes with once the provider reported `usage`: each token
    /// limit reconciled to what the provider finally charges. OpenAI and Azure keep
    /// their admission estimate whatever was generated, so their reservation stays
    /// whole (releasing it would free capacity the provider still counts).
    pub fn actuals(&self, call: &ProfileCall<'_>, usage: &ProviderUsage) -> Vec<Actual> {
        let actual = |key: &LimitKey, amount: u64| Actual {
            key: key.clone(),
            actual_amount: amount,
        };
        match self.provider {
            Provider::Openai | Provider::Azure => (self.token_amounts(call).iter())
                .map(|(key, amount)| actual(key, (*amount).max(1)))
                .collect(),
            Provider::Anthropic => vec![
                actual(&self.tokens, usage.input_tokens),
                actual(
                    self.output_tokens.as_ref().expect("anthropic has an output limit"),
                    usage.output_tokens,
                ),
            ],
            Provider::Gemini => vec![actual(&self.tokens, usage.input_tokens)],
            Provider::Bedrock => vec![actual(
                &self.tokens,
                (usage.input_tokens).saturating_add(usage.output_tokens.saturating_mul(BEDROCK_OUTPUT_BURNDOWN)),
            )],
        }
    }

    /// [`ProfileRules::actuals`] when only the call's total tokens are known (the
    /// scheduler's execute returns one figure): the prompt's charge is the input,
    /// the rest the output.
    pub fn actuals_from_total(&self, call: &ProfileCall<'_>, total_tokens: u64) -> Vec<Actual> {
        let input = self
            .prompt_charge(call)
            .saturating_sub(call.cache_read_tokens)
            .min(total_tokens);
        let usage = ProviderUsage {
            input_tokens: input,
            output_tokens: total_tokens - input,
        };
        self.actuals(call, &usage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::definition::LimitKind;

    fn shape(profile: &LlmProfile) -> Vec<(String, u64, u64, Option<u64>)> {
        (profile.definitions.iter())
            .map(|d| {
                (
                    d.key().as_str().to_owned(),
                    d.capacity(),
                    d.window_seconds(),
                    d.window_margin_ms(),
                )
            })
            .collect()
    }

    fn kinds(profile: &LlmProfile) -> Vec<LimitKind> {
        profile.definitions.iter().map(LimitDefinition::kind).collect()
    }

    #[test]
    fn only_anthropic_uses_buckets_the_others_enforce_windows() {
        let numbers = Published {
            input_tpm: Some(30_000),
            output_tpm: Some(8_000),
            rpd: Some(10_000),
            ..published(500, 30_000)
        };
        for provider in Provider::ALL {
            let profile = llm_profile(provider.as_str(), "m", &numbers).unwrap();
            let expected = match provider {
                Provider::Anthropic => LimitKind::Bucket,
                _ => LimitKind::Rolling,
            };
            assert!(
                kinds(&profile).iter().all(|kind| *kind == expected),
                "{provider:?}: {:?}",
                kinds(&profile)
            );
        }
        // A published figure too small to keep a burst is a clear error, not a limit
        // that can never grant.
        let tiny = Published {
            rpm: Some(1),
            ..numbers
        };
        let refused = llm_profile("anthropic", "m", &tiny).unwrap_err();
        assert!(refused.to_string().contains("keeps no burst"), "{refused}");
    }

    fn published(rpm: u64, tpm: u64) -> Published {
        Published {
            rpm: Some(rpm),
            tpm: Some(tpm),
            ..Published::default()
        }
    }

    fn owned(rows: &[(&str, u64, u64, Option<u64>)]) -> Vec<(String, u64, u64, Option<u64>)> {
        rows.iter().map(|&(k, c, w, m)| (k.to_owned(), c, w, m)).collect()
    }

    #[test]
    fn openai_quantizes_to_a_second_and_grows_the_token_window_to_the_largest_request() {
        // OpenAI tier 1 gpt-4o-mini: 500 RPM, 200,000 TPM. "60,000 requests/minute may be
        // enforced as 1,000 requests/second": 500 RPM is 8 a second (rounded down);
        // 200,000 TPM is 3,333 a second, below a 16,384-token request: 5 s hold 16,666.
        let profile = llm_profile("openai", "gpt-4o-mini", &published(500, 200_000)).unwrap();
        assert_eq!(
            shape(&profile),
            owned(&[
                ("global:llm:openai:gpt-4o-mini:rpm", 8, 1, Some(10)),
                ("global:llm:openai:gpt-4o-mini:tpm", 16_666, 5, Some(50)),
            ])
        );
        // 30,000 RPM and 150,000,000 TPM: a second holds both.
        let big = llm_profile("openai", "gpt-4o", &published(30_000, 150_000_000)).unwrap();
        assert_eq!(
            shape(&big)[0],
            ("global:llm:openai:gpt-4o:rpm".to_owned(), 500, 1, Some(10))
        );
        assert_eq!(shape(&big)[1].1, 2_500_000);
        // 3 RPM: a second holds none; 20 s hold one.
        let tiny = llm_profile("openai", "o1", &published(3, 1_000_000)).unwrap();
        assert_eq!(
            shape(&tiny)[0],
            ("global:llm:openai:o1:rpm".to_owned(), 1, 20, Some(200))
        );
    }

    #[test]
    fn openai_reserves_its_estimate_plus_max_tokens_and_keeps_it() {
        let profile = llm_profile("openai", "gpt-4o", &published(500, 30_000)).unwrap();
        let call = ProfileCall {
            prompt: &"word ".repeat(100), // 500 characters: OpenAI estimates 125 tokens.
            prompt_tokens: Some(100),
            cache_read_tokens: 0,
            max_output_tokens: 400,
            best_of: 1,
        };
        let amounts: Vec<u64> = profile.rules.requirements(&call).iter().map(|r| r.amount).collect();
        assert_eq!(amounts, [1, 525], "not the smaller exact count");
        let usage = ProviderUsage {
            input_tokens: 100,
            output_tokens: 3,
        };
        let actuals = profile.rules.actuals(&call, &usage);
        assert_eq!(actuals[0].actual_amount, 525, "OpenAI still counts its estimate");
    }

    #[test]
    fn a_counted_prompt_is_charged_at_least_openais_character_estimate() {
        let rules = |provider: &str| {
            let mut numbers = published(500, 30_000);
            numbers.input_tpm = Some(30_000);
            numbers.output_tpm = Some(8_000);
            llm_profile(provider, "m", &numbers).unwrap().rules
        };
        for provider in ["openai", "azure"] {
            // 400 characters the tokenizer packs into 50 tokens: OpenAI counts 100.
            assert_eq!(rules(provider).counted_prompt_charge(50, 400), 100, "{provider}");
            assert_eq!(rules(provider).counted_prompt_charge(150, 400), 150, "{provider}");
            assert_eq!(rules(provider).counted_prompt_charge(0, 1), 1, "{provider}: rounds up");
        }
        assert_eq!(
            rules("anthropic").counted_prompt_charge(50, 400),
            50,
            "counts tokens only"
        );
    }

    #[test]
    fn azure_derives_rpm_from_tpm_and_reserves_best_of() {
        // Azure: "6 RPM per 1000 TPM"; 100,000 TPM gives 600 RPM, "10 requests per
        // 1-second period"; tokens are counted per minute.
        let profile = llm_profile(
            "azure",
            "gpt-4o",
            &Published {
                tpm: Some(100_000),
                ..Published::default()
            },
        )
        .unwrap();
        assert_eq!(
            shape(&profile),
            owned(&[
                ("global:llm:azure:gpt-4o:rpm", 10, 1, Some(10)),
                ("global:llm:azure:gpt-4o:tpm", 100_000, 60, None),
            ])
        );
        let call = ProfileCall {
            prompt: "abcdefgh",
            prompt_tokens: None,
            cache_read_tokens: 0,
            max_output_tokens: 100,
            best_of: 3,
        };
        assert_eq!(profile.rules.requirements(&call)[1].amount, 302);
    }

    #[test]
    fn anthropic_splits_input_and_output_and_reconciles_each() {
        // Anthropic tier 4 Claude Sonnet: 4,000 RPM, 2,000,000 ITPM, 400,000 OTPM.
        let profile = llm_profile(
            "anthropic",
            "claude-sonnet-4",
            &Published {
                rpm: Some(4_000),
                input_tpm: Some(2_000_000),
                output_tpm: Some(400_000),
                concurrency: Some(32),
                ..Published::default()
            },
        )
        .unwrap();
        assert_eq!(
            shape(&profile),
            owned(&[
                ("global:llm:anthropic:claude-sonnet-4:rpm", 4_000, 60, None),
                ("global:llm:anthropic:claude-sonnet-4:itpm", 2_000_000, 60, None),
                ("global:llm:anthropic:claude-sonnet-4:otpm", 400_000, 60, None),
                ("global:llm:anthropic:claude-sonnet-4:concurrency", 32, 0, None),
            ])
        );
        // Anthropic enforces token buckets: its three published limits are buckets.
        assert_eq!(
            kinds(&profile),
            [
                LimitKind::Bucket,
                LimitKind::Bucket,
                LimitKind::Bucket,
                LimitKind::Concurrency
            ]
        );
        let call = ProfileCall {
            prompt: "",
            prompt_tokens: Some(10_000),
            cache_read_tokens: 9_000,
            max_output_tokens: 1_000,
            best_of: 1,
        };
        let got: Vec<(String, u64)> = (profile.rules.requirements(&call).iter())
            .map(|r| (r.key.as_str().rsplit(':').next().unwrap().to_owned(), r.amount))
            .collect();
        let expected: Vec<(String, u64)> = [("rpm", 1), ("itpm", 1_000), ("otpm", 1_000), ("concurrency", 1)]
            .iter()
            .map(|&(k, a)| (k.to_owned(), a))
            .collect();
        assert_eq!(got, expected, "cache reads are not input");
        let actuals = profile.rules.actuals(
            &call,
            &ProviderUsage {
                input_tokens: 1_000,
                output_tokens: 120,
            },
        );
        assert_eq!(
            actuals.iter().map(|a| a.actual_amount).collect::<Vec<_>>(),
            [1_000, 120]
        );
        let token_keys: Vec<String> = (profile.rules.token_keys().iter())
            .map(|k| k.as_str().to_owned())
            .collect();
        assert_eq!(
            token_keys,
            [
                "global:llm:anthropic:claude-sonnet-4:itpm",
                "global:llm:anthropic:claude-sonnet-4:otpm"
            ],
            "a Complete frees room on both"
        );
        let missing = llm_profile("anthropic", "m", &published(50, 30_000)).unwrap_err();
        assert!(missing.to_string().contains("input_tpm"), "{missing}");
    }

    #[test]
    fn gemini_adds_requests_per_day_and_bedrock_burns_output_down_at_five() {
        let gemini = llm_profile(
            "gemini",
            "gemini-2.5-flash",
            &Published {
                rpd: Some(10_000),
                ..published(1_000, 1_000_000)
            },
        )
        .unwrap();
        assert_eq!(
            shape(&gemini)[2],
            (
                "global:llm:gemini:gemini-2.5-flash:rpd".to_owned(),
                10_000,
                86_400,
                None
            )
        );
        let bedrock = llm_profile("bedrock", "claude", &published(100, 200_000)).unwrap();
        let call = ProfileCall {
            prompt: "",
            prompt_tokens: Some(1_000),
            cache_read_tokens: 0,
            max_output_tokens: 2_000,
            best_of: 1,
        };
        assert_eq!(bedrock.rules.requirements(&call)[1].amount, 11_000);
        assert_eq!(
            bedrock.rules.token_keys(),
            [LimitKey::llm_tpm("bedrock", "claude").unwrap()]
        );
        assert_eq!(bedrock.rules.actuals_from_total(&call, 1_300)[0].actual_amount, 2_500);
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        assert!(matches!(
            llm_profile("mistral", "m", &published(1, 1)),
            Err(ProfileError::UnknownProvider(_))
        ));
        assert!(llm_profile("openai", "gpt:4o", &published(1, 1)).is_err());
        let zero = llm_profile("openai", "m", &published(0, 1)).unwrap_err();
        assert!(zero.to_string().contains("rpm"), "{zero}");
        let quantum = llm_profile(
            "openai",
            "m",
            &Published {
                quantum_seconds: Some(61),
                ..published(1, 1)
            },
        );
        assert!(quantum.is_err());
    }
}
