//! Budget alerts (docs/gateway.md, "Budgets and spend"): a budget's `alert_at`
//! fractions, each reported once when its spend crosses it: once per budget and
//! calendar period (a new period arms them again), or, for a rolling window,
//! once until the spend falls back below it. Each crossing is one structured log
//! line and, with `gateway.alerts.webhook_url`, one event handed to the webhook
//! ([`crate::observe::alert_webhook`]), which never delays a call. On a fleet,
//! the watch ([`crate::observe::budget_watch`]) claims each crossing in the
//! cluster before it logs and posts it.
//!
//! The tracker reads time from the injected clock and knows nothing of how a
//! budget is enforced: the caller gives it a budget's reading after each
//! reconciliation.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ratelimiter::Clock;
use serde::Serialize;

/// The most budgets watched at once (whose crossings are remembered): each is
/// about 100 bytes, 100 MB at the bound; as many as the directory's keys at
/// most, so one alerted budget on every key of a full directory fits (only
/// budgets that a call was charged on and that set `alert_at` count). When it
/// is reached, the budgets
/// whose period ended (or whose window passed since their last reading) are
/// forgotten first, at most once per [`SWEEP_INTERVAL_MS`]; a budget still
/// beyond it is not alerted on: counted (`untracked`) and logged.
pub const BUDGETS_TRACKED_MAX: usize = 1_000_000;
/// The shortest time between two sweeps of the forgotten budgets: a sweep
/// reads every budget watched, so a tracker full of live budgets does not
/// sweep on every reading.
pub const SWEEP_INTERVAL_MS: u64 = 60_000;

/// What a budget is counted over, as the alert reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum AlertSpan {
    /// A calendar period in UTC (`day`, `week`, `month`) that started at this instant.
    Period {
        /// The period's name.
        period: String,
        /// Its start, Unix ms.
        period_start_unix_ms: u64,
    },
    /// A rolling window of this many seconds.
    Window {
        /// The window's length.
        window_seconds: u64,
    },
}

/// Whose budget it is: a tenant's, a model's (every tenant's calls of it), or the
/// whole gateway's (neither).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AlertScope {
    /// The tenant, for a tenant's or a key's budget.
    pub tenant: Option<String>,
    /// The model, for a model's budget.
    pub model: Option<String>,
}

/// One budget as it stands after a reconciliation.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetReading<'a> {
    /// The budget's limit key: what names it in alerts and in the tracker.
    pub key: &'a str,
    /// Whose it is.
    pub scope: &'a AlertScope,
    /// Its period or window.
    pub span: AlertSpan,
    /// Spent (and held by calls in flight) in the period or window, micro-USD.
    pub spent_micro_usd: u64,
    /// The budget, micro-USD.
    pub budget_micro_usd: u64,
    /// The fractions alerted at, ascending, each in (0, 1].
    pub alert_at: &'a [f64],
    /// After this instant, with no reading since, what the tracker remembers
    /// of the budget no longer matters: its period ended, or its window has
    /// passed since this reading.
    pub forgettable_after_unix_ms: u64,
}

/// One crossing: the structured log line's fields and the webhook's JSON body.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BudgetAlert {
    /// Always `budget_alert`: what a receiver dispatches on.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The budget's limit key.
    pub budget: String,
    /// Whose budget.
    #[serde(flatten)]
    pub scope: AlertScope,
    /// The fraction crossed.
    pub fraction: f64,
    /// Spent when it was crossed, micro-USD, and in USD.
    pub spent_micro_usd: u64,
    /// `spent_micro_usd` in USD, for reading.
    pub spent_usd: f64,
    /// The budget, micro-USD.
    pub budget_micro_usd: u64,
    /// `budget_micro_usd` in USD, for reading.
    pub budget_usd: f64,
    /// The period or window.
    #[serde(flatten)]
    pub span: AlertSpan,
    /// When it was crossed, Unix ms.
    pub at_unix_ms: u64,
}

/// What the tracker remembers of one budget.
#[derive(Debug, Clone, Copy)]
struct Crossed {
    /// The period the count is of (`None`: a rolling window).
    period_start_unix_ms: Option<u64>,
    /// How many of the budget's fractions are crossed.
    count: usize,
    /// The reading's [`BudgetReading::forgettable_after_unix_ms`].
    forgettable_after_unix_ms: u64,
}

/// The budgets watched, and when they were last swept.
#[derive(Debug, Default)]
struct Watched {
    crossed: HashMap<String, Crossed>,
    swept_unix_ms: Option<u64>,
}

impl Watched {
    /// Whether `key` has room: it is watched already, the bound is not
    /// reached, or a sweep (if one is due) made room.
    fn room_for(&mut self, key: &str, now_unix_ms: u64, budgets_max: usize) -> bool {
        if self.crossed.contains_key(key) || self.crossed.len() < budgets_max {
            return true;
        }
        let due = self
            .swept_unix_ms
            .is_none_or(|at| now_unix_ms >= at.saturating_add(SWEEP_INTERVAL_MS));
        if due {
            self.swept_unix_ms = Some(now_unix_ms);
            self.crossed.retain(|_, c| c.forgettable_after_unix_ms > now_unix_ms);
        }
        self.crossed.len() < budgets_max
    }
}

