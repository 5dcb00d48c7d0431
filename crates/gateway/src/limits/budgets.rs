//! Budgets in money as limit keys (docs/gateway.md, "Budgets and spend"): each
//! budget is a limit in micro-dollars, reserved at a call's worst case at its
//! deployment's price in the same all-or-nothing reservation as the call's rate
//! limits, and reconciled at completion to what the provider bills.
//!
//! The keys, by owner (`<span>` is `day`, `week`, `month` or `window<seconds>`):
//! `tenant:<name>:usd:<span>`, `key:<id>:usd:<span>` (a directory key's own),
//! `model:<name>:usd:<span>` (every call of the model, all tenants together),
//! `gateway:usd:<span>` (every call).
//!
//! Here: the budgets the configuration defines and what a call's budgets
//! reserve and complete, over the key sets (`key_sets.rs`); one budget's key
//! is `budget_key.rs`, below both.

use ratelimiter::price::{billed_micro_usd, worst_case_micro_usd, CallBound, ModelPrice, MICRO_USD_PER_USD};
use ratelimiter::{Actual, LimitDefinition, LimitKey, Requirement};

use super::budget_key::{budget_keys, BudgetKey};
use super::key_sets::{tenant_budget_prefix, ModelKeys, TenantKeys};
use crate::config::{validate_budgets, Budget, BudgetConfig, GatewayConfig, ModelConfig};
use crate::wire::usage::Usage;

/// Whether a key is a budget in money: beside the budgets' other key functions,
/// and below them with the budget's definition ([`super::budget_key`]).
pub use super::budget_key::is_budget_key;

/// The start of a model's budget keys (`model:<name>:usd:<span>`): shared by
/// every caller of the model.
pub const MODEL_BUDGET_PREFIX: &str = "model:";
/// The start of the gateway's budget keys (`gateway:usd:<span>`).
pub const GATEWAY_BUDGET_PREFIX: &str = "gateway:";

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
/// 0: a try that did no work (refused, never sent) failed over, and the
/// deployment that serves the call charges them.
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

    #[test]
    fn budget_keys_are_told_by_their_usd_part_and_dollars_have_six_decimals() {
        assert!(is_budget_key("gateway:usd:window3600"));
        assert!(is_budget_key("model:gpt-4o:usd:day"));
        assert!(!is_budget_key("tenant:usd:llm:rpm"), "a tenant named usd");
        assert_eq!(dollars(1_234_567), "1.234567");
        assert_eq!(dollars(5), "0.000005");
    }
}
