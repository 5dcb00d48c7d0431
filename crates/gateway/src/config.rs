//! The `gateway:` section of the server's YAML (docs/gateway.md, "Configuration"):
//! upstreams, the models they serve with their limits, and the tenants that may call.
//!
//! Unknown keys are errors, like everywhere in the server's configuration: a
//! misspelt limit must not silently fall back to "unlimited".

use std::collections::{BTreeMap, HashSet};

use ratelimiter::profile::{llm_profile_keyed, LlmProfile, ProfileError, Published};
use ratelimiter::LimitKey;
use serde::Deserialize;

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
/// one tenant cannot fill a queue ([`crate::queue::WAITERS_MAX`]) for the others.
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
    /// Who may call. Empty is refused unless `allow_anonymous` says so.
    #[serde(default)]
    pub tenants: Vec<TenantConfig>,
    /// Serve without tenants: anyone who reaches the listener may call, without
    /// a key. Refused with tenants; warned about at every start.
    #[serde(default)]
    pub allow_anonymous: bool,
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
    pub classes: Vec<crate::classes::ClassConfig>,
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

/// The wire format an upstream speaks.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum UpstreamKind {
    /// api.openai.com.
    Openai,
    /// api.anthropic.com.
    Anthropic,
    /// Any server of the OpenAI wire format (vLLM, Ollama, ...).
    OpenaiCompatible,
}

impl UpstreamKind {
    /// True for the formats of OpenAI's API.
    pub fn is_openai(self) -> bool {
        matches!(self, UpstreamKind::Openai | UpstreamKind::OpenaiCompatible)
    }
}

/// One `upstreams:` entry.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// The provider part of the limit keys (`global:llm:<name>:<model>:rpm`).
    pub name: String,
    /// The wire format.
    pub kind: UpstreamKind,
    /// Everything before `/v1/...`, e.g. `http://127.0.0.1:9000`.
    pub base_url: String,
    /// The environment variable holding the upstream's key; never the key itself,
    /// so configuration files can be shared. `None`: no key is sent (local servers).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Client request headers passed to this upstream besides `anthropic-version`
    /// (such as `anthropic-beta`, `openai-organization`, `openai-project`): none
    /// unless listed, so a client cannot pick the organization, project or beta
    /// features the gateway's key is used with.
    #[serde(default)]
    pub forward_headers: Vec<String>,
}

/// The tokenizer used to count a model's prompts.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// GPT-4o, GPT-4.1, GPT-5, o-series.
    O200kBase,
    /// GPT-4, GPT-3.5, text-embedding-3.
    Cl100kBase,
    /// One token per UTF-8 byte: an upper bound for every BPE tokenizer, for models
    /// whose tokenizer is not public (Claude) or not embedded (open models).
    Bytes,
}

/// One `models:` entry: one deployment (`upstream` and its limits), or a pool of
/// them (`deployments`; docs/gateway.md, "Pools").
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct ModelConfig {
    /// The model name clients send, forwarded unchanged (in a pool: rewritten to
    /// each deployment's `model`).
    pub name: String,
    /// The `upstreams:` entry serving it; empty for a pool, whose `deployments`
    /// name theirs.
    #[serde(default)]
    pub upstream: String,
    /// The deployment's limits and provider profile (single-deployment form;
    /// a pool's are in each of its `deployments`).
    #[serde(flatten)]
    pub limits: DeploymentLimits,
    /// The output bound reserved when a chat or Responses request names none;
    /// default the model's largest output (`tokens::output_default`). Anthropic
    /// requests must name theirs and embeddings have none, so neither needs it.
    #[serde(default)]
    pub max_output_tokens_default: Option<u64>,
    /// How long a denied request may wait in the model's queue; 0 answers 429 at once.
    #[serde(default)]
    pub max_wait_ms: u64,
    /// The prompt tokenizer; default by model name (docs/gateway.md, "Counting").
    #[serde(default)]
    pub encoding: Option<Encoding>,
    /// Tokens reserved per image part whose size the gateway cannot know without
    /// fetching it (by URL or file id); default the most the model's image rule
    /// bills (`model_table`).
    #[serde(default)]
    pub image_tokens: Option<u64>,
    /// Tokens reserved per file, document or audio part the gateway cannot
    /// count (a file id, a PDF, audio); default the model's context window.
    #[serde(default)]
    pub file_tokens: Option<u64>,
    /// Tokens reserved for the stored context a Responses call continues
    /// (`previous_response_id`, `conversation`, a stored `prompt`, each
    /// `item_reference`); default the model's context window.
    #[serde(default)]
    pub stored_context_tokens: Option<u64>,
    /// How a pool picks among its deployments of one priority.
    #[serde(default)]
    pub routing: crate::routing::Routing,
    /// The pool's deployments, instead of `upstream` and the limits above.
    #[serde(default)]
    pub deployments: Vec<crate::pool::DeploymentConfig>,
    /// The circuit breaker of each of the pool's deployments (pools only).
    #[serde(default)]
    pub breaker: Option<crate::breaker::BreakerConfig>,
}

