//! The memory backend's configuration.

use serde::{Deserialize, Serialize};

use crate::model::definition::{check_window_margin_ms, WINDOW_MARGIN_MS_DEFAULT};
use crate::model::retry::{RetryPolicy, RETRY_MS_MAX};

/// How long a caller denied with `limit_decreasing` waits (docs/retry-hints.md, "Decrease
/// hints"): decreases are applied by a periodic task, so a long wait is right.
pub const DECREASE_RETRY_MS_DEFAULT: u64 = 10_000;
/// Live leases kept for reconciliation: far more calls than providers let one
/// deployment have in flight. An outstanding four-requirement lease costs about
/// 230–320 bytes (BENCHMARKS.md), so about 32 MiB when full.
pub const LEASES_MAX_DEFAULT: usize = 100_000;
/// The share of `leases_max` one owner (a client token, a gateway tenant) may
/// hold, in percent: four owners at their whole share fill the table, so one
/// client flooding reserves leaves three quarters to the others.
pub const LEASE_SHARE_PERCENT_DEFAULT: u8 = 25;
/// Settled (completed or evicted) leases remembered for idempotent retries.
/// Each is remembered for its retention (longest window or timeout plus 60 s)
/// unless half this many later leases settle first: at 1,000 completes/s that
/// is 500 s, so up to that rate deployments whose windows and timeouts are at
/// most 440 s never forget a settled lease early. About 53 bytes each
/// (BENCHMARKS.md), so 53 MB, allocated up front and resident only as leases
/// settle into it.
pub const SETTLED_LEASES_MAX_DEFAULT: usize = 1_000_000;
/// The largest `settled_leases_max`: 1.8 GB at about 53 bytes each. A digit too
/// many is refused rather than reserving tens of GB.
pub const SETTLED_LEASES_MAX_LIMIT: usize = 1 << 25;
/// Denied lease ids remembered so a retry with one stays denied: about 85 bytes
/// each, so about 42 MiB when full. Past it the oldest are forgotten (and counted).
pub const FAILED_LEASES_MAX_DEFAULT: usize = 500_000;

/// Configuration of a [`super::MemoryBackend`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryConfig {
    /// Hints for denied reservations (docs/retry-hints.md); rolling hints are exact here,
    /// so only the rolling jitter is used from `rolling`.
    pub retry_policy: RetryPolicy,
    /// The hint for `limit_decreasing` denials, in ms (1..=3,600,000).
    pub decrease_retry_ms: u64,
    /// The most live leases kept. A lease is never pushed out while one of its
    /// holds is in force: when the table is full, a lease whose holds all
    /// ended goes (counted), else the reserve is refused with
    /// [`crate::LimiterError::TooManyLeases`].
    pub leases_max: usize,
    /// The share of `leases_max` one owner ([`crate::LeaseOwner`]) may hold,
    /// in percent (1..=100): beyond it its reserves are refused with
    /// [`crate::LimiterError::TooManyLeases`]. Leases without an owner are
    /// bounded by the whole table only.
    pub lease_share_percent: u8,
    /// The most settled (completed or evicted) leases remembered, so a retry of
    /// their reserve is answered allowed at the original time and reserves
    /// nothing (2..=[`SETTLED_LEASES_MAX_LIMIT`]). Each is kept at least as long
    /// as the longest window or timeout plus a margin, unless half this many
    /// later leases settle first (then it is counted as evicted). About 53
    /// bytes each, allocated up front.
    pub settled_leases_max: usize,
    /// The most denied lease ids remembered. Each is kept at least as long as
    /// the longest window or timeout, unless this bound forces it out first.
    pub failed_leases_max: usize,
    /// How long, in ms, rolling reservations of definitions that give no
    /// `window_margin_ms` are held beyond their window, so they outlast the
    /// provider's window, which starts when the call reaches it (0..=
    /// [`crate::WINDOW_MARGIN_MS_MAX`]).
    pub window_margin_ms: u64,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            retry_policy: RetryPolicy::default(),
            decrease_retry_ms: DECREASE_RETRY_MS_DEFAULT,
            leases_max: LEASES_MAX_DEFAULT,
            lease_share_percent: LEASE_SHARE_PERCENT_DEFAULT,
            settled_leases_max: SETTLED_LEASES_MAX_DEFAULT,
            failed_leases_max: FAILED_LEASES_MAX_DEFAULT,
            window_margin_ms: WINDOW_MARGIN_MS_DEFAULT,
        }
    }
}

impl MemoryConfig {
    /// The most live leases one owner may hold: its share of `leases_max`,
    /// at least 1.
    pub fn owner_leases_max(&self) -> usize {
        (self.leases_max.saturating_mul(usize::from(self.lease_share_percent)) / 100).max(1)
    }

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
        if !(1..=100).contains(&self.lease_share_percent) {
            return Err(format!(
                "lease_share_percent must be 1..=100, got {}",
                self.lease_share_percent
            ));
        }
        if !(2..=SETTLED_LEASES_MAX_LIMIT).contains(&self.settled_leases_max) {
            return Err(format!(
                "settled_leases_max must be 2..={SETTLED_LEASES_MAX_LIMIT}, got {}",
                self.settled_leases_max
            ));
        }
        if self.failed_leases_max == 0 {
            return Err("failed_leases_max must be at least 1".to_owned());
        }
        check_window_margin_ms(self.window_margin_ms, 0)
    }
}
