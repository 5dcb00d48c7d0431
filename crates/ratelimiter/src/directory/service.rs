//! [`Directory`]: the tenants and keys of the gateway, kept in a
//! [`DirectoryStore`] and served from memory. Every change is validated
//! against a view read up to date, recorded durably, read back, logged and
//! counted; the gateway's lookup reads only the in-memory index.

use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant};

use super::change::Change;
use super::counters::Counters;
use super::index::{Authenticated, DirectoryIndex, Refusal};
use super::secret::NewKey;
use super::store::{Appended, DirectoryStore};
use super::{DirectoryError, KeyRecord, KeySpec, Source, TenantFields, TenantPatch, TenantRecord};
use crate::base::clock::Clock;

/// How often a server reads a shared store: a key created, revoked or rotated
/// on any server of a fleet is served or refused the same by every other
/// within this plus one read (the fleet test asserts under 1 s). Four reads a
/// second of an empty page cost the cluster next to nothing.
pub const DIRECTORY_REFRESH_INTERVAL_MS: u64 = 250;
/// The shortest time between two reads made for keys this server does not
/// know: a flood of wrong keys makes at most ten reads a second, whatever
/// its rate, and a key just created elsewhere waits at most this long.
pub const UNKNOWN_KEY_READ_INTERVAL_MS: u64 = 100;
/// Attempts of a change whose subject another server changed at the same
/// instant: each one reads the store again and validates anew.
pub const WRITE_ATTEMPTS_MAX: usize = 3;
/// The most tenants kept (the YAML's included): tenants are listed whole.
pub const TENANTS_MAX: usize = 100_000;
/// The most keys kept, revoked and expired ones included until they are
/// forgotten: about 1.8 KB each resident after a start (measured,
/// BENCHMARKS.md "Gateway keys"), 1.8 GB at the bound.
pub const KEYS_MAX: usize = 1_000_000;
/// How long a revoked or expired key is kept (listed, counted) by default:
/// thirty days, time enough to see in the lists why an application's key
/// stopped working.
pub const KEY_RETENTION_MS_DEFAULT: u64 = 30 * 86_400_000;
/// How often a server forgets the keys past their retention: a day's
/// retention is kept within a quarter of an hour, and a scan of a million
/// keys every ten minutes costs nothing noticeable.
pub const FORGET_INTERVAL_MS: u64 = 600_000;

/// What a directory is opened with besides its store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectoryOptions {
    /// How long a key is kept after it ended (revoked, expired, its tenant
    /// deleted) before it is forgotten.
    pub key_retention_ms: u64,
    /// The most keys kept ([`KEYS_MAX`]; lower in tests of the bound).
    pub keys_max: usize,
}

impl Default for DirectoryOptions {
    fn default() -> Self {
        Self {
            key_retention_ms: KEY_RETENTION_MS_DEFAULT,
            keys_max: KEYS_MAX,
        }
    }
}

/// A key just created: its record and its text, shown this once.
#[derive(Debug)]
pub struct CreatedKey {
    /// The record kept.
    pub record: KeyRecord,
    /// The key to hand over; nothing keeps it after the answer.
    pub key: NewKey,
}

/// The directory of one server.
#[derive(Debug)]
pub struct Directory {
    store: Arc<dyn DirectoryStore>,
    pub(super) index: RwLock<DirectoryIndex>,
    pub(super) clock: Arc<dyn Clock>,
    options: DirectoryOptions,
    /// Serializes this server's changes (another server's are ordered by the store).
    writes: tokio::sync::Mutex<()>,
    /// Serializes reads of the store.
    reads: tokio::sync::Mutex<()>,
    /// Serializes and spaces the reads made for unknown keys.
    unknown_reads: tokio::sync::Mutex<Option<Instant>>,
    pub(super) counters: Counters,
}

impl Directory {
    /// Opens the directory of `store` with the YAML's tenants, reads every
    /// change recorded, and compacts the store when it is worth it. A shared
    /// store that does not answer yet is read later by the periodic read
    /// ([`Directory::start_refresh`]); a local one must answer now.
    pub async fn open(
        store: Arc<dyn DirectoryStore>,
        clock: Arc<dyn Clock>,
        config_tenants: Vec<TenantRecord>,
    ) -> Result<Self, DirectoryError> {
        Self::open_with(store, clock, config_tenants, DirectoryOptions::default()).await
    }