impl ModelConfig {
    /// The model's provider profile, keyed by the name of `upstream` (the keys stay
    /// `global:llm:<upstream>:<model>:...`); `None` without `profile`.
    pub fn llm_profile(&self, upstream: &str) -> Option<Result<LlmProfile, ProfileError>> {
        let provider = self.limits.profile.as_deref()?;
        Some(llm_profile_keyed(
            provider,
            upstream,
            &self.name,
            &self.limits.published,
        ))
    }
}

/// The limits and provider profile one deployment is held to: a model's own in
/// the single-deployment form, or each entry of its `deployments`. One struct,
/// flattened into both entries, so that each limit field is declared, documented
/// and checked once.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct DeploymentLimits {
    /// The numbers the provider publishes for the deployment (`rpm`, `tpm`,
    /// `input_tpm`, `output_tpm`, `concurrency`, and a profile's `rpd`,
    /// `largest_request_tokens`, `quantum_seconds`): the library's own struct,
    /// so that a profile is built from exactly what the entry says.
    #[serde(flatten)]
    pub published: Published,
    /// Whether Anthropic's cache reads count on this deployment's input limit: they do
    /// for the older models Anthropic marks so (docs/gateway.md, "Reconciling").
    #[serde(default)]
    pub count_cache_reads: bool,
    /// The provider profile (`openai`, `azure`, `anthropic`, `gemini`, `bedrock`;
    /// docs/provider-profiles.md): the model's definitions and what a call
    /// reserves and reconciles to follow that provider's documented enforcement,
    /// built by `ratelimiter::profile::llm_profile_keyed` from the numbers above.
    /// `None`: the gateway's own per-minute limits (docs/gateway.md, "Limits").
    #[serde(default)]
    pub profile: Option<String>,
    /// Keys no field of the entry took, refused by [`GatewayConfig::validate`].
    /// Last, and here rather than in the entry: serde hands a flattened field
    /// only the keys the fields before it left.
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

impl DeploymentLimits {
    /// Each field by its YAML name, and whether the entry sets it: a pool's own
    /// entry must set none of them (they belong in each deployment).
    pub fn fields_set(&self) -> [(&'static str, bool); 10] {
        let p = &self.published;
        [
            ("rpm", p.rpm.is_some()),
            ("tpm", p.tpm.is_some()),
            ("input_tpm", p.input_tpm.is_some()),
            ("output_tpm", p.output_tpm.is_some()),
            ("concurrency", p.concurrency.is_some()),
            ("profile", self.profile.is_some()),
            ("rpd", p.rpd.is_some()),
            ("largest_request_tokens", p.largest_request_tokens.is_some()),
            ("quantum_seconds", p.quantum_seconds.is_some()),
            ("count_cache_reads", self.count_cache_reads),
        ]
    }
}

/// The keys of an entry that no field took. Serde's `deny_unknown_fields` does
/// not combine with `flatten`, so the entries that flatten [`DeploymentLimits`]
/// collect their leftover keys here and [`GatewayConfig::validate`] refuses any:
/// a misspelt limit must not fall back to "unlimited".
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct UnknownFields(BTreeMap<String, Ignored>);

impl UnknownFields {
    /// The first unknown key, if any, in alphabetical order.
    pub fn first(&self) -> Option<&str> {
        self.0.keys().next().map(String::as_str)
    }
}

/// A value read and dropped: only its key matters to [`UnknownFields`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ignored;

impl<'de> Deserialize<'de> for Ignored {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(deserializer).map(|_| Ignored)
    }
}

