//! The chat call on the wire, as the simulator serves it and the replay's client
//! sends it: OpenAI's request and usage shapes, their bounds, and the header in
//! which the simulator says when it admitted a call.

use serde::{Deserialize, Serialize};

/// The largest `max_tokens` accepted, as a provider bounds its output.
pub const MAX_TOKENS_MAX: u64 = 131_072;
/// `max_tokens` when the request sets none.
pub const MAX_TOKENS_DEFAULT: u64 = 4_096;
/// The most messages in one request.
pub const MESSAGES_MAX: usize = 1_024;

/// One chat message.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

/// The request body. Unknown fields are ignored, as OpenAI clients send many.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChatRequest {
    /// The model asked for (echoed back).
    pub model: String,
    /// The conversation; its text is the prompt.
    pub messages: Vec<Message>,
    /// The output bound the client sends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// How many tokens the simulated model writes (capped by `max_tokens`); the
    /// trace's output length. Without it the model writes `max_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sim_output_tokens: Option<u64>,
}

/// Token usage, as OpenAI reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// The provider's count of the prompt.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub completion_tokens: u64,
    /// Their sum.
    pub total_tokens: u64,
}

/// The simulated provider's header giving the Unix ms at which it admitted
/// the call: where its window for the call starts (not an OpenAI header).
pub const ADMITTED_HEADER: &str = "x-sim-admitted-unix-ms";
