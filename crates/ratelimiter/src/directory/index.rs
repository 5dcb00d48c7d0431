//! What a server knows of the directory: every tenant and key, with the one
//! lookup of the gateway's hot path, a key's hash to its key and tenant, in
//! one hash-map probe whatever the number of keys.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::change::{Change, Recorded};
use super::secret::{KeyHash, PRESENTED_KEY_BYTES_MAX};
use super::tenant::CONFIG_TENANT_ID_PREFIX;
use super::{KeyRecord, KeyStatus, Source, TenantRecord};

/// A key the gateway may serve, with the tenant it charges.
#[derive(Debug, Clone)]
pub struct Authenticated {
    /// The key.
    pub key: Arc<KeyRecord>,
    /// Its tenant, live.
    pub tenant: Arc<TenantRecord>,
}

impl Authenticated {
    /// True when both the key's scope and its tenant's allow `model`.
    pub fn allows_model(&self, model: &str) -> bool {
        self.key.allows_model(model) && self.tenant.allows_model(model)
    }
}

/// Why a presented key is refused (every one an HTTP 401 in the provider's shape).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No key has this hash.
    Unknown,
    /// The key's life ended (it may say so).
    Expired,
    /// The key was revoked, or its tenant deleted.
    Revoked,
}

/// Every tenant and key, and the changes' bookkeeping.
#[derive(Debug, Default)]
pub struct DirectoryIndex {
    tenants: BTreeMap<String, Arc<TenantRecord>>,
    keys: BTreeMap<String, Arc<KeyRecord>>,
    /// The hot path's map: SHA-256 of a key → the key.
    by_hash: HashMap<KeyHash, Arc<KeyRecord>, foldhash::fast::RandomState>,
    /// Tenant name → ids of its keys (revoked ones included), for lists and deletes.
    by_tenant: BTreeMap<String, BTreeSet<String>>,
    /// Stored tenants hidden by a YAML tenant of the same name: kept apart
    /// (never merged into the YAML's) so their keys are not taken for keys of
    /// a deleted tenant, and so a start can name the clash and refuse.
    shadowed: BTreeMap<String, Arc<TenantRecord>>,
    /// Subject → the version of its last change ([`Change::subject`]).
    versions: HashMap<String, u64>,
    newest_version: u64,
    skipped_total: u64,
}

impl DirectoryIndex {
    /// Sets the YAML's tenants: they stand beside the stored ones and change
    /// only with the file. A stored tenant of the same name is set apart
    /// ([`DirectoryIndex::shadowed_tenants`]): a server refuses to start so.
    pub fn set_config_tenants(&mut self, tenants: Vec<TenantRecord>) {
        self.tenants.retain(|_, t| t.source != Source::Config);
        for tenant in tenants {
            assert_eq!(tenant.source, Source::Config, "the YAML's tenants");
            if let Some(stored) = self.tenants.remove(&tenant.name) {
                self.shadowed.insert(stored.name.clone(), stored);
            }
            self.tenants.insert(tenant.name.clone(), Arc::new(tenant));
        }
    }

    /// The stored (API) tenants whose name a YAML tenant also has: the two
    /// sources disagree, and neither is taken silently.
    pub fn shadowed_tenants(&self) -> impl Iterator<Item = &Arc<TenantRecord>> {
        self.shadowed.values()
    }

