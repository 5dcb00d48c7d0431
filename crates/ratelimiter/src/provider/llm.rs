//! The LLM helper (docs/client-library.md, "The LLM helper"): turns one model call into
//! the requirements it reserves and the actuals it completes with, so callers never
//! assemble keys.

use crate::model::key::{KeyError, LimitKey};
use crate::model::wire::{Actual, Requirement};

/// One LLM call, described by what decides its limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlmCall<'a> {
    /// The tenant whose daily budget the call spends.
    pub tenant_id: &'a str,
    /// The provider, e.g. `openai`.
    pub provider: &'a str,
    /// The model, e.g. `gpt-4o`.
    pub model: &'a str,
    /// The prompt text sent to the model.
    pub prompt: &'a str,
    /// The `max_tokens` bound sent to the provider.
    pub max_output_tokens: u64,
    /// The prompt's token count by the provider's own tokenizer (tiktoken for
    /// OpenAI), when the caller has it: reserved instead of the byte estimate,
    /// which is about four times too high for English. `None` keeps the byte
    /// estimate, which never under-reserves for a tokenizer whose tokens are at
    /// least one byte (every BPE tokenizer in use). A count from another tokenizer
    /// than the provider's can under-reserve: the provider may then answer 429.
    pub prompt_tokens: Option<u64>,
    /// Whether the tenant's daily token budget is reserved too.
    pub want_daily_budget: bool,
}

/// The v1 prompt estimate: one token per UTF-8 byte. Tokenizers produce about one
/// token per four bytes of English, so this never under-reserves.
pub fn estimate_prompt_tokens(prompt: &str) -> u64 {
    u64::try_from(prompt.len()).expect("usize fits u64")
}

/// The most tokens the call can use: the prompt estimate plus the output bound,
/// at least 1 (a reservation of 0 is not a reservation).
pub fn token_upper_bound(prompt: &str, max_output_tokens: u64) -> u64 {
    estimate_prompt_tokens(prompt).saturating_add(max_output_tokens).max(1)
}

impl LlmCall<'_> {
    /// The most tokens the call can use: the caller's prompt count when given,
    /// else the byte estimate, plus the output bound; at least 1.
    pub fn token_upper_bound(&self) -> u64 {
        match self.prompt_tokens {
            Some(prompt_tokens) => prompt_tokens.saturating_add(self.max_output_tokens).max(1),
            None => token_upper_bound(self.prompt, self.max_output_tokens),
        }
    }
}

/// Requirements for `call`: rpm 1, tpm the token upper bound, concurrency 1, and
/// the tenant's daily tokens when asked for.
pub fn build_llm_requirements(call: &LlmCall<'_>) -> Result<Vec<Requirement>, KeyError> {
    let tokens = call.token_upper_bound();
    let mut requirements = vec![
        Requirement {
            key: LimitKey::llm_rpm(call.provider, call.model)?,
            amount: 1,
        },
        Requirement {
            key: LimitKey::llm_tpm(call.provider, call.model)?,
            amount: tokens,
        },
        Requirement {
            key: LimitKey::llm_concurrency(call.provider, call.model)?,
            amount: 1,
        },
    ];
    if call.want_daily_budget {
        requirements.push(Requirement {
            key: LimitKey::tenant_daily_tokens(call.tenant_id)?,
            amount: tokens,
        });
    }
    Ok(requirements)
}

/// Actuals for `call` once it used `actual_tokens`: the token limits it reserved
/// (tpm and, when asked for, the daily budget) are reconciled to that figure.
pub fn build_llm_actuals(call: &LlmCall<'_>, actual_tokens: u64) -> Result<Vec<Actual>, KeyError> {
    let mut actuals = vec![Actual {
        key: LimitKey::llm_tpm(call.provider, call.model)?,
        actual_amount: actual_tokens,
    }];
    if call.want_daily_budget {
        actuals.push(Actual {
            key: LimitKey::tenant_daily_tokens(call.tenant_id)?,
            actual_amount: actual_tokens,
        });
    }
    Ok(actuals)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(prompt: &str, want_daily_budget: bool) -> LlmCall<'_> {
        LlmCall {
            tenant_id: "tenant_a",
            provider: "openai",
            model: "gpt-4o",
            prompt,
            max_output_tokens: 800,
            prompt_tokens: None,
            want_daily_budget,
        }
    }

    #[test]
    fn requirements_follow_spec_section_5() {
        let prompt = "h\u{e9}llo"; // 6 bytes in UTF-8.
        let reqs = build_llm_requirements(&call(prompt, true)).unwrap();
        let got: Vec<(&str, u64)> = reqs.iter().map(|r| (r.key.as_str(), r.amount)).collect();
        assert_eq!(
            got,
            vec![
                ("global:llm:openai:gpt-4o:rpm", 1),
                ("global:llm:openai:gpt-4o:tpm", 806),
                ("global:llm:openai:gpt-4o:concurrency", 1),
                ("tenant:tenant_a:llm:daily_tokens", 806),
            ]
        );
        assert_eq!(build_llm_requirements(&call(prompt, false)).unwrap().len(), 3);
    }

    #[test]
    fn a_counted_prompt_replaces_the_byte_estimate() {
        let prompt = "the cat sat on the mat"; // 22 bytes, 6 tokens for cl100k.
        let mut counted = call(prompt, true);
        assert_eq!(counted.token_upper_bound(), 822);
        counted.prompt_tokens = Some(6);
        assert_eq!(counted.token_upper_bound(), 806);
        let reqs = build_llm_requirements(&counted).unwrap();
        assert_eq!(reqs[1].amount, 806);
        assert_eq!(reqs[3].amount, 806);
        counted.prompt_tokens = Some(u64::MAX);
        assert_eq!(counted.token_upper_bound(), u64::MAX);
        counted.prompt_tokens = Some(0);
        counted.max_output_tokens = 0;
        assert_eq!(counted.token_upper_bound(), 1);
    }

    #[test]
    fn upper_bound_saturates_and_is_never_zero() {
        assert_eq!(token_upper_bound("", 0), 1);
        assert_eq!(token_upper_bound("abc", u64::MAX), u64::MAX);
    }

    #[test]
    fn actuals_reconcile_the_token_limits() {
        let actuals = build_llm_actuals(&call("x", true), 740).unwrap();
        let got: Vec<(&str, u64)> = actuals.iter().map(|a| (a.key.as_str(), a.actual_amount)).collect();
        assert_eq!(
            got,
            vec![
                ("global:llm:openai:gpt-4o:tpm", 740),
                ("tenant:tenant_a:llm:daily_tokens", 740)
            ]
        );
    }

    #[test]
    fn bad_names_are_errors() {
        let mut bad = call("x", true);
        bad.model = "gpt:4o";
        assert!(build_llm_requirements(&bad).is_err());
        let mut bad = call("x", true);
        bad.tenant_id = "";
        assert!(build_llm_requirements(&bad).is_err());
        bad.want_daily_budget = false;
        assert!(build_llm_requirements(&bad).is_ok());
    }
}
