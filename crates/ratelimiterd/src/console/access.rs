//! Who may open the console, decided once from the configuration: the rule the
//! page's routes and the sampler both follow.
//!
//! A leaf: it reads the configuration and nothing else of the server, so the
//! server's state can hold the rule without importing the console that obeys it.

use crate::config::{parse_listen_addr, Config};

/// Who may open the console.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The admin token is configured: the endpoint requires it.
    AdminToken,
    /// No admin token, and the server listens on loopback only: open to local users.
    Loopback,
    /// No admin token on a non-loopback listener: not served.
    Off,
}

impl Access {
    /// The access `config` allows; logs a warning when the console is off.
    pub fn of(config: &Config) -> Self {
        if config.server.admin_token.is_some() {
            return Access::AdminToken;
        }
        let loopback = parse_listen_addr(&config.server.listen_addr).is_ok_and(|a| a.ip().is_loopback());
        if loopback {
            Access::Loopback
        } else {
            tracing::warn!(
                listen_addr = %config.server.listen_addr,
                "the console at /ui is off: the server listens beyond loopback and server.admin_token is not set"
            );
            Access::Off
        }
    }
}
