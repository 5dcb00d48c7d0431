//! Prometheus metrics: reserve outcomes per key and reason, reserve and complete
//! latency histograms, requests in flight, shed and timed-out requests.
//!
//! Counters are atomics so the hot path never takes a write lock once a key has
//! been seen. The per-key map only ever holds keys the backend recognised (defined
//! limits), and is bounded all the same.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use ratelimiter::memory::{MemoryBackend, MemoryCounters};
use ratelimiter::{Denial, LimitKey, ReserveOutcome, ReserveRequest};

/// The most keys with their own counters. Past it, outcomes are counted under the
/// key `_other`, so a registry that grows without bound cannot grow memory here.
pub const METRIC_KEYS_MAX: usize = 100_000;
/// Latency bucket bounds, in microseconds: 50 µs to 5 s, covering a memory-backend
/// hit and a TigerBeetle round trip under load alike.
const BUCKET_BOUNDS_MICROS: [u64; 16] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000,
    5_000_000,
];
/// The label value under which keys past [`METRIC_KEYS_MAX`] are counted.
const OTHER_KEY: &str = "_other";

/// Outcome counters of one key.
#[derive(Debug, Default)]
struct KeyCounters {
    allowed: AtomicU64,
    insufficient_capacity: AtomicU64,
    exceeds_capacity: AtomicU64,
    limit_decreasing: AtomicU64,
}

/// A latency histogram with fixed buckets.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKET_BOUNDS_MICROS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, elapsed: Duration) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        if let Some(i) = BUCKET_BOUNDS_MICROS.iter().position(|bound| micros <= *bound) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// Appends the histogram's Prometheus text; `labels` (possibly empty) are
    /// written inside braces, before the bucket's `le`.
    pub fn render(&self, out: &mut String, name: &str, labels: &str) {
        let (bucket_labels, own_labels) = if labels.is_empty() {
            (String::new(), String::new())
        } else {
            (format!("{labels},"), format!("{{{labels}}}"))
        };
        let mut cumulative = 0;
        for (bound, bucket) in BUCKET_BOUNDS_MICROS.iter().zip(&self.buckets) {
            cumulative += bucket.load(Ordering::Relaxed);
            let seconds = *bound as f64 / 1e6;
            let _ = writeln!(out, "{name}_bucket{{{bucket_labels}le=\"{seconds}\"}} {cumulative}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{bucket_labels}le=\"+Inf\"}} {count}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum{own_labels} {sum}");
        let _ = writeln!(out, "{name}_count{own_labels} {count}");
    }
}

/// Every metric the server exports.
#[derive(Debug, Default)]
pub struct Metrics {
    per_key: RwLock<HashMap<LimitKey, Arc<KeyCounters>>>,
    other: Arc<KeyCounters>,
    lease_already_failed: AtomicU64,
    unknown_limit_key: AtomicU64,
    /// Reserve handling time, from the body read to the answer.
    pub reserve_latency: Histogram,
    /// Complete handling time.
    pub complete_latency: Histogram,
    in_flight: AtomicI64,
    shed: AtomicU64,
    timeouts: AtomicU64,
}

