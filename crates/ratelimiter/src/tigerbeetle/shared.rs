//! What the TigerBeetle backend holds, below every path of the backend: the
//! cluster's sessions and the submitter, the definitions read from the log, the
//! lease cache, the bucket and clock memories and the counters.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::base::clock::Clock;
use crate::model::error::LimiterError;
use crate::model::retry::RetryAdvisor;

use super::buckets::{LevelReads, RefillMemory};
use super::cluster_clock::ClusterClock;
use super::config::{SubmitMode, TigerBeetleConfig};
use super::counters::TigerBeetleCounters;
use super::definition_log::DefinitionView;
use super::denied_leases::DeniedLeases;
use super::lease_cache::LeaseCache;
use super::lease_lookup::LeaseLookups;
use super::pool::{ClientPool, PoolError};
use super::server_log::{AnnounceProgress, ServerIdentity, ServerView};
use super::submitter::Submitter;

/// The retry hint of a 503: long enough for a replica to fail over or a queue
/// to drain, short enough that a retry with the same lease id comes soon.
pub const UNAVAILABLE_RETRY_MS: u64 = 1_000;
/// The most limits one backend holds: definitions are in memory and every
/// report lists them all.
pub const LIMITS_MAX: usize = 100_000;
/// How many leases denied by TigerBeetle are remembered (about 50 bytes each):
/// a million denials is minutes of a saturated fleet, longer than a caller
/// keeps retrying one lease id; beyond it TigerBeetle's own `id_already_failed`
/// still answers most retries.
pub const DENIED_LEASES_MAX: usize = 1_000_000;
/// How long a health check waits for the cluster: with the watchdog's
/// [`super::pool::STALL_MS`], a balancer hears of an outage within 2 s.
pub const HEALTH_TIMEOUT_MS: u64 = 1_000;

/// What the backend needs besides the cluster settings.
#[derive(Debug)]
pub struct BackendOptions {
    /// The retry hints of denials (docs/retry-hints.md: "ADR 0010 backoff", "Streaks",
    /// "Jitter").
    pub retry: RetryAdvisor,
    /// The `retry_after_ms` of `limit_decreasing:<key>` denials.
    pub decrease_retry_ms: u64,
    /// The time source of `reserved_at_unix_ms` and reconciliation.
    pub clock: Arc<dyn Clock>,
    /// How long, in ms, rolling reservations of definitions that give no
    /// `window_margin_ms` are held beyond their window (0..=
    /// [`crate::WINDOW_MARGIN_MS_MAX`]; usually [`crate::WINDOW_MARGIN_MS_DEFAULT`]).
    /// Timeouts are whole seconds: window plus margin is rounded up.
    pub window_margin_ms: u64,
}

