//! What the OTLP export dropped or failed to send (docs/observability.md, "Never
//! in a call's way"): counted by signal for the Prometheus endpoint
//! (`ratelimiterd_otel_dropped_total{signal="traces|metrics"}`) and logged at
//! most once every [`DROP_LOG_INTERVAL`], so that a collector that is down
//! neither floods the log nor goes unseen.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The least time between two log lines about dropped telemetry: a collector
/// down for an hour is 60 lines, not one per batch.
pub const DROP_LOG_INTERVAL: Duration = Duration::from_secs(60);
/// The counter's name on the Prometheus endpoint.
pub const DROPPED_METRIC: &str = "ratelimiterd_otel_dropped_total";

/// A signal of the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Spans.
    Traces,
    /// Metric data points.
    Metrics,
}

impl Signal {
    /// The `signal` label's value.
    pub fn label(self) -> &'static str {
        match self {
            Signal::Traces => "traces",
            Signal::Metrics => "metrics",
        }
    }
}

/// The spans and metric data points the export dropped (a full queue) or
/// failed to send (the collector refused, timed out or was unreachable).
#[derive(Debug, Default)]
pub struct OtelDropped {
    traces: AtomicU64,
    metrics: AtomicU64,
    /// When the last log line was written.
    logged_at: Mutex<Option<Instant>>,
}

impl OtelDropped {
    /// Counts `count` items of `signal` lost, `why` saying how; logs when no
    /// line was written in the last [`DROP_LOG_INTERVAL`].
    pub fn count(&self, signal: Signal, count: u64, why: &str) {
        if count == 0 {
            return;
        }
        let counter = match signal {
            Signal::Traces => &self.traces,
            Signal::Metrics => &self.metrics,
        };
        counter.fetch_add(count, Ordering::Relaxed);
        let mut logged_at = self.logged_at.lock().unwrap_or_else(|p| p.into_inner());
        if logged_at.is_some_and(|at| at.elapsed() < DROP_LOG_INTERVAL) {
            return;
        }
        *logged_at = Some(Instant::now());
        drop(logged_at);
        tracing::warn!(
            signal = signal.label(),
            count,
            reason = why,
            dropped_traces = self.get(Signal::Traces),
            dropped_metrics = self.get(Signal::Metrics),
            "telemetry: OTLP export dropped data (logged at most once a minute; see {DROPPED_METRIC})"
        );
    }

    /// What was lost of `signal` so far.
    pub fn get(&self, signal: Signal) -> u64 {
        match signal {
            Signal::Traces => self.traces.load(Ordering::Relaxed),
            Signal::Metrics => self.metrics.load(Ordering::Relaxed),
        }
    }

    /// Appends the counter in Prometheus text.
    pub fn render(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP {DROPPED_METRIC} Spans and metric data points the OTLP export dropped or failed to send.\n\
             # TYPE {DROPPED_METRIC} counter"
        );
        for signal in [Signal::Traces, Signal::Metrics] {
            let _ = writeln!(
                out,
                "{DROPPED_METRIC}{{signal=\"{}\"}} {}",
                signal.label(),
                self.get(signal)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn losses_are_counted_by_signal_and_rendered() {
        let dropped = OtelDropped::default();
        dropped.count(Signal::Traces, 3, "refused");
        dropped.count(Signal::Traces, 2, "refused");
        dropped.count(Signal::Metrics, 0, "nothing");
        let mut text = String::new();
        dropped.render(&mut text);
        assert!(
            text.contains("ratelimiterd_otel_dropped_total{signal=\"traces\"} 5\n"),
            "{text}"
        );
        assert!(
            text.contains("ratelimiterd_otel_dropped_total{signal=\"metrics\"} 0\n"),
            "{text}"
        );
    }
}
