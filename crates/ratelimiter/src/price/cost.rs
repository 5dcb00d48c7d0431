//! The cost of a call in integer micro-dollars, in one place: the worst case a
//! budget reserves before the call, and the billed cost of the usage the provider
//! reports, which Complete reconciles to. Both round up: a budget in micro-dollars
//! is never charged less than the exact cost.

use super::model_price::ModelPrice;

/// Micro-dollars in a dollar: a budget of $20 is a limit of capacity 20,000,000.
pub const MICRO_USD_PER_USD: u64 = 1_000_000;

/// Tokens in the million that prices are given per.
const TOKENS_PER_MTOK: u128 = 1_000_000;

/// The most a call can use, as the caller bounds it before sending it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CallBound {
    /// Every prompt token the call sends: text, images and files, counted as the
    /// gateway counts them for the token limits, whether the provider then reads
    /// them from its cache, writes them to it, or neither.
    pub prompt_tokens: u64,
    /// The output bound sent to the provider (`max_tokens`), reasoning included:
    /// providers count thinking within it.
    pub output_tokens_max: u64,
}

/// What a provider reports a call used, split by how it bills each token. The
/// prompt parts do not overlap: a token is uncached input, a cache read, or a
/// cache write, once (OpenAI's `prompt_tokens` includes its `cached_tokens`:
/// the caller subtracts them; Anthropic reports the three apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Prompt tokens neither read from nor written to the prompt cache.
    pub input_tokens: u64,
    /// Prompt tokens read from the prompt cache.
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the prompt cache (Anthropic's 5-minute write).
    pub cache_write_tokens: u64,
    /// Prompt tokens written to Anthropic's 1-hour cache.
    pub cache_write_1h_tokens: u64,
    /// Output tokens, reasoning included (Gemini reports its thoughts apart from
    /// its candidates: the caller adds them).
    pub output_tokens: u64,
}

impl Usage {
    /// Every prompt token of the usage, however billed (saturating).
    pub fn prompt_tokens(&self) -> u64 {
        (self.input_tokens)
            .saturating_add(self.cache_read_tokens)
            .saturating_add(self.cache_write_tokens)
            .saturating_add(self.cache_write_1h_tokens)
    }

    /// True when the usage stays within `bound`: then its billed cost is at most
    /// the bound's worst case.
    pub fn is_within(&self, bound: &CallBound) -> bool {
        self.prompt_tokens() <= bound.prompt_tokens && self.output_tokens <= bound.output_tokens_max
    }
}

/// The most `bound` can cost at `price`, in micro-dollars rounded up: every prompt
/// token at the dearest way the provider may bill it (the higher of the input and
/// cache-write prices, cache reads included for a price that makes them dearer),
/// plus the output bound at the output price. What a budget reserves before the
/// call is sent. Saturates at `u64::MAX`, which no budget grants.
pub fn worst_case_micro_usd(price: &ModelPrice, bound: &CallBound) -> u64 {
    micro_usd_rounded_up([
        (bound.prompt_tokens, price.prompt_max_micro_usd_per_mtok()),
        (bound.output_tokens_max, price.output_micro_usd_per_mtok()),
    ])
}

/// What the provider bills for `usage` at `price`, in micro-dollars rounded up:
/// uncached input at the input price, cache reads at the cache-read price, cache
/// writes at their own (5-minute or 1-hour), output (reasoning included) at the
/// output price. What Complete reconciles a budget's reservation to.
pub fn billed_micro_usd(price: &ModelPrice, usage: &Usage) -> u64 {
    micro_usd_rounded_up([
        (usage.input_tokens, price.input_micro_usd_per_mtok()),
        (usage.cache_read_tokens, price.cache_read_micro_usd_per_mtok()),
        (usage.cache_write_tokens, price.cache_write_micro_usd_per_mtok()),
        (usage.cache_write_1h_tokens, price.cache_write_1h_micro_usd_per_mtok()),
        (usage.output_tokens, price.output_micro_usd_per_mtok()),
    ])
}

