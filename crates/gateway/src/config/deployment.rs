//! What one deployment of a model is held to and where it sits in its pool
//! (docs/gateway.md, "Pools"): the limit fields a model entry and each of its
//! `deployments:` share, and the deployments' own entries. Below the model
//! entry that holds them and the rules that resolve a model into them.

use std::collections::BTreeMap;

use ratelimiter::profile::Published;
use serde::Deserialize;

/// How a pool picks among deployments of one priority.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Routing {
    /// The deployment with the most free capacity for this call, as a fraction of
    /// its limits: every deployment fills evenly.
    #[default]
    Capacity,
    /// The first listed first.
    Ordered,
    /// In proportion to `weight` (smooth weighted round robin: exact shares, no
    /// runs on one deployment).
    Weighted,
}

/// The most deployments in one pool: each is tried at most once per call, and the
/// set of those tried is a bit mask.
pub const DEPLOYMENTS_MAX: usize = 16;
/// The largest `weight`.
pub const WEIGHT_MAX: u32 = 1_000;
/// The largest `priority`.
pub const PRIORITY_MAX: u32 = 1_000;

/// One `deployments:` entry: everything a single-deployment model takes, per
/// deployment, plus its place in the pool.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct DeploymentConfig {
    /// The `upstreams:` entry.
    pub upstream: String,
    /// The model name sent upstream (the `model` field is rewritten to it); the
    /// limit keys are named by it: `global:llm:<upstream>:<model>:...`. Default:
    /// the model's name.
    #[serde(default)]
    pub model: Option<String>,
    /// Lower is tried first; a higher one only while every lower one is full,
    /// paused or failing.
    #[serde(default)]
    pub priority: u32,
    /// The share under `routing: weighted` (default 1; weighted routing only).
    #[serde(default)]
    pub weight: Option<u32>,
    /// The deployment's price (a PTU at 0 beside pay-as-you-go spillover);
    /// none: the model's.
    #[serde(default)]
    pub price: Option<ratelimiter::price::ModelPrice>,
    /// The deployment's limits and provider profile.
    #[serde(flatten)]
    pub limits: DeploymentLimits,
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
    /// Keys no field of the entry took, refused by
    /// [`GatewayConfig::validate`](crate::config::GatewayConfig::validate). Last,
    /// and here rather than in the entry: serde hands a flattened field only the
    /// keys the fields before it left.
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
/// collect their leftover keys here and
/// [`GatewayConfig::validate`](crate::config::GatewayConfig::validate) refuses
/// any: a misspelt limit must not fall back to "unlimited".
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
