//! The memory backend (single-binary mode, spec §10, `backend-memory.md`): the
//! semantics of the TigerBeetle backend with in-process data structures.
//!
//! Locking: one mutex guards every limit, so an all-or-nothing reserve over
//! any set of keys is atomic without lock ordering between keys; its critical
//! section is the key lookups and O(1) queue operations. Lease bookkeeping
//! (live, settled and denied lease ids) is split into shards by lease id, each
//! with its own mutex, always taken before the limits mutex: requests with the
//! same lease id are serialized, and the map work of different ids happens
//! outside the limits' critical section. BENCHMARKS.md has the measurements.

mod config;
mod counters;
mod expiry_queue;
mod lease_shard;
mod lease_table;
mod limit;
mod limit_table;
mod recent_ids;
mod settled_cache;
mod stack_vec;

use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;

use crate::clock::Clock;
use crate::definition::{LimitReport, LimitState};
use crate::error::LimiterError;
use crate::key::LimitKey;
use crate::limiter::{Backend, Limiter};
use crate::retry::Jitter;

use crate::wire::{CompleteRequest, Denial, ReserveOutcome, ReserveRequest};
use lease_table::LiveLease;

pub use config::{MemoryConfig, DECREASE_RETRY_MS_DEFAULT, FAILED_LEASES_MAX_DEFAULT, LEASES_MAX_DEFAULT};
pub use counters::MemoryCounters;
pub use expiry_queue::EXPIRY_INSTANTS_MAX;
pub use limit_table::{LEASE_MEMORY_MARGIN_MS, LIMITS_MAX};

use lease_shard::LeaseShard;
use limit_table::LimitTable;

/// Lease shards when the lease bounds are large. More shards than cores keep
/// two requests for different leases from meeting on one shard.
pub const LEASE_SHARDS: usize = 16;
/// The smallest lease bound that is sharded: below it one shard keeps exact
/// oldest-first eviction, which matters more than parallelism for tiny tables
/// (with shards, "oldest" is per shard: ids spread evenly, so nearly the same).
pub const SHARDED_LEASES_MIN: usize = 4096;

/// The hash maps of the hot path: foldhash is several times faster than SipHash
/// on lease ids and keys, and its per-process random seed keeps chosen lease ids
/// from forcing collisions cheaply.
type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Limits held in process memory. Cheap to share: use it as `Arc<dyn Backend>`.
#[derive(Debug)]
pub struct MemoryBackend {
    clock: Arc<dyn Clock>,
    jitter: Jitter,
    limits: Mutex<LimitTable>,
    /// A power-of-two number of shards, chosen by a lease id's low bits
    /// (random in a ULID).
    shards: Box<[Mutex<LeaseShard>]>,
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
        let sharded = config.leases_max >= SHARDED_LEASES_MIN && config.failed_leases_max >= SHARDED_LEASES_MIN;
        let shards = if sharded { LEASE_SHARDS } else { 1 };
        // Floors, so the shards together never exceed the configured bounds.
        let (leases_max, failed_max) = (config.leases_max / shards, config.failed_leases_max / shards);
        Self {
            clock,
            jitter,
            limits: Mutex::new(LimitTable::new(&config)),
            shards: (0..shards)
                .map(|_| Mutex::new(LeaseShard::new(leases_max, failed_max)))
                .collect(),
        }
    }

    /// The counters (overage dropped, evictions, ...).
    pub fn counters(&self) -> MemoryCounters {
        let (overage_dropped_total, overage_debt_total) = lock(&self.limits).overage_totals();
        let mut counters = MemoryCounters {
            overage_dropped_total,
            overage_debt_total,
            ..MemoryCounters::default()
        };
        for shard in self.shards.iter() {
            let c = lock(shard).counters();
            counters.leases_evicted_total += c.leases_evicted_total;
            counters.settled_leases_evicted_total += c.settled_leases_evicted_total;
            counters.failed_leases_evicted_total += c.failed_leases_evicted_total;
            counters.leases_live += c.leases_live;
            counters.failed_leases_remembered += c.failed_leases_remembered;
        }
        counters
    }

    fn shard(&self, id: u128) -> MutexGuard<'_, LeaseShard> {
        lock(&self.shards[id as usize & (self.shards.len() - 1)])
    }
}

/// Locks `mutex`. A panic under a lock is a bug that already failed loudly;
/// state is only mutated after every check passed, so it stays usable.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[async_trait]
impl Limiter for MemoryBackend {
    /// In the order of the contract: unknown key, idempotent replay or
    /// conflict, burnt lease id, never-fitting amount, decreasing key, then all
    /// requirements or none.
    async fn reserve(&self, request: &ReserveRequest) -> Result<ReserveOutcome, LimiterError> {
        // The clock is read outside the locks to keep the critical sections short.
        let now_unix_ms = self.clock.now_unix_ms();
        let id = request.lease_id().to_u128();
        let mut shard = self.shard(id);
        let mut limits = lock(&self.limits);
        let wanted = limits.resolve(request)?;
        let retention_ms = limits.retention_ms();
        shard.forget_old(now_unix_ms, retention_ms);
        if let Some(answer) = shard.replay(request.lease_id(), &wanted, now_unix_ms, retention_ms) {
            return answer;
        }
        if shard.is_failed(id) {
            return Ok(ReserveOutcome::Denied(Denial::LeaseAlreadyFailed));
        }
        if let Some(denial) = limits.standing_denial(&wanted) {
            return Ok(ReserveOutcome::Denied(denial));
        }
        let granted = limits.try_grant(&wanted, now_unix_ms, &self.jitter);
        drop(limits);
        match granted {
            Ok(holds) => {
                let lease = LiveLease::new(now_unix_ms, holds.as_slice());
                shard.insert(id, lease, now_unix_ms, retention_ms);
                Ok(ReserveOutcome::Allowed {
                    reserved_at_unix_ms: now_unix_ms,
                })
            }
            Err(denial) => {
                shard.record_failed(id, now_unix_ms);
                Ok(ReserveOutcome::Denied(denial))
            }
        }
    }

    /// Checks every actual before anything changes; an unknown or settled lease
    /// changes nothing.
    async fn complete(&self, request: &CompleteRequest) -> Result<(), LimiterError> {
        let now_unix_ms = self.clock.now_unix_ms();
        let id = request.lease_id().to_u128();
        let mut shard = self.shard(id);
        let Some(lease) = shard.get(id) else {
            return Ok(());
        };
        let retention_ms = {
            let mut limits = lock(&self.limits);
            limits.settle_lease(lease, request, now_unix_ms)?;
            limits.retention_ms()
        };
        shard.complete(id, now_unix_ms, retention_ms);
        Ok(())
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    async fn apply_state(&self, state: &LimitState) -> Result<(), LimiterError> {
        lock(&self.limits).apply_state(state)
    }

    async fn limit_report(&self, key: &LimitKey) -> Result<Option<LimitReport>, LimiterError> {
        let now_unix_ms = self.clock.now_unix_ms();
        Ok(lock(&self.limits).limit_report(key, now_unix_ms))
    }

    async fn limit_reports(&self) -> Result<Vec<LimitReport>, LimiterError> {
        let now_unix_ms = self.clock.now_unix_ms();
        Ok(lock(&self.limits).limit_reports(now_unix_ms))
    }

    async fn apply_pending_decreases(&self) -> Result<Vec<LimitState>, LimiterError> {
        let now_unix_ms = self.clock.now_unix_ms();
        Ok(lock(&self.limits).apply_pending_decreases(now_unix_ms))
    }

    async fn health(&self) -> Result<(), LimiterError> {
        Ok(())
    }
}
