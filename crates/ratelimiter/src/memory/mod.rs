//! The memory backend (single-binary mode, spec §10, `backend-memory.md`): the
//! semantics of the TigerBeetle backend with in-process data structures.
//!
//! Locking, always in this order: the lease shard of the call's lease id (lease
//! bookkeeping: live, settled and denied ids; requests with the same lease id
//! are serialized), the limit set for reading (written only to add a limit),
//! then the call's limits in ascending index order, all held while deciding so
//! all-or-nothing stays atomic. Calls on disjoint keys and lease ids share no
//! lock but the limit set's read side. BENCHMARKS.md has the measurements.

mod config;
mod counters;
mod expiry_queue;
mod lease_shard;
mod lease_table;
mod limit;
mod limit_set;
mod recent_ids;
mod settled_cache;
mod stack_vec;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard};

use async_trait::async_trait;

use crate::clock::Clock;
use crate::definition::{LimitReport, LimitState};
use crate::error::LimiterError;
use crate::key::LimitKey;
use crate::limiter::{Backend, Limiter};
use crate::retry::Jitter;
use crate::wire::{CompleteRequest, Denial, ReserveOutcome, ReserveRequest};

pub use config::{MemoryConfig, DECREASE_RETRY_MS_DEFAULT, FAILED_LEASES_MAX_DEFAULT, LEASES_MAX_DEFAULT};
pub use counters::MemoryCounters;
pub use expiry_queue::EXPIRY_INSTANTS_MAX;
pub use limit_set::{LEASE_MEMORY_MARGIN_MS, LIMITS_MAX};
pub use settled_cache::SETTLED_SLOTS_MAX;

use lease_shard::LeaseShard;
use lease_table::LiveLease;
use limit_set::{lock, sorted, LimitSet, OverageUnits};

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
    config: MemoryConfig,
    limits: RwLock<LimitSet>,
    /// A power-of-two number of shards, chosen by a lease id's low bits
    /// (random in a ULID).
    shards: Box<[Mutex<LeaseShard>]>,
    /// The longest window or timeout of any limit ever defined, plus
    /// [`LEASE_MEMORY_MARGIN_MS`]: how long denied and settled lease ids are remembered.
    retention_ms: AtomicU64,
    overage_dropped_total: AtomicU64,
    overage_debt_total: AtomicU64,
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
            config,
            limits: RwLock::new(LimitSet::default()),
            shards: (0..shards)
                .map(|_| Mutex::new(LeaseShard::new(leases_max, failed_max)))
                .collect(),
            retention_ms: AtomicU64::new(LEASE_MEMORY_MARGIN_MS),
            overage_dropped_total: AtomicU64::new(0),
            overage_debt_total: AtomicU64::new(0),
        }
    }

    /// The counters (overage dropped, evictions, ...).
    pub fn counters(&self) -> MemoryCounters {
        let mut counters = MemoryCounters {
            overage_dropped_total: self.overage_dropped_total.load(Ordering::Relaxed),
            overage_debt_total: self.overage_debt_total.load(Ordering::Relaxed),
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

    fn limit_set(&self) -> RwLockReadGuard<'_, LimitSet> {
        self.limits.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn count_overage(&self, overage: OverageUnits) {
        if overage.dropped > 0 {
            self.overage_dropped_total.fetch_add(overage.dropped, Ordering::Relaxed);
        }
        if overage.debt > 0 {
            self.overage_debt_total.fetch_add(overage.debt, Ordering::Relaxed);
        }
    }
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
        let retention_ms = self.retention_ms.load(Ordering::Relaxed);
        let mut shard = self.shard(id);
        let set = self.limit_set();
        let wanted = set.resolve(request)?;
        shard.forget_old(now_unix_ms, retention_ms);
        if let Some(answer) = shard.replay(request.lease_id(), &wanted, now_unix_ms, retention_ms) {
            return answer;
        }
        if shard.is_failed(id) {
            return Ok(ReserveOutcome::Denied(Denial::LeaseAlreadyFailed));
        }
        let mut locked = set.lock_all(sorted(&wanted).as_slice().iter().map(|&(i, _)| i));
        if let Some(denial) = locked.standing_denial(&wanted, self.config.decrease_retry_ms) {
            return Ok(ReserveOutcome::Denied(denial));
        }
        let granted = locked.try_grant(&wanted, now_unix_ms, &self.config.retry_policy, &self.jitter);
        drop(locked);
        drop(set);
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
        let retention_ms = self.retention_ms.load(Ordering::Relaxed);
        let mut shard = self.shard(id);
        let Some(lease) = shard.get(id) else {
            return Ok(());
        };
        let overage = self.limit_set().settle_lease(lease, request, now_unix_ms)?;
        shard.complete(id, now_unix_ms, retention_ms);
        drop(shard);
        self.count_overage(overage);
        Ok(())
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    async fn apply_state(&self, state: &LimitState) -> Result<(), LimiterError> {
        let hold_ms = state.definition().hold_ms();
        if !self.limit_set().update(state)? {
            let mut set = self.limits.write().unwrap_or_else(|poisoned| poisoned.into_inner());
            // Another call may have added the key between the two locks.
            if !set.update(state)? {
                set.insert(state)?;
            }
        }
        self.retention_ms
            .fetch_max(hold_ms + LEASE_MEMORY_MARGIN_MS, Ordering::Relaxed);
        Ok(())
    }

    async fn limit_report(&self, key: &LimitKey) -> Result<Option<LimitReport>, LimiterError> {
        let now_unix_ms = self.clock.now_unix_ms();
        Ok(self.limit_set().limit_report(key, now_unix_ms))
    }

    async fn limit_reports(&self) -> Result<Vec<LimitReport>, LimiterError> {
        let now_unix_ms = self.clock.now_unix_ms();
        Ok(self.limit_set().limit_reports(now_unix_ms))
    }

    async fn apply_pending_decreases(&self) -> Result<Vec<LimitState>, LimiterError> {
        let now_unix_ms = self.clock.now_unix_ms();
        Ok(self.limit_set().apply_pending_decreases(now_unix_ms))
    }

    async fn health(&self) -> Result<(), LimiterError> {
        Ok(())
    }
}
