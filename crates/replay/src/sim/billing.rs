//! The simulator's own bill: every call it admits, priced at the simulator's
//! configured prices ([`crate::sim::price`]) and summed per model, exactly (in
//! pico-USD). It is what the provider would invoice, kept apart from anything the
//! gateway computes, so that a benchmark can check the gateway's budgets and spend
//! report against it. `GET /sim/billing` reports it.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::Serialize;

use crate::sim::price::{BilledUsage, Price};

/// Pico-USD in a US dollar.
pub const PICO_USD_PER_USD: u128 = 1_000_000_000_000;

/// One model's bill so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ModelBill {
    /// Calls billed.
    pub calls: u64,
    /// Their tokens, as billed.
    pub tokens: BilledUsage,
    /// Their cost, exact, in pico-USD (serialized as a string: JSON numbers stop at 2^53).
    #[serde(serialize_with = "as_string")]
    pub pico_usd: u128,
}

impl ModelBill {
    fn add(&mut self, usage: &BilledUsage, pico_usd: u128) {
        self.calls += 1;
        self.tokens.input_tokens += usage.input_tokens;
        self.tokens.cache_read_tokens += usage.cache_read_tokens;
        self.tokens.cache_write_tokens += usage.cache_write_tokens;
        self.tokens.output_tokens += usage.output_tokens;
        self.pico_usd += pico_usd;
    }
}

fn as_string<S: serde::Serializer>(value: &u128, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&value.to_string())
}

/// The bill so far: per model, their total, and the calls of models without a price.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BillReport {
    /// Per priced model.
    pub models: BTreeMap<String, ModelBill>,
    /// Every priced model together.
    pub total: ModelBill,
    /// The total in USD (`total.pico_usd` / 10^12), for reading.
    pub total_usd: f64,
    /// Calls of a model the simulator has no price for: billed nothing, counted
    /// here so that a reader sees its bill is incomplete.
    pub unpriced_calls: u64,
}

/// The prices and the bill.
#[derive(Debug, Default)]
pub struct Billing {
    prices: BTreeMap<String, Price>,
    bill: Mutex<BillReport>,
}

impl Billing {
    /// Bills calls of the models of `prices` at their price.
    pub fn new(prices: BTreeMap<String, Price>) -> Self {
        Self {
            prices,
            bill: Mutex::new(BillReport::default()),
        }
    }

    /// The prices.
    pub fn prices(&self) -> &BTreeMap<String, Price> {
        &self.prices
    }

    /// Bills one call of `model` for `usage`.
    pub fn bill(&self, model: &str, usage: &BilledUsage) {
        let mut bill = self.bill.lock().expect("bill lock");
        let Some(price) = self.prices.get(model) else {
            bill.unpriced_calls += 1;
            return;
        };
        let cost = price.cost_pico_usd(usage);
        bill.models.entry(model.to_owned()).or_default().add(usage, cost);
        bill.total.add(usage, cost);
    }

    /// The bill so far.
    pub fn report(&self) -> BillReport {
        let mut report = self.bill.lock().expect("bill lock").clone();
        report.total_usd = report.total.pico_usd as f64 / PICO_USD_PER_USD as f64;
        report
    }

    /// Starts the bill again from nothing.
    pub fn reset(&self) {
        *self.bill.lock().expect("bill lock") = BillReport::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bill_sums_each_priced_call_and_counts_unpriced_ones() {
        let price = Price::parse("input:2.5,output:10").unwrap();
        let billing = Billing::new(BTreeMap::from([("gpt-4o".to_owned(), price)]));
        billing.bill("gpt-4o", &BilledUsage::openai(1_000, 0, 100));
        billing.bill("gpt-4o", &BilledUsage::openai(3, 0, 1));
        billing.bill("other", &BilledUsage::openai(1_000, 0, 100));
        let report = billing.report();
        let expected = 1_003 * 2_500_000 + 101 * 10_000_000;
        assert_eq!(report.total.pico_usd, expected);
        assert_eq!(report.models["gpt-4o"].calls, 2);
        assert_eq!(report.total.tokens.output_tokens, 101);
        assert_eq!(report.unpriced_calls, 1);
        assert!((report.total_usd - expected as f64 / 1e12).abs() < 1e-15);
        billing.reset();
        assert_eq!(billing.report().total.calls, 0);
    }
}
