//! The gateway's metrics, per model and tenant (docs/gateway.md, "Metrics"),
//! rendered in the Prometheus text format beside ratelimiterd's own.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use ratelimiter::metrics::Histogram;

use super::prometheus::render_histogram;
use crate::routing::{BreakerState, DeploymentState};

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

/// A copy of one (model, tenant) pair's counters at one instant: what the
/// operator's console turns into rates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallTotals {
    /// Calls admitted.
    pub admitted: u64,
    /// Calls that waited.
    pub queued: u64,
    /// Calls answered 429 by the gateway.
    pub denied: u64,
    /// Calls the provider answered 429.
    pub provider_429: u64,
    /// Tokens reserved.
    pub tokens_reserved: u64,
    /// Tokens the provider reported used.
    pub tokens_used: u64,
}

impl CallCounters {
    /// The counters' values now.
    pub fn totals(&self) -> CallTotals {
        CallTotals {
            admitted: self.admitted.load(Ordering::Relaxed),
            queued: self.queued.load(Ordering::Relaxed),
            denied: self.denied.load(Ordering::Relaxed),
            provider_429: self.provider_429.load(Ordering::Relaxed),
            tokens_reserved: self.tokens_reserved.load(Ordering::Relaxed),
            tokens_used: self.tokens_used.load(Ordering::Relaxed),
        }
    }
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

/// The call counters of each tenant, by model.
type CallsByModel = HashMap<String, HashMap<String, Arc<CallCounters>, FastHash>, FastHash>;
/// The hash of the call counters' maps.
type FastHash = foldhash::fast::RandomState;

/// Every gateway metric.
#[derive(Debug, Default)]
pub struct GatewayMetrics {
    /// By model, then tenant: looked up by reference at every call, without
    /// copying either name, with a fast hash (names of the configuration and
    /// the directory).
    calls: RwLock<CallsByModel>,
    models: RwLock<HashMap<String, Arc<ModelMetrics>>>,
    deployments: RwLock<Vec<Arc<DeploymentState>>>,
    /// Per (model, class).
    pub classes: super::class_metrics::ClassMetrics,
    /// The spend recorded in the spend ledger.
    pub spend: Arc<super::spend_metrics::SpendMetrics>,
    /// The budget alerts' webhook, when one is configured.
    pub alert_webhook: std::sync::OnceLock<Arc<super::alert_webhook::WebhookCounts>>,
    /// The budget alerts' watch: what it raised, skipped and could not watch.
    pub budget_watch: std::sync::OnceLock<Arc<super::budget_watch::BudgetWatch>>,
}

/// The tenant label of calls without a tenant (a gateway without keys).
pub const NO_TENANT: &str = "_none";

impl GatewayMetrics {
    /// The counters of (`model`, `tenant`); both come from the configuration, so
    /// the map is bounded by it.
    pub fn calls(&self, model: &str, tenant: &str) -> Arc<CallCounters> {
        let calls = self.calls.read().expect("metrics lock");
        if let Some(found) = calls.get(model).and_then(|tenants| tenants.get(tenant)) {
            return found.clone();
        }
        drop(calls);
        let mut calls = self.calls.write().expect("metrics lock");
        let tenants = calls.entry(model.to_owned()).or_default();
        tenants.entry(tenant.to_owned()).or_default().clone()
    }

