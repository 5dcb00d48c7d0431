//! The limit keys a call is charged on, by owner (docs/gateway.md, "Limits"):
//! a model's deployment, a tenant, a directory key, each with its budgets in
//! money. What the keys are, below what a call reserves and completes on them
//! (`keys.rs`) and what its budgets are charged (`budgets.rs`).

use ratelimiter::directory::KeyRecord;
use ratelimiter::price::ModelPrice;
use ratelimiter::profile::ProfileRules;
use ratelimiter::LimitKey;

use super::budget_key::{budget_keys, directory_budget_keys, BudgetKey};
use crate::config::{validate_budgets, ModelConfig, TenantConfig};

/// One model's keys; `None` where the configuration sets no limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelKeys {
    /// `global:llm:<upstream>:<model>:rpm`.
    pub rpm: Option<LimitKey>,
    /// `...:tpm`: prompt and output together.
    pub tpm: Option<LimitKey>,
    /// `...:input_tpm` (Anthropic's ITPM).
    pub input_tpm: Option<LimitKey>,
    /// `...:output_tpm` (Anthropic's OTPM).
    pub output_tpm: Option<LimitKey>,
    /// `...:concurrency`.
    pub concurrency: Option<LimitKey>,
    /// A model with a `profile`: its provider's rules choose the reservation and
    /// reconciliation on the profile's keys (`rpm` and `concurrency` above are the
    /// profile's; the token keys above are `None`).
    pub profile: Option<ProfileRules>,
    /// The deployment's price, when one resolves (its own, its model's or a list
    /// price): what the call's budgets in money reserve and reconcile at.
    pub price: Option<ModelPrice>,
    /// The budgets every call of the deployment's model reserves besides its
    /// caller's: the model's (`model:<name>:usd:<span>`) and the gateway's.
    pub usd: Vec<BudgetKey>,
}

/// One caller's keys: its tenant's, and for a key of the directory the key's
/// own, reserved in the same all-or-nothing reservation; `None` where no limit is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantKeys {
    /// `tenant:<name>:llm:daily_tokens`.
    pub daily_tokens: Option<LimitKey>,
    /// `tenant:<name>:llm:rpm`.
    pub rpm: Option<LimitKey>,
    /// `tenant:<name>:llm:concurrency`.
    pub concurrency: Option<LimitKey>,
    /// The presented key's own limits; `None` for a tenant's configured key.
    pub key: Option<KeyLimitKeys>,
    /// The tenant's budgets in money (`tenant:<name>:usd:<span>`).
    pub usd: Vec<BudgetKey>,
}

/// A directory key's own limits (`key:<id>:llm:<dimension>`, docs/gateway.md,
/// "Tenants and keys"); `None` where the key sets no limit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyLimitKeys {
    /// `key:<id>:llm:daily_tokens`.
    pub daily_tokens: Option<LimitKey>,
    /// `key:<id>:llm:rpm`.
    pub rpm: Option<LimitKey>,
    /// `key:<id>:llm:concurrency`.
    pub concurrency: Option<LimitKey>,
    /// The key's budgets in money (`key:<id>:usd:<span>`).
    pub usd: Vec<BudgetKey>,
}

pub use ratelimiter::directory::KEY_LIMIT_PREFIX;
/// The start of every tenant's own limit keys (`tenant:<name>:llm:<dimension>`).
pub const TENANT_LIMIT_PREFIX: &str = "tenant:";
/// The prefixes of the keys a caller owns alone: its tenant's limits and its
/// API key's. A wait on one of them is the caller's own business.
pub const OWN_KEY_PREFIXES: [&str; 2] = [TENANT_LIMIT_PREFIX, KEY_LIMIT_PREFIX];

/// Whether `key` limits one caller alone (a tenant's or an API key's limit), as
/// opposed to a key every caller shares (a model's, a deployment's, a ceiling).
pub fn is_own_key(key: &str) -> bool {
    OWN_KEY_PREFIXES.iter().any(|prefix| key.starts_with(prefix))
}

fn key(text: String) -> LimitKey {
    LimitKey::new(text).expect("names were validated with the configuration")
}

