//! The gateway's metrics, per model and tenant (docs/gateway.md, "Metrics"),
//! rendered in the Prometheus text format beside ratelimiterd's own.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use ratelimiter::metrics::{Histogram, BUCKET_BOUNDS_MICROS};

/// Counters of one (model, tenant) pair.
#[derive(Debug, Default)]
pub struct CallCounters {
    /// Calls admitted (a lease granted), at once or after a wait.
    pub admitted: AtomicU64,
    /// Calls that had to wait in the model's queue.
    pub queued: AtomicU64,
    /// Calls the gateway answered 429 (its own limits).
    pub denied: AtomicU64,
    /// Calls the provider answered 429.
    pub provider_429: AtomicU64,
    /// Tokens reserved before the calls.
    pub tokens_reserved: AtomicU64,
    /// Tokens the provider reported used.
    pub tokens_used: AtomicU64,
}

/// Histograms and provider figures of one model.
#[derive(Debug, Default)]
pub struct ModelMetrics {
    /// Time spent waiting in the queue, for calls that waited.
    pub queue_wait: Histogram,
    /// Time from sending upstream to the answer's headers.
    pub upstream_latency: Histogram,
    /// The provider's last `x-ratelimit-remaining-requests` (or Anthropic's), +1
    /// so that 0 means "never seen".
    pub provider_remaining_requests: AtomicU64,
    /// The provider's last remaining tokens, +1 likewise.
    pub provider_remaining_tokens: AtomicU64,
}

/// Every gateway metric.
#[derive(Debug, Default)]
pub struct GatewayMetrics {
    calls: RwLock<HashMap<(String, String), Arc<CallCounters>>>,
    models: RwLock<HashMap<String, Arc<ModelMetrics>>>,
    /// Per (model, class).
    pub classes: crate::class_metrics::ClassMetrics,
}

/// The tenant label of calls without a tenant (a gateway without keys).
pub const NO_TENANT: &str = "_none";

impl GatewayMetrics {
    /// The counters of (`model`, `tenant`); both come from the configuration, so
    /// the map is bounded by it.
    pub fn calls(&self, model: &str, tenant: &str) -> Arc<CallCounters> {
        let key = (model.to_owned(), tenant.to_owned());
        if let Some(found) = self.calls.read().expect("metrics lock").get(&key) {
            return found.clone();
        }
        self.calls
            .write()
            .expect("metrics lock")
            .entry(key)
            .or_default()
            .clone()
    }

    /// The histograms of `model`.
    pub fn model(&self, model: &str) -> Arc<ModelMetrics> {
        if let Some(found) = self.models.read().expect("metrics lock").get(model) {
            return found.clone();
        }
        self.models
            .write()
            .expect("metrics lock")
            .entry(model.to_owned())
            .or_default()
            .clone()
    }

    /// Appends the Prometheus text of every gateway metric to `out`.
    pub fn render(&self, out: &mut String) {
        self.classes.render(out);
        let calls = self.calls.read().expect("metrics lock");
        let mut pairs: Vec<_> = calls.iter().collect();
        pairs.sort_by(|a, b| a.0.cmp(b.0));
        type Field = fn(&CallCounters) -> &AtomicU64;
        let counters: [(&str, &str, Field); 6] = [
            ("admitted_total", "Calls admitted by the gateway's limits.", |c| {
                &c.admitted
            }),
            ("queued_total", "Calls that waited in the model's queue.", |c| &c.queued),
            ("denied_total", "Calls the gateway answered 429.", |c| &c.denied),
            ("provider_429_total", "Calls the provider answered 429.", |c| {
                &c.provider_429
            }),
            ("tokens_reserved_total", "Tokens reserved before calls.", |c| {
                &c.tokens_reserved
            }),
            ("tokens_used_total", "Tokens the provider reported used.", |c| {
                &c.tokens_used
            }),
        ];
        for (name, help, field) in counters {
            let _ = writeln!(
                out,
                "# HELP ratelimiterd_gateway_{name} {help}\n# TYPE ratelimiterd_gateway_{name} counter"
            );
            for ((model, tenant), c) in &pairs {
                let value = field(c).load(Ordering::Relaxed);
                let _ = writeln!(
                    out,
                    "ratelimiterd_gateway_{name}{{model=\"{model}\",tenant=\"{tenant}\"}} {value}"
                );
            }
        }
        drop(calls);
        let models = self.models.read().expect("metrics lock");
        let mut models: Vec<_> = models.iter().collect();
        models.sort_by(|a, b| a.0.cmp(b.0));
        for (name, help, pick) in [
            ("queue_wait_seconds", "Time calls waited in the model's queue.", 0),
            (
                "upstream_latency_seconds",
                "Time from sending upstream to the answer's headers.",
                1,
            ),
        ] {
            let full = format!("ratelimiterd_gateway_{name}");
            let _ = writeln!(out, "# HELP {full} {help}\n# TYPE {full} histogram");
            for (model, m) in &models {
                let histogram = if pick == 0 { &m.queue_wait } else { &m.upstream_latency };
                render_histogram(out, &full, &format!("model=\"{model}\""), histogram);
            }
        }
        for (name, pick) in [("provider_remaining_requests", 0), ("provider_remaining_tokens", 1)] {
            let _ = writeln!(out, "# HELP ratelimiterd_gateway_{name} The provider's last reported remaining capacity (rate-limit headers).\n# TYPE ratelimiterd_gateway_{name} gauge");
            for (model, m) in &models {
                let raw = if pick == 0 {
                    &m.provider_remaining_requests
                } else {
                    &m.provider_remaining_tokens
                };
                let raw = raw.load(Ordering::Relaxed);
                if raw > 0 {
                    let _ = writeln!(out, "ratelimiterd_gateway_{name}{{model=\"{model}\"}} {}", raw - 1);
                }
            }
        }
    }
}

/// Appends one histogram in the Prometheus text format.
pub(crate) fn render_histogram(out: &mut String, name: &str, labels: &str, histogram: &Histogram) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn renders_per_model_and_tenant() {
        let metrics = GatewayMetrics::default();
        metrics.calls("gpt", "acme").admitted.fetch_add(2, Ordering::Relaxed);
        metrics.model("gpt").queue_wait.observe(Duration::from_millis(3));
        let mut text = String::new();
        metrics.render(&mut text);
        assert!(text.contains("ratelimiterd_gateway_admitted_total{model=\"gpt\",tenant=\"acme\"} 2\n"));
        assert!(text.contains("ratelimiterd_gateway_queue_wait_seconds_count{model=\"gpt\"} 1\n"));
    }
}
