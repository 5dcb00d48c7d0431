//! The limits a call reserves (docs/gateway.md, "Limits"): the keys the
//! configuration implies, what one call requires and completes on them, the
//! classes' ceilings over them, and the guard of a reservation until its call
//! owns it.

pub mod budget_key;
pub mod budgets;
pub mod classes;
pub mod key_sets;
pub mod keys;
pub mod reservation;

use crate::config::{GatewayConfig, GatewayConfigError};

pub use budget_key::{budget_keys, directory_budget_keys, AlertFractions, BudgetKey};
pub use budgets::{
    billed_of, call_budgets, caller_budget_releases, is_budget_key, model_budget_keys, GATEWAY_BUDGET_PREFIX,
    MODEL_BUDGET_PREFIX,
};
pub use classes::{ceiling_capacity, Classes, CLASS_HEADER};
pub use key_sets::{
    is_own_key, tenant_budget_prefix, KeyLimitKeys, ModelKeys, TenantKeys, KEY_LIMIT_PREFIX, OWN_KEY_PREFIXES,
    TENANT_LIMIT_PREFIX,
};
pub use keys::{
    actuals, concurrency_hold_seconds, definitions, definitions_without_ceilings, directory_key_definitions,
    directory_tenant_definitions, prompt_charge, requirements, CONCURRENCY_TIMEOUT_MARGIN_SECONDS,
};
pub use reservation::{
    denial_key, release_unused, reserve_guarded, run_if_ready, spawn_if_pending, CapacityFreed, Reservation, Reserved,
};

impl GatewayConfig {
    /// Checks every rule a parse cannot: the section's own shape
    /// ([`GatewayConfig::validate_schema`]), then that every limit the section
    /// implies, the classes' ceilings included, is a valid definition.
    pub fn validate(&self) -> Result<(), GatewayConfigError> {
        self.validate_schema()?;
        Classes::new(&self.classes)
            .ceiling_definitions(&definitions_without_ceilings(self))
            .map(|_| ())
            .map_err(|message| GatewayConfigError {
                entry: "classes".to_owned(),
                message,
            })
    }
}
