//! The memory backend's configuration.

use serde::{Deserialize, Serialize};

use crate::retry::{RetryPolicy, RETRY_MS_MAX};

/// How long a caller denied with `limit_decreasing` waits (`decisions.md` §3):
/// decreases are applied by a periodic task, so a long wait is right.
pub const DECREASE_RETRY_MS_DEFAULT: u64 = 10_000;
/// Live leases kept for reconciliation: far more calls than providers let one
/// deployment have in flight. An outstanding four-requirement lease costs about
/// 230–320 bytes (BENCHMARKS.md), so about 32 MiB when full, plus up to 5 MiB
/// for the settled-lease cache of as many slots.
pub const LEASES_MAX_DEFAULT: usize = 100_000;
/// Denied lease ids remembered so a retry with one stays denied: about 85 bytes
/// each, so about 42 MiB when full. Past it the oldest are forgotten (and counted).
pub const FAILED_LEASES_MAX_DEFAULT: usize = 500_000;

/// Configuration of a [`super::MemoryBackend`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryConfig {
    /// Hints for denied reservations (ADR 0010); rolling hints are exact here,
    /// so only the rolling jitter is used from `rolling`.
    pub retry_policy: RetryPolicy,
    /// The hint for `limit_decreasing` denials, in ms (1..=3,600,000).
    pub decrease_retry_ms: u64,
    /// The most live leases kept. When full the oldest goes: its holds then end
    /// by their window or timeout, unreconciled. Also the number of slots (at
    /// most 2 Mi) of the cache of completed lease ids remembered for idempotent
    /// retries.
    pub leases_max: usize,
    /// The most denied lease ids remembered. Each is kept at least as long as
    /// the longest window or timeout, unless this bound forces it out first.
    pub failed_leases_max: usize,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            retry_policy: RetryPolicy::default(),
            decrease_retry_ms: DECREASE_RETRY_MS_DEFAULT,
            leases_max: LEASES_MAX_DEFAULT,
            failed_leases_max: FAILED_LEASES_MAX_DEFAULT,
        }
    }
}

impl MemoryConfig {
    /// Checks the ranges; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=RETRY_MS_MAX).contains(&self.decrease_retry_ms) {
            return Err(format!(
                "decrease_retry_ms must be 1..={RETRY_MS_MAX}, got {}",
                self.decrease_retry_ms
            ));
        }
        if self.leases_max == 0 {
            return Err("leases_max must be at least 1".to_owned());
        }
        if self.failed_leases_max == 0 {
            return Err("failed_leases_max must be at least 1".to_owned());
        }
        Ok(())
    }
}
