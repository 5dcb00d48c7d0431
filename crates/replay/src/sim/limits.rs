//! The provider's terms as the simulator is given them: its limits and speed,
//! how it charges a call's tokens, and how it counts the tokens of a text. A
//! leaf: the profiles, the ledger and the wire formats all read it.

/// The provider's own token count: one token per 4 bytes of text, rounded up, as
/// English text averages under OpenAI's tokenizers.
pub const BYTES_PER_TOKEN: u64 = 4;
/// How the provider charges a request against its token limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Accounting {
    /// Charge the tokens really read and written (prompt + generated output).
    Actual,
    /// Charge as OpenAI documents: the estimated prompt tokens plus `max_tokens`,
    /// at admission, whatever the model then generates.
    Openai,
}

impl Accounting {
    /// The tokens charged for a call of `prompt_tokens` with a `max_tokens` bound that
    /// generates `output_tokens` (never more than `max_tokens`).
    pub fn charge(self, prompt_tokens: u64, max_tokens: u64, output_tokens: u64) -> u64 {
        assert!(output_tokens <= max_tokens, "the model never writes past max_tokens");
        match self {
            Accounting::Actual => prompt_tokens + output_tokens,
            Accounting::Openai => prompt_tokens + max_tokens,
        }
    }
}

/// The provider's limits and speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProviderLimits {
    /// Requests admitted per window.
    pub rpm: u64,
    /// Tokens charged per window.
    pub tpm: u64,
    /// The rolling window, in ms.
    pub window_ms: u64,
    /// Calls in flight at once.
    pub concurrency: u64,
    /// Time the model takes per output token, in ms.
    pub ms_per_output_token: u64,
    /// How tokens are charged.
    pub accounting: Accounting,
}

/// The provider's token count of `text`.
pub fn count_tokens(text: &str) -> u64 {
    u64::try_from(text.len())
        .expect("usize fits u64")
        .div_ceil(BYTES_PER_TOKEN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_counted_four_bytes_to_a_token() {
        assert_eq!(count_tokens(""), 0);
        assert_eq!(count_tokens("abc"), 1);
        assert_eq!(count_tokens("abcd"), 1);
        assert_eq!(count_tokens("abcde"), 2);
        assert_eq!(Accounting::Actual.charge(100, 50, 20), 120);
        assert_eq!(Accounting::Openai.charge(100, 50, 20), 150);
    }
}
