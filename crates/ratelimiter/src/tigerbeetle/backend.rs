//! The TigerBeetle backend: the [`Backend`] of distributed mode. Limits live in
//! TigerBeetle accounts; this process keeps only their definitions, the lease
//! cache and retry streaks, so any number of servers can share one cluster.
//!
//! What the backend holds is `Shared` (shared.rs), below the files of its paths
//! (reserve, complete, admin, definitions, buckets, the logs); this type sits
//! above them all and hands each call to them.

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;

use crate::base::metrics::{BackendMetrics, LabeledMetric, Metric};
use crate::limiting::limiter::{Backend, FleetServer, Limiter};
use crate::model::definition::{LimitReport, LimitState};
use crate::model::error::LimiterError;
use crate::model::key::LimitKey;
use crate::model::wire::{CompleteRequest, ReserveOutcome, ReserveRequest};

use super::config::TigerBeetleConfig;
use super::connections::ReplicaConnectionCounts;
use super::counters::{self, TigerBeetleCounters};
use super::server_log::ServerIdentity;
use super::shared::Shared;
use super::submitter::SubmitterStats;

pub use super::shared::{BackendOptions, DENIED_LEASES_MAX, HEALTH_TIMEOUT_MS, LIMITS_MAX, UNAVAILABLE_RETRY_MS};

/// The TigerBeetle backend.
pub struct TigerBeetleBackend {
    /// Everything the backend holds; the logs built on the backend share it.
    pub(super) shared: Arc<Shared>,
}

impl std::fmt::Debug for TigerBeetleBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.shared.fmt(f)
    }
}

impl TigerBeetleBackend {
    /// Opens the sessions and starts the submitter, which stops on `shutdown`.
    /// Does not wait for the cluster: [`Backend::health`] says whether it answers.
    pub fn connect(
        config: &TigerBeetleConfig,
        options: BackendOptions,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<Self, LimiterError> {
        let shared = Shared::connect(config, options, shutdown)?;
        Ok(Self {
            shared: Arc::new(shared),
        })
    }

    /// Units of overage dropped because the limit has `overage: none` and the
    /// difference could not be reserved.
    pub fn overage_dropped_units(&self) -> u64 {
        self.shared.overage_dropped_units()
    }

    /// What the submitter sent so far (batch sizes reached).
    pub fn submitter_stats(&self) -> &SubmitterStats {
        self.shared.submitter.stats()
    }

    /// The TCP connections this server holds to each replica (open, opened,
    /// opened while cut off, closed), as the kernel lists them.
    pub fn replica_connections(&self) -> Vec<ReplicaConnectionCounts> {
        self.shared.pool.replica_connections()
    }

    /// Every counter of the backend, read now.
    pub fn counters(&self) -> TigerBeetleCounters {
        self.shared.counters()
    }

    /// Reads the log up to date: every record committed before the call is
    /// applied when it returns. Reads run one at a time; a caller that waited
    /// while another read ran returns as soon as a read that started after its
    /// own arrival has finished, so a burst of unknown keys costs few reads.
    pub async fn refresh_definitions(&self) -> Result<(), LimiterError> {
        self.shared.refresh_definitions().await
    }

    /// Starts the task that refreshes the definitions every
    /// [`super::DEFINITIONS_REFRESH_INTERVAL_MS`] while they change, backing off
    /// while they do not; it ends when the backend (and every log built on it)
    /// is dropped.
    pub fn start_definitions_refresh(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        self.shared.start_definitions_refresh()
    }

    /// Names this server in the cluster: its definition records carry
    /// `identity` from now on, and the periodic read of the definitions writes
    /// its announce (retrying while the cluster does not answer). An identity
    /// given twice keeps the first.
    pub fn set_identity(&self, identity: ServerIdentity) -> Result<(), LimiterError> {
        self.shared.set_identity(identity)
    }

    /// Writes the announce when this server has an identity, has not written
    /// it yet and its next attempt is due; called by the periodic read of the
    /// definitions (and by a test or an embedder that runs none).
    pub async fn announce_if_due(&self) {
        self.shared.announce_if_due().await
    }

    /// The fleet's servers, reading what the cluster recorded since the last read.
    pub async fn read_servers(&self) -> Result<Vec<FleetServer>, LimiterError> {
        self.shared.read_servers().await
    }
}

impl BackendMetrics for TigerBeetleBackend {
    fn metrics(&self) -> Vec<Metric> {
        counters::backend_metrics(self.counters(), self.submitter_stats())
    }

    fn labeled_metrics(&self) -> Vec<LabeledMetric> {
        counters::replica_connection_metrics(&self.replica_connections())
    }
}

#[async_trait]
impl Limiter for TigerBeetleBackend {
    async fn reserve(&self, request: &ReserveRequest) -> Result<ReserveOutcome, LimiterError> {
        self.shared.reserve_lease(request).await
    }

    async fn complete(&self, request: &CompleteRequest) -> Result<(), LimiterError> {
        self.shared.complete_lease(request).await
    }
}

#[async_trait]
impl Backend for TigerBeetleBackend {
    async fn apply_state(&self, state: &LimitState) -> Result<(), LimiterError> {
        self.shared.apply_limit_state(state).await
    }

    async fn limit_report(&self, key: &LimitKey) -> Result<Option<LimitReport>, LimiterError> {
        let Some(state) = self.shared.state_of_fresh(key).await? else {
            return Ok(None);
        };
        Ok(self.shared.reports_of(vec![state]).await?.pop())
    }

    async fn limit_reports(&self) -> Result<Vec<LimitReport>, LimiterError> {
        let states = self.shared.all_states().into_iter().map(|v| v.state).collect();
        self.shared.reports_of(states).await
    }

    fn keeps_definitions(&self) -> bool {
        true
    }

    async fn refresh_definitions(&self) -> Result<(), LimiterError> {
        self.shared.refresh_definitions().await
    }

    async fn apply_pending_decreases(&self) -> Result<Vec<LimitState>, LimiterError> {
        self.shared.apply_decreases().await
    }

    async fn next_release_ms(&self, key: &LimitKey) -> Result<Option<u64>, LimiterError> {
        self.shared.next_release_from_cluster(key).await
    }

    fn name_server(&self, name: &str, address: &str) -> Result<(), LimiterError> {
        self.shared.set_identity(ServerIdentity {
            name: name.to_owned(),
            address: address.to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
        })
    }

    async fn fleet_servers(&self) -> Result<Option<Vec<FleetServer>>, LimiterError> {
        self.shared.read_servers().await.map(Some)
    }

    async fn health(&self) -> Result<(), LimiterError> {
        self.shared.check_health().await
    }

    fn unhealthy_reason(&self) -> Option<String> {
        self.shared.pool.stall_reason()
    }
}
