//! Budgets in money as configuration and the admin API write them (the
//! gateway's `budgets:` on a tenant, a key, a model or the whole gateway,
//! docs/gateway.md, "Budgets and spend"): each a limit in micro-dollars over a
//! calendar period in UTC or a rolling window.

use serde::{Deserialize, Serialize};

use super::MICRO_USD_PER_USD;
use crate::base::period::Period;
use crate::model::definition::WINDOW_SECONDS_MAX;

/// The largest budget accepted, in USD: far above any team's spend, so a value
/// above it is a typing mistake (digits added, cents for dollars) worth a clear
/// error rather than a budget that never binds.
pub const BUDGET_USD_MAX: f64 = 1_000_000_000.0;
/// The most thresholds of one budget's `alert_at`.
pub const ALERT_AT_MAX: usize = 10;
/// The most budgets on one tenant, key, model or the gateway: each is a limit
/// every call of theirs reserves, and a reservation holds at most 32 (with a
/// tenant's, its key's, the model's and the gateway's, 12 of them are budgets).
pub const BUDGETS_MAX: usize = 3;
/// The only currency budgets and prices are counted in: providers bill in USD.
pub const CURRENCY: &str = "USD";
/// How far from a whole number of micro-dollars a budget converted from decimal
/// USD may be and still be that number: `f64`'s error on up to six decimals.
const CONVERSION_TOLERANCE: f64 = 1e-3;

/// A number as configuration writes it (dollars, fractions), compared by its bits:
/// entries are compared for equality only, and are validated before any use.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Written(pub f64);

impl PartialEq for Written {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Written {}

/// One `budgets:` entry as written: `{usd: 500, period: month}` or
/// `{usd: 5, window_seconds: 3600}`, optionally with `alert_at`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BudgetConfig {
    /// The budget in USD (whole micro-dollars; a fraction of one is dropped,
    /// so the budget is never above what was written). 0 refuses every call.
    pub usd: Written,
    /// The currency, `USD` when given: the only one providers bill in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    /// `day`, `week` or `month`: a calendar period in UTC that resets at its boundary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<String>,
    /// A rolling window instead of a period, as every other limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_seconds: Option<u64>,
    /// Fractions of the budget (each in (0, 1]) whose crossing is reported once
    /// per period (docs/gateway.md, "Budgets and spend").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alert_at: Vec<Written>,
}

/// What a budget's spend is counted over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BudgetSpan {
    /// A calendar period in UTC: every hold ends at the period's end.
    Period(Period),
    /// A rolling window of this many seconds.
    WindowSeconds(u64),
}

impl BudgetSpan {
    /// The last part of the budget's limit key: `usd:month`, `usd:window3600`.
    pub fn key_suffix(self) -> String {
        match self {
            BudgetSpan::Period(period) => format!("usd:{period}"),
            BudgetSpan::WindowSeconds(seconds) => format!("usd:window{seconds}"),
        }
    }
}

/// A budget validated: its capacity in micro-dollars, its span and its alerts.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    /// The budget in micro-dollars; 0 refuses every call.
    pub micro_usd: u64,
    /// Its period or window.
    pub span: BudgetSpan,
    /// The fractions alerted at, ascending.
    pub alert_at: Vec<f64>,
}

