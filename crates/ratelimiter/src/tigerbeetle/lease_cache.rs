//! The lease cache: what Complete needs to know about a reservation (when it was made,
//! what it holds), kept in memory only and bounded (docs/tigerbeetle-backend.md, "The
//! lease cache"). A lease that is not here is completed without reconciliation: its holds
//! expire by their TigerBeetle timeouts. Completed leases stay until evicted, so retries
//! of their Reserve or Complete are answered without another round trip.

use std::sync::Mutex;

use crate::recent_ids::RecentIds;

use crate::{LeaseId, LimitKey, LimitKind};

/// One reserved requirement as it was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldRequirement {
    /// The limit.
    pub key: LimitKey,
    /// The units reserved.
    pub amount: u64,
    /// The limit's kind when reserved: concurrency holds are voided on Complete,
    /// rolling ones reconciled.
    pub kind: LimitKind,
    /// The pending transfer's timeout in seconds (window plus margin rounded up,
    /// or hold timeout), so the reconciled reservation ends when the original
    /// one would have.
    pub timeout_seconds: u64,
    /// The id of its pending transfer, which a void names: derived from the
    /// lease and the requirement's index ([`super::ids::reservation_id`]), or,
    /// for a lease reserved by an earlier version, from the lease and the key.
    pub reservation_id: u128,
}

/// A fingerprint of a set of (key, amount) requirements, independent of their
/// order: what a completed lease keeps to tell a retry from a reuse.
pub fn fingerprint<'a>(requirements: impl Iterator<Item = (&'a LimitKey, u64)>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut sorted: Vec<(&LimitKey, u64)> = requirements.collect();
    sorted.sort_unstable();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    sorted.hash(&mut hasher);
    hasher.finish()
}

/// What is remembered of one lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// When the reservation was made (or attempted, for an unknown outcome).
    pub reserved_at_unix_ms: u64,
    /// The cluster's time stamp of the lease's latest reservation, in ns,
    /// for a lease read back from the cluster (reserved by another process):
    /// Complete then measures the window's elapsed time on the cluster's
    /// clock, not against another process's `reserved_at_unix_ms`. `None` for
    /// a lease this process reserved, timed by its own monotonic clock.
    pub reserved_at_cluster_ns: Option<u64>,
    /// The requirements in request order; emptied once completed, since only
    /// the fingerprint is needed from then on.
    pub held: Vec<HeldRequirement>,
    /// The fingerprint of the requirements ([`fingerprint`]): a retry of the
    /// lease must ask for exactly the same, in any order.
    pub fingerprint: u64,
    /// True once TigerBeetle confirmed the reservation; false while its outcome
    /// is unknown (a timeout), when Complete still voids by id to be safe.
    pub confirmed: bool,
    /// True once Complete ran: a second Complete changes nothing, and the same
    /// lease reserved again is answered from here without reserving anything.
    pub completed: bool,
}

/// A bounded map of lease records; the oldest insertions are dropped first.
/// Each record is remembered from its `reserved_at_unix_ms`; nothing expires
/// by time, only the count bound applies.
#[derive(Debug)]
pub struct LeaseCache {
    /// Leases forgotten to respect `leases_max` are counted by the map (a
    /// metric): their Completes were not reconciled, their holds expire by
    /// their timeouts.
    inner: Mutex<RecentIds<LeaseRecord>>,
}

impl LeaseCache {
    /// A cache of at most `leases_max` leases.
    pub fn new(leases_max: usize) -> Self {
        Self {
            inner: Mutex::new(RecentIds::new(leases_max)),
        }
    }