/// One `tenants:` entry.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// The tenant part of the limit keys (`tenant:<name>:llm:daily_tokens`).
    pub name: String,
    /// The environment variable holding the tenant's gateway key.
    pub api_key_env: String,
    /// Tokens per rolling day.
    #[serde(default)]
    pub daily_tokens: Option<u64>,
    /// Requests per minute, over every model.
    #[serde(default)]
    pub rpm: Option<u64>,
    /// Calls in flight, over every model.
    #[serde(default)]
    pub concurrency: Option<u64>,
    /// Calls open at once (each holds a connection); default `tenant_connections_max`.
    #[serde(default)]
    pub connections_max: Option<usize>,
    /// Calls waiting in queues at once; default `tenant_queued_max`.
    #[serde(default)]
    pub queued_max: Option<usize>,
    /// The tenant's class (an entry of `classes`); none: the lowest class.
    #[serde(default)]
    pub class: Option<String>,
}

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

/// Why the `gateway:` section cannot be used; the message names the entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("gateway.{entry}: {message}")]
pub struct GatewayConfigError {
    /// The entry, such as `models[2].upstream`.
    pub entry: String,
    /// What is wrong.
    pub message: String,
}

fn invalid(entry: impl Into<String>, message: impl Into<String>) -> GatewayConfigError {
    GatewayConfigError {
        entry: entry.into(),
        message: message.into(),
    }
}

impl GatewayConfig {
    /// Checks every rule a parse cannot: ranges, references, unique names, and that
    /// every limit key the section implies is a valid key.
    pub fn validate(&self) -> Result<(), GatewayConfigError> {
        if self.body_bytes_max == 0 || self.body_bytes_max > BODY_BYTES_MAX_LIMIT {
            return Err(invalid("body_bytes_max", format!("must be 1..={BODY_BYTES_MAX_LIMIT}")));
        }
        if self.upstream_timeout_ms == 0 || self.upstream_timeout_ms > UPSTREAM_TIMEOUT_MS_LIMIT {
            return Err(invalid(
                "upstream_timeout_ms",
                format!("must be 1..={UPSTREAM_TIMEOUT_MS_LIMIT}"),
            ));
        }
        for (what, len) in [
            ("upstreams", self.upstreams.len()),
            ("models", self.models.len()),
            ("tenants", self.tenants.len()),
        ] {
            if len > ENTRIES_MAX {
                return Err(invalid(what, format!("at most {ENTRIES_MAX} entries")));
            }
        }
        self.validate_clients()?;
        self.validate_upstreams()?;
        self.validate_models()?;
        self.validate_tenants()?;
        self.validate_classes()
    }

    fn validate_classes(&self) -> Result<(), GatewayConfigError> {
        let tenant_classes: Vec<Option<&str>> = self.tenants.iter().map(|t| t.class.as_deref()).collect();
        crate::classes::validate(&self.classes, &tenant_classes).map_err(|(entry, message)| invalid(entry, message))?;
        let classes = crate::classes::Classes::new(&self.classes);
        classes
            .ceiling_definitions(&crate::limits::definitions_without_ceilings(self))
            .map(|_| ())
            .map_err(|message| invalid("classes", message))
    }

    /// The client timeouts and caps, and that a gateway without tenants is meant.
    fn validate_clients(&self) -> Result<(), GatewayConfigError> {
        if self.tenants.is_empty() && !self.allow_anonymous {
            return Err(invalid(
                "tenants",
                "is empty: anyone reaching the listener could call with the upstreams' keys; add tenants, \
                 or set allow_anonymous: true to serve without keys",
            ));
        }
        if !self.tenants.is_empty() && self.allow_anonymous {
            return Err(invalid(
                "allow_anonymous",
                "is true but tenants are given: their keys would not be asked; remove one of the two",
            ));
        }
        for (field, value) in [
            ("client_header_timeout_ms", self.client_header_timeout_ms),
            ("client_body_timeout_ms", self.client_body_timeout_ms),
            ("client_write_timeout_ms", self.client_write_timeout_ms),
        ] {
            if value == 0 || value > CLIENT_TIMEOUT_MS_LIMIT {
                return Err(invalid(field, format!("must be 1..={CLIENT_TIMEOUT_MS_LIMIT}")));
            }
        }
        let mut caps = vec![
            ("tenant_connections_max".to_owned(), Some(self.tenant_connections_max)),
            ("tenant_queued_max".to_owned(), Some(self.tenant_queued_max)),
        ];
        for (i, tenant) in self.tenants.iter().enumerate() {
            caps.push((format!("tenants[{i}].connections_max"), tenant.connections_max));
            caps.push((format!("tenants[{i}].queued_max"), tenant.queued_max));
        }
        for (field, value) in caps {
            if value.is_some_and(|v| v == 0 || v > TENANT_CAP_LIMIT) {
                return Err(invalid(field, format!("must be 1..={TENANT_CAP_LIMIT}")));
            }
        }
        Ok(())
    }

