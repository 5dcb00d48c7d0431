//! How a limit replenishes and what happens to usage above a reservation.

use serde::{Deserialize, Serialize};

/// How a limit replenishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    /// Each reservation holds its amount for `window_seconds`, then expires
    /// (requests or tokens per minute, daily budgets).
    Rolling,
    /// Each reservation holds its amount until Complete, or `timeout_seconds`
    /// as a safety net when the caller crashed (calls in flight).
    Concurrency,
    /// A token bucket of `capacity` units refilled at `capacity` per
    /// `window_seconds`: a reservation takes its units at once and they come
    /// back by refill, as Anthropic enforces its limits (docs/bucket-limits.md).
    Bucket,
}

impl std::fmt::Display for LimitKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LimitKind::Rolling => "rolling",
            LimitKind::Concurrency => "concurrency",
            LimitKind::Bucket => "bucket",
        })
    }
}

/// What Complete does when the actual usage exceeds what was reserved and the
/// difference no longer fits in the window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overage {
    /// Drop the difference (it is counted in a metric).
    #[default]
    None,
    /// Record the difference as debt on the limit, reported by the admin API.
    Debt,
    /// Record it as debt, and refuse every reservation on the limit while it
    /// owes: until the window (or calendar period) in which the unheld usage
    /// happened ends. For budgets, in money or tokens: a bill that could not be
    /// bounded beforehand passes a budget once, never call after call
    /// (docs/decisions.md, "Complete").
    Owe,
}

impl Overage {
    /// Whether usage that could not be held refuses the limit's next
    /// reservations until the window or period it happened in ends.
    pub fn refuses_while_owing(self) -> bool {
        self == Overage::Owe
    }

    /// Whether usage that could not be held is recorded as debt.
    pub fn records_debt(self) -> bool {
        matches!(self, Overage::Debt | Overage::Owe)
    }
}