    /// [`Directory::open`] with `options`; the keys past their retention are
    /// forgotten before the store is compacted, so a compacted file holds
    /// none of them.
    pub async fn open_with(
        store: Arc<dyn DirectoryStore>,
        clock: Arc<dyn Clock>,
        config_tenants: Vec<TenantRecord>,
        options: DirectoryOptions,
    ) -> Result<Self, DirectoryError> {
        let mut index = DirectoryIndex::default();
        index.set_config_tenants(config_tenants);
        let directory = Self {
            store,
            index: RwLock::new(index),
            clock,
            options,
            writes: tokio::sync::Mutex::new(()),
            reads: tokio::sync::Mutex::new(()),
            unknown_reads: tokio::sync::Mutex::new(None),
            counters: Counters::default(),
        };
        match directory.refresh().await {
            Ok(()) => {}
            // A fleet's server starts while its cluster is down, as it does
            // for its limits: it admits nothing until the cluster answers, and
            // its periodic read loads the directory then. A key it meets
            // before is read for at once, as an unknown key is.
            Err(DirectoryError::Unavailable { .. }) if directory.store.shared() => {
                tracing::warn!(
                    "the gateway's tenants and keys are not read yet: the cluster does not answer; will retry"
                );
                return Ok(directory);
            }
            Err(e) => return Err(e),
        }
        directory.refuse_shadowed()?;
        if let Err(e) = directory.forget_past_retention().await {
            tracing::warn!(error = %e, "forgetting the keys past their retention failed at start; will retry");
        }
        let records = directory.snapshot_changes();
        directory.store.compact(records).await?;
        Ok(directory)
    }

    /// Refuses a start where a YAML tenant has the name of a tenant made
    /// through the admin API: taking either would silently change which limits
    /// and keys the name has, so the operator chooses (the error says how).
    fn refuse_shadowed(&self) -> Result<(), DirectoryError> {
        let index = self.index.read().expect("directory lock");
        let Some(stored) = index.shadowed_tenants().next() else {
            return Ok(());
        };
        let name = &stored.name;
        let keys = index.keys(Some(name)).filter(|k| k.tenant_id == stored.id).count();
        Err(DirectoryError::Conflict(format!(
            "tenant {name} is defined both in the configuration file (gateway.tenants) and through the admin API \
             (tenant id {}, {keys} keys); a name has one source: rename or remove the configuration's entry, or \
             delete the API tenant and its keys (start without the entry, run `ratelimiterd tenants delete {name}` \
             or DELETE /v1/admin/gateway/tenants/{name}, then add the entry back)",
            stored.id
        )))
    }

    /// Every record as the changes that recreate it: API tenants first, then keys.
    fn snapshot_changes(&self) -> Vec<Change> {
        let index = self.index.read().expect("directory lock");
        let tenants = (index.tenants())
            .filter(|t| t.source == Source::Api)
            .map(|t| Change::PutTenant {
                tenant: TenantRecord::clone(t),
            });
        let keys = index.keys(None).map(|k| Change::CreateKey {
            key: KeyRecord::clone(k),
        });
        tenants.chain(keys).collect()
    }