    /// Applies one change in the store's order; false when it changed nothing
    /// (a change that no longer applies, such as a put over a YAML tenant).
    pub fn apply(&mut self, recorded: Recorded) -> bool {
        let subject = recorded.change.subject();
        let forgetting = matches!(recorded.change, Change::ForgetKeys { .. });
        let applied = match recorded.change {
            Change::PutTenant { tenant } => self.put_tenant(tenant),
            Change::DeleteTenant { name, id, at_unix_ms } => self.delete_tenant(&name, &id, at_unix_ms),
            Change::CreateKey { key } => self.insert_key(key),
            Change::RevokeKey { id, at_unix_ms } => self.update_key(&id, |key| {
                key.revoked_at_unix_ms.get_or_insert(at_unix_ms);
            }),
            Change::RotateKey {
                id,
                expires_at_unix_ms,
                key,
            } => {
                let new_id = key.id.clone();
                let old = self.update_key(&id, |old| {
                    let at = old
                        .expires_at_unix_ms
                        .map_or(expires_at_unix_ms, |e| e.min(expires_at_unix_ms));
                    old.expires_at_unix_ms = Some(at);
                    old.rotated_to = Some(new_id);
                });
                old && self.insert_key(key)
            }
            Change::UpdateKey { id, limits, .. } => self.update_key(&id, |key| key.limits = limits),
            // Every id is forgotten (no short circuit): true when any was known.
            Change::ForgetKeys { ids, .. } => ids.iter().filter(|id| self.forget_key(id)).count() > 0,
        };
        // A forgetting's subject is never followed: nothing to remember of it.
        if !forgetting {
            self.versions.insert(subject, recorded.version);
        }
        self.newest_version = self.newest_version.max(recorded.version);
        if !applied {
            self.skipped_total += 1;
        }
        applied
    }

    fn put_tenant(&mut self, tenant: TenantRecord) -> bool {
        if self
            .tenants
            .get(&tenant.name)
            .is_some_and(|t| t.source == Source::Config)
        {
            tracing::warn!(tenant = %tenant.name, "a tenant made through the admin API has the name of a tenant of the configuration; its keys are refused until one of the two is renamed or deleted");
            self.shadowed.insert(tenant.name.clone(), Arc::new(tenant));
            return false;
        }
        self.tenants.insert(tenant.name.clone(), Arc::new(tenant));
        true
    }

    fn delete_tenant(&mut self, name: &str, id: &str, at_unix_ms: u64) -> bool {
        if self.shadowed.get(name).is_some_and(|t| t.id == id) {
            self.shadowed.remove(name);
        } else if self
            .tenants
            .get(name)
            .is_none_or(|t| t.id != id || t.source == Source::Config)
        {
            return false;
        } else {
            self.tenants.remove(name);
        }
        let ids: Vec<String> = self.by_tenant.get(name).into_iter().flatten().cloned().collect();
        for key_id in ids {
            self.update_key(&key_id, |key| {
                if key.tenant_id == id {
                    key.revoked_at_unix_ms.get_or_insert(at_unix_ms);
                }
            });
        }
        true
    }

    /// Inserts a new key; a key whose stored tenant is not live (deleted by a
    /// change the store ordered first) is kept revoked, so it never works. A
    /// key of a YAML tenant absent from this start's file is not: the lookup
    /// refuses it while the entry is missing, and it works again with it.
    fn insert_key(&mut self, mut key: KeyRecord) -> bool {
        if self.keys.contains_key(&key.id) || self.by_hash.contains_key(&key.hash) {
            return false;
        }
        let of_config = key.tenant_id.starts_with(CONFIG_TENANT_ID_PREFIX);
        if !of_config && !self.tenant_is_live(&key.tenant, &key.tenant_id) {
            key.revoked_at_unix_ms.get_or_insert(key.created_at_unix_ms);
        }
        let key = Arc::new(key);
        self.by_tenant
            .entry(key.tenant.clone())
            .or_default()
            .insert(key.id.clone());
        self.by_hash.insert(key.hash, key.clone());
        self.keys.insert(key.id.clone(), key);
        true
    }

    fn update_key(&mut self, id: &str, change: impl FnOnce(&mut KeyRecord)) -> bool {
        let Some(current) = self.keys.get(id) else {
            return false;
        };
        let mut key = KeyRecord::clone(current);
        change(&mut key);
        let key = Arc::new(key);
        self.by_hash.insert(key.hash, key.clone());
        self.keys.insert(key.id.clone(), key);
        true
    }

    /// Drops the key `id` and everything kept of it; false when unknown.
    fn forget_key(&mut self, id: &str) -> bool {
        let Some(key) = self.keys.remove(id) else {
            return false;
        };
        if self.by_hash.get(&key.hash).is_some_and(|k| k.id == key.id) {
            self.by_hash.remove(&key.hash);
        }
        if let Some(ids) = self.by_tenant.get_mut(&key.tenant) {
            ids.remove(id);
            if ids.is_empty() {
                self.by_tenant.remove(&key.tenant);
            }
        }
        self.versions.remove(&format!("key:{id}"));
        true
    }

