//! The server's configuration: the YAML of README.md, "The server: `ratelimiterd`", plus
//! what the server needs to run safely (request limits, tokens, decrease timing, retry
//! hints).
//!
//! Every section and field is optional and has a documented default, so
//! `ratelimiterd` without `--config` serves the memory backend on `127.0.0.1:8080`.
//! Unknown keys are errors: a misspelt limit must not silently fall back to a default.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use ratelimiter::retry::RetryPolicy;
use serde::Deserialize;

/// The default listen address: loopback only, so a fresh server is not exposed.
pub const LISTEN_ADDR_DEFAULT: &str = "127.0.0.1:8080";
/// The default registry file (docs/decisions.md, "Registry file").
pub const REGISTRY_PATH_DEFAULT: &str = "./data/limits.json";
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
/// The retry hint of `limit_decreasing:<key>` denials (docs/retry-hints.md, "Decrease
/// hints").
pub const DECREASE_RETRY_MS_DEFAULT: u64 = 10_000;
/// How often pending decreases are checked by default.
pub const DECREASE_CHECK_INTERVAL_MS_DEFAULT: u64 = 1_000;
/// The longest decrease check interval and decrease retry that may be configured: one hour.
pub const DECREASE_MS_LIMIT: u64 = 3_600_000;
/// The most client tokens: they are compared one by one on every request.
pub const CLIENT_TOKENS_MAX: usize = 64;
/// The shortest token accepted: shorter ones are guessable.
pub const TOKEN_BYTES_MIN: usize = 16;
/// The longest token accepted.
pub const TOKEN_BYTES_MAX: usize = 512;
/// The largest configuration file read.
pub const CONFIG_FILE_BYTES_MAX: u64 = 1024 * 1024;

/// Why the configuration cannot be used. Every message names the file and the entry.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("config {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The file is not valid YAML for this schema (unknown key, wrong type).
    #[error("config {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, which names the entry and line.
        message: String,
    },
    /// An entry has a value out of its range.
    #[error("config {path}: {entry}: {message}")]
    Invalid {
        /// The file, or `<defaults>` without `--config`.
        path: PathBuf,
        /// The entry, such as `server.listen_addr`.
        entry: String,
        /// What is wrong.
        message: String,
    },
}

/// The whole configuration file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// How the server listens and protects itself.
    pub server: ServerConfig,
    /// Where limit definitions are persisted.
    pub registry: RegistryConfig,
    /// The TigerBeetle cluster, used when `server.backend` is `tigerbeetle`.
    pub tigerbeetle: ratelimiter::tigerbeetle::ConfigFields,
    /// Retry hints for denials (docs/retry-hints.md).
    pub retry_policy: RetryPolicy,
    /// Capacity decreases (docs/decisions.md, "Capacity decreases").
    pub decrease: DecreaseConfig,
    /// What definitions that leave a field out get (the window margin).
    pub defaults: DefinitionDefaults,
    /// Bounds of the memory backend.
    pub memory: MemorySection,
    /// Log output.
    pub log: LogConfig,
    /// The OpenAI/Anthropic gateway on a listener of its own (docs/gateway.md);
    /// absent: no gateway.
    pub gateway: Option<gateway::GatewayConfig>,
    /// Provider profiles (docs/provider-profiles.md): each entry's published limits
    /// become the definitions of its provider's profile, applied at startup.
    pub profiles: Vec<ProfileEntry>,
    /// The file it was read from, if any: where the gateway's prices are
    /// read again at runtime (docs/gateway.md, "Prices").
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

/// The most `profiles:` entries: one per model a deployment calls is a few dozen.
pub const PROFILES_MAX: usize = 256;

/// One `profiles:` entry: a provider's published limits for one model.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileEntry {
    /// `openai`, `azure`, `anthropic`, `gemini` or `bedrock`.
    pub provider: String,
    /// The model, as in the keys (`global:llm:<provider>:<model>:...`).
    pub model: String,
    /// The numbers the provider publishes (`rpm`, `tpm`, `input_tpm`, `output_tpm`, `rpd`, ...).
    pub limits: ratelimiter::profile::Published,
}

impl ProfileEntry {
    /// The profile's definitions and rules.
    pub fn profile(&self) -> Result<ratelimiter::profile::LlmProfile, ratelimiter::profile::ProfileError> {
        ratelimiter::profile::llm_profile(&self.provider, &self.model, &self.limits)
    }
}

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
    /// `host:port`, or `:port` for every interface (README.md, "The server:
    /// `ratelimiterd`").
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

