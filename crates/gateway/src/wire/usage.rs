//! Usage as the provider reports it, from a whole answer or from a stream's own
//! events (docs/gateway.md, "Reconciling").

use serde::Deserialize;
use serde_json::Value;

/// Tokens a call used, as the provider counted them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Tokens that count on the input limit: OpenAI's prompt tokens; Anthropic's
    /// input tokens plus cache-creation tokens.
    pub input_tokens: u64,
    /// Tokens that count on the output limit.
    pub output_tokens: u64,
    /// Anthropic's cache reads: billed, so counted on budgets ([`Usage::billed`]),
    /// but not on the input limit of current models.
    pub cache_read_tokens: u64,
    /// OpenAI's prompt tokens read from its cache: a share of `input_tokens`,
    /// billed at the cache-read price (`prompt_tokens_details.cached_tokens`,
    /// Responses' `input_tokens_details.cached_tokens`).
    pub cached_input_tokens: u64,
    /// Anthropic's tokens written to the 5-minute cache: a share of `input_tokens`.
    pub cache_write_tokens: u64,
    /// Anthropic's tokens written to the 1-hour cache: a share of `input_tokens`.
    pub cache_write_1h_tokens: u64,
}

impl Usage {
    /// Input and output together, as the model's limits count them: what a
    /// combined tpm limit counts.
    pub fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// Every token the provider bills: input (with OpenAI's cached tokens and
    /// Anthropic's cache writes), Anthropic's cache reads, and output (with
    /// reasoning): what a tenant's daily budget counts.
    pub fn billed(&self) -> u64 {
        self.total().saturating_add(self.cache_read_tokens)
    }

    /// The usage split by how each token is priced, for a budget in money: the
    /// shares of `input_tokens` read from (OpenAI) or written to (Anthropic) the
    /// cache apart from the rest, Anthropic's reads beside them, output (with
    /// reasoning) as it stands. No token is counted twice.
    pub fn priced(&self) -> ratelimiter::price::Usage {
        let shares = (self.cached_input_tokens)
            .saturating_add(self.cache_write_tokens)
            .saturating_add(self.cache_write_1h_tokens);
        ratelimiter::price::Usage {
            // A share reported above the whole (a provider's error) is billed as
            // reported, never less: the shares keep their own (dearer or equal) price.
            input_tokens: self.input_tokens.saturating_sub(shares),
            cache_read_tokens: self.cache_read_tokens.saturating_add(self.cached_input_tokens),
            cache_write_tokens: self.cache_write_tokens,
            cache_write_1h_tokens: self.cache_write_1h_tokens,
            output_tokens: self.output_tokens,
        }
    }
}

/// What the stream handler does with one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventAction {
    /// Send it to the client.
    Forward,
    /// Keep it from the client (the usage chunk the gateway asked for itself).
    Drop,
}

/// The fields of a provider's `usage` object the gateway reconciles with
/// (OpenAI's chat and embeddings, OpenAI's responses, Anthropic's), each 0 when
/// absent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(default)]
pub struct UsageFields {
    /// OpenAI chat and embeddings: the prompt.
    pub prompt_tokens: u64,
    /// OpenAI chat: the output.
    pub completion_tokens: u64,
    /// OpenAI responses and Anthropic: the input.
    pub input_tokens: u64,
    /// OpenAI responses and Anthropic: the output.
    pub output_tokens: u64,
    /// Anthropic: tokens written to the prompt cache.
    pub cache_creation_input_tokens: u64,
    /// Anthropic: tokens read from the prompt cache.
    pub cache_read_input_tokens: u64,
    /// OpenAI chat: the prompt's details (its cached share).
    pub prompt_tokens_details: Option<TokenDetails>,
    /// OpenAI responses: the input's details (its cached share).
    pub input_tokens_details: Option<TokenDetails>,
    /// Anthropic: the cache writes by lifetime (5-minute and 1-hour).
    pub cache_creation: Option<CacheCreation>,
}

/// OpenAI's `prompt_tokens_details` / `input_tokens_details`: the share of the
/// prompt read from the cache
/// (<https://platform.openai.com/docs/api-reference/chat/object>, `usage`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(default)]
pub struct TokenDetails {
    /// Prompt tokens read from the cache.
    pub cached_tokens: u64,
}

