//! A gateway key: who it charges (its tenant), what it may use (its models),
//! its own limits and its life (created, expiring, revoked). The key's text is
//! never kept: its [`KeyHash`] and a hint of its last characters are.

use serde::{Deserialize, Serialize};

/// The start of every key's own limit keys (`key:<id>:llm:<dimension>`): the
/// gateway tells a key's own limit from a shared one by it.
pub const KEY_LIMIT_PREFIX: &str = "key:";

use super::limits::{check_budgets, check_limit};
use super::name::{check_key_name, check_models};
use super::secret::KeyHash;
use super::DirectoryError;
use crate::model::definition::LimitDefinition;
use crate::model::key::LimitKey;
use crate::price::budget::BudgetConfig;

/// The longest life a key may be given at creation: ten years.
pub const EXPIRES_IN_SECONDS_MAX: u64 = 10 * 365 * 86_400;
/// The longest a rotated key keeps working beside its successor: thirty
/// days, long enough to redeploy every application that holds it.
pub const GRACE_SECONDS_MAX: u64 = 30 * 86_400;
/// The window of a key's `rpm`: requests per minute, as the providers state theirs.
pub const MINUTE_WINDOW_SECONDS: u64 = 60;
/// The window of a key's `daily_tokens`: a rolling day.
pub const DAY_WINDOW_SECONDS: u64 = 86_400;

/// A key's own limits, charged beside its tenant's and the model's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyLimits {
    /// Requests per minute of this key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpm: Option<u64>,
    /// Calls in flight of this key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u64>,
    /// Tokens per rolling day of this key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daily_tokens: Option<u64>,
    /// Its budgets in money (`key:<id>:usd:<span>`), as a tenant's `budgets`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budgets: Option<Vec<BudgetConfig>>,
}

/// What a key is created with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeySpec {
    /// The tenant it charges.
    pub tenant: String,
    /// A label for people (`ci-runner`); may be empty.
    pub name: String,
    /// The models it may use, within its tenant's; none: its tenant's.
    pub models: Option<Vec<String>>,
    /// Its life from creation; none: until revoked.
    pub expires_in_seconds: Option<u64>,
    /// Its own limits.
    pub limits: KeyLimits,
}

impl KeySpec {
    /// Checks every field's own rule.
    pub fn validate(&self) -> Result<(), DirectoryError> {
        check_key_name("name", &self.name)?;
        if let Some(models) = &self.models {
            check_models("models", models)?;
        }
        if self
            .expires_in_seconds
            .is_some_and(|s| s == 0 || s > EXPIRES_IN_SECONDS_MAX)
        {
            return Err(DirectoryError::invalid(
                "expires_in_seconds",
                format!("must be 1..={EXPIRES_IN_SECONDS_MAX}"),
            ));
        }
        check_limit("rpm", self.limits.rpm)?;
        check_limit("concurrency", self.limits.concurrency)?;
        check_limit("daily_tokens", self.limits.daily_tokens)?;
        check_budgets(self.limits.budgets.as_deref())
    }
}

/// A key as the directory keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// Its id (a ULID): how the API and the logs name it.
    pub id: String,
    /// The name of the tenant it charges.
    pub tenant: String,
    /// The incarnation of that tenant ([`super::TenantRecord::id`]): the key
    /// works only while this very tenant lives.
    pub tenant_id: String,
    /// A label for people; may be empty.
    #[serde(default)]
    pub name: String,
    /// The models it may use; none: its tenant's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// Its own limits (an object of its own, not flattened: a flattened
    /// field makes every record parse through a buffer, several times slower
    /// to read at start).
    #[serde(default)]
    pub limits: KeyLimits,
    /// The id whose limit keys it charges: its own, or for a key made by a
    /// rotation, the first key's, so a rotation does not reset the counters
    /// and the two keys of a grace period share one budget.
    pub limits_of: String,
    /// The SHA-256 of its text.
    pub hash: KeyHash,
    /// The last characters of its text.
    pub hint: String,
    /// When it was created, ms since the Unix epoch.
    pub created_at_unix_ms: u64,
    /// When it stops working, ms since the Unix epoch; none: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_unix_ms: Option<u64>,
    /// When it was revoked (or its tenant deleted), ms since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at_unix_ms: Option<u64>,
    /// The key that replaced it by a rotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotated_to: Option<String>,
}

/// Where a key stands at an instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyStatus {
    /// It works.
    Active,
    /// Its life ended.
    Expired,
    /// It was revoked, or its tenant deleted.
    Revoked,
}

