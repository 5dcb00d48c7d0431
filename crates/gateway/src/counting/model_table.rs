//! The per-model numbers counting relies on, in one table with the source of
//! each (docs/gateway.md, "Counting"): how a model bills an image, its context
//! window (no prompt it accepts is longer, so it bounds every part whose size
//! the gateway cannot see) and its largest output (the output bound of a chat
//! or Responses call that names none).
//!
//! A model is found by the longest entry that starts its name, so dated
//! snapshots (`gpt-4o-mini-2024-07-18`) take their family's row. A model in no
//! row gets [`UNKNOWN`]: the largest figures of the table, never below a row's.

use crate::counting::images::ImageRule;

/// One row of the table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelRow {
    /// The start of the model names the row covers.
    pub prefix: &'static str,
    /// How the model bills an image.
    pub image: ImageRule,
    /// The longest prompt the model accepts, in tokens.
    pub context_window_tokens: u64,
    /// The most output tokens one call may generate.
    pub max_output_tokens: u64,
}

/// OpenAI's tile rule for the GPT-4o class: 85 base tokens and 170 per 512-px
/// tile (<https://platform.openai.com/docs/guides/images-vision>, "Calculating
/// costs": "GPT-4o, GPT-4.1, GPT-4.5: base 85, tile 170"; the example
/// "1024 x 1024 ... 765 tokens").
const TILES_4O: ImageRule = ImageRule::Tiles {
    base_tokens: 85,
    tile_tokens: 170,
};
/// gpt-4o-mini bills images at a multiple: "gpt-4o-mini: base 2833, tile 5667"
/// (same page, same table).
const TILES_4O_MINI: ImageRule = ImageRule::Tiles {
    base_tokens: 2_833,
    tile_tokens: 5_667,
};
/// o1 and o3: "o1, o1-pro, o3: base 75, tile 150" (same table).
const TILES_O_SERIES: ImageRule = ImageRule::Tiles {
    base_tokens: 75,
    tile_tokens: 150,
};
/// The patch rule: "Calculate how many 32px x 32px patches are needed to cover
/// the image ... If the number of patches exceeds 1536, we scale down the image
/// ... multiply image tokens by 1.62 for gpt-4.1-mini, 2.46 for gpt-4.1-nano,
/// 1.72 for o4-mini" (same page, "GPT-4.1-mini, GPT-4.1-nano, o4-mini"; the
/// same table lists gpt-5-mini at 1.62 and gpt-5-nano at 2.46). Multipliers are
/// kept in hundredths so the rule stays integer.
const fn patches(cap_patches: u64, multiplier_hundredths: u64) -> ImageRule {
    ImageRule::Patches {
        cap_patches,
        multiplier_hundredths,
    }
}
/// Claude models up to 4.6: "If your image's long edge is more than 1568 pixels,
/// or your image is more than ~1,600 tokens, it is first scaled down, preserving
/// aspect ratio"; "An image uses approximately width * height / 750 tokens";
/// "images are padded on the bottom and right corners to a multiple of 28
/// pixels" (<https://platform.claude.com/docs/en/vision>, "Evaluate image size").
const AREA_CLAUDE: ImageRule = ImageRule::Area {
    long_edge_px: 1_568,
    area_tokens_max: 1_600,
};
/// Claude Opus 4.7 reads images up to 2,576 px on the long edge, about 3.75
/// megapixels (Anthropic's launch notes of 2026-04-16, as measured in
/// <https://www.claudecodecamp.com/p/images-cost-3x-more-tokens-in-claude-opus-4-7>):
/// 3,750,000 / 750 = 5,000 tokens.
const AREA_OPUS_4_7: ImageRule = ImageRule::Area {
    long_edge_px: 2_576,
    area_tokens_max: 5_000,
};

