//! Properties of the cost arithmetic (docs/prices.md, "Arithmetic"): rounding never
//! undercounts, never adds a whole micro-dollar, and the billed cost of any usage
//! within a call's bounds is at most the worst case reserved for it, so a budget
//! reconciled down at Complete never needs more than it reserved.

use proptest::prelude::*;
use ratelimiter::price::{billed_micro_usd, worst_case_micro_usd, CallBound, ModelPrice, Usage};

/// Prices up to $1,000 per million tokens, in micro-dollars per million tokens.
fn price_micro() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), 0..1_000_000_000u64]
}

fn price() -> impl Strategy<Value = ModelPrice> {
    (
        price_micro(),
        price_micro(),
        price_micro(),
        price_micro(),
        price_micro(),
    )
        .prop_map(|(i, o, r, w, w1)| ModelPrice::from_micro_usd_per_mtok(i, o, r, w, w1))
}

/// Token counts up to ten million per kind: far beyond any context window.
fn tokens() -> impl Strategy<Value = u64> {
    0..10_000_000u64
}

/// `Σ tokens × price`, exact, in micro-dollars × 10^6.
fn exact(terms: &[(u64, u64)]) -> u128 {
    terms.iter().map(|&(t, p)| u128::from(t) * u128::from(p)).sum()
}

proptest! {
    #[test]
    fn billing_rounds_up_by_less_than_a_micro_dollar(
        price in price(),
        (input, read, write, write_1h, output) in (tokens(), tokens(), tokens(), tokens(), tokens()),
    ) {
        let usage = Usage {
            input_tokens: input,
            cache_read_tokens: read,
            cache_write_tokens: write,
            cache_write_1h_tokens: write_1h,
            output_tokens: output,
        };
        let exact = exact(&[
            (input, price.input_micro_usd_per_mtok()),
            (read, price.cache_read_micro_usd_per_mtok()),
            (write, price.cache_write_micro_usd_per_mtok()),
            (write_1h, price.cache_write_1h_micro_usd_per_mtok()),
            (output, price.output_micro_usd_per_mtok()),
        ]);
        let billed = u128::from(billed_micro_usd(&price, &usage)) * 1_000_000;
        prop_assert!(billed >= exact, "never undercounts");
        prop_assert!(billed < exact + 1_000_000, "at most the last micro-dollar more");
    }

    #[test]
    fn the_worst_case_rounds_up_by_less_than_a_micro_dollar(
        price in price(),
        (prompt, output) in (tokens(), tokens()),
    ) {
        let bound = CallBound { prompt_tokens: prompt, output_tokens_max: output };
        let exact = exact(&[
            (prompt, price.prompt_max_micro_usd_per_mtok()),
            (output, price.output_micro_usd_per_mtok()),
        ]);
        let worst = u128::from(worst_case_micro_usd(&price, &bound)) * 1_000_000;
        prop_assert!(worst >= exact && worst < exact + 1_000_000);
    }

    #[test]
    fn the_billed_cost_of_usage_within_bounds_never_exceeds_the_worst_case(
        price in price(),
        (prompt, output_max) in (tokens(), tokens()),
        shares in (0..=100u64, 0..=100u64, 0..=100u64, 0..=100u64, 0..=100u64),
    ) {
        // Split at most `prompt` tokens over the four prompt kinds, and use at most
        // the output bound.
        let (a, b, c, d, o) = shares;
        let total = (a + b + c + d).max(100);
        let part = |share: u64| prompt * share / total;
        let usage = Usage {
            input_tokens: part(a),
            cache_read_tokens: part(b),
            cache_write_tokens: part(c),
            cache_write_1h_tokens: part(d),
            output_tokens: output_max * o / 100,
        };
        let bound = CallBound { prompt_tokens: prompt, output_tokens_max: output_max };
        prop_assert!(usage.is_within(&bound));
        prop_assert!(billed_micro_usd(&price, &usage) <= worst_case_micro_usd(&price, &bound));
    }
}
