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

mod call;
mod definitions;
mod error;
mod figures;
mod provider;
mod published;
mod rules;
#[cfg(test)]
mod tests;

pub use call::{ProfileCall, ProviderUsage};
pub use definitions::{llm_profile, llm_profile_keyed};
pub use error::ProfileError;
pub use figures::{
    AZURE_QUANTUM_SECONDS, AZURE_RPM_PER_1000_TPM, BEDROCK_OUTPUT_BURNDOWN, CONCURRENCY_TIMEOUT_SECONDS, DAY_SECONDS,
    LARGEST_REQUEST_TOKENS_DEFAULT, MINUTE_SECONDS, OPENAI_CHARACTERS_PER_TOKEN, OPENAI_QUANTUM_SECONDS,
    SUB_WINDOWS_SECONDS, SUB_WINDOW_MARGIN_PER_MILLE,
};
pub use provider::Provider;
pub use published::Published;
pub use rules::{LlmProfile, ProfileRules};