    /// Up to `most` keys that ended (revoked, expired, or their tenant
    /// deleted) at least `retention_ms` before `now_unix_ms`, by id.
    pub fn past_retention(&self, now_unix_ms: u64, retention_ms: u64, most: usize) -> Vec<String> {
        (self.keys.values())
            .filter(|k| {
                k.ended_at_unix_ms(now_unix_ms)
                    .is_some_and(|ended| ended.saturating_add(retention_ms) <= now_unix_ms)
            })
            .take(most)
            .map(|k| k.id.clone())
            .collect()
    }

    /// True when the stored tenant `name` of id `id` is not deleted (a
    /// shadowed one included: its keys are not revoked, only refused).
    fn tenant_is_live(&self, name: &str, id: &str) -> bool {
        (self.tenants.get(name).or(self.shadowed.get(name))).is_some_and(|t| t.id == id)
    }

    /// The key of `presented` and its tenant, if the key works at
    /// `now_unix_ms`: one SHA-256 and one hash-map probe. A key longer than
    /// [`PRESENTED_KEY_BYTES_MAX`] is unknown without being hashed.
    pub fn authenticate(&self, presented: &str, now_unix_ms: u64) -> Result<Authenticated, Refusal> {
        if presented.len() > PRESENTED_KEY_BYTES_MAX {
            return Err(Refusal::Unknown);
        }
        self.authenticate_hash(&KeyHash::of(presented), now_unix_ms)
    }

    /// [`DirectoryIndex::authenticate`] of a hash already computed.
    pub fn authenticate_hash(&self, hash: &KeyHash, now_unix_ms: u64) -> Result<Authenticated, Refusal> {
        let key = self.by_hash.get(hash).ok_or(Refusal::Unknown)?;
        match key.status(now_unix_ms) {
            KeyStatus::Revoked => return Err(Refusal::Revoked),
            KeyStatus::Expired => return Err(Refusal::Expired),
            KeyStatus::Active => {}
        }
        match self.tenants.get(&key.tenant) {
            Some(tenant) if tenant.id == key.tenant_id => Ok(Authenticated {
                key: key.clone(),
                tenant: tenant.clone(),
            }),
            _ => Err(Refusal::Revoked),
        }
    }

    /// True when some key has this hash (in any state).
    pub fn knows_hash(&self, hash: &KeyHash) -> bool {
        self.by_hash.contains_key(hash)
    }

    /// The live tenant named `name`.
    pub fn tenant(&self, name: &str) -> Option<&Arc<TenantRecord>> {
        self.tenants.get(name)
    }

    /// Every live tenant, by name.
    pub fn tenants(&self) -> impl Iterator<Item = &Arc<TenantRecord>> {
        self.tenants.values()
    }

    /// The key of id `id`, in any state.
    pub fn key(&self, id: &str) -> Option<&Arc<KeyRecord>> {
        self.keys.get(id)
    }

    /// Every key (revoked ones included), by id, or those of one tenant name.
    pub fn keys<'a>(&'a self, tenant: Option<&'a str>) -> Box<dyn Iterator<Item = &'a Arc<KeyRecord>> + 'a> {
        match tenant {
            None => Box::new(self.keys.values()),
            Some(name) => Box::new((self.by_tenant.get(name).into_iter().flatten()).filter_map(|id| self.keys.get(id))),
        }
    }

    /// How many keys are kept, revoked ones included.
    pub fn keys_len(&self) -> usize {
        self.keys.len()
    }

    /// How many tenants live, the YAML's included.
    pub fn tenants_len(&self) -> usize {
        self.tenants.len()
    }

    /// The version of `subject`'s last change (0: none).
    pub fn version_of(&self, subject: &str) -> u64 {
        self.versions.get(subject).copied().unwrap_or(0)
    }

    /// The version of the newest change applied.
    pub fn newest_version(&self) -> u64 {
        self.newest_version
    }

    /// Changes read that no longer applied.
    pub fn skipped_total(&self) -> u64 {
        self.skipped_total
    }
}