/// The sum of `tokens × micro-dollars per million tokens` over `terms`, divided by a
/// million once and rounded up: exact up to the last micro-dollar, never below.
fn micro_usd_rounded_up<const N: usize>(terms: [(u64, u64); N]) -> u64 {
    let scaled = (terms.iter()).fold(0u128, |sum, &(tokens, micro_usd_per_mtok)| {
        sum.saturating_add(u128::from(tokens) * u128::from(micro_usd_per_mtok))
    });
    u64::try_from(scaled.div_ceil(TOKENS_PER_MTOK)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Claude Sonnet 4.5's list price: $3 input, $3.75 and $6 cache writes, $0.30
    /// cache reads, $15 output.
    const SONNET: ModelPrice =
        ModelPrice::from_micro_usd_per_mtok(3_000_000, 15_000_000, 300_000, 3_750_000, 6_000_000);
    /// gpt-4o's price as an operator would write it: $2.50, $1.25 cached, $10 output.
    const GPT_4O: ModelPrice =
        ModelPrice::from_micro_usd_per_mtok(2_500_000, 10_000_000, 1_250_000, 2_500_000, 2_500_000);

    #[test]
    fn the_worst_case_bills_every_prompt_token_at_its_dearest() {
        let bound = CallBound {
            prompt_tokens: 10_000,
            output_tokens_max: 1_000,
        };
        // Anthropic: the 1-hour write ($6) is the dearest: 10,000 × 6 + 1,000 × 15 = $0.075.
        assert_eq!(worst_case_micro_usd(&SONNET, &bound), 75_000);
        // OpenAI: no write price, so the input price: 10,000 × 2.5 + 1,000 × 10 = $0.035.
        assert_eq!(worst_case_micro_usd(&GPT_4O, &bound), 35_000);
        assert_eq!(worst_case_micro_usd(&ModelPrice::FREE, &bound), 0, "free is $0");
    }

    #[test]
    fn billing_follows_each_provider_format() {
        // OpenAI: prompt_tokens 10,000 of which cached_tokens 8,000; completion 900
        // with 600 of reasoning inside it: 2,000 × 2.5 + 8,000 × 1.25 + 900 × 10.
        let openai = Usage {
            input_tokens: 2_000,
            cache_read_tokens: 8_000,
            output_tokens: 900,
            ..Usage::default()
        };
        assert_eq!(billed_micro_usd(&GPT_4O, &openai), 5_000 + 10_000 + 9_000);
        // Anthropic: input 100, cache read 6,000, 5-minute write 2,000, 1-hour write
        // 1,000, output 500 (thinking inside it).
        let anthropic = Usage {
            input_tokens: 100,
            cache_read_tokens: 6_000,
            cache_write_tokens: 2_000,
            cache_write_1h_tokens: 1_000,
            output_tokens: 500,
        };
        assert_eq!(
            billed_micro_usd(&SONNET, &anthropic),
            300 + 1_800 + 7_500 + 6_000 + 7_500
        );
        // An image's tokens are prompt tokens: billed as input like text.
        let image = Usage {
            input_tokens: 1_600,
            output_tokens: 10,
            ..Usage::default()
        };
        assert_eq!(billed_micro_usd(&GPT_4O, &image), 4_000 + 100);
    }

    #[test]
    fn costs_round_up_once() {
        // One token of gpt-4o input costs $0.0000025: 2.5 micro-dollars, billed 3.
        let one = Usage {
            input_tokens: 1,
            ..Usage::default()
        };
        assert_eq!(billed_micro_usd(&GPT_4O, &one), 3);
        // Two such tokens are exactly 5, not 3 + 3: the sum is rounded, not each part.
        let two = Usage {
            input_tokens: 1,
            cache_write_tokens: 1,
            ..Usage::default()
        };
        assert_eq!(billed_micro_usd(&GPT_4O, &two), 5);
        let bound = CallBound {
            prompt_tokens: 1,
            output_tokens_max: 0,
        };
        assert_eq!(worst_case_micro_usd(&GPT_4O, &bound), 3);
    }

    #[test]
    fn huge_counts_saturate_instead_of_wrapping() {
        let bound = CallBound {
            prompt_tokens: u64::MAX,
            output_tokens_max: u64::MAX,
        };
        assert_eq!(worst_case_micro_usd(&SONNET, &bound), u64::MAX);
        assert_eq!(worst_case_micro_usd(&ModelPrice::FREE, &bound), 0);
    }
}
