//! Where a call goes (docs/gateway.md, "Pools"): a model's deployments, each with
//! its state (breaker, this server's pause, counters), the order a call tries
//! them in, and the reservation of a call on the first that holds it.

pub mod breaker;
pub mod deployment;
pub mod order;
pub mod pause;
pub mod pool;
pub mod refusal;

pub use breaker::{Breaker, BreakerState, Pass};
pub use deployment::{Deployment, DeploymentState};
pub use pool::{Grant, Need, Pool};
pub use refusal::Refusal;
