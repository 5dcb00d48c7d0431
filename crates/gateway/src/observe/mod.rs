//! What an operator sees: the gateway's metrics per (model, tenant), per
//! (model, class) and per deployment, each directory key's calls today, in the Prometheus text format, and the
//! console's views of each model and class right now.

pub mod class_metrics;
pub mod key_usage;
pub mod metrics;
pub mod status;