    /// Reads the store up to date: every change recorded before the call is
    /// applied when it returns. A caller that waited while another read ran
    /// returns as soon as a read that started after its arrival has finished.
    pub async fn refresh(&self) -> Result<(), DirectoryError> {
        let arrived = self.counters.reads_started.load(Ordering::Acquire);
        let _gate = self.reads.lock().await;
        if self.counters.reads_done.load(Ordering::Acquire) > arrived {
            return Ok(());
        }
        let started = self.counters.reads_started.fetch_add(1, Ordering::AcqRel) + 1;
        let changes = match self.store.read_new().await {
            Ok(changes) => changes,
            Err(e) => {
                self.counters.read_failures.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
        };
        if !changes.is_empty() {
            let mut index = self.index.write().expect("directory lock");
            for change in changes {
                index.apply(change);
            }
        }
        self.counters.reads_done.store(started, Ordering::Release);
        Ok(())
    }

    /// Starts the task that reads a shared store every
    /// [`DIRECTORY_REFRESH_INTERVAL_MS`]; none for a store of this server
    /// alone. It ends when the directory is dropped.
    pub fn start_refresh(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        if !self.store.shared() {
            return None;
        }
        let directory: Weak<Self> = Arc::downgrade(self);
        Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(DIRECTORY_REFRESH_INTERVAL_MS)).await;
                let Some(directory) = directory.upgrade() else {
                    return;
                };
                if let Err(e) = directory.refresh().await {
                    tracing::warn!(error = %e, "reading the gateway's tenants and keys failed; will retry");
                }
            }
        }))
    }

    /// The gateway's lookup: the key `presented` and its live tenant, or why
    /// it is refused. One SHA-256 and one hash-map probe; for a key this
    /// server does not know, on a shared store, one read of the store first
    /// (another server may have just created it), spaced by
    /// [`UNKNOWN_KEY_READ_INTERVAL_MS`] whatever the number of unknown keys.
    pub async fn authenticate(&self, presented: &str) -> Result<Authenticated, Refusal> {
        let first = self.authenticate_now(presented);
        if !matches!(first, Err(Refusal::Unknown)) || !self.store.shared() {
            return first;
        }
        if let Err(e) = self.read_for_unknown_key().await {
            tracing::warn!(error = %e, "reading the directory for an unknown key failed");
        }
        self.authenticate_now(presented)
    }

    /// The lookup without any read of the store.
    pub fn authenticate_now(&self, presented: &str) -> Result<Authenticated, Refusal> {
        let now = self.clock.now_unix_ms();
        self.index.read().expect("directory lock").authenticate(presented, now)
    }

    async fn read_for_unknown_key(&self) -> Result<(), DirectoryError> {
        let arrived = self.counters.reads_started.load(Ordering::Acquire);
        let mut last = self.unknown_reads.lock().await;
        if self.counters.reads_done.load(Ordering::Acquire) > arrived {
            return Ok(());
        }
        let spacing = Duration::from_millis(UNKNOWN_KEY_READ_INTERVAL_MS);
        if let Some(wait) = last.and_then(|at| spacing.checked_sub(at.elapsed())) {
            tokio::time::sleep(wait).await;
        }
        *last = Some(Instant::now());
        self.counters.unknown_key_reads.fetch_add(1, Ordering::Relaxed);
        self.refresh().await
    }

    /// Validates with `make` against a view read up to date, records the
    /// change it returns, and reads it back; again (up to
    /// [`WRITE_ATTEMPTS_MAX`]) when another server changed the subject at the
    /// same instant.
    async fn write<T>(
        &self,
        make: impl Fn(&DirectoryIndex, u64) -> Result<(Change, T), DirectoryError>,
    ) -> Result<T, DirectoryError> {
        self.write_if(|index, now| make(index, now).map(|(change, out)| (Some(change), out)))
            .await
    }

    /// [`Directory::write`] of a change `make` may find needless (`None`:
    /// nothing is written, its answer returned).
    async fn write_if<T>(
        &self,
        make: impl Fn(&DirectoryIndex, u64) -> Result<(Option<Change>, T), DirectoryError>,
    ) -> Result<T, DirectoryError> {
        let _writes = self.writes.lock().await;
        for _ in 0..WRITE_ATTEMPTS_MAX {
            self.refresh().await?;
            let (change, out, previous) = {
                let index = self.index.read().expect("directory lock");
                let (change, out) = make(&index, self.clock.now_unix_ms())?;
                let Some(change) = change else { return Ok(out) };
                let previous = index.version_of(&change.subject());
                (change, out, previous)
            };
            match self.store.append(&change, previous).await? {
                Appended::Written => {
                    self.refresh().await?;
                    log_change(&change);
                    return Ok(out);
                }
                Appended::Superseded => continue,
            }
        }
        Err(DirectoryError::Conflict(
            "other servers changed this record at the same instant; retry".to_owned(),
        ))
    }
}

