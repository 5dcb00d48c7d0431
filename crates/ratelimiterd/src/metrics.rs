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

use ratelimiter::metrics::{Histogram, HistogramSnapshot, LabeledMetric, Metric, MetricValue, BUCKET_BOUNDS_MICROS};
use ratelimiter::{Denial, LimitKey, ReserveOutcome, ReserveRequest};

use crate::telemetry::dropped::OtelDropped;

/// The most keys with their own counters. Past it, outcomes are counted under the
/// key `_other`, so a registry that grows without bound cannot grow memory here.
pub const METRIC_KEYS_MAX: usize = 100_000;
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
    /// What the OTLP export dropped or failed to send, by signal.
    pub otel_dropped: Arc<OtelDropped>,
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
        for (endpoint, histogram) in [("reserve", &self.reserve_latency), ("complete", &self.complete_latency)] {
            render_histogram(
                &mut out,
                "ratelimiterd_request_duration_seconds",
                &format!("endpoint=\"{endpoint}\""),
                &histogram.snapshot(),
            );
        }
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
        self.otel_dropped.render(&mut out);
        out
    }
}

/// The prefix of every metric the server exports, backends' included.
const PREFIX: &str = "ratelimiterd_";

/// Appends a backend's metrics, each under [`PREFIX`].
pub fn render_backend(out: &mut String, metrics: &[Metric]) {
    for metric in metrics {
        let name = format!("{PREFIX}{}", metric.name);
        let help = metric.help;
        match metric.value {
            MetricValue::Counter(value) => {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
            }
            MetricValue::Gauge(value) => {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
            }
            MetricValue::Histogram(snapshot) => {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
                render_histogram(out, &name, "", &snapshot);
            }
        }
    }
}

/// Appends a backend's metrics kept per label value (`ratelimiterd_` prefixed):
/// counters when their name ends in `_total`, gauges otherwise.
pub fn render_labeled(out: &mut String, metrics: &[LabeledMetric]) {
    for metric in metrics {
        let name = format!("{PREFIX}{}", metric.name);
        let kind = if metric.name.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        let _ = writeln!(out, "# HELP {name} {}\n# TYPE {name} {kind}", metric.help);
        for (value_of_label, value) in &metric.series {
            let _ = writeln!(
                out,
                "{name}{{{}=\"{}\"}} {value}",
                metric.label,
                escape_label(value_of_label)
            );
        }
    }
}

/// Appends a histogram's Prometheus text; `labels` (possibly empty) are
/// written inside braces, before the bucket's `le`.
pub fn render_histogram(out: &mut String, name: &str, labels: &str, snapshot: &HistogramSnapshot) {
    let (bucket_labels, own_labels) = if labels.is_empty() {
        (String::new(), String::new())
    } else {
        (format!("{labels},"), format!("{{{labels}}}"))
    };
    for (bound, cumulative) in BUCKET_BOUNDS_MICROS.iter().zip(&snapshot.cumulative) {
        let seconds = *bound as f64 / 1e6;
        let _ = writeln!(out, "{name}_bucket{{{bucket_labels}le=\"{seconds}\"}} {cumulative}");
    }
    let count = snapshot.count;
    let _ = writeln!(out, "{name}_bucket{{{bucket_labels}le=\"+Inf\"}} {count}");
    let sum = snapshot.sum_micros as f64 / 1e6;
    let _ = writeln!(out, "{name}_sum{own_labels} {sum}");
    let _ = writeln!(out, "{name}_count{own_labels} {count}");
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
    use std::time::Duration;

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
