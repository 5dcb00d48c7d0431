//! The `server:` section (docs/server.md, "Configuration"): how the
//! server listens, which backend holds the limits, who may call, and how it
//! protects itself (body, time, concurrency and connection limits).

use ratelimiter::origin::check_allowed_hosts;
use serde::Deserialize;

use super::checks::{check_range, parse_listen_addr};

/// The default listen address: loopback only, so a fresh server is not exposed.
pub const LISTEN_ADDR_DEFAULT: &str = "127.0.0.1:8080";
/// The default largest request body: a reserve of 32 requirements with 256-byte
/// keys is about 10 KiB, a definition with the longest description about 2 KiB.
pub const BODY_BYTES_MAX_DEFAULT: usize = 64 * 1024;
/// The largest body limit that may be configured: bodies are buffered in memory.
pub const BODY_BYTES_MAX_LIMIT: usize = 16 * 1024 * 1024;
/// The default time one request may take before the server answers 503.
pub const REQUEST_TIMEOUT_MS_DEFAULT: u64 = 5_000;
/// The longest request timeout that may be configured.
pub const REQUEST_TIMEOUT_MS_LIMIT: u64 = 600_000;
/// The default number of requests served at once; more are shed with a 503.
pub const CONCURRENT_REQUESTS_MAX_DEFAULT: usize = 4_096;
/// The largest concurrency that may be configured.
pub const CONCURRENT_REQUESTS_MAX_LIMIT: usize = 1_000_000;
/// The default time in-flight requests get to finish after a shutdown signal.
pub const SHUTDOWN_GRACE_MS_DEFAULT: u64 = 10_000;
/// The default most open connections: each costs a task and buffers, about
/// 10 KiB, so 10,000 is about 100 MiB at worst.
pub const CONNECTIONS_MAX_DEFAULT: usize = 10_000;
/// The largest connection limit that may be configured.
pub const CONNECTIONS_MAX_LIMIT: usize = 1_000_000;
/// The most client tokens: they are compared one by one on every request.
pub const CLIENT_TOKENS_MAX: usize = 64;
/// The shortest token accepted: shorter ones are guessable.
pub const TOKEN_BYTES_MIN: usize = 16;
/// The longest token accepted.
pub const TOKEN_BYTES_MAX: usize = 512;

/// Which backend holds the limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// In-process limits: one server, no dependency; live state kept across
    /// restarts by snapshots beside the registry (`memory.snapshot_interval_ms`).
    #[default]
    Memory,
    /// A TigerBeetle cluster: needs the `tigerbeetle` cargo feature.
    Tigerbeetle,
}

/// The `server:` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// `host:port`, or `:port` for every interface (docs/server.md,
    /// "Configuration").
    pub listen_addr: String,
    /// `memory` (default) or `tigerbeetle`.
    pub backend: BackendKind,
    /// When set, admin endpoints need `Authorization: Bearer <admin_token>`.
    pub admin_token: Option<String>,
    /// When non-empty, reserve and complete need `Authorization: Bearer <one of them>`;
    /// an entry may be scoped to key prefixes (`crate::client_tokens`).
    pub client_tokens: Vec<crate::client_tokens::ClientTokenConfig>,
    /// The largest request body; larger ones are answered 413.
    pub body_bytes_max: usize,
    /// The longest a request may take; slower ones are answered 503 (outcome unknown).
    pub request_timeout_ms: u64,
    /// Requests served at once; more are answered 503 at once (load shedding).
    pub concurrent_requests_max: usize,
    /// Connections open at once; at the cap a new connection closes the one
    /// idle the longest (crate::connections), or is closed when none is idle.
    pub connections_max: usize,
    /// How long a client has to send a request's headers, and how long a
    /// kept-alive connection may stay idle.
    pub client_header_timeout_ms: u64,
    /// How long a write to a client may stay blocked (it stopped reading its
    /// answers) before the connection is closed.
    pub client_write_timeout_ms: u64,
    /// Host names, besides IP addresses and `localhost`, that requests may
    /// name in `Host` while an endpoint needs no token (ratelimiter::origin).
    pub allowed_hosts: Vec<String>,
    /// After a shutdown signal, how long in-flight requests get before the server exits.
    pub shutdown_grace_ms: u64,
    /// Serves `POST /v1/echo`, a JSON echo used as the benchmark's reference. Off by default.
    pub echo_route: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen_addr: LISTEN_ADDR_DEFAULT.to_owned(),
            backend: BackendKind::Memory,
            admin_token: None,
            client_tokens: Vec::new(),
            body_bytes_max: BODY_BYTES_MAX_DEFAULT,
            request_timeout_ms: REQUEST_TIMEOUT_MS_DEFAULT,
            concurrent_requests_max: CONCURRENT_REQUESTS_MAX_DEFAULT,
            connections_max: CONNECTIONS_MAX_DEFAULT,
            client_header_timeout_ms: crate::connections::HEADER_READ_TIMEOUT_MS,
            client_write_timeout_ms: crate::connections::WRITE_STALL_TIMEOUT_MS,
            allowed_hosts: Vec::new(),
            shutdown_grace_ms: SHUTDOWN_GRACE_MS_DEFAULT,
            echo_route: false,
        }
    }
}

