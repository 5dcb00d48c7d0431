//! Callers by directory key (docs/gateway.md, "Tenants and keys"): a key made
//! through the admin API names its tenant (of the configuration or of the
//! directory) and brings its own limits and scope of models. The lookup is the
//! directory's in-memory index: one SHA-256 and one hash-map probe, whatever
//! the number of keys; the key itself is never logged nor kept.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use ratelimiter::directory::{Authenticated, Directory, KeyRecord, Refusal, TenantRecord, KEY_PREFIX};

use crate::admission::tenant_caps::TenantCaps;
use crate::admission::{Admission, Caller};
use crate::limits::{directory_budget_keys, tenant_budget_prefix, KeyLimitKeys, TenantKeys};
use crate::wire::error::{ErrorKind, GatewayError};

/// Who a request authenticated as: its caller, and for a directory key, the
/// key and its tenant (their scope of models).
pub struct Authorized {
    /// The caller charged: its tenant's keys, with the key's own limits beside them.
    pub caller: Arc<Caller>,
    /// The directory key presented, with its live tenant.
    pub key: Option<Authenticated>,
}

impl Authorized {
    /// True when the caller may use `model`: always for a configured key or no
    /// key, else when both the key's scope and its tenant's list it (or set none).
    pub fn allows_model(&self, model: &str) -> bool {
        self.key.as_ref().is_none_or(|k| k.allows_model(model))
    }
}

/// What makes sure a tenant of the directory has its own limits
/// (`tenant:<name>:llm:*`) before this server serves its first call: the
/// server that made the tenant defines them right after writing it, and a
/// crash between the two writes leaves them undefined, which would fail every
/// call of the tenant's keys.
#[async_trait::async_trait]
pub trait TenantLimits: Send + Sync {
    /// Defines whichever of `tenant`'s limits the backend lacks; an error
    /// says why they could not be read or defined.
    async fn ensure(&self, tenant: &TenantRecord) -> Result<(), String>;
}

/// A tenant of the directory as the gateway serves it: its record when its
/// caller was made, and the caller (its queue turn, class, caps and keys).
struct ApiTenant {
    record: Arc<TenantRecord>,
    caller: Arc<Caller>,
}

/// The most keys whose callers are kept ([`KeyCallers::key_caller`]): the
/// keys in use at once on a busy gateway, a few megabytes at most; past it
/// the table starts afresh and each key's caller is made again at its next call.
pub const KEY_CALLERS_KEPT_MAX: usize = 16_384;

/// A key's caller, kept with what it was made of.
struct KeyCaller {
    record: Arc<KeyRecord>,
    tenant: Arc<Caller>,
    caller: Arc<Caller>,
}

/// The directory, and the callers of its tenants.
pub struct KeyCallers {
    directory: Arc<Directory>,
    /// By tenant incarnation: made at the tenant's first call, made again when
    /// its record changes (a change of its caps starts them afresh).
    api_tenants: RwLock<HashMap<String, ApiTenant>>,
    /// The next caller index: after the configuration's callers, never reused.
    next_index: AtomicUsize,
    /// The callers of the keys in use, by key id, bounded by [`KEY_CALLERS_KEPT_MAX`].
    key_callers: RwLock<HashMap<String, KeyCaller>>,
    /// The gateway's `tenant_connections_max` and `tenant_queued_max`.
    caps_default: (usize, usize),
    /// Checked when a tenant's caller is made: at its first call here, and
    /// again after each change of its record.
    tenant_limits: Option<Arc<dyn TenantLimits>>,
}

impl KeyCallers {
    /// The callers of `directory`'s keys; the first new tenant gets `first_index`.
    pub fn new(directory: Arc<Directory>, first_index: usize, caps_default: (usize, usize)) -> Self {
        Self {
            directory,
            api_tenants: RwLock::new(HashMap::new()),
            next_index: AtomicUsize::new(first_index),
            key_callers: RwLock::new(HashMap::new()),
            caps_default,
            tenant_limits: None,
        }
    }

    /// These callers, making sure of each tenant's limits with `limits`
    /// before its first call.
    pub fn with_tenant_limits(mut self, limits: Arc<dyn TenantLimits>) -> Self {
        self.tenant_limits = Some(limits);
        self
    }

    /// The caller of `presented` when it is a key of the directory; `Ok(None)`
    /// when no key of the directory has its text (the configuration's keys may),
    /// a 401 when the key expired or was revoked.
    pub async fn authorize(&self, presented: &str, admission: &Admission) -> Result<Option<Authorized>, GatewayError> {
        // Only the directory's keys carry its prefix: no other key costs a hash or a read.
        if !presented.starts_with(KEY_PREFIX) {
            return Ok(None);
        }
        let found = match self.directory.authenticate(presented).await {
            Ok(found) => found,
            Err(Refusal::Unknown) => return Ok(None),
            Err(Refusal::Expired) => {
                return Err(GatewayError::new(
                    ErrorKind::Authentication,
                    "This API key has expired.",
                ));
            }
            Err(Refusal::Revoked) => return Err(incorrect_key()),
        };
        let tenant = self.tenant_caller(&found.tenant, admission).await?;
        let caller = self.key_caller(&found.key, tenant);
        Ok(Some(Authorized {
            caller,
            key: Some(found),
        }))
    }

