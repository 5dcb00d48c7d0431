//! The TigerBeetle backend (distributed mode, spec §9): limits are TigerBeetle
//! accounts, reservations are linked chains of pending transfers with timeouts,
//! and the hot path never reads.
//!
//! - [`ids`]: the account model and the deterministic ids (ADR 0004).
//! - [`config`]: the `tigerbeetle:` settings.
//! - [`pool`]: client sessions and the bound on requests outstanding on them.
//! - [`submitter`]: micro-batching of many requests' chains (spec §9.6).
//! - [`backend`]: [`TigerBeetleBackend`], the [`ratelimiter::Backend`]; its
//!   reserve, complete and admin paths live in their own files.
//! - [`harness`]: a local cluster for tests, examples and benchmarks.

pub mod backend;
pub mod config;
pub mod denied_leases;
pub mod harness;
pub mod ids;
pub mod lease_cache;
pub mod pool;
pub mod submitter;

mod admin;
mod complete;
mod reserve;

pub use backend::{BackendOptions, TigerBeetleBackend};
pub use config::{ConfigFields, SubmitMode, TigerBeetleConfig};
pub use harness::LocalCluster;