/// Anthropic's `cache_creation`: the cache writes by lifetime, which together
/// make `cache_creation_input_tokens`
/// (<https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching>, "1-hour cache duration").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(default)]
pub struct CacheCreation {
    /// Tokens written to the 5-minute cache.
    pub ephemeral_5m_input_tokens: u64,
    /// Tokens written to the 1-hour cache.
    pub ephemeral_1h_input_tokens: u64,
}

/// A whole answer as far as the gateway reads it: its `usage` only. Every other
/// field is skipped by the parser without being built (no values, no strings),
/// which is most of a non-stream answer's bytes.
#[derive(serde::Deserialize)]
struct Answer {
    #[serde(default)]
    usage: Option<UsageFields>,
}

impl UsageFields {
    /// The `usage` of a whole answer's JSON `body`; `None` when the body is not
    /// JSON, has no `usage` object, or a field is not a non-negative integer (the
    /// call then keeps its reservation: never less than the provider counted).
    pub fn of_answer(body: &[u8]) -> Option<Self> {
        serde_json::from_slice::<Answer>(body).ok()?.usage
    }

    /// The fields of a `usage` value already parsed (a stream's event), read by
    /// the same rule as [`UsageFields::of_answer`]: `None` when a field is not a
    /// non-negative integer (negative, `null`, a string), so that a stream keeps
    /// its reservation exactly where the same answer whole would.
    pub fn of_value(usage: &Value) -> Option<Self> {
        Self::deserialize(usage).ok()
    }

    /// OpenAI's cached share of the prompt (chat or Responses), 0 when absent.
    pub fn cached_tokens(&self) -> u64 {
        (self.prompt_tokens_details.or(self.input_tokens_details)).map_or(0, |d| d.cached_tokens)
    }

    /// Anthropic's cache writes split by lifetime: (5-minute, 1-hour). Without
    /// the split every write is a 5-minute one; with it, a 5-minute share is
    /// whatever of `cache_creation_input_tokens` the 1-hour share leaves.
    pub fn cache_writes(&self) -> (u64, u64) {
        let total = self.cache_creation_input_tokens;
        let one_hour = self
            .cache_creation
            .map_or(0, |c| c.ephemeral_1h_input_tokens)
            .min(total);
        (total - one_hour, one_hour)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answers_usage_is_read_and_the_rest_skipped() {
        let body = br#"{"id":"x","choices":[{"message":{"content":"hi","tool_calls":[{"a":[1,2,{"b":null}]}]}}],
            "usage":{"prompt_tokens":9,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":0}}}"#;
        let fields = UsageFields::of_answer(body).unwrap();
        assert_eq!((fields.prompt_tokens, fields.completion_tokens), (9, 4));
        assert_eq!(UsageFields::of_answer(br#"{"choices":[]}"#), None);
        assert_eq!(UsageFields::of_answer(br#"{"usage":null}"#), None);
        assert_eq!(UsageFields::of_answer(br#"{"usage":{"prompt_tokens":"9"}}"#), None);
        assert_eq!(UsageFields::of_answer(b"not json"), None);
        let value: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(UsageFields::of_value(&value["usage"]), Some(fields));
    }

    #[test]
    fn a_streams_malformed_usage_reads_as_none_like_a_whole_answers() {
        for field in ["-5", "null", "\"9\"", "1.5"] {
            let usage: Value =
                serde_json::from_str(&format!(r#"{{"prompt_tokens":{field},"completion_tokens":4}}"#)).unwrap();
            assert_eq!(UsageFields::of_value(&usage), None, "{field}");
            let body = format!(r#"{{"usage":{usage}}}"#);
            assert_eq!(
                UsageFields::of_answer(body.as_bytes()),
                None,
                "{field}: the same answer whole"
            );
        }
        let details: Value = serde_json::from_str(r#"{"prompt_tokens":9,"prompt_tokens_details":null}"#).unwrap();
        assert_eq!(
            UsageFields::of_value(&details).unwrap().prompt_tokens,
            9,
            "absent details are allowed"
        );
    }
}