/// The one log line of a change: what, the tenant and the key's id, never the key.
fn log_change(change: &Change) {
    let (tenant, key_id) = match change {
        Change::PutTenant { tenant } => (tenant.name.as_str(), ""),
        Change::DeleteTenant { name, .. } => (name.as_str(), ""),
        Change::CreateKey { key } | Change::RotateKey { key, .. } => (key.tenant.as_str(), key.id.as_str()),
        Change::RevokeKey { id, .. } | Change::UpdateKey { id, .. } => ("", id.as_str()),
        Change::ForgetKeys { ids, .. } => {
            tracing::info!(change = change.kind(), keys = ids.len(), "gateway directory changed");
            return;
        }
    };
    let replaces = match change {
        Change::RotateKey { id, .. } => id.as_str(),
        _ => "",
    };
    tracing::info!(
        change = change.kind(),
        tenant,
        key_id,
        replaces,
        "gateway directory changed"
    );
}

/// A new id: a ULID, ordered by creation, unique without coordination.
fn new_id(now_unix_ms: u64) -> String {
    ulid::Ulid::from_parts(now_unix_ms, rand::random::<u128>()).to_string()
}

impl Directory {
    /// Creates the tenant `name`: 409 when a live tenant has the name.
    pub async fn create_tenant(&self, name: &str, fields: TenantFields) -> Result<TenantRecord, DirectoryError> {
        super::name::check_tenant_name("name", name)?;
        fields.validate()?;
        let id = new_id(self.clock.now_unix_ms());
        let tenant = self
            .write(|index, now| {
                match index.tenant(name) {
                    Some(t) if t.source == Source::Config => {
                        return Err(DirectoryError::Conflict(format!(
                            "a tenant named {name} is defined in the configuration file (gateway.tenants): a name has \
                             one source; choose another name, or create keys for the configuration's tenant"
                        )));
                    }
                    Some(_) => return Err(DirectoryError::Exists(name.to_owned())),
                    None => {}
                }
                if index.tenants_len() >= TENANTS_MAX {
                    return Err(DirectoryError::Full(format!(
                        "the directory holds {TENANTS_MAX} tenants, its most"
                    )));
                }
                let tenant = TenantRecord {
                    name: name.to_owned(),
                    id: id.clone(),
                    source: Source::Api,
                    fields: fields.clone(),
                    created_at_unix_ms: now,
                    updated_at_unix_ms: now,
                };
                Ok((Change::PutTenant { tenant: tenant.clone() }, tenant))
            })
            .await?;
        self.counters.tenants_created.fetch_add(1, Ordering::Relaxed);
        Ok(tenant)
    }

    /// Changes the fields `patch` names on the tenant `name`; a tenant of the
    /// YAML changes with the file only (409).
    pub async fn update_tenant(&self, name: &str, patch: &TenantPatch) -> Result<TenantRecord, DirectoryError> {
        let tenant = self
            .write(|index, now| {
                let current = live_api_tenant(index, name)?;
                let tenant = TenantRecord {
                    fields: patch.applied_to(&current.fields)?,
                    updated_at_unix_ms: now,
                    ..TenantRecord::clone(current)
                };
                Ok((Change::PutTenant { tenant: tenant.clone() }, tenant))
            })
            .await?;
        self.counters.tenants_updated.fetch_add(1, Ordering::Relaxed);
        Ok(tenant)
    }

    /// Deletes the tenant `name` and revokes its keys, in one change; returns
    /// the tenant and how many of its keys were working.
    pub async fn delete_tenant(&self, name: &str) -> Result<(TenantRecord, usize), DirectoryError> {
        let deleted = self
            .write(|index, now| {
                let tenant = live_api_tenant(index, name)?;
                let working = index
                    .keys(Some(name))
                    .filter(|k| index.authenticate_hash(&k.hash, now).is_ok())
                    .count();
                let change = Change::DeleteTenant {
                    name: name.to_owned(),
                    id: tenant.id.clone(),
                    at_unix_ms: now,
                };
                Ok((change, (TenantRecord::clone(tenant), working)))
            })
            .await?;
        self.counters.tenants_deleted.fetch_add(1, Ordering::Relaxed);
        Ok(deleted)
    }

