//! The Prometheus text format's shapes that more than one of the gateway's
//! metrics render (docs/gateway.md, "Metrics"): below every metrics module,
//! so that each renders its own without reaching into another.

use std::fmt::Write as _;

use ratelimiter::metrics::{Histogram, BUCKET_BOUNDS_MICROS};

/// Appends one histogram in the Prometheus text format (its cumulative buckets
/// in seconds, its sum and its count under `labels`): the one shape every
/// histogram of the gateway is scraped in, per model or per class alike.
pub fn render_histogram(out: &mut String, name: &str, labels: &str, histogram: &Histogram) {
    let snapshot = histogram.snapshot();
    for (bound, cumulative) in BUCKET_BOUNDS_MICROS.iter().zip(&snapshot.cumulative) {
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels},le=\"{}\"}} {cumulative}",
            *bound as f64 / 1e6
        );
    }
    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", snapshot.count);
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", snapshot.sum_micros as f64 / 1e6);
    let _ = writeln!(out, "{name}_count{{{labels}}} {}", snapshot.count);
}
