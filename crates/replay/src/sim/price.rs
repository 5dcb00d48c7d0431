//! What a model's tokens cost, in the form providers publish and the gateway's
//! configuration takes: US dollars per million tokens of input, cached input read,
//! cache writes and output. Held as integer micro-dollars per million tokens so
//! that the simulator's bill is an exact integer sum (in pico-dollars: a token at
//! `p` micro-dollars per million costs `p` pico-dollars), written apart from the
//! gateway's pricing so that each checks the other.

use serde::Serialize;

/// The highest price accepted, in USD per million tokens: above every list price
/// (the dearest, OpenAI's o1-pro output, is $600), low enough that a call's cost
/// cannot overflow.
pub const PRICE_USD_PER_MILLION_MAX: u64 = 10_000;
/// Decimal places a price may have: a micro-dollar per million tokens.
pub const PRICE_DECIMALS_MAX: usize = 6;
/// Micro-dollars in a dollar.
const MICROS_PER_USD: u64 = 1_000_000;

/// One model's prices, in micro-USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Price {
    /// Uncached prompt tokens (images included, as the providers count them).
    pub input_micro_usd_per_million: u64,
    /// Output tokens, reasoning included (both providers bill reasoning as output).
    pub output_micro_usd_per_million: u64,
    /// Prompt tokens read from the cache.
    pub cache_read_micro_usd_per_million: u64,
    /// Prompt tokens written to the cache (Anthropic's `cache_creation_input_tokens`).
    pub cache_write_micro_usd_per_million: u64,
}

/// The tokens of one call, split as the providers bill them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BilledUsage {
    /// Uncached prompt tokens.
    pub input_tokens: u64,
    /// Prompt tokens read from the cache.
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the cache.
    pub cache_write_tokens: u64,
    /// Output tokens, reasoning included.
    pub output_tokens: u64,
}

impl BilledUsage {
    /// OpenAI's usage: `prompt_tokens` include the `cached_tokens` billed at the
    /// cached-input price; `completion_tokens` include the reasoning tokens, billed
    /// as output (<https://platform.openai.com/docs/pricing>, "Cached input";
    /// <https://platform.openai.com/docs/guides/reasoning>, "reasoning tokens are
    /// ... billed as output tokens"). OpenAI bills no cache writes.
    pub fn openai(prompt_tokens: u64, cached_tokens: u64, completion_tokens: u64) -> Self {
        assert!(cached_tokens <= prompt_tokens, "cached tokens are part of the prompt");
        Self {
            input_tokens: prompt_tokens - cached_tokens,
            cache_read_tokens: cached_tokens,
            cache_write_tokens: 0,
            output_tokens: completion_tokens,
        }
    }

    /// Anthropic's usage: `input_tokens` exclude the cache's, which are billed apart,
    /// writes at 1.25x the input price and reads at 0.1x in Anthropic's table
    /// (<https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching>,
    /// "Pricing"; the prices themselves come from the configuration).
    pub fn anthropic(input_tokens: u64, cache_write_tokens: u64, cache_read_tokens: u64, output_tokens: u64) -> Self {
        Self {
            input_tokens,
            cache_read_tokens,
            cache_write_tokens,
            output_tokens,
        }
    }
}

impl Price {
    /// A call's cost in pico-USD: exact, no rounding.
    pub fn cost_pico_usd(&self, usage: &BilledUsage) -> u128 {
        let part = |tokens: u64, price: u64| u128::from(tokens) * u128::from(price);
        part(usage.input_tokens, self.input_micro_usd_per_million)
            + part(usage.output_tokens, self.output_micro_usd_per_million)
            + part(usage.cache_read_tokens, self.cache_read_micro_usd_per_million)
            + part(usage.cache_write_tokens, self.cache_write_micro_usd_per_million)
    }

