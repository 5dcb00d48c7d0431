//! `ratelimiterd`: the HTTP server of the `ratelimiter` library (docs/http-api.md;
//! configuration in README.md, "The server: `ratelimiterd`"). The binary is a thin `main`
//! over [`cli`] and [`server`].

#![warn(missing_docs)]

pub mod admin;
pub mod app;
pub mod auth;
pub mod backend;
pub mod body;
pub mod cli;
pub mod cli_directory;
pub mod client_tokens;
pub mod config;
pub mod connections;
pub mod decrease;
pub mod directory_api;
pub mod directory_body;
pub mod directory_setup;
pub mod echo;
pub mod error;
pub mod health;
pub mod lease;
pub mod logging;
pub mod metrics;
pub mod overload;
pub mod server;
pub mod shutdown;
pub mod snapshots;
pub mod state;
pub mod ui;
pub mod ui_history;
pub mod ui_query;
pub mod ui_view;
pub mod write_stall;

pub use app::app;
pub use config::Config;
pub use error::ApiError;
pub use server::{run, serve, start, ServeOptions, ServerError};
pub use state::AppState;