    /// Every (model, tenant) pair seen so far with its counters, unordered.
    fn each_call(calls: &CallsByModel) -> impl Iterator<Item = ((&String, &String), &Arc<CallCounters>)> {
        (calls.iter()).flat_map(|(model, tenants)| tenants.iter().map(move |(tenant, c)| ((model, tenant), c)))
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

    /// Every (model, tenant) pair seen so far with its totals now, ordered.
    pub fn call_totals(&self) -> Vec<(String, String, CallTotals)> {
        let calls = self.calls.read().expect("metrics lock");
        let mut out: Vec<_> = Self::each_call(&calls)
            .map(|((model, tenant), c)| (model.clone(), tenant.clone(), c.totals()))
            .collect();
        drop(calls);
        out.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        out
    }

    /// The queue-wait histogram of `model`, if it has been seen.
    pub fn queue_wait(&self, model: &str) -> Option<ratelimiter::metrics::HistogramSnapshot> {
        let models = self.models.read().expect("metrics lock");
        models.get(model).map(|m| m.queue_wait.snapshot())
    }

    /// Registers a deployment's stats (at startup: bounded by the configuration).
    pub fn add_deployment(&self, stats: Arc<DeploymentState>) {
        self.deployments.write().expect("metrics lock").push(stats);
    }

    /// Every deployment's stats, in configuration order, for the admin API.
    pub fn deployments_json(&self) -> serde_json::Value {
        let deployments = self.deployments.read().expect("metrics lock");
        serde_json::Value::Array(deployments.iter().map(|d| deployment_json(d)).collect())
    }

    fn render_deployments(&self, out: &mut String) {
        let deployments = self.deployments.read().expect("metrics lock");
        type Field = fn(&DeploymentState) -> u64;
        let series: [(&str, &str, &str, Field); 6] = [
            (
                "deployment_admitted_total",
                "counter",
                "Calls reserved on the deployment.",
                |d| d.admitted.load(Ordering::Relaxed),
            ),
            (
                "deployment_admitted_after_denial_total",
                "counter",
                "Calls reserved on the deployment after another deployment denied them in the same admission.",
                |d| d.admitted_after_denial.load(Ordering::Relaxed),
            ),
            (
                "deployment_denied_total",
                "counter",
                "Reservations the deployment's (or the tenant's) keys denied.",
                |d| d.denied.load(Ordering::Relaxed),
            ),
            (
                "deployment_failed_over_total",
                "counter",
                "Calls the deployment failed that went on to another deployment.",
                |d| d.failed_over.load(Ordering::Relaxed),
            ),
            (
                "deployment_breaker_open",
                "gauge",
                "The breaker's state: 0 closed, 1 open, 2 half-open.",
                |d| match d.breaker_state() {
                    BreakerState::Closed => 0,
                    BreakerState::Open => 1,
                    BreakerState::HalfOpen => 2,
                },
            ),
            (
                "deployment_paused_until_seconds",
                "gauge",
                "When this server's pause after the deployment's 429 ends (unix seconds; 0: none).",
                |d| d.cooldown.until_unix_ms().unwrap_or(0) / 1000,
            ),
        ];
        for (name, kind, help, field) in series {
            let _ = writeln!(
                out,
                "# HELP ratelimiterd_gateway_{name} {help}\n# TYPE ratelimiterd_gateway_{name} {kind}"
            );
            // A deployment shows from its first call on, as a (model, tenant) pair does.
            for d in deployments.iter().filter(|d| d.is_active()) {
                let _ = writeln!(
                    out,
                    "ratelimiterd_gateway_{name}{{model=\"{}\",upstream=\"{}\",upstream_model=\"{}\"}} {}",
                    d.model,
                    d.upstream,
                    d.upstream_model,
                    field(d)
                );
            }
        }
    }

    /// Appends the Prometheus text of every gateway metric to `out`.
    pub fn render(&self, out: &mut String) {
        self.render_deployments(out);
        self.classes.render(out);
        self.spend.render(out);
        if let Some(webhook) = self.alert_webhook.get() {
            webhook.render(out);
        }
        if let Some(watch) = self.budget_watch.get() {
            watch.render(out);
        }
        let calls = self.calls.read().expect("metrics lock");
        let mut pairs: Vec<_> = Self::each_call(&calls).collect();
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
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

/// A deployment's state, as the admin API shows it.
fn deployment_json(d: &DeploymentState) -> serde_json::Value {
    serde_json::json!({
        "model": d.model,
        "upstream": d.upstream,
        "upstream_model": d.upstream_model,
        "admitted": d.admitted.load(Ordering::Relaxed),
        "admitted_after_denial": d.admitted_after_denial.load(Ordering::Relaxed),
        "denied": d.denied.load(Ordering::Relaxed),
        "failed_over": d.failed_over.load(Ordering::Relaxed),
        "breaker": d.breaker_state().label(),
        "paused_until_unix_ms": d.cooldown.until_unix_ms(),
    })
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

    #[test]
    fn totals_are_read_per_pair_in_order() {
        let metrics = GatewayMetrics::default();
        metrics.calls("b", "t").denied.fetch_add(3, Ordering::Relaxed);
        metrics.calls("a", "t").tokens_used.fetch_add(7, Ordering::Relaxed);
        let totals = metrics.call_totals();
        assert_eq!(totals.len(), 2);
        assert_eq!((totals[0].0.as_str(), totals[0].2.tokens_used), ("a", 7));
        assert_eq!((totals[1].0.as_str(), totals[1].2.denied), ("b", 3));
        assert!(metrics.queue_wait("a").is_none());
        metrics.model("a").queue_wait.observe(Duration::from_millis(2));
        assert_eq!(metrics.queue_wait("a").unwrap().count, 1);
    }

    #[test]
    fn a_deployment_shows_from_its_first_call_and_in_the_admin_view() {
        let metrics = GatewayMetrics::default();
        let stats = Arc::new(DeploymentState::new(
            "gpt",
            "east",
            "gpt-ptu",
            None,
            Arc::new(ratelimiter::SystemClock::new()),
        ));
        metrics.add_deployment(stats.clone());
        let mut text = String::new();
        metrics.render(&mut text);
        assert!(!text.contains("deployment_admitted_total{"), "{text}");
        stats.admitted.fetch_add(3, Ordering::Relaxed);
        let mut text = String::new();
        metrics.render(&mut text);
        assert!(text.contains(
            "ratelimiterd_gateway_deployment_admitted_total{model=\"gpt\",upstream=\"east\",upstream_model=\"gpt-ptu\"} 3\n"
        ));
        let view = &metrics.deployments_json()[0];
        assert_eq!(
            (view["admitted"].as_u64(), view["breaker"].as_str()),
            (Some(3), Some("closed"))
        );
        assert!(view["paused_until_unix_ms"].is_null());
    }
}
