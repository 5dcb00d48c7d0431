//! The `gateway:` section of the server's YAML (docs/gateway.md, "Configuration"):
//! upstreams, the models they serve with their limits, and the tenants that may call.
//!
//! Unknown keys are errors, like everywhere in the server's configuration: a
//! misspelt limit must not silently fall back to "unlimited".

mod alerts;
mod breaker;
mod budget;
mod classes;
mod deployment;
mod error;
mod headers;
mod model;
mod pool;
mod price;
mod section;
#[cfg(test)]
pub(crate) mod tests;
mod upstream;
mod validate;

pub use alerts::{
    AlertsConfig, WebhookSettings, ATTEMPTS_DEFAULT, ATTEMPTS_LIMIT, BACKOFF_FIRST_MS, BACKOFF_MAX_MS, QUEUE_DEFAULT,
    QUEUE_LIMIT, WEBHOOK_URL_BYTES_MAX,
};
pub use breaker::{BreakerConfig, FAILURES_DEFAULT, FAILURES_LIMIT, OPEN_MS_DEFAULT, OPEN_MS_LIMIT};
pub use budget::{
    validate_budgets, Budget, BudgetConfig, BudgetSpan, Written, ALERT_AT_MAX, BUDGETS_MAX, BUDGET_USD_MAX, CURRENCY,
};
#[cfg(test)]
pub(crate) use classes::tests::configs as class_configs;
pub use classes::{validate_classes, ClassConfig, Headroom, HEADROOM_PPM_ONE};
pub use deployment::{
    DeploymentConfig, DeploymentLimits, Ignored, Routing, UnknownFields, DEPLOYMENTS_MAX, PRIORITY_MAX, WEIGHT_MAX,
};
pub use error::GatewayConfigError;
pub use headers::check_forwardable;
pub use model::{key_model_name, Encoding, ModelConfig, TenantConfig};
pub use pool::{resolve, validate_formats, validate_shape, Resolved};
pub use price::{deployment_price, price_provider};
pub use section::{
    GatewayConfig, BODY_BYTES_MAX_DEFAULT, BODY_BYTES_MAX_LIMIT, CLIENT_BODY_TIMEOUT_MS_DEFAULT,
    CLIENT_HEADER_TIMEOUT_MS_DEFAULT, CLIENT_TIMEOUT_MS_LIMIT, CLIENT_WRITE_TIMEOUT_MS_DEFAULT, DAY_WINDOW_SECONDS,
    ENTRIES_MAX, FORWARD_HEADERS_MAX, MAX_WAIT_MS_LIMIT, MINUTE_WINDOW_SECONDS, TENANT_CAP_LIMIT,
    TENANT_CONNECTIONS_MAX_DEFAULT, TENANT_KEY_BYTES_MIN, TENANT_QUEUED_MAX_DEFAULT, UPSTREAM_TIMEOUT_MS_DEFAULT,
    UPSTREAM_TIMEOUT_MS_LIMIT,
};
pub use upstream::{default_base_url, UpstreamConfig, UpstreamKind};