impl Metrics {
    /// Counts a reserve's outcome: every key on allow, the failing key on denial.
    pub fn record_outcome(&self, request: &ReserveRequest, outcome: &ReserveOutcome) {
        match outcome {
            ReserveOutcome::Allowed { .. } => {
                for requirement in request.requirements() {
                    self.with_key(&requirement.key, |c| c.allowed.fetch_add(1, Ordering::Relaxed));
                }
            }
            ReserveOutcome::Denied(Denial::InsufficientCapacity { key, .. }) => {
                self.with_key(key, |c| c.insufficient_capacity.fetch_add(1, Ordering::Relaxed))
            }
            ReserveOutcome::Denied(Denial::ExceedsCapacity { key }) => {
                self.with_key(key, |c| c.exceeds_capacity.fetch_add(1, Ordering::Relaxed))
            }
            ReserveOutcome::Denied(Denial::LimitDecreasing { key, .. }) => {
                self.with_key(key, |c| c.limit_decreasing.fetch_add(1, Ordering::Relaxed))
            }
            ReserveOutcome::Denied(Denial::LeaseAlreadyFailed) => {
                self.lease_already_failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Counts a reserve that named an undefined key. The key itself is not a
    /// label: callers choose it, so it would let them grow the metrics at will.
    pub fn record_unknown_key(&self) {
        self.unknown_limit_key.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request shed because too many were in flight.
    pub fn record_shed(&self) {
        self.shed.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request that ran past the request timeout.
    pub fn record_timeout(&self) {
        self.timeouts.fetch_add(1, Ordering::Relaxed);
    }

    /// Marks a request as in flight until the guard drops.
    pub fn in_flight(self: &Arc<Self>) -> InFlightGuard {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlightGuard(self.clone())
    }

    fn with_key(&self, key: &LimitKey, count: impl FnOnce(&KeyCounters) -> u64) {
        if let Some(counters) = self.per_key.read().expect("metrics lock").get(key) {
            count(counters);
            return;
        }
        let mut map = self.per_key.write().expect("metrics lock");
        if map.len() >= METRIC_KEYS_MAX && !map.contains_key(key) {
            count(&self.other);
            return;
        }
        count(map.entry(key.clone()).or_default());
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        out.push_str("# HELP ratelimiterd_reserve_outcomes_total Reserve outcomes per limit key: allowed counts every key of the lease, a denial the key that denied.\n");
        out.push_str("# TYPE ratelimiterd_reserve_outcomes_total counter\n");
        let map = self.per_key.read().expect("metrics lock");
        let mut keys: Vec<&LimitKey> = map.keys().collect();
        keys.sort();
        for key in keys {
            render_key(&mut out, key.as_str(), &map[key]);
        }
        drop(map);
        render_key(&mut out, OTHER_KEY, &self.other);
        for (reason, counter) in [
            ("lease_already_failed", &self.lease_already_failed),
            ("unknown_limit_key", &self.unknown_limit_key),
        ] {
            let value = counter.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "ratelimiterd_reserve_outcomes_total{{key=\"\",outcome=\"{reason}\"}} {value}"
            );
        }
        out.push_str("# HELP ratelimiterd_request_duration_seconds Time to handle reserve and complete requests.\n");
        out.push_str("# TYPE ratelimiterd_request_duration_seconds histogram\n");
        self.reserve_latency.render(
            &mut out,
            "ratelimiterd_request_duration_seconds",
            "endpoint=\"reserve\"",
        );
        self.complete_latency.render(
            &mut out,
            "ratelimiterd_request_duration_seconds",
            "endpoint=\"complete\"",
        );
        let gauges = [
            (
                "ratelimiterd_requests_in_flight",
                "gauge",
                "Requests being handled now.",
                self.in_flight.load(Ordering::Relaxed),
            ),
            (
                "ratelimiterd_requests_shed_total",
                "counter",
                "Requests answered 503 overloaded because too many were in flight.",
                self.shed.load(Ordering::Relaxed) as i64,
            ),
            (
                "ratelimiterd_request_timeouts_total",
                "counter",
                "Requests answered 503 because they ran past the request timeout.",
                self.timeouts.load(Ordering::Relaxed) as i64,
            ),
        ];
        for (name, kind, help, value) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
        }
        out
    }
}

impl BackendMetrics for MemoryBackend {
    fn render_metrics(&self, out: &mut String) {
        render_memory(out, &self.counters());
    }
}

/// Appends the memory backend's counters.
fn render_memory(out: &mut String, counters: &MemoryCounters) {
    let lines: [(&str, &str, &str, u64); 8] = [
        (
            "ratelimiterd_memory_overage_dropped_units_total",
            "counter",
            "Units used above reservations and dropped (overage: none).",
            counters.overage_dropped_total,
        ),
        (
            "ratelimiterd_memory_overage_debt_units_total",
            "counter",
            "Units used above reservations and recorded as debt (overage: debt).",
            counters.overage_debt_total,
        ),
        (
            "ratelimiterd_memory_leases_evicted_total",
            "counter",
            "Live leases forgotten to respect memory.leases_max; their completes were not reconciled.",
            counters.leases_evicted_total,
        ),
        (
            "ratelimiterd_memory_settled_leases_evicted_total",
            "counter",
            "Settled (completed or evicted) lease ids forgotten before their retention to respect \
             memory.settled_leases_max; a retry of one is reserved anew.",
            counters.settled_leases_evicted_total,
        ),
        (
            "ratelimiterd_memory_failed_leases_evicted_total",
            "counter",
            "Denied lease ids forgotten early to respect memory.failed_leases_max.",
            counters.failed_leases_evicted_total,
        ),
        (
            "ratelimiterd_memory_leases_live",
            "gauge",
            "Leases allowed and not completed.",
            counters.leases_live,
        ),
        (
            "ratelimiterd_memory_settled_leases_remembered",
            "gauge",
            "Settled lease ids remembered for idempotent retries.",
            counters.settled_leases_remembered,
        ),
        (
            "ratelimiterd_memory_failed_leases_remembered",
            "gauge",
            "Denied lease ids remembered.",
            counters.failed_leases_remembered,
        ),
    ];
    render_lines(out, &lines);
}

/// A backend's own counters, appended to `/metrics` after the server's.
pub trait BackendMetrics: Send + Sync {
    /// Appends the Prometheus text of the backend's counters to `out`.
    fn render_metrics(&self, out: &mut String);
}

#[cfg(feature = "tigerbeetle")]
impl BackendMetrics for crate::tigerbeetle::TigerBeetleBackend {
    fn render_metrics(&self, out: &mut String) {
        render_tigerbeetle(out, &self.counters());
        let stats = self.submitter_stats();
        out.push_str("# HELP ratelimiterd_tigerbeetle_queue_wait_seconds Time work items waited for the submitter before their batch was sent.\n");
        out.push_str("# TYPE ratelimiterd_tigerbeetle_queue_wait_seconds histogram\n");
        stats
            .queue_wait
            .render(out, "ratelimiterd_tigerbeetle_queue_wait_seconds", "");
        out.push_str("# HELP ratelimiterd_tigerbeetle_request_duration_seconds Time TigerBeetle took to answer each create_transfers request.\n");
        out.push_str("# TYPE ratelimiterd_tigerbeetle_request_duration_seconds histogram\n");
        stats
            .round_trip
            .render(out, "ratelimiterd_tigerbeetle_request_duration_seconds", "");
    }
}

/// The TigerBeetle backend's single-valued metrics: name, type, help, and how
/// to read the value from the counters.
#[cfg(feature = "tigerbeetle")]
type TigerBeetleLine = (
    &'static str,
    &'static str,
    &'static str,
    fn(&crate::tigerbeetle::TigerBeetleCounters) -> u64,
);

#[cfg(feature = "tigerbeetle")]
const TIGERBEETLE_LINES: [TigerBeetleLine; 16] = [
    (
        "ratelimiterd_tigerbeetle_overage_dropped_units_total",
        "counter",
        "Units used above reservations and dropped (overage: none).",
        |c| c.overage_dropped_units,
    ),
    (
        "ratelimiterd_tigerbeetle_overage_debt_units_total",
        "counter",
        "Units used above reservations and recorded as debt (overage: debt).",
        |c| c.overage_debt_units,
    ),
    (
        "ratelimiterd_tigerbeetle_batches_total",
        "counter",
        "create_transfers requests sent; transfers per batch is batch_transfers_total over this.",
        |c| c.batches.batches,
    ),
    (
        "ratelimiterd_tigerbeetle_batch_items_total",
        "counter",
        "Work items (a lease's chain, a Complete's transfers) sent in those requests.",
        |c| c.batches.items,
    ),
    (
        "ratelimiterd_tigerbeetle_batch_transfers_total",
        "counter",
        "Transfers sent in those requests.",
        |c| c.batches.transfers,
    ),
    (
        "ratelimiterd_tigerbeetle_batch_transfers_max",
        "gauge",
        "The most transfers sent in one request since the start.",
        |c| c.batches.largest_batch,
    ),
    (
        "ratelimiterd_tigerbeetle_queue_full_total",
        "counter",
        "Work items refused at once (503) because the submitter's queue was full.",
        |c| c.queue_full,
    ),
    (
        "ratelimiterd_tigerbeetle_timeouts_total",
        "counter",
        "Requests TigerBeetle did not answer within request_timeout_ms (503, outcome unknown).",
        |c| c.timeouts,
    ),
    (
        "ratelimiterd_tigerbeetle_abandoned_items_total",
        "counter",
        "Queued work items not sent because their caller had given up.",
        |c| c.abandoned,
    ),
    (
        "ratelimiterd_tigerbeetle_queue_depth",
        "gauge",
        "Work items waiting for the submitter.",
        |c| c.queue_depth,
    ),
    (
        "ratelimiterd_tigerbeetle_requests_outstanding",
        "gauge",
        "Requests sent on the client sessions and not answered yet.",
        |c| c.slots_busy,
    ),
    (
        "ratelimiterd_tigerbeetle_sessions_renewed_total",
        "counter",
        "Client sessions reopened after the cluster evicted them.",
        |c| c.sessions_renewed,
    ),
    (
        "ratelimiterd_tigerbeetle_leases_cached",
        "gauge",
        "Leases whose metadata is kept for Complete.",
        |c| c.leases_cached,
    ),
    (
        "ratelimiterd_tigerbeetle_lease_cache_evictions_total",
        "counter",
        "Leases forgotten to respect lease_cache_max; their Completes were not reconciled.",
        |c| c.lease_cache_evictions,
    ),
    (
        "ratelimiterd_tigerbeetle_denied_leases_remembered",
        "gauge",
        "Lease ids TigerBeetle denied, remembered so that they stay denied.",
        |c| c.denied_leases,
    ),
    (
        "ratelimiterd_tigerbeetle_denied_leases_evictions_total",
        "counter",
        "Denied lease ids forgotten to respect the bound; TigerBeetle still remembers them.",
        |c| c.denied_lease_evictions,
    ),
];

/// Appends the TigerBeetle backend's counters.
#[cfg(feature = "tigerbeetle")]
pub fn render_tigerbeetle(out: &mut String, counters: &crate::tigerbeetle::TigerBeetleCounters) {
    let lines: Vec<(&str, &str, &str, u64)> = TIGERBEETLE_LINES
        .iter()
        .map(|(name, kind, help, value)| (*name, *kind, *help, value(counters)))
        .collect();
    render_lines(out, &lines);
}

/// Appends one single-valued metric per line: (name, type, help, value).
fn render_lines(out: &mut String, lines: &[(&str, &str, &str, u64)]) {
    for (name, kind, help, value) in lines {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
    }
}

fn render_key(out: &mut String, key: &str, counters: &KeyCounters) {
    let key = escape_label(key);
    for (outcome, counter) in [
        ("allowed", &counters.allowed),
        ("insufficient_capacity", &counters.insufficient_capacity),
        ("exceeds_capacity", &counters.exceeds_capacity),
        ("limit_decreasing", &counters.limit_decreasing),
    ] {
        let value = counter.load(Ordering::Relaxed);
        if value > 0 {
            let _ = writeln!(
                out,
                "ratelimiterd_reserve_outcomes_total{{key=\"{key}\",outcome=\"{outcome}\"}} {value}"
            );
        }
    }
}

/// Escapes a Prometheus label value. Limit keys never need it; it is here so that
/// a future key alphabet cannot break the exposition format.
fn escape_label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Holds one request in the in-flight gauge.
#[derive(Debug)]
pub struct InFlightGuard(Arc<Metrics>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimiter::{LeaseId, Requirement};

    fn request(keys: &[&str]) -> ReserveRequest {
        let requirements = keys
            .iter()
            .map(|k| Requirement {
                key: LimitKey::new(*k).unwrap(),
                amount: 1,
            })
            .collect();
        ReserveRequest::new(LeaseId::generate(), None, requirements).unwrap()
    }

    #[test]
    fn outcomes_are_counted_per_key_and_reason() {
        let metrics = Arc::new(Metrics::default());
        let req = request(&["a", "b"]);
        metrics.record_outcome(&req, &ReserveOutcome::Allowed { reserved_at_unix_ms: 1 });
        metrics.record_outcome(&req, &ReserveOutcome::Allowed { reserved_at_unix_ms: 2 });
        let b = LimitKey::new("b").unwrap();
        metrics.record_outcome(
            &req,
            &ReserveOutcome::Denied(Denial::InsufficientCapacity {
                key: b,
                retry_after_ms: 5,
            }),
        );
        metrics.record_outcome(&req, &ReserveOutcome::Denied(Denial::LeaseAlreadyFailed));
        metrics.reserve_latency.observe(Duration::from_micros(70));
        let guard = metrics.in_flight();
        let text = metrics.render();
        drop(guard);
        assert!(text.contains("ratelimiterd_reserve_outcomes_total{key=\"a\",outcome=\"allowed\"} 2\n"));
        assert!(text.contains("ratelimiterd_reserve_outcomes_total{key=\"b\",outcome=\"insufficient_capacity\"} 1\n"));
        assert!(text.contains("{key=\"\",outcome=\"lease_already_failed\"} 1\n"));
        assert!(text.contains("ratelimiterd_request_duration_seconds_bucket{endpoint=\"reserve\",le=\"0.0001\"} 1\n"));
        assert!(text.contains("ratelimiterd_request_duration_seconds_bucket{endpoint=\"reserve\",le=\"0.00005\"} 0\n"));
        assert!(text.contains("ratelimiterd_request_duration_seconds_count{endpoint=\"complete\"} 0\n"));
        assert!(text.contains("ratelimiterd_requests_in_flight 1\n"));
        assert!(metrics.render().contains("ratelimiterd_requests_in_flight 0\n"));
    }
}
