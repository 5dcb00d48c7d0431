//! One model's price per token kind, validated.

use serde::{Deserialize, Serialize};

use super::error::PriceError;

/// The highest price accepted for one million tokens of any kind, in USD: list prices
/// are at most a few hundred dollars per million tokens, so a price above this is a
/// typing mistake (digits added, a price per billion) that would quietly make every
/// call unaffordable, or a unit confusion worth a clear error.
pub const PRICE_USD_PER_MTOK_MAX: f64 = 10_000.0;
/// [`PRICE_USD_PER_MTOK_MAX`] in micro-dollars per million tokens.
const PRICE_MICRO_USD_PER_MTOK_MAX: u64 = 10_000_000_000;

/// Micro-dollars in a dollar: a price in USD per million tokens is kept in
/// micro-dollars per million tokens.
const MICRO_USD_PER_USD_F64: f64 = 1_000_000.0;

/// How far from a whole number of micro-dollars per million tokens a price converted
/// from decimal USD may be and still be that whole number: the error of `f64`
/// arithmetic on prices written with up to six decimals, far below one unit.
const CONVERSION_TOLERANCE: f64 = 1e-3;

/// A price as configuration writes it: USD per million tokens of each kind, e.g.
/// `{input: 2.50, output: 10.00, cache_read: 1.25, cache_write: 3.75}`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceFields {
    /// Prompt tokens read from neither cache nor written to one (text, images, files).
    pub input: f64,
    /// Output tokens, reasoning included.
    pub output: f64,
    /// Prompt tokens read from the provider's prompt cache. Absent: the input price
    /// (no discount assumed, so a cost is never undercounted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read: Option<f64>,
    /// Prompt tokens written to the prompt cache (Anthropic's 5-minute cache write).
    /// Absent: the input price (OpenAI and Gemini charge no write).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<f64>,
    /// Prompt tokens written to Anthropic's 1-hour cache, priced apart from the
    /// 5-minute write. Absent: the `cache_write` price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_1h: Option<f64>,
}

/// A validated price, in integer micro-dollars per million tokens of each kind, so
/// that costs are computed exactly ([`super::worst_case_micro_usd`]). Only valid
/// prices exist: every field finite, at least 0 and at most
/// [`PRICE_USD_PER_MTOK_MAX`]. All zero is a free model (self-hosted, a PTU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "PriceFields", into = "PriceFields")]
pub struct ModelPrice {
    input: u64,
    output: u64,
    cache_read: u64,
    cache_write: u64,
    cache_write_1h: u64,
}

impl ModelPrice {
    /// A price from micro-dollars per million tokens (a list price compiled in):
    /// `input`, `output`, `cache_read`, `cache_write`, `cache_write_1h`. Panics above
    /// [`PRICE_USD_PER_MTOK_MAX`], a programmer's error in a compiled table.
    pub const fn from_micro_usd_per_mtok(
        input: u64,
        output: u64,
        cache_read: u64,
        cache_write: u64,
        cache_write_1h: u64,
    ) -> Self {
        let max = PRICE_MICRO_USD_PER_MTOK_MAX;
        assert!(input <= max && output <= max && cache_read <= max);
        assert!(cache_write <= max && cache_write_1h <= max);
        Self {
            input,
            output,
            cache_read,
            cache_write,
            cache_write_1h,
        }
    }

    /// A free model: every token at $0.
    pub const FREE: ModelPrice = ModelPrice::from_micro_usd_per_mtok(0, 0, 0, 0, 0);

    /// Micro-dollars per million uncached input tokens.
    pub fn input_micro_usd_per_mtok(&self) -> u64 {
        self.input
    }
    /// Micro-dollars per million output tokens (reasoning included).
    pub fn output_micro_usd_per_mtok(&self) -> u64 {
        self.output
    }
    /// Micro-dollars per million tokens read from the prompt cache.
    pub fn cache_read_micro_usd_per_mtok(&self) -> u64 {
        self.cache_read
    }
    /// Micro-dollars per million tokens written to the (5-minute) prompt cache.
    pub fn cache_write_micro_usd_per_mtok(&self) -> u64 {
        self.cache_write
    }
    /// Micro-dollars per million tokens written to the 1-hour prompt cache.
    pub fn cache_write_1h_micro_usd_per_mtok(&self) -> u64 {
        self.cache_write_1h
    }
    /// The dearest price of a prompt token, whichever way the provider bills it:
    /// what the worst case charges every prompt token.
    pub fn prompt_max_micro_usd_per_mtok(&self) -> u64 {
        self.input
            .max(self.cache_read)
            .max(self.cache_write)
            .max(self.cache_write_1h)
    }
}

impl TryFrom<PriceFields> for ModelPrice {
    type Error = PriceError;

    fn try_from(f: PriceFields) -> Result<Self, PriceError> {
        let input = micro_usd_per_mtok("input", f.input)?;
        let cache_write = match f.cache_write {
            Some(usd) => micro_usd_per_mtok("cache_write", usd)?,
            None => input,
        };
        Ok(Self {
            input,
            output: micro_usd_per_mtok("output", f.output)?,
            cache_read: match f.cache_read {
                Some(usd) => micro_usd_per_mtok("cache_read", usd)?,
                None => input,
            },
            cache_write,
            cache_write_1h: match f.cache_write_1h {
                Some(usd) => micro_usd_per_mtok("cache_write_1h", usd)?,
                None => cache_write,
            },
        })
    }
}