/// The `registry:` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RegistryConfig {
    /// The JSON file holding every limit state.
    pub path: PathBuf,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            path: PathBuf::from(REGISTRY_PATH_DEFAULT),
        }
    }
}

/// The `decrease:` section: how capacity decreases are carried out.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DecreaseConfig {
    /// The retry hint of `limit_decreasing:<key>` denials.
    pub retry_ms: u64,
    /// How often the server tries to carry out pending decreases.
    pub check_interval_ms: u64,
}

impl Default for DecreaseConfig {
    fn default() -> Self {
        Self {
            retry_ms: DECREASE_RETRY_MS_DEFAULT,
            check_interval_ms: DECREASE_CHECK_INTERVAL_MS_DEFAULT,
        }
    }
}

/// The `defaults:` section: what applies to definitions that leave a field out.
/// Applied when reservations are made, not written into definitions, so a
/// change here reaches every such limit at the next restart.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DefinitionDefaults {
    /// How long, in ms, rolling reservations of definitions without
    /// `window_margin_ms` are held beyond their window: the provider's window
    /// starts when the call reaches it, after the grant
    /// (0..=[`ratelimiter::WINDOW_MARGIN_MS_MAX`]).
    pub window_margin_ms: u64,
}

impl Default for DefinitionDefaults {
    fn default() -> Self {
        Self {
            window_margin_ms: ratelimiter::WINDOW_MARGIN_MS_DEFAULT,
        }
    }
}

/// The `memory:` section: the memory backend's bounds.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemorySection {
    /// Live leases kept for reconciliation; a lease is never pushed out while
    /// a hold of it is in force (ratelimiter::MemoryConfig::leases_max).
    pub leases_max: usize,
    /// The share of `leases_max` one client token may hold, in percent
    /// (1..=100); beyond it its reserves are answered 429 `too_many_leases`.
    pub lease_share_percent: u8,
    /// Settled (completed or evicted) lease ids remembered so that a retry of
    /// their reserve is answered allowed at the original time, reserving nothing;
    /// about 53 bytes each, allocated at startup.
    pub settled_leases_max: usize,
    /// Denied lease ids remembered so that a retry with one stays denied.
    pub failed_leases_max: usize,
    /// How often the live state (units held, leases, settled and denied ids)
    /// is saved beside the registry, so a SIGKILL loses at most the grants of
    /// the last interval; 0 saves only on a graceful stop. Otherwise
    /// [`SNAPSHOT_INTERVAL_MS_MIN`]..=[`SNAPSHOT_INTERVAL_MS_LIMIT`].
    pub snapshot_interval_ms: u64,
    /// What a start does when the snapshot file is damaged.
    pub damaged_snapshot: DamagedSnapshotPolicy,
}

/// What the server does at start when its memory snapshot is damaged
/// (unreadable as a whole snapshot: torn, flipped bits, another format).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DamagedSnapshotPolicy {
    /// Move the file aside as `<file>.damaged-<unix ms>`, log an error naming
    /// both, count it in `ratelimiterd_memory_snapshot_damaged_total`, and
    /// serve with nothing held: availability first, since the provider's own
    /// limits still bound the over-admission (README, "Restarts").
    #[default]
    StartFresh,
    /// Refuse to start, naming the file and the two ways on: for deployments
    /// where forgetting a window of spend (a daily budget) is worse than an outage.
    Refuse,
}

/// How often the memory backend's live state is saved by default: a SIGKILL
/// then loses at most a second of grants, and a snapshot of 100,000 live
/// leases pauses reserves for a few ms (BENCHMARKS.md, "Memory snapshots").
pub const SNAPSHOT_INTERVAL_MS_DEFAULT: u64 = 1_000;
/// The shortest snapshot interval (besides 0, off): each snapshot copies the
/// whole live state under the lock, so shorter intervals would spend a large
/// share of the lock on copies at 100,000 live leases.
pub const SNAPSHOT_INTERVAL_MS_MIN: u64 = 100;
/// The longest snapshot interval: an hour of grants is the most a SIGKILL may lose.
pub const SNAPSHOT_INTERVAL_MS_LIMIT: u64 = 3_600_000;

/// The most leases, settled or failed lease ids that may be configured: at most
/// about 200 bytes each, so at most a few GiB.
pub const MEMORY_ENTRIES_MAX_LIMIT: usize = 20_000_000;

