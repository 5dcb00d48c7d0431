//! Where budget alerts are raised: after a call's reservation is reconciled,
//! each of its budgets that sets `alert_at` is read from the backend (spent and
//! held, against its capacity now) and given to the tracker
//! ([`crate::observe::budget_alerts`]); each crossing is logged and goes to the
//! webhook when one is configured. The reading runs in a task of its own: a
//! call never waits for it.
//!
//! The budgets watched are the ones calls are charged on, each with the
//! `alert_at` it had when the call was admitted: the configuration's, and the
//! directory's tenants' and keys' as the directory stands on this server (a
//! tenant or key created, changed or removed on any server of a fleet is
//! watched or not from its next call here on). The tracker bounds how many.
//!
//! On a fleet ([`BudgetWatch::with_claims`]) every server reads the same
//! budgets and may see the same crossing: each claims it in the cluster first,
//! and only the server whose claim is first logs and posts it. A claim the
//! cluster does not answer is alerted all the same: a duplicate rather than a
//! lost alert.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use ratelimiter::alert_claims::{AlertClaims, Crossing};
use ratelimiter::{Backend, Clock, LimitKey};

use super::alert_webhook::AlertWebhook;
use super::budget_alerts::{log, AlertScope, AlertSpan, BudgetAlert, BudgetAlerts, BudgetReading};
use crate::config::{BudgetSpan, GatewayConfig};
use crate::limits::AlertFractions;

/// One budget a call was charged on, with what its alerts need.
#[derive(Debug, Clone)]
pub struct WatchedBudget {
    /// Its limit key.
    pub key: LimitKey,
    /// Whose it is.
    pub scope: AlertScope,
    /// Its period or window.
    pub span: BudgetSpan,
    /// Its `alert_at`, never empty.
    pub alert_at: AlertFractions,
}

/// What the watch has done so far, beside the webhook's counts.
#[derive(Debug, Default)]
pub struct WatchCounts {
    /// Crossings this server alerted (logged, and handed to the webhook if any).
    pub raised: AtomicU64,
    /// Crossings another server of the fleet claimed first: not alerted here.
    pub duplicates_skipped: AtomicU64,
    /// Crossings whose claim the cluster did not answer: alerted all the same.
    pub claims_failed: AtomicU64,
}

/// The backend, the tracker, the webhook and, on a fleet, the claims.
pub struct BudgetWatch {
    backend: Arc<dyn Backend>,
    clock: Arc<dyn Clock>,
    alerts: BudgetAlerts,
    webhook: Option<AlertWebhook>,
    claims: OnceLock<Arc<dyn AlertClaims>>,
    counts: Arc<WatchCounts>,
}

impl std::fmt::Debug for BudgetWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BudgetWatch")
            .field("watched", &self.alerts.watched())
            .field("claims", &self.claims.get())
            .finish_non_exhaustive()
    }
}

impl BudgetWatch {
    /// The watch of a validated `config`'s gateway on `backend`. Starts the
    /// webhook's task when one is configured (on the current Tokio runtime).
    pub fn of(config: &GatewayConfig, backend: Arc<dyn Backend>, clock: Arc<dyn Clock>) -> Arc<Self> {
        let webhook = (config.alerts.webhook().expect("validated with the configuration")).map(AlertWebhook::start);
        Self::posting_to(webhook, backend, clock)
    }

    /// The watch on `backend` posting to `webhook`, if any.
    fn posting_to(webhook: Option<AlertWebhook>, backend: Arc<dyn Backend>, clock: Arc<dyn Clock>) -> Arc<Self> {
        Arc::new(Self {
            backend,
            alerts: BudgetAlerts::new(clock.clone()),
            clock,
            webhook,
            claims: OnceLock::new(),
            counts: Arc::new(WatchCounts::default()),
        })
    }

    /// This watch alerting only the crossings it claims first in `claims`
    /// (a fleet's cluster); set once, before any call is served.
    pub fn with_claims(&self, claims: Arc<dyn AlertClaims>) {
        assert!(self.claims.set(claims).is_ok(), "the claims are set once");
    }

    /// Reads `budgets` (just reconciled) in a task of its own and raises
    /// their crossings.
    pub fn after_reconcile(self: &Arc<Self>, budgets: Vec<WatchedBudget>) {
        let watch = Arc::clone(self);
        tokio::spawn(async move {
            for budget in budgets {
                watch.read(&budget).await;
            }
        });
    }