    fn locked(&self) -> std::sync::MutexGuard<'_, RecentIds<LeaseRecord>> {
        self.inner.lock().expect("lease cache lock poisoned")
    }

    /// Remembers `record` for `lease`, replacing an older one, and forgets the
    /// oldest leases beyond `leases_max`.
    pub fn insert(&self, lease: LeaseId, record: LeaseRecord) {
        let since = record.reserved_at_unix_ms;
        self.locked().insert(lease.to_u128(), since, record);
    }

    /// Replaces the record of `lease` in place, keeping its age, or inserts it
    /// when it is not remembered (any more). A lease's later states (confirmed,
    /// completed) thus cost no second entry in the insertion order.
    pub fn update(&self, lease: LeaseId, record: LeaseRecord) {
        let since = record.reserved_at_unix_ms;
        self.locked().update(lease.to_u128(), since, record);
    }

    /// The record of `lease`, if remembered.
    pub fn get(&self, lease: LeaseId) -> Option<LeaseRecord> {
        self.locked().get(lease.to_u128()).cloned()
    }

    /// Forgets `lease` (after a Complete).
    pub fn remove(&self, lease: LeaseId) {
        self.locked().remove(lease.to_u128());
    }

    /// How many leases are remembered.
    pub fn len(&self) -> usize {
        self.locked().len()
    }

    /// How many leases were forgotten to respect `leases_max`.
    pub fn evicted(&self) -> u64 {
        self.locked().evicted_total()
    }

    /// True when no lease is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(at: u64) -> LeaseRecord {
        LeaseRecord {
            reserved_at_unix_ms: at,
            reserved_at_cluster_ns: None,
            held: vec![HeldRequirement {
                key: LimitKey::new("k").unwrap(),
                amount: 1,
                kind: LimitKind::Rolling,
                timeout_seconds: 60,
                reservation_id: 1,
            }],
            fingerprint: 0,
            confirmed: true,
            completed: false,
        }
    }

    #[test]
    fn fingerprints_ignore_order_only() {
        let (a, b) = (LimitKey::new("a").unwrap(), LimitKey::new("b").unwrap());
        let ab = fingerprint([(&a, 1), (&b, 2)].into_iter());
        assert_eq!(ab, fingerprint([(&b, 2), (&a, 1)].into_iter()));
        assert_ne!(ab, fingerprint([(&a, 1), (&b, 3)].into_iter()));
        assert_ne!(ab, fingerprint([(&a, 1)].into_iter()));
    }

    #[test]
    fn oldest_leases_are_dropped_beyond_capacity() {
        let cache = LeaseCache::new(2);
        let (a, b, c) = (LeaseId::from_u128(1), LeaseId::from_u128(2), LeaseId::from_u128(3));
        cache.insert(a, record(1));
        cache.insert(b, record(2));
        cache.insert(c, record(3));
        assert_eq!(cache.len(), 2);
        assert!(cache.get(a).is_none());
        assert_eq!(cache.evicted(), 1);
        assert_eq!(cache.get(b).unwrap().reserved_at_unix_ms, 2);
        assert_eq!(cache.get(c).unwrap().reserved_at_unix_ms, 3);
    }

    #[test]
    fn reinserted_leases_are_not_evicted_by_their_stale_entry() {
        let cache = LeaseCache::new(2);
        let (a, b, c) = (LeaseId::from_u128(1), LeaseId::from_u128(2), LeaseId::from_u128(3));
        cache.insert(a, record(1));
        cache.insert(b, record(2));
        cache.remove(a);
        cache.insert(a, record(10));
        cache.insert(c, record(3));
        // b is now the oldest live lease.
        assert!(cache.get(b).is_none());
        assert_eq!(cache.get(a).unwrap().reserved_at_unix_ms, 10);
        assert!(cache.get(c).is_some());
    }

    #[test]
    fn updates_keep_the_age_and_add_no_order_entry() {
        let cache = LeaseCache::new(2);
        let (a, b, c) = (LeaseId::from_u128(1), LeaseId::from_u128(2), LeaseId::from_u128(3));
        cache.insert(a, record(1));
        cache.insert(b, record(2));
        for at in 10..20 {
            cache.update(a, record(at));
        }
        assert_eq!(cache.get(a).unwrap().reserved_at_unix_ms, 19);
        // a is still the oldest: the next insertion evicts it.
        cache.insert(c, record(3));
        assert!(cache.get(a).is_none());
        // An update of a forgotten lease remembers it again.
        cache.update(a, record(4));
        assert_eq!(cache.get(a).unwrap().reserved_at_unix_ms, 4);
        assert!(cache.get(b).is_none());
    }

    #[test]
    fn the_order_queue_stays_bounded_under_churn() {
        let cache = LeaseCache::new(4);
        for i in 1..=10_000u128 {
            let lease = LeaseId::from_u128(i);
            cache.insert(lease, record(i as u64));
            cache.remove(lease);
        }
        assert!(cache.is_empty());
        assert_eq!(cache.evicted(), 0, "removed leases are not evictions");
    }
}
