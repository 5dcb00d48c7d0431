//! What each call reserves and reconciles to under a provider's profile.

use crate::model::definition::LimitDefinition;
use crate::model::key::LimitKey;
use crate::model::wire::{Actual, Requirement};

use super::call::{ProfileCall, ProviderUsage};
use super::figures::{BEDROCK_OUTPUT_BURNDOWN, OPENAI_CHARACTERS_PER_TOKEN};
use super::provider::Provider;

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
    pub(super) provider: Provider,
    pub(super) key_provider: String,
    pub(super) model: String,
    pub(super) requests: LimitKey,
    pub(super) tokens: LimitKey,
    pub(super) output_tokens: Option<LimitKey>,
    pub(super) daily_requests: Option<LimitKey>,
    pub(super) concurrency: Option<LimitKey>,
}

impl ProfileRules {
    /// The provider.
    pub fn provider(&self) -> Provider {
        self.provider
    }

    /// The provider part of the keys: the provider's name, unless built by
    /// [`llm_profile_keyed`](super::llm_profile_keyed).
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
