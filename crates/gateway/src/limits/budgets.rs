//! Budgets in money as limit keys (docs/gateway.md, "Budgets and spend"): each
//! budget is a limit in micro-dollars, reserved at a call's worst case at its
//! deployment's price in the same all-or-nothing reservation as the call's rate
//! limits, and reconciled at completion to what the provider bills.
//!
//! The keys, by owner (`<span>` is `day`, `week`, `month` or `window<seconds>`):
//! `tenant:<name>:usd:<span>`, `key:<id>:usd:<span>` (a directory key's own),
//! `model:<name>:usd:<span>` (every call of the model, all tenants together),
//! `gateway:usd:<span>` (every call).

use std::sync::Arc;

use ratelimiter::price::{billed_micro_usd, worst_case_micro_usd, CallBound, ModelPrice, MICRO_USD_PER_USD};
use ratelimiter::{Actual, LimitDefinition, LimitKey, Requirement};

use super::keys::{tenant_budget_prefix, ModelKeys, TenantKeys};
use crate::config::{validate_budgets, Budget, BudgetConfig, BudgetSpan, GatewayConfig, ModelConfig};
use crate::wire::usage::Usage;

/// The start of a model's budget keys (`model:<name>:usd:<span>`): shared by
/// every caller of the model.
pub const MODEL_BUDGET_PREFIX: &str = "model:";
/// The start of the gateway's budget keys (`gateway:usd:<span>`).
pub const GATEWAY_BUDGET_PREFIX: &str = "gateway:";
/// The part of a key that marks a budget in money: `...:usd:<span>`.
const USD_PART: &str = "usd";

/// One budget's limit key and its configured capacity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetKey {
    /// The limit key, e.g. `tenant:acme:usd:month`.
    pub key: LimitKey,
    /// The capacity configured, in micro-dollars; 0 refuses every call (no
    /// limit can hold 0, so such a budget has no definition and is refused
    /// before any reservation).
    pub micro_usd: u64,
    /// Its period or window.
    pub span: BudgetSpan,
    /// The fractions whose crossing is alerted (`alert_at`); empty: none.
    pub alert_at: AlertFractions,
}

/// A budget's `alert_at` as validated (each finite, in (0, 1], ascending),
/// carried with the budget's key to every call charged on it, so the call's
/// completion alerts on the budget as it was when the call was admitted: a
/// budget of the configuration or of the directory alike.
#[derive(Debug, Clone, Default)]
pub struct AlertFractions(Arc<[f64]>);

impl AlertFractions {
    /// The fractions of a validated budget.
    pub fn new(fractions: &[f64]) -> Self {
        assert!(
            fractions.iter().all(|f| f.is_finite()),
            "alert_at was validated with the budget"
        );
        Self(fractions.into())
    }
}

impl std::ops::Deref for AlertFractions {
    type Target = [f64];

    fn deref(&self) -> &[f64] {
        &self.0
    }
}

impl PartialEq for AlertFractions {
    fn eq(&self, other: &Self) -> bool {
        self.0.len() == other.0.len()
            && self
                .0
                .iter()
                .zip(other.0.iter())
                .all(|(a, b)| a.to_bits() == b.to_bits())
    }
}

// Every fraction is finite (asserted at construction), so equality is total.
impl Eq for AlertFractions {}

impl BudgetKey {
    /// Whether the budget is $0: every call it applies to is refused.
    pub fn is_zero(&self) -> bool {
        self.micro_usd == 0
    }

    /// Its registry definition: a rolling limit over its period or window, in
    /// micro-dollars, recording billed usage above a reservation as debt.
    /// `None` for a $0 budget.
    pub fn definition(&self) -> Option<LimitDefinition> {
        if self.is_zero() {
            return None;
        }
        let definition = match self.span {
            BudgetSpan::Period(period) => LimitDefinition::per_period(self.key.clone(), self.micro_usd, period),
            BudgetSpan::WindowSeconds(seconds) => LimitDefinition::rolling(self.key.clone(), self.micro_usd, seconds),
        };
        let definition = definition.expect("budgets were validated with the configuration");
        Some(definition.with_overage(ratelimiter::Overage::Debt))
    }
}