/// The table. Context windows and output maxima are the providers' model
/// pages (<https://platform.openai.com/docs/models>,
/// <https://platform.claude.com/docs/en/about-claude/models/overview>); where
/// a model offers a larger window in beta (Claude's 1M context), the larger.
pub const TABLE: &[ModelRow] = &[
    row("gpt-4o-mini", TILES_4O_MINI, 128_000, 16_384),
    row("gpt-4o", TILES_4O, 128_000, 16_384),
    row("chatgpt-4o", TILES_4O, 128_000, 16_384),
    row("gpt-4-turbo", TILES_4O, 128_000, 4_096),
    row("gpt-4.5", TILES_4O, 128_000, 16_384),
    row("gpt-4.1-mini", patches(1_536, 162), 1_047_576, 32_768),
    row("gpt-4.1-nano", patches(1_536, 246), 1_047_576, 32_768),
    row("gpt-4.1", TILES_4O, 1_047_576, 32_768),
    row("o1", TILES_O_SERIES, 200_000, 100_000),
    row("o3", TILES_O_SERIES, 200_000, 100_000),
    row("o4-mini", patches(1_536, 172), 200_000, 100_000),
    row("gpt-5-mini", patches(1_536, 162), 400_000, 128_000),
    row("gpt-5-nano", patches(1_536, 246), 400_000, 128_000),
    // gpt-5 and its point releases: OpenAI's page gives them no figure of their
    // own; they are measured at 1.2 per 32-px patch with up to 2,500 patches
    // (<https://community.openai.com/t/introducing-gpt-5-4-mini-and-nano-our-most-capable-small-models-yet/1377015>).
    row("gpt-5", patches(2_500, 120), 400_000, 128_000),
    row("claude-opus-4-7", AREA_OPUS_4_7, 1_000_000, 128_000),
    row("claude-sonnet-4", AREA_CLAUDE, 1_000_000, 64_000),
    row("claude-opus-4", AREA_CLAUDE, 200_000, 64_000),
    row("claude-haiku-4", AREA_CLAUDE, 200_000, 64_000),
    row("claude", AREA_CLAUDE, 200_000, 64_000),
];

const fn row(prefix: &'static str, image: ImageRule, context_window_tokens: u64, max_output_tokens: u64) -> ModelRow {
    ModelRow {
        prefix,
        image,
        context_window_tokens,
        max_output_tokens,
    }
}

/// A model in no row: the most any row bills for an image of unknown size
/// (gpt-4o-mini's tiles), the largest context window and output of the table.
pub const UNKNOWN: ModelRow = row("", TILES_4O_MINI, 1_047_576, 128_000);

/// The row of `model`: the longest prefix that matches, else [`UNKNOWN`].
pub fn lookup(model: &str) -> &'static ModelRow {
    TABLE
        .iter()
        .filter(|row| model.starts_with(row.prefix))
        .max_by_key(|row| row.prefix.len())
        .unwrap_or(&UNKNOWN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_prefix_wins_and_unknown_models_get_the_largest_figures() {
        assert_eq!(lookup("gpt-4o-mini-2024-07-18").image, TILES_4O_MINI);
        assert_eq!(lookup("gpt-4o-2024-08-06").image, TILES_4O);
        assert_eq!(lookup("gpt-4.1-nano").image, patches(1_536, 246));
        assert_eq!(lookup("gpt-4.1").image, TILES_4O);
        assert_eq!(lookup("gpt-5.2").image, patches(2_500, 120));
        assert_eq!(lookup("claude-sonnet-4-5").context_window_tokens, 1_000_000);
        assert_eq!(lookup("claude-3-5-haiku").image, AREA_CLAUDE);
        assert_eq!(lookup("llama-3"), &UNKNOWN);
        for row in TABLE {
            assert!(
                row.context_window_tokens <= UNKNOWN.context_window_tokens,
                "{}",
                row.prefix
            );
            assert!(row.max_output_tokens <= UNKNOWN.max_output_tokens, "{}", row.prefix);
            assert!(row.image.max_tokens() <= UNKNOWN.image.max_tokens(), "{}", row.prefix);
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2_000))]

        /// Any size, on every row's rule: at most the rule's maximum, what a
        /// call reserves for an image whose size it cannot read.
        #[test]
        fn any_size_is_at_most_the_maximum(width in 1u32..200_000, height in 1u32..200_000, low: bool) {
            for row in TABLE {
                proptest::prop_assert!(row.image.tokens(Some((width, height)), low) <= row.image.max_tokens());
            }
        }
    }

    #[test]
    fn no_size_costs_more_than_the_rules_maximum() {
        let rules = TABLE.iter().map(|row| row.image);
        for rule in rules {
            let max = rule.max_tokens();
            for width in (1..9000).step_by(331) {
                for height in (1..9000).step_by(467) {
                    assert!(
                        rule.tokens(Some((width, height)), false) <= max,
                        "{rule:?} {width}x{height}"
                    );
                }
            }
        }
    }
}
