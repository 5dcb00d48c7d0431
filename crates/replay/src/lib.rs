//! Trace replay against a simulated LLM provider: the instrument that measures
//! whether a limiting strategy keeps the provider busy up to its limits and never
//! past them.
//!
//! A trace ([`trace`]) is replayed, time compressed, through a strategy
//! ([`strategy`]) against a simulated provider ([`sim`]) that enforces its own
//! limits; the run is summarized ([`summary`]) and plotted ([`plot`]).
//!
//! # Layout
//!
//! Imports point down this list (tests/layers.rs keeps it so):
//!
//! - [`sim`]: the provider simulator, also served alone by `provider-sim`; it
//!   imports nothing of the replay;
//! - [`names`], [`trace`], [`outcome`]: the provider and model names, the trace,
//!   a request's outcome;
//! - [`strategy`]: how a client decides when to send, each strategy built from
//!   options of its own; [`replayer`]: the trace's arrivals through a strategy;
//! - [`definitions`], [`server_process`]: the limits our strategies reserve
//!   against, and a `ratelimiterd` started for a run;
//! - [`summary`], [`record`], [`plot`]: what a run reports;
//! - [`cli`]: the command line, turned into the options above; [`run`]: one run.

#![warn(missing_docs)]

pub mod cli;
pub mod definitions;
pub mod names;
pub mod outcome;
pub mod plot;
pub mod record;
pub mod replayer;
pub mod run;
pub mod server_process;
pub mod sim;
pub mod strategy;
pub mod summary;
pub mod trace;

// The simulator's modules under the names they had before it had a folder: the
// gateway's tests and benchmarks reach the simulator through these paths.
pub use sim::{
    anthropic as sim_anthropic, cache as sim_cache, client as provider_client, control as sim_control, enforcement,
    openai as sim_openai, profile as sim_profile, prompt, server as provider_server, vision as sim_vision,
};

/// The ledger ([`sim::provider`]) with the provider's terms ([`sim::limits`]),
/// under the path the gateway's tests and benchmarks use.
pub mod provider {
    pub use crate::sim::limits::*;
    pub use crate::sim::provider::*;
}
