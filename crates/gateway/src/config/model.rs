//! The entries of the `gateway:` section: upstreams, models with their limits,
//! and tenants.

use ratelimiter::price::ModelPrice;
use ratelimiter::profile::{llm_profile_keyed, LlmProfile, ProfileError};
use serde::Deserialize;

use super::{BreakerConfig, BudgetConfig, DeploymentConfig, DeploymentLimits, Routing};

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
    pub routing: Routing,
    /// The pool's deployments, instead of `upstream` and the limits above.
    #[serde(default)]
    pub deployments: Vec<DeploymentConfig>,
    /// The circuit breaker of each of the pool's deployments (pools only).
    #[serde(default)]
    pub breaker: Option<BreakerConfig>,
    /// The model's price in USD per million tokens (docs/gateway.md, "Budgets and
    /// spend"); a deployment's own `price` wins. None: the list price, if any.
    #[serde(default)]
    pub price: Option<ModelPrice>,
    /// Budgets on every call of the model, whatever the tenant (`model:<name>:usd:<span>`).
    #[serde(default)]
    pub budgets: Vec<BudgetConfig>,
}

/// The model part of a deployment's limit keys: the name sent upstream with
/// each `:` written `@` (docs/gateway.md, "Amazon Bedrock", limit keys). A key
/// component holds no `:` (it separates the key's parts); only a Bedrock model
/// id may hold one (`us.anthropic.claude-sonnet-4-5-20250929-v1:0`), and a
/// Bedrock model id holding `@` is refused, so on every upstream the mapping
/// is one-to-one: ids without `:` are their own key name, and a Bedrock key
/// name's `@` can only have been a `:`.
pub fn key_model_name(name: &str) -> std::borrow::Cow<'_, str> {
    if name.contains(':') {
        std::borrow::Cow::Owned(name.replace(':', "@"))
    } else {
        std::borrow::Cow::Borrowed(name)
    }
}

impl ModelConfig {
    /// The model part of its limit keys ([`key_model_name`] of its name).
    pub fn key_name(&self) -> std::borrow::Cow<'_, str> {
        key_model_name(&self.name)
    }

    /// The model's provider profile, keyed by the name of `upstream` (the keys stay
    /// `global:llm:<upstream>:<model>:...`); `None` without `profile`.
    pub fn llm_profile(&self, upstream: &str) -> Option<Result<LlmProfile, ProfileError>> {
        let provider = self.limits.profile.as_deref()?;
        Some(llm_profile_keyed(
            provider,
            upstream,
            &self.key_name(),
            &self.limits.published,
        ))
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
    /// The tenant's budgets in money (`tenant:<name>:usd:<span>`).
    #[serde(default)]
    pub budgets: Vec<BudgetConfig>,
}
