//! The `gateway:` section as a whole (docs/gateway.md, "Configuration"): its
//! entries, its settings with their defaults and the limits on them. Above the
//! entries' own modules, which it holds.

use serde::Deserialize;

use super::{AlertsConfig, BudgetConfig, ClassConfig, ModelConfig, TenantConfig, UpstreamConfig};

/// The default largest request body: prompts with a few images inlined as base64.
pub const BODY_BYTES_MAX_DEFAULT: usize = 8 * 1024 * 1024;
/// The largest body limit that may be configured: bodies are buffered to be counted.
pub const BODY_BYTES_MAX_LIMIT: usize = 64 * 1024 * 1024;
/// The default time an upstream call may take, first byte to last: long generations
/// of reasoning models run for minutes.
pub const UPSTREAM_TIMEOUT_MS_DEFAULT: u64 = 600_000;
/// The longest upstream timeout that may be configured: one hour.
pub const UPSTREAM_TIMEOUT_MS_LIMIT: u64 = 3_600_000;
/// The longest a request may wait in a model's queue: the SDKs give up on retry
/// hints over 60 s (Anthropic) and 120 s (OpenAI), so longer waits help nobody.
pub const MAX_WAIT_MS_LIMIT: u64 = 120_000;
/// The window of `rpm`, `tpm`, `input_tpm` and `output_tpm`: both providers state
/// these limits per minute.
pub const MINUTE_WINDOW_SECONDS: u64 = 60;
/// The window of a tenant's `daily_tokens`.
pub const DAY_WINDOW_SECONDS: u64 = 86_400;
/// The most models, upstreams or tenants: each tenant key is compared on every call.
pub const ENTRIES_MAX: usize = 1_024;
/// The shortest gateway key accepted: shorter ones are guessable.
pub const TENANT_KEY_BYTES_MIN: usize = 16;
/// The default time a client has to send a request's headers (and the longest
/// a kept-alive connection stays idle): a slowloris client holds a connection
/// slot this long at most.
pub const CLIENT_HEADER_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// The default time a client has to send its whole body, first byte to last: an
/// 8 MB body at 1 MB/s fits; a client sending a byte a second is cut off.
pub const CLIENT_BODY_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// The default time a write to a client may stay blocked: a client that stops
/// reading an answer this long is disconnected and its call completed.
pub const CLIENT_WRITE_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// The longest any of the three client timeouts may be configured: ten minutes.
pub const CLIENT_TIMEOUT_MS_LIMIT: u64 = 600_000;
/// The default calls one tenant may have open at once (each holds a connection
/// until its answer ends): one tenant cannot fill the connection table.
pub const TENANT_CONNECTIONS_MAX_DEFAULT: usize = 256;
/// The default calls one tenant may have waiting in the models' queues at once:
/// one tenant cannot fill a queue (the model's queue) for the others.
pub const TENANT_QUEUED_MAX_DEFAULT: usize = 1_000;
/// The largest per-tenant cap that may be configured.
pub const TENANT_CAP_LIMIT: usize = 100_000;
/// The most `forward_headers` of one upstream.
pub const FORWARD_HEADERS_MAX: usize = 32;

/// The `gateway:` section.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// `host:port` of the gateway's own listener, beside the limiter API's.
    pub listen_addr: String,
    /// The largest request body; larger ones are answered 413 in the provider's shape.
    #[serde(default = "body_bytes_max_default")]
    pub body_bytes_max: usize,
    /// The longest an upstream call may take; past it the client gets a 504.
    #[serde(default = "upstream_timeout_ms_default")]
    pub upstream_timeout_ms: u64,
    /// The providers calls are forwarded to.
    pub upstreams: Vec<UpstreamConfig>,
    /// The models served, each on one upstream with its limits, or on a pool of
    /// deployments (docs/gateway.md, "Pools").
    pub models: Vec<ModelConfig>,
    /// The tenants of the file, each with its key. Empty without
    /// `allow_anonymous`: only keys made through the admin API may call
    /// (docs/gateway.md, "Tenants and keys").
    #[serde(default)]
    pub tenants: Vec<TenantConfig>,
    /// Serve without tenants: anyone who reaches the listener may call, without
    /// a key. Refused with tenants; warned about at every start.
    #[serde(default)]
    pub allow_anonymous: bool,
    /// With `allow_anonymous`, the host names the listener answers to besides IP
    /// addresses and `localhost` (docs/gateway.md, "Requests from browsers"): a
    /// web page that rebinds its own name to the gateway is refused.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// How long a client has to send a request's headers.
    #[serde(default = "client_header_timeout_ms_default")]
    pub client_header_timeout_ms: u64,
    /// How long a client has to send its whole body.
    #[serde(default = "client_body_timeout_ms_default")]
    pub client_body_timeout_ms: u64,
    /// How long a write to a client may stay blocked before the connection is closed.
    #[serde(default = "client_write_timeout_ms_default")]
    pub client_write_timeout_ms: u64,
    /// Calls one tenant may have open at once, unless the tenant sets its own.
    #[serde(default = "tenant_connections_max_default")]
    pub tenant_connections_max: usize,
    /// Calls one tenant may have waiting in queues at once, unless the tenant sets its own.
    #[serde(default = "tenant_queued_max_default")]
    pub tenant_queued_max: usize,
    /// Priority classes, highest first (docs/gateway.md, "Classes"); none: one class.
    #[serde(default)]
    pub classes: Vec<ClassConfig>,
    /// Budgets on every call through the gateway (`gateway:usd:<span>`).
    #[serde(default)]
    pub budgets: Vec<BudgetConfig>,
    /// Where budget alerts go besides the log (docs/gateway.md, "Budgets and spend").
    #[serde(default)]
    pub alerts: AlertsConfig,
}

fn body_bytes_max_default() -> usize {
    BODY_BYTES_MAX_DEFAULT
}

fn client_header_timeout_ms_default() -> u64 {
    CLIENT_HEADER_TIMEOUT_MS_DEFAULT
}

fn client_body_timeout_ms_default() -> u64 {
    CLIENT_BODY_TIMEOUT_MS_DEFAULT
}

fn client_write_timeout_ms_default() -> u64 {
    CLIENT_WRITE_TIMEOUT_MS_DEFAULT
}

fn tenant_connections_max_default() -> usize {
    TENANT_CONNECTIONS_MAX_DEFAULT
}

fn tenant_queued_max_default() -> usize {
    TENANT_QUEUED_MAX_DEFAULT
}

fn upstream_timeout_ms_default() -> u64 {
    UPSTREAM_TIMEOUT_MS_DEFAULT
}

// A tenant's caps fall back to the section's defaults: they are read here, beside
// the section, so that the tenant's entry (model.rs) needs nothing of the section.
impl TenantConfig {
    /// The tenant's cap on open calls.
    pub fn connections_max(&self, gateway: &GatewayConfig) -> usize {
        self.connections_max.unwrap_or(gateway.tenant_connections_max)
    }

    /// The tenant's cap on waiting calls.
    pub fn queued_max(&self, gateway: &GatewayConfig) -> usize {
        self.queued_max.unwrap_or(gateway.tenant_queued_max)
    }
}
