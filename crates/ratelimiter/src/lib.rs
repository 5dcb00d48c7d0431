//! Multi-dimensional rate limiting for LLM workloads.
//!
//! Callers reserve every limit a call needs (requests and tokens per minute,
//! calls in flight, tenant budgets) all or nothing, call the provider, then
//! complete with the tokens really used. See the workspace README and
//! `../shared/spec/` for the design.

#![warn(missing_docs)]

pub mod clock;
pub mod definition;
pub mod error;
#[cfg(feature = "http-client")]
pub mod httpclient;
pub mod id;
pub mod key;
pub mod limiter;
pub mod llm;
pub mod local;
pub mod memory;
pub mod registry;
pub mod retry;
pub mod scheduler;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod wire;

pub use clock::{Clock, FakeClock, SystemClock, TokioClock};
pub use definition::{
    DefinitionError, DefinitionFields, LimitDefinition, LimitKind, LimitReport, LimitState, LimitStatus, Overage,
};
pub use error::LimiterError;
pub use id::{id128, LeaseId};
pub use key::LimitKey;
pub use limiter::{Backend, Limiter};
pub use memory::{MemoryBackend, MemoryConfig};
pub use retry::RetryPolicy;
pub use wire::{
    Actual, CompleteRequest, CompleteResponse, Denial, Requirement, ReserveOutcome, ReserveRequest, ReserveResponse,
};
