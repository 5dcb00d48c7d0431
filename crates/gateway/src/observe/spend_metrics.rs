//! The spend the gateway recorded, by tenant, model and deployment, in the
//! Prometheus text format (docs/gateway.md, "The spend ledger"). Keys are not
//! labels (there may be thousands): the ledger reports them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use ratelimiter::spend::SpendEntry;

/// Sums by tenant, then model, then deployment: nested so that counting an
/// entry whose labels are known looks them up without copying them.
type Sums = BTreeMap<String, BTreeMap<String, BTreeMap<String, u64>>>;

/// The spend recorded durably by this server, and what could not be recorded.
#[derive(Debug, Default)]
pub struct SpendMetrics {
    /// Micro-dollars by (tenant, model, deployment); bounded by the tenants,
    /// models and deployments the configuration and directory have.
    micro_usd: Mutex<Sums>,
    /// Entries written to the ledger.
    pub recorded: AtomicU64,
    /// Writes of a batch that failed (each retried with backoff).
    pub record_failures: AtomicU64,
    /// Entries dropped: the queue was full, or the ledger refused them as invalid.
    pub dropped: AtomicU64,
}

/// The value of `map` at `key`, made (default) when missing; the key is
/// copied only then.
fn slot<'a, V: Default>(map: &'a mut BTreeMap<String, V>, key: &str) -> &'a mut V {
    if !map.contains_key(key) {
        map.insert(key.to_owned(), V::default());
    }
    map.get_mut(key).expect("inserted above")
}

impl SpendMetrics {
    /// Counts `entry`, recorded durably.
    pub fn add(&self, entry: &SpendEntry) {
        self.recorded.fetch_add(1, Ordering::Relaxed);
        let mut sums = self.micro_usd.lock().expect("spend metrics lock");
        let sum = slot(slot(slot(&mut sums, &entry.tenant), &entry.model), &entry.deployment);
        *sum = sum.saturating_add(entry.micro_usd);
    }

    /// Appends the Prometheus text of the spend metrics to `out`.
    pub fn render(&self, out: &mut String) {
        let name = "ratelimiterd_gateway_spend_micro_usd_total";
        let _ = writeln!(
            out,
            "# HELP {name} Billed cost of completed calls recorded in the spend ledger by this server, in micro-dollars.\n# TYPE {name} counter"
        );
        let sums = self.micro_usd.lock().expect("spend metrics lock");
        let labelled = sums.iter().flat_map(|(tenant, models)| {
            (models.iter()).flat_map(move |(model, deployments)| {
                (deployments.iter()).map(move |(deployment, value)| ((tenant, model, deployment), value))
            })
        });
        for ((tenant, model, deployment), value) in labelled {
            let _ = writeln!(
                out,
                "{name}{{tenant=\"{}\",model=\"{}\",deployment=\"{}\"}} {value}",
                escaped(tenant),
                escaped(model),
                escaped(deployment)
            );
        }
        drop(sums);
        for (name, help, counter) in [
            (
                "spend_recorded_total",
                "Entries written to the spend ledger.",
                &self.recorded,
            ),
            (
                "spend_record_failures_total",
                "Writes to the spend ledger that failed; each is retried with backoff.",
                &self.record_failures,
            ),
            (
                "spend_dropped_total",
                "Spend entries dropped: the recording queue was full, or the ledger refused them.",
                &self.dropped,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP ratelimiterd_gateway_{name} {help}\n# TYPE ratelimiterd_gateway_{name} counter\nratelimiterd_gateway_{name} {}",
                counter.load(Ordering::Relaxed)
            );
        }
    }
}

/// `value` as a Prometheus label value: backslash, quote and newline escaped
/// (a directory tenant's name is the operator's text).
fn escaped(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spend_is_summed_by_tenant_model_and_deployment_without_keys() {
        let metrics = SpendMetrics::default();
        let entry = |key: &str, micro_usd| SpendEntry {
            at_unix_ms: 0,
            tenant: "acme".into(),
            key: key.into(),
            model: "gpt-4o".into(),
            deployment: "east".into(),
            input_tokens: 1,
            cached_tokens: 0,
            output_tokens: 1,
            micro_usd,
            unpriced: false,
        };
        metrics.add(&entry("K1", 5));
        metrics.add(&entry("K2", 7));
        let mut text = String::new();
        metrics.render(&mut text);
        assert!(text.contains(
            "ratelimiterd_gateway_spend_micro_usd_total{tenant=\"acme\",model=\"gpt-4o\",deployment=\"east\"} 12\n"
        ));
        assert!(text.contains("ratelimiterd_gateway_spend_recorded_total 2\n"));
        assert!(!text.contains("K1"), "keys are not labels");
    }
}