impl ModelKeys {
    /// The keys of `model` on `upstream`.
    pub fn new(upstream: &str, model: &ModelConfig) -> Self {
        if let Some(profile) = model.llm_profile(upstream) {
            let rules = profile.expect("profiles were validated with the configuration").rules;
            return Self {
                rpm: Some(rules.requests_key().clone()),
                tpm: None,
                input_tpm: None,
                output_tpm: None,
                concurrency: rules.concurrency_key().cloned(),
                profile: Some(rules),
                price: None,
                usd: Vec::new(),
            };
        }
        let global = |dimension: &str| key(format!("global:llm:{upstream}:{}:{dimension}", model.key_name()));
        Self {
            rpm: model.limits.published.rpm.map(|_| global("rpm")),
            tpm: model.limits.published.tpm.map(|_| global("tpm")),
            input_tpm: model.limits.published.input_tpm.map(|_| global("input_tpm")),
            output_tpm: model.limits.published.output_tpm.map(|_| global("output_tpm")),
            concurrency: model.limits.published.concurrency.map(|_| global("concurrency")),
            profile: None,
            price: None,
            usd: Vec::new(),
        }
    }

    /// These keys with the deployment's `price` and the budgets (`usd`) its
    /// calls reserve besides their caller's.
    pub fn with_budgets(self, price: Option<ModelPrice>, usd: Vec<BudgetKey>) -> Self {
        Self { price, usd, ..self }
    }
}

impl TenantKeys {
    /// The keys of `tenant`.
    pub fn new(tenant: &TenantConfig) -> Self {
        let keys = Self::of(&tenant.name, (tenant.rpm, tenant.concurrency, tenant.daily_tokens));
        let budgets = validate_budgets(&tenant.budgets, &|f: &str| f.to_owned())
            .expect("budgets were validated with the configuration");
        keys.with_budgets(budget_keys(&tenant_budget_prefix(&tenant.name), &budgets))
    }

    /// These keys with the tenant's budgets in money.
    pub fn with_budgets(self, usd: Vec<BudgetKey>) -> Self {
        Self { usd, ..self }
    }

    /// Every budget in money of the call's caller: the tenant's, then its key's.
    pub fn usd_budgets(&self) -> impl Iterator<Item = &BudgetKey> {
        let key = self.key.iter().flat_map(|k| k.usd.iter());
        self.usd.iter().chain(key)
    }

    /// The keys of the tenant `name` with `(rpm, concurrency, daily_tokens)`
    /// set or not: a tenant of the configuration or of the directory alike.
    pub fn of(name: &str, (rpm, concurrency, daily_tokens): (Option<u64>, Option<u64>, Option<u64>)) -> Self {
        let own = |dimension: &str| key(format!("{TENANT_LIMIT_PREFIX}{name}:llm:{dimension}"));
        Self {
            daily_tokens: daily_tokens.map(|_| own("daily_tokens")),
            rpm: rpm.map(|_| own("rpm")),
            concurrency: concurrency.map(|_| own("concurrency")),
            key: None,
            usd: Vec::new(),
        }
    }

    /// These keys with a directory key's own limits beside them.
    pub fn with_key(&self, key: KeyLimitKeys) -> Self {
        Self {
            key: Some(key),
            ..self.clone()
        }
    }

    /// The daily token budgets: the tenant's, and the key's own.
    pub fn budgets(&self) -> impl Iterator<Item = &LimitKey> {
        let key = self.key.as_ref().and_then(|k| k.daily_tokens.as_ref());
        self.daily_tokens.iter().chain(key)
    }
}

/// The start of the tenant `name`'s budget keys: `tenant:<name>:` (then `usd:<span>`).
pub fn tenant_budget_prefix(name: &str) -> String {
    format!("{TENANT_LIMIT_PREFIX}{name}:")
}

impl KeyLimitKeys {
    /// The limit keys of `key`'s own limits (shared by the keys of one rotation).
    pub fn of(key: &KeyRecord) -> Self {
        let l = &key.limits;
        Self {
            daily_tokens: l.daily_tokens.map(|_| key.limit_key("daily_tokens")),
            rpm: l.rpm.map(|_| key.limit_key("rpm")),
            concurrency: l.concurrency.map(|_| key.limit_key("concurrency")),
            usd: directory_budget_keys(&key.budget_prefix(), l.budgets.as_deref()),
        }
    }
}
