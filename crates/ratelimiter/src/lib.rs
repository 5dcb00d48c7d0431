//! Multi-dimensional rate limiting for LLM workloads.
//!
//! Callers reserve every limit a call needs (requests and tokens per minute, calls in
//! flight, tenant budgets) all or nothing, call the provider, then complete with the
//! tokens really used. See the workspace README and docs/README.md for the design.
//!
//! # In one process
//!
//! Define the provider's limits on a [`MemoryBackend`] and hand calls to a
//! [`scheduler::Scheduler`]: it reserves each call's requirements, runs the call
//! once they are granted, completes the lease with the tokens really used, and
//! never lets a saturated provider hold up calls to another. Over
//! `ratelimiterd`, use [`httpclient::HttpClient`] as the limiter instead of the
//! backend; nothing else changes.
//!
//! ```
//! use std::sync::Arc;
//! use ratelimiter::scheduler::{ExecuteError, Job, JobSpec, Scheduler};
//! use ratelimiter::{Backend, LimitDefinition, LimitKey, MemoryBackend, MemoryConfig, SystemClock};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let backend = Arc::new(MemoryBackend::new(Arc::new(SystemClock::new()), MemoryConfig::default()));
//! // The provider allows 500 requests and 30,000 tokens a minute and 50 calls at once: the
//! // limits are defined exactly as it documents them. The provider starts a request's window
//! // when the call reaches it, a moment after the grant; the backend holds each rolling
//! // reservation for the window plus a margin that covers that moment
//! // (`MemoryConfig::window_margin_ms`, BENCHMARKS.md, "Window margin").
//! let limits = [
//!     LimitDefinition::rolling(LimitKey::llm_rpm("openai", "gpt-4o")?, 500, 60)?,
//!     LimitDefinition::rolling(LimitKey::llm_tpm("openai", "gpt-4o")?, 30_000, 60)?,
//!     // A hold ends at Complete; the timeout only frees the holds of crashed callers.
//!     LimitDefinition::concurrency(LimitKey::llm_concurrency("openai", "gpt-4o")?, 50, 300)?,
//! ];
//! for limit in &limits {
//!     backend.apply_definition(limit).await?;
//! }
//! let scheduler = Scheduler::new(backend, 16);
//! let spec = JobSpec {
//!     job_id: "summary-1".to_owned(),
//!     tenant_id: "acme".to_owned(),
//!     provider: "openai".to_owned(),
//!     model: "gpt-4o".to_owned(),
//!     prompt: "Summarise the design in one line.".to_owned(),
//!     max_output_tokens: 200,
//!     // The provider's own count (tiktoken for OpenAI) when the caller has it; `None`
//!     // reserves one token per prompt byte, which is safe but four times too much.
//!     prompt_tokens: Some(8),
//!     want_daily_budget: false,
//!     // The work class (docs/client-library.md, "Classes"); `None` is the lowest.
//!     class: None,
//! };
//! let job = Job::new(spec, || async {
//!     // Call the provider here. Return the tokens it charged: prompt plus output as it
//!     // reports them, or, where it charges `max_tokens` at admission (OpenAI's
//!     // documented accounting), prompt plus `max_tokens`, so Complete does not free
//!     // capacity the provider still counts as used.
//!     Ok::<u64, ExecuteError>(8 + 23)
//! });
//! let done = scheduler.submit(job)?.await?;
//! assert_eq!(done.actual_tokens, 31);
//! scheduler.shutdown(std::future::ready(())).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Layout
//!
//! One folder per layer, each importing only from itself and the folders above
//! it in this list (`tests/layers.rs` keeps it so, with no circle of files and
//! no file over 700 lines); the modules keep their paths at the crate root:
//!
//! - `base`: primitives: [`clock`], [`id`], [`period`], [`metrics`], [`origin`], [`recent_ids`].
//! - `model`: the limit model: [`key`], [`owner`], [`wire`], [`bucket`], [`definition`], [`error`], [`decision`], [`registry`], [`retry`].
//! - `limiting`: the [`Limiter`] and [`Backend`] traits, the fleet's [`alert_claims`] and [`handed_ids`], runtime [`admin`].
//! - `provider`: the LLM helper [`llm`] and the provider profiles [`profile`].
//! - [`price`], [`spend`], [`directory`]: prices and budgets, the spend ledger, the gateway's tenants and keys.
//! - [`memory`]: the in-process backend.
//! - [`tigerbeetle`]: the distributed backend.
//! - `feedback`: learning from a provider's answers: [`provider_headers`], the [`pause`] after a 429.
//! - [`scheduler`]: calls reserved, run and completed with fairness between providers.
//! - `client`: the remote HTTP client (`httpclient`, feature `http-client`) and single-binary [`local`] mode.
//! - `testkit` (feature `testkit`): the backend behaviour suite.

#![warn(missing_docs)]

mod base;
mod client;
pub mod directory;
mod feedback;
mod limiting;
pub mod memory;
mod model;
pub mod price;
mod provider;
pub mod scheduler;
pub mod spend;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod tigerbeetle;

pub use base::{clock, id, metrics, origin, period, recent_ids};
#[cfg(feature = "http-client")]
pub use client::httpclient;
pub use client::local;
pub use feedback::{pause, provider_headers};
pub use limiting::{admin, alert_claims, handed_ids, limiter};
pub use model::{bucket, decision, definition, error, key, owner, registry, retry, wire};
pub use provider::{llm, profile};

pub use clock::{BootInstant, Clock, FakeClock, SystemClock, TokioClock};
pub use definition::{
    check_window_margin_ms, DefinitionError, DefinitionFields, LimitDefinition, LimitKind, LimitReport, LimitState,
    LimitStatus, Overage, WINDOW_MARGIN_MS_DEFAULT, WINDOW_MARGIN_MS_MAX, WINDOW_MARGIN_WINDOW_DIVISOR,
};
pub use error::LimiterError;
pub use id::{id128, LeaseId};
pub use key::LimitKey;
pub use limiter::{Backend, FleetServer, Limiter};
pub use memory::{MemoryBackend, MemoryConfig};
pub use owner::LeaseOwner;
pub use period::Period;
pub use retry::RetryPolicy;
pub use wire::{
    Actual, CompleteRequest, CompleteResponse, Denial, Requirement, ReserveOutcome, ReserveRequest, ReserveResponse,
};
