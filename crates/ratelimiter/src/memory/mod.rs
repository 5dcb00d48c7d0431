//! The memory backend (single-binary mode, docs/memory-backend.md): the semantics of the
//! TigerBeetle backend with in-process data structures.
//!
//! One lock guards all state, so all-or-nothing reserves are trivially atomic;
//! the critical section is a few hash lookups and O(1) queue operations. The
//! lock is a combining lock: under contention its holder runs the waiting
//! calls too, so the state stays in one core's cache (see BENCHMARKS.md for
//! what it costs and how it scales).

mod combining_lock;
mod config;
mod counters;
mod expiry_queue;
mod fast_map;
mod lease_table;
mod limit;
mod settled_leases;
mod snapshot;
mod stack_vec;
mod state;

use std::sync::Arc;

use async_trait::async_trait;

use crate::base::clock::Clock;
use crate::base::metrics::{BackendMetrics, Metric};
use crate::limiting::limiter::{Backend, Limiter};
use crate::model::definition::{LimitReport, LimitState};
use crate::model::error::LimiterError;
use crate::model::key::LimitKey;
use crate::model::retry::Jitter;
use crate::model::wire::{CompleteRequest, ReserveOutcome, ReserveRequest};

pub use config::LEASE_SHARE_PERCENT_DEFAULT;
pub use config::{MemoryConfig, DECREASE_RETRY_MS_DEFAULT, FAILED_LEASES_MAX_DEFAULT, LEASES_MAX_DEFAULT};
pub use config::{SETTLED_LEASES_MAX_DEFAULT, SETTLED_LEASES_MAX_LIMIT};
pub use counters::MemoryCounters;
pub use expiry_queue::EXPIRY_INSTANTS_MAX;
pub use snapshot::SNAPSHOT_FORMAT_VERSION_OLDEST;
pub use snapshot::{MemorySnapshot, RestoreReport, SnapshotError, SNAPSHOT_FORMAT_VERSION, SNAPSHOT_MAGIC};
pub use state::{LEASE_MEMORY_MARGIN_MS, LIMITS_MAX, TOO_MANY_LEASES_RETRY_MS};

use combining_lock::CombiningLock;
use state::MemoryState;

/// Limits held in process memory. Cheap to share: use it as `Arc<dyn Backend>`.
#[derive(Debug)]
pub struct MemoryBackend {
    clock: Arc<dyn Clock>,
    jitter: Jitter,
    /// All limits and leases; every call is one operation on it.
    state: CombiningLock<MemoryState>,
}

impl MemoryBackend {
    /// A backend with no limits, reading time from `clock`, jitter seeded from
    /// the operating system.
    ///
    /// Panics when `config` is invalid: check it with [`MemoryConfig::validate`].
    pub fn new(clock: Arc<dyn Clock>, config: MemoryConfig) -> Self {
        Self::with_jitter(clock, config, Jitter::from_entropy())
    }

    /// Like [`MemoryBackend::new`] with a given jitter source, so tests get
    /// reproducible hints.
    pub fn with_jitter(clock: Arc<dyn Clock>, config: MemoryConfig, jitter: Jitter) -> Self {
        if let Err(message) = config.validate() {
            panic!("invalid memory backend config: {message}");
        }
        Self {
            clock,
            jitter,
            state: CombiningLock::new(MemoryState::new(config)),
        }
    }

    /// The counters (overage dropped, evictions, ...).
    pub fn counters(&self) -> MemoryCounters {
        self.state.run(|state| state.counters())
    }

    /// The live state now, to save with [`MemorySnapshot::write_atomic`] and
    /// put back after a restart with [`MemoryBackend::restore`]. Only plain
    /// copies are made under the lock; encoding happens outside it.
    pub fn snapshot(&self) -> MemorySnapshot {
        let mut snapshot = MemorySnapshot::empty();
        self.snapshot_into(&mut snapshot);
        snapshot
    }

    /// Like [`MemoryBackend::snapshot`], over `snapshot`'s content and into
    /// its memory: periodic snapshots reuse one, so the copy under the lock
    /// writes to pages already in memory (BENCHMARKS.md, "Memory snapshots").
    pub fn snapshot_into(&self, snapshot: &mut MemorySnapshot) {
        let now_unix_micros = self.clock.now_unix_micros();
        let now_boot = self.clock.boot_instant();
        self.state
            .run(|state| snapshot.copy_from(state, now_unix_micros, now_boot));
    }

