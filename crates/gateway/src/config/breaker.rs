//! `breaker:` of a pooled model (docs/gateway.md, "Pools"): when a failing
//! deployment is left out, and for how long.

use serde::Deserialize;

/// Failures in a row that open the breaker by default: Envoy's outlier detection
/// ejects a host after 5 consecutive 5xx by default (`consecutive_5xx`).
pub const FAILURES_DEFAULT: u32 = 5;
/// How long an open breaker keeps its deployment out by default: Envoy's
/// `base_ejection_time` default, 30 s.
pub const OPEN_MS_DEFAULT: u64 = 30_000;
/// The most failures that may be configured before opening.
pub const FAILURES_LIMIT: u32 = 1_000;
/// The longest a breaker may stay open: ten minutes, the longest pause a
/// provider 429 makes.
pub const OPEN_MS_LIMIT: u64 = 600_000;

/// `breaker:` of a pooled model.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BreakerConfig {
    /// Failures in a row that open the breaker.
    #[serde(default = "failures_default")]
    pub failures: u32,
    /// How long it stays open before a probe is let through.
    #[serde(default = "open_ms_default")]
    pub open_ms: u64,
}

fn failures_default() -> u32 {
    FAILURES_DEFAULT
}

fn open_ms_default() -> u64 {
    OPEN_MS_DEFAULT
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failures: FAILURES_DEFAULT,
            open_ms: OPEN_MS_DEFAULT,
        }
    }
}

impl BreakerConfig {
    /// The range check, with the field named.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if !(1..=FAILURES_LIMIT).contains(&self.failures) {
            return Err(("failures", format!("must be 1..={FAILURES_LIMIT}")));
        }
        if !(1..=OPEN_MS_LIMIT).contains(&self.open_ms) {
            return Err(("open_ms", format!("must be 1..={OPEN_MS_LIMIT}")));
        }
        Ok(())
    }
}
