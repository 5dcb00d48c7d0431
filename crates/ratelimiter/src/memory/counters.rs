//! Counters of the memory backend, for metrics and tests.

/// A snapshot of the memory backend's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryCounters {
    /// Overage units dropped because they did not fit and the limit has `overage: none`.
    pub overage_dropped_total: u64,
    /// Overage units recorded as debt (`overage: debt`).
    pub overage_debt_total: u64,
    /// Live leases evicted to respect `leases_max`; their completes were not reconciled.
    pub leases_evicted_total: u64,
    /// Settled (completed or evicted) lease ids forgotten before their retention
    /// ended to respect `settled_leases_max`; a retry of one would be reserved
    /// again. Zero exactly when none was; when one was, every id of the
    /// generation it went with counts, some of which may already have served
    /// their retention (see `settled_leases.rs`).
    pub settled_leases_evicted_total: u64,
    /// Denied lease ids forgotten early to respect `failed_leases_max`.
    pub failed_leases_evicted_total: u64,
    /// Leases allowed and not completed now.
    pub leases_live: u64,
    /// Settled lease ids remembered now, against `settled_leases_max`.
    pub settled_leases_remembered: u64,
    /// Denied lease ids remembered now.
    pub failed_leases_remembered: u64,
}
