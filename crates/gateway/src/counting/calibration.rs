//! A calibrated count for models without a public tokenizer (docs/gateway.md,
//! "Calibration"): the byte bound, scaled by what the provider's own usage
//! reports say it counts.
//!
//! Every call whose prompt is all text (no image, file or stored context, whose
//! counts are not bytes) gives one sample when the provider reports its usage:
//! the provider's count of the whole prompt divided by the gateway's byte count
//! of it. The factor applied is an upper quantile of the last samples plus a
//! margin, so a prompt that packs more tokens per byte than most is still
//! covered; until enough samples are seen it is 1, the byte bound, which is
//! never below the provider's count. The factor is kept per model and per
//! server: every server of a fleet learns the same provider's counting from its
//! own calls, with nothing to share on the cluster.
//!
//! The calibrator takes its samples as arguments and reads no clock: tests feed
//! it the reports they choose.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Samples kept per model: enough for the upper quantile to mean something,
/// few enough to follow a change of the traffic's language within minutes.
pub const SAMPLES_KEPT: usize = 512;
/// Samples before the factor leaves the byte bound.
pub const SAMPLES_MIN: usize = 32;
/// The quantile of the kept samples the factor starts from.
pub const QUANTILE_PERMILLE: usize = 990;
/// The margin added to the quantile, in percent: room for prompts that pack
/// more tokens per byte than every recent one.
pub const MARGIN_PERCENT: u64 = 10;
/// The smallest count a sample is taken from: tiny prompts are mostly the
/// format's overhead and say little about the text.
pub const SAMPLE_BYTES_MIN: u64 = 64;
/// The factor's bounds, in millionths: never below 1/20 of the byte bound (a
/// token is never 20 bytes of text in any published tokenizer's average), and
/// up to twice it, should a provider count more than the bytes (its own system
/// text), which the samples then show.
pub const FACTOR_MIN_MILLIONTHS: u64 = 50_000;
/// See [`FACTOR_MIN_MILLIONTHS`].
pub const FACTOR_MAX_MILLIONTHS: u64 = 2_000_000;
/// The factor of the byte bound itself.
pub const FACTOR_ONE_MILLIONTHS: u64 = 1_000_000;
/// Samples between two recomputations of the factor: a sort of
/// [`SAMPLES_KEPT`] numbers per call would be wasted work.
const RECOMPUTE_EVERY: usize = 8;

/// One model's calibration.
#[derive(Debug)]
pub struct Calibrator {
    /// The factor in millionths, read by every call without a lock.
    factor_millionths: AtomicU64,
    samples: Mutex<Samples>,
}

#[derive(Debug, Default)]
struct Samples {
    /// Ratios in millionths; a ring once full.
    ratios: Vec<u64>,
    next: usize,
    seen: usize,
}

impl Default for Calibrator {
    fn default() -> Self {
        Self {
            factor_millionths: AtomicU64::new(FACTOR_ONE_MILLIONTHS),
            samples: Mutex::new(Samples::default()),
        }
    }
}

impl Calibrator {
    /// The calibrated count of `byte_count` tokens counted by bytes: never 0
    /// for a non-empty count.
    pub fn apply(&self, byte_count: u64) -> u64 {
        let factor = self.factor_millionths.load(Ordering::Relaxed);
        let scaled = u128::from(byte_count) * u128::from(factor);
        u64::try_from(scaled.div_ceil(u128::from(FACTOR_ONE_MILLIONTHS))).unwrap_or(u64::MAX)
    }

    /// The factor in millionths (1,000,000: the byte bound).
    pub fn factor_millionths(&self) -> u64 {
        self.factor_millionths.load(Ordering::Relaxed)
    }

