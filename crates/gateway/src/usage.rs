//! Usage as the provider reports it, from a whole answer or from a stream's own
//! events (docs/gateway.md, "Reconciling").

use serde_json::Value;

/// Tokens a call used, as the provider counted them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Tokens that count on the input limit: OpenAI's prompt tokens; Anthropic's
    /// input tokens plus cache-creation tokens.
    pub input_tokens: u64,
    /// Tokens that count on the output limit.
    pub output_tokens: u64,
    /// Anthropic's cache reads, reported for logs and metrics only: Anthropic does
    /// not count them on the input limit of current models.
    pub cache_read_tokens: u64,
}

impl Usage {
    /// Input and output together: what a combined tpm limit and a daily budget count.
    pub fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
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

/// A number field of `value`, 0 when absent or not a number.
pub(crate) fn number(value: &Value, field: &str) -> u64 {
    value.get(field).and_then(Value::as_u64).unwrap_or(0)
}