impl KeyRecord {
    /// Where the key stands at `now_unix_ms`.
    pub fn status(&self, now_unix_ms: u64) -> KeyStatus {
        if self.revoked_at_unix_ms.is_some() {
            KeyStatus::Revoked
        } else if self.expires_at_unix_ms.is_some_and(|at| now_unix_ms >= at) {
            KeyStatus::Expired
        } else {
            KeyStatus::Active
        }
    }

    /// When it stopped working, for good: the first of its revocation and
    /// its expiry (`None` while neither happened or is due). A key of a YAML
    /// tenant missing from the file has not ended: it works again with the entry.
    pub fn ended_at_unix_ms(&self, now_unix_ms: u64) -> Option<u64> {
        let expired = self.expires_at_unix_ms.filter(|at| *at <= now_unix_ms);
        match (self.revoked_at_unix_ms, expired) {
            (Some(revoked), Some(expired)) => Some(revoked.min(expired)),
            (revoked, expired) => revoked.or(expired),
        }
    }

    /// `key:<limits_of>:llm:<dimension>`: the limit key of one of its limits.
    pub fn limit_key(&self, dimension: &str) -> LimitKey {
        LimitKey::new(format!("{KEY_LIMIT_PREFIX}{}:llm:{dimension}", self.limits_of))
            .expect("a ULID and a dimension make a valid key")
    }

    /// `key:<limits_of>:`: the start of its budgets' limit keys (`...usd:<span>`).
    pub fn budget_prefix(&self) -> String {
        format!("{KEY_LIMIT_PREFIX}{}:", self.limits_of)
    }

    /// The definitions of its own limits: `rpm` per minute, `daily_tokens`
    /// per rolling day, `concurrency` held up to `concurrency_hold_seconds`
    /// (the gateway's upstream timeout and its margin, as for a tenant's).
    pub fn limit_definitions(&self, concurrency_hold_seconds: u64) -> Vec<LimitDefinition> {
        let mut out = Vec::new();
        let valid = "validated limits make valid definitions";
        if let Some(rpm) = self.limits.rpm {
            out.push(LimitDefinition::rolling(self.limit_key("rpm"), rpm, MINUTE_WINDOW_SECONDS).expect(valid));
        }
        if let Some(tokens) = self.limits.daily_tokens {
            out.push(
                LimitDefinition::rolling(self.limit_key("daily_tokens"), tokens, DAY_WINDOW_SECONDS).expect(valid),
            );
        }
        if let Some(concurrency) = self.limits.concurrency {
            out.push(
                LimitDefinition::concurrency(self.limit_key("concurrency"), concurrency, concurrency_hold_seconds)
                    .expect(valid),
            );
        }
        out
    }

    /// True when the key's own scope allows `model` (its tenant's is checked apart).
    pub fn allows_model(&self, model: &str) -> bool {
        self.models.as_ref().is_none_or(|m| m.iter().any(|n| n == model))
    }

    /// What the API shows of it at `now_unix_ms`: everything but the hash.
    pub fn view(&self, now_unix_ms: u64) -> KeyView {
        KeyView {
            id: self.id.clone(),
            tenant: self.tenant.clone(),
            name: self.name.clone(),
            models: self.models.clone(),
            limits: self.limits.clone(),
            hint: format!("…{}", self.hint),
            status: self.status(now_unix_ms),
            created_at: self.created_at_unix_ms / 1_000,
            expires_at: self.expires_at_unix_ms.map(|ms| ms / 1_000),
            revoked_at: self.revoked_at_unix_ms.map(|ms| ms / 1_000),
            rotated_to: self.rotated_to.clone(),
        }
    }
}

/// A key as the API lists it: never its text nor its hash. Times are Unix
/// seconds, as OpenAI's objects give their `created_at`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyView {
    /// Its id.
    pub id: String,
    /// Its tenant.
    pub tenant: String,
    /// Its label.
    pub name: String,
    /// The models it may use; `null`: its tenant's.
    pub models: Option<Vec<String>>,
    /// Its own limits (`rpm`, `concurrency`, `daily_tokens` when set).
    #[serde(flatten)]
    pub limits: KeyLimits,
    /// `…` and its last characters.
    pub hint: String,
    /// `active`, `expired` or `revoked`.
    pub status: KeyStatus,
    /// Unix seconds.
    pub created_at: u64,
    /// Unix seconds; `null`: never.
    pub expires_at: Option<u64>,
    /// Unix seconds, when revoked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<u64>,
    /// Its successor, after a rotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotated_to: Option<String>,
}