    /// The webhook, when one is configured.
    pub fn webhook(&self) -> Option<&AlertWebhook> {
        self.webhook.as_ref()
    }

    /// What the watch has done so far.
    pub fn counts(&self) -> &Arc<WatchCounts> {
        &self.counts
    }

    /// Appends the Prometheus text of the watch's counts to `out`.
    pub fn render(&self, out: &mut String) {
        self.counts.render(&self.alerts, out);
    }

    async fn read(&self, budget: &WatchedBudget) {
        let key = &budget.key;
        let report = match self.backend.limit_report(key).await {
            Ok(Some(report)) => report,
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(budget = key.as_str(), %error, "budget alerts: the budget cannot be read");
                return;
            }
        };
        let now_unix_ms = self.clock.now_unix_ms();
        let (span, forgettable_after_unix_ms) = match budget.span {
            BudgetSpan::Period(period) => (
                AlertSpan::Period {
                    period: period.to_string(),
                    period_start_unix_ms: period.start_unix_ms(now_unix_ms),
                },
                period.end_unix_ms(now_unix_ms),
            ),
            BudgetSpan::WindowSeconds(window_seconds) => (
                AlertSpan::Window { window_seconds },
                now_unix_ms.saturating_add(window_seconds.saturating_mul(1_000)),
            ),
        };
        let reading = BudgetReading {
            key: key.as_str(),
            scope: &budget.scope,
            span,
            spent_micro_usd: report.held_and_owed(),
            budget_micro_usd: report.state.definition().capacity(),
            alert_at: &budget.alert_at,
            forgettable_after_unix_ms,
        };
        for alert in self.alerts.observe(&reading) {
            if self.claimed(&alert).await {
                self.raise(alert);
            }
        }
    }

    /// Whether this server alerts `alert`: always alone; on a fleet, when its
    /// claim is first, or when the cluster does not answer.
    async fn claimed(&self, alert: &BudgetAlert) -> bool {
        let Some(claims) = self.claims.get() else {
            return true;
        };
        let crossing = Crossing {
            budget: &alert.budget,
            span_start_unix_ms: span_start_unix_ms(&alert.span, alert.at_unix_ms),
            fraction: alert.fraction,
        };
        match claims.claim(&crossing).await {
            Ok(true) => true,
            Ok(false) => {
                self.counts.duplicates_skipped.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(budget = %alert.budget, fraction = alert.fraction,
                    "budget alert: another server of the fleet alerted this crossing");
                false
            }
            Err(error) => {
                self.counts.claims_failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(budget = %alert.budget, fraction = alert.fraction, %error,
                    "budget alert: the fleet's claim did not answer; alerting (maybe twice)");
                true
            }
        }
    }

    fn raise(&self, alert: BudgetAlert) {
        self.counts.raised.fetch_add(1, Ordering::Relaxed);
        log(&alert);
        if let Some(webhook) = &self.webhook {
            webhook.send(alert);
        }
    }
}

/// The start of the span a crossing is claimed in: its calendar period's, or
/// for a rolling window, the window-long slot of the clock it fell in (so a
/// window's fraction is alerted at most once per slot by the fleet).
fn span_start_unix_ms(span: &AlertSpan, at_unix_ms: u64) -> u64 {
    match span {
        AlertSpan::Period {
            period_start_unix_ms, ..
        } => *period_start_unix_ms,
        AlertSpan::Window { window_seconds } => {
            let window_ms = window_seconds.saturating_mul(1_000).max(1);
            at_unix_ms - at_unix_ms % window_ms
        }
    }
}