    /// Creates a key for `spec.tenant`. A tenant deleted by another server
    /// while the key was written leaves no working key: the store orders the
    /// two changes, and a key ordered after its tenant's deletion is revoked
    /// as it is read (the answer is then 404, as if the tenant had been gone).
    pub async fn create_key(&self, spec: &KeySpec) -> Result<CreatedKey, DirectoryError> {
        spec.validate()?;
        if self.sizes().1 >= self.options.keys_max {
            // Full: the keys past their retention make room first.
            self.forget_past_retention().await?;
        }
        let key = NewKey::generate();
        let id = new_id(self.clock.now_unix_ms());
        let record = self
            .write(|index, now| {
                let tenant = index
                    .tenant(&spec.tenant)
                    .ok_or_else(|| DirectoryError::UnknownTenant(spec.tenant.clone()))?;
                let most = self.options.keys_max;
                if index.keys_len() >= most {
                    return Err(DirectoryError::Full(format!(
                        "the directory holds {most} keys, its most; revoked and expired keys count until they are \
                         forgotten, {} days after they ended (directory.key_retention_days)",
                        self.options.key_retention_ms / 86_400_000
                    )));
                }
                let record = KeyRecord {
                    id: id.clone(),
                    tenant: tenant.name.clone(),
                    tenant_id: tenant.id.clone(),
                    name: spec.name.clone(),
                    models: spec.models.clone(),
                    limits: spec.limits.clone(),
                    limits_of: id.clone(),
                    hash: key.hash,
                    hint: key.hint.clone(),
                    created_at_unix_ms: now,
                    expires_at_unix_ms: spec.expires_in_seconds.map(|s| now + s * 1_000),
                    revoked_at_unix_ms: None,
                    rotated_to: None,
                };
                Ok((Change::CreateKey { key: record.clone() }, record))
            })
            .await?;
        self.check_key_lives(&record)?;
        self.counters.keys_created.fetch_add(1, Ordering::Relaxed);
        Ok(CreatedKey { record, key })
    }

    /// After a key was recorded: its tenant may have been deleted by a change
    /// ordered before it, in which case the key was recorded revoked.
    fn check_key_lives(&self, record: &KeyRecord) -> Result<(), DirectoryError> {
        let index = self.index.read().expect("directory lock");
        match index.key(&record.id) {
            Some(kept) if kept.revoked_at_unix_ms.is_none() => Ok(()),
            _ => Err(DirectoryError::UnknownTenant(record.tenant.clone())),
        }
    }

    /// Revokes the key `id` (a key already revoked stays as it is); returns it.
    pub async fn revoke_key(&self, id: &str) -> Result<KeyRecord, DirectoryError> {
        let fresh = self
            .write(|index, now| {
                let key = index.key(id).ok_or_else(|| DirectoryError::UnknownKey(id.to_owned()))?;
                let fresh = key.revoked_at_unix_ms.is_none();
                Ok((
                    Change::RevokeKey {
                        id: id.to_owned(),
                        at_unix_ms: now,
                    },
                    fresh,
                ))
            })
            .await?;
        if fresh {
            self.counters.keys_revoked.fetch_add(1, Ordering::Relaxed);
        }
        self.key(id).ok_or_else(|| DirectoryError::UnknownKey(id.to_owned()))
    }