    /// The caller of a call with `key`: its tenant's, with the key's own
    /// limits beside the tenant's when it has some. Kept by key id while
    /// neither the key's record nor its tenant's caller changes: its limit
    /// keys are made once, not at every call.
    fn key_caller(&self, key: &Arc<KeyRecord>, tenant: Arc<Caller>) -> Arc<Caller> {
        let kept = self.key_callers.read().expect("key callers lock");
        if let Some(kept) = kept.get(key.id.as_str()) {
            if Arc::ptr_eq(&kept.record, key) && Arc::ptr_eq(&kept.tenant, &tenant) {
                return kept.caller.clone();
            }
        }
        drop(kept);
        let own = KeyLimitKeys::of(key);
        let caller = match (&tenant.keys, own == KeyLimitKeys::default()) {
            (Some(keys), false) => Arc::new(Caller {
                index: tenant.index,
                name: tenant.name.clone(),
                owner: tenant.owner.clone(),
                keys: Some(Arc::new(keys.with_key(own))),
                class: tenant.class,
                caps: tenant.caps.clone(),
                owner_of_leases: tenant.owner_of_leases.clone(),
            }),
            _ => tenant.clone(),
        };
        let mut kept = self.key_callers.write().expect("key callers lock");
        if kept.len() >= KEY_CALLERS_KEPT_MAX && !kept.contains_key(key.id.as_str()) {
            kept.clear();
        }
        let entry = KeyCaller {
            record: key.clone(),
            tenant,
            caller: caller.clone(),
        };
        kept.insert(key.id.clone(), entry);
        caller
    }

    /// The caller of `tenant`: the configuration's own for a tenant of the
    /// file, else the directory tenant's, made or made again as its record changed.
    async fn tenant_caller(
        &self,
        tenant: &Arc<TenantRecord>,
        admission: &Admission,
    ) -> Result<Arc<Caller>, GatewayError> {
        if tenant.source == ratelimiter::directory::Source::Config {
            // A key of a tenant the file no longer has is refused by the lookup;
            // one the gateway does not serve (another server's file) is too.
            let caller = admission.tenants().iter().find(|c| *c.name == *tenant.name);
            return caller.cloned().ok_or_else(incorrect_key);
        }
        if let Some(found) = self.api_tenants.read().expect("key callers lock").get(&tenant.id) {
            if Arc::ptr_eq(&found.record, tenant) {
                return Ok(found.caller.clone());
            }
        }
        // The tenant's first call here (or the first since its record changed):
        // its limits first, so that no call meets a limit a crash left undefined.
        if let Some(limits) = &self.tenant_limits {
            limits.ensure(tenant).await.map_err(|e| {
                tracing::warn!(tenant = %tenant.name, error = %e, "gateway: the tenant's limits could not be defined");
                GatewayError::new(ErrorKind::Internal, "The tenant's limits could not be read; retry.")
            })?;
        }
        let mut tenants = self.api_tenants.write().expect("key callers lock");
        let index = match tenants.get(&tenant.id) {
            Some(found) if Arc::ptr_eq(&found.record, tenant) => return Ok(found.caller.clone()),
            Some(found) => found.caller.index,
            None => self.next_index.fetch_add(1, Ordering::Relaxed),
        };
        let caller = Arc::new(api_caller(tenant, index, admission, self.caps_default));
        let entry = ApiTenant {
            record: tenant.clone(),
            caller: caller.clone(),
        };
        tenants.insert(tenant.id.clone(), entry);
        Ok(caller)
    }
}

/// The caller of a tenant of the directory, as a configured tenant's: its
/// limit keys, class and caps. A class the configuration no longer has (the
/// file changed since the tenant was made) is the lowest, as no class is.
fn api_caller(tenant: &TenantRecord, index: usize, admission: &Admission, caps_default: (usize, usize)) -> Caller {
    let f = &tenant.fields;
    let classes = admission.classes();
    let class = match f.class.as_deref() {
        Some(name) if classes.knows(name) => classes.of_tenant(Some(name)),
        Some(name) => {
            tracing::warn!(tenant = %tenant.name, class = name,
                "gateway: a tenant of the directory names a class the configuration does not have; it runs in the lowest");
            classes.of_tenant(None)
        }
        None => classes.of_tenant(None),
    };
    let cap = |value: Option<u64>, default: usize| value.map_or(default, |v| v as usize);
    Caller {
        index,
        name: Arc::from(tenant.name.as_str()),
        // This incarnation of the name: a tenant made again is another owner.
        owner: Arc::from(format!("{DIRECTORY_OWNER_PREFIX}{}", tenant.id)),
        keys: Some(Arc::new(
            TenantKeys::of(&tenant.name, (f.rpm, f.concurrency, f.daily_tokens)).with_budgets(directory_budget_keys(
                &tenant_budget_prefix(&tenant.name),
                f.budgets.as_deref(),
            )),
        )),
        class,
        caps: Arc::new(TenantCaps::new(
            format!("tenant {} (admin API)", tenant.name),
            cap(f.connections_max, caps_default.0),
            cap(f.queued_max, caps_default.1),
        )),
        owner_of_leases: crate::admission::entry::lease_owner_of(&tenant.name),
    }
}

/// What the owner of a directory tenant's stored ids starts with, before its
/// id: no name of the file can be taken for it (a tenant's name has no `:`).
const DIRECTORY_OWNER_PREFIX: &str = "directory:";

/// The 401 of a wrong, unknown or revoked key: which of the three is not said.
pub fn incorrect_key() -> GatewayError {
    GatewayError::new(ErrorKind::Authentication, "Incorrect API key provided.")
}