/// What the TigerBeetle backend holds: its sessions and submitter, the
/// definitions, the lease cache and the counters. The backend's paths (reserve,
/// complete, admin, the logs) are `impl` blocks of this type in their own files,
/// which take it from below; [`super::backend::TigerBeetleBackend`] above them
/// delegates to it.
pub(super) struct Shared {
    pub(super) pool: Arc<ClientPool>,
    pub(super) submitter: Submitter,
    /// Batches the lookups of leases this server does not hold.
    pub(super) lookups: LeaseLookups,
    /// The state of every defined limit, as read from the cluster's log.
    pub(super) definitions: RwLock<DefinitionView>,
    /// Serializes reads of the log.
    pub(super) refresh_gate: tokio::sync::Mutex<()>,
    /// Numbers the reads of the log as they start.
    pub(super) refresh_started: AtomicU64,
    /// The number of the last read that finished successfully.
    pub(super) refresh_done: AtomicU64,
    /// When the log was last read up to date (a metric of staleness).
    pub(super) last_refresh_unix_ms: AtomicU64,
    /// Reads of the log that failed (a metric).
    pub(super) refresh_failures: AtomicU64,
    /// Set by a read that found records, cleared by the periodic task, which
    /// then reads fast again (docs/tigerbeetle-backend.md, "Shared definitions").
    pub(super) log_moved: std::sync::atomic::AtomicBool,
    /// True once the definition log's and claims' accounts are known to exist.
    pub(super) log_accounts_ready: std::sync::atomic::AtomicBool,
    /// True once the lease-marker accounts are known to exist.
    pub(super) lease_accounts_ready: std::sync::atomic::AtomicBool,
    /// Completes whose lease this server remembered (a metric).
    pub(super) completes_from_cache: AtomicU64,
    /// Completes whose lease was read back from the cluster (a metric).
    pub(super) completes_from_cluster: AtomicU64,
    /// A lower bound of the cluster's time, for Completes of leases reserved
    /// by another process (docs/tigerbeetle-backend.md, "Clocks").
    pub(super) cluster_clock: ClusterClock,
    /// The last refill boundary this process saw posted, per bucket key
    /// (docs/tigerbeetle-backend.md, "Buckets").
    pub(super) refills: RefillMemory,
    /// Bucket levels read for denials' hints, shared for a moment by the
    /// key's other denials.
    pub(super) levels: LevelReads,
    pub(super) leases: LeaseCache,
    pub(super) denied: DeniedLeases,
    pub(super) retry: RetryAdvisor,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) decrease_retry_ms: u64,
    /// The window margin of definitions that give none, in ms.
    pub(super) window_margin_ms: u64,
    /// The longest a request waits for TigerBeetle.
    pub(super) timeout: Duration,
    /// Serialises admin changes: each one reads balances and then moves capacity.
    pub(super) admin: tokio::sync::Mutex<()>,
    /// Overage of `overage: none` limits that could not be reserved (a metric).
    pub(super) overage_dropped_units: AtomicU64,
    /// Overage of `overage: debt` limits recorded as debt (a metric).
    pub(super) overage_debt_units: AtomicU64,
    /// Who this server is, once the embedding server said (docs/tigerbeetle-backend.md,
    /// "Servers of the fleet"); its definition records then name it.
    pub(super) identity: std::sync::OnceLock<(ServerIdentity, u64)>,
    /// Whether this server's announce is written, or when to try again.
    pub(super) announce: std::sync::Mutex<AnnounceProgress>,
    /// The fleet's servers as read from the cluster, with the read's cursor.
    pub(super) servers: tokio::sync::Mutex<ServerView>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Named as the backend it is the state of, as before it had a type of its own.
        f.debug_struct("TigerBeetleBackend")
            .field("pool", &self.pool)
            .field("submitter", &self.submitter)
            .field("leases", &self.leases.len())
            .finish()
    }
}

