//! The gateway (docs/gateway.md): ratelimiterd speaks the OpenAI and Anthropic
//! APIs on a listener of its own. Every call is counted before it is sent,
//! reserved all or nothing through the `ratelimiter` library (so it holds on the
//! memory backend, on TigerBeetle and across a fleet), forwarded with its stream
//! untouched, and completed once with the provider's reported usage. The library
//! does not learn about HTTP providers.
//!
//! # Layout
//!
//! One folder per stage of a call, each importing only from the folders above it
//! in this list (`tests/layers.rs` keeps it so):
//!
//! - [`config`]: the `gateway:` section's serde types and its own checks; nothing else of the crate.
//! - [`counting`]: what a call can use at most: tokens, images, the model table, calibration.
//! - [`wire`]: the providers' APIs: endpoints, the request, OpenAI and Anthropic, SSE, usage, error shapes.
//! - [`limits`]: the keys, what a call requires and completes, classes' ceilings, the reservation guard.
//! - [`routing`]: a model's deployments and their state, the pool, the order, breaker, pause.
//! - [`observe`]: metrics, their Prometheus text, the console's views, the spend recorder.
//! - [`admission`]: the model entry, the per-call context, the fair queue, admit, tenant caps, the call's lease, its spend.
//! - [`proxy`]: building the gateway, the service, forwarding and failover, the answer, bodies, upstream client, headers, auth.

#![warn(missing_docs)]

pub mod admission;
pub mod config;
pub mod counting;
pub mod limits;
pub mod observe;
pub mod proxy;
pub mod routing;
pub mod wire;

pub use config::GatewayConfig;
pub use observe::{class_metrics, metrics};
pub use proxy::{router, Gateway};