    fn validate_upstreams(&self) -> Result<(), GatewayConfigError> {
        let mut names = HashSet::new();
        for (i, upstream) in self.upstreams.iter().enumerate() {
            check_name(&format!("upstreams[{i}].name"), &upstream.name)?;
            if !names.insert(upstream.name.as_str()) {
                return Err(invalid(format!("upstreams[{i}].name"), "appears twice"));
            }
            let rest = upstream
                .base_url
                .strip_prefix("https://")
                .or_else(|| upstream.base_url.strip_prefix("http://"));
            if rest.is_none_or(|host| host.is_empty()) || upstream.base_url.parse::<axum::http::Uri>().is_err() {
                return Err(invalid(
                    format!("upstreams[{i}].base_url"),
                    "must be an http:// or https:// URL",
                ));
            }
            if upstream.forward_headers.len() > FORWARD_HEADERS_MAX {
                return Err(invalid(
                    format!("upstreams[{i}].forward_headers"),
                    format!("at most {FORWARD_HEADERS_MAX} entries"),
                ));
            }
            for (j, name) in upstream.forward_headers.iter().enumerate() {
                crate::headers::check_forwardable(name)
                    .map_err(|m| invalid(format!("upstreams[{i}].forward_headers[{j}]"), m))?;
            }
        }
        Ok(())
    }

    fn validate_models(&self) -> Result<(), GatewayConfigError> {
        let mut names = HashSet::new();
        let mut deployment_keys = HashSet::new();
        for (i, model) in self.models.iter().enumerate() {
            let entry = |field: &str| format!("models[{i}].{field}");
            check_name(&entry("name"), &model.name)?;
            if !names.insert(model.name.as_str()) {
                return Err(invalid(entry("name"), "appears twice"));
            }
            check_known(&model.limits.unknown, &entry)?;
            for (j, deployment) in model.deployments.iter().enumerate() {
                check_known(&deployment.limits.unknown, &|f: &str| {
                    entry(&format!("deployments[{j}].{f}"))
                })?;
            }
            for (field, value) in [
                ("image_tokens", model.image_tokens),
                ("file_tokens", model.file_tokens),
                ("stored_context_tokens", model.stored_context_tokens),
                ("max_output_tokens_default", model.max_output_tokens_default),
            ] {
                if value == Some(0) {
                    return Err(invalid(entry(field), "must be at least 1 (leave it out for no limit)"));
                }
            }
            if model.max_wait_ms > MAX_WAIT_MS_LIMIT {
                return Err(invalid(
                    entry("max_wait_ms"),
                    format!("must be 0..={MAX_WAIT_MS_LIMIT}"),
                ));
            }
            crate::pool::validate_shape(model, &entry)?;
            for (j, deployment) in crate::pool::resolve(model).iter().enumerate() {
                let prefix = if model.deployments.is_empty() {
                    format!("models[{i}]")
                } else {
                    format!("models[{i}].deployments[{j}]")
                };
                let entry = |field: &str| format!("{prefix}.{field}");
                if !deployment_keys.insert((deployment.model.upstream.clone(), deployment.model.name.clone())) {
                    return Err(invalid(
                        entry("model"),
                        format!(
                            "model {:?}: the deployment {}/{} is already served by another entry (its limit keys would be shared)",
                            model.name, deployment.model.upstream, deployment.model.name
                        ),
                    ));
                }
                self.validate_deployment(&deployment.model, &entry).map_err(|e| {
                    if model.deployments.is_empty() {
                        e
                    } else {
                        invalid(e.entry, format!("model {:?}: {}", model.name, e.message))
                    }
                })?;
            }
            crate::pool::validate_formats(model, &self.upstreams, &entry)?;
        }
        Ok(())
    }