impl Default for MemorySection {
    fn default() -> Self {
        Self {
            leases_max: ratelimiter::memory::LEASES_MAX_DEFAULT,
            lease_share_percent: ratelimiter::memory::LEASE_SHARE_PERCENT_DEFAULT,
            settled_leases_max: ratelimiter::memory::SETTLED_LEASES_MAX_DEFAULT,
            failed_leases_max: ratelimiter::memory::FAILED_LEASES_MAX_DEFAULT,
            snapshot_interval_ms: SNAPSHOT_INTERVAL_MS_DEFAULT,
            damaged_snapshot: DamagedSnapshotPolicy::StartFresh,
        }
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// The `log:` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `text` or `json`.
    pub format: LogFormat,
    /// A tracing filter such as `info` or `ratelimiterd=debug`; `RUST_LOG` overrides it.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".to_owned(),
        }
    }
}

impl Config {
    /// Reads and validates the file at `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let io = |source| ConfigError::Io {
            path: path.to_owned(),
            source,
        };
        let size = std::fs::metadata(path).map_err(io)?.len();
        if size > CONFIG_FILE_BYTES_MAX {
            return Err(ConfigError::Parse {
                path: path.to_owned(),
                message: format!("file is larger than {CONFIG_FILE_BYTES_MAX} bytes"),
            });
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        let mut config = Self::parse(&text, path)?;
        config.source = Some(path.to_owned());
        Ok(config)
    }

    /// Parses and validates YAML text; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        // An empty file is an empty mapping: every default.
        let config: Config = if text.trim().is_empty() {
            Config::default()
        } else {
            serde_yaml::from_str(text).map_err(|e| ConfigError::Parse {
                path: path.to_owned(),
                message: e.to_string(),
            })?
        };
        config.validate(path)?;
        Ok(config)
    }

    /// The built-in configuration used without `--config`.
    pub fn defaults() -> Self {
        let config = Config::default();
        config
            .validate(Path::new("<defaults>"))
            .expect("the defaults are valid");
        config
    }

    /// The listen address, parsed (validated by [`Config::parse`]).
    pub fn listen_addr(&self) -> SocketAddr {
        parse_listen_addr(&self.server.listen_addr).expect("validated at load")
    }

    fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |entry: &str, message: String| ConfigError::Invalid {
            path: path.to_owned(),
            entry: entry.to_owned(),
            message,
        };
        let s = &self.server;
        parse_listen_addr(&s.listen_addr).map_err(|m| invalid("server.listen_addr", m))?;
        check_range(s.body_bytes_max as u64, 1024, BODY_BYTES_MAX_LIMIT as u64)
            .map_err(|m| invalid("server.body_bytes_max", m))?;
        check_range(s.request_timeout_ms, 1, REQUEST_TIMEOUT_MS_LIMIT)
            .map_err(|m| invalid("server.request_timeout_ms", m))?;
        check_range(
            s.concurrent_requests_max as u64,
            1,
            CONCURRENT_REQUESTS_MAX_LIMIT as u64,
        )
        .map_err(|m| invalid("server.concurrent_requests_max", m))?;
        check_range(s.shutdown_grace_ms, 0, REQUEST_TIMEOUT_MS_LIMIT)
            .map_err(|m| invalid("server.shutdown_grace_ms", m))?;
        check_range(s.client_header_timeout_ms, 1, REQUEST_TIMEOUT_MS_LIMIT)
            .map_err(|m| invalid("server.client_header_timeout_ms", m))?;
        check_range(s.client_write_timeout_ms, 1, REQUEST_TIMEOUT_MS_LIMIT)
            .map_err(|m| invalid("server.client_write_timeout_ms", m))?;
        ratelimiter::origin::check_allowed_hosts(&s.allowed_hosts).map_err(|m| invalid("server.allowed_hosts", m))?;
        if let Some(token) = &s.admin_token {
            check_token(token).map_err(|m| invalid("server.admin_token", m))?;
        }
        if s.client_tokens.len() > CLIENT_TOKENS_MAX {
            return Err(invalid(
                "server.client_tokens",
                format!("at most {CLIENT_TOKENS_MAX} tokens, got {}", s.client_tokens.len()),
            ));
        }
        for (i, entry) in s.client_tokens.iter().enumerate() {
            let entry_name = format!("server.client_tokens[{i}]");
            let (token, _) = entry.resolve().map_err(|m| invalid(&entry_name, m))?;
            check_token(&token).map_err(|m| invalid(&entry_name, m))?;
        }
        if self.registry.path.as_os_str().is_empty() {
            return Err(invalid("registry.path", "must not be empty".to_owned()));
        }
        check_range(self.decrease.retry_ms, 1, DECREASE_MS_LIMIT).map_err(|m| invalid("decrease.retry_ms", m))?;
        check_range(self.decrease.check_interval_ms, 1, DECREASE_MS_LIMIT)
            .map_err(|m| invalid("decrease.check_interval_ms", m))?;
        ratelimiter::check_window_margin_ms(self.defaults.window_margin_ms, 0)
            .map_err(|m| invalid("defaults.window_margin_ms", m))?;
        check_range(self.memory.leases_max as u64, 1, MEMORY_ENTRIES_MAX_LIMIT as u64)
            .map_err(|m| invalid("memory.leases_max", m))?;
        check_range(self.memory.lease_share_percent.into(), 1, 100)
            .map_err(|m| invalid("memory.lease_share_percent", m))?;
        let settled_max = MEMORY_ENTRIES_MAX_LIMIT.min(ratelimiter::memory::SETTLED_LEASES_MAX_LIMIT);
        check_range(self.memory.settled_leases_max as u64, 2, settled_max as u64)
            .map_err(|m| invalid("memory.settled_leases_max", m))?;
        check_range(self.memory.failed_leases_max as u64, 1, MEMORY_ENTRIES_MAX_LIMIT as u64)
            .map_err(|m| invalid("memory.failed_leases_max", m))?;
        if self.memory.snapshot_interval_ms != 0 {
            check_range(
                self.memory.snapshot_interval_ms,
                SNAPSHOT_INTERVAL_MS_MIN,
                SNAPSHOT_INTERVAL_MS_LIMIT,
            )
            .map_err(|m| invalid("memory.snapshot_interval_ms", format!("0 (off) or {m}")))?;
        }
        self.validate_tigerbeetle(path)?;
        if let Some(gateway) = &self.gateway {
            parse_listen_addr(&gateway.listen_addr).map_err(|m| invalid("gateway.listen_addr", m))?;
            gateway
                .validate()
                .map_err(|e| invalid(&format!("gateway.{}", e.entry), e.message))?;
        }
        if self.profiles.len() > PROFILES_MAX {
            return Err(invalid("profiles", format!("at most {PROFILES_MAX} entries")));
        }
        for (i, entry) in self.profiles.iter().enumerate() {
            entry
                .profile()
                .map_err(|e| invalid(&format!("profiles[{i}]"), e.to_string()))?;
        }
        self.log
            .level
            .parse::<tracing_subscriber::EnvFilter>()
            .map_err(|e| invalid("log.level", e.to_string()))?;
        Ok(())
    }

    fn validate_tigerbeetle(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |entry: &str, message: String| ConfigError::Invalid {
            path: path.to_owned(),
            entry: entry.to_owned(),
            message,
        };
        // The backend's own validation, so the block means the same in every build.
        ratelimiter::tigerbeetle::TigerBeetleConfig::new(self.tigerbeetle.clone())
            .map_err(|e| invalid(&format!("tigerbeetle.{}", e.field), e.message))?;
        if self.server.backend == BackendKind::Tigerbeetle && !cfg!(feature = "tigerbeetle") {
            return Err(invalid(
                "server.backend",
                "\"tigerbeetle\" needs a ratelimiterd built with `--features tigerbeetle`".to_owned(),
            ));
        }
        Ok(())
    }
}