/// The keys of `budgets` owned under `prefix` (`tenant:acme:`, `gateway:`).
pub fn budget_keys(prefix: &str, budgets: &[Budget]) -> Vec<BudgetKey> {
    (budgets.iter())
        .map(|budget| BudgetKey {
            key: LimitKey::new(format!("{prefix}{}", budget.span.key_suffix()))
                .expect("names were validated with the configuration"),
            micro_usd: budget.micro_usd,
            span: budget.span,
            alert_at: AlertFractions::new(&budget.alert_at),
        })
        .collect()
}

/// The validated budgets of one owner's `budgets` list.
fn validated(budgets: &[BudgetConfig]) -> Vec<Budget> {
    validate_budgets(budgets, &|f: &str| f.to_owned()).expect("budgets were validated with the configuration")
}

/// The budgets every call of `model` reserves besides its caller's: the model's
/// own (`model:<name>:usd:<span>`, `model` as clients name it), then the gateway's.
pub fn model_budget_keys(config: &GatewayConfig, model: &ModelConfig) -> Vec<BudgetKey> {
    let mut keys = budget_keys(
        &format!("{MODEL_BUDGET_PREFIX}{}:", model.name),
        &validated(&model.budgets),
    );
    keys.extend(budget_keys(GATEWAY_BUDGET_PREFIX, &validated(&config.budgets)));
    keys
}

/// The definitions of every budget the configuration sets (the gateway's, each
/// model's, each tenant's), $0 budgets excepted: they are refused before any
/// reservation.
pub fn budget_definitions(config: &GatewayConfig) -> Vec<LimitDefinition> {
    let mut keys = budget_keys(GATEWAY_BUDGET_PREFIX, &validated(&config.budgets));
    for model in &config.models {
        keys.extend(budget_keys(
            &format!("{MODEL_BUDGET_PREFIX}{}:", model.name),
            &validated(&model.budgets),
        ));
    }
    for tenant in &config.tenants {
        keys.extend(budget_keys(
            &tenant_budget_prefix(&tenant.name),
            &validated(&tenant.budgets),
        ));
    }
    keys.iter().filter_map(BudgetKey::definition).collect()
}

/// Every budget a call of `model` by `tenant` is charged on: its caller's (the
/// tenant's, its key's), then the model's and the gateway's.
pub fn call_budgets<'a>(model: &'a ModelKeys, tenant: Option<&'a TenantKeys>) -> impl Iterator<Item = &'a BudgetKey> {
    tenant
        .into_iter()
        .flat_map(TenantKeys::usd_budgets)
        .chain(model.usd.iter())
}

/// What a call reserves on its budgets: its worst case on each at the
/// deployment's price, for a prompt charge of `input` and an output bound of
/// `output`. Nothing for a call that costs nothing at most (a free model: no
/// budget can be spent by it), nor on a $0 budget or without a price: admission
/// refuses those calls before reserving (`admission::admit`).
pub fn budget_requirements(
    model: &ModelKeys,
    tenant: Option<&TenantKeys>,
    input: u64,
    output: u64,
) -> Vec<Requirement> {
    let worst = worst_case(model.price.as_ref(), (input, output)).unwrap_or(0);
    if worst == 0 {
        return Vec::new();
    }
    (call_budgets(model, tenant).filter(|b| !b.is_zero()))
        .map(|b| Requirement {
            key: b.key.clone(),
            amount: worst,
        })
        .collect()
}

/// What a call's budgets are reconciled to: the billed cost of `usage` at the
/// deployment's price, on exactly the budgets [`budget_requirements`] reserved
/// for `reserved` (input, output).
pub fn budget_actuals(
    model: &ModelKeys,
    tenant: Option<&TenantKeys>,
    reserved: (u64, u64),
    usage: &Usage,
) -> Vec<Actual> {
    let Some(price) = model.price.as_ref() else {
        return Vec::new();
    };
    let billed = billed_micro_usd(price, &usage.priced());
    (budget_requirements(model, tenant, reserved.0, reserved.1).into_iter())
        .map(|r| Actual {
            key: r.key,
            actual_amount: billed,
        })
        .collect()
}

