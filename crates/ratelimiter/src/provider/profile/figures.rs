//! The providers' documented figures a profile is built from, and the bounds
//! and margins a profile adds, each with its source or reason.

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
