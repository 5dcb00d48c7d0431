//! The gateway's metrics per (model, class) (docs/gateway.md, "Classes"): what an
//! operator reads to see that interactive calls are admitted at once while batch
//! waits, and how long each class waits.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use ratelimiter::metrics::{Histogram, HistogramSnapshot, BUCKET_BOUNDS_MICROS};

use super::prometheus::render_histogram;

/// Counters of one (model, class) pair.
#[derive(Debug, Default)]
pub struct ClassCounters {
    /// Calls admitted (a lease granted), at once or after a wait.
    pub admitted: AtomicU64,
    /// Calls the gateway answered 429 (its own limits).
    pub denied: AtomicU64,
    /// Calls that had to wait in the model's queue.
    pub queued: AtomicU64,
    /// Time spent waiting in the queue, for calls that waited.
    pub queue_wait: Histogram,
}

/// A snapshot of one pair, for the admin API.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ClassReport {
    /// The model clients name.
    pub model: String,
    /// The class.
    pub class: String,
    /// Calls admitted.
    pub admitted: u64,
    /// Calls denied with a 429.
    pub denied: u64,
    /// Calls that waited.
    pub queued: u64,
    /// An upper bound of the 99th percentile of the waits, in ms: the histogram
    /// bucket bound it falls under; 0 before any wait.
    pub queue_wait_p99_ms: u64,
}

/// The raw totals of one pair at one moment: what the console differences
/// between two samples for its per-second rates and windowed wait p99.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassTotals {
    /// Calls admitted so far.
    pub admitted: u64,
    /// Calls denied so far.
    pub denied: u64,
    /// Calls that waited so far.
    pub queued: u64,
    /// The queue-wait histogram so far.
    pub queue_wait: HistogramSnapshot,
}

impl Default for ClassTotals {
    /// Nothing counted yet.
    fn default() -> Self {
        Self {
            admitted: 0,
            denied: 0,
            queued: 0,
            queue_wait: HistogramSnapshot {
                cumulative: [0; BUCKET_BOUNDS_MICROS.len()],
                count: 0,
                sum_micros: 0,
            },
        }
    }
}

/// Every (model, class) pair's counters; bounded by the configuration (models × classes).
#[derive(Debug, Default)]
pub struct ClassMetrics {
    pairs: RwLock<BTreeMap<(String, String), Arc<ClassCounters>>>,
}

impl ClassMetrics {
    /// The counters of (`model`, `class`), made on first use.
    pub fn pair(&self, model: &str, class: &str) -> Arc<ClassCounters> {
        let key = (model.to_owned(), class.to_owned());
        if let Some(found) = self.pairs.read().expect("metrics lock").get(&key) {
            return found.clone();
        }
        (self.pairs.write().expect("metrics lock").entry(key).or_default()).clone()
    }

    /// Every pair's figures, by model then class.
    pub fn reports(&self) -> Vec<ClassReport> {
        let pairs = self.pairs.read().expect("metrics lock");
        (pairs.iter())
            .map(|((model, class), c)| ClassReport {
                model: model.clone(),
                class: class.clone(),
                admitted: c.admitted.load(Ordering::Relaxed),
                denied: c.denied.load(Ordering::Relaxed),
                queued: c.queued.load(Ordering::Relaxed),
                queue_wait_p99_ms: p99_bound_ms(&c.queue_wait.snapshot()),
            })
            .collect()
    }

    /// Every pair's raw totals, by model then class.
    pub fn totals(&self) -> Vec<(String, String, ClassTotals)> {
        let pairs = self.pairs.read().expect("metrics lock");
        (pairs.iter())
            .map(|((model, class), c)| {
                let totals = ClassTotals {
                    admitted: c.admitted.load(Ordering::Relaxed),
                    denied: c.denied.load(Ordering::Relaxed),
                    queued: c.queued.load(Ordering::Relaxed),
                    queue_wait: c.queue_wait.snapshot(),
                };
                (model.clone(), class.clone(), totals)
            })
            .collect()
    }

    /// Appends the Prometheus text of every pair to `out`.
    pub fn render(&self, out: &mut String) {
        let pairs = self.pairs.read().expect("metrics lock");
        type Field = fn(&ClassCounters) -> &AtomicU64;
        let counters: [(&str, &str, Field); 3] = [
            ("class_admitted_total", "Calls admitted, per model and class.", |c| {
                &c.admitted
            }),
            ("class_denied_total", "Calls answered 429, per model and class.", |c| {
                &c.denied
            }),
            ("class_queued_total", "Calls that waited, per model and class.", |c| {
                &c.queued
            }),
        ];
        for (name, help, field) in counters {
            let full = format!("ratelimiterd_gateway_{name}");
            let _ = writeln!(out, "# HELP {full} {help}\n# TYPE {full} counter");
            for ((model, class), c) in pairs.iter() {
                let value = field(c).load(Ordering::Relaxed);
                let _ = writeln!(out, "{full}{{model=\"{model}\",class=\"{class}\"}} {value}");
            }
        }
        let full = "ratelimiterd_gateway_class_queue_wait_seconds";
        let _ = writeln!(
            out,
            "# HELP {full} Time calls waited in the model's queue, per class.\n# TYPE {full} histogram"
        );
        for ((model, class), c) in pairs.iter() {
            let labels = format!("model=\"{model}\",class=\"{class}\"");
            render_histogram(out, full, &labels, &c.queue_wait);
        }
    }
}

/// The bound of the histogram bucket the 99th percentile falls under, in ms (the
/// last bound for waits above every bucket); 0 without observations.
fn p99_bound_ms(snapshot: &HistogramSnapshot) -> u64 {
    if snapshot.count == 0 {
        return 0;
    }
    let target = (snapshot.count * 99).div_ceil(100);
    let bound = (BUCKET_BOUNDS_MICROS.iter().zip(&snapshot.cumulative))
        .find(|(_, cumulative)| **cumulative >= target)
        .map_or(BUCKET_BOUNDS_MICROS[BUCKET_BOUNDS_MICROS.len() - 1], |(bound, _)| {
            *bound
        });
    bound.div_ceil(1_000)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn pairs_are_reported_and_rendered_with_their_labels() {
        let metrics = ClassMetrics::default();
        let batch = metrics.pair("gpt-4o", "batch");
        batch.admitted.fetch_add(3, Ordering::Relaxed);
        batch.queued.fetch_add(2, Ordering::Relaxed);
        for _ in 0..99 {
            batch.queue_wait.observe(Duration::from_millis(3));
        }
        batch.queue_wait.observe(Duration::from_secs(2));
        metrics
            .pair("gpt-4o", "interactive")
            .admitted
            .fetch_add(1, Ordering::Relaxed);
        let reports = metrics.reports();
        assert_eq!(reports.len(), 2);
        assert_eq!(
            (reports[0].class.as_str(), reports[0].admitted, reports[0].queued),
            ("batch", 3, 2)
        );
        assert!((3..=10).contains(&reports[0].queue_wait_p99_ms), "{reports:?}");
        assert_eq!(reports[1].queue_wait_p99_ms, 0);
        let mut text = String::new();
        metrics.render(&mut text);
        assert!(text.contains("ratelimiterd_gateway_class_admitted_total{model=\"gpt-4o\",class=\"batch\"} 3"));
        assert!(
            text.contains("ratelimiterd_gateway_class_queue_wait_seconds_count{model=\"gpt-4o\",class=\"batch\"} 100")
        );
    }
}