impl Shared {
    /// Opens the sessions and starts the submitter, which stops on `shutdown`.
    /// Does not wait for the cluster.
    pub(super) fn connect(
        config: &TigerBeetleConfig,
        options: BackendOptions,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<Self, LimiterError> {
        let fields = config.fields();
        crate::model::definition::check_window_margin_ms(options.window_margin_ms, 0)
            .map_err(|m| LimiterError::Backend(format!("window_margin_ms: {m}")))?;
        // Batching keeps one batch in flight per session; direct mode lets the
        // client library queue up to the configured depth.
        let slots = match fields.submit_mode {
            SubmitMode::Batching => fields.sessions as usize,
            SubmitMode::Direct => fields.queue_depth_max as usize,
        };
        let pool = Arc::new(ClientPool::open(config, slots).map_err(|e| LimiterError::Backend(e.to_string()))?);
        let submitter = Submitter::start(Arc::clone(&pool), config, shutdown);
        // Replaces stalled sessions once the cluster answers again; ends with the pool.
        pool.start_watchdog();
        let lookups = LeaseLookups::start(Arc::clone(&pool));
        Ok(Self {
            pool,
            submitter,
            lookups,
            definitions: RwLock::new(DefinitionView::default()),
            refresh_gate: tokio::sync::Mutex::new(()),
            refresh_started: AtomicU64::new(0),
            refresh_done: AtomicU64::new(0),
            last_refresh_unix_ms: AtomicU64::new(0),
            refresh_failures: AtomicU64::new(0),
            log_moved: std::sync::atomic::AtomicBool::new(false),
            log_accounts_ready: std::sync::atomic::AtomicBool::new(false),
            lease_accounts_ready: std::sync::atomic::AtomicBool::new(false),
            completes_from_cache: AtomicU64::new(0),
            completes_from_cluster: AtomicU64::new(0),
            cluster_clock: ClusterClock::default(),
            refills: RefillMemory::default(),
            levels: LevelReads::default(),
            leases: LeaseCache::new(fields.lease_cache_max as usize, config.owner_leases_max()),
            denied: DeniedLeases::new(DENIED_LEASES_MAX),
            retry: options.retry,
            clock: options.clock,
            decrease_retry_ms: options.decrease_retry_ms,
            window_margin_ms: options.window_margin_ms,
            timeout: Duration::from_millis(fields.request_timeout_ms),
            admin: tokio::sync::Mutex::new(()),
            overage_dropped_units: AtomicU64::new(0),
            overage_debt_units: AtomicU64::new(0),
            identity: std::sync::OnceLock::new(),
            announce: std::sync::Mutex::new(Default::default()),
            servers: tokio::sync::Mutex::new(ServerView::default()),
        })
    }

    /// Units of overage dropped because the limit has `overage: none` and the
    /// difference could not be reserved.
    pub(super) fn overage_dropped_units(&self) -> u64 {
        self.overage_dropped_units.load(Ordering::Relaxed)
    }

    /// Every counter of the backend, read now.
    pub(super) fn counters(&self) -> TigerBeetleCounters {
        let stats = self.submitter.stats();
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let now = self.clock.now_unix_ms();
        let view = self.definitions.read().expect("definitions lock");
        let (lease_lookups, lease_lookup_requests) = self.lookups.counts();
        TigerBeetleCounters {
            overage_dropped_units: load(&self.overage_dropped_units),
            overage_debt_units: load(&self.overage_debt_units),
            batches: stats.snapshot(),
            queue_full: load(&stats.queue_full),
            timeouts: load(&stats.timeouts),
            abandoned: load(&stats.abandoned),
            queue_depth: self.submitter.queue_depth() as u64,
            slots_busy: self.pool.slots_busy() as u64,
            sessions_renewed: self.pool.sessions_renewed(),
            sessions_replaced: self.pool.sessions_replaced(),
            session_probes: self.pool.probes(),
            clients_open: self.pool.clients_open() as u64,
            probes_open: self.pool.probes_open() as u64,
            requests: self.pool.requests(),
            definitions_reads: load(&self.refresh_started),
            leases_cached: self.leases.len() as u64,
            lease_cache_evictions: self.leases.evicted(),
            lease_cache_refused: self.leases.refused(),
            denied_leases: self.denied.len() as u64,
            denied_lease_evictions: self.denied.evicted(),
            completes_from_cache: load(&self.completes_from_cache),
            completes_from_cluster: load(&self.completes_from_cluster),
            cluster_clock_probes: self.cluster_clock.probes(),
            lease_lookups,
            lease_lookup_requests,
            definitions: view.len() as u64,
            definitions_newest_age_ms: match view.newest_version() {
                0 => 0,
                newest => now.saturating_sub(newest / 1_000_000),
            },
            definitions_refresh_age_ms: now.saturating_sub(load(&self.last_refresh_unix_ms)),
            definitions_refresh_failures: load(&self.refresh_failures),
            definitions_malformed: view.malformed_total(),
        }
    }
}
/// Maps a pool error to the caller's error: nothing known is `Unavailable`.
pub(super) fn unavailable(error: &PoolError, what: &str) -> LimiterError {
    match error {
        PoolError::Busy => tracing::warn!(what, "TigerBeetle queue full, shedding"),
        PoolError::Timeout(_) => tracing::warn!(what, error = %error, "TigerBeetle outcome unknown"),
        PoolError::Client(_) => tracing::error!(what, error = %error, "TigerBeetle client failed"),
    }
    LimiterError::Unavailable {
        retry_after_ms: UNAVAILABLE_RETRY_MS,
    }
}
