//! Backend counters in a form that names no exporter: a backend lists its
//! [`Metric`]s, and whoever serves them (the server's `/metrics`, a test, an
//! embedding program) renders them in its own format under its own prefix.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Latency bucket bounds, in microseconds: 50 µs to 5 s, covering a memory-backend
/// hit and a TigerBeetle round trip under load alike.
pub const BUCKET_BOUNDS_MICROS: [u64; 16] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000,
    5_000_000,
];

/// A latency histogram with the fixed buckets [`BUCKET_BOUNDS_MICROS`]; updated
/// with relaxed atomics, so observing never blocks the hot path.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKET_BOUNDS_MICROS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    /// Records one observation; one past the last bound counts only in the total.
    pub fn observe(&self, elapsed: Duration) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        if let Some(i) = BUCKET_BOUNDS_MICROS.iter().position(|bound| micros <= *bound) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// The histogram's values now.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut cumulative = [0; BUCKET_BOUNDS_MICROS.len()];
        let mut total = 0;
        for (slot, bucket) in cumulative.iter_mut().zip(&self.buckets) {
            total += bucket.load(Ordering::Relaxed);
            *slot = total;
        }
        HistogramSnapshot {
            cumulative,
            count: self.count.load(Ordering::Relaxed),
            sum_micros: self.sum_micros.load(Ordering::Relaxed),
        }
    }
}

/// A [`Histogram`] read at one moment, in Prometheus' cumulative form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Observations at or below each bound of [`BUCKET_BOUNDS_MICROS`].
    pub cumulative: [u64; BUCKET_BOUNDS_MICROS.len()],
    /// Every observation, those above the last bound included.
    pub count: u64,
    /// The sum of all observations, in microseconds.
    pub sum_micros: u64,
}

/// The value of one metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricValue {
    /// Only ever grows (units, events).
    Counter(u64),
    /// Goes up and down (queue depth, entries remembered).
    Gauge(u64),
    /// A latency distribution.
    Histogram(HistogramSnapshot),
}

/// One metric of a backend: a name without any exporter prefix (the server
/// adds `ratelimiterd_`), a help sentence and its value now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    /// Lower-case words joined by `_`, units and `_total` last.
    pub name: &'static str,
    /// One sentence saying what is counted and why it matters.
    pub help: &'static str,
    /// The value now.
    pub value: MetricValue,
}

/// A metric of a backend with one series per value of one label (a
/// replica's address, ...), since what it counts is kept apart per value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabeledMetric {
    /// Lower-case words joined by `_`, units and `_total` last (a counter
    /// when it ends in `_total`, a gauge otherwise).
    pub name: &'static str,
    /// One sentence saying what is counted and why it matters.
    pub help: &'static str,
    /// The label's name.
    pub label: &'static str,
    /// Each label value and its value now.
    pub series: Vec<(String, u64)>,
}

/// A backend that reports its own counters.
pub trait BackendMetrics: Send + Sync {
    /// Every metric of the backend, read now, in a stable order.
    fn metrics(&self) -> Vec<Metric>;

    /// The metrics kept per label value, read now; a backend with none has
    /// nothing to add (the default).
    fn labeled_metrics(&self) -> Vec<LabeledMetric> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_count_the_overflow() {
        let histogram = Histogram::default();
        histogram.observe(Duration::from_micros(40));
        histogram.observe(Duration::from_micros(200));
        histogram.observe(Duration::from_secs(10));
        let snapshot = histogram.snapshot();
        assert_eq!(snapshot.cumulative[0], 1);
        assert_eq!(snapshot.cumulative[2], 2);
        assert_eq!(snapshot.cumulative[BUCKET_BOUNDS_MICROS.len() - 1], 2);
        assert_eq!(snapshot.count, 3);
        assert_eq!(snapshot.sum_micros, 10_000_240);
    }
}