    /// The rules of one deployment, in its single-deployment form (a model without
    /// `deployments` is its own one deployment).
    fn validate_deployment(
        &self,
        model: &ModelConfig,
        entry: &dyn Fn(&str) -> String,
    ) -> Result<(), GatewayConfigError> {
        let Some(upstream) = self.upstreams.iter().find(|u| u.name == model.upstream) else {
            return Err(invalid(
                entry("upstream"),
                format!("no upstream named {:?}", model.upstream),
            ));
        };
        for (field, value) in [
            ("rpm", model.limits.published.rpm),
            ("tpm", model.limits.published.tpm),
            ("input_tpm", model.limits.published.input_tpm),
            ("output_tpm", model.limits.published.output_tpm),
            ("concurrency", model.limits.published.concurrency),
        ] {
            if value == Some(0) {
                return Err(invalid(entry(field), "must be at least 1 (leave it out for no limit)"));
            }
        }
        if model.limits.published.tpm.is_some()
            && (model.limits.published.input_tpm.is_some() || model.limits.published.output_tpm.is_some())
        {
            return Err(invalid(entry("tpm"), "give tpm, or input_tpm and output_tpm, not both"));
        }
        if upstream.kind.is_openai()
            && (model.limits.published.input_tpm.is_some() || model.limits.published.output_tpm.is_some())
        {
            return Err(invalid(entry("input_tpm"), "OpenAI models have one tpm"));
        }
        check_name(&entry("model"), &model.name)?;
        LimitKey::llm_rpm(&upstream.name, &model.name).map_err(|e| invalid(entry("name"), e.to_string()))?;
        Self::validate_profile(model, &upstream.name, entry)?;
        Ok(())
    }

    /// A profile must name a known provider and have the numbers it needs; the
    /// profile's own fields are errors without one.
    fn validate_profile(
        model: &ModelConfig,
        upstream: &str,
        entry: &dyn Fn(&str) -> String,
    ) -> Result<(), GatewayConfigError> {
        match model.llm_profile(upstream) {
            Some(Err(e)) => Err(invalid(entry("profile"), e.to_string())),
            Some(Ok(_)) => Ok(()),
            None => {
                for (field, value) in [
                    ("rpd", model.limits.published.rpd),
                    ("largest_request_tokens", model.limits.published.largest_request_tokens),
                    ("quantum_seconds", model.limits.published.quantum_seconds),
                ] {
                    if value.is_some() {
                        return Err(invalid(entry(field), "is a profile's number: give a profile too"));
                    }
                }
                Ok(())
            }
        }
    }

    fn validate_tenants(&self) -> Result<(), GatewayConfigError> {
        let mut names = HashSet::new();
        for (i, tenant) in self.tenants.iter().enumerate() {
            let entry = |field: &str| format!("tenants[{i}].{field}");
            check_name(&entry("name"), &tenant.name)?;
            if !names.insert(tenant.name.as_str()) {
                return Err(invalid(entry("name"), "appears twice"));
            }
            for (field, value) in [
                ("daily_tokens", tenant.daily_tokens),
                ("rpm", tenant.rpm),
                ("concurrency", tenant.concurrency),
            ] {
                if value == Some(0) {
                    return Err(invalid(entry(field), "must be at least 1 (leave it out for no limit)"));
                }
            }
            LimitKey::tenant_daily_tokens(&tenant.name).map_err(|e| invalid(entry("name"), e.to_string()))?;
        }
        Ok(())
    }
}

/// An entry with a key no field took is refused, its key named: the same rule
/// as `deny_unknown_fields` elsewhere, for the entries that flatten their limits.
fn check_known(unknown: &UnknownFields, entry: &dyn Fn(&str) -> String) -> Result<(), GatewayConfigError> {
    match unknown.first() {
        Some(field) => Err(invalid(entry(field), "unknown field")),
        None => Ok(()),
    }
}