/// The budgets' crossings so far.
#[derive(Debug)]
pub struct BudgetAlerts {
    clock: Arc<dyn Clock>,
    watched: Mutex<Watched>,
    untracked: AtomicU64,
    /// [`BUDGETS_TRACKED_MAX`], but in tests of the bound.
    budgets_max: usize,
}

impl BudgetAlerts {
    /// A tracker reading time from `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            watched: Mutex::new(Watched::default()),
            untracked: AtomicU64::new(0),
            budgets_max: BUDGETS_TRACKED_MAX,
        }
    }

    /// A tracker watching `budgets_max` budgets at most: the bound's test.
    #[cfg(test)]
    fn with_budgets_max(clock: Arc<dyn Clock>, budgets_max: usize) -> Self {
        Self {
            budgets_max,
            ..Self::new(clock)
        }
    }

    /// The alerts `reading` raises: each fraction newly crossed, lowest first,
    /// for the caller to log ([`log`]) and post. Empty for a budget without
    /// `alert_at` or of 0.
    pub fn observe(&self, reading: &BudgetReading<'_>) -> Vec<BudgetAlert> {
        if reading.alert_at.is_empty() || reading.budget_micro_usd == 0 {
            return Vec::new();
        }
        let now = crossed_count(reading);
        let period_start = match &reading.span {
            AlertSpan::Period {
                period_start_unix_ms, ..
            } => Some(*period_start_unix_ms),
            AlertSpan::Window { .. } => None,
        };
        let at_unix_ms = self.clock.now_unix_ms();
        let fresh = Crossed {
            period_start_unix_ms: period_start,
            count: 0,
            forgettable_after_unix_ms: reading.forgettable_after_unix_ms,
        };
        let before = {
            let mut watched = self.watched.lock().expect("alerts lock");
            if !watched.room_for(reading.key, at_unix_ms, self.budgets_max) {
                let untracked = self.untracked.fetch_add(1, Ordering::Relaxed) + 1;
                if untracked.is_power_of_two() {
                    tracing::warn!(
                        budget = reading.key,
                        untracked,
                        limit = self.budgets_max,
                        "budget alerts: too many budgets watched; this one is not alerted on"
                    );
                }
                return Vec::new();
            }
            let entry = watched.crossed.entry(reading.key.to_owned()).or_insert(fresh);
            if entry.period_start_unix_ms != period_start {
                // A new period (or a budget changed between period and window): armed again.
                *entry = fresh;
            }
            entry.forgettable_after_unix_ms = reading.forgettable_after_unix_ms;
            let before = entry.count;
            entry.count = match period_start {
                // Once per period: a reconciliation that lowers the spend does not re-arm.
                Some(_) => before.max(now),
                // A rolling window: a fraction the spend falls below is armed again.
                None => now,
            };
            before
        };
        (before..now)
            .map(|i| alert(reading, reading.alert_at[i], at_unix_ms))
            .collect()
    }

    /// How many budgets are watched now.
    pub fn watched(&self) -> usize {
        self.watched.lock().expect("alerts lock").crossed.len()
    }

    /// Readings not tracked because [`BUDGETS_TRACKED_MAX`] budgets already are.
    pub fn untracked(&self) -> u64 {
        self.untracked.load(Ordering::Relaxed)
    }
}

/// How many of `reading`'s fractions its spend has reached: a fraction `f` is
/// reached at `ceil(f * budget)` micro-USD.
fn crossed_count(reading: &BudgetReading<'_>) -> usize {
    let budget = reading.budget_micro_usd as f64;
    (reading.alert_at.iter())
        .take_while(|f| reading.spent_micro_usd as f64 >= (**f * budget).ceil())
        .count()
}

fn alert(reading: &BudgetReading<'_>, fraction: f64, at_unix_ms: u64) -> BudgetAlert {
    let usd = |micro: u64| micro as f64 / 1e6;
    BudgetAlert {
        kind: "budget_alert",
        budget: reading.key.to_owned(),
        scope: reading.scope.clone(),
        fraction,
        spent_micro_usd: reading.spent_micro_usd,
        spent_usd: usd(reading.spent_micro_usd),
        budget_micro_usd: reading.budget_micro_usd,
        budget_usd: usd(reading.budget_micro_usd),
        span: reading.span.clone(),
        at_unix_ms,
    }
}

/// The structured log line of one crossing.
pub fn log(alert: &BudgetAlert) {
    let (period, period_start_unix_ms, window_seconds) = match &alert.span {
        AlertSpan::Period {
            period,
            period_start_unix_ms,
        } => (Some(period.as_str()), Some(*period_start_unix_ms), None),
        AlertSpan::Window { window_seconds } => (None, None, Some(*window_seconds)),
    };
    tracing::warn!(
        target: "gateway::budget_alert",
        budget = %alert.budget,
        tenant = alert.scope.tenant.as_deref(),
        model = alert.scope.model.as_deref(),
        fraction = alert.fraction,
        spent_usd = alert.spent_usd,
        budget_usd = alert.budget_usd,
        period,
        period_start_unix_ms,
        window_seconds,
        "budget alert: {:.0}% of {} spent",
        alert.fraction * 100.0,
        alert.budget
    );
}

#[cfg(test)]
#[path = "budget_alerts_tests.rs"]
mod tests;
