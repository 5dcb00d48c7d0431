//! The compiled list of providers' list prices (docs/prices.md, "List prices"): used
//! for a model whose configuration gives no price. Each row names the provider's
//! pricing page it comes from and the day it was read (from the page itself, or from
//! copies of it that agree, as each provider's constant says). A model whose price
//! could not be verified so is left out rather than guessed: its configuration must
//! give a price, or budgets refuse it ([`super::resolve_price`]).
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

/// OpenAI's pricing page: the "Standard" tier's text-token table gives input,
/// cached input and output per model. OpenAI charges nothing apart for writing
/// to its prompt cache, so a cache write is billed as input.
///
/// This page could not be read from here: the rows were read from the copy of it
/// shipped in LiteLLM 1.110.2 (PyPI, `model_prices_and_context_window_backup.json`,
/// each row's `source` naming this page), read on the day below, and kept only
/// where a second copy agrees: tokencost 0.1.26 (PyPI, `model_prices.json`) for the
/// GPT-4o, GPT-4.1, GPT-5 and o-series rows; for GPT-5.4 and GPT-5.5, the
/// `adk-model` crate's table (docs.rs) and a June 2026 summary of the page
/// (morphllm.com/openai-api-pricing). Rows with a single copy (GPT-5.1, GPT-5.2,
/// later models) are left out.
const OPENAI_PRICING_URL: &str = "https://developers.openai.com/api/docs/pricing";
/// The day the OpenAI rows were read from the copies above.
const OPENAI_READ_ON: &str = "2026-11-28";

/// Google's Gemini API pricing page: the "Standard" tier's input and output price
/// per model, for text, image and video prompts (audio prompts are dearer and
/// need a price of their own).
///
/// Read, as OpenAI's, from LiteLLM 1.110.2's copy and checked against
/// tokencost 0.1.26's, on the day below. The two copies agree on input and output
/// but not on the context-cache read ($0.03 and $0.075 per million tokens for
/// Gemini 2.5 Flash), so the rows give no cache-read price: a cache read is billed
/// at the input price, which can only overcount. Models whose price rises with
/// the prompt's length (Gemini 2.5 Pro and the Pro models after it) are left
/// out: a price cannot express a tier (docs/prices.md).
const GEMINI_PRICING_URL: &str = "https://ai.google.dev/gemini-api/docs/pricing";
/// The day the Gemini rows were read from the copies above.
const GEMINI_READ_ON: &str = "2026-11-28";

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

/// An OpenAI row: input, cached input, output, in micro-dollars per million
/// tokens (the page's column order). Cache writes are billed as input.
const fn openai(model: &'static str, input: u64, cached: u64, output: u64) -> ListPrice {
    ListPrice {
        provider: "openai",
        model,
        price: ModelPrice::from_micro_usd_per_mtok(input, output, cached, input, input),
        source_url: OPENAI_PRICING_URL,
        read_on: OPENAI_READ_ON,
    }
}

/// An OpenAI row without a cached-input price (the page gives none: the "pro"
/// models): a cache read, if any, is billed as input.
const fn openai_uncached(model: &'static str, input: u64, output: u64) -> ListPrice {
    openai(model, input, input, output)
}

/// A Gemini row: input and output, in micro-dollars per million tokens; cache
/// reads and writes at the input price (see [`GEMINI_PRICING_URL`]).
const fn gemini(model: &'static str, input: u64, output: u64) -> ListPrice {
    ListPrice {
        provider: "gemini",
        model,
        price: ModelPrice::from_micro_usd_per_mtok(input, output, input, input, input),
        source_url: GEMINI_PRICING_URL,
        read_on: GEMINI_READ_ON,
    }
}

