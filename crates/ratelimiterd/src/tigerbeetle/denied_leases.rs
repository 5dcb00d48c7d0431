//! Leases TigerBeetle denied for lack of capacity. TigerBeetle remembers the id
//! of the transfer that failed (`id_already_failed`), but a retried chain stops
//! at its first failing transfer: when an earlier key of the chain is full by
//! then, the retry reads `exceeds_credits` again instead of `id_already_failed`.
//! The backend therefore remembers these leases itself, bounded, to keep "a
//! denied lease stays denied" (decisions §3) exact; TigerBeetle's own memory
//! covers other servers and restarts. Denials decided before sending anything
//! (a decreasing limit, an amount above capacity) burn nothing and are not here.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use ratelimiter::LeaseId;

/// A bounded set of denied lease ids; the oldest are forgotten first.
#[derive(Debug)]
pub struct DeniedLeases {
    inner: Mutex<(HashSet<LeaseId>, VecDeque<LeaseId>)>,
    capacity: usize,
    /// Lease ids forgotten to respect the capacity (a metric): a retry of one of
    /// them relies on TigerBeetle's own `id_already_failed`.
    evicted: AtomicU64,
}

impl DeniedLeases {
    /// A set of at most `capacity` lease ids.
    pub fn new(capacity: usize) -> Self {
        assert!(capacity >= 1, "a denied set holds at least one lease");
        Self {
            inner: Mutex::new((HashSet::new(), VecDeque::new())),
            capacity,
            evicted: AtomicU64::new(0),
        }
    }

    /// Remembers `lease` as denied.
    pub fn insert(&self, lease: LeaseId) {
        let mut guard = self.inner.lock().expect("denied leases lock poisoned");
        let (set, order) = &mut *guard;
        if !set.insert(lease) {
            return;
        }
        order.push_back(lease);
        if order.len() > self.capacity {
            let oldest = order.pop_front().expect("order is not empty");
            set.remove(&oldest);
            self.evicted.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// How many lease ids were forgotten to respect the capacity.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// How many denied lease ids are remembered.
    pub fn len(&self) -> usize {
        self.inner.lock().expect("denied leases lock poisoned").0.len()
    }

    /// True when no denied lease is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when `lease` was denied (and not forgotten yet).
    pub fn contains(&self, lease: LeaseId) -> bool {
        self.inner
            .lock()
            .expect("denied leases lock poisoned")
            .0
            .contains(&lease)
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
