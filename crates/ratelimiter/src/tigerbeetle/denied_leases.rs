//! Leases TigerBeetle denied for lack of capacity. TigerBeetle remembers the id of the
//! transfer that failed (`id_already_failed`), but a retried chain stops at its first
//! failing transfer: when an earlier key of the chain is full by then, the retry reads
//! `exceeds_credits` again instead of `id_already_failed`. The backend therefore
//! remembers these leases itself, bounded, to keep "a denied lease stays denied"
//! (docs/lease-ids.md, "Denied lease ids stay denied") exact; TigerBeetle's own memory
//! covers other servers and restarts. Denials decided before sending anything (a
//! decreasing limit, an amount above capacity) burn nothing and are not here.

use std::sync::Mutex;

use crate::base::id::LeaseId;
use crate::base::recent_ids::RecentIds;

/// The instant every denied id is remembered at: these ids never expire by
/// time (TigerBeetle never forgets them either), only the count bound applies,
/// and one instant makes a repeated insert keep its place.
const DENIED_SINCE_UNIX_MS: u64 = 0;

/// A bounded set of denied lease ids; the oldest are forgotten first.
#[derive(Debug)]
pub struct DeniedLeases {
    /// Forgotten ids are counted by the map (a metric): a retry of one of them
    /// relies on TigerBeetle's own `id_already_failed`.
    inner: Mutex<RecentIds<()>>,
}

impl DeniedLeases {
    /// A set of at most `leases_max` lease ids.
    pub fn new(leases_max: usize) -> Self {
        Self {
            inner: Mutex::new(RecentIds::new(leases_max)),
        }
    }

    fn locked(&self) -> std::sync::MutexGuard<'_, RecentIds<()>> {
        self.inner.lock().expect("denied leases lock poisoned")
    }

    /// Remembers `lease` as denied.
    pub fn insert(&self, lease: LeaseId) {
        self.locked().insert(lease.to_u128(), DENIED_SINCE_UNIX_MS, ());
    }

    /// How many lease ids were forgotten to respect `leases_max`.
    pub fn evicted(&self) -> u64 {
        self.locked().evicted_total()
    }

    /// How many denied lease ids are remembered.
    pub fn len(&self) -> usize {
        self.locked().len()
    }

    /// True when no denied lease is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when `lease` was denied (and not forgotten yet).
    pub fn contains(&self, lease: LeaseId) -> bool {
        self.locked().get(lease.to_u128()).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_up_to_capacity() {
        let denied = DeniedLeases::new(2);
        let ids: Vec<LeaseId> = (1..=3u128).map(LeaseId::from_u128).collect();
        for id in &ids {
            denied.insert(*id);
        }
        denied.insert(ids[2]);
        assert!(!denied.contains(ids[0]));
        assert_eq!((denied.len(), denied.evicted()), (2, 1));
        assert!(denied.contains(ids[1]));
        assert!(denied.contains(ids[2]));
    }
}
