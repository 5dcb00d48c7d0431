//! The gateway (issue 18; docs/gateway.md): ratelimiterd speaks the OpenAI and
//! Anthropic APIs on a listener of its own. Every call is counted before it is
//! sent, reserved all or nothing through the `ratelimiter` library (so it holds
//! on the memory backend, on TigerBeetle and across a fleet), forwarded with its
//! stream untouched, and completed once with the provider's reported usage.
//!
//! One module per provider wire format ([`openai`], [`anthropic`]), token
//! counting ([`tokens`], with [`images`] sized by their provider's rule, the
//! per-model numbers in [`model_table`] and the byte bound calibrated to the
//! provider's reports in [`calibration`]), usage extraction ([`usage`], [`sse`]), the proxy
//! service ([`proxy`]), and a model's pool of deployments with its routing and
//! breakers ([`pool`], [`routing`], [`breaker`]). The library does not learn
//! about HTTP providers.

#![warn(missing_docs)]

pub mod anthropic;
pub mod auth;
pub mod breaker;
pub mod calibration;
pub mod call;
pub mod class_metrics;
pub mod classes;
pub mod config;
pub mod cooldown;
pub mod error;
pub mod headers;
pub mod images;
pub mod lease;
pub mod limits;
pub mod metrics;
pub mod model_table;
pub mod openai;
pub mod passthrough;
pub mod pool;
pub mod proxy;
pub mod queue;
pub mod routing;
pub mod sse;
pub mod status;
pub mod tenant_caps;
pub mod tokens;
pub mod upstream;
pub mod usage;
pub mod usage_scan;

pub use config::GatewayConfig;
pub use proxy::{router, Gateway};
