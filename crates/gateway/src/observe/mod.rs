//! What an operator sees: the gateway's metrics per (model, tenant), per
//! (model, class) and per deployment, each directory key's calls today, in the Prometheus text format, and the
//! console's views of each model and class right now; the spend recorded in the
//! spend ledger, and the recorder that writes it off the calls' path; the
//! budgets' alerts and their webhook; the trace of each call, for OpenTelemetry.

pub mod alert_webhook;
mod bound_metrics;
pub mod budget_alerts;
pub mod budget_watch;
mod call_facts;
pub mod class_metrics;
pub mod genai_metrics;
pub mod key_usage;
pub mod metrics;
pub mod prometheus;
pub mod semconv;
mod span_handle;
pub mod spend_metrics;
pub mod spend_recorder;
pub mod status;
pub mod trace;
mod trace_context;
