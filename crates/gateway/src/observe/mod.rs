//! What an operator sees: the gateway's metrics per (model, tenant), per
//! (model, class) and per deployment, in the Prometheus text format, and the
//! console's views of each model and class right now; the budgets' alerts and
//! their webhook.

pub mod alert_webhook;
pub mod budget_alerts;
pub mod budget_watch;
pub mod class_metrics;
pub mod metrics;
pub mod status;
