//! Leases that stopped being live (completed, or evicted from the lease table),
//! remembered so a retry of their reserve is answered idempotently.

use std::hash::BuildHasher;

/// The most slots: 2 Mi slots of 40 bytes is 80 MiB, the most this best-effort
/// memory may take however large `leases_max` is configured.
pub const SETTLED_SLOTS_MAX: usize = 1 << 21;

/// What a retry of a settled lease's reserve needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SettledLease {
    /// When it was granted: answered again.
    pub reserved_at_unix_ms: u64,
    /// A keyed hash of its requirements, to tell a retry that asks for
    /// something else (see [`super::state`]).
    pub fingerprint: u64,
}

/// One slot as five words: lease id (low, high), since, reserved at,
/// fingerprint. All zeros is the empty slot (lease id 0 is never stored), and
/// a zeroed vector of integer arrays comes from the allocator already zeroed.
type Slot = [u64; 5];

fn slot_id(slot: &Slot) -> u128 {
    u128::from(slot[0]) | (u128::from(slot[1]) << 64)
}

/// A direct-mapped cache of settled leases: a fixed array indexed by a keyed
/// hash of the lease id, each id with exactly one possible slot.
///
/// Remembering a lease touches one slot (one cache line) and never allocates,
/// where an insertion-ordered map with oldest-first eviction touched three
/// random places per Complete; this was the largest cost of the hot path
/// (BENCHMARKS.md). The price: a lease is forgotten early when a later one
/// lands in its slot (about a third of them by the time as many leases as there
/// are slots have settled). That only matters for a caller retrying a reserve
/// after it completed the lease or after the lease was evicted; such a retry is
/// then granted anew, which can waste capacity but never over-admits. Early
/// evictions are counted.
#[derive(Debug)]
pub struct SettledCache {
    slots: Box<[Slot]>,
    hasher: foldhash::quality::RandomState,
    evicted_total: u64,
}

impl SettledCache {
    /// A cache of `entries` slots rounded up to a power of two, at most
    /// [`SETTLED_SLOTS_MAX`]. The slots are zeroed memory from the allocator
    /// (`vec!` of zeros asks for it zeroed), so pages cost resident memory only
    /// once leases settle into them.
    pub fn new(entries: usize) -> Self {
        assert!(entries >= 1, "room for one lease at least");
        let slots = vec![[0u64; 5]; entries.min(SETTLED_SLOTS_MAX).next_power_of_two()];
        Self {
            slots: slots.into_boxed_slice(),
            hasher: foldhash::quality::RandomState::default(),
            evicted_total: 0,
        }
    }

    /// The slot of `id`. The quality variant of foldhash, because the slot is
    /// the hash's low bits and the fast variant leaves them uneven for ids that
    /// differ little (measured on sequential ids: with some seeds, half again as
    /// many early evictions).
    fn slot(&self, id: u128) -> usize {
        // The mask keeps the index in range: the length is a power of two.
        (self.hasher.hash_one(id) as usize) & (self.slots.len() - 1)
    }

    /// The lease `id`, if remembered and younger than `retention_ms`.
    pub fn get(&self, id: u128, now_unix_ms: u64, retention_ms: u64) -> Option<SettledLease> {
        let slot = &self.slots[self.slot(id)];
        let fresh = slot[2].saturating_add(retention_ms) > now_unix_ms;
        let lease = SettledLease {
            reserved_at_unix_ms: slot[3],
            fingerprint: slot[4],
        };
        (id != 0 && slot_id(slot) == id && fresh).then_some(lease)
    }

    /// Remembers `lease` as `id` from `now_unix_ms` on, replacing whatever held its slot.
    pub fn insert(&mut self, id: u128, lease: SettledLease, now_unix_ms: u64, retention_ms: u64) {
        if id == 0 {
            return;
        }
        let i = self.slot(id);
        let slot = &mut self.slots[i];
        let displaced = slot_id(slot) != 0 && slot_id(slot) != id;
        if displaced && slot[2].saturating_add(retention_ms) > now_unix_ms {
            self.evicted_total += 1;
        }
        *slot = [
            id as u64,
            (id >> 64) as u64,
            now_unix_ms,
            lease.reserved_at_unix_ms,
            lease.fingerprint,
        ];
    }

    /// Leases forgotten before their retention ended.
    pub fn evicted_total(&self) -> u64 {
        self.evicted_total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(at: u64) -> SettledLease {
        SettledLease {
            reserved_at_unix_ms: at,
            fingerprint: at * 7,
        }
    }

    #[test]
    fn leases_are_remembered_for_the_retention() {
        let mut cache = SettledCache::new(1024);
        cache.insert(42, lease(5), 100, 50);
        assert_eq!(cache.get(42, 149, 50), Some(lease(5)));
        assert_eq!(cache.get(42, 150, 50), None);
        assert_eq!(cache.get(43, 120, 50), None);
        cache.insert(0, lease(1), 100, 50);
        assert_eq!(cache.get(0, 100, 50), None, "id 0 marks empty slots");
    }

    #[test]
    fn a_colliding_lease_displaces_the_older_one_and_is_counted() {
        let mut cache = SettledCache::new(1);
        cache.insert(1, lease(1), 0, 100);
        cache.insert(2, lease(2), 10, 100);
        assert_eq!((cache.get(1, 10, 100), cache.get(2, 10, 100)), (None, Some(lease(2))));
        assert_eq!(cache.evicted_total(), 1);
        cache.insert(3, lease(3), 500, 100);
        assert_eq!(cache.evicted_total(), 1, "an expired lease was not evicted early");
        cache.insert(3, lease(4), 501, 100);
        assert_eq!(cache.evicted_total(), 1, "re-settling the same id evicts nothing");
    }

    #[test]
    fn most_leases_survive_when_the_cache_is_half_full() {
        let mut cache = SettledCache::new(4096);
        for id in 1..=2048u128 {
            cache.insert(id, lease(id as u64), 0, 1000);
        }
        let remembered = (1..=2048u128).filter(|&id| cache.get(id, 0, 1000).is_some()).count();
        assert!(remembered > 1400, "{remembered} of 2048");
    }
}
