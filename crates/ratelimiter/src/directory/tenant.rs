//! A tenant of the gateway: a team or application charged as one, with its
//! limits, priority class and the models it may use.

use serde::{Deserialize, Serialize};

use super::limits::{check_budgets, check_limit};
use super::name::{check_models, check_tenant_name};
use super::DirectoryError;
use crate::price::budget::BudgetConfig;

/// The largest per-tenant cap on open or queued calls: the gateway's own
/// bound (`gateway::config::TENANT_CAP_LIMIT`, checked equal by the server's tests).
pub const TENANT_CAP_MAX: u64 = 100_000;

/// The start of the incarnation id of every YAML tenant (`config:<name>`).
pub const CONFIG_TENANT_ID_PREFIX: &str = "config:";

/// Where a tenant comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The YAML's `gateway.tenants`: applied at every start, changed by
    /// editing the file only (the API may add keys to it).
    Config,
    /// Created through the admin API, kept in the directory's store.
    Api,
}

/// What an operator sets on a tenant.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantFields {
    /// Its priority class (an entry of the gateway's `classes`); none: the lowest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// Requests per minute over every model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpm: Option<u64>,
    /// Calls in flight over every model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u64>,
    /// Tokens per rolling day.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daily_tokens: Option<u64>,
    /// Calls open at once; none: the gateway's `tenant_connections_max`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections_max: Option<u64>,
    /// Calls waiting in queues at once; none: the gateway's `tenant_queued_max`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_max: Option<u64>,
    /// The models it may use; none: every model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// Its budgets in money, as a configured tenant's `budgets`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budgets: Option<Vec<BudgetConfig>>,
}

impl TenantFields {
    /// Checks every field's own rule (the class and the models against the
    /// gateway's configuration are the server's check).
    pub fn validate(&self) -> Result<(), DirectoryError> {
        for (field, value) in [
            ("rpm", self.rpm),
            ("concurrency", self.concurrency),
            ("daily_tokens", self.daily_tokens),
        ] {
            check_limit(field, value)?;
        }
        for (field, value) in [
            ("connections_max", self.connections_max),
            ("queued_max", self.queued_max),
        ] {
            if value.is_some_and(|v| v == 0 || v > TENANT_CAP_MAX) {
                return Err(DirectoryError::invalid(field, format!("must be 1..={TENANT_CAP_MAX}")));
            }
        }
        if let Some(class) = &self.class {
            check_tenant_name("class", class)?;
        }
        if let Some(models) = &self.models {
            check_models("models", models)?;
        }
        check_budgets(self.budgets.as_deref())
    }
}

/// A tenant as the directory keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantRecord {
    /// Its name, unique among live tenants: the `tenant:<name>:…` limit keys.
    pub name: String,
    /// This incarnation of the name: a tenant deleted and created again is
    /// another tenant, and the first one's keys never work for the second.
    /// `config:<name>` for a tenant of the YAML.
    pub id: String,
    /// Where it comes from.
    pub source: Source,
    /// Its settings (an object of its own: see [`super::KeyRecord::limits`]).
    #[serde(default)]
    pub fields: TenantFields,
    /// When it was created, ms since the Unix epoch.
    pub created_at_unix_ms: u64,
    /// When it last changed, ms since the Unix epoch.
    pub updated_at_unix_ms: u64,
}

impl TenantRecord {
    /// The tenant of a YAML entry: its incarnation is its name, so the keys the
    /// API gives it work across restarts as long as the entry stays.
    pub fn from_config(name: &str, fields: TenantFields) -> Self {
        Self {
            name: name.to_owned(),
            id: format!("{CONFIG_TENANT_ID_PREFIX}{name}"),
            source: Source::Config,
            fields,
            created_at_unix_ms: 0,
            updated_at_unix_ms: 0,
        }
    }

    /// True when the tenant may use `model` (its scope lists it, or it has none).
    pub fn allows_model(&self, model: &str) -> bool {
        self.fields.models.as_ref().is_none_or(|m| m.iter().any(|n| n == model))
    }
}

