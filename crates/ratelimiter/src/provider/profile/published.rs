//! The limits a provider publishes for a model, as configuration gives them.

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
    /// (default [`LARGEST_REQUEST_TOKENS_DEFAULT`](super::LARGEST_REQUEST_TOKENS_DEFAULT)).
    #[serde(default)]
    pub largest_request_tokens: Option<u64>,
    /// OpenAI, Azure: the period the provider quantizes requests to, in seconds,
    /// when known to differ from its documented example.
    #[serde(default)]
    pub quantum_seconds: Option<u64>,
}
