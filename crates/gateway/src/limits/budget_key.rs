//! One budget in money as a limit key (docs/gateway.md, "Budgets and spend"):
//! its key, capacity, span and alert fractions, as the configuration and the
//! directory give them. A type module below the key sets that carry budgets and
//! the budgets' charges over those sets, so each takes it from below.

use std::sync::Arc;

use ratelimiter::{LimitDefinition, LimitKey, Overage};

use crate::config::{validate_budgets, Budget, BudgetConfig, BudgetSpan};

/// The part of a key that marks a budget in money: `...:usd:<span>`.
const USD_PART: &str = "usd";

/// The dimensions (a key's last part) that are budgets of tokens (a tenant's or
/// key's).
const TOKEN_BUDGET_DIMENSIONS: [&str; 1] = ["daily_tokens"];

/// Whether `key` is a budget in money (`...:usd:<span>`).
pub fn is_budget_key(key: &str) -> bool {
    let mut parts = key.rsplit(':');
    let _span = parts.next();
    parts.next() == Some(USD_PART)
}

/// `definition` as the gateway applies every budget, of tokens (`daily_tokens`)
/// or money (`...:usd:<span>`), whether the configuration, the directory or the
/// admin API gives it: it owes the billed usage it cannot hold (`overage: owe`),
/// refusing every call until the period or window that usage belongs to has
/// rolled past, so a bill that could not be bounded beforehand passes the budget
/// once, not call after call. `Err` gives back, unchanged, a definition whose
/// key names no budget.
pub fn as_budget(definition: LimitDefinition) -> Result<LimitDefinition, LimitDefinition> {
    let key = definition.key().as_str();
    let dimension = key.rsplit(':').next().unwrap_or("");
    if TOKEN_BUDGET_DIMENSIONS.contains(&dimension) || is_budget_key(key) {
        Ok(definition.with_overage(Overage::Owe))
    } else {
        Err(definition)
    }
}

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
    /// micro-dollars, owing what it cannot hold as every budget does ([`as_budget`]).
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
        Some(as_budget(definition).expect("a budget's key ends in usd:<span>"))
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
        assert_eq!(month.overage(), ratelimiter::Overage::Owe);
        assert!(keys[1].is_zero() && keys[1].definition().is_none(), "$0 has no limit");
    }
}
