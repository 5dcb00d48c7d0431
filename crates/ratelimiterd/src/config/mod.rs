//! The server's configuration: the YAML of docs/server.md, "Configuration", plus
//! what the server needs to run safely (request limits, tokens, decrease timing, retry
//! hints).
//!
//! Every section and field is optional and has a documented default, so
//! `ratelimiterd` without `--config` serves the memory backend on `127.0.0.1:8080`.
//! Unknown keys are errors: a misspelt limit must not silently fall back to a default.
//!
//! The sections with rules of their own have a module each (`server.rs`,
//! `memory.rs`), below the whole file's type and its loading here; `checks.rs`
//! holds the checks of single values they share.

mod checks;
mod directory;
mod memory;
mod server;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use ratelimiter::retry::RetryPolicy;
use serde::Deserialize;

use checks::check_range;
pub use checks::parse_listen_addr;
pub use directory::{DirectorySection, KEY_RETENTION_DAYS_DEFAULT, KEY_RETENTION_DAYS_LIMIT};
pub use memory::{
    DamagedSnapshotPolicy, MemorySection, MEMORY_ENTRIES_MAX_LIMIT, SNAPSHOT_INTERVAL_MS_DEFAULT,
    SNAPSHOT_INTERVAL_MS_LIMIT, SNAPSHOT_INTERVAL_MS_MIN,
};
pub use server::{
    BackendKind, ServerConfig, BODY_BYTES_MAX_DEFAULT, BODY_BYTES_MAX_LIMIT, CLIENT_TOKENS_MAX,
    CONCURRENT_REQUESTS_MAX_DEFAULT, CONCURRENT_REQUESTS_MAX_LIMIT, CONNECTIONS_MAX_DEFAULT, CONNECTIONS_MAX_LIMIT,
    LISTEN_ADDR_DEFAULT, REQUEST_TIMEOUT_MS_DEFAULT, REQUEST_TIMEOUT_MS_LIMIT, SHUTDOWN_GRACE_MS_DEFAULT,
    TOKEN_BYTES_MAX, TOKEN_BYTES_MIN,
};

/// The default registry file (docs/decisions.md, "Registry file").
pub const REGISTRY_PATH_DEFAULT: &str = "./data/limits.json";
/// The retry hint of `limit_decreasing:<key>` denials (docs/retry-hints.md, "Decrease
/// hints").
pub const DECREASE_RETRY_MS_DEFAULT: u64 = 10_000;
/// How often pending decreases are checked by default.
pub const DECREASE_CHECK_INTERVAL_MS_DEFAULT: u64 = 1_000;
/// The longest decrease check interval and decrease retry that may be configured: one hour.
pub const DECREASE_MS_LIMIT: u64 = 3_600_000;
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
    /// How the gateway's tenants and keys made through the admin API are kept.
    pub directory: DirectorySection,
    /// Log output.
    pub log: LogConfig,
    /// The OpenAI/Anthropic gateway on a listener of its own (docs/gateway.md);
    /// absent: no gateway.
    pub gateway: Option<gateway::GatewayConfig>,
    /// Provider profiles (docs/provider-profiles.md): each entry's published limits
    /// become the definitions of its provider's profile, applied at startup.
    pub profiles: Vec<ProfileEntry>,
    /// OpenTelemetry export (docs/observability.md), each entry overridden by its
    /// `OTEL_*` environment variable; nothing set: nothing exported.
    pub telemetry: crate::telemetry::TelemetryConfig,
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
        (self.server.validate()).map_err(|(entry, message)| invalid(&entry, message))?;
        if self.registry.path.as_os_str().is_empty() {
            return Err(invalid("registry.path", "must not be empty".to_owned()));
        }
        check_range(self.decrease.retry_ms, 1, DECREASE_MS_LIMIT).map_err(|m| invalid("decrease.retry_ms", m))?;
        check_range(self.decrease.check_interval_ms, 1, DECREASE_MS_LIMIT)
            .map_err(|m| invalid("decrease.check_interval_ms", m))?;
        ratelimiter::check_window_margin_ms(self.defaults.window_margin_ms, 0)
            .map_err(|m| invalid("defaults.window_margin_ms", m))?;
        (self.memory.validate()).map_err(|(entry, message)| invalid(&entry, message))?;
        (self.directory.validate()).map_err(|(entry, message)| invalid(&entry, message))?;
        self.validate_tigerbeetle(path)?;
        if let Some(gateway) = &self.gateway {
            parse_listen_addr(&gateway.listen_addr).map_err(|m| invalid("gateway.listen_addr", m))?;
            gateway
                .validate()
                .map_err(|e| invalid(&format!("gateway.{}", e.entry), e.message))?;
        }
        // With the environment it is read with, as the server will read it.
        (self.telemetry.resolve(&|name| std::env::var(name).ok())).map_err(|m| invalid("telemetry", m))?;
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

        let doc = include_str!("../../../../docs/http-api.md");
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