impl WatchCounts {
    /// Appends the Prometheus text of the counts, and of the tracker's, to `out`.
    pub fn render(&self, alerts: &BudgetAlerts, out: &mut String) {
        use std::fmt::Write;
        let counts = [
            (
                "raised_total",
                "counter",
                "Budget alerts this server raised (logged, and posted if a webhook is set).",
                self.raised.load(Ordering::Relaxed),
            ),
            (
                "duplicates_skipped_total",
                "counter",
                "Budget alert crossings another server of the fleet claimed first.",
                self.duplicates_skipped.load(Ordering::Relaxed),
            ),
            (
                "claims_failed_total",
                "counter",
                "Budget alert claims the cluster did not answer (alerted all the same).",
                self.claims_failed.load(Ordering::Relaxed),
            ),
            (
                "untracked_total",
                "counter",
                "Budget readings not alerted on: too many budgets watched.",
                alerts.untracked(),
            ),
            (
                "watched",
                "gauge",
                "Budgets with alert_at whose crossings this server remembers.",
                alerts.watched() as u64,
            ),
        ];
        for (name, kind, help, value) in counts {
            let name = format!("ratelimiterd_gateway_budget_alerts_{name}");
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use ratelimiter::period::Period;
    use ratelimiter::{
        FakeClock, LeaseId, LimitDefinition, Limiter, LimiterError, MemoryBackend, MemoryConfig, Requirement,
        ReserveRequest,
    };

    use super::*;

    /// Claims answered in turn from a script; records each claim's identity.
    #[derive(Debug, Default)]
    struct Scripted {
        answers: Mutex<Vec<Result<bool, LimiterError>>>,
        claimed: Mutex<Vec<String>>,
    }

    #[async_trait::async_trait]
    impl AlertClaims for Scripted {
        async fn claim(&self, crossing: &Crossing<'_>) -> Result<bool, LimiterError> {
            self.claimed.lock().unwrap().push(crossing.identity());
            self.answers.lock().unwrap().remove(0)
        }
    }

    /// 2026-11-28 00:00 UTC plus a second.
    const NOW_MS: u64 = 1_795_824_001_000;

    #[tokio::test]
    async fn a_crossing_claimed_elsewhere_is_skipped_and_an_unanswered_claim_alerted() {
        let clock = Arc::new(FakeClock::new(NOW_MS));
        let backend = Arc::new(MemoryBackend::new(clock.clone(), MemoryConfig::default()));
        let key = LimitKey::new("key:k1:usd:day").unwrap();
        let definition = LimitDefinition::per_period(key.clone(), 1_000_000, Period::Day).unwrap();
        backend.apply_definition(&definition).await.unwrap();
        let hold = ReserveRequest::new(
            LeaseId::generate(),
            None,
            vec![Requirement {
                key: key.clone(),
                amount: 850_000,
            }],
        );
        assert!(backend.reserve(&hold.unwrap()).await.unwrap().is_allowed());
        let watch = BudgetWatch::posting_to(None, backend, clock);
        let claims = Arc::new(Scripted::default());
        // 0.5 was alerted by another server; the cluster does not answer for 0.8.
        *claims.answers.lock().unwrap() = vec![Ok(false), Err(LimiterError::Unavailable { retry_after_ms: 1 })];
        watch.with_claims(claims.clone());
        let budget = WatchedBudget {
            key,
            scope: AlertScope::default(),
            span: BudgetSpan::Period(Period::Day),
            alert_at: AlertFractions::new(&[0.5, 0.8, 1.0]),
        };
        watch.read(&budget).await;
        let counts = watch.counts();
        let count = |c: &AtomicU64| c.load(Ordering::Relaxed);
        assert_eq!(count(&counts.duplicates_skipped), 1);
        assert_eq!(count(&counts.claims_failed), 1);
        assert_eq!(count(&counts.raised), 1, "the unanswered claim is alerted");
        let day_start_ms = NOW_MS - 1_000;
        let expected: Vec<String> = [0.5, 0.8]
            .iter()
            .map(|&fraction| {
                let crossing = Crossing {
                    budget: "key:k1:usd:day",
                    span_start_unix_ms: day_start_ms,
                    fraction,
                };
                crossing.identity()
            })
            .collect();
        assert_eq!(*claims.claimed.lock().unwrap(), expected, "claimed by period start");
        // Read again: nothing new crossed, nothing claimed.
        watch.read(&budget).await;
        assert_eq!(claims.claimed.lock().unwrap().len(), 2);
    }

    #[test]
    fn a_rolling_window_is_claimed_per_window_long_slot() {
        let span = AlertSpan::Window { window_seconds: 60 };
        assert_eq!(span_start_unix_ms(&span, 125_000), 120_000);
        assert_eq!(span_start_unix_ms(&span, 179_999), 120_000);
        assert_eq!(span_start_unix_ms(&span, 180_000), 180_000);
    }
}