impl From<ModelPrice> for PriceFields {
    fn from(p: ModelPrice) -> Self {
        let usd = |micro: u64| micro as f64 / MICRO_USD_PER_USD_F64;
        Self {
            input: usd(p.input),
            output: usd(p.output),
            cache_read: Some(usd(p.cache_read)),
            cache_write: Some(usd(p.cache_write)),
            cache_write_1h: Some(usd(p.cache_write_1h)),
        }
    }
}

/// `usd` per million tokens in micro-dollars per million tokens: refused when not
/// finite, negative or above [`PRICE_USD_PER_MTOK_MAX`]; a fraction of a unit is
/// rounded up, so a price is never lowered.
fn micro_usd_per_mtok(field: &'static str, usd: f64) -> Result<u64, PriceError> {
    let invalid = |reason: String| Err(PriceError::Invalid { field, reason });
    if !usd.is_finite() {
        return invalid(format!("must be a finite number of USD per million tokens, got {usd}"));
    }
    if usd < 0.0 {
        return invalid(format!("must be at least 0 USD per million tokens, got {usd}"));
    }
    if usd > PRICE_USD_PER_MTOK_MAX {
        return invalid(format!(
            "must be at most {PRICE_USD_PER_MTOK_MAX} USD per million tokens, got {usd}"
        ));
    }
    let scaled = usd * MICRO_USD_PER_USD_F64;
    let nearest = scaled.round();
    let micro = if (scaled - nearest).abs() <= CONVERSION_TOLERANCE {
        nearest
    } else {
        scaled.ceil()
    };
    // In range: at most PRICE_USD_PER_MTOK_MAX × 10^6 = 10^10.
    Ok(micro as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<ModelPrice, String> {
        serde_json::from_str::<ModelPrice>(json).map_err(|e| e.to_string())
    }

    #[test]
    fn prices_convert_to_whole_micro_dollars() {
        let p = parse(r#"{"input":2.50,"output":10.00,"cache_read":1.25,"cache_write":3.75}"#).unwrap();
        assert_eq!(p.input_micro_usd_per_mtok(), 2_500_000);
        assert_eq!(p.output_micro_usd_per_mtok(), 10_000_000);
        assert_eq!(p.cache_read_micro_usd_per_mtok(), 1_250_000);
        assert_eq!(p.cache_write_micro_usd_per_mtok(), 3_750_000);
        assert_eq!(
            p.cache_write_1h_micro_usd_per_mtok(),
            3_750_000,
            "absent: the 5-minute write"
        );
        for (usd, micro) in [
            (0.075, 75_000),
            (0.0375, 37_500),
            (0.1, 100_000),
            (0.3, 300_000),
            (1.6, 1_600_000),
        ] {
            let json = format!(r#"{{"input":{usd},"output":0}}"#);
            assert_eq!(parse(&json).unwrap().input_micro_usd_per_mtok(), micro, "{usd}");
        }
        let tiny = parse(r#"{"input":0.0000001,"output":0}"#).unwrap();
        assert_eq!(tiny.input_micro_usd_per_mtok(), 1, "a fraction of a unit rounds up");
    }

    #[test]
    fn absent_cache_prices_are_never_a_discount() {
        let p = parse(r#"{"input":3,"output":15}"#).unwrap();
        assert_eq!(p.cache_read_micro_usd_per_mtok(), 3_000_000);
        assert_eq!(p.cache_write_micro_usd_per_mtok(), 3_000_000);
        assert_eq!(p.cache_write_1h_micro_usd_per_mtok(), 3_000_000);
        let free = parse(r#"{"input":0,"output":0}"#).unwrap();
        assert_eq!(free, ModelPrice::FREE);
    }

    #[test]
    fn bad_prices_are_refused_naming_the_field() {
        for (json, field) in [
            (r#"{"input":-1,"output":1}"#, "price.input"),
            (r#"{"input":1,"output":-0.01}"#, "price.output"),
            (r#"{"input":1,"output":1,"cache_read":-1}"#, "price.cache_read"),
            (r#"{"input":1,"output":1,"cache_write":20000}"#, "price.cache_write"),
            (
                r#"{"input":1,"output":1,"cache_write_1h":1e300}"#,
                "price.cache_write_1h",
            ),
            (r#"{"input":10000.5,"output":1}"#, "price.input"),
        ] {
            let error = parse(json).unwrap_err();
            assert!(error.contains(field), "{json}: {error}");
        }
        for field in ["input", "output", "cache_read"] {
            let fields = PriceFields {
                input: 1.0,
                output: 1.0,
                cache_read: Some(1.0),
                cache_write: None,
                cache_write_1h: None,
            };
            let fields = match field {
                "input" => PriceFields {
                    input: f64::NAN,
                    ..fields
                },
                "output" => PriceFields {
                    output: f64::INFINITY,
                    ..fields
                },
                _ => PriceFields {
                    cache_read: Some(f64::NEG_INFINITY),
                    ..fields
                },
            };
            let error = ModelPrice::try_from(fields).unwrap_err();
            assert!(
                matches!(error, PriceError::Invalid { field: f, .. } if f == field),
                "{error}"
            );
        }
        assert!(parse(r#"{"input":1}"#).is_err(), "output is required");
        assert!(
            parse(r#"{"input":1,"output":1,"currency":"EUR"}"#).is_err(),
            "unknown field"
        );
        assert!(parse(r#"{"input":10000,"output":0}"#).is_ok(), "the maximum itself");
    }

    #[test]
    fn prices_round_trip_through_json() {
        let p = parse(r#"{"input":5,"output":25,"cache_read":0.5,"cache_write":6.25,"cache_write_1h":10}"#).unwrap();
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(parse(&json).unwrap(), p, "{json}");
        assert_eq!(p.prompt_max_micro_usd_per_mtok(), 10_000_000);
    }
}