impl BudgetConfig {
    /// The budget this entry describes, or the field that is wrong and why.
    pub fn validated(&self) -> Result<Budget, (&'static str, String)> {
        if let Some(currency) = &self.currency {
            if !currency.eq_ignore_ascii_case(CURRENCY) {
                return Err(("currency", format!("only {CURRENCY} is supported, got {currency:?}")));
            }
        }
        let micro_usd = micro_usd_of(self.usd.0).map_err(|m| ("usd", m))?;
        let span = match (&self.period, self.window_seconds) {
            (Some(_), Some(_)) => {
                return Err(("period", "give period or window_seconds, not both".to_owned()));
            }
            (None, None) => return Err(("period", "give period (day, week, month) or window_seconds".to_owned())),
            (Some(period), None) => BudgetSpan::Period(period_of(period)?),
            (None, Some(seconds)) if (1..=WINDOW_SECONDS_MAX).contains(&seconds) => BudgetSpan::WindowSeconds(seconds),
            (None, Some(seconds)) => {
                return Err((
                    "window_seconds",
                    format!("must be 1..={WINDOW_SECONDS_MAX}, got {seconds}"),
                ))
            }
        };
        Ok(Budget {
            micro_usd,
            span,
            alert_at: alert_fractions(&self.alert_at)?,
        })
    }
}

/// A `period` by its name.
fn period_of(name: &str) -> Result<Period, (&'static str, String)> {
    match name {
        "day" => Ok(Period::Day),
        "week" => Ok(Period::Week),
        "month" => Ok(Period::Month),
        other => Err((
            "period",
            format!("must be day, week or month (a calendar period in UTC), got {other:?}"),
        )),
    }
}

/// `usd` in whole micro-dollars, rounded down: refused when not finite, negative
/// or above [`BUDGET_USD_MAX`].
fn micro_usd_of(usd: f64) -> Result<u64, String> {
    if !usd.is_finite() || usd < 0.0 {
        return Err(format!("must be a finite number of USD, at least 0, got {usd}"));
    }
    if usd > BUDGET_USD_MAX {
        return Err(format!("must be at most {BUDGET_USD_MAX} USD, got {usd}"));
    }
    let scaled = usd * MICRO_USD_PER_USD as f64;
    let nearest = scaled.round();
    let micro = if (scaled - nearest).abs() <= CONVERSION_TOLERANCE {
        nearest
    } else {
        scaled.floor()
    };
    // In range: at most BUDGET_USD_MAX × 10^6 = 10^15.
    Ok(micro as u64)
}

/// The `alert_at` fractions, each finite in (0, 1], no two alike, ascending.
fn alert_fractions(written: &[Written]) -> Result<Vec<f64>, (&'static str, String)> {
    if written.len() > ALERT_AT_MAX {
        return Err(("alert_at", format!("at most {ALERT_AT_MAX} thresholds")));
    }
    let mut fractions: Vec<f64> = written.iter().map(|w| w.0).collect();
    if let Some(bad) = fractions.iter().find(|f| !(f.is_finite() && **f > 0.0 && **f <= 1.0)) {
        return Err((
            "alert_at",
            format!("each threshold is a fraction of the budget in (0, 1], got {bad}"),
        ));
    }
    fractions.sort_by(f64::total_cmp);
    if fractions.windows(2).any(|w| w[0] == w[1]) {
        return Err(("alert_at", "a threshold appears twice".to_owned()));
    }
    Ok(fractions)
}

/// Checks a list of budgets of one owner: each valid, at most [`BUDGETS_MAX`], no
/// two on the same span (they would share one limit key). `entry` names a field
/// of the list (`budgets[1].usd`).
pub fn validate_budgets(
    budgets: &[BudgetConfig],
    entry: &dyn Fn(&str) -> String,
) -> Result<Vec<Budget>, (String, String)> {
    if budgets.len() > BUDGETS_MAX {
        return Err((entry("budgets"), format!("at most {BUDGETS_MAX} budgets")));
    }
    let mut out: Vec<Budget> = Vec::with_capacity(budgets.len());
    for (i, budget) in budgets.iter().enumerate() {
        let valid = budget
            .validated()
            .map_err(|(field, message)| (entry(&format!("budgets[{i}].{field}")), message))?;
        if out.iter().any(|b| b.span == valid.span) {
            return Err((
                entry(&format!("budgets[{i}]")),
                "another budget has the same period or window (they would share one limit)".to_owned(),
            ));
        }
        out.push(valid);
    }
    Ok(out)
}
