//! The compiled list of providers' list prices (docs/prices.md, "List prices"): used
//! for a model whose configuration gives no price. Each row names the provider's
//! pricing page it was read from and the day it was read. A model whose price could
//! not be read from its provider's own page is left out rather than guessed: its
//! configuration must give a price, or budgets refuse it ([`super::resolve_price`]).
//!
//! Prices are the standard (pay-as-you-go, non-batch) rates for prompts within the
//! model's standard context window; a deployment billed otherwise (batch, a
//! long-context tier, a negotiated rate, a PTU) gives its own price.

use super::model_price::ModelPrice;

/// One model's list price and where it comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListPrice {
    /// The provider, as the gateway names it (`anthropic`).
    pub provider: &'static str,
    /// The model name the provider's API takes (its undated alias; a dated
    /// snapshot such as `claude-sonnet-4-5-20250929` resolves to it).
    pub model: &'static str,
    /// The price.
    pub price: ModelPrice,
    /// The provider's pricing page the price was read from.
    pub source_url: &'static str,
    /// The day it was read, `YYYY-MM-DD`.
    pub read_on: &'static str,
}

/// Anthropic's pricing page: the "Model pricing" table gives base input, 5-minute
/// and 1-hour cache writes, cache hits and output per model.
const ANTHROPIC_PRICING_URL: &str = "https://platform.claude.com/docs/en/about-claude/pricing";
/// The day the Anthropic rows were read.
const ANTHROPIC_READ_ON: &str = "2026-11-28";

/// Micro-dollars per million tokens in a dollar per million tokens.
const USD: u64 = 1_000_000;

/// An Anthropic row: input, 5-minute cache write, 1-hour cache write, cache hit,
/// output, in micro-dollars per million tokens (the page's column order).
const fn anthropic(model: &'static str, input: u64, write_5m: u64, write_1h: u64, hit: u64, output: u64) -> ListPrice {
    ListPrice {
        provider: "anthropic",
        model,
        price: ModelPrice::from_micro_usd_per_mtok(input, output, hit, write_5m, write_1h),
        source_url: ANTHROPIC_PRICING_URL,
        read_on: ANTHROPIC_READ_ON,
    }
}

/// Opus 4.5 and later: $5 input, $6.25 and $10 cache writes, $0.50 hits, $25 output.
const fn opus_4_5(model: &'static str) -> ListPrice {
    anthropic(model, 5 * USD, 6_250_000, 10 * USD, 500_000, 25 * USD)
}
/// Opus 4 and 4.1: $15 input, $18.75 and $30 cache writes, $1.50 hits, $75 output.
const fn opus_4(model: &'static str) -> ListPrice {
    anthropic(model, 15 * USD, 18_750_000, 30 * USD, 1_500_000, 75 * USD)
}
/// Sonnet 4 to 4.6: $3 input, $3.75 and $6 cache writes, $0.30 hits, $15 output.
const fn sonnet_4(model: &'static str) -> ListPrice {
    anthropic(model, 3 * USD, 3_750_000, 6 * USD, 300_000, 15 * USD)
}

/// Every list price compiled in. OpenAI's and Google's pricing pages could not be
/// read when the list was compiled, so their models are not in it (docs/prices.md).
pub const LIST_PRICES: &[ListPrice] = &[
    opus_4_5("claude-opus-4-6"),
    opus_4_5("claude-opus-4-5"),
    opus_4("claude-opus-4-1"),
    opus_4("claude-opus-4-0"),
    opus_4("claude-opus-4"),
    sonnet_4("claude-sonnet-4-6"),
    sonnet_4("claude-sonnet-4-5"),
    sonnet_4("claude-sonnet-4-0"),
    sonnet_4("claude-sonnet-4"),
    anthropic("claude-haiku-4-5", USD, 1_250_000, 2 * USD, 100_000, 5 * USD),
    anthropic("claude-3-5-haiku", 800_000, USD, 1_600_000, 80_000, 4 * USD),
    anthropic("claude-3-haiku", 250_000, 300_000, 500_000, 30_000, 1_250_000),
];

/// The list price of `model` at `provider`: the row of that name, or of the name
/// without a dated snapshot suffix (`-20250929`) or `-latest`.
pub fn list_price(provider: &str, model: &str) -> Option<&'static ListPrice> {
    let find = |name: &str| (LIST_PRICES.iter()).find(|row| row.provider == provider && row.model == name);
    find(model)
        .or_else(|| undated(model).and_then(find))
        .or_else(|| model.strip_suffix("-latest").and_then(find))
}

/// `model` without a trailing `-YYYYMMDD`, when it has one.
fn undated(model: &str) -> Option<&str> {
    let (alias, date) = model.rsplit_once('-')?;
    (date.len() == 8 && date.bytes().all(|b| b.is_ascii_digit())).then_some(alias)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dated_snapshots_and_aliases_resolve_to_their_row() {
        let sonnet = list_price("anthropic", "claude-sonnet-4-5-20250929").expect("a dated snapshot");
        assert_eq!(sonnet.model, "claude-sonnet-4-5");
        assert_eq!(sonnet.price.output_micro_usd_per_mtok(), 15 * USD);
        assert_eq!(
            list_price("anthropic", "claude-3-5-haiku-latest").unwrap().model,
            "claude-3-5-haiku"
        );
        assert_eq!(
            list_price("anthropic", "claude-opus-4-20250514").unwrap().model,
            "claude-opus-4"
        );
        assert!(list_price("anthropic", "claude-sonnet-9").is_none());
        assert!(
            list_price("openai", "claude-sonnet-4-5").is_none(),
            "the provider matters"
        );
        assert!(
            list_price("anthropic", "claude-sonnet-4-5-2025").is_none(),
            "not a date"
        );
    }

    #[test]
    fn every_row_is_sourced_unique_and_plausible() {
        for (i, row) in LIST_PRICES.iter().enumerate() {
            assert!(row.source_url.starts_with("https://"), "{}", row.model);
            assert_eq!(row.read_on.len(), 10, "{}", row.model);
            let p = row.price;
            assert!(p.input_micro_usd_per_mtok() > 0 && p.output_micro_usd_per_mtok() > p.input_micro_usd_per_mtok());
            // Anthropic's multipliers: hits 0.1×, 5-minute writes 1.25×, 1-hour 2× input,
            // except Haiku 3's, whose page row reads $0.30, $0.50 and $0.03.
            if row.model != "claude-3-haiku" {
                assert_eq!(
                    p.cache_read_micro_usd_per_mtok() * 10,
                    p.input_micro_usd_per_mtok(),
                    "{}",
                    row.model
                );
                assert_eq!(
                    p.cache_write_micro_usd_per_mtok() * 4,
                    p.input_micro_usd_per_mtok() * 5,
                    "{}",
                    row.model
                );
                assert_eq!(
                    p.cache_write_1h_micro_usd_per_mtok(),
                    2 * p.input_micro_usd_per_mtok(),
                    "{}",
                    row.model
                );
            }
            let duplicate = LIST_PRICES[..i]
                .iter()
                .any(|r| (r.provider, r.model) == (row.provider, row.model));
            assert!(!duplicate, "{}", row.model);
        }
    }
}