/// Every list price compiled in (docs/prices.md, "List prices").
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
    openai("gpt-5.5", 5 * USD, 500_000, 30 * USD),
    openai_uncached("gpt-5.5-pro", 30 * USD, 180 * USD),
    openai("gpt-5.4", 2_500_000, 250_000, 15 * USD),
    openai("gpt-5.4-mini", 750_000, 75_000, 4_500_000),
    openai("gpt-5.4-nano", 200_000, 20_000, 1_250_000),
    openai_uncached("gpt-5.4-pro", 30 * USD, 180 * USD),
    openai("gpt-5", 1_250_000, 125_000, 10 * USD),
    openai("gpt-5-mini", 250_000, 25_000, 2 * USD),
    openai("gpt-5-nano", 50_000, 5_000, 400_000),
    openai("gpt-4.1", 2 * USD, 500_000, 8 * USD),
    openai("gpt-4.1-mini", 400_000, 100_000, 1_600_000),
    openai("gpt-4.1-nano", 100_000, 25_000, 400_000),
    openai("gpt-4o", 2_500_000, 1_250_000, 10 * USD),
    openai("gpt-4o-mini", 150_000, 75_000, 600_000),
    openai("o1", 15 * USD, 7_500_000, 60 * USD),
    openai("o3", 2 * USD, 500_000, 8 * USD),
    openai_uncached("o3-pro", 20 * USD, 80 * USD),
    openai("o3-mini", 1_100_000, 550_000, 4_400_000),
    openai("o4-mini", 1_100_000, 275_000, 4_400_000),
    gemini("gemini-2.5-flash", 300_000, 2_500_000),
    gemini("gemini-2.5-flash-lite", 100_000, 400_000),
];

/// The list price of `model` at `provider`: the row of that name, or of the name
/// without a dated snapshot suffix (`-20250929`) or `-latest`. OpenAI's dated
/// snapshots (`gpt-4o-2024-05-13`) do not resolve to their alias: some were priced
/// otherwise (that one at $5 and $15, twice `gpt-4o`'s), so such a name needs a
/// price of its own.
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
            if row.provider == "anthropic" && row.model != "claude-3-haiku" {
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

    #[test]
    fn openai_and_gemini_rows_are_sane() {
        let rows = || LIST_PRICES.iter().filter(|r| r.provider != "anthropic");
        assert_eq!(rows().filter(|r| r.provider == "openai").count(), 19);
        assert_eq!(rows().filter(|r| r.provider == "gemini").count(), 2);
        for row in rows() {
            let p = row.price;
            let (input, output) = (p.input_micro_usd_per_mtok(), p.output_micro_usd_per_mtok());
            let (read, write) = (p.cache_read_micro_usd_per_mtok(), p.cache_write_micro_usd_per_mtok());
            assert!(input > 0 && output >= input, "{}: output at least input", row.model);
            assert!(read <= input, "{}: a cache read is never dearer than input", row.model);
            // Neither provider charges a cache write apart: it is billed as input.
            assert_eq!(write, input, "{}", row.model);
            assert_eq!(p.cache_write_1h_micro_usd_per_mtok(), input, "{}", row.model);
            assert_eq!(p.prompt_max_micro_usd_per_mtok(), input, "{}", row.model);
            match row.provider {
                "openai" if row.model.ends_with("-pro") => assert_eq!(read, input, "{}: no cached price", row.model),
                "openai" => assert!(read < input, "{}: a cached price below input", row.model),
                "gemini" => assert_eq!(read, input, "{}: the cache read is unverified", row.model),
                other => panic!("unexpected provider {other}"),
            }
            assert!(row.source_url.starts_with("https://"), "{}", row.model);
            assert_eq!(row.read_on, "2026-11-28", "{}", row.model);
        }
    }

    #[test]
    fn openai_and_gemini_models_resolve_by_name_only() {
        let gpt_4o = list_price("openai", "gpt-4o").expect("listed");
        assert_eq!(gpt_4o.price.input_micro_usd_per_mtok(), 2_500_000);
        assert_eq!(gpt_4o.price.cache_read_micro_usd_per_mtok(), 1_250_000);
        assert_eq!(gpt_4o.price.output_micro_usd_per_mtok(), 10 * USD);
        assert_eq!(
            list_price("openai", "gpt-5-mini")
                .unwrap()
                .price
                .output_micro_usd_per_mtok(),
            2 * USD
        );
        // A dated OpenAI snapshot may be priced otherwise (gpt-4o-2024-05-13 was $5/$15).
        assert!(list_price("openai", "gpt-4o-2024-05-13").is_none());
        assert!(list_price("openai", "gpt-4o-2024-08-06").is_none());
        assert!(list_price("anthropic", "gpt-4o").is_none(), "the provider matters");
        let flash = list_price("gemini", "gemini-2.5-flash").expect("listed");
        assert_eq!(flash.price.input_micro_usd_per_mtok(), 300_000);
        assert_eq!(flash.price.output_micro_usd_per_mtok(), 2_500_000);
        assert!(
            list_price("gemini", "gemini-2.5-pro").is_none(),
            "tiered by prompt length: left out"
        );
    }
}