    /// Parses `input:2.50,output:10,cache_read:1.25,cache_write:3.75` (USD per
    /// million tokens; `input` and `output` required, the cache prices default to
    /// the input price: a model without a cache discount bills them as input).
    pub fn parse(text: &str) -> Result<Price, String> {
        let (mut input, mut output, mut cache_read, mut cache_write) = (None, None, None, None);
        for part in text.split(',') {
            let (name, value) =
                (part.split_once(':')).ok_or_else(|| format!("{part:?}: expected name:usd_per_million"))?;
            let micros = parse_usd_per_million(value.trim()).map_err(|e| format!("{}: {e}", name.trim()))?;
            let slot = match name.trim() {
                "input" => &mut input,
                "output" => &mut output,
                "cache_read" => &mut cache_read,
                "cache_write" => &mut cache_write,
                other => return Err(format!("{other}: not a price (input, output, cache_read, cache_write)")),
            };
            if slot.replace(micros).is_some() {
                return Err(format!("{}: given twice", name.trim()));
            }
        }
        let input = input.ok_or("input: required")?;
        Ok(Price {
            input_micro_usd_per_million: input,
            output_micro_usd_per_million: output.ok_or("output: required")?,
            cache_read_micro_usd_per_million: cache_read.unwrap_or(input),
            cache_write_micro_usd_per_million: cache_write.unwrap_or(input),
        })
    }
}

/// `2.50` -> 2,500,000 micro-USD per million: a non-negative decimal of at most
/// [`PRICE_DECIMALS_MAX`] places, at most [`PRICE_USD_PER_MILLION_MAX`].
fn parse_usd_per_million(text: &str) -> Result<u64, String> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || !digits(fraction) || fraction.len() > PRICE_DECIMALS_MAX {
        return Err(format!(
            "{text:?} is not a non-negative decimal of at most {PRICE_DECIMALS_MAX} places"
        ));
    }
    let whole: u64 = whole.parse().map_err(|_| format!("{text:?} is too large"))?;
    if whole > PRICE_USD_PER_MILLION_MAX {
        return Err(format!(
            "{text} is above {PRICE_USD_PER_MILLION_MAX} USD per million tokens"
        ));
    }
    let padded = format!("{fraction:0<width$}", width = PRICE_DECIMALS_MAX);
    let fraction: u64 = padded.parse().expect("six digits");
    let micros = whole * MICROS_PER_USD + fraction;
    if micros > PRICE_USD_PER_MILLION_MAX * MICROS_PER_USD {
        return Err(format!(
            "{text} is above {PRICE_USD_PER_MILLION_MAX} USD per million tokens"
        ));
    }
    Ok(micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_parse_exactly_and_bad_ones_are_refused_naming_the_field() {
        let price = Price::parse("input:2.50,output:10,cache_read:1.25,cache_write:3.75").unwrap();
        assert_eq!(price.input_micro_usd_per_million, 2_500_000);
        assert_eq!(price.output_micro_usd_per_million, 10_000_000);
        assert_eq!(price.cache_read_micro_usd_per_million, 1_250_000);
        assert_eq!(price.cache_write_micro_usd_per_million, 3_750_000);
        let plain = Price::parse("input:0.15,output:0.6").unwrap();
        assert_eq!(plain.cache_read_micro_usd_per_million, 150_000);
        assert_eq!(plain.cache_write_micro_usd_per_million, 150_000);
        assert_eq!(
            Price::parse("input:0.000001,output:0")
                .unwrap()
                .input_micro_usd_per_million,
            1
        );
        for (bad, field) in [
            ("input:-1,output:1", "input"),
            ("input:1,output:NaN", "output"),
            ("input:1,output:1e3", "output"),
            ("input:1,output:10001", "output"),
            ("input:1,output:1.0000001", "output"),
            ("input:1", "output"),
            ("input:1,output:1,cache_read:.5", "cache_read"),
            ("input:1,output:1,currency:1", "currency"),
            ("input:1,input:2,output:1", "input"),
        ] {
            let error = Price::parse(bad).unwrap_err();
            assert!(error.starts_with(field), "{bad}: {error}");
        }
    }

    #[test]
    fn a_call_costs_each_kind_of_token_at_its_own_price() {
        let price = Price::parse("input:3,output:15,cache_read:0.30,cache_write:3.75").unwrap();
        // Anthropic: 1,000 input, 2,000 written, 4,000 read, 500 output.
        let usage = BilledUsage::anthropic(1_000, 2_000, 4_000, 500);
        let expected = 1_000 * 3_000_000 + 2_000 * 3_750_000 + 4_000 * 300_000 + 500 * 15_000_000;
        assert_eq!(price.cost_pico_usd(&usage), expected);
        // OpenAI: 1,000 prompt tokens of which 400 cached, 300 completion.
        let usage = BilledUsage::openai(1_000, 400, 300);
        assert_eq!(usage.input_tokens, 600);
        assert_eq!(
            price.cost_pico_usd(&usage),
            600 * 3_000_000 + 400 * 300_000 + 300 * 15_000_000
        );
    }
}
