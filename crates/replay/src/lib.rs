//! Trace replay against a simulated LLM provider (issue 6): the instrument that
//! measures whether a limiting strategy keeps the provider busy up to its limits
//! and never past them.
//!
//! A trace ([`trace`]) is replayed, time compressed, through a strategy
//! ([`strategy`]) against a simulated provider ([`provider`], [`provider_server`])
//! that enforces its own limits; the run is summarized ([`summary`]) and plotted ([`plot`]).

#![warn(missing_docs)]

pub mod cli;
pub mod definitions;
pub mod enforcement;
pub mod outcome;
pub mod plot;
pub mod prompt;
pub mod provider;
pub mod provider_client;
pub mod provider_server;
pub mod record;
pub mod replayer;
pub mod run;
pub mod server_process;
pub mod sim_anthropic;
pub mod sim_cache;
pub mod sim_control;
pub mod sim_openai;
pub mod sim_profile;
pub mod sim_vision;
pub mod strategy;
pub mod summary;
pub mod trace;