fn check_name(entry: &str, name: &str) -> Result<(), GatewayConfigError> {
    if name.is_empty() || name.contains(':') {
        return Err(invalid(entry, "must be non-empty and must not contain ':'"));
    }
    LimitKey::new(name)
        .map(|_| ())
        .map_err(|e| invalid(entry, e.to_string()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const EXAMPLE: &str = r#"
listen_addr: "127.0.0.1:8081"
upstreams:
  - name: openai
    kind: openai
    base_url: "http://127.0.0.1:9000"
    api_key_env: OPENAI_API_KEY
  - name: anthropic
    kind: anthropic
    base_url: "http://127.0.0.1:9000"
models:
  - name: gpt-4o-mini
    upstream: openai
    rpm: 500
    tpm: 200000
    concurrency: 50
    max_output_tokens_default: 4096
    max_wait_ms: 0
  - name: claude-sonnet-4
    upstream: anthropic
    input_tpm: 30000
    output_tpm: 8000
    rpm: 50
    max_output_tokens_default: 1024
    profile: anthropic
tenants:
  - name: acme
    api_key_env: ACME_GATEWAY_KEY
    daily_tokens: 1000000
"#;

    fn parse(text: &str) -> GatewayConfig {
        serde_yaml::from_str(text).unwrap()
    }

    /// A gateway without upstreams, models or tenants, open to anyone, every
    /// other field at its default: the base of other modules' test configurations.
    pub(crate) fn anonymous() -> GatewayConfig {
        parse("listen_addr: \"127.0.0.1:0\"\nupstreams: []\nmodels: []\nallow_anonymous: true\n")
    }

    #[test]
    fn a_gateway_without_tenants_must_say_it_is_open() {
        let mut config = parse(EXAMPLE);
        config.tenants.clear();
        let error = config.validate().unwrap_err();
        assert_eq!(error.entry, "tenants");
        assert!(error.to_string().contains("allow_anonymous: true"), "{error}");
        config.allow_anonymous = true;
        config.validate().unwrap();
        let mut config = parse(EXAMPLE);
        config.allow_anonymous = true;
        let error = config.validate().unwrap_err();
        assert_eq!(error.entry, "allow_anonymous");
        assert!(error.message.contains("tenants"), "{error}");
    }

    #[test]
    fn client_timeouts_caps_and_forwarded_headers_are_checked() {
        let config = parse(EXAMPLE);
        assert_eq!(config.client_header_timeout_ms, CLIENT_HEADER_TIMEOUT_MS_DEFAULT);
        assert_eq!(config.client_body_timeout_ms, CLIENT_BODY_TIMEOUT_MS_DEFAULT);
        assert_eq!(config.client_write_timeout_ms, CLIENT_WRITE_TIMEOUT_MS_DEFAULT);
        assert_eq!(
            config.tenants[0].connections_max(&config),
            TENANT_CONNECTIONS_MAX_DEFAULT
        );
        assert_eq!(config.tenants[0].queued_max(&config), TENANT_QUEUED_MAX_DEFAULT);
        for field in [
            "client_header_timeout_ms",
            "client_body_timeout_ms",
            "client_write_timeout_ms",
        ] {
            let text = format!("{EXAMPLE}{field}: 0\n");
            assert_eq!(parse(&text).validate().unwrap_err().entry, field);
        }
        let mut config = parse(EXAMPLE);
        config.tenants[0].queued_max = Some(0);
        assert_eq!(config.validate().unwrap_err().entry, "tenants[0].queued_max");
        let mut config = parse(EXAMPLE);
        config.tenant_connections_max = TENANT_CAP_LIMIT + 1;
        assert_eq!(config.validate().unwrap_err().entry, "tenant_connections_max");
        let mut config = parse(EXAMPLE);
        config.upstreams[1].forward_headers = vec!["anthropic-beta".into()];
        config.validate().unwrap();
        config.upstreams[1].forward_headers.push("x-api-key".into());
        assert_eq!(config.validate().unwrap_err().entry, "upstreams[1].forward_headers[1]");
    }

    #[test]
    fn the_issue_example_is_valid() {
        let config = parse(EXAMPLE);
        config.validate().unwrap();
        assert_eq!(config.models[1].limits.profile.as_deref(), Some("anthropic"));
        assert_eq!(config.body_bytes_max, BODY_BYTES_MAX_DEFAULT);
    }

    #[test]
    fn bad_entries_are_named() {
        let mut config = parse(EXAMPLE);
        config.models[0].upstream = "nope".into();
        assert_eq!(config.validate().unwrap_err().entry, "models[0].upstream");
        let mut config = parse(EXAMPLE);
        config.models[0].limits.published.rpm = Some(0);
        assert_eq!(config.validate().unwrap_err().entry, "models[0].rpm");
        let mut config = parse(EXAMPLE);
        config.models[1].limits.published.tpm = Some(5);
        assert_eq!(config.validate().unwrap_err().entry, "models[1].tpm");
        let mut config = parse(EXAMPLE);
        config.models[0].limits.published.input_tpm = Some(5);
        config.models[0].limits.published.tpm = None;
        assert_eq!(config.validate().unwrap_err().entry, "models[0].input_tpm");
        let mut config = parse(EXAMPLE);
        config.tenants[0].name = "a:b".into();
        assert_eq!(config.validate().unwrap_err().entry, "tenants[0].name");
        let mut config = parse(EXAMPLE);
        config.models.push(config.models[0].clone());
        assert_eq!(config.validate().unwrap_err().entry, "models[2].name");
        let mut config = parse(EXAMPLE);
        config.upstreams[0].base_url = "https://api.openai.com".into();
        config.validate().unwrap();
        for bad in ["ftp://host", "https://", "api.openai.com", "http://bad host"] {
            config.upstreams[0].base_url = bad.into();
            assert_eq!(config.validate().unwrap_err().entry, "upstreams[0].base_url", "{bad}");
        }
    }

    #[test]
    fn counting_fields_are_optional_and_never_zero() {
        // An Anthropic model and an embeddings model as the docs show them: no
        // output default, no counting bound.
        let text = EXAMPLE.replace("    max_output_tokens_default: 1024\n", "").replace(
            "tenants:",
            "  - {name: text-embedding-3-small, upstream: openai, tpm: 1000000}\ntenants:",
        );
        let config = parse(&text);
        config.validate().unwrap();
        assert_eq!(config.models[1].max_output_tokens_default, None);
        assert_eq!(config.models[2].max_output_tokens_default, None);
        for field in [
            "max_output_tokens_default",
            "file_tokens",
            "stored_context_tokens",
            "image_tokens",
        ] {
            let text = EXAMPLE.replace("    max_wait_ms: 0\n", &format!("    max_wait_ms: 0\n    {field}: 0\n"));
            let text = text.replace("    max_output_tokens_default: 4096\n", "");
            let error = parse(&text).validate().unwrap_err();
            assert_eq!(error.entry, format!("models[0].{field}"), "{error}");
        }
    }

    #[test]
    fn a_profile_is_validated_with_the_entry_named() {
        let mut config = parse(EXAMPLE);
        config.models[0].limits.profile = Some("openai".into());
        config.validate().unwrap();
        let profile = config.models[0].llm_profile("openai").unwrap().unwrap();
        assert_eq!(
            profile.definitions[0].key().as_str(),
            "global:llm:openai:gpt-4o-mini:rpm",
            "keyed by the upstream's name"
        );
        config.models[0].limits.profile = Some("mistral".into());
        let error = config.validate().unwrap_err();
        assert_eq!(error.entry, "models[0].profile");
        assert!(error.message.contains("mistral"), "{error}");
        // Anthropic's profile needs its rpm.
        let mut config = parse(EXAMPLE);
        config.models[1].limits.published.rpm = None;
        let error = config.validate().unwrap_err();
        assert_eq!(error.entry, "models[1].profile");
        assert!(error.message.contains("rpm"), "{error}");
        // A profile's own numbers need a profile.
        let mut config = parse(EXAMPLE);
        config.models[0].limits.published.quantum_seconds = Some(2);
        assert_eq!(config.validate().unwrap_err().entry, "models[0].quantum_seconds");
        config.models[0].limits.profile = Some("openai".into());
        config.validate().unwrap();
        config.models[0].limits.published.quantum_seconds = Some(61);
        assert_eq!(config.validate().unwrap_err().entry, "models[0].profile");
    }

    /// The pool example of docs/gateway.md ("Pools"), its `gateway:` section.
    #[test]
    fn a_misspelt_field_of_a_model_or_a_deployment_is_refused_by_name() {
        // The limits are flattened into both entries, so serde cannot deny unknown
        // keys there: `validate` must, or `tmp: 5` would mean "no token limit".
        let text = EXAMPLE.replace("    tpm: 200000\n", "    tmp: 200000\n");
        let error = parse(&text).validate().unwrap_err();
        assert_eq!(error.entry, "models[0].tmp");
        assert_eq!(error.message, "unknown field");
        let text = docs_pool_text().replace("          concurrency: 20\n", "          concurency: 20\n");
        let error = parse_section(&text).validate().unwrap_err();
        assert_eq!(error.entry, "models[0].deployments[1].concurency");
        assert_eq!(error.message, "unknown field");
        // A known field still lands in the flattened limits.
        let config = parse(EXAMPLE);
        assert_eq!(config.models[0].limits.published.tpm, Some(200_000));
        assert_eq!(config.models[1].limits.profile.as_deref(), Some("anthropic"));
        assert_eq!(config.models[0].limits.unknown, UnknownFields::default());
    }

    /// The YAML example of docs/gateway.md, "Pools".
    fn docs_pool_text() -> String {
        let docs = include_str!("../../../docs/gateway.md");
        let pools = &docs[docs.find("## Pools").expect("a Pools section")..];
        let start = pools.find("```yaml\n").expect("a YAML example") + "```yaml\n".len();
        pools[start..start + pools[start..].find("```").unwrap()].to_owned()
    }

    /// A `gateway:` section, parsed.
    fn parse_section(text: &str) -> GatewayConfig {
        #[derive(Deserialize)]
        struct Section {
            gateway: GatewayConfig,
        }
        serde_yaml::from_str::<Section>(text).unwrap().gateway
    }

    fn docs_pool() -> GatewayConfig {
        parse_section(&docs_pool_text())
    }

    #[test]
    fn the_documented_pool_is_valid_and_resolves_into_its_deployments() {
        let config = docs_pool();
        config.validate().unwrap();
        let deployments = crate::pool::resolve(&config.models[0]);
        let keys: Vec<String> = deployments
            .iter()
            .map(|d| format!("{}/{}/{}", d.model.upstream, d.model.name, d.priority))
            .collect();
        assert_eq!(
            keys,
            ["azure-east/gpt-4o-ptu/0", "azure-west/gpt-4o/1", "openai/gpt-4o/1"]
        );
        assert_eq!(deployments[1].model.limits.published.concurrency, Some(20));
        assert_eq!(deployments[2].model.limits.profile.as_deref(), Some("openai"));
        assert_eq!(
            deployments[0].model.max_wait_ms, 2000,
            "the model's own fields carry over"
        );
    }

    #[test]
    fn pool_configuration_errors_name_the_model_and_the_entry() {
        let error_of = |edit: &dyn Fn(&mut GatewayConfig)| {
            let mut config = docs_pool();
            edit(&mut config);
            let error = config.validate().unwrap_err();
            assert!(error.message.contains("\"gpt-4o\""), "{error}");
            error.entry
        };
        assert_eq!(
            error_of(&|c| c.models[0].upstream = "openai".into()),
            "models[0].upstream"
        );
        assert_eq!(
            error_of(&|c| c.models[0].limits.published.rpm = Some(5)),
            "models[0].rpm"
        );
        assert_eq!(error_of(&|c| c.models[0].deployments.clear()), "models[0].upstream");
        assert_eq!(
            error_of(&|c| c.models[0].deployments[1].weight = Some(2)),
            "models[0].deployments[1].weight"
        );
        assert_eq!(
            error_of(&|c| {
                let copy = c.models[0].deployments[1].clone();
                c.models[0].deployments.push(copy);
            }),
            "models[0].deployments[3].model"
        );
        assert_eq!(
            error_of(&|c| c.models[0].breaker = Some(crate::breaker::BreakerConfig {
                failures: 0,
                open_ms: 1
            })),
            "models[0].breaker.failures"
        );
        // Mixed wire formats.
        let error = {
            let mut config = docs_pool();
            config.upstreams.push(UpstreamConfig {
                name: "claude".into(),
                kind: UpstreamKind::Anthropic,
                base_url: "https://api.anthropic.com".into(),
                api_key_env: None,
                forward_headers: Vec::new(),
            });
            config.models[0].deployments[2].upstream = "claude".into();
            config.models[0].deployments[2].limits.profile = None;
            config.validate().unwrap_err()
        };
        assert_eq!(error.entry, "models[0].deployments[2].upstream");
        // A deployment's own checks, with its entry named.
        let mut config = docs_pool();
        config.models[0].deployments[0].limits.published.rpm = Some(0);
        assert_eq!(config.validate().unwrap_err().entry, "models[0].deployments[0].rpm");
        config.models[0].deployments[0].limits.published.rpm = Some(1);
        config.models[0].deployments[0].upstream = "nowhere".into();
        assert_eq!(
            config.validate().unwrap_err().entry,
            "models[0].deployments[0].upstream"
        );
        // A pool's fields on a single-deployment model.
        let mut config = parse(EXAMPLE);
        config.models[0].routing = crate::routing::Routing::Weighted;
        assert_eq!(config.validate().unwrap_err().entry, "models[0].routing");
        // A deployment may not share a single model's keys.
        let mut config = docs_pool();
        let mut single = parse(EXAMPLE).models[0].clone();
        single.name = "gpt-4o-ptu".into();
        single.upstream = "azure-east".into();
        config.models.push(single);
        assert_eq!(config.validate().unwrap_err().entry, "models[1].model");
    }
}
