//! Counters of the memory backend, for metrics and tests.

use crate::base::metrics::{Metric, MetricValue};

/// A snapshot of the memory backend's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryCounters {
    /// Overage units dropped because they did not fit and the limit has `overage: none`.
    pub overage_dropped_total: u64,
    /// Overage units recorded as debt (`overage: debt`).
    pub overage_debt_total: u64,
    /// Live leases dropped to make room in the table: leases whose holds had
    /// all ended (a late Complete of one records no overage), and leases a
    /// restore into a smaller `leases_max` had no room for.
    pub leases_evicted_total: u64,
    /// Reserves refused because the lease table had no room for them: the
    /// owner held its share, or every lease was still in force.
    pub leases_refused_total: u64,
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

impl MemoryCounters {
    /// The counters as backend-neutral metrics, named `memory_*`.
    pub fn metrics(&self) -> Vec<Metric> {
        let counter = MetricValue::Counter;
        let gauge = MetricValue::Gauge;
        vec![
            Metric {
                name: "memory_overage_dropped_units_total",
                help: "Units used above reservations and dropped (overage: none).",
                value: counter(self.overage_dropped_total),
            },
            Metric {
                name: "memory_overage_debt_units_total",
                help: "Units used above reservations and recorded as debt (overage: debt).",
                value: counter(self.overage_debt_total),
            },
            Metric {
                name: "memory_leases_evicted_total",
                help: "Live leases dropped to make room in the lease table: their holds had ended, or a restore \
                       into a smaller memory.leases_max had no room for them.",
                value: counter(self.leases_evicted_total),
            },
            Metric {
                name: "memory_leases_refused_total",
                help: "Reserves refused with too_many_leases: the owner held its share of memory.leases_max, \
                       or every lease was still in force.",
                value: counter(self.leases_refused_total),
            },
            Metric {
                name: "memory_settled_leases_evicted_total",
                help: "Settled (completed or evicted) lease ids forgotten before their retention to respect \
                       memory.settled_leases_max; a retry of one is reserved anew.",
                value: counter(self.settled_leases_evicted_total),
            },
            Metric {
                name: "memory_failed_leases_evicted_total",
                help: "Denied lease ids forgotten early to respect memory.failed_leases_max.",
                value: counter(self.failed_leases_evicted_total),
            },
            Metric {
                name: "memory_leases_live",
                help: "Leases allowed and not completed.",
                value: gauge(self.leases_live),
            },
            Metric {
                name: "memory_settled_leases_remembered",
                help: "Settled lease ids remembered for idempotent retries.",
                value: gauge(self.settled_leases_remembered),
            },
            Metric {
                name: "memory_failed_leases_remembered",
                help: "Denied lease ids remembered.",
                value: gauge(self.failed_leases_remembered),
            },
        ]
    }
}
