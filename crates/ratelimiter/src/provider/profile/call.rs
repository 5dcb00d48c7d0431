//! One call as a profile sizes it, and what the provider reported it used.

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