/// A change of a tenant's fields: each field present replaces the current
/// value, `Some(None)` clears it (JSON `null`), absent leaves it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantPatch {
    /// `class`.
    pub class: Option<Option<String>>,
    /// `rpm`.
    pub rpm: Option<Option<u64>>,
    /// `concurrency`.
    pub concurrency: Option<Option<u64>>,
    /// `daily_tokens`.
    pub daily_tokens: Option<Option<u64>>,
    /// `connections_max`.
    pub connections_max: Option<Option<u64>>,
    /// `queued_max`.
    pub queued_max: Option<Option<u64>>,
    /// `models`.
    pub models: Option<Option<Vec<String>>>,
    /// `budgets`.
    pub budgets: Option<Option<Vec<BudgetConfig>>>,
}

impl TenantPatch {
    /// `fields` with this patch applied, validated.
    pub fn applied_to(&self, fields: &TenantFields) -> Result<TenantFields, DirectoryError> {
        fn pick<T: Clone>(patch: &Option<Option<T>>, current: &Option<T>) -> Option<T> {
            patch.clone().unwrap_or_else(|| current.clone())
        }
        let out = TenantFields {
            class: pick(&self.class, &fields.class),
            rpm: pick(&self.rpm, &fields.rpm),
            concurrency: pick(&self.concurrency, &fields.concurrency),
            daily_tokens: pick(&self.daily_tokens, &fields.daily_tokens),
            connections_max: pick(&self.connections_max, &fields.connections_max),
            queued_max: pick(&self.queued_max, &fields.queued_max),
            models: pick(&self.models, &fields.models),
            budgets: pick(&self.budgets, &fields.budgets),
        };
        out.validate()?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::KeyLimits;
    use super::*;

    #[test]
    fn fields_are_checked_by_name_and_patches_replace_or_clear() {
        let fields = TenantFields {
            rpm: Some(10),
            models: Some(vec!["gpt-4o-mini".into()]),
            ..Default::default()
        };
        assert!(fields.validate().is_ok());
        for (bad, field) in [
            (
                TenantFields {
                    rpm: Some(0),
                    ..Default::default()
                },
                "rpm: ",
            ),
            (
                TenantFields {
                    queued_max: Some(TENANT_CAP_MAX + 1),
                    ..Default::default()
                },
                "queued_max: ",
            ),
            (
                TenantFields {
                    class: Some("a b".into()),
                    ..Default::default()
                },
                "class: ",
            ),
        ] {
            assert!(bad.validate().unwrap_err().to_string().starts_with(field), "{field}");
        }
        let patch = TenantPatch {
            rpm: Some(None),
            concurrency: Some(Some(4)),
            ..Default::default()
        };
        let patched = patch.applied_to(&fields).unwrap();
        assert_eq!((patched.rpm, patched.concurrency), (None, Some(4)));
        assert_eq!(patched.models, fields.models, "absent fields stay");
        let bad = TenantPatch {
            daily_tokens: Some(Some(0)),
            ..Default::default()
        };
        assert!(bad.applied_to(&fields).is_err());
    }

    #[test]
    fn budgets_are_checked_as_the_configurations_and_patched_whole() {
        let budgets = |json: &str| serde_json::from_str::<Vec<BudgetConfig>>(json).unwrap();
        let fields = TenantFields {
            budgets: Some(budgets(r#"[{"usd": 500, "period": "month"}]"#)),
            ..Default::default()
        };
        fields.validate().unwrap();
        let patch = TenantPatch {
            budgets: Some(Some(budgets(r#"[{"usd": -1, "period": "day"}]"#))),
            ..Default::default()
        };
        let error = patch.applied_to(&fields).unwrap_err().to_string();
        assert!(error.starts_with("budgets[0].usd"), "{error}");
        let patch = TenantPatch {
            budgets: Some(None),
            ..Default::default()
        };
        assert_eq!(patch.applied_to(&fields).unwrap().budgets, None, "null clears them");
        let key = KeyLimits {
            budgets: Some(budgets(r#"[{"usd": 5, "period": "fortnight"}]"#)),
            ..Default::default()
        };
        let spec = super::super::KeySpec {
            tenant: "acme".into(),
            limits: key,
            ..Default::default()
        };
        assert!(spec
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("budgets[0].period"));
    }
}