impl ServerConfig {
    /// Checks every entry of the section a parse cannot: ranges, the listen
    /// address, the tokens. The error is the first entry found wrong
    /// (`server.<field>`) and what is wrong with it.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let invalid = |entry: &str, message: String| (entry.to_owned(), message);
        parse_listen_addr(&self.listen_addr).map_err(|m| invalid("server.listen_addr", m))?;
        check_range(self.body_bytes_max as u64, 1024, BODY_BYTES_MAX_LIMIT as u64)
            .map_err(|m| invalid("server.body_bytes_max", m))?;
        check_range(self.request_timeout_ms, 1, REQUEST_TIMEOUT_MS_LIMIT)
            .map_err(|m| invalid("server.request_timeout_ms", m))?;
        check_range(
            self.concurrent_requests_max as u64,
            1,
            CONCURRENT_REQUESTS_MAX_LIMIT as u64,
        )
        .map_err(|m| invalid("server.concurrent_requests_max", m))?;
        check_range(self.shutdown_grace_ms, 0, REQUEST_TIMEOUT_MS_LIMIT)
            .map_err(|m| invalid("server.shutdown_grace_ms", m))?;
        check_range(self.client_header_timeout_ms, 1, REQUEST_TIMEOUT_MS_LIMIT)
            .map_err(|m| invalid("server.client_header_timeout_ms", m))?;
        check_range(self.client_write_timeout_ms, 1, REQUEST_TIMEOUT_MS_LIMIT)
            .map_err(|m| invalid("server.client_write_timeout_ms", m))?;
        check_allowed_hosts(&self.allowed_hosts).map_err(|m| invalid("server.allowed_hosts", m))?;
        if let Some(token) = &self.admin_token {
            check_token(token).map_err(|m| invalid("server.admin_token", m))?;
        }
        if self.client_tokens.len() > CLIENT_TOKENS_MAX {
            return Err(invalid(
                "server.client_tokens",
                format!("at most {CLIENT_TOKENS_MAX} tokens, got {}", self.client_tokens.len()),
            ));
        }
        for (i, entry) in self.client_tokens.iter().enumerate() {
            let entry_name = format!("server.client_tokens[{i}]");
            let (token, _) = entry.resolve().map_err(|m| invalid(&entry_name, m))?;
            check_token(&token).map_err(|m| invalid(&entry_name, m))?;
        }
        Ok(())
    }
}

/// A bearer token's rules: long enough not to be guessed, short enough to be
/// compared on every request, and printable, so that it fits in a header.
fn check_token(token: &str) -> Result<(), String> {
    if !(TOKEN_BYTES_MIN..=TOKEN_BYTES_MAX).contains(&token.len()) {
        return Err(format!(
            "a token must be {TOKEN_BYTES_MIN}..={TOKEN_BYTES_MAX} bytes, got {}",
            token.len()
        ));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("a token must be printable ASCII without spaces".to_owned());
    }
    Ok(())
}