/// The caller's budgets a call reserved for `reserved` (input, output), back to
/// 0: the call failed over, and the deployment that serves it charges them.
pub fn caller_budget_releases(model: &ModelKeys, tenant: &TenantKeys, reserved: (u64, u64)) -> Vec<Actual> {
    let own: Vec<&LimitKey> = tenant.usd_budgets().map(|b| &b.key).collect();
    (budget_requirements(model, Some(tenant), reserved.0, reserved.1).into_iter())
        .filter(|r| own.contains(&&r.key))
        .map(|r| Actual {
            key: r.key,
            actual_amount: 0,
        })
        .collect()
}

/// What a call's budgets are charged for `usage` at the deployment's price, in
/// micro-dollars; `None` when the deployment has no price.
pub fn billed_of(model: &ModelKeys, usage: &Usage) -> Option<u64> {
    model
        .price
        .as_ref()
        .map(|price| billed_micro_usd(price, &usage.priced()))
}

/// The keys of a directory tenant's or key's `budgets` under `prefix`; budgets
/// the directory validated when they were written. One it would refuse now (a
/// record of an older rule) is logged and left out.
pub fn directory_budget_keys(prefix: &str, budgets: Option<&[BudgetConfig]>) -> Vec<BudgetKey> {
    let Some(budgets) = budgets else {
        return Vec::new();
    };
    match validate_budgets(budgets, &|f: &str| f.to_owned()) {
        Ok(budgets) => budget_keys(prefix, &budgets),
        Err((field, message)) => {
            tracing::error!(
                prefix,
                field,
                message,
                "gateway: a directory record's budget is invalid; left out"
            );
            Vec::new()
        }
    }
}

/// Whether `key` is a budget in money (`...:usd:<span>`).
pub fn is_budget_key(key: &str) -> bool {
    let mut parts = key.rsplit(':');
    let _span = parts.next();
    parts.next() == Some(USD_PART)
}

/// What a call reserves on each of its budgets at `price`: its worst case, the
/// prompt at the dearest prompt price and the output bound at the output
/// price, rounded up. `None` without a price: the call cannot be counted.
pub fn worst_case(price: Option<&ModelPrice>, (input, output): (u64, u64)) -> Option<u64> {
    let bound = CallBound {
        prompt_tokens: input,
        output_tokens_max: output,
    };
    price.map(|price| worst_case_micro_usd(price, &bound))
}

/// `micro_usd` as dollars with six decimals, as the remaining-budget header gives it.
pub fn dollars(micro_usd: u64) -> String {
    format!("{}.{:06}", micro_usd / MICRO_USD_PER_USD, micro_usd % MICRO_USD_PER_USD)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimiter::Period;

    #[test]
    fn budget_keys_are_named_by_owner_and_span() {
        let budgets = [
            Budget {
                micro_usd: 500_000_000,
                span: BudgetSpan::Period(Period::Month),
                alert_at: Vec::new(),
            },
            Budget {
                micro_usd: 0,
                span: BudgetSpan::WindowSeconds(3600),
                alert_at: Vec::new(),
            },
        ];
        let keys = budget_keys("tenant:acme:", &budgets);
        assert_eq!(keys[0].key.as_str(), "tenant:acme:usd:month");
        assert_eq!(keys[1].key.as_str(), "tenant:acme:usd:window3600");
        let month = keys[0].definition().unwrap();
        assert_eq!((month.capacity(), month.period()), (500_000_000, Some(Period::Month)));
        assert_eq!(month.overage(), ratelimiter::Overage::Debt);
        assert!(keys[1].is_zero() && keys[1].definition().is_none(), "$0 has no limit");
        assert!(is_budget_key("gateway:usd:window3600"));
        assert!(is_budget_key("model:gpt-4o:usd:day"));
        assert!(!is_budget_key("tenant:usd:llm:rpm"), "a tenant named usd");
        assert_eq!(dollars(1_234_567), "1.234567");
        assert_eq!(dollars(5), "0.000005");
    }
}