    /// Records one call: the gateway's byte count of an all-text prompt and the
    /// provider's reported count of it (input, cache writes and cache reads).
    pub fn observe(&self, byte_count: u64, provider_count: u64) {
        if byte_count < SAMPLE_BYTES_MIN {
            return;
        }
        let ratio = u128::from(provider_count) * u128::from(FACTOR_ONE_MILLIONTHS) / u128::from(byte_count);
        let ratio = u64::try_from(ratio).unwrap_or(u64::MAX);
        let mut samples = self.samples.lock().expect("no panics under the lock");
        if samples.ratios.len() < SAMPLES_KEPT {
            samples.ratios.push(ratio);
        } else {
            let next = samples.next;
            samples.ratios[next] = ratio;
        }
        samples.next = (samples.next + 1) % SAMPLES_KEPT;
        samples.seen = samples.seen.saturating_add(1);
        // A sample above the factor in use raises it at once; otherwise the
        // factor is recomputed every few samples.
        let above = ratio > self.factor_millionths.load(Ordering::Relaxed);
        if samples.ratios.len() >= SAMPLES_MIN && (above || samples.seen % RECOMPUTE_EVERY == 0) {
            self.factor_millionths
                .store(factor_of(&samples.ratios), Ordering::Relaxed);
        }
    }
}

/// The factor of `ratios`: their upper quantile plus the margin, within bounds.
fn factor_of(ratios: &[u64]) -> u64 {
    let mut sorted = ratios.to_vec();
    sorted.sort_unstable();
    let index = (sorted.len() * QUANTILE_PERMILLE).div_ceil(1000).saturating_sub(1);
    let quantile = sorted[index.min(sorted.len() - 1)];
    let with_margin = quantile.saturating_mul(100 + MARGIN_PERCENT).div_ceil(100);
    with_margin.clamp(FACTOR_MIN_MILLIONTHS, FACTOR_MAX_MILLIONTHS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_bound_holds_until_enough_calls_are_seen() {
        let calibrator = Calibrator::default();
        for _ in 0..SAMPLES_MIN - 1 {
            calibrator.observe(4_000, 1_000);
        }
        assert_eq!(calibrator.apply(4_000), 4_000, "still the byte bound");
        calibrator.observe(4_000, 1_000);
        // A quarter of the bytes, plus the margin.
        assert_eq!(calibrator.factor_millionths(), 275_000);
        assert_eq!(calibrator.apply(4_000), 1_100);
        assert_eq!(calibrator.apply(1), 1, "never 0");
    }

    #[test]
    fn the_upper_quantile_covers_the_densest_recent_prompts() {
        let calibrator = Calibrator::default();
        // 1 in 50 prompts packs a token in 2 bytes, the rest in 4: the 99th
        // percentile is the dense ones'.
        for i in 0..400 {
            let provider = if i % 50 == 0 { 2_000 } else { 1_000 };
            calibrator.observe(4_000, provider);
        }
        assert_eq!(calibrator.factor_millionths(), 550_000);
        // Then the traffic changes to sparse prompts only: the dense samples age out.
        for _ in 0..SAMPLES_KEPT {
            calibrator.observe(4_000, 800);
        }
        assert_eq!(calibrator.factor_millionths(), 220_000);
    }

    #[test]
    fn a_report_above_the_factor_raises_it_at_once_and_bounds_hold() {
        let calibrator = Calibrator::default();
        for _ in 0..SAMPLES_MIN {
            calibrator.observe(4_000, 1_000);
        }
        calibrator.observe(4_000, 3_000);
        assert_eq!(
            calibrator.factor_millionths(),
            825_000,
            "the new sample is the quantile"
        );
        for _ in 0..SAMPLES_KEPT {
            calibrator.observe(1_000, 100_000);
        }
        assert_eq!(calibrator.factor_millionths(), FACTOR_MAX_MILLIONTHS);
        calibrator.observe(10, 1_000_000);
        assert_eq!(
            calibrator.factor_millionths(),
            FACTOR_MAX_MILLIONTHS,
            "tiny prompts are no sample"
        );
        let low = Calibrator::default();
        for _ in 0..SAMPLES_MIN {
            low.observe(1_000_000, 1);
        }
        assert_eq!(low.factor_millionths(), FACTOR_MIN_MILLIONTHS);
    }
}