    /// Replaces the key `id` by a new one of the same tenant, scope and
    /// limits (the same limit keys: one budget across the two); the old one
    /// keeps working `grace_seconds` more. A key that does not work any more
    /// cannot be rotated (409).
    pub async fn rotate_key(&self, id: &str, grace_seconds: u64) -> Result<CreatedKey, DirectoryError> {
        if grace_seconds > super::key::GRACE_SECONDS_MAX {
            return Err(DirectoryError::invalid(
                "grace_seconds",
                format!("must be 0..={}", super::key::GRACE_SECONDS_MAX),
            ));
        }
        let key = NewKey::generate();
        let new_id = new_id(self.clock.now_unix_ms());
        let record = self
            .write(|index, now| {
                let old = index.key(id).ok_or_else(|| DirectoryError::UnknownKey(id.to_owned()))?;
                if index.authenticate_hash(&old.hash, now).is_err() {
                    return Err(DirectoryError::Conflict(format!(
                        "key {id} is {:?}: only a working key is rotated; create a new one",
                        old.status(now)
                    )));
                }
                let record = KeyRecord {
                    id: new_id.clone(),
                    hash: key.hash,
                    hint: key.hint.clone(),
                    created_at_unix_ms: now,
                    revoked_at_unix_ms: None,
                    rotated_to: None,
                    ..KeyRecord::clone(old)
                };
                let change = Change::RotateKey {
                    id: id.to_owned(),
                    expires_at_unix_ms: now + grace_seconds * 1_000,
                    key: record.clone(),
                };
                Ok((change, record))
            })
            .await?;
        self.check_key_lives(&record)?;
        self.counters.keys_rotated.fetch_add(1, Ordering::Relaxed);
        Ok(CreatedKey { record, key })
    }
}

impl Directory {
    /// Replaces the own limits of the key `id` by `limits` (its budgets,
    /// through the key's PATCH); returns the key. A key that no longer works
    /// is not changed (409): nothing would charge them.
    pub async fn update_key_limits(&self, id: &str, limits: &super::KeyLimits) -> Result<KeyRecord, DirectoryError> {
        super::KeySpec {
            limits: limits.clone(),
            ..Default::default()
        }
        .validate()?;
        self.write(|index, now| {
            let key = index.key(id).ok_or_else(|| DirectoryError::UnknownKey(id.to_owned()))?;
            if index.authenticate_hash(&key.hash, now).is_err() {
                return Err(DirectoryError::Conflict(format!(
                    "key {id} is {:?}: only a working key's limits are changed",
                    key.status(now)
                )));
            }
            let change = Change::UpdateKey {
                id: id.to_owned(),
                limits: limits.clone(),
                at_unix_ms: now,
            };
            Ok((change, ()))
        })
        .await?;
        self.counters.keys_updated.fetch_add(1, Ordering::Relaxed);
        self.key(id).ok_or_else(|| DirectoryError::UnknownKey(id.to_owned()))
    }

    /// Forgets every key that ended (revoked, expired, its tenant deleted)
    /// longer than the retention ago, [`super::FORGET_KEYS_PER_CHANGE`] a
    /// change; returns how many. A forgotten key is no longer listed nor
    /// counted toward the bound, and is refused as an unknown key.
    pub async fn forget_past_retention(&self) -> Result<usize, DirectoryError> {
        let retention_ms = self.options.key_retention_ms;
        let mut forgotten = 0;
        loop {
            let count = self
                .write_if(|index, now| {
                    let ids = index.past_retention(now, retention_ms, super::FORGET_KEYS_PER_CHANGE);
                    let count = ids.len();
                    let change = (count > 0).then_some(Change::ForgetKeys { ids, at_unix_ms: now });
                    Ok((change, count))
                })
                .await?;
            forgotten += count;
            self.counters.keys_forgotten.fetch_add(count as u64, Ordering::Relaxed);
            if count < super::FORGET_KEYS_PER_CHANGE {
                return Ok(forgotten);
            }
        }
    }

    /// Starts the task that forgets the keys past their retention every
    /// [`FORGET_INTERVAL_MS`]; it ends when the directory is dropped.
    pub fn start_forgetting(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let directory: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(FORGET_INTERVAL_MS)).await;
                let Some(directory) = directory.upgrade() else {
                    return;
                };
                if let Err(e) = directory.forget_past_retention().await {
                    tracing::warn!(error = %e, "forgetting the keys past their retention failed; will retry");
                }
            }
        })
    }
}

fn live_api_tenant<'a>(index: &'a DirectoryIndex, name: &str) -> Result<&'a Arc<TenantRecord>, DirectoryError> {
    let tenant = index
        .tenant(name)
        .ok_or_else(|| DirectoryError::UnknownTenant(name.to_owned()))?;
    if tenant.source == Source::Config {
        return Err(DirectoryError::Conflict(format!(
            "tenant {name} is defined in the configuration file: change it there (the API may add and revoke its keys)"
        )));
    }
    Ok(tenant)
}
