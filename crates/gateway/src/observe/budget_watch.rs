//! Where budget alerts are raised: after a call's reservation is reconciled, each
//! of its budgets that sets `alert_at` is read from the backend (spent and held,
//! against its capacity now) and given to the tracker
//! ([`crate::observe::budget_alerts`]); each crossing goes to the webhook when
//! one is configured. The reading runs in a task of its own: a call never waits
//! for it.

use std::collections::HashMap;
use std::sync::Arc;

use ratelimiter::{Backend, Clock, LimitKey};

use super::alert_webhook::AlertWebhook;
use super::budget_alerts::{AlertScope, AlertSpan, BudgetAlerts, BudgetReading};
use crate::config::{validate_budgets, BudgetConfig, BudgetSpan, GatewayConfig};
use crate::limits::budgets::{budget_keys, GATEWAY_BUDGET_PREFIX, MODEL_BUDGET_PREFIX};
use crate::limits::keys::tenant_budget_prefix;

/// One budget with `alert_at`: whose it is, its span, its fractions.
#[derive(Debug)]
struct Watched {
    scope: AlertScope,
    span: BudgetSpan,
    alert_at: Vec<f64>,
}

/// The budgets with `alert_at`, the tracker and the webhook.
pub struct BudgetWatch {
    backend: Arc<dyn Backend>,
    clock: Arc<dyn Clock>,
    watched: HashMap<LimitKey, Watched>,
    alerts: BudgetAlerts,
    webhook: Option<AlertWebhook>,
}

impl std::fmt::Debug for BudgetWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BudgetWatch")
            .field("watched", &self.watched)
            .finish_non_exhaustive()
    }
}

impl BudgetWatch {
    /// The watch of a validated `config`'s budgets on `backend`; `None` when no
    /// budget sets `alert_at`. Starts the webhook's task when one is configured
    /// (on the current Tokio runtime).
    pub fn of(config: &GatewayConfig, backend: Arc<dyn Backend>, clock: Arc<dyn Clock>) -> Option<Arc<Self>> {
        let mut watched = HashMap::new();
        let mut add = |prefix: String, budgets: &[BudgetConfig], scope: AlertScope| {
            let validated =
                validate_budgets(budgets, &|f: &str| f.to_owned()).expect("validated with the configuration");
            for (key, budget) in budget_keys(&prefix, &validated).into_iter().zip(validated) {
                if !budget.alert_at.is_empty() {
                    let scope = scope.clone();
                    watched.insert(
                        key.key,
                        Watched {
                            scope,
                            span: budget.span,
                            alert_at: budget.alert_at,
                        },
                    );
                }
            }
        };
        add(GATEWAY_BUDGET_PREFIX.to_owned(), &config.budgets, AlertScope::default());
        for model in &config.models {
            let scope = AlertScope {
                tenant: None,
                model: Some(model.name.clone()),
            };
            add(format!("{MODEL_BUDGET_PREFIX}{}:", model.name), &model.budgets, scope);
        }
        for tenant in &config.tenants {
            let scope = AlertScope {
                tenant: Some(tenant.name.clone()),
                model: None,
            };
            add(tenant_budget_prefix(&tenant.name), &tenant.budgets, scope);
        }
        if watched.is_empty() {
            return None;
        }
        let webhook = (config.alerts.webhook().expect("validated with the configuration")).map(AlertWebhook::start);
        Some(Arc::new(Self {
            backend,
            alerts: BudgetAlerts::new(clock.clone()),
            clock,
            watched,
            webhook,
        }))
    }

    /// Whether `key` is a budget with `alert_at`.
    pub fn watches(&self, key: &LimitKey) -> bool {
        self.watched.contains_key(key)
    }

    /// Reads `keys` (budgets just reconciled) in a task of its own and raises
    /// their crossings.
    pub fn after_reconcile(self: &Arc<Self>, keys: Vec<LimitKey>) {
        let watch = Arc::clone(self);
        tokio::spawn(async move {
            for key in keys {
                watch.read(&key).await;
            }
        });
    }

    /// The webhook, when one is configured.
    pub fn webhook(&self) -> Option<&AlertWebhook> {
        self.webhook.as_ref()
    }

    async fn read(&self, key: &LimitKey) {
        let Some(watched) = self.watched.get(key) else {
            return;
        };
        let report = match self.backend.limit_report(key).await {
            Ok(Some(report)) => report,
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(budget = key.as_str(), %error, "budget alerts: the budget cannot be read");
                return;
            }
        };
        let span = match watched.span {
            BudgetSpan::Period(period) => AlertSpan::Period {
                period: period.to_string(),
                period_start_unix_ms: period.start_unix_ms(self.clock.now_unix_ms()),
            },
            BudgetSpan::WindowSeconds(window_seconds) => AlertSpan::Window { window_seconds },
        };
        let reading = BudgetReading {
            key: key.as_str(),
            scope: &watched.scope,
            span,
            spent_micro_usd: report.in_use.saturating_add(report.debt),
            budget_micro_usd: report.state.definition().capacity(),
            alert_at: &watched.alert_at,
        };
        for alert in self.alerts.observe(&reading) {
            if let Some(webhook) = &self.webhook {
                webhook.send(alert);
            }
        }
    }
}
