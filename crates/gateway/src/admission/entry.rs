//! The gateway's entries a call is admitted against: each served model (its
//! pool, counter, queue and counters) and each caller (a tenant, or the one
//! caller of a gateway without tenants).

use std::sync::{Arc, OnceLock};

use ratelimiter::LeaseOwner;

use super::queue::ModelQueue;
use super::tenant_caps::TenantCaps;
use crate::config::{ModelConfig, UpstreamKind};
use crate::counting::tokens::Counter;
use crate::limits::{Classes, TenantKeys, TENANT_LIMIT_PREFIX};
use crate::observe::class_metrics::ClassCounters;
use crate::observe::metrics::{CallCounters, GatewayMetrics, ModelMetrics, NO_TENANT};
use crate::routing::Pool;

/// What a tenant's lease owner is called before its name: the name a
/// `too_many_leases` refusal shows.
pub const LEASE_OWNER_PREFIX: &str = "gateway tenant ";

/// One served model.
pub struct ModelEntry {
    /// Its configuration.
    pub config: ModelConfig,
    /// The wire format of its deployments (one per pool), as the kind that
    /// speaks it natively (`UpstreamConfig::format_of`).
    pub kind: UpstreamKind,
    /// The name, shared by every call's log line.
    pub name: Arc<str>,
    /// Its deployments (one for a model of the single-deployment form).
    pub pool: Arc<Pool>,
    /// Counts its calls before a deployment is chosen: by the name clients send
    /// (every deployment of a pool serves that model).
    pub counter: Counter,
    /// The (model, caller) counters, indexed by caller: found per call by index,
    /// not by a label lookup; each made (and shown in the metrics) at its pair's
    /// first call.
    counters: Vec<OnceLock<Arc<CallCounters>>>,
    /// Its fair queue.
    pub queue: Arc<ModelQueue>,
    /// Its histograms and provider figures.
    pub metrics: Arc<ModelMetrics>,
    /// The (model, class) counters, indexed by class; each made (and shown in the
    /// metrics) at its pair's first call, like the (model, caller) ones.
    class_counters: Vec<OnceLock<Arc<ClassCounters>>>,
}

impl ModelEntry {
    /// The entry of `config` served by `pool` in wire format `kind`, for
    /// `callers` callers and the gateway's `classes`.
    pub fn new(
        config: &ModelConfig,
        (pool, kind): (Arc<Pool>, UpstreamKind),
        callers: usize,
        classes: &Classes,
        metrics: &GatewayMetrics,
    ) -> Self {
        Self {
            config: config.clone(),
            kind,
            name: Arc::from(config.name.as_str()),
            pool,
            counter: Counter::for_model(kind, config),
            counters: (0..callers).map(|_| OnceLock::new()).collect(),
            queue: Arc::new(ModelQueue::new(classes.work_classes())),
            metrics: metrics.model(&config.name),
            class_counters: classes.work_classes().iter().map(|_| OnceLock::new()).collect(),
        }
    }

    /// The (model, `caller`) counters, made at the pair's first call; a
    /// tenant of the directory (an index beyond the configuration's callers)
    /// finds its own in the metrics by name.
    pub fn counters(&self, caller: &Caller, metrics: &GatewayMetrics) -> Arc<CallCounters> {
        let Some(slot) = self.counters.get(caller.index) else {
            return metrics.calls(&self.config.name, &caller.name);
        };
        slot.get_or_init(|| metrics.calls(&self.config.name, &caller.name))
            .clone()
    }

    /// The (model, `class`) counters, made at the pair's first call.
    pub fn class_counters(&self, class: usize, classes: &Classes, metrics: &GatewayMetrics) -> Arc<ClassCounters> {
        let slot = &self.class_counters[class];
        slot.get_or_init(|| metrics.classes.pair(&self.config.name, classes.name(class)))
            .clone()
    }
}

/// Who calls: a tenant, or the one caller of a gateway without tenants (the
/// last of the gateway's callers, named [`NO_TENANT`], without keys, in the
/// top class).
pub struct Caller {
    /// Its index among the gateway's callers: its queue turn, its counters.
    pub index: usize,
    /// The tenant's name, or [`NO_TENANT`]; a metrics label and the log's.
    pub name: Arc<str>,
    /// Who owns the stored responses and conversations handed to it
    /// (`proxy/response_ids.rs`): the name of a tenant of the file (or
    /// [`NO_TENANT`]), the id of a tenant of the directory, so that a tenant
    /// deleted and made again under the same name is another owner.
    pub owner: Arc<str>,
    /// The tenant's keys; `None` for the caller without a tenant.
    pub keys: Option<Arc<TenantKeys>>,
    /// Its class (an index into the gateway's classes).
    pub class: usize,
    /// Its calls open and waiting.
    pub caps: Arc<TenantCaps>,
    /// The owner of its leases ([`Caller::lease_owner`]), made once with the
    /// caller ([`lease_owner_of`]): its tag is a SHA-256 of the name, too dear
    /// to compute again for every call.
    pub owner_of_leases: LeaseOwner,
}

/// The owner of the leases of the caller named `name` (see [`Caller::lease_owner`]).
pub fn lease_owner_of(name: &str) -> LeaseOwner {
    LeaseOwner::new(format!("{LEASE_OWNER_PREFIX}{name}"))
}

impl Caller {
    /// The caller without a tenant, at `index`, under `caps`.
    pub fn no_tenant(index: usize, caps: TenantCaps) -> Self {
        Self {
            index,
            name: Arc::from(NO_TENANT),
            owner: Arc::from(NO_TENANT),
            keys: None,
            class: 0,
            caps: Arc::new(caps),
            owner_of_leases: lease_owner_of(NO_TENANT),
        }
    }

    /// The owner its leases are charged to in the backend's lease table
    /// (docs/memory-backend.md, "Shares of the lease table"): one per tenant, so
    /// one tenant holding its whole share cannot crowd out another's live leases.
    /// The gateway makes its own lease ids, so no namespace is needed.
    pub fn lease_owner(&self) -> LeaseOwner {
        self.owner_of_leases.clone()
    }

    /// The prefix of the tenant's own keys (`tenant:<name>:`); `None` without a tenant.
    pub fn key_prefix(&self) -> Option<String> {
        self.keys
            .as_ref()
            .map(|_| format!("{TENANT_LIMIT_PREFIX}{}:", self.name))
    }
}
