//! `ratelimiterd`: the HTTP server of the `ratelimiter` library (docs/http-api.md;
//! configuration in docs/server.md, "Configuration"). The binary is a thin `main`
//! over [`cli`] and [`server`].
//!
//! The operator's console is the folder [`console`]; the server's state
//! ([`state`]) holds only its leaves (the access rule and the history), so the
//! console's routes import the state and never the other way (tests/layers.rs).

#![warn(missing_docs)]

pub mod admin;
pub mod allocator;
pub mod app;
pub mod auth;
pub mod backend;
pub mod body;
pub mod cli;
pub mod cli_directory;
pub mod cli_spend;
pub mod client_tokens;
pub mod config;
pub mod connection_table;
pub mod connections;
pub mod console;
pub mod decrease;
pub mod directory_api;
pub mod directory_body;
pub mod directory_setup;
pub mod echo;
pub mod error;
pub mod health;
pub mod key_limits;
pub mod lease;
pub mod logging;
pub mod metrics;
pub mod overload;
pub mod price_reload;
pub mod prices_api;
pub mod server;
pub mod shutdown;
pub mod signals;
pub mod snapshots;
pub mod spend_api;
pub mod state;
pub mod telemetry;
pub mod tenant_limits;
pub mod write_stall;

pub use app::app;
pub use config::Config;
pub use error::ApiError;
pub use server::{run, serve, start, ServeOptions, ServerError};
pub use state::AppState;
