//! The lease bookkeeping of one shard of lease ids: live leases, settled ones
//! and denied ones. Each shard has its own mutex, taken before the limits
//! mutex, so requests with the same lease id are serialized while lease
//! bookkeeping of different ids runs outside the limits' critical section.

use std::hash::{BuildHasher, Hasher};

use crate::error::LimiterError;
use crate::id::LeaseId;
use crate::wire::ReserveOutcome;

use super::lease_table::{LeaseTable, LimitIndex, LiveLease};
use super::limit_set::{sorted, Wanted};
use super::recent_ids::RecentIds;
use super::settled_cache::{SettledCache, SettledLease};

/// One shard's leases.
#[derive(Debug)]
pub struct LeaseShard {
    leases: LeaseTable,
    settled: SettledCache,
    failed: RecentIds<()>,
    /// Seeds the fingerprints of settled leases' requirements: 64-bit keyed
    /// hashes, so a retry with other requirements is told apart unless it
    /// collides, with odds of 2^-64 for a caller already misusing the id.
    fingerprints: foldhash::fast::RandomState,
    leases_evicted_total: u64,
}

/// The lease counters of one shard.
#[derive(Debug, Clone, Copy, Default)]
pub struct ShardCounters {
    /// Live leases evicted to respect the bound.
    pub leases_evicted_total: u64,
    /// Settled leases forgotten early.
    pub settled_leases_evicted_total: u64,
    /// Denied ids forgotten early.
    pub failed_leases_evicted_total: u64,
    /// Live leases now.
    pub leases_live: u64,
    /// Denied ids remembered now.
    pub failed_leases_remembered: u64,
}

impl LeaseShard {
    /// An empty shard for at most `leases_max` live leases (and as many settled
    /// slots) and `failed_max` denied ids.
    pub fn new(leases_max: usize, failed_max: usize) -> Self {
        Self {
            leases: LeaseTable::new(leases_max),
            settled: SettledCache::new(leases_max),
            failed: RecentIds::new(failed_max),
            fingerprints: foldhash::fast::RandomState::default(),
            leases_evicted_total: 0,
        }
    }

    /// Forgets denied ids older than `retention_ms`.
    pub fn forget_old(&mut self, now_unix_ms: u64, retention_ms: u64) {
        self.failed.expire(now_unix_ms, retention_ms);
    }

    /// The answer to a lease id seen allowed before: the same grant again, or a
    /// conflict when the requirements differ (compared as sets).
    pub fn replay(
        &self,
        lease_id: LeaseId,
        wanted: &Wanted,
        now_unix_ms: u64,
        retention_ms: u64,
    ) -> Option<Result<ReserveOutcome, LimiterError>> {
        let id = lease_id.to_u128();
        let (reserved_at_unix_ms, same) = if let Some(lease) = self.leases.get(id) {
            let held = lease.holds().iter().map(|h| (h.limit, h.amount));
            (
                lease.reserved_at_unix_ms,
                held.eq(sorted(wanted).as_slice().iter().copied()),
            )
        } else if let Some(settled) = self.settled.get(id, now_unix_ms, retention_ms) {
            let fingerprint = self.fingerprint(sorted(wanted).as_slice().iter().copied());
            (settled.reserved_at_unix_ms, settled.fingerprint == fingerprint)
        } else {
            return None;
        };
        if !same {
            return Some(Err(LimiterError::Conflict(format!(
                "lease_id {lease_id} was already reserved with other requirements; use a new lease id"
            ))));
        }
        Some(Ok(ReserveOutcome::Allowed { reserved_at_unix_ms }))
    }

    /// True when `id` was denied for lack of capacity (and is still remembered).
    pub fn is_failed(&self, id: u128) -> bool {
        self.failed.get(id).is_some()
    }

    /// Burns `id`: a later reserve with it is denied.
    pub fn record_failed(&mut self, id: u128, now_unix_ms: u64) {
        self.failed.insert(id, now_unix_ms, ());
    }

    /// Records a granted lease; an evicted oldest lease is settled (its holds
    /// stay until they end; only its reconciliation is lost).
    pub fn insert(&mut self, id: u128, lease: LiveLease, now_unix_ms: u64, retention_ms: u64) {
        if let Some((evicted_id, evicted)) = self.leases.insert(id, lease) {
            self.leases_evicted_total += 1;
            self.settle(evicted_id, &evicted, now_unix_ms, retention_ms);
        }
    }

    /// The live lease `id`.
    pub fn get(&self, id: u128) -> Option<&LiveLease> {
        self.leases.get(id)
    }

    /// Ends the live lease `id` and remembers it as settled.
    pub fn complete(&mut self, id: u128, now_unix_ms: u64, retention_ms: u64) {
        let lease = self.leases.remove(id).expect("the caller found the lease");
        self.settle(id, &lease, now_unix_ms, retention_ms);
    }

    fn settle(&mut self, id: u128, lease: &LiveLease, now_unix_ms: u64, retention_ms: u64) {
        let settled = SettledLease {
            reserved_at_unix_ms: lease.reserved_at_unix_ms,
            fingerprint: self.fingerprint(lease.holds().iter().map(|h| (h.limit, h.amount))),
        };
        self.settled.insert(id, settled, now_unix_ms, retention_ms);
    }

    /// A keyed hash of requirements sorted by limit.
    fn fingerprint(&self, sorted: impl Iterator<Item = (LimitIndex, u64)>) -> u64 {
        let mut hasher = self.fingerprints.build_hasher();
        for (limit, amount) in sorted {
            hasher.write_u32(limit);
            hasher.write_u64(amount);
        }
        hasher.finish()
    }

    /// This shard's counters.
    pub fn counters(&self) -> ShardCounters {
        ShardCounters {
            leases_evicted_total: self.leases_evicted_total,
            settled_leases_evicted_total: self.settled.evicted_total(),
            failed_leases_evicted_total: self.failed.evicted_total(),
            leases_live: self.leases.len() as u64,
            failed_leases_remembered: self.failed.len() as u64,
        }
    }
}
