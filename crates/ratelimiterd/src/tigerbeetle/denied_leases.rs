//! Leases TigerBeetle denied for lack of capacity. TigerBeetle remembers the id
//! of the transfer that failed (`id_already_failed`), but a retried chain stops
//! at its first failing transfer: when an earlier key of the chain is full by
//! then, the retry reads `exceeds_credits` again instead of `id_already_failed`.
//! The backend therefore remembers these leases itself, bounded, to keep "a
//! denied lease stays denied" (decisions §3) exact; TigerBeetle's own memory
//! covers other servers and restarts. Denials decided before sending anything
//! (a decreasing limit, an amount above capacity) burn nothing and are not here.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

use ratelimiter::LeaseId;

/// A bounded set of denied lease ids; the oldest are forgotten first.
#[derive(Debug)]
pub struct DeniedLeases {
    inner: Mutex<(HashSet<LeaseId>, VecDeque<LeaseId>)>,
    capacity: usize,
}

impl DeniedLeases {
    /// A set of at most `capacity` lease ids.
    pub fn new(capacity: usize) -> Self {
        assert!(capacity >= 1, "a denied set holds at least one lease");
        Self {
            inner: Mutex::new((HashSet::new(), VecDeque::new())),
            capacity,
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
        }
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
        assert!(denied.contains(ids[1]));
        assert!(denied.contains(ids[2]));
    }
}
