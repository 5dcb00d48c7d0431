//! The limits a tenant or a key may set, checked the same way for both.

use super::DirectoryError;
use crate::price::budget::{validate_budgets, BudgetConfig};

/// The largest rate or budget a tenant or key may be given: far above any
/// provider's limit, low enough that a typo of many digits is refused.
pub const LIMIT_VALUE_MAX: u64 = 1_000_000_000_000_000;

/// Budgets in money a tenant or key may set: the configuration's rules.
pub(super) fn check_budgets(budgets: Option<&[BudgetConfig]>) -> Result<(), DirectoryError> {
    let Some(budgets) = budgets else { return Ok(()) };
    validate_budgets(budgets, &|f: &str| f.to_owned())
        .map(|_| ())
        .map_err(|(field, message)| DirectoryError::invalid(field, message))
}

/// A limit a tenant or key may set: 1..=[`LIMIT_VALUE_MAX`], or none.
pub(super) fn check_limit(field: &str, value: Option<u64>) -> Result<(), DirectoryError> {
    match value {
        Some(0) => Err(DirectoryError::invalid(
            field,
            "must be at least 1 (leave it out for no limit)",
        )),
        Some(v) if v > LIMIT_VALUE_MAX => Err(DirectoryError::invalid(
            field,
            format!("must be at most {LIMIT_VALUE_MAX}"),
        )),
        _ => Ok(()),
    }
}