fn check_range(value: u64, min: u64, max: u64) -> Result<(), String> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(format!("must be {min}..={max}, got {value}"))
    }
}

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

/// Parses `host:port`, `[v6]:port` or `:port` (every interface).
pub fn parse_listen_addr(text: &str) -> Result<SocketAddr, String> {
    let full = match text.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => text.to_owned(),
    };
    full.parse::<SocketAddr>()
        .map_err(|_| format!("{text:?} is not host:port, [v6]:port or :port with a numeric host"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, Path::new("/etc/rl.yaml")).map_err(|e| e.to_string())
    }

    #[test]
    fn an_empty_file_is_the_defaults() {
        let config = parse("").unwrap();
        assert_eq!(config.listen_addr(), "127.0.0.1:8080".parse().unwrap());
        assert_eq!(config.registry.path, PathBuf::from("./data/limits.json"));
        assert_eq!(config.decrease.retry_ms, 10_000);
        assert_eq!(config.defaults.window_margin_ms, ratelimiter::WINDOW_MARGIN_MS_DEFAULT);
        assert_eq!(
            parse("defaults:\n  window_margin_ms: 0\n")
                .unwrap()
                .defaults
                .window_margin_ms,
            0
        );
        assert_eq!(config.server.backend, BackendKind::Memory);
        assert!(!config.server.echo_route);
        assert_eq!(config.memory.snapshot_interval_ms, SNAPSHOT_INTERVAL_MS_DEFAULT);
        assert_eq!(config.memory.damaged_snapshot, DamagedSnapshotPolicy::StartFresh);
    }

    #[test]
    fn snapshots_can_be_periodic_or_only_at_a_graceful_stop() {
        let config = parse("memory:\n  snapshot_interval_ms: 0\n  damaged_snapshot: refuse\n").unwrap();
        assert_eq!(config.memory.snapshot_interval_ms, 0);
        assert_eq!(config.memory.damaged_snapshot, DamagedSnapshotPolicy::Refuse);
        assert!(parse("memory:\n  damaged_snapshot: ignore\n")
            .unwrap_err()
            .contains("damaged_snapshot"));
    }

    #[test]
    fn the_spec_example_parses() {
        let config = parse(
            "server:\n  listen_addr: \":8080\"\n  backend: \"memory\"\nregistry:\n  path: \"./data/limits.json\"\n\
             tigerbeetle:\n  cluster_id: \"0\"\n  addresses: [\"127.0.0.1:3000\"]\n  sessions: 8\n  \
             max_batch_events: 8000\n  flush_interval_micros: 200\n",
        )
        .unwrap();
        assert_eq!(config.listen_addr(), "0.0.0.0:8080".parse().unwrap());
        assert_eq!(config.tigerbeetle.batch_events_max, 8_000);
    }

    #[test]
    fn unknown_keys_name_the_file_and_the_key() {
        let message = parse("server:\n  listen_adr: \":8080\"\n").unwrap_err();
        assert!(message.contains("/etc/rl.yaml"), "{message}");
        assert!(message.contains("listen_adr"), "{message}");
        let message = parse("limits: {}\n").unwrap_err();
        assert!(message.contains("unknown field `limits`"), "{message}");
    }

    #[test]
    fn bad_values_name_the_file_and_the_entry() {
        let cases = [
            ("server:\n  listen_addr: nowhere\n", "server.listen_addr"),
            ("server:\n  request_timeout_ms: 0\n", "server.request_timeout_ms"),
            ("server:\n  body_bytes_max: 10\n", "server.body_bytes_max"),
            ("server:\n  admin_token: short\n", "server.admin_token"),
            (
                "server:\n  client_tokens: [\"ok-token-0123456789\", \"has space 0123456789\"]\n",
                "server.client_tokens[1]",
            ),
            ("tigerbeetle:\n  cluster_id: x\n", "tigerbeetle.cluster_id"),
            (
                "tigerbeetle:\n  max_batch_events: 9000\n",
                "tigerbeetle.max_batch_events",
            ),
            ("decrease:\n  check_interval_ms: 0\n", "decrease.check_interval_ms"),
            (
                "server:\n  concurrent_requests_max: 0\n",
                "server.concurrent_requests_max",
            ),
            ("memory:\n  settled_leases_max: 1\n", "memory.settled_leases_max"),
            ("memory:\n  snapshot_interval_ms: 99\n", "memory.snapshot_interval_ms"),
            (
                "memory:\n  snapshot_interval_ms: 3600001\n",
                "memory.snapshot_interval_ms",
            ),
            ("defaults:\n  window_margin_ms: 60001\n", "defaults.window_margin_ms"),
        ];
        for (text, entry) in cases {
            let message = parse(text).unwrap_err();
            assert!(
                message.starts_with(&format!("config /etc/rl.yaml: {entry}: ")),
                "{message}"
            );
        }
        let message = parse("retry_policy:\n  rolling:\n    factor: 0.5\n").unwrap_err();
        assert!(message.contains("factor"), "{message}");
    }

    #[test]
    fn the_gateway_section_is_checked_with_the_rest() {
        let section = "gateway:\n  listen_addr: \"127.0.0.1:8081\"\n  allow_anonymous: true\n  upstreams:\n    - {name: openai, kind: openai, base_url: \"https://api.openai.com\"}\n  models:\n    - {name: gpt-4o-mini, upstream: openai, rpm: 500, tpm: 200000, max_output_tokens_default: 4096}\n";
        let config = parse(section).unwrap();
        assert_eq!(config.gateway.unwrap().models[0].limits.published.rpm, Some(500));
        assert!(parse("").unwrap().gateway.is_none());
        let cases = [
            (section.replace("127.0.0.1:8081", "nowhere"), "gateway.listen_addr"),
            (
                section.replace("upstream: openai", "upstream: other"),
                "gateway.models[0].upstream",
            ),
            (section.replace("rpm: 500", "rpm: 0"), "gateway.models[0].rpm"),
        ];
        for (text, entry) in cases {
            let message = parse(&text).unwrap_err();
            assert!(
                message.starts_with(&format!("config /etc/rl.yaml: {entry}: ")),
                "{message}"
            );
        }
        let misspelt = parse(&section.replace("rpm: 500", "rmp: 500")).unwrap_err();
        assert!(misspelt.contains("rmp"), "{misspelt}");
    }

    #[test]
    fn tigerbeetle_needs_the_cargo_feature() {
        let result = parse("server:\n  backend: tigerbeetle\n");
        if cfg!(feature = "tigerbeetle") {
            assert!(result.is_ok());
        } else {
            assert!(result.unwrap_err().contains("--features tigerbeetle"));
        }
    }

    #[test]
    fn profiles_expand_into_their_providers_definitions_and_bad_ones_are_named() {
        let config = parse(
            "profiles:\n  - provider: openai\n    model: gpt-4o\n    limits: {rpm: 600, tpm: 30000000}\n  \
             - provider: anthropic\n    model: claude-sonnet\n    limits: {rpm: 4000, input_tpm: 2000000, output_tpm: 400000}\n",
        )
        .unwrap();
        let keys: Vec<(String, u64, u64)> = (config.profiles.iter())
            .flat_map(|entry| entry.profile().unwrap().definitions)
            .map(|d| (d.key().as_str().to_owned(), d.capacity(), d.window_seconds()))
            .collect();
        let expected: Vec<(String, u64, u64)> = [
            ("global:llm:openai:gpt-4o:rpm", 10, 1),
            ("global:llm:openai:gpt-4o:tpm", 500_000, 1),
            ("global:llm:anthropic:claude-sonnet:rpm", 4_000, 60),
            ("global:llm:anthropic:claude-sonnet:itpm", 2_000_000, 60),
            ("global:llm:anthropic:claude-sonnet:otpm", 400_000, 60),
        ]
        .iter()
        .map(|&(k, c, w)| (k.to_owned(), c, w))
        .collect();
        assert_eq!(keys, expected);
        let message = parse("profiles:\n  - provider: anthropic\n    model: m\n    limits: {rpm: 5}\n").unwrap_err();
        assert!(
            message.contains("profiles[0]") && message.contains("input_tpm"),
            "{message}"
        );
        let message =
            parse("profiles:\n  - provider: openai\n    model: m\n    limits: {rpm: 5, tmp: 1}\n").unwrap_err();
        assert!(message.contains("tmp"), "{message}");
    }

    /// The example of docs/http-api.md, "Scoped client tokens", loads as a server configuration.
    #[test]
    fn the_documented_example_loads() {
        use crate::client_tokens::KeyScope;

        let doc = include_str!("../../../docs/http-api.md");
        let start = doc.find("```yaml\nserver:\n  admin_token").expect("the example") + "```yaml\n".len();
        let example = &doc[start..start + doc[start..].find("```").unwrap()];
        for (name, value) in [
            ("SEARCH_LIMITER_TOKEN", "search-token-0123456789"),
            ("BILLING_LIMITER_TOKEN", "billing-token-0123456789"),
            ("OPS_LIMITER_TOKEN", "ops-token-0123456789"),
        ] {
            std::env::set_var(name, value);
        }
        let config = Config::parse(example, Path::new("docs/http-api.md")).unwrap();
        let scopes: Vec<KeyScope> = config
            .server
            .client_tokens
            .iter()
            .map(|t| t.resolve().unwrap().1)
            .collect();
        assert_eq!(scopes.len(), 4);
        assert_eq!(scopes[0], KeyScope::All);
        assert_eq!(scopes[1], KeyScope::Prefixes(vec!["svc:search:".to_owned()].into()));
        assert_eq!(scopes[3], KeyScope::All);
    }
}