    /// Puts `snapshot` back, as of the clock's now: define the limits first
    /// (from the registry), then restore before serving anything. Holds that
    /// ended meanwhile and limits no longer defined are left out (the report
    /// counts them); settled and denied lease ids keep answering replays.
    /// A wall-clock step since the snapshot (same boot) moves its instants
    /// first, so holds end after the real time they were granted for.
    pub fn restore(&self, snapshot: &MemorySnapshot) -> Result<RestoreReport, SnapshotError> {
        let now_unix_micros = self.clock.now_unix_micros();
        let now_unix_ms = now_unix_micros / 1_000;
        let clock_step_ms = snapshot.clock_step_ms(now_unix_micros, self.clock.boot_instant());
        let shifted;
        let snapshot = if clock_step_ms == 0 {
            snapshot
        } else {
            shifted = snapshot.shifted(clock_step_ms);
            &shifted
        };
        let report = self.state.run(|state| state.restore(snapshot, now_unix_ms))?;
        Ok(RestoreReport {
            clock_step_ms,
            ..report
        })
    }
}

/// The instants of a reserve: now in whole milliseconds, rounded down, for
/// what has expired (a hold ends once its instant is reached); and the grant's
/// instant rounded up, from which its holds last their window or timeout. A
/// grant 12.9 ms into a second then ends at 13 ms + window, never before its
/// window has passed since the grant (rounded down it ended at 12 ms + window,
/// up to 1 ms early: issue 15). At whole milliseconds the two are equal.
fn grant_instants(clock: &dyn Clock) -> (u64, u64) {
    let now_unix_micros = clock.now_unix_micros();
    (now_unix_micros / 1_000, now_unix_micros.div_ceil(1_000))
}

impl BackendMetrics for MemoryBackend {
    fn metrics(&self) -> Vec<Metric> {
        self.counters().metrics()
    }
}

#[async_trait]
impl Limiter for MemoryBackend {
    async fn reserve(&self, request: &ReserveRequest) -> Result<ReserveOutcome, LimiterError> {
        // The clock is read outside the lock to keep the critical section short.
        let (now_unix_ms, granted_unix_ms) = grant_instants(self.clock.as_ref());
        self.state
            .run(|state| state.reserve(request, now_unix_ms, granted_unix_ms, &self.jitter))
    }

    async fn complete(&self, request: &CompleteRequest) -> Result<(), LimiterError> {
        let now_unix_ms = self.clock.now_unix_ms();
        self.state.run(|state| state.complete(request, now_unix_ms))
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    async fn apply_state(&self, state: &LimitState) -> Result<(), LimiterError> {
        self.state.run(|memory| memory.apply_state(state))
    }

    async fn limit_report(&self, key: &LimitKey) -> Result<Option<LimitReport>, LimiterError> {
        let now_unix_ms = self.clock.now_unix_ms();
        Ok(self.state.run(|state| state.limit_report(key, now_unix_ms)))
    }

    async fn limit_available(&self, key: &LimitKey) -> Result<Option<u64>, LimiterError> {
        let now_unix_ms = self.clock.now_unix_ms();
        Ok(self.state.run(|state| state.limit_available(key, now_unix_ms)))
    }

    async fn limit_reports(&self) -> Result<Vec<LimitReport>, LimiterError> {
        let now_unix_ms = self.clock.now_unix_ms();
        Ok(self.state.run(|state| state.limit_reports(now_unix_ms)))
    }

    async fn apply_pending_decreases(&self) -> Result<Vec<LimitState>, LimiterError> {
        let now_unix_ms = self.clock.now_unix_ms();
        Ok(self.state.run(|state| state.apply_pending_decreases(now_unix_ms)))
    }

    async fn next_release_ms(&self, key: &LimitKey) -> Result<Option<u64>, LimiterError> {
        let now_unix_ms = self.clock.now_unix_ms();
        Ok(self.state.run(|state| state.next_release_ms(key, now_unix_ms)))
    }

    async fn health(&self) -> Result<(), LimiterError> {
        Ok(())
    }
}
