//! The gateway's tenants and keys on this server (docs/gateway.md, "Tenants
//! and keys"): which store keeps them (a file beside the registry on the
//! memory backend, the cluster on TigerBeetle), the YAML's tenants beside the
//! stored ones, and what the gateway's configuration allows a tenant or key
//! to name (its classes and models).

use std::collections::BTreeSet;
use std::sync::Arc;

use ratelimiter::directory::{
    journal_path, Directory, DirectoryError, DirectoryStore, FileStore, TenantFields, TenantRecord,
};
use ratelimiter::Clock;

use crate::config::Config;

/// What the gateway's configuration lets a tenant or key name.
#[derive(Debug, Clone, Default)]
pub struct GatewayScope {
    /// The configured classes; `None`: no gateway section, any valid name.
    classes: Option<BTreeSet<String>>,
    /// The configured models; `None`: no gateway section, any valid name.
    models: Option<BTreeSet<String>>,
    /// How long a key's concurrency slot is held at most, as a tenant's.
    concurrency_hold_seconds: u64,
}

impl GatewayScope {
    /// The scope of `config`'s gateway section.
    pub fn of(config: &Config) -> Self {
        use gateway::config::UPSTREAM_TIMEOUT_MS_DEFAULT;
        use gateway::limits::CONCURRENCY_TIMEOUT_MARGIN_SECONDS;
        let section = config.gateway.as_ref();
        let upstream_timeout_ms = section.map_or(UPSTREAM_TIMEOUT_MS_DEFAULT, |g| g.upstream_timeout_ms);
        Self {
            classes: section.map(|g| g.classes.iter().map(|c| c.name.clone()).collect()),
            models: section.map(|g| g.models.iter().map(|m| m.name.clone()).collect()),
            concurrency_hold_seconds: upstream_timeout_ms.div_ceil(1000) + CONCURRENCY_TIMEOUT_MARGIN_SECONDS,
        }
    }

    /// How long a key's concurrency slot is held at most.
    pub fn concurrency_hold_seconds(&self) -> u64 {
        self.concurrency_hold_seconds
    }

    /// Refuses a class the gateway does not configure.
    pub fn check_class(&self, class: Option<&str>) -> Result<(), DirectoryError> {
        match (class, &self.classes) {
            (Some(class), Some(classes)) if !classes.contains(class) => Err(DirectoryError::invalid(
                "class",
                format!("no class {class} in gateway.classes"),
            )),
            _ => Ok(()),
        }
    }

    /// Refuses a model the gateway does not serve, or (for a key) one outside
    /// its tenant's models.
    pub fn check_models(&self, models: Option<&[String]>, within: Option<&[String]>) -> Result<(), DirectoryError> {
        for (i, model) in models.unwrap_or_default().iter().enumerate() {
            if self.models.as_ref().is_some_and(|served| !served.contains(model)) {
                return Err(DirectoryError::invalid(
                    format!("models[{i}]"),
                    format!("no model {model} in gateway.models"),
                ));
            }
            if within.is_some_and(|allowed| !allowed.contains(model)) {
                return Err(DirectoryError::invalid(
                    format!("models[{i}]"),
                    format!("{model} is outside the tenant's models"),
                ));
            }
        }
        Ok(())
    }
}

/// The YAML's tenants, as the directory lists them (`"source": "config"`).
pub fn config_tenants(config: &Config) -> Vec<TenantRecord> {
    let Some(section) = &config.gateway else {
        return Vec::new();
    };
    (section.tenants.iter())
        .map(|t| {
            let fields = TenantFields {
                class: t.class.clone(),
                rpm: t.rpm,
                concurrency: t.concurrency,
                daily_tokens: t.daily_tokens,
                connections_max: t.connections_max.map(|v| v as u64),
                queued_max: t.queued_max.map(|v| v as u64),
                models: None,
                budgets: (!t.budgets.is_empty()).then(|| t.budgets.clone()),
            };
            TenantRecord::from_config(&t.name, fields)
        })
        .collect()
}

/// Opens the directory of `config`: on `store` when the backend keeps one
/// (TigerBeetle's cluster), else in the file beside the registry; starts its
/// periodic read on a shared store, and the periodic forgetting of the keys
/// past `directory.key_retention_days`.
pub async fn open(
    config: &Config,
    store: Option<Arc<dyn DirectoryStore>>,
    clock: Arc<dyn Clock>,
) -> Result<Arc<Directory>, String> {
    let store: Arc<dyn DirectoryStore> = match store {
        Some(store) => store,
        None => Arc::new(FileStore::open(journal_path(&config.registry.path))?),
    };
    let directory = Directory::open_with(store, clock, config_tenants(config), config.directory.options())
        .await
        .map_err(|e| format!("gateway tenants and keys: {e}"))?;
    let directory = Arc::new(directory);
    directory.start_refresh();
    directory.start_forgetting();
    Ok(directory)
}
